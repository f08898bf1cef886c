//! When pleg cannot read a pod's status, it reads it again at its next relist (upstream's
//! `podsToReinspect`), and it never passes the failure on as "the pod is gone": pleg talks
//! to the real containerd through a proxy that fails `ContainerStatus` on demand
//! (containerd cannot be made to); pod-sync and the test talk to containerd directly.

use nodeagent_config::Service;
use nodeagent_proto::api::GetPodStatusRequest;
use nodeagent_proto::api::pleg_client::PlegClient;
use nodeagent_tests::cri_fault::CriFaultProxy;
use nodeagent_tests::{
    Node, NodeOptions, container_status, eventually, is_running, require_runtime,
};
use std::path::Path;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(60);

/// A node whose pleg reads the real containerd through a fault proxy, and a directory
/// (`out`) for the pod's hostPath volume.
struct Setup {
    proxy: CriFaultProxy,
    node: Node,
    out: std::path::PathBuf,
    _sockets: tempfile::TempDir,
}

async fn node_behind_a_proxy(test: &str) -> Setup {
    let mut node = Node::start(
        test,
        NodeOptions {
            no_services: true,
            // No periodic resync to paper over a stale pleg within the test's time.
            sync_frequency: Some("5m".into()),
            ..Default::default()
        },
    )
    .await;
    // The proxy stands before the runtime the node leased.
    let sockets = tempfile::tempdir().unwrap();
    let proxy =
        CriFaultProxy::start(&sockets.path().join("cri.sock"), &node.runtime().socket).await;
    node.set_service_args(
        Service::Pleg,
        vec!["--container-runtime-endpoint".into(), proxy.endpoint()],
    );
    node.spawn_all();
    let out = node.path("out");
    std::fs::create_dir_all(&out).unwrap();
    Setup {
        proxy,
        node,
        out,
        _sockets: sockets,
    }
}

/// A static pod whose container exits 3 once `<out>/exit` exists.
fn exiting_pod(out: &Path) -> String {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "exits"},
        "spec": {
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "c", "image": "busybox:1.36",
                "command": ["sh", "-c", "while [ ! -f /out/exit ]; do sleep 0.1; done; exit 3"],
                "volumeMounts": [{"name": "out", "mountPath": "/out"}],
            }],
            "volumes": [{"name": "out", "hostPath": {"path": out, "type": "Directory"}}],
        }
    })
    .to_string()
}

/// Waits until pleg's GetPodStatus shows container `id` of pod `exits` running.
async fn pleg_sees_running(node: &Node, id: &str) {
    let uid = node.pod("exits").await.unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    let pleg = PlegClient::new(nodeagent_transport::connect(&node.socket(Service::Pleg)));
    let running = nodeagent_proto::cri::ContainerState::ContainerRunning as i32;
    eventually("pleg's view of the running container", DEADLINE, || {
        let (mut pleg, uid) = (pleg.clone(), uid.clone());
        async move {
            let status = pleg
                .get_pod_status(GetPodStatusRequest {
                    pod_uid: uid,
                    newer_than_unix_nanos: 0,
                })
                .await
                .map_err(|e| e.to_string())?
                .into_inner();
            status
                .containers
                .iter()
                .any(|c| c.id == id && c.state == running)
                .then_some(())
                .ok_or_else(|| format!("{:?}", status.containers))
        }
    })
    .await;
}

/// Waits until `proxy` has failed two more calls: relists have come and gone.
async fn two_more_failures(proxy: &CriFaultProxy) {
    let before = proxy.failures();
    eventually("two more failed status reads", DEADLINE, || async {
        (proxy.failures() >= before + 2)
            .then_some(())
            .ok_or_else(|| format!("{} failed reads", proxy.failures()))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_read_that_failed_is_retried_at_the_next_relist() {
    if !require_runtime("pleg reinspection") {
        return;
    }
    let Setup {
        proxy,
        node,
        out,
        _sockets,
    } = node_behind_a_proxy("reinspect").await;
    node.write_manifest("exits.json", &exiting_pod(&out));
    let id = node.running_container("exits", "c", DEADLINE).await;
    // pleg has read the running container (pod-sync reports its own starts at once).
    pleg_sees_running(&node, &id).await;

    // The container exits while every status read of pleg's fails.
    proxy.fail("RuntimeService/ContainerStatus");
    std::fs::write(out.join("exit"), "").unwrap();
    let exited = nodeagent_proto::cri::ContainerState::ContainerExited as i32;
    eventually("the container exited in the runtime", DEADLINE, || async {
        let state = node.containers().await.into_iter().find(|c| c.id == id);
        match state {
            Some(c) if c.state == exited => Ok(()),
            other => Err(format!("{:?}", other.map(|c| c.state))),
        }
    })
    .await;
    // Relists after the exit have listed it and failed to read its status.
    two_more_failures(&proxy).await;
    let pod = node.pod("exits").await.unwrap();
    eprintln!(
        "while pleg could not read the status, /pods said: {}",
        container_status(&pod, "c").unwrap()["state"]
    );

    // Reads work again; nothing changes in the runtime, yet the next relist reads the pod.
    proxy.heal();
    let pod = eventually(
        "/pods showing the exit",
        Duration::from_secs(20),
        || async {
            let pod = node.pod("exits").await?;
            let terminated =
                &container_status(&pod, "c").ok_or("no status")?["state"]["terminated"];
            (terminated["exitCode"] == 3 && pod["status"]["phase"] == "Failed")
                .then_some(pod.clone())
                .ok_or_else(|| pod["status"].to_string())
        },
    )
    .await;
    assert!(!is_running(&pod, "c"));
    node.stop().await;
}

/// upstream keeps a failed inspection's error in its cache, so the pod worker waits; ours
/// answered GetPodStatus with "a newer relist saw nothing of this pod", and pod-sync then
/// tried to create a second sandbox beside the running one (containerd refused the name).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_pleg_cannot_read_is_not_taken_for_gone() {
    if !require_runtime("pleg reinspection") {
        return;
    }
    let Setup {
        proxy,
        node,
        out,
        _sockets,
    } = node_behind_a_proxy("unread").await;
    // pleg cannot read any container from before the pod's start.
    proxy.fail("RuntimeService/ContainerStatus");
    node.write_manifest("exits.json", &exiting_pod(&out));
    let id = node.running_container("exits", "c", DEADLINE).await;
    two_more_failures(&proxy).await;
    two_more_failures(&proxy).await;
    let sandboxes = node.sandboxes().await;
    assert_eq!(sandboxes.len(), 1, "one sandbox: {sandboxes:?}");
    let log = node.log(Service::PodSync);
    assert!(
        !log.contains("FailedCreatePodSandBox") && !log.contains("RunPodSandbox:"),
        "pod-sync tried to start the pod again while pleg could not read it:\n{log}"
    );
    // The pod still runs, as it did; once pleg can read it, nothing changes.
    assert!(is_running(&node.pod("exits").await.unwrap(), "c"));
    proxy.heal();
    pleg_sees_running(&node, &id).await;
    assert_eq!(node.sandboxes().await.len(), 1);
    assert_eq!(node.running_container("exits", "c", DEADLINE).await, id);
    node.stop().await;
}
