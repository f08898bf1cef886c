//! What follows a kill, as upstream's computePodActions decides it, against the real
//! containerd: a container whose spec changed (its image) is replaced at once whatever the
//! restart policy; a container that fails its liveness probe under Never is not restarted.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use nodeagent_tests::{Node, NodeOptions, container_status, eventually, require_runtime};
use serde_json::{Value, json};
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(90);

async fn api_pod(pods: &Api<Pod>, name: &str) -> Result<Value, String> {
    let p = pods.get(name).await.map_err(|e| e.to_string())?;
    Ok(serde_json::to_value(p).unwrap())
}

fn running_id(pod: &Value, name: &str) -> Option<String> {
    let c = container_status(pod, name)?;
    c["state"]["running"]
        .is_object()
        .then(|| c["containerID"].as_str().unwrap_or_default().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_image_replaces_the_container_even_under_never() {
    if !require_runtime("a changed image under Never") {
        return;
    }
    let (server, node) = Node::start_with_api_server("image-change", NodeOptions::default()).await;
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    let name = node.pod_name("changed");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node.name,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": "busybox:1.36",
                "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.2; done"]}]
        }
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let first = eventually("the container running", DEADLINE, || async {
        let p = api_pod(&pods, &name).await?;
        running_id(&p, "c").ok_or_else(|| p["status"].to_string())
    })
    .await;
    // The same image by another name: upstream hashes the image string, so this is a
    // change (the only container field a pod update may change).
    let patch =
        json!({"spec": {"containers": [{"name": "c", "image": "docker.io/library/busybox:1.36"}]}});
    pods.patch(&name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .unwrap();
    let pod = eventually("a new container with the new image", DEADLINE, || async {
        let p = api_pod(&pods, &name).await?;
        match running_id(&p, "c") {
            Some(id) if id != first => Ok(p),
            _ => Err(p["status"].to_string()),
        }
    })
    .await;
    let c = container_status(&pod, "c").unwrap();
    assert_eq!(c["restartCount"], 1, "{c}");
    assert_eq!(c["image"], "docker.io/library/busybox:1.36", "{c}");
    assert_eq!(pod["status"]["phase"], "Running", "{}", pod["status"]);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_liveness_probe_under_never_kills_without_a_restart() {
    if !require_runtime("liveness under Never") {
        return;
    }
    let node = Node::start("liveness-never", NodeOptions::default()).await;
    let manifest = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "never"},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": "busybox:1.36",
                "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.2; done"],
                "livenessProbe": {"exec": {"command": ["false"]},
                    "periodSeconds": 1, "failureThreshold": 1}}]
        }
    });
    node.write_manifest("never.json", &manifest.to_string());
    // Killed once (its TERM trap exits 0), not restarted: a static pod keeps the phase
    // its containers give it, Succeeded here.
    let pod = eventually("the Never pod finished", DEADLINE, || async {
        let p = node.pod("never").await?;
        let done = container_status(&p, "c").is_some_and(|c| c["state"]["terminated"].is_object());
        if done {
            Ok(p)
        } else {
            Err(p["status"].to_string())
        }
    })
    .await;
    let c = container_status(&pod, "c").unwrap();
    assert_eq!(c["restartCount"], 0, "{c}");
    assert_eq!(pod["status"]["phase"], "Succeeded", "{}", pod["status"]);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_loop_back_off_carries_over_into_a_new_sandbox() {
    if !require_runtime("back-off in a new sandbox") {
        return;
    }
    let node = Node::start("backoff-sandbox", NodeOptions::default()).await;
    let manifest = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "crashy"},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": "busybox:1.36",
                "command": ["sh", "-c", "sleep 1; exit 1"]}]
        }
    });
    node.write_manifest("crashy.json", &manifest.to_string());
    // Its third run crashed: the next one waits 20 s.
    eventually("in a 20 s back-off", DEADLINE, || async {
        let p = node.pod("crashy").await?;
        let c = container_status(&p, "c").ok_or("no status")?;
        if c["restartCount"] == 2 && c["state"]["waiting"]["reason"] == "CrashLoopBackOff" {
            Ok(())
        } else {
            Err(p["status"].to_string())
        }
    })
    .await;
    node.stop_only_sandbox().await;
    // The fourth run, in a new sandbox, still waited out the back-off (containerd's own
    // timestamps: it was created at least 15 s after the third one finished); before, a
    // new sandbox started it at once.
    let (previous_end, next_created) = eventually("the fourth run", DEADLINE, || async {
        let containers = node.containers().await;
        let by_attempt = |a: u32| {
            containers
                .iter()
                .find(|c| c.metadata.as_ref().is_some_and(|m| m.attempt == a))
                .cloned()
        };
        match (by_attempt(2), by_attempt(3)) {
            (Some(third), Some(fourth)) => {
                let finished = node
                    .cri
                    .container_status(&third.id)
                    .await
                    .map_err(|e| e.to_string())?
                    .status
                    .ok_or("no status")?
                    .finished_at;
                Ok((finished, fourth.created_at))
            }
            _ => Err(format!("{} containers", containers.len())),
        }
    })
    .await;
    let waited = Duration::from_nanos((next_created - previous_end).max(0) as u64);
    assert!(
        waited >= Duration::from_secs(15),
        "restarted {waited:?} after the crash"
    );
    assert_eq!(node.sandboxes().await.len(), 2, "a new sandbox");
    node.stop().await;
}
