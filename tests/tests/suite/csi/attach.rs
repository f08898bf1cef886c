//! Attach and detach of a persistent CSI volume (issue 32) through the test API server's
//! attach/detach controller and the driver's external-attacher (`apiserver_attach`),
//! against the real containerd and the test CSI driver. Judged by upstream's rules, not
//! ours:
//! - kubelet_node_status.go: the kubelet registers its Node with the
//!   `volumes.kubernetes.io/controller-managed-attach-detach: "true"` annotation (and puts
//!   it back on an existing Node, `reconcileCMADAnnotationWithExistingNode`); without it
//!   the controller attaches nothing to the node;
//! - the attach/detach reconciler: a volume the Node lists in `status.volumesInUse` is never
//!   detached ("Cannot detach volume because it is still mounted");
//! - the operation generator's VerifyControllerAttachedVolume: nothing is staged before the
//!   Node lists the volume in `status.volumesAttached`.
//!
//! Attacked: SIGKILLs of the volume service, node-status and the CSI driver under a pod
//! that uses the volume (nothing detached, unstaged or published again, the pod stays
//! Ready, the Node keeps both lists); the pod deleted while node-status is down (the volume
//! is unstaged, but stays attached until the Node stops listing it in use).

use super::claims::{bound_claim, kubectl, persistent_driver, run_claim_pod, start_with_driver};
use super::*;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Patch, PatchParams};
use nodeagent_tests::apiserver_attach::{CONTROLLER_MANAGED_ANNOTATION, attachment_name};

/// Waits for the VolumeAttachment `name` to be gone (detached by the attacher).
pub(super) async fn detached(attachments: &Api<VolumeAttachment>, name: &str) {
    eventually("the VolumeAttachment gone", DEADLINE, || async {
        let va = attachments.get_opt(name).await.unwrap();
        va.is_none()
            .then_some(())
            .ok_or_else(|| format!("{:?}", va.map(|v| v.status)))
    })
    .await;
}

/// The Node's `status.volumesInUse` and the names in `status.volumesAttached`.
async fn node_lists(client: &kube::Client, node: &Node) -> (Vec<String>, Vec<String>) {
    let nodes: Api<ApiNode> = Api::all(client.clone());
    let status = nodes
        .get(&node.name)
        .await
        .unwrap()
        .status
        .unwrap_or_default();
    (
        status.volumes_in_use.unwrap_or_default(),
        status
            .volumes_attached
            .unwrap_or_default()
            .into_iter()
            .map(|a| a.name)
            .collect(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kills_under_an_attached_volume_never_detach_it_and_detach_waits_for_the_node() {
    if !require_runtime("csi") {
        return;
    }
    let (server, mut node, pods, mut driver) =
        start_with_driver("csi-attach", persistent_driver(true), "", &["--stage"]).await;
    let client = server.client();
    server.state.attachers.deploy(DRIVER, &driver.socket());

    // The Node registered for the controller's attach and detach, and it stays so.
    let annotation = || async {
        let nodes: Api<ApiNode> = Api::all(client.clone());
        let n = nodes.get(&node.name).await.unwrap();
        n.metadata
            .annotations
            .unwrap_or_default()
            .get(CONTROLLER_MANAGED_ANNOTATION)
            .cloned()
    };
    assert_eq!(annotation().await.as_deref(), Some("true"));
    let nodes: Api<ApiNode> = Api::all(client.clone());
    nodes
        .patch(
            &node.name,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {CONTROLLER_MANAGED_ANNOTATION: null}}}),
            ),
        )
        .await
        .unwrap();
    eventually("the annotation put back", DEADLINE, || async {
        let value = annotation().await;
        (value.as_deref() == Some("true"))
            .then_some(())
            .ok_or_else(|| format!("{value:?}"))
    })
    .await;

    let (claim, pv, handle) = (
        format!("claim-{}", node.name),
        format!("pv-{}", node.name),
        format!("vol-{}", node.name),
    );
    bound_claim(&client, &claim, &pv, &handle).await;
    let pod = run_claim_pod(&pods, &node, "user", &claim, "echo kept > /data/mark").await;
    let unique = format!("kubernetes.io/csi/{DRIVER}^{handle}");
    let attachment = attachment_name(&handle, DRIVER, &node.name);
    let attachments: Api<VolumeAttachment> = Api::all(client.clone());
    let attached = || async {
        let va = attachments.get_opt(&attachment).await.unwrap();
        let status = va.as_ref().and_then(|v| v.status.clone());
        (status.as_ref().is_some_and(|s| s.attached)
            && va.is_some_and(|v| v.metadata.deletion_timestamp.is_none()))
        .then_some(())
        .ok_or_else(|| format!("{status:?}"))
    };
    attached().await.unwrap();
    let lists = node_lists(&client, &node).await;
    assert_eq!(lists, (vec![unique.clone()], vec![unique.clone()]));

    // Each kill under the running pod: nothing detached, unstaged, unpublished or set up
    // again, the pod Ready, both lists unchanged (checked for a stated window after the
    // victim is back).
    let before = driver.log_lines("calls.log").len();
    for victim in ["volume", "node-status", "driver", "volume+node-status"] {
        match victim {
            "driver" => {
                if let Some(mut child) = driver.child.take() {
                    let _ = child.kill();
                    let _ = child.wait();
                }
                driver.start();
            }
            _ => {
                let services: &[Service] = match victim {
                    "volume" => &[Service::Volume],
                    "node-status" => &[Service::NodeStatus],
                    _ => &[Service::Volume, Service::NodeStatus],
                };
                for s in services {
                    node.signal(*s, Signal::SIGKILL).await;
                }
                for s in services {
                    node.spawn(*s);
                    node.wait_serving(*s).await;
                }
            }
        }
        consistently(
            &format!("the volume attached and used after the {victim} kill"),
            Duration::from_secs(5),
            Duration::from_millis(500),
            || async {
                ready(&pods, &pod).await?;
                attached().await?;
                let lists = node_lists(&client, &node).await;
                if lists != (vec![unique.clone()], vec![unique.clone()]) {
                    return Err(format!("the Node's lists: {lists:?}"));
                }
                let calls = driver.changing_calls_since(before);
                calls
                    .is_empty()
                    .then_some(())
                    .ok_or_else(|| format!("driver calls: {calls:?}"))
            },
        )
        .await;
    }
    let published = driver.calls("ControllerPublishVolume");
    assert_eq!(published.len(), 1, "attached once: {published:?}");

    // The pod deleted while node-status is down: the volume is unstaged, but the Node
    // still lists it in use, so it stays attached for as long as that lasts.
    node.signal(Service::NodeStatus, Signal::SIGKILL).await;
    pods.delete(&pod, &DeleteParams::default()).await.unwrap();
    eventually("the volume unstaged", DEADLINE, || async {
        (!driver.calls("NodeUnstageVolume").is_empty())
            .then_some(())
            .ok_or_else(|| "not yet".to_string())
    })
    .await;
    consistently(
        "attached while the Node lists the volume in use",
        Duration::from_secs(5),
        Duration::from_millis(500),
        || async {
            attached().await?;
            let unpublished = driver.calls("ControllerUnpublishVolume");
            unpublished
                .is_empty()
                .then_some(())
                .ok_or_else(|| format!("{unpublished:?}"))
        },
    )
    .await;
    // node-status back: no longer in use, then detached, as kubectl shows the Node.
    node.spawn(Service::NodeStatus);
    node.wait_serving(Service::NodeStatus).await;
    detached(&attachments, &attachment).await;
    let unpublished = driver.calls("ControllerUnpublishVolume");
    assert_eq!(unpublished.len(), 1, "{unpublished:?}");
    assert_eq!(unpublished[0]["volume_id"], handle.as_str());
    eventually("the Node's lists empty", DEADLINE, || async {
        let lists = node_lists(&client, &node).await;
        (lists == (vec![], vec![]))
            .then_some(())
            .ok_or_else(|| format!("{lists:?}"))
    })
    .await;
    let shown = kubectl(&server, &node, &["get", "volumeattachments", "-o", "name"]).await;
    assert_eq!(shown.trim(), "", "kubectl lists no VolumeAttachment");
    node.stop().await;
}
