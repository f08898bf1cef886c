//! The walking skeleton end to end: the seven real binaries against the real containerd.

use nix::sys::signal::Signal;
use nodeagent_config::Service;
use nodeagent_tests::{Node, NodeOptions, eventually, require_runtime};
use serde_json::Value;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(90);

fn web_manifest(marker: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: web
  labels:
    app: web
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: httpd
    image: busybox:1.36
    command: ["httpd", "-f", "-p", "8080", "-h", "/www"]
    volumeMounts:
    - name: www
      mountPath: /www
    readinessProbe:
      exec:
        command: ["test", "-d", "/www"]
      periodSeconds: 1
  - name: writer
    image: busybox:1.36
    command: ["sh", "-c", "echo {marker} > /www/index.html; trap 'exit 0' TERM; while true; do sleep 1; done"]
    volumeMounts:
    - name: www
      mountPath: /www
  volumes:
  - name: www
    emptyDir: {{}}
"#
    )
}

/// The pod named `name` from /pods, once it is Running and Ready with a pod IP.
async fn running_pod(node: &Node, name: &str) -> Value {
    let full = node.pod_name(name);
    eventually(
        &format!("{full} Running and Ready in /pods"),
        DEADLINE,
        || async {
            let pods = node.pods().await?;
            let pod = pods
                .into_iter()
                .find(|p| p["metadata"]["name"] == full.as_str())
                .ok_or_else(|| format!("{full} not listed"))?;
            let status = &pod["status"];
            let ready = status["conditions"]
                .as_array()
                .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
                .map(|c| c["status"] == "True")
                .unwrap_or(false);
            let ip = status["podIP"].as_str().unwrap_or_default();
            if status["phase"] == "Running" && ready && !ip.is_empty() {
                Ok(pod)
            } else {
                Err(format!("phase {} ready {ready} ip {ip:?}", status["phase"]))
            }
        },
    )
    .await
}

/// Waits until /pods lists exactly one pod and it is not `old_uid`; returns its uid.
async fn replacement_of(node: &Node, old_uid: &str, what: &str) -> String {
    eventually(what, DEADLINE, || async {
        let pods = node.pods().await?;
        let uids: Vec<String> = pods
            .iter()
            .map(|p| {
                p["metadata"]["uid"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect();
        match uids.as_slice() {
            [only] if only != old_uid => Ok(only.clone()),
            _ => Err(format!("{uids:?}")),
        }
    })
    .await
}

/// (container id, name, attempt, state) of every CRI container of a pod uid.
async fn cri_containers(node: &Node, uid: &str) -> Vec<(String, String, u32, i32)> {
    let mut v: Vec<_> = node
        .containers()
        .await
        .into_iter()
        .filter(|c| c.labels.get("io.kubernetes.pod.uid").map(String::as_str) == Some(uid))
        .map(|c| {
            let m = c.metadata.unwrap_or_default();
            (c.id, m.name, m.attempt, c.state)
        })
        .collect();
    v.sort();
    v
}

const RUNNING: i32 = nodeagent_proto::cri::ContainerState::ContainerRunning as i32;

async fn both_running(node: &Node, uid: &str) -> Vec<(String, String, u32, i32)> {
    eventually("both containers running in CRI", DEADLINE, || async {
        let cs = cri_containers(node, uid).await;
        if cs.len() == 2 && cs.iter().all(|c| c.3 == RUNNING) {
            Ok(cs)
        } else {
            Err(format!("{cs:?}"))
        }
    })
    .await
}

/// Waits until the newest httpd container of `web` serves `marker`, the writer
/// container's line in the emptyDir they share (fetched by httpd's own wget, inside it).
async fn assert_served(node: &Node, marker: &str) {
    eventually(&format!("httpd serving {marker}"), DEADLINE, || async {
        let id = node
            .container_id("web", "httpd")
            .await
            .ok_or("no httpd container")?;
        let body = node
            .exec(&id, &["wget", "-qO-", "http://127.0.0.1:8080/index.html"])
            .await?;
        (body.trim() == marker)
            .then_some(())
            .ok_or_else(|| format!("served {body:?}"))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_pod_runs_is_replaced_on_edit_and_cleaned_up_on_removal() {
    if !require_runtime("a_static_pod_runs...") {
        return;
    }
    let node = Node::start("lifecycle", NodeOptions::default()).await;
    node.write_manifest("web.yaml", &web_manifest("one"));

    let pod = running_pod(&node, "web").await;
    let uid = pod["metadata"]["uid"].as_str().unwrap().to_string();
    let first = both_running(&node, &uid).await;
    // Checked through CRI, not only our own status: the labels upstream tools rely on.
    let sandboxes = node.sandboxes().await;
    assert_eq!(sandboxes.len(), 1, "{sandboxes:?}");
    assert_eq!(sandboxes[0].labels["io.kubernetes.pod.uid"], uid);
    for cs in pod["status"]["containerStatuses"].as_array().unwrap() {
        let id = cs["containerID"]
            .as_str()
            .unwrap()
            .trim_start_matches("containerd://");
        assert!(
            first.iter().any(|c| c.0 == id),
            "{id} not in CRI: {first:?}"
        );
    }
    // The emptyDir is shared: the writer's file is what httpd serves.
    assert_served(&node, "one").await;
    let log_dir = node.path(&format!("pod-logs/default_{}_{uid}", node.pod_name("web")));
    assert!(log_dir.is_dir(), "{}", log_dir.display());

    // Healthy: every service answers its check. A check that overran its 2 s (the
    // cgroup v2 guest under TCG, where one did once) answers 500 naming the service; the
    // next one must pass.
    eventually("/healthz ok", DEADLINE, || async {
        match nodeagent_tests::http_get(node.healthz_port, "/healthz").await? {
            (200, body) if body == "ok" => Ok(()),
            (code, body) => Err(format!("{code}: {body}")),
        }
    })
    .await;

    // Edit: a static pod's UID follows its content, so the pod is replaced.
    node.write_manifest("web.yaml", &web_manifest("two"));
    let new_uid = replacement_of(&node, &uid, "the edited pod to replace the old one").await;
    both_running(&node, &new_uid).await;
    assert_served(&node, "two").await;
    eventually(
        "the old pod's containers removed from CRI",
        DEADLINE,
        || async {
            let left = cri_containers(&node, &uid).await;
            if left.is_empty() {
                Ok(())
            } else {
                Err(format!("{left:?}"))
            }
        },
    )
    .await;

    // Rename: the file's path is part of a static pod's UID, so the pod is replaced again.
    std::fs::rename(
        node.path("manifests/web.yaml"),
        node.path("manifests/web-renamed.yaml"),
    )
    .unwrap();
    let renamed_uid = replacement_of(
        &node,
        &new_uid,
        "the renamed manifest's pod to replace the old one",
    )
    .await;
    both_running(&node, &renamed_uid).await;
    let new_uid = renamed_uid;
    node.remove_manifest("web-renamed.yaml");

    // Remove: sandbox and containers go, and what the runtime leaves behind too.
    eventually(
        "every sandbox and container of the node removed",
        DEADLINE,
        || async {
            let (s, c) = (node.sandboxes().await.len(), node.containers().await.len());
            let pods = node.pods().await?.len();
            if s == 0 && c == 0 && pods == 0 {
                Ok(())
            } else {
                Err(format!("{s} sandboxes, {c} containers, {pods} pods"))
            }
        },
    )
    .await;
    let new_log_dir = node.path(&format!(
        "pod-logs/default_{}_{new_uid}",
        node.pod_name("web")
    ));
    eventually("log dir, volumes and cgroup removed", DEADLINE, || async {
        let cgroup = std::path::Path::new("/sys/fs/cgroup/memory/kubepods/besteffort")
            .join(format!("pod{new_uid}"));
        let cgroup_v2 = std::path::Path::new("/sys/fs/cgroup/kubepods/besteffort")
            .join(format!("pod{new_uid}"));
        let volumes = node.path(&format!("root/pods/{new_uid}"));
        match (
            new_log_dir.exists(),
            volumes.exists(),
            cgroup.exists() || cgroup_v2.exists(),
        ) {
            (false, false, false) => Ok(()),
            state => Err(format!("log dir, volumes, cgroup still there: {state:?}")),
        }
    })
    .await;
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_pod_sync_or_pleg_leaves_running_containers_untouched() {
    if !require_runtime("killing_pod_sync_or_pleg...") {
        return;
    }
    let mut node = Node::start("restart", NodeOptions::default()).await;
    node.write_manifest("web.yaml", &web_manifest("steady"));
    let pod = running_pod(&node, "web").await;
    let uid = pod["metadata"]["uid"].as_str().unwrap().to_string();
    let before = both_running(&node, &uid).await;

    for service in [
        Service::PodSync,
        Service::Pleg,
        Service::ConfigSource,
        Service::Volume,
        Service::Probe,
    ] {
        let status = node.signal(service, Signal::SIGKILL).await;
        assert!(!status.success(), "{}: {status:?}", service.name());
        node.spawn(service);
        // Give the restarted service time to act: wait until it serves, then until the
        // status is complete again (pod-sync rebuilt it from the snapshots).
        node.wait_serving(service).await;
        let pod = running_pod(&node, "web").await;
        assert_eq!(pod["metadata"]["uid"], uid.as_str());
        for cs in pod["status"]["containerStatuses"].as_array().unwrap() {
            assert_eq!(
                cs["restartCount"],
                0,
                "after restarting {}: {cs}",
                service.name()
            );
        }
        let after = cri_containers(&node, &uid).await;
        assert_eq!(
            after,
            before,
            "containers changed after restarting {}",
            service.name()
        );
    }
    // Let a few relists and syncs happen with everyone back, then look again.
    node.wait_relists(3).await;
    eventually("healthz with everyone back", DEADLINE, || async {
        let h = nodeagent_tests::http_get(node.healthz_port, "/healthz").await?;
        if h.0 == 200 {
            Ok(())
        } else {
            Err(format!("{h:?}"))
        }
    })
    .await;
    assert_eq!(cri_containers(&node, &uid).await, before);
    node.remove_manifest("web.yaml");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_manifest_is_reported_and_disturbs_nothing() {
    if !require_runtime("a_malformed_manifest...") {
        return;
    }
    let node = Node::start("malformed", NodeOptions::default()).await;
    node.write_manifest("web.yaml", &web_manifest("good"));
    let pod = running_pod(&node, "web").await;
    let uid = pod["metadata"]["uid"].as_str().unwrap().to_string();
    let before = both_running(&node, &uid).await;

    let cases = [
        (
            "broken.yaml",
            "apiVersion: v1\nkind: Pod\nmetadata: [oops\n",
            "invalid YAML or JSON",
        ),
        ("empty.yaml", "", "the file is empty"),
        (
            "nocontainers.yaml",
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: bare\nspec:\n  containers: []\n",
            "spec.containers: Required value",
        ),
        (
            "page.html",
            "<html><body>not a pod</body></html>",
            "invalid",
        ),
    ];
    for (file, text, _) in &cases {
        node.write_manifest(file, text);
    }
    // A 10 MiB file is refused before it is parsed.
    let huge = format!("# {}\n", "x".repeat(10 << 20));
    node.write_manifest("huge.yaml", &huge);
    let cases: Vec<_> = cases
        .into_iter()
        .chain([("huge.yaml", "", "the limit is")])
        .collect();
    for (file, _, reason) in &cases {
        let path = node
            .path(&format!("manifests/{file}"))
            .display()
            .to_string();
        eventually(
            &format!("config-source to report {file}"),
            DEADLINE,
            || async {
                let log = node.log(Service::ConfigSource);
                let line = log
                    .lines()
                    .find(|l| l.contains(&path) && l.contains("invalid static pod manifest"));
                match line {
                    Some(l) if l.contains(reason) => Ok(()),
                    Some(l) => Err(format!("reported without {reason:?}: {l}")),
                    None => Err("not reported yet".into()),
                }
            },
        )
        .await;
    }
    // Reported once, not on every re-scan.
    let log = node.log(Service::ConfigSource);
    let path = node.path("manifests/broken.yaml").display().to_string();
    assert_eq!(
        log.lines().filter(|l| l.contains(&path)).count(),
        1,
        "{log}"
    );

    // The good pod kept running, untouched, and is still the only pod.
    let pods = node.pods().await.unwrap();
    assert_eq!(pods.len(), 1);
    assert_eq!(cri_containers(&node, &uid).await, before);

    // A good manifest turned bad keeps its pod (a half-written file must not kill it).
    node.write_manifest("web.yaml", "apiVersion: v1\nkind: Pod\nspec: {");
    let path = node.path("manifests/web.yaml").display().to_string();
    eventually("the broken edit to be reported", DEADLINE, || async {
        if node
            .log(Service::ConfigSource)
            .lines()
            .any(|l| l.contains(&path) && l.contains("kept_previous_version=true"))
        {
            Ok(())
        } else {
            Err("not yet".into())
        }
    })
    .await;
    assert_eq!(cri_containers(&node, &uid).await, before);
    node.stop().await;
}
