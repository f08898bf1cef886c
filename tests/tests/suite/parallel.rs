//! Pod workers wait in parallel, and status does not wait for pleg, against the real
//! containerd: pods that wait out a long grace period hold back neither each other's
//! SIGTERM nor the start of another pod (before, four syncs at a time were allowed, grace
//! periods included), and a container that pod-sync started shows Running in `/pods`
//! without waiting for pleg's next relist.

use nodeagent_tests::{Node, NodeOptions, container_status, eventually, require_runtime};
use serde_json::{Value, json};
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(90);
/// More pods than the four syncs the old cap let run at once.
const TERMINATING: usize = 6;
/// Longer than every wait below: a pod that needed another's grace to end first fails.
const GRACE: i64 = 150;

/// A pod of one busybox container running `script`, with the host directory `out` at
/// `/out`.
fn pod(name: &str, grace: i64, script: &str, out: &str) -> String {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": grace,
            "containers": [{"name": "c", "image": "busybox:1.36",
                "command": ["sh", "-c", script],
                "volumeMounts": [{"name": "out", "mountPath": "/out"}]}],
            "volumes": [{"name": "out", "hostPath": {"path": out}}],
        }
    })
    .to_string()
}

fn running(pod: &Value) -> bool {
    pod["status"]["phase"] == "Running"
        && container_status(pod, "c").is_some_and(|c| c["state"]["running"].is_object())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_waiting_out_their_grace_hold_back_neither_each_other_nor_a_new_pod() {
    if !require_runtime("parallel termination") {
        return;
    }
    let node = Node::start("parallel", NodeOptions::default()).await;
    let out = node.path("out");
    std::fs::create_dir_all(&out).unwrap();
    let out = out.display().to_string();
    for i in 0..TERMINATING {
        // SIGTERM is noted on the host and otherwise ignored: each pod waits out its grace.
        let script = format!("trap 'touch /out/term-{i}' TERM; while true; do sleep 0.2; done");
        node.write_manifest(
            &format!("t{i}.json"),
            &pod(&format!("t{i}"), GRACE, &script, &out),
        );
    }
    eventually("every pod running", DEADLINE, || async {
        let pods = node.pods().await?;
        let n = pods.iter().filter(|p| running(p)).count();
        (n == TERMINATING)
            .then_some(())
            .ok_or_else(|| format!("{n} of {TERMINATING} running"))
    })
    .await;
    let mut ids = Vec::new();
    for i in 0..TERMINATING {
        ids.extend(node.container_id(&format!("t{i}"), "c").await);
    }
    assert_eq!(ids.len(), TERMINATING, "one container per pod");

    for i in 0..TERMINATING {
        node.remove_manifest(&format!("t{i}.json"));
    }
    eventually(
        "every removed pod's container got SIGTERM",
        DEADLINE,
        || async {
            let got = (0..TERMINATING)
                .filter(|i| std::path::Path::new(&format!("{out}/term-{i}")).exists())
                .count();
            (got == TERMINATING)
                .then_some(())
                .ok_or_else(|| format!("{got} of {TERMINATING} got SIGTERM"))
        },
    )
    .await;

    // A pod added now starts while the others wait out their grace.
    node.write_manifest("new.json", &pod("new", 1, "sleep 3600", &out));
    eventually("the new pod running", DEADLINE, || async {
        let p = node.pod("new").await?;
        running(&p)
            .then_some(())
            .ok_or_else(|| format!("not running: {}", p["status"]))
    })
    .await;

    // Nothing was cut short: the removed pods' containers still run out their grace.
    let states: Vec<i32> = node
        .containers()
        .await
        .into_iter()
        .filter(|c| ids.contains(&c.id))
        .map(|c| c.state)
        .collect();
    let running_state = nodeagent_proto::cri::ContainerState::ContainerRunning as i32;
    assert_eq!(
        states,
        vec![running_state; TERMINATING],
        "the terminating containers still run within their grace"
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_started_container_shows_running_without_waiting_for_pleg() {
    if !require_runtime("status from pod-sync's own runtime reads") {
        return;
    }
    // pleg relists once at its start and then not for five minutes, and no periodic
    // resync comes sooner: only pod-sync's own reads can show the container running.
    let node = Node::start(
        "own-status",
        NodeOptions {
            pleg_relist_period: Some("300s".into()),
            sync_frequency: Some("300s".into()),
            ..Default::default()
        },
    )
    .await;
    let out = node.path("out");
    std::fs::create_dir_all(&out).unwrap();
    node.write_manifest(
        "p.json",
        &pod("p", 1, "sleep 3600", &out.display().to_string()),
    );
    eventually("/pods says Running", DEADLINE, || async {
        let p = node.pod("p").await?;
        running(&p)
            .then_some(())
            .ok_or_else(|| format!("not running: {}", p["status"]))
    })
    .await;
    node.stop().await;
}
