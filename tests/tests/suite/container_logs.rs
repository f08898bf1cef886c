//! Container logs over the kubelet API (`/containerLogs`, every query parameter, `follow`
//! while the container writes and across a rotation, `previous` after a restart), log
//! rotation by pod-sync, and `/logs/` serving /var/log without escapes.
//! Needs root and the containerd that `deploy/runtime/setup.sh` starts.

use http_body_util::BodyExt;
use k8s_openapi::jiff::Timestamp;
use nodeagent_tests::{Node, NodeOptions, eventually, eventually_every, require_runtime};
use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn pod(name: &str, restart: &str, script: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  \
         restartPolicy: {restart}\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    \
         image: busybox:1.36\n    command: [\"sh\", \"-c\", {script:?}]\n"
    )
}

/// `/containerLogs/default/<pod>/c?<query>` → (status, body).
async fn try_logs(node: &Node, pod: &str, query: &str) -> Result<(u16, String), String> {
    let path = format!("/containerLogs/default/{}/c?{query}", node.pod_name(pod));
    let r = node.api.get(&path).await?;
    Ok((r.status, r.text()))
}

async fn logs(node: &Node, pod: &str, query: &str) -> (u16, String) {
    try_logs(node, pod, query).await.expect("GET containerLogs")
}

/// Reads a streaming body until `done` says so; panics after `deadline`.
async fn read_until(
    body: &mut hyper::body::Incoming,
    text: &mut String,
    deadline: Duration,
    what: &str,
    done: impl Fn(&str) -> bool,
) {
    let until = tokio::time::Instant::now() + deadline;
    while !done(text) {
        let frame = tokio::time::timeout_at(until, body.frame())
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {what}; got {text:?}"))
            .unwrap_or_else(|| panic!("the body ended before {what}; got {text:?}"))
            .expect("body frame");
        if let Ok(data) = frame.into_data() {
            text.push_str(std::str::from_utf8(&data).expect("UTF-8 logs"));
        }
    }
}

/// The numbers of the `<prefix>-<n>` lines of `text`, in order.
fn numbers(text: &str, prefix: &str) -> Vec<u64> {
    text.lines()
        .filter_map(|l| {
            l.split_whitespace()
                .next()?
                .strip_prefix(prefix)?
                .parse()
                .ok()
        })
        .collect()
}

fn timestamp_of(text: &str, line: &str) -> Timestamp {
    let l = text
        .lines()
        .find(|l| l.ends_with(&format!(" {line}")))
        .unwrap_or_else(|| panic!("no line {line:?} in {text:?}"));
    l.split(' ')
        .next()
        .unwrap()
        .parse()
        .expect("RFC3339 timestamp")
}

#[tokio::test(flavor = "multi_thread")]
async fn container_logs_query_parameters_and_errors() {
    if !require_runtime("containerLogs") {
        return;
    }
    let node = Node::start("container_logs_query", NodeOptions::default()).await;
    let script = "for i in 1 2 3 4 5; do echo line-$i; done; sleep 3; echo oops >&2; sleep 1; \
                  echo late; exec sleep 3600";
    node.write_manifest("fixed.yaml", &pod("fixed", "Always", script));
    let all = "line-1\nline-2\nline-3\nline-4\nline-5\noops\nlate\n";
    eventually("every line logged", Duration::from_secs(40), || async {
        let (code, body) = try_logs(&node, "fixed", "").await?;
        (code == 200 && body == all)
            .then_some(())
            .ok_or(format!("{code}: {body:?}"))
    })
    .await;
    let name = node.pod_name("fixed");

    assert_eq!(
        logs(&node, "fixed", "tailLines=2").await,
        (200, "oops\nlate\n".into())
    );
    assert_eq!(logs(&node, "fixed", "tail=1").await, (200, "late\n".into()));
    assert_eq!(
        logs(&node, "fixed", "tailLines=0").await,
        (200, String::new())
    );
    assert_eq!(
        logs(&node, "fixed", "tailLines=100").await,
        (200, all.into())
    );
    assert_eq!(
        logs(&node, "fixed", "limitBytes=8").await,
        (200, "line-1\nl".into())
    );
    assert_eq!(
        logs(&node, "fixed", "tailLines=2&limitBytes=3").await,
        (200, "oop".into())
    );
    assert_eq!(
        logs(&node, "fixed", "stream=Stderr").await,
        (200, "oops\n".into())
    );
    assert_eq!(
        logs(
            &node,
            "fixed",
            "insecureSkipTLSVerifyBackend=true&follow=false"
        )
        .await,
        (200, all.into())
    );

    // timestamps: upstream's fixed-width RFC3339 with nanoseconds, then the line.
    let (code, stamped) = logs(&node, "fixed", "timestamps=true").await;
    assert_eq!(code, 200);
    assert_eq!(stamped.lines().count(), 7, "{stamped}");
    for l in stamped.lines() {
        let (ts, _) = l.split_once(' ').expect("timestamp and line");
        assert_eq!(ts.len(), "2006-01-02T15:04:05.000000000Z".len(), "{l}");
        assert!(ts.ends_with('Z') && ts.as_bytes()[19] == b'.', "{l}");
        ts.parse::<Timestamp>().expect("RFC3339");
    }
    let oops = timestamp_of(&stamped, "oops");
    assert!(oops > timestamp_of(&stamped, "line-5"));

    // sinceTime: from the stderr line on.
    let (code, body) = logs(&node, "fixed", &format!("sinceTime={oops}")).await;
    assert_eq!((code, body.as_str()), (200, "oops\nlate\n"));
    // sinceSeconds: a bound between line-5 and oops (3 s apart).
    let age = Timestamp::now().duration_since(oops).as_secs_f64().ceil() as i64 + 1;
    let (code, body) = logs(&node, "fixed", &format!("sinceSeconds={age}")).await;
    assert_eq!(
        (code, body.as_str()),
        (200, "oops\nlate\n"),
        "sinceSeconds={age}"
    );
    assert_eq!(
        logs(&node, "fixed", "sinceSeconds=86400").await,
        (200, all.into())
    );

    // Malformed values: 400; values that are not valid: 422, as upstream.
    let decode = r#"{"message": "Unable to decode query."}"#;
    for q in [
        "tailLines=abc",
        "limitBytes=x",
        "sinceSeconds=1.5",
        "sinceTime=yesterday",
    ] {
        assert_eq!(logs(&node, "fixed", q).await, (400, decode.into()), "{q}");
    }
    let invalid = r#"{"message": "Invalid request."}"#;
    for q in [
        "tailLines=-1",
        "limitBytes=0",
        "sinceSeconds=0",
        "sinceSeconds=5&sinceTime=2024-05-01T10:00:00Z",
    ] {
        assert_eq!(logs(&node, "fixed", q).await, (422, invalid.into()), "{q}");
    }
    // No previous instance yet.
    assert_eq!(
        logs(&node, "fixed", "previous=true").await,
        (
            400,
            format!(r#"previous terminated container "c" in pod "{name}" not found"#)
        )
    );
    // Unknown pod and container: 404 with upstream's wording.
    let r = node.api.get("/containerLogs/default/nope/c").await.unwrap();
    assert_eq!(
        (r.status, r.text()),
        (404, r#"pod "nope" does not exist"#.into())
    );
    let r = node
        .api
        .get(&format!("/containerLogs/kube-system/{name}/c"))
        .await
        .unwrap();
    assert_eq!(
        r.status,
        404,
        "the pod is in namespace default: {}",
        r.text()
    );
    let r = node
        .api
        .get(&format!("/containerLogs/default/{name}/nope"))
        .await
        .unwrap();
    assert_eq!(
        (r.status, r.text()),
        (
            404,
            format!(r#"container "nope" not found in pod "{name}""#)
        )
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn follow_streams_while_the_container_writes_and_ends_when_it_exits() {
    if !require_runtime("containerLogs follow") {
        return;
    }
    let node = Node::start("container_logs_follow", NodeOptions::default()).await;
    let script = "i=0; while [ $i -lt 30 ]; do i=$((i+1)); echo tick-$i; sleep 0.25; done";
    node.write_manifest("ticker.yaml", &pod("ticker", "Never", script));
    eventually("the first tick", Duration::from_secs(40), || async {
        let (code, body) = try_logs(&node, "ticker", "").await?;
        (code == 200 && body.contains("tick-1\n"))
            .then_some(())
            .ok_or(format!("{code}: {body:?}"))
    })
    .await;
    let path = format!(
        "/containerLogs/default/{}/c?follow=true&tailLines=1",
        node.pod_name("ticker")
    );
    let response = node.api.send("GET", &path).await.expect("follow request");
    assert_eq!(response.status(), 200);
    let (_, mut body) = response.into_parts();
    let mut text = String::new();
    read_until(
        &mut body,
        &mut text,
        Duration::from_secs(10),
        "a tick",
        |t| !numbers(t, "tick-").is_empty(),
    )
    .await;
    let first = numbers(&text, "tick-")[0];
    // Lines the container writes after the request started arrive on the open response.
    read_until(
        &mut body,
        &mut text,
        Duration::from_secs(10),
        "three later ticks",
        |t| numbers(t, "tick-").last().is_some_and(|n| *n >= first + 3),
    )
    .await;
    // The response ends once the container has exited, with every line up to the last.
    let rest = tokio::time::timeout(Duration::from_secs(20), body.collect())
        .await
        .expect("the follow ends after the container exits")
        .expect("body");
    text.push_str(std::str::from_utf8(&rest.to_bytes()).unwrap());
    let got = numbers(&text, "tick-");
    let want: Vec<u64> = (first..=30).collect();
    assert_eq!(got, want, "{text}");
    node.stop().await;
}

/// The files in the log directory of container `c` of `pod`.
fn log_files(node: &Node, pod: &str) -> Result<(PathBuf, Vec<String>), String> {
    let prefix = format!("default_{}_", node.pod_name(pod));
    let logs = node.path("pod-logs");
    let dir = std::fs::read_dir(&logs)
        .map_err(|e| e.to_string())?
        .flatten()
        .find(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .ok_or("no pod log directory")?
        .path()
        .join("c");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .map_err(|e| e.to_string())?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    Ok((dir, names))
}

#[tokio::test(flavor = "multi_thread")]
async fn follow_continues_across_rotation_and_rotation_keeps_max_files() {
    if !require_runtime("log rotation") {
        return;
    }
    let options = NodeOptions {
        // Checked every 3 s (upstream's shortest containerLogMonitorInterval; 10 s default).
        extra_config:
            "containerLogMaxSize: 1Ki\ncontainerLogMaxFiles: 3\ncontainerLogMonitorInterval: 3s\n"
                .into(),
        ..Default::default()
    };
    let node = Node::start("container_logs_rotation", options).await;
    // About 1.8 KiB a second: past 1Ki at every check.
    let script =
        "i=0; while true; do i=$((i+1)); echo line-$i $(printf '%080d' 0); sleep 0.05; done";
    node.write_manifest("chatty.yaml", &pod("chatty", "Always", script));
    node.running_container("chatty", "c", Duration::from_secs(40))
        .await;
    let path = format!(
        "/containerLogs/default/{}/c?follow=true",
        node.pod_name("chatty")
    );
    let response = node.api.send("GET", &path).await.expect("follow request");
    assert_eq!(response.status(), 200);
    let (_, mut body) = response.into_parts();
    let mut text = String::new();

    // Three rotations, never more than containerLogMaxFiles files (`.gz` ones count): after
    // the second, the live log, the first rotated file gzipped and the second plain; after
    // the third, the first is removed. The bytes of each plain rotated file are kept as
    // last read, to compare with its gzip later.
    let mut rotated_seen: Vec<String> = Vec::new();
    let mut plain: HashMap<String, Vec<u8>> = HashMap::new();
    let dir = eventually("three rotations", Duration::from_secs(50), || {
        let (dir, names) = match log_files(&node, "chatty") {
            Ok(v) => v,
            Err(e) => return std::future::ready(Err(e)),
        };
        assert!(
            names.len() <= 3,
            "more than containerLogMaxFiles files: {names:?}"
        );
        for n in names.iter().filter(|n| n.starts_with("0.log.")) {
            if n.ends_with(".tmp") {
                continue;
            }
            let base = n.strip_suffix(".gz").unwrap_or(n).to_string();
            if !n.ends_with(".gz")
                && let Ok(bytes) = std::fs::read(dir.join(n))
            {
                plain.insert(base.clone(), bytes);
            }
            if !rotated_seen.contains(&base) {
                rotated_seen.push(base);
            }
        }
        std::future::ready(
            (rotated_seen.len() >= 3)
                .then_some(dir)
                .ok_or(format!("rotated so far: {rotated_seen:?}, now {names:?}")),
        )
    })
    .await;
    // At each rotation the live log is missing for a moment (renamed, then reopened by the
    // runtime's ReopenContainerLog) and a gzip may be half written (`.tmp`): the listing is
    // taken once both have settled (stop 42's CI caught the reopen's window: no 0.log).
    let names = eventually_every(
        "the live log reopened and no gzip half written",
        Duration::from_secs(10),
        Duration::from_millis(20),
        || {
            let settled = log_files(&node, "chatty").and_then(|(_, names)| {
                let live = names.iter().any(|n| n == "0.log");
                if live && !names.iter().any(|n| n.ends_with(".tmp")) {
                    Ok(names)
                } else {
                    Err(format!("{names:?}"))
                }
            });
            std::future::ready(settled)
        },
    )
    .await;
    let (older, newest) = (&rotated_seen[1], &rotated_seen[2]);
    assert_eq!(
        names,
        vec!["0.log".to_string(), format!("{older}.gz"), newest.clone()],
        "the live log, the older rotated file gzipped, the newest plain; the oldest removed \
         (rotated: {rotated_seen:?})"
    );
    let compressed = std::fs::read(dir.join(format!("{older}.gz"))).expect("read the .gz");
    let mut unzipped = Vec::new();
    flate2::read::GzDecoder::new(compressed.as_slice())
        .read_to_end(&mut unzipped)
        .expect("the older rotated file is a valid gzip");
    let original = plain
        .get(older)
        .expect("the older rotated file was seen plain before compression");
    assert!(!original.is_empty());
    assert!(
        unzipped == *original,
        "the gzip holds the plain file's bytes ({} bytes unzipped, {} read plain)",
        unzipped.len(),
        original.len()
    );
    let newest_bytes = std::fs::read(dir.join(newest)).expect("read the newest rotated file");
    assert!(
        newest_bytes.starts_with(b"20") && newest_bytes.ends_with(b"\n"),
        "the newest rotated file stays plain CRI log text"
    );

    // The follower read through the rotations without losing or repeating a line.
    let live_first = eventually("the live log's first line", Duration::from_secs(10), || {
        let content = std::fs::read_to_string(dir.join("0.log")).unwrap_or_default();
        std::future::ready(
            content
                .lines()
                .find_map(|l| {
                    l.split(" F ")
                        .nth(1)
                        .and_then(|c| numbers(c, "line-").first().copied())
                })
                .ok_or_else(|| "empty".to_string()),
        )
    })
    .await;
    read_until(
        &mut body,
        &mut text,
        Duration::from_secs(20),
        "lines of the live log",
        |t| {
            numbers(t, "line-")
                .last()
                .is_some_and(|n| *n >= live_first + 5)
        },
    )
    .await;
    let got = numbers(&text, "line-");
    // (From the first line read: a rotation may have come before the request.)
    let want: Vec<u64> = (got[0]..=*got.last().unwrap()).collect();
    assert!(
        got == want,
        "lines missing or repeated across the rotation: {got:?}"
    );

    // Without follow, only the live file is read (as upstream).
    let (code, current) = logs(&node, "chatty", "").await;
    assert_eq!(code, 200);
    assert_eq!(
        numbers(&current, "line-").first(),
        Some(&live_first),
        "{current}"
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn previous_shows_the_last_terminated_instance() {
    if !require_runtime("containerLogs previous") {
        return;
    }
    let node = Node::start("container_logs_previous", NodeOptions::default()).await;
    // The first run prints and fails; the second prints and stays.
    let manifest = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: restarts\nspec:\n  \
        restartPolicy: Always\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    \
        image: busybox:1.36\n    command: [\"sh\", \"-c\", \"n=$(cat /data/n 2>/dev/null || echo 0); \
        n=$((n+1)); echo $n > /data/n; echo run-$n; echo err-$n >&2; [ $n -gt 1 ] || exit 3; exec sleep 3600\"]\n    \
        volumeMounts:\n    - name: data\n      mountPath: /data\n  volumes:\n  - name: data\n    emptyDir: {}\n";
    node.write_manifest("restarts.yaml", manifest);
    eventually("the second run", Duration::from_secs(50), || async {
        let (code, body) = try_logs(&node, "restarts", "").await?;
        (code == 200 && body.contains("run-2"))
            .then_some(())
            .ok_or(format!("{code}: {body:?}"))
    })
    .await;
    let (code, current) = logs(&node, "restarts", "").await;
    assert_eq!(code, 200);
    assert_eq!(sorted_lines(&current), ["err-2", "run-2"]);
    let (code, previous) = logs(&node, "restarts", "previous=true").await;
    assert_eq!(code, 200, "{previous}");
    assert_eq!(sorted_lines(&previous), ["err-1", "run-1"]);
    let (code, previous) = logs(&node, "restarts", "previous=true&stream=Stdout").await;
    assert_eq!((code, previous.as_str()), (200, "run-1\n"));
    node.stop().await;
}

fn sorted_lines(s: &str) -> Vec<&str> {
    let mut v: Vec<&str> = s.lines().collect();
    v.sort();
    v
}

/// A directory under /var/log for one test, removed when dropped.
struct VarLogDir(PathBuf);

impl Drop for VarLogDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn node_logs_serve_var_log_without_escapes() {
    if !require_runtime("/logs/") {
        return;
    }
    let node = Node::start("node_logs", NodeOptions::default()).await;
    let name = format!("nodeagent-test-{}", node.name);
    let dir = VarLogDir(Path::new("/var/log").join(&name));
    std::fs::create_dir_all(dir.0.join("sub")).unwrap();
    std::fs::write(dir.0.join("a.log"), "hello from a.log\n").unwrap();
    std::fs::write(dir.0.join("sub/b.log"), "b\n").unwrap();
    std::os::unix::fs::symlink("/etc", dir.0.join("escape")).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", dir.0.join("escape-file")).unwrap();
    std::os::unix::fs::symlink("a.log", dir.0.join("inside")).unwrap();

    let root = eventually("/logs/", Duration::from_secs(30), || async {
        let r = node.api.get("/logs/").await?;
        (r.status == 200)
            .then_some(r)
            .ok_or("not yet 200".to_string())
    })
    .await;
    assert!(
        root.text()
            .contains(&format!("<a href=\"{name}/\">{name}/</a>")),
        "{}",
        root.text()
    );
    assert_eq!(root.headers["content-type"], "text/html; charset=utf-8");
    let listing = node.api.get(&format!("/logs/{name}/")).await.unwrap();
    assert_eq!(listing.status, 200);
    for entry in ["a.log", "sub/", "escape", "inside"] {
        assert!(
            listing.text().contains(&format!(">{entry}</a>")),
            "{entry}: {}",
            listing.text()
        );
    }
    let file = node.api.get(&format!("/logs/{name}/a.log")).await.unwrap();
    assert_eq!(
        (file.status, file.text().as_str()),
        (200, "hello from a.log\n")
    );
    assert_eq!(file.headers["content-length"], "17");
    assert_eq!(file.headers["accept-ranges"], "bytes");
    // Range requests, as Go's FileServer answers them ("hello from a.log\n").
    let a_log = format!("/logs/{name}/a.log");
    for (range, status, body, content_range) in [
        ("bytes=6-9", 206, "from", Some("bytes 6-9/17")),
        ("bytes=-4", 206, "log\n", Some("bytes 13-16/17")),
        ("bytes=11-", 206, "a.log\n", Some("bytes 11-16/17")),
        ("bytes=0-1,3-4", 200, "hello from a.log\n", None),
        (
            "bytes=17-",
            416,
            "invalid range: failed to overlap\n",
            Some("bytes */17"),
        ),
        ("bytes=9-5", 416, "invalid range\n", None),
    ] {
        let r = node
            .api
            .request_with("GET", &a_log, &[("range", range)])
            .await
            .unwrap();
        assert_eq!((r.status, r.text().as_str()), (status, body), "{range}");
        assert_eq!(
            r.headers.get("content-range").and_then(|v| v.to_str().ok()),
            content_range,
            "{range}"
        );
    }
    let inside = node.api.get(&format!("/logs/{name}/inside")).await.unwrap();
    assert_eq!(inside.text(), "hello from a.log\n");
    let nested = node
        .api
        .get(&format!("/logs/{name}/sub/b.log"))
        .await
        .unwrap();
    assert_eq!(nested.text(), "b\n");
    // A directory without its slash is redirected, as Go's FileServer does.
    let r = node.api.get(&format!("/logs/{name}")).await.unwrap();
    assert_eq!(
        (r.status, r.headers["location"].to_str().unwrap()),
        (301, format!("{name}/").as_str())
    );

    // Symlinks out of /var/log are refused; `..` is refused before any lookup.
    for escape in ["escape/hostname", "escape-file", "escape/"] {
        let r = node
            .api
            .get(&format!("/logs/{name}/{escape}"))
            .await
            .unwrap();
        assert_eq!(r.status, 403, "{escape}: {}", r.text());
    }
    for dotdot in [
        "/logs/../etc/hostname".to_string(),
        format!("/logs/{name}/../../../etc/hostname"),
        "/logs/%2e%2e/etc/hostname".to_string(),
    ] {
        let r = node.api.get(&dotdot).await.unwrap();
        assert_eq!(
            (r.status, r.text().as_str()),
            (400, "invalid URL path\n"),
            "{dotdot}"
        );
    }
    let r = node
        .api
        .get(&format!("/logs/{name}/absent.log"))
        .await
        .unwrap();
    assert_eq!(r.status, 404);
    node.stop().await;
}
