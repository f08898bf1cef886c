//! pod-sync's gRPC API and status publication (the status manager's local half).

use crate::PodSync;
use crate::runtime_spec;
use crate::status::{StatusInputs, compute};
use nodeagent_proto::api::{
    ListPodsRequest, ListPodsResponse, PodStatusUpdate, WatchPodStatusRequest,
    pod_sync_server::PodSync as PodSyncApi,
};
use nodeagent_proto::k8s;
use nodeagent_transport::{WatchStream, snapshot_then_deltas};
use std::collections::HashMap;
use std::sync::Arc;
use tonic::{Request, Response, Status};

pub struct PodSyncService {
    pub sync: Arc<PodSync>,
}

impl PodSync {
    /// Recomputes one pod's status and, when it changed, tells the watchers.
    pub(crate) async fn publish_status(&self, uid: &str) {
        self.read_termination_messages(uid);
        let mut st = self.lock();
        let Some(pod) = st.desired.get(uid).cloned() else {
            return;
        };
        let empty = HashMap::new();
        let waiting = st.waiting.get(uid).unwrap_or(&empty);
        let previous = st.statuses.get(uid).and_then(|p| p.status.clone());
        let status = compute(
            &StatusInputs {
                pod: &pod,
                runtime: st.runtime.get(uid),
                readiness: &st.readiness,
                started: &st.started,
                waiting,
                host_ip: &self.node.host_ip,
                pod_failed: st.pod_failed.get(uid),
                termination_messages: &st.termination_messages,
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
        let mut with_status = pod;
        with_status.status = Some(status);
        // Metadata changes (labels, annotations) are published too, not only status.
        if st.statuses.get(uid) == Some(&with_status) {
            return;
        }
        st.status_revision += 1;
        let update = PodStatusUpdate {
            revision: st.status_revision,
            snapshot: false,
            pods_json: vec![k8s::encode_pod(&with_status)],
            removed_uids: Vec::new(),
            trace: nodeagent_telemetry::current_trace_context(),
        };
        st.statuses.insert(uid.to_string(), with_status);
        let _ = self.status_tx.send(update);
    }
}

impl PodSync {
    /// Reads, once per container, the termination message of every exited container of
    /// the pod: its terminationMessagePath file or, with FallbackToLogsOnError and a
    /// failure, the tail of its log (upstream: 80 lines, 2 KiB at most).
    fn read_termination_messages(&self, uid: &str) {
        let (pod, exited) = {
            let st = self.lock();
            let Some(pod) = st.desired.get(uid).cloned() else {
                return;
            };
            let exited: Vec<_> = st
                .runtime
                .get(uid)
                .map(|r| {
                    r.containers
                        .iter()
                        .filter(|c| {
                            c.state == nodeagent_proto::cri::ContainerState::ContainerExited as i32
                        })
                        .filter(|c| !st.termination_messages.contains_key(&c.id))
                        .cloned()
                        .collect()
                })
                .unwrap_or_default();
            (pod, exited)
        };
        if exited.is_empty() {
            return;
        }
        let spec = pod.spec.clone().unwrap_or_default();
        let mut found = Vec::new();
        for c in exited {
            let Some(container) = spec
                .containers
                .iter()
                .chain(spec.init_containers.iter().flatten())
                .find(|s| s.name == c.name)
            else {
                continue;
            };
            let file = runtime_spec::termination_message_file(
                &self.node.root_dir,
                uid,
                &c.name,
                c.attempt,
            );
            let mut message = read_capped(&file, 4096);
            let fallback =
                container.termination_message_policy.as_deref() == Some("FallbackToLogsOnError");
            if message.is_empty() && fallback && c.exit_code != 0 {
                let log = runtime_spec::pod_log_dir(&self.node.pod_logs_dir, &pod)
                    .join(&c.name)
                    .join(format!("{}.log", c.attempt));
                message = log_tail(&log, 80, 2048);
            }
            found.push((c.id, message));
        }
        self.lock().termination_messages.extend(found);
    }
}

fn read_capped(path: &std::path::Path, max: usize) -> String {
    let data = std::fs::read(path).unwrap_or_default();
    String::from_utf8_lossy(&data[..data.len().min(max)]).into_owned()
}

/// The last lines of a CRI log file, without the "<time> <stream> <tag> " prefixes.
fn log_tail(path: &std::path::Path, lines: usize, max_bytes: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text
        .lines()
        .map(|l| l.splitn(4, ' ').nth(3).unwrap_or(l))
        .collect();
    let tail = all[all.len().saturating_sub(lines)..].join("\n");
    let start = tail.len().saturating_sub(max_bytes);
    let start = (start..tail.len())
        .find(|i| tail.is_char_boundary(*i))
        .unwrap_or(tail.len());
    tail[start..].to_string()
}

#[tonic::async_trait]
impl PodSyncApi for PodSyncService {
    async fn list_pods(
        &self,
        _r: Request<ListPodsRequest>,
    ) -> Result<Response<ListPodsResponse>, Status> {
        let st = self.sync.lock();
        Ok(Response::new(ListPodsResponse {
            revision: st.status_revision,
            pods_json: st.statuses.values().map(k8s::encode_pod).collect(),
        }))
    }

    type WatchPodStatusStream = WatchStream<PodStatusUpdate>;

    async fn watch_pod_status(
        &self,
        _r: Request<WatchPodStatusRequest>,
    ) -> Result<Response<Self::WatchPodStatusStream>, Status> {
        let (snapshot, rx) = {
            let st = self.sync.lock();
            let snapshot = PodStatusUpdate {
                revision: st.status_revision,
                snapshot: true,
                pods_json: st.statuses.values().map(k8s::encode_pod).collect(),
                removed_uids: Vec::new(),
                trace: None,
            };
            (snapshot, self.sync.status_tx.subscribe())
        };
        Ok(Response::new(snapshot_then_deltas(
            snapshot,
            rx,
            self.sync.shutdown.clone(),
        )))
    }
}
