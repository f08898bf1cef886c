//! A CreateContainerConfigError, as upstream scopes it, against the real containerd: it
//! marks only the container that cannot be made (its env names a config map that does not
//! exist yet), the pod's other container runs meanwhile, and the error clears once the
//! cause is gone.

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, PostParams};
use nodeagent_tests::{Node, NodeOptions, container_status, eventually, require_runtime};
use serde_json::{Value, json};
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(90);

fn waiting(pod: &Value, name: &str) -> String {
    container_status(pod, name)
        .and_then(|c| c["state"]["waiting"]["reason"].as_str())
        .unwrap_or_default()
        .to_string()
}

fn running(pod: &Value, name: &str) -> bool {
    container_status(pod, name).is_some_and(|c| c["state"]["running"].is_object())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_error_marks_only_its_container_and_clears_when_the_cause_is_gone() {
    if !require_runtime("CreateContainerConfigError") {
        return;
    }
    let (server, node) = Node::start_with_api_server("config-error", NodeOptions::default()).await;
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    let name = node.pod_name("two");
    let sleeper = "trap 'exit 0' TERM; while true; do sleep 0.2; done";
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node.name,
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {"name": "needs", "image": "busybox:1.36", "command": ["sh", "-c", sleeper],
                 "env": [{"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "later", "key": "mode"}}}]},
                {"name": "plain", "image": "busybox:1.36", "command": ["sh", "-c", sleeper]}
            ]
        }
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let seen = eventually("needs waiting, plain running", DEADLINE, || async {
        let p = node.pod("two").await?;
        if waiting(&p, "needs") == "CreateContainerConfigError" && running(&p, "plain") {
            Ok(p)
        } else {
            Err(p["status"].to_string())
        }
    })
    .await;
    let message = container_status(&seen, "needs").unwrap()["state"]["waiting"]["message"].clone();
    assert!(
        message.as_str().is_some_and(|m| m.contains("later")),
        "the message names the config map: {message}"
    );
    assert!(container_status(&seen, "plain").unwrap()["state"]["waiting"].is_null());

    // The config map appears: the error clears, and needs runs with the value.
    let maps: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let map: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "later", "namespace": "default"},
        "data": {"mode": "on"}
    }))
    .unwrap();
    maps.create(&PostParams::default(), &map).await.unwrap();
    let p = eventually("both running", DEADLINE, || async {
        let p = node.pod("two").await?;
        if running(&p, "needs") && running(&p, "plain") {
            Ok(p)
        } else {
            Err(p["status"].to_string())
        }
    })
    .await;
    assert_eq!(p["status"]["phase"], "Running", "{}", p["status"]);
    let id = node
        .container_id("two", "needs")
        .await
        .expect("needs' container");
    let env = node.exec(&id, &["sh", "-c", "echo $MODE"]).await.unwrap();
    assert_eq!(env.trim(), "on");
    // plain was never restarted while needs waited.
    assert_eq!(container_status(&p, "plain").unwrap()["restartCount"], 0);
    node.stop().await;
}
