//! pod-sync's gRPC API and status publication (the status manager's local half).

use crate::PodSync;
use crate::status::{StatusInputs, compute};
use nodeagent_proto::api::{
    ListPodsRequest, ListPodsResponse, PodStatusUpdate, ProberMembership, RegisterProberRequest,
    WatchPodStatusRequest, pod_sync_server::PodSync as PodSyncApi,
};
use nodeagent_proto::k8s;
use nodeagent_transport::{WatchStream, snapshot_then_deltas};
use std::collections::HashMap;
use std::sync::Arc;
use tonic::{Request, Response, Status};

pub struct PodSyncService {
    pub sync: Arc<PodSync>,
    /// The registered probe instances.
    pub probers: Arc<crate::probers::Probers>,
}

impl PodSync {
    /// Recomputes one pod's status and, when it changed, tells the watchers.
    pub(crate) async fn publish_status(&self, uid: &str) {
        self.read_termination_messages(uid).await;
        if self.publish_status_now(uid) {
            // A pod that has just finished is on disk before anything else happens to it.
            self.save_finished().await;
        }
    }

    /// Recomputes and publishes one pod's status; true when the pod's finished record
    /// changed (it must be saved).
    fn publish_status_now(&self, uid: &str) -> bool {
        let mut st = self.lock();
        // A pod being terminated keeps its status current until it is gone (upstream).
        let (pod, terminating) = match (st.desired.get(uid), st.terminating.get(uid)) {
            (Some(p), _) => (p.clone(), false),
            (None, Some(p)) => (p.clone(), true),
            (None, None) => return false,
        };
        let terminated = terminating
            && !st
                .runtime
                .get(uid)
                .is_some_and(|rt| rt.any_container_running());
        let empty = HashMap::new();
        let waiting = st.waiting.get(uid).unwrap_or(&empty);
        // After a restart, a finished pod's record stands for what it published last.
        let previous = st
            .statuses
            .get(uid)
            .and_then(|p| p.status.clone())
            .or_else(|| st.finished.get(uid).cloned());
        let status = compute(
            &StatusInputs {
                pod: &pod,
                runtime: st.runtime.get(uid),
                readiness: &st.readiness,
                started: &st.started,
                waiting,
                node_ips: &self.node.ips,
                pod_failed: st.pod_failed.get(uid),
                termination_messages: &st.termination_messages,
                terminated,
                resize: st.resize.get(uid),
                actuated: Some(&st.allocations.actuated),
            },
            previous.as_ref(),
        );
        let mut status = status;
        if status.pod_ip.is_none() {
            // The sandbox is already stopped (a pod that finished quickly): keep its IP.
            if let Some(ip) = st.sandbox_ips.get(uid) {
                status.pod_ip = Some(ip.clone());
                status.pod_ips = Some(vec![k8s_openapi::api::core::v1::PodIP { ip: ip.clone() }]);
            }
        }
        if st.probe_synced {
            st.published_since_probe.insert(uid.to_string());
        }
        let record_changed = crate::status::finished::record(&mut st.finished, uid, &status);
        // The spec as the pod's source has it (a resize not admitted yet included); the
        // status says what was allocated.
        let mut with_status = match st.allocations.wanted.get(uid) {
            Some(wanted) => crate::allocation::with_resources(pod, wanted),
            None => pod,
        };
        with_status.status = Some(status);
        // Metadata changes (labels, annotations) are published too, not only status.
        if st.statuses.get(uid) == Some(&with_status) {
            return record_changed;
        }
        st.status_revision += 1;
        let update = PodStatusUpdate {
            revision: st.status_revision,
            snapshot: false,
            pods_json: vec![k8s::encode_pod(&with_status)],
            removed_uids: Vec::new(),
            trace: nodeagent_telemetry::current_trace_context(),
            snapshot_continues: false,
        };
        let sandbox_created = st
            .runtime
            .get(uid)
            .and_then(|rt| rt.sandboxes.iter().map(|s| s.created_at_unix_nanos).max());
        let started_here = sandbox_created.is_some_and(|t| t >= self.started_unix_nanos);
        observe_pod_start(&with_status, previous.as_ref(), started_here);
        st.statuses.insert(uid.to_string(), with_status);
        let _ = self.status_tx.send(update);
        record_changed
    }
}

/// kubelet_pod_start_duration_seconds: from the pod's `kubernetes.io/config.seen` to
/// the status that first shows it Running. A pod's first status counts only when this
/// process made its sandbox (`started_here`): pod-sync publishes Running from its own
/// sync, so a pod may be Running in its very first status, while a restarted pod-sync
/// must not count the running pods it adopts again.
fn observe_pod_start(
    pod: &k8s_openapi::api::core::v1::Pod,
    previous: Option<&k8s_openapi::api::core::v1::PodStatus>,
    started_here: bool,
) {
    let phase = |s: Option<&k8s_openapi::api::core::v1::PodStatus>| {
        s.and_then(|s| s.phase.clone()).unwrap_or_default()
    };
    let counted = match previous {
        None => started_here,
        Some(_) => phase(previous) != "Running",
    };
    if !counted || phase(pod.status.as_ref()) != "Running" {
        return;
    }
    let seen = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(k8s::labels::CONFIG_SEEN))
        .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok());
    if let Some(seen) = seen {
        let seconds = k8s_openapi::jiff::Timestamp::now()
            .duration_since(seen)
            .as_secs_f64();
        nodeagent_telemetry::metrics::kubelet::POD_START_DURATION
            .get_or_create(&Vec::new())
            .observe(seconds.max(0.0));
    }
}

/// Statuses are not served before they are complete; consumers retry.
fn not_yet_servable() -> Status {
    Status::unavailable("pod-sync is still computing the status of every pod after its start")
}

#[tonic::async_trait]
impl PodSyncApi for PodSyncService {
    async fn device_resources(
        &self,
        _r: Request<nodeagent_proto::api::DeviceResourcesRequest>,
    ) -> Result<Response<nodeagent_proto::api::DeviceResourcesResponse>, Status> {
        let c = self.sync.device_manager.capacity();
        Ok(Response::new(
            nodeagent_proto::api::DeviceResourcesResponse {
                capacity: c.capacity.into_iter().collect(),
                allocatable: c.allocatable.into_iter().collect(),
                retired: c.retired,
            },
        ))
    }

    async fn list_pods(
        &self,
        _r: Request<ListPodsRequest>,
    ) -> Result<Response<ListPodsResponse>, Status> {
        let mut st = self.sync.lock();
        if !st.statuses_servable() {
            return Err(not_yet_servable());
        }
        Ok(Response::new(ListPodsResponse {
            revision: st.status_revision,
            pods_json: st.statuses.values().map(k8s::encode_pod).collect(),
        }))
    }

    type WatchPodStatusStream = WatchStream<PodStatusUpdate>;

    async fn watch_pod_status(
        &self,
        request: Request<WatchPodStatusRequest>,
    ) -> Result<Response<Self::WatchPodStatusStream>, Status> {
        let (snapshot, rx) = {
            let mut st = self.sync.lock();
            if !st.statuses_servable() {
                return Err(not_yet_servable());
            }
            let snapshot = PodStatusUpdate {
                revision: st.status_revision,
                snapshot: true,
                pods_json: st.statuses.values().map(k8s::encode_pod).collect(),
                removed_uids: Vec::new(),
                trace: None,
                snapshot_continues: false,
            };
            (snapshot, self.sync.status_tx.subscribe())
        };
        Ok(Response::new(snapshot_then_deltas(
            snapshot,
            rx,
            self.sync.shutdown.clone(),
            request.get_ref().accept_chunked_snapshot,
        )))
    }

    type RegisterProberStream = WatchStream<ProberMembership>;

    async fn register_prober(
        &self,
        request: Request<RegisterProberRequest>,
    ) -> Result<Response<Self::RegisterProberStream>, Status> {
        let r = request.into_inner();
        Ok(Response::new(
            self.probers.register(&r.instance_id, &r.endpoint)?,
        ))
    }
}
