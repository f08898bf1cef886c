//! Limits against the real services and containerd: static pods that add up to more than
//! any one gRPC message may carry all run and are listed by /pods, and pod-sync (restarted) follows config-source's
//! chunked snapshot; a pod over the per-pod size limit is refused at the source while the
//! others run; a `$(VAR)` doubling chain is a CreateContainerConfigError, not a pod-sync
//! that runs out of memory.

use nix::sys::signal::Signal;
use nodeagent_config::Service;
use nodeagent_tests::{Node, NodeOptions, eventually, http_get, require_runtime};
use serde_json::json;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(120);
const LARGE_PODS: usize = 12;

/// A static pod manifest (JSON is YAML) with an annotation of `padding` bytes.
fn manifest(name: &str, padding: usize, env: serde_json::Value) -> String {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "annotations": {"example.com/padding": "p".repeat(padding)}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "c", "image": "busybox:1.36", "env": env,
                "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.2; done"],
            }]
        }
    })
    .to_string()
}

/// The names of the listed pods that are Running.
async fn running(node: &Node) -> Result<Vec<String>, String> {
    Ok(node
        .pods()
        .await?
        .iter()
        .filter(|p| p["status"]["phase"] == "Running")
        .filter_map(|p| p["metadata"]["name"].as_str().map(String::from))
        .collect())
}

async fn all_large_pods_running(node: &Node) -> Result<(), String> {
    let running = running(node).await?;
    let missing: Vec<String> = (0..LARGE_PODS)
        .map(|i| node.pod_name(&format!("large-{i}")))
        .filter(|n| !running.contains(n))
        .collect();
    match missing.is_empty() {
        true => Ok(()),
        false => Err(format!("not running yet: {missing:?}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_over_the_message_limit_in_total_run_and_an_oversized_pod_is_refused() {
    if !require_runtime("large pods") {
        return;
    }
    let mut node = Node::start(
        "large-pods",
        NodeOptions {
            no_services: true,
            ..Default::default()
        },
    )
    .await;
    // 12 x 700 KiB: about 8.4 MiB, twice tonic's default limit, each pod under the per-pod
    // limit. Not more: the pods' annotations are also on their CRI sandboxes, and containerd
    // answers ListPodSandbox in one message of at most 16 MiB, so a node whose pods carry
    // more than that in total cannot be relisted (as upstream).
    for i in 0..LARGE_PODS {
        node.write_manifest(
            &format!("large-{i}.yaml"),
            &manifest(&format!("large-{i}"), 700 << 10, json!([])),
        );
    }
    node.write_manifest("huge.yaml", &manifest("huge", 3 << 20, json!([])));
    for s in Service::ALL {
        node.spawn(s);
    }
    eventually("every large pod running", DEADLINE, || {
        all_large_pods_running(&node)
    })
    .await;
    let log = node.log(Service::ConfigSource);
    let refused = log
        .lines()
        .find(|l| l.contains("huge.yaml") && l.contains("the limit is 1572864 bytes"));
    assert!(
        refused.is_some(),
        "no refusal naming the file and the limit:\n{log}"
    );
    let huge = node.pod_name("huge");
    assert!(!running(&node).await.unwrap().contains(&huge));
    let before = node.containers().await;

    // A restarted pod-sync gets the whole set as one (chunked) snapshot, and probe then
    // gets pod-sync's status snapshot the same way.
    let log_len = node.log(Service::PodSync).len();
    node.signal(Service::PodSync, Signal::SIGKILL).await;
    node.spawn(Service::PodSync);
    eventually(
        "pod-sync following config-source again",
        DEADLINE,
        || async {
            let log = node.log(Service::PodSync);
            let new = &log[log_len.min(log.len())..];
            if new.contains("config-source stream broken") {
                panic!("pod-sync cannot follow config-source:\n{new}");
            }
            match new.contains("following config-source") {
                true => Ok(()),
                false => Err("not yet".to_string()),
            }
        },
    )
    .await;
    eventually(
        "/pods lists every large pod after the restart",
        DEADLINE,
        || all_large_pods_running(&node),
    )
    .await;
    let mut after = node.containers().await;
    let mut before = before;
    before.sort_by(|a, b| a.id.cmp(&b.id));
    after.sort_by(|a, b| a.id.cmp(&b.id));
    let ids = |cs: &[nodeagent_proto::cri::Container]| -> Vec<(String, u32)> {
        cs.iter()
            .map(|c| (c.id.clone(), c.metadata.as_ref().map_or(0, |m| m.attempt)))
            .collect()
    };
    assert_eq!(
        ids(&after),
        ids(&before),
        "the restart changed no container"
    );
    let probe_log = node.log(Service::Probe);
    assert!(
        !probe_log.contains("decoded message length too large"),
        "probe could not follow pod-sync:\n{probe_log}"
    );
    let (code, body) = http_get(node.healthz_port, "/healthz").await.unwrap();
    assert_eq!(code, 200, "{body}");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_doubling_env_chain_is_a_create_container_config_error() {
    if !require_runtime("env doubling chain") {
        return;
    }
    let node = Node::start("env-chain", NodeOptions::default()).await;
    // V30 would expand to 64 GiB.
    let mut env = vec![json!({"name": "V0", "value": "x".repeat(64)})];
    for n in 1..=30 {
        let value = format!("$(V{})$(V{})", n - 1, n - 1);
        env.push(json!({"name": format!("V{n}"), "value": value}));
    }
    node.write_manifest("chain.yaml", &manifest("chain", 0, json!(env)));
    node.write_manifest("plain.yaml", &manifest("plain", 0, json!([])));
    let message = node
        .waiting_message("chain", "c", "CreateContainerConfigError", DEADLINE)
        .await;
    assert!(
        message.contains("\"V12\"") && message.contains("131072 bytes"),
        "{message}"
    );
    // pod-sync stays healthy and keeps running other pods.
    eventually("the plain pod running", DEADLINE, || async {
        let names = running(&node).await?;
        match names.contains(&node.pod_name("plain")) {
            true => Ok(()),
            false => Err(format!("running: {names:?}")),
        }
    })
    .await;
    nodeagent_transport::check_health(
        nodeagent_transport::connect(&node.socket(Service::PodSync)),
        "",
        Duration::from_secs(2),
    )
    .await
    .expect("pod-sync healthy");
    let (code, body) = http_get(node.healthz_port, "/healthz").await.unwrap();
    assert_eq!(code, 200, "{body}");
    node.stop().await;
}
