//! With an API server: register the Node, patch its status every
//! `nodeStatusUpdateFrequency`, and renew the node Lease (`kube-node-lease/<node>`) every
//! quarter of `nodeLeaseDurationSeconds`, as upstream's node status manager and lease
//! controller do.

use crate::NodeStatusService;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, OwnerReference};
use kube::api::{Api, GetParams, Patch, PatchParams, PostParams};
use nodeagent_transport::Shutdown;
use std::sync::Arc;
use std::time::Duration;

const LEASE_NAMESPACE: &str = "kube-node-lease";

pub struct NodeReporter {
    pub service: Arc<NodeStatusService>,
    pub client: kube::Client,
    pub status_every: Duration,
    /// An unchanged status is patched again only this often (`nodeStatusReportFrequency`).
    pub report_every: Duration,
    pub lease_seconds: i32,
}

/// The status without its heartbeat times: what tells a changed status from a repeat
/// (upstream's `nodeStatusHasChanged`).
fn without_heartbeats(
    status: &Option<k8s_openapi::api::core::v1::NodeStatus>,
) -> serde_json::Value {
    let mut s = status.clone().unwrap_or_default();
    for c in s.conditions.iter_mut().flatten() {
        c.last_heartbeat_time = None;
    }
    serde_json::to_value(s).unwrap_or_default()
}

fn now_micro() -> MicroTime {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or_default();
    MicroTime(
        k8s_openapi::jiff::Timestamp::from_nanosecond(nanos)
            .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    )
}

impl NodeReporter {
    pub async fn run(self, shutdown: Shutdown) {
        let mut status_tick = tokio::time::interval(self.status_every);
        let renew = Duration::from_millis(self.lease_seconds.max(1) as u64 * 250);
        let mut lease_tick = tokio::time::interval(renew);
        let mut node_uid: Option<String> = None;
        let mut lease: Option<Lease> = None;
        let mut last: Option<(serde_json::Value, std::time::Instant)> = None;
        loop {
            tokio::select! {
                _ = shutdown.wait() => return,
                _ = status_tick.tick() => {
                    match self.report_status(&mut last).await {
                        Ok(uid) => node_uid = Some(uid),
                        Err(e) => tracing::warn!(error = %e, "updating the Node failed; will retry"),
                    }
                }
                _ = lease_tick.tick() => {
                    if let Some(uid) = &node_uid
                        && let Err(e) = self.renew_lease(uid, &mut lease).await {
                            tracing::warn!(error = %e, "renewing the node lease failed; will retry");
                        }
                }
            }
        }
    }

    /// Registers the Node if it is missing (and `registerNode`), then writes its status
    /// when it changed or `report_every` has passed since the last write, as upstream's
    /// `PatchNodeStatus`: the Node read from the API server's cache (resourceVersion=0),
    /// and a two-way strategic merge patch to the status [`merged_status`] gives, so what
    /// other writers set is never sent. Returns the Node's uid.
    async fn report_status(
        &self,
        last: &mut Option<(serde_json::Value, std::time::Instant)>,
    ) -> Result<String, kube::Error> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let node = self.service.build().await;
        let name = self.service.node_name.clone();
        let existing = match nodes.get_with(&name, &GetParams::any()).await {
            Ok(n) => n,
            Err(kube::Error::Api(s)) if s.is_not_found() && self.service.kubelet.register_node => {
                let fresh = self.service.registration(node.clone());
                let created = nodes.create(&PostParams::default(), &fresh).await?;
                tracing::info!(node = %name, "registered the Node with the API server");
                created
            }
            Err(e) => return Err(e),
        };
        let uid = existing.metadata.uid.clone().unwrap_or_default();
        // A Node registered without the attach/detach annotation (by an older agent, or
        // edited away) gets it back (upstream's `reconcileCMADAnnotationWithExistingNode`).
        let annotated = existing.metadata.annotations.as_ref().is_some_and(|a| {
            a.get(crate::CONTROLLER_MANAGED_ATTACH).map(String::as_str) == Some("true")
        });
        if !annotated {
            nodes
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::json!({"metadata": {"annotations": {
                        crate::CONTROLLER_MANAGED_ATTACH: "true"}}})),
                )
                .await?;
            tracing::info!(node = %name, "set the node annotation that enables the controller's volume attach and detach");
        }
        let now = without_heartbeats(&node.status);
        let repeat = last
            .as_ref()
            .is_some_and(|(sent, at)| *sent == now && at.elapsed() < self.report_every);
        // A Node that lost its status (re-created behind our back) gets it at once.
        if repeat && existing.status.is_some() {
            return Ok(uid);
        }
        let mut ours = node.status.clone().unwrap_or_default();
        if !self.service.volumes_in_use_known() {
            // The volume service has not answered yet: the Node's list stays.
            ours.volumes_in_use = existing
                .status
                .as_ref()
                .and_then(|s| s.volumes_in_use.clone());
        }
        let status = crate::merged_status(
            existing.status.as_ref(),
            ours,
            self.service.external_cloud_provider,
        );
        let diff = nodeagent_config::status_patch::two_way(
            &serde_json::to_value(existing.status.clone().unwrap_or_default()).unwrap_or_default(),
            &serde_json::to_value(status).unwrap_or_default(),
        );
        if diff.as_object().is_some_and(|d| !d.is_empty()) {
            nodes
                .patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Strategic(serde_json::json!({ "status": diff })),
                )
                .await?;
        }
        *last = Some((now, std::time::Instant::now()));
        Ok(uid)
    }

    /// Renews the node Lease as upstream's lease controller does: one update (PUT) of the
    /// Lease last seen, with a new renewTime; only when there is none, or the update
    /// conflicted or found it gone, is it read again (or created).
    async fn renew_lease(
        &self,
        node_uid: &str,
        seen: &mut Option<Lease>,
    ) -> Result<(), kube::Error> {
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), LEASE_NAMESPACE);
        let name = &self.service.node_name;
        let renewed = |lease: &Lease| {
            let mut next = lease.clone();
            let spec = next.spec.get_or_insert_default();
            spec.holder_identity = Some(name.clone());
            spec.lease_duration_seconds = Some(self.lease_seconds);
            spec.renew_time = Some(now_micro());
            next
        };
        if let Some(lease) = seen.take() {
            match leases
                .replace(name, &PostParams::default(), &renewed(&lease))
                .await
            {
                Ok(updated) => {
                    *seen = Some(updated);
                    return Ok(());
                }
                Err(kube::Error::Api(s)) if s.code == 409 || s.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        let current = match leases.get_opt(name).await? {
            Some(lease) => lease,
            None => {
                let lease = Lease {
                    metadata: kube::api::ObjectMeta {
                        name: Some(name.clone()),
                        namespace: Some(LEASE_NAMESPACE.into()),
                        owner_references: Some(vec![OwnerReference {
                            api_version: "v1".into(),
                            kind: "Node".into(),
                            name: name.clone(),
                            uid: node_uid.to_string(),
                            ..Default::default()
                        }]),
                        ..Default::default()
                    },
                    spec: Some(LeaseSpec::default()),
                };
                let created = leases
                    .create(&PostParams::default(), &renewed(&lease))
                    .await?;
                tracing::info!(node = %name, "created the node lease");
                *seen = Some(created);
                return Ok(());
            }
        };
        *seen = Some(
            leases
                .replace(name, &PostParams::default(), &renewed(&current))
                .await?,
        );
        Ok(())
    }
}
