//! One pod's status as the runtime has it (`RuntimePodStatus`): its sandboxes and
//! containers, each inspected. pleg builds its cache from it, and pod-sync reads a pod it
//! just changed with it, so that what it publishes does not wait for the next relist.

use crate::{Cri, Status, api};
use nodeagent_proto::api::{RuntimeContainer, RuntimePodStatus, RuntimeSandbox};
use nodeagent_proto::k8s::labels;
use std::time::SystemTime;

impl Cri {
    /// Lists and inspects the pod `uid` now; the status is as old as the lists.
    pub async fn pod_status(&self, uid: &str) -> Result<RuntimePodStatus, Status> {
        let listed_at = now_nanos();
        let (sandboxes, containers) = tokio::try_join!(
            self.list_sandboxes(Some(uid)),
            self.list_containers(Some(uid))
        )?;
        inspect_pod(self, uid, &sandboxes, &containers, listed_at).await
    }
}

/// Reads the full status of one pod's sandboxes and containers.
/// `listed_at` is when the lists were taken: the status is as old as they are.
pub async fn inspect_pod(
    cri: &Cri,
    uid: &str,
    sandboxes: &[api::PodSandbox],
    containers: &[api::Container],
    listed_at: i64,
) -> Result<RuntimePodStatus, Status> {
    let mut status = RuntimePodStatus {
        uid: uid.to_string(),
        timestamp_unix_nanos: listed_at,
        ..Default::default()
    };
    for sb in sandboxes {
        let meta = sb.metadata.clone().unwrap_or_default();
        if status.name.is_empty() {
            status.name = meta.name.clone();
            status.namespace = meta.namespace.clone();
        }
        let mut out = RuntimeSandbox {
            id: sb.id.clone(),
            state: sb.state,
            attempt: meta.attempt,
            created_at_unix_nanos: sb.created_at,
            ..Default::default()
        };
        if sb.state == api::PodSandboxState::SandboxReady as i32
            && let Ok(s) = cri.sandbox_status(&sb.id).await
            && let Some(net) = s.network
        {
            out.ip = net.ip;
            out.additional_ips = net.additional_ips.into_iter().map(|i| i.ip).collect();
        }
        status.sandboxes.push(out);
    }
    for c in containers {
        let meta = c.metadata.clone().unwrap_or_default();
        let mut out = RuntimeContainer {
            id: c.id.clone(),
            name: meta.name,
            state: c.state,
            attempt: meta.attempt,
            image: c
                .image
                .as_ref()
                .map(|i| i.image.clone())
                .unwrap_or_default(),
            image_ref: c.image_ref.clone(),
            created_at_unix_nanos: c.created_at,
            spec_hash: c
                .annotations
                .get(labels::CONTAINER_HASH)
                .cloned()
                .unwrap_or_default(),
            upstream_hash: c
                .annotations
                .get(labels::CONTAINER_UPSTREAM_HASH)
                .cloned()
                .unwrap_or_default(),
            sandbox_id: c.pod_sandbox_id.clone(),
            backoff_base: c
                .annotations
                .get(labels::CONTAINER_BACKOFF_BASE)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            ..Default::default()
        };
        if status.name.is_empty() {
            status.name = c.labels.get(labels::POD_NAME).cloned().unwrap_or_default();
            status.namespace = c
                .labels
                .get(labels::POD_NAMESPACE)
                .cloned()
                .unwrap_or_default();
        }
        match cri.container_status(&c.id).await {
            Ok(resp) => {
                if let Some(s) = resp.status {
                    out.state = s.state;
                    out.started_at_unix_nanos = s.started_at;
                    out.finished_at_unix_nanos = s.finished_at;
                    out.exit_code = s.exit_code;
                    out.reason = s.reason;
                    out.message = s.message;
                    if !s.image_ref.is_empty() {
                        out.image_ref = s.image_ref;
                    }
                }
            }
            Err(e) if crate::is_not_found(&e) => continue,
            Err(e) => return Err(e),
        }
        status.containers.push(out);
    }
    Ok(status)
}

pub fn now_nanos() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or_default()
}
