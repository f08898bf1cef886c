//! Resource admission as upstream's kubelet does it (pkg/kubelet/lifecycle/predicate.go):
//! a pod asking for more CPU than allocatable is Failed `OutOfcpu`, one asking for more
//! ephemeral-storage `OutOfephemeral-storage`, a pod beyond `maxPods` is Failed `OutOfpods`,
//! each with InsufficientResourceError's message after upstream's "Pod was rejected: "
//! (kubelet.go `rejectPod`), nothing of it runs,
//! and a refused pod does not count against the pods that come after it. API pods: static
//! pods are critical (upstream's `IsCriticalPod`), for which upstream preempts others
//! instead; we admit them.

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;
use nodeagent_tests::{Node, NodeOptions, api_pod, api_pod_in_phase, require_runtime};
use serde_json::json;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(90);

async fn create(pods: &Api<Pod>, node: &Node, name: &str, cpu: Option<&str>) -> String {
    let resources = match cpu {
        Some(c) => json!({"requests": {"cpu": c}}),
        None => json!({}),
    };
    create_with(pods, node, name, resources).await
}

async fn create_with(
    pods: &Api<Pod>,
    node: &Node,
    name: &str,
    resources: serde_json::Value,
) -> String {
    let name = node.pod_name(name);
    let extra = json!({"spec": {"containers": [{"name": "c", "image": "busybox:1.36",
        "command": ["sleep", "3600"], "resources": resources}]}});
    pods.create(&PostParams::default(), &api_pod(&name, &node.name, extra))
        .await
        .unwrap();
    name
}

fn reason_and_message(p: &Pod) -> (String, String) {
    let s = p.status.clone().unwrap_or_default();
    (s.reason.unwrap_or_default(), s.message.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_beyond_max_pods_or_allocatable_cpu_are_refused_in_upstreams_words() {
    if !require_runtime("admission") {
        return;
    }
    let (server, node) = Node::start_with_api_server(
        "admission",
        NodeOptions {
            extra_config: "maxPods: 2\n".into(),
            ..Default::default()
        },
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    let cpus = nodeagent_config::machine::cpus() * 1000;

    // More CPU than the node has: OutOfcpu, and no container.
    let hog = create(&pods, &node, "hog", Some("1000")).await;
    let refused = api_pod_in_phase(&pods, &hog, "Failed", DEADLINE).await;
    assert_eq!(
        reason_and_message(&refused),
        (
            "OutOfcpu".to_string(),
            format!(
                "Pod was rejected: Node didn't have enough resource: cpu, requested: 1000000, used: 0, capacity: {cpus}"
            )
        )
    );
    assert_eq!(node.container_id(&hog, "c").await, None);

    // More ephemeral-storage than the node's filesystem holds (a limit, which is also the
    // request by defaulting): OutOfephemeral-storage, against the allocatable the Node
    // shows (node-status reports it in Ki).
    let filler = create_with(
        &pods,
        &node,
        "filler",
        json!({"limits": {"ephemeral-storage": "1000Ti"}}),
    )
    .await;
    let refused = api_pod_in_phase(&pods, &filler, "Failed", DEADLINE).await;
    let (reason, message) = reason_and_message(&refused);
    assert_eq!(reason, "OutOfephemeral-storage", "{message}");
    let prefix = "Pod was rejected: Node didn't have enough resource: ephemeral-storage, requested: 1099511627776000, used: 0, capacity: ";
    let capacity: i64 = message
        .strip_prefix(prefix)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("{message}"));
    let shown: k8s_openapi::api::core::v1::Node =
        Api::all(server.client()).get(&node.name).await.unwrap();
    let shown = shown.status.unwrap().allocatable.unwrap()["ephemeral-storage"]
        .0
        .clone();
    let shown_bytes = shown
        .strip_suffix("Ki")
        .and_then(|k| k.parse::<i64>().ok())
        .map(|k| k * 1024)
        .unwrap_or_else(|| panic!("allocatable ephemeral-storage {shown}"));
    assert!(
        capacity > 0 && (capacity - shown_bytes).abs() < 1024,
        "admitted against {capacity}, the Node shows {shown}"
    );
    assert_eq!(node.container_id(&filler, "c").await, None);

    // Two fit (the refused one does not count), the third is one too many.
    let a = create(&pods, &node, "a", Some("100m")).await;
    api_pod_in_phase(&pods, &a, "Running", DEADLINE).await;
    let b = create(&pods, &node, "b", None).await;
    api_pod_in_phase(&pods, &b, "Running", DEADLINE).await;
    let c = create(&pods, &node, "c", None).await;
    let refused = api_pod_in_phase(&pods, &c, "Failed", DEADLINE).await;
    assert_eq!(
        reason_and_message(&refused),
        (
            "OutOfpods".to_string(),
            "Pod was rejected: Node didn't have enough resource: pods, requested: 1, used: 2, capacity: 2"
                .to_string()
        )
    );
    assert_eq!(node.container_id(&c, "c").await, None);
    // The admitted ones run on.
    for name in [&a, &b] {
        api_pod_in_phase(&pods, name, "Running", DEADLINE).await;
    }
    node.stop().await;
    drop(server);
}
