//! RuntimeClass against the real containerd, which `deploy/runtime/setup.sh` gives a second
//! handler, `runc-audited` (runc through a wrapper that records every call it gets):
//!
//! - a pod whose `runtimeClassName` names a class with that handler runs under it (the
//!   sandbox says so, and the wrapper saw its container created), with the class's
//!   `overhead.podFixed` (copied into the pod by the API server's admission) added to its
//!   pod cgroup's memory limit; a pod beside it without a class runs under plain runc;
//! - a pod naming a class the API server does not have: at the API server it is refused
//!   (admission); as a static pod it gets upstream's `FailedCreatePodSandBox` event with
//!   `runtimeclass.node.k8s.io "<name>" not found` and stays Pending, and once the class is
//!   created it starts (the worker retries).
//!
//! Needs root and containerd.

use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::Api;
use kube::api::PostParams;
use nodeagent_tests::{
    Node, NodeOptions, api_pod, api_pod_in_phase, cgroup, eventually, eventually_event,
    require_runtime,
};
use serde_json::json;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(90);
const HANDLER: &str = "runc-audited";
/// What the node's runtime's `runc-audited` wrapper recorded.
fn audited(node: &Node) -> String {
    std::fs::read_to_string(node.runtime().audit_log()).unwrap_or_default()
}

async fn create_class(client: &kube::Client, name: &str, handler: &str, overhead: Option<&str>) {
    let mut rc = json!({
        "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
        "metadata": {"name": name}, "handler": handler,
    });
    if let Some(memory) = overhead {
        rc["overhead"] = json!({"podFixed": {"memory": memory}});
    }
    let rc: RuntimeClass = serde_json::from_value(rc).unwrap();
    Api::<RuntimeClass>::all(client.clone())
        .create(&PostParams::default(), &rc)
        .await
        .expect("create the RuntimeClass");
}

/// The CRI runtime handler of the pod's sandbox.
async fn sandbox_handler(node: &Node, pod: &str) -> String {
    let full = node.pod_name(pod);
    node.sandboxes()
        .await
        .into_iter()
        .find(|s| s.metadata.as_ref().is_some_and(|m| m.name == full))
        .map(|s| s.runtime_handler)
        .unwrap_or_else(|| panic!("no sandbox of {full}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_class_picks_the_handler_and_adds_its_overhead() {
    if !require_runtime("RuntimeClass") {
        return;
    }
    let (server, node) = Node::start_with_api_server("runtimeclass", NodeOptions::default()).await;
    let client = server.client();
    let class = format!("audited-{}", node.name);
    create_class(&client, &class, HANDLER, Some("64Mi")).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let limited = |class: Option<&str>| {
        let mut spec = json!({"containers": [{
            "name": "c", "image": "busybox:1.36",
            "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.2; done"],
            "resources": {"limits": {"memory": "32Mi", "cpu": "100m"}},
        }]});
        if let Some(class) = class {
            spec["runtimeClassName"] = json!(class);
        }
        json!({ "spec": spec })
    };
    let (with, without) = (node.pod_name("with"), node.pod_name("without"));
    for (name, class) in [(&with, Some(class.as_str())), (&without, None)] {
        pods.create(
            &PostParams::default(),
            &api_pod(name, &node.name, limited(class)),
        )
        .await
        .unwrap();
    }
    let pod = api_pod_in_phase(&pods, &with, "Running", DEADLINE).await;
    api_pod_in_phase(&pods, &without, "Running", DEADLINE).await;
    let overhead = pod.spec.as_ref().and_then(|s| s.overhead.clone());
    assert_eq!(
        overhead.and_then(|o| o.get("memory").map(|q| q.0.clone())),
        Some("64Mi".to_string()),
        "the admission copies the class's overhead into the pod"
    );

    assert_eq!(sandbox_handler(&node, "with").await, HANDLER);
    assert_eq!(sandbox_handler(&node, "without").await, "");
    let with_id = node.container_id("with", "c").await.expect("container");
    let without_id = node.container_id("without", "c").await.expect("container");
    let log = audited(&node);
    assert!(
        log.lines()
            .any(|l| l.contains(" create ") && l.contains(&with_id)),
        "{HANDLER} did not create {with_id}"
    );
    assert!(
        !log.contains(&without_id),
        "{HANDLER} ran the pod without a class"
    );

    // The pod cgroup's limit: the container's 32Mi plus the class's 64Mi (Guaranteed: the
    // limits are the requests).
    let uid = pod.metadata.uid.clone().unwrap();
    assert_eq!(
        cgroup::memory_limit(&format!("kubepods/pod{uid}")).unwrap(),
        Some(96 << 20)
    );
    let plain_uid = pods.get(&without).await.unwrap().metadata.uid.unwrap();
    assert_eq!(
        cgroup::memory_limit(&format!("kubepods/pod{plain_uid}")).unwrap(),
        Some(32 << 20)
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_runtime_class_holds_the_pod_until_it_exists() {
    if !require_runtime("RuntimeClass") {
        return;
    }
    let (server, node) = Node::start_with_api_server("noclass", NodeOptions::default()).await;
    let client = server.client();
    let class = format!("late-{}", node.name);

    // The API server refuses a pod naming a class it does not have.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let refused = pods
        .create(
            &PostParams::default(),
            &api_pod(
                &node.pod_name("refused"),
                &node.name,
                json!({"spec": {"runtimeClassName": class}}),
            ),
        )
        .await
        .unwrap_err();
    assert!(
        refused
            .to_string()
            .contains(&format!("pod rejected: RuntimeClass \"{class}\" not found")),
        "{refused}"
    );

    // A static pod meets no admission: the node refuses its sandbox, as upstream.
    node.write_manifest(
        "static.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: static\nspec:\n  runtimeClassName: {class}\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: busybox:1.36\n    command: [\"sh\", \"-c\", \"trap 'exit 0' TERM; while true; do sleep 0.2; done\"]\n"
        ),
    );
    let full = node.pod_name("static");
    let event: Event = eventually_event(
        &client,
        "default",
        "FailedCreatePodSandBox",
        DEADLINE,
        |e| {
            e.reason.as_deref() == Some("FailedCreatePodSandBox")
                && e.involved_object.name.as_deref() == Some(full.as_str())
        },
    )
    .await;
    assert_eq!(
        event.message.as_deref(),
        Some(
            format!("Failed to create pod sandbox: runtimeclass.node.k8s.io \"{class}\" not found")
                .as_str()
        )
    );
    assert!(node.sandboxes().await.is_empty(), "no sandbox is made");
    let status = node.pod("static").await.unwrap();
    assert_eq!(status["status"]["phase"], "Pending", "{status}");

    // Once the class exists, the pod starts under its handler.
    create_class(&client, &class, HANDLER, None).await;
    eventually("the static pod running", DEADLINE, || async {
        node.container_id("static", "c")
            .await
            .ok_or_else(|| "no container yet".to_string())
    })
    .await;
    assert_eq!(sandbox_handler(&node, "static").await, HANDLER);
    node.stop().await;
}
