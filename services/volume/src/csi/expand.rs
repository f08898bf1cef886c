//! Node expansion of a claimed CSI volume that grew (upstream's `NodeExpander` in
//! pkg/volume/util/operationexecutor/node_expander.go and `csiPlugin.NodeExpand` in
//! pkg/volume/csi/expander.go).
//!
//! The external resizer grows the volume on the storage side, sets the PV's capacity and
//! leaves the claim's `status.allocatedResourceStatuses.storage` at `NodeResizePending`
//! when the driver needs the node's part. At the pod's next set-up pass the volume service
//! then marks the claim `NodeResizeInProgress`, calls the driver's `NodeExpandVolume` on
//! the publish target, and on success sets the claim's `status.capacity` to the PV's,
//! clears its resize status and condition, and posts `FileSystemResizeSuccessful` on the
//! pod and on the claim. A failure is posted as `VolumeResizeFailed` and retried at the
//! next pass; it never unmounts the volume nor holds the pod back.

use super::persistent::staging_path;
use super::{Csi, call, go_rpc_error};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use nodeagent_config::events::EventType;
use std::path::Path;

/// The claim's resize status values upstream's kubelet acts on.
const NODE_RESIZE_PENDING: &str = "NodeResizePending";
const NODE_RESIZE_IN_PROGRESS: &str = "NodeResizeInProgress";
/// The claim conditions a finished resize clears (upstream's `MarkFSResizeFinished`).
const RESIZE_CONDITIONS: [&str; 2] = ["Resizing", "FileSystemResizePending"];

/// The PV's capacity (as written, and in bytes) when the node's part of an expansion is
/// due: above the claim's `status.capacity`, with the claim's resize status at
/// `NodeResizePending` or `NodeResizeInProgress` (upstream's `runPreCheck`; a claim
/// without a resize status is left to the resizer).
pub fn node_expansion_due(
    pvc: &PersistentVolumeClaim,
    pv: &PersistentVolume,
) -> Option<(String, u64)> {
    let storage = |q: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>| {
        q.and_then(|q| nodeagent_config::quantity::parse_bytes(&q.0).ok())
    };
    let pv_quantity = pv.spec.as_ref()?.capacity.as_ref()?.get("storage")?;
    let wanted = storage(Some(pv_quantity))?;
    let status = pvc.status.as_ref()?;
    let have = storage(status.capacity.as_ref().and_then(|c| c.get("storage"))).unwrap_or(0);
    let resize_status = status
        .allocated_resource_statuses
        .as_ref()
        .and_then(|s| s.get("storage"))
        .map(String::as_str);
    let due = wanted > have
        && matches!(
            resize_status,
            Some(NODE_RESIZE_PENDING | NODE_RESIZE_IN_PROGRESS)
        );
    due.then(|| (pv_quantity.0.clone(), wanted))
}

/// Whether `message` about volume `pv` was not posted within the last minute (and notes
/// it as posted now).
fn first_in_a_while(pv: &str, message: &str) -> bool {
    use std::sync::{LazyLock, Mutex};
    use std::time::{Duration, Instant};
    static POSTED: LazyLock<Mutex<std::collections::HashMap<String, (String, Instant)>>> =
        LazyLock::new(Default::default);
    let mut posted = POSTED.lock().unwrap_or_else(|e| e.into_inner());
    posted.retain(|_, (_, at)| at.elapsed() < Duration::from_secs(60));
    if posted.get(pv).is_some_and(|(m, _)| m == message) {
        return false;
    }
    posted.insert(pv.to_string(), (message.to_string(), Instant::now()));
    true
}

impl Csi {
    /// Expands the claimed volume published at `target` for `pod` if its PV grew (see the
    /// module docs). Never fails the set-up.
    pub(super) async fn expand_if_grown(
        &self,
        pod: &Pod,
        pvc: &PersistentVolumeClaim,
        pv: &PersistentVolume,
        target: &Path,
    ) {
        if node_expansion_due(pvc, pv).is_none() {
            return;
        }
        let pv_name = pv.metadata.name.clone().unwrap_or_default();
        // One expansion of a volume at a time (its stage lock), decided on the claim as it
        // is now: another pod's pass may have expanded it meanwhile (upstream's operation
        // executor runs one operation per volume).
        let Some(csi) = pv.spec.as_ref().and_then(|s| s.csi.as_ref()) else {
            return;
        };
        let lock = self.stage_lock(&staging_path(&self.root, &csi.driver, &csi.volume_handle));
        let _one = lock.lock().await;
        let name = pvc.metadata.name.clone().unwrap_or_default();
        let pvc = match self.claims(pvc) {
            Ok(claims) => match claims.get(&name).await {
                Ok(now) => now,
                Err(e) => {
                    tracing::warn!(volume = %pv_name, error = %e, "claim not read again; expansion left for the next pass");
                    return;
                }
            },
            Err(e) => {
                tracing::warn!(volume = %pv_name, error = %e, "expansion left for the next pass");
                return;
            }
        };
        let pvc = &pvc;
        let Some((quantity, bytes)) = node_expansion_due(pvc, pv) else {
            return;
        };
        match self.node_expand(pvc, pv, target, bytes).await {
            Ok(false) => {
                tracing::debug!(volume = %pv_name, "the driver does not offer EXPAND_VOLUME: the claim is left to its resizer");
            }
            Ok(true) => {
                // Upstream's GenerateMsg: the prefix, the volume, the node; the events
                // first, then the claim's status.
                let message = format!(
                    "MountVolume.NodeExpandVolume succeeded for volume {pv_name:?} {}",
                    self.node_name
                );
                tracing::info!(volume = %pv_name, size = %quantity, "{message}");
                self.post(
                    pod,
                    None,
                    EventType::Normal,
                    "FileSystemResizeSuccessful",
                    &message,
                )
                .await;
                self.post(
                    pod,
                    Some(pvc),
                    EventType::Normal,
                    "FileSystemResizeSuccessful",
                    &message,
                )
                .await;
                if let Err(e) = self.mark_resize_finished(pvc, &quantity).await {
                    // The next pass expands again (a driver's NodeExpandVolume is
                    // idempotent) and retries this.
                    tracing::warn!(volume = %pv_name, error = %e, "mountVolume.NodeExpandVolume update pvc status failed");
                }
            }
            Err(e) => {
                // Upstream's GenerateError of the in-use expansion; the same failure is
                // posted at most once a minute (it is retried at every pass).
                let message = format!(
                    "NodeExpandVolume.NodeExpandVolume failed for volume {pv_name:?} : {e}"
                );
                tracing::warn!(volume = %pv_name, "{message}");
                if first_in_a_while(&pv_name, &message) {
                    self.post(
                        pod,
                        None,
                        EventType::Warning,
                        "VolumeResizeFailed",
                        &message,
                    )
                    .await;
                }
            }
        }
    }

    /// Marks the claim in progress and asks the driver; false when it does not offer
    /// EXPAND_VOLUME. Errors are upstream's `Expander.NodeExpand` words.
    async fn node_expand(
        &self,
        pvc: &PersistentVolumeClaim,
        pv: &PersistentVolume,
        target: &Path,
        bytes: u64,
    ) -> Result<bool, String> {
        let spec = pv.spec.clone().unwrap_or_default();
        let source = spec
            .csi
            .ok_or("Expander.NodeExpand found no CSI source in the PersistentVolume")?;
        let driver = self.registry.driver(&source.driver)?;
        let capabilities = self.try_capabilities(&driver).await.map_err(|s| {
            format!(
                "Expander.NodeExpand failed to check if node supports expansion : {}",
                go_rpc_error(&s)
            )
        })?;
        if !capabilities.expand_volume {
            return Ok(false);
        }
        let secrets = self
            .secret_ref(
                "NodeExpandSecretRef",
                source.node_expand_secret_ref.as_ref(),
            )
            .await?;
        self.set_resize_status(pvc, NODE_RESIZE_IN_PROGRESS)
            .await
            .map_err(|e| {
                format!(
                    "MountVolume.NodeExpandVolume failed to mark node expansion in progress: {e}"
                )
            })?;
        let access_modes = spec.access_modes.clone().unwrap_or_default();
        let staging = capabilities
            .stage_unstage
            .then(|| staging_path(&self.root, &source.driver, &source.volume_handle));
        let request = nodeagent_proto::csi::NodeExpandVolumeRequest {
            volume_id: source.volume_handle.clone(),
            volume_path: target.to_string_lossy().into_owned(),
            capacity_range: Some(nodeagent_proto::csi::CapacityRange {
                required_bytes: i64::try_from(bytes).unwrap_or(i64::MAX),
                limit_bytes: 0,
            }),
            staging_target_path: staging
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default(),
            volume_capability: Some(super::capability(
                source.fs_type.as_deref().unwrap_or_default(),
                spec.mount_options.clone().unwrap_or_default(),
                super::access_mode(&access_modes, capabilities),
                String::new(),
            )),
            secrets,
        };
        call(driver.node_client().node_expand_volume(request))
            .await
            .map(|_| true)
            .map_err(|s| {
                format!(
                    "Expander.NodeExpand failed to expand the volume : {}",
                    go_rpc_error(&s)
                )
            })
    }

    fn claims(
        &self,
        pvc: &PersistentVolumeClaim,
    ) -> Result<kube::Api<PersistentVolumeClaim>, String> {
        let client = self.client.as_ref().ok_or("no API server")?;
        let namespace = pvc.metadata.namespace.as_deref().unwrap_or("default");
        Ok(kube::Api::namespaced(client.clone(), namespace))
    }

    /// Upstream's `MarkNodeExpansionInProgress`.
    async fn set_resize_status(
        &self,
        pvc: &PersistentVolumeClaim,
        status: &str,
    ) -> Result<(), String> {
        self.patch_claim_status(
            pvc,
            serde_json::json!({"allocatedResourceStatuses": {"storage": status}}),
        )
        .await
    }

    /// Upstream's `MarkFSResizeFinished`: the claim's capacity is the new size, its resize
    /// conditions and its storage resize status are gone.
    async fn mark_resize_finished(
        &self,
        pvc: &PersistentVolumeClaim,
        quantity: &str,
    ) -> Result<(), String> {
        let conditions: Vec<_> = pvc
            .status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default()
            .into_iter()
            .filter(|c| !RESIZE_CONDITIONS.contains(&c.type_.as_str()))
            .collect();
        self.patch_claim_status(
            pvc,
            serde_json::json!({
                "capacity": {"storage": quantity},
                "conditions": conditions,
                "allocatedResourceStatuses": {"storage": null},
            }),
        )
        .await
    }

    /// A JSON merge patch of the claim's status.
    async fn patch_claim_status(
        &self,
        pvc: &PersistentVolumeClaim,
        status: serde_json::Value,
    ) -> Result<(), String> {
        let name = pvc.metadata.name.clone().unwrap_or_default();
        self.claims(pvc)?
            .patch_status(
                &name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(serde_json::json!({ "status": status })),
            )
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// An event on the pod, or on the claim when `pvc` is given; a failure is logged.
    async fn post(
        &self,
        pod: &Pod,
        pvc: Option<&PersistentVolumeClaim>,
        ty: EventType,
        reason: &str,
        message: &str,
    ) {
        let Some(client) = &self.client else {
            return;
        };
        match pvc {
            None => {
                nodeagent_config::events::post(client, pod, ty, reason, message, &self.node_name)
                    .await
            }
            Some(pvc) => {
                let object = k8s_openapi::api::core::v1::ObjectReference {
                    kind: Some("PersistentVolumeClaim".into()),
                    api_version: Some("v1".into()),
                    name: pvc.metadata.name.clone(),
                    namespace: pvc.metadata.namespace.clone(),
                    uid: pvc.metadata.uid.clone(),
                    ..Default::default()
                };
                nodeagent_config::events::post_about(
                    client,
                    object,
                    ty,
                    reason,
                    message,
                    &self.node_name,
                )
                .await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim_and_volume(
        status_capacity: &str,
        resize_status: Option<&str>,
        pv_capacity: &str,
    ) -> (PersistentVolumeClaim, PersistentVolume) {
        let mut status =
            serde_json::json!({"phase": "Bound", "capacity": {"storage": status_capacity}});
        if let Some(s) = resize_status {
            status["allocatedResourceStatuses"] = serde_json::json!({"storage": s});
        }
        let pvc = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "c", "namespace": "ns"},
            "spec": {"resources": {"requests": {"storage": pv_capacity}}},
            "status": status,
        }))
        .unwrap();
        let pv = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pv"},
            "spec": {"capacity": {"storage": pv_capacity}, "csi": {"driver": "d", "volumeHandle": "h"}},
        }))
        .unwrap();
        (pvc, pv)
    }

    /// The decision of node_expander_test.go's `TestNodeExpander` cases (their names in the
    /// comments): pending or in progress with a bigger PV expands; failed, a controller
    /// still at work, or no resize status (a resizer that does not ask the node) does not.
    /// Not ported: upstream's "pvc.status.cap = pv.spec.cap, resizeStatus=''" case, where a
    /// ReadWriteMany volume expanded on another node is expanded here too (we keep no
    /// record of the size a volume was mounted at to compare with).
    #[test]
    fn the_node_expands_only_what_the_resizer_left_to_it() {
        let due = |cap: &str, status: Option<&str>, pv: &str| {
            let (pvc, pv) = claim_and_volume(cap, status, pv);
            node_expansion_due(&pvc, &pv)
        };
        // "pv.spec.cap > pvc.status.cap, resizeStatus=node_expansion_pending"
        assert_eq!(
            due("1Gi", Some(NODE_RESIZE_PENDING), "2Gi"),
            Some(("2Gi".to_string(), 2 << 30))
        );
        // "... resizeStatus=node_expansion_inprogress" (a pass interrupted after marking)
        assert_eq!(
            due("1Gi", Some(NODE_RESIZE_IN_PROGRESS), "2Gi"),
            Some(("2Gi".to_string(), 2 << 30))
        );
        // "pv.spec.cap > pvc.status.cap, resizeStatus=node_expansion_failed"
        assert_eq!(due("1Gi", Some("NodeResizeFailed"), "2Gi"), None);
        // "pv.spec.cap > pvc.status.cap, resizeStatus=controller_expansion_inprogress"
        assert_eq!(due("1Gi", Some("ControllerResizeInProgress"), "2Gi"), None);
        // No resize status: the resizer does not need the node.
        assert_eq!(due("1Gi", None, "2Gi"), None);
        // Done already (the same size in other units).
        assert_eq!(due("2048Mi", Some(NODE_RESIZE_PENDING), "2Gi"), None);
    }
}
