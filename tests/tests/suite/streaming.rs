//! `/exec`, `/attach`, `/portForward` and `/run` on the kubelet API against real
//! containers, over the WebSocket channel protocols (v4 proxied to the runtime, v5
//! translated by the kubelet API to SPDY towards it) and SPDY/3.1 (kubectl drives these
//! through the test API server in the kubectl tests). Needs root and the containerd that
//! `deploy/runtime/setup.sh` starts.

use nodeagent_tests::spdy::{DICTIONARY_ID, SpdyClient};
use nodeagent_tests::websocket::{ChannelClient, Received, exit_code};
use nodeagent_tests::{Node, NodeOptions, eventually, require_runtime};
use std::time::Duration;

const V4: &str = "v4.channel.k8s.io";
const V5: &str = "v5.channel.k8s.io";

/// A shell waiting on stdin (for attach) and busybox httpd serving one page on 8080.
const MANIFEST: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: streams
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: shell
    image: busybox:1.36
    command: ["sh"]
    stdin: true
  - name: web
    image: busybox:1.36
    command: ["sh", "-c", "mkdir -p /www && echo hello-from-httpd > /www/index.html && exec httpd -f -p 8080 -h /www"]
"#;

/// Starts the pod and waits until both containers run and httpd answers.
async fn start_pod(node: &Node) -> (String, String) {
    node.write_manifest("streams.yaml", MANIFEST);
    node.running_container("streams", "shell", Duration::from_secs(40))
        .await;
    let web = node
        .running_container("streams", "web", Duration::from_secs(40))
        .await;
    eventually("httpd answering", Duration::from_secs(20), || async {
        node.exec(&web, &["wget", "-qO-", "http://127.0.0.1:8080/"])
            .await
    })
    .await;
    let pod = node.pod("streams").await.expect("the pod is listed");
    let uid = pod["metadata"]["uid"]
        .as_str()
        .expect("the pod has a uid")
        .to_string();
    (node.pod_name("streams"), uid)
}

/// Percent-encodes one query value.
fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn command_query(args: &[&str]) -> String {
    args.iter()
        .map(|a| format!("command={}", enc(a)))
        .collect::<Vec<_>>()
        .join("&")
}

async fn open(node: &Node, path: &str, protocols: &[&str]) -> ChannelClient {
    match ChannelClient::connect(&node.api, path, protocols).await {
        Ok(c) => c,
        Err(Ok(refused)) => panic!("{path}: upgrade refused: {refused:?}"),
        Err(Err(e)) => panic!("{path}: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_attach_and_run() {
    if !require_runtime("streaming") {
        return;
    }
    let node = Node::start("streaming_exec", NodeOptions::default()).await;
    let (pod, uid) = start_pod(&node).await;

    // exec with stdin, stdout, stderr and a non-zero exit code, in upstream's v4 Status.
    let script = "read line; echo got $line; echo oops >&2; exit 3";
    let path = format!(
        "/exec/default/{pod}/web?{}&input=1&output=1&error=1",
        command_query(&["sh", "-c", script])
    );
    let mut session = open(&node, &path, &[V4]).await;
    assert_eq!(session.protocol.as_deref(), Some(V4));
    session.send(0, b"hello\n").await.unwrap();
    let got = session
        .read_to_close(Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(got.text(1), "got hello\n", "{got:?}");
    assert_eq!(got.text(2), "oops\n", "{got:?}");
    let status = got.0.get(&3).expect("a status on the error channel");
    assert_eq!(exit_code(status), Ok(3), "{}", got.text(3));
    let status: serde_json::Value = serde_json::from_slice(status).unwrap();
    assert_eq!(status["status"], "Failure");
    assert_eq!(status["reason"], "NonZeroExitCode");

    // The pod UID form, stdout only, exit 0: a Success status.
    let path = format!(
        "/exec/default/{pod}/{uid}/web?{}&stdout=true",
        command_query(&["echo", "by uid"])
    );
    let got = open(&node, &path, &["v5.channel.k8s.io", V4])
        .await
        .read_to_close(Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(got.text(1), "by uid\n");
    assert_eq!(exit_code(got.0.get(&3).map_or(&[][..], |v| v)), Ok(0));

    // A terminal, resized through channel 4: the command sees the new size.
    resize_terminal(&node, &pod, V4, 123, 45).await;

    // attach to the running shell: a command in, its output out; the shell is still
    // there for the next client.
    let path = format!("/attach/default/{pod}/shell?input=1&output=1&error=1");
    attach_and_echo(&node, &path, V4, "attached-$((6 * 7))", "attached-42").await;
    let path = format!("/attach/default/{pod}/{uid}/shell?input=1&output=1");
    attach_and_echo(&node, &path, V4, "again", "again").await;

    // /run: ExecSync's output, and a failure with its exit code.
    let run = node
        .api
        .request(
            "POST",
            &format!("/run/default/{pod}/web?cmd=cat+/www/index.html"),
        )
        .await
        .unwrap();
    assert_eq!(run.status, 200, "{}", run.text());
    assert_eq!(run.text(), "hello-from-httpd\n");
    let run = node
        .api
        .request(
            "POST",
            &format!("/run/default/{pod}/{uid}/web?cmd=ls+/no/such/dir"),
        )
        .await
        .unwrap();
    assert_eq!(run.status, 500, "{}", run.text());
    assert!(run.text().contains("exited with 1"), "{}", run.text());
    let run = node
        .api
        .request("GET", &format!("/run/default/{pod}/web?cmd=true"))
        .await
        .unwrap();
    assert_eq!(run.status, 405, "{}", run.text());

    exec_over_spdy(&node, &pod).await;
    exec_and_attach_over_v5(&node, &pod).await;
    bad_requests(&node, &pod).await;
}

/// v5.channel.k8s.io, as kubectl ≥ 1.30 speaks it first: stdin closed by the CLOSE
/// signal (`[255, 0]`) so `cat` ends, output beyond SPDY's 64 KiB default window both
/// ways, a resized terminal, and attach.
async fn exec_and_attach_over_v5(node: &Node, pod: &str) {
    let path = format!(
        "/exec/default/{pod}/web?{}&input=1&output=1&error=1",
        command_query(&["sh", "-c", "cat; echo done >&2; exit 3"])
    );
    let mut session = open(node, &path, &[V5, V4]).await;
    assert_eq!(session.protocol.as_deref(), Some(V5));
    session.send(0, b"piped input\n").await.unwrap();
    session.send(255, &[0]).await.unwrap();
    let got = session
        .read_to_close(Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(got.text(1), "piped input\n", "{got:?}");
    assert_eq!(got.text(2), "done\n", "{got:?}");
    let status = got.0.get(&3).expect("a status on the error channel");
    assert_eq!(exit_code(status), Ok(3), "{}", got.text(3));

    // 300 000 bytes in, counted by the command, then 512 KiB out.
    let path = format!(
        "/exec/default/{pod}/web?{}&input=1&output=1",
        command_query(&["wc", "-c"])
    );
    let mut session = open(node, &path, &[V5]).await;
    for chunk in vec![b'y'; 300_000].chunks(32 << 10) {
        session.send(0, chunk).await.unwrap();
    }
    session.send(255, &[0]).await.unwrap();
    let got = session
        .read_to_close(Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(got.text(1).trim(), "300000", "{}", got.text(3));
    let path = format!(
        "/exec/default/{pod}/web?{}&output=1",
        command_query(&[
            "sh",
            "-c",
            "dd if=/dev/zero bs=1024 count=512 2>/dev/null | tr '\\0' x"
        ])
    );
    let got = open(node, &path, &[V5])
        .await
        .read_to_close(Duration::from_secs(20))
        .await
        .unwrap();
    let out = got.0.get(&1).map_or(&[][..], |v| v);
    assert_eq!(out.len(), 512 << 10, "{}", got.text(3));
    assert!(out.iter().all(|&b| b == b'x'));
    assert_eq!(exit_code(got.0.get(&3).map_or(&[][..], |v| v)), Ok(0));

    // A terminal resized through channel 4.
    resize_terminal(node, pod, V5, 99, 33).await;

    // attach to the running shell.
    let path = format!("/attach/default/{pod}/shell?input=1&output=1&error=1");
    attach_and_echo(node, &path, V5, "v5-attached-$((6 * 7))", "v5-attached-42").await;
}

/// Resizes an exec's terminal through channel 4 over `protocol` and waits until the
/// command sees the new size.
async fn resize_terminal(node: &Node, pod: &str, protocol: &str, width: u16, height: u16) {
    let path = format!(
        "/exec/default/{pod}/web?{}&input=1&output=1&tty=1",
        command_query(&[
            "sh",
            "-c",
            "for i in $(seq 100); do stty size; sleep 0.2; done"
        ])
    );
    let mut tty = open(node, &path, &[protocol]).await;
    tty.resize(width, height).await.unwrap();
    let size = format!("{height} {width}");
    let mut seen = Received::default();
    tty.read_until(&mut seen, Duration::from_secs(15), |r| {
        r.text(1).contains(&size)
    })
    .await
    .unwrap();
    tty.close().await;
}

/// Attaches at `path` over `protocol`, sends `echo <words>` to the shell, and waits for
/// `expect` on stdout.
async fn attach_and_echo(node: &Node, path: &str, protocol: &str, words: &str, expect: &str) {
    let mut attached = open(node, path, &[protocol]).await;
    assert_eq!(attached.protocol.as_deref(), Some(protocol));
    attached
        .send(0, format!("echo {words}\n").as_bytes())
        .await
        .unwrap();
    let mut seen = Received::default();
    attached
        .read_until(&mut seen, Duration::from_secs(15), |r| {
            r.text(1).contains(expect)
        })
        .await
        .unwrap();
    attached.close().await;
}

/// The same exec over SPDY/3.1, as kubectl and the API server speak it: here stdin can
/// be closed (FIN), so `cat` ends.
async fn exec_over_spdy(node: &Node, pod: &str) {
    let path = format!(
        "/exec/default/{pod}/web?{}&input=1&output=1&error=1",
        command_query(&["sh", "-c", "cat; echo done >&2; exit 3"])
    );
    let mut spdy = SpdyClient::connect(&node.api, &path, &[V4, "v3.channel.k8s.io"])
        .await
        .unwrap();
    assert_eq!(spdy.protocol.as_deref(), Some(V4));
    spdy.open_stream("error").await.unwrap();
    let stdin = spdy.open_stream("stdin").await.unwrap();
    spdy.open_stream("stdout").await.unwrap();
    spdy.open_stream("stderr").await.unwrap();
    spdy.data(stdin, b"piped input\n", false).await.unwrap();
    spdy.data(stdin, b"", true).await.unwrap();
    let got = spdy.read_to_close(Duration::from_secs(20)).await.unwrap();
    assert_eq!(got.text("stdout"), "piped input\n", "{got:?}");
    assert_eq!(got.text("stderr"), "done\n", "{got:?}");
    let status = got.data.get("error").expect("a status on the error stream");
    assert_eq!(exit_code(status), Ok(3), "{}", got.text("error"));
    // The server's header blocks name the same dictionary this client's do.
    let zlib = got.server_zlib_header.expect("a SYN_REPLY");
    assert_eq!(zlib[2..], DICTIONARY_ID);
}

/// 404 and 400 with upstream's wording, before any stream is opened.
async fn bad_requests(node: &Node, pod: &str) {
    let echo = command_query(&["echo", "x"]);
    for (method, path, status, body) in [
        (
            "GET",
            format!("/exec/default/no-such-pod/web?{echo}&output=1"),
            404,
            "pod does not exist".to_string(),
        ),
        (
            "POST",
            format!("/exec/default/{pod}/nope?{echo}&output=1"),
            404,
            "container not found (\"nope\")".to_string(),
        ),
        (
            "GET",
            format!("/exec/default/{pod}/00000000-0000-0000-0000-000000000000/web?{echo}&output=1"),
            404,
            "container not found (\"web\")".to_string(),
        ),
        (
            "GET",
            format!("/attach/default/{pod}/nope?output=1"),
            404,
            format!("container nope not found in pod {pod}_default"),
        ),
        (
            "GET",
            format!("/portForward/other-namespace/{pod}"),
            404,
            "pod does not exist".to_string(),
        ),
        (
            "GET",
            format!("/portForward/default/{pod}/not-the-uid"),
            404,
            "pod not found".to_string(),
        ),
        (
            "POST",
            format!("/run/default/{pod}/nope?cmd=true"),
            404,
            "container not found (\"nope\")".to_string(),
        ),
        (
            "GET",
            format!("/exec/default/{pod}/web?{echo}"),
            400,
            "you must specify at least 1 of stdin, stdout, stderr".to_string(),
        ),
        (
            "GET",
            format!("/exec/default/{pod}/web?{echo}&output=maybe"),
            400,
            "invalid value \"maybe\" for query parameter \"output\": want 1 or 0".to_string(),
        ),
        (
            "GET",
            format!("/exec/default/{pod}/web?{echo}&output=1"),
            400,
            "Upgrade request required".to_string(),
        ),
        (
            "POST",
            format!("/run/default/{pod}/web"),
            400,
            "query parameter \"cmd\" is required: the command to run, its arguments separated by spaces".to_string(),
        ),
    ] {
        let r = node.api.request(method, &path).await.unwrap();
        assert_eq!((r.status, r.text()), (status, body), "{method} {path}");
    }

    // A subprotocol nobody speaks: a 400 naming what is spoken (an upgrade failure to
    // kubectl, which then retries over SPDY).
    let path = format!("/exec/default/{pod}/web?{echo}&output=1");
    match ChannelClient::connect(&node.api, &path, &["v6.channel.k8s.io"]).await {
        Err(Ok(refused)) => {
            assert_eq!(refused.status, 400, "{refused:?}");
            assert!(
                refused.body.contains("SPDY/3.1") && refused.body.contains(V5),
                "{refused:?}"
            );
        }
        Ok(_) => panic!("v6.channel.k8s.io was accepted"),
        Err(Err(e)) => panic!("{e}"),
    }
    // v5 is for exec and attach; port-forward speaks v4.
    let forward = format!("/portForward/default/{pod}?port=8080");
    match ChannelClient::connect(&node.api, &forward, &[V5]).await {
        Err(Ok(refused)) => assert_eq!(refused.status, 400, "{refused:?}"),
        Ok(_) => panic!("a v5 port-forward was accepted"),
        Err(Err(e)) => panic!("{e}"),
    }
    // A WebSocket port-forward names its ports in the query.
    match ChannelClient::connect(&node.api, &format!("/portForward/default/{pod}"), &[V4]).await {
        Err(Ok(refused)) => assert_eq!(
            (refused.status, refused.body.as_str()),
            (400, "query parameter \"port\" is required")
        ),
        Ok(_) => panic!("a port-forward without ports was accepted"),
        Err(Err(e)) => panic!("{e}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn port_forward_and_idle_timeout() {
    if !require_runtime("streaming") {
        return;
    }
    let options = NodeOptions {
        extra_config: "streamingConnectionIdleTimeout: 3s\n".into(),
        ..NodeOptions::default()
    };
    let node = Node::start("streaming_port_forward", options).await;
    let (pod, _uid) = start_pod(&node).await;

    // Port-forward to httpd: channel 0 carries the data, channel 1 errors; each starts with
    // the port, little-endian.
    let mut forward = open(
        &node,
        &format!("/portForward/default/{pod}?port=8080"),
        &[V4],
    )
    .await;
    forward
        .send(0, b"GET /index.html HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let got = forward
        .read_to_close(Duration::from_secs(20))
        .await
        .unwrap();
    let data = got.0.get(&0).cloned().unwrap_or_default();
    assert_eq!(data.get(..2), Some(&8080u16.to_le_bytes()[..]), "{got:?}");
    let http = String::from_utf8_lossy(&data[2..]);
    assert!(http.starts_with("HTTP/1.1 200 OK"), "{http}");
    assert!(http.ends_with("hello-from-httpd\n"), "{http}");
    assert_eq!(
        got.0.get(&1).map(Vec::as_slice),
        Some(&8080u16.to_le_bytes()[..]),
        "nothing but the port on the error channel: {got:?}"
    );

    // The same over SPDY/3.1 (kubectl port-forward's protocol): per request an error and
    // a data stream naming the port.
    let mut spdy = SpdyClient::connect(
        &node.api,
        &format!("/portForward/default/{pod}"),
        &["portforward.k8s.io"],
    )
    .await
    .unwrap();
    assert_eq!(spdy.protocol.as_deref(), Some("portforward.k8s.io"));
    let request = [("port", "8080"), ("requestid", "0")];
    spdy.open_stream_with("error", &request).await.unwrap();
    let data = spdy.open_stream_with("data", &request).await.unwrap();
    spdy.data(data, b"GET / HTTP/1.0\r\n\r\n", true)
        .await
        .unwrap();
    let got = spdy
        .read_until(Duration::from_secs(20), |r| r.finished.contains("data"))
        .await
        .unwrap();
    let http = got.text("data");
    assert!(http.starts_with("HTTP/1.1 200 OK"), "{got:?}");
    assert!(http.ends_with("hello-from-httpd\n"), "{got:?}");
    assert_eq!(got.text("error"), "", "{got:?}");

    // A stream with no traffic is closed after streamingConnectionIdleTimeout.
    let path = format!(
        "/exec/default/{pod}/web?{}&output=1",
        command_query(&["sleep", "60"])
    );
    let started = std::time::Instant::now();
    let mut idle = open(&node, &path, &[V4]).await;
    idle.read_to_close(Duration::from_secs(20))
        .await
        .expect("the idle stream is closed");
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(2500) && elapsed < Duration::from_secs(15),
        "closed after {elapsed:?}"
    );
}

/// The stream cap: 256 long-lived streams (here `containerLogs?follow`, which count against
/// the same limit as exec, attach and port-forward) are served; the next stream of any
/// kind gets 429 with Retry-After, while `/healthz` and plain requests still answer; once
/// one stream ends, a new one is served again.
#[tokio::test(flavor = "multi_thread")]
async fn the_stream_cap_refuses_the_257th_and_frees_slots() {
    if !require_runtime("stream cap") {
        return;
    }
    let node = Node::start("streaming_cap", NodeOptions::default()).await;
    let (pod, _) = start_pod(&node).await;
    let follow = format!("/containerLogs/default/{pod}/web?follow=true");
    let mut held = Vec::new();
    for batch in 0..(256 / 32) {
        let opened =
            futures::future::join_all((0..32).map(|_| node.api.send("GET", &follow))).await;
        for (i, r) in opened.into_iter().enumerate() {
            let r = r.unwrap_or_else(|e| panic!("stream {}: {e}", batch * 32 + i));
            assert_eq!(r.status(), 200, "stream {}", batch * 32 + i);
            held.push(r);
        }
    }
    // The 257th: a log follow and an exec are both refused, and say when to retry.
    let refused = node.api.get(&follow).await.unwrap();
    assert_eq!(refused.status, 429, "{}", refused.text());
    assert_eq!(refused.headers["retry-after"], "1");
    assert!(
        refused.text().contains("too many streams"),
        "{}",
        refused.text()
    );
    let exec = format!(
        "/exec/default/{pod}/web?{}&output=1",
        command_query(&["true"])
    );
    match ChannelClient::connect(&node.api, &exec, &[V5]).await {
        Err(Ok(refused)) => assert_eq!(refused.status, 429, "{refused:?}"),
        Ok(_) => panic!("an exec beyond the cap was accepted"),
        Err(Err(e)) => panic!("{e}"),
    }
    // Requests that are not streams still answer.
    let healthz = node.api.get("/healthz").await.unwrap();
    assert_eq!((healthz.status, healthz.text().as_str()), (200, "ok"));
    assert_eq!(node.api.get("/pods").await.unwrap().status, 200);
    // One stream ends: its slot is free again.
    drop(held.pop());
    eventually("a stream slot freed", Duration::from_secs(20), || async {
        let r = node.api.send("GET", &follow).await?;
        if r.status() == 200 {
            Ok(())
        } else {
            Err(format!("status {}", r.status()))
        }
    })
    .await;
    drop(held);
    node.stop().await;
}
