//! The container GC against the real containerd: a pod whose sandbox dies three times
//! behind the agent's back leaves dead containers and sandboxes; the GC keeps exactly
//! `--maximum-dead-containers-per-container` dead containers and the sandboxes that hold
//! them, and what the user sees of the pod (phase, readiness, restart count, last state)
//! does not change. Needs root and containerd.

use nodeagent_config::Service;
use nodeagent_proto::cri;
use nodeagent_tests::{Node, NodeOptions, eventually, require_runtime};
use std::time::Duration;

/// The GC runs every minute; a pass and pleg's relist must fit.
const DEADLINE: Duration = Duration::from_secs(150);

const POD: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: churn
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: busybox:1.36
    command: ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]
"#;

/// (running, exited) container ids of `main`, and the pod's sandboxes, from CRI.
async fn runtime(node: &Node) -> (Vec<String>, Vec<String>, Vec<cri::PodSandbox>) {
    let full = node.pod_name("churn");
    let (mut running, mut exited) = (Vec::new(), Vec::new());
    for c in node.containers().await {
        if c.labels.get("io.kubernetes.pod.name") != Some(&full) {
            continue;
        }
        if c.state == cri::ContainerState::ContainerRunning as i32 {
            running.push(c.id);
        } else {
            exited.push(c.id);
        }
    }
    let sandboxes = node
        .sandboxes()
        .await
        .into_iter()
        .filter(|s| s.metadata.as_ref().is_some_and(|m| m.name == full))
        .collect();
    (running, exited, sandboxes)
}

/// What the user sees: (phase, ready, restartCount, lastState present).
async fn seen(node: &Node) -> Result<(String, bool, i64, bool), String> {
    let pod = node.pod("churn").await?;
    let cs = &pod["status"]["containerStatuses"][0];
    Ok((
        pod["status"]["phase"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        cs["ready"].as_bool().unwrap_or(false),
        cs["restartCount"].as_i64().unwrap_or(-1),
        cs["lastState"]["terminated"].is_object(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gc_keeps_the_configured_dead_containers_and_their_sandboxes() {
    if !require_runtime("container GC") {
        return;
    }
    let options = NodeOptions {
        service_args: vec![(
            Service::PodSync,
            // A pass every 5 s instead of upstream's minute: the test waits for passes.
            vec![
                "--maximum-dead-containers-per-container=2".into(),
                "--container-gc-period=5s".into(),
            ],
        )],
        ..Default::default()
    };
    let node = Node::start("containergc", options).await;
    node.write_manifest("churn.yaml", POD);
    // The sandbox dies three times; each time the pod comes back in a new one.
    for round in 1..=3 {
        let ready = eventually(
            &format!("round {round}: the pod running"),
            DEADLINE,
            || async {
                let (running, _, sandboxes) = runtime(&node).await;
                let ready: Vec<_> = sandboxes
                    .iter()
                    .filter(|s| s.state == cri::PodSandboxState::SandboxReady as i32)
                    .collect();
                match (running.len(), ready.as_slice()) {
                    (1, [s]) => Ok(s.id.clone()),
                    _ => Err(format!(
                        "{} running, {} ready sandboxes",
                        running.len(),
                        ready.len()
                    )),
                }
            },
        )
        .await;
        let mut rt = node.cri.runtime.clone();
        rt.stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: ready,
        })
        .await
        .expect("StopPodSandbox");
    }
    let before = eventually(
        "the pod back, Running and Ready, restarted",
        DEADLINE,
        || async {
            let s = seen(&node).await?;
            let (running, _, _) = runtime(&node).await;
            if s.0 == "Running" && s.1 && s.2 >= 1 && s.3 && running.len() == 1 {
                Ok(s)
            } else {
                Err(format!("{s:?}, {} running", running.len()))
            }
        },
    )
    .await;

    // Within a GC pass: exactly two dead containers, and only the sandboxes that hold them
    // or run the pod.
    let (running, exited, sandboxes) =
        eventually("the GC to leave 2 dead containers", DEADLINE, || async {
            let (running, exited, sandboxes) = runtime(&node).await;
            if exited.len() == 2 && sandboxes.len() == 3 {
                Ok((running, exited, sandboxes))
            } else {
                Err(format!(
                    "{} dead containers, {} sandboxes",
                    exited.len(),
                    sandboxes.len()
                ))
            }
        })
        .await;
    assert_eq!(running.len(), 1);
    let holders: Vec<String> = node
        .containers()
        .await
        .into_iter()
        .filter(|c| exited.contains(&c.id) || running.contains(&c.id))
        .map(|c| c.pod_sandbox_id)
        .collect();
    for s in &sandboxes {
        assert!(
            holders.contains(&s.id),
            "an empty old sandbox was kept: {s:?}"
        );
    }
    // The user sees the same pod: nothing restarted, the count kept.
    assert_eq!(seen(&node).await.unwrap(), before);

    node.remove_manifest("churn.yaml");
    eventually("the removed pod leaves nothing", DEADLINE, || async {
        let (running, exited, sandboxes) = runtime(&node).await;
        if running.len() + exited.len() + sandboxes.len() == 0 {
            Ok(())
        } else {
            Err(format!(
                "{running:?} {exited:?} {} sandboxes",
                sandboxes.len()
            ))
        }
    })
    .await;
    node.stop().await;
}
