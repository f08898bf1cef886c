//! Tearing a pod down: stop its containers within the grace period, stop and remove its
//! sandboxes and containers, release its volumes, and remove what the runtime leaves
//! behind (the pod cgroup and the log directory).

use crate::PodSync;
use crate::workers::SyncOutcome;
use nodeagent_proto::api::{ReleasePodRequest, RuntimePodStatus};
use nodeagent_proto::cri::{self, RemovePodSandboxRequest};
use std::sync::Arc;

impl PodSync {
    pub(crate) async fn kill_pod(
        self: &Arc<Self>,
        uid: &str,
        rt: &RuntimePodStatus,
    ) -> anyhow::Result<SyncOutcome> {
        let pod = self.lock().terminating.get(uid).cloned();
        let grace = pod.as_ref().map(crate::sync::grace_seconds).unwrap_or(30);
        let running: Vec<_> = rt
            .containers
            .iter()
            .filter(|c| c.state == cri::ContainerState::ContainerRunning as i32)
            .collect();
        if !rt.sandboxes.is_empty() || !rt.containers.is_empty() {
            tracing::info!(
                containers = rt.containers.len(),
                sandboxes = rt.sandboxes.len(),
                grace_seconds = grace,
                "terminating pod"
            );
        }
        let mut stops = tokio::task::JoinSet::new();
        for c in running {
            let this = self.clone();
            let (id, name, pod) = (c.id.clone(), c.name.clone(), pod.clone());
            stops.spawn(async move {
                this.kill_container(pod.as_ref(), &name, &id, grace, "the pod is being removed")
                    .await
            });
        }
        while stops.join_next().await.is_some() {}
        for s in &rt.sandboxes {
            self.stop_sandbox(&s.id).await;
        }
        for c in &rt.containers {
            self.remove_container(&c.id).await;
        }
        for s in &rt.sandboxes {
            let mut runtime = self.cri.runtime.clone();
            let req = self.cri.request(RemovePodSandboxRequest {
                pod_sandbox_id: s.id.clone(),
            });
            if let Err(e) = runtime.remove_pod_sandbox(req).await
                && !nodeagent_cri::is_not_found(&e)
            {
                anyhow::bail!("RemovePodSandbox {}: {}", s.id, e.message());
            }
        }
        if !rt.sandboxes.is_empty() || !rt.containers.is_empty() {
            self.acted(uid);
        }

        let mut volume = self.volume.clone();
        volume
            .release_pod(ReleasePodRequest {
                pod_uid: uid.to_string(),
                trace: nodeagent_telemetry::current_trace_context(),
            })
            .await
            .map_err(|e| anyhow::anyhow!("releasing volumes: {}", e.message()))?;

        if let Some(pod) = &pod {
            if let Some(parent) = crate::cgroups::pod_cgroup_parent(
                pod,
                self.node.cgroups_per_qos,
                &self.node.cgroup_root,
            ) && let Err(e) = crate::cgroups::remove_pod_cgroup(&self.cgroup_fs, &parent)
            {
                tracing::warn!(cgroup = %parent, error = %e, "cannot remove the pod cgroup yet");
            }
        } else {
            // The pod is unknown (we restarted meanwhile): look for it under every QoS class.
            for qos in ["", "/burstable", "/besteffort"] {
                let root = self.node.cgroup_root.trim_end_matches('/');
                let _ = crate::cgroups::remove_pod_cgroup(
                    &self.cgroup_fs,
                    &format!("{root}/kubepods{qos}/pod{uid}"),
                );
            }
        }
        self.remove_log_dir(uid, rt, pod.as_ref());
        if let (Some(client), Some(pod)) = (&self.api, &pod) {
            crate::api_status::finish_deletion(client, pod).await;
        }

        let mut st = self.lock();
        st.terminating.remove(uid);
        st.runtime.remove(uid);
        st.waiting.remove(uid);
        st.pod_failed.remove(uid);
        st.sandbox_ips.remove(uid);
        st.pull_backoff.retain(|(u, _), _| u != uid);
        let ids: Vec<String> = rt.containers.iter().map(|c| c.id.clone()).collect();
        st.termination_messages.retain(|id, _| !ids.contains(id));
        st.last_action.remove(uid);
        if st.statuses.remove(uid).is_some() {
            st.status_revision += 1;
            let update = nodeagent_proto::api::PodStatusUpdate {
                revision: st.status_revision,
                snapshot: false,
                pods_json: Vec::new(),
                removed_uids: vec![uid.to_string()],
                trace: nodeagent_telemetry::current_trace_context(),
                snapshot_continues: false,
            };
            let _ = self.status_tx.send(update);
        }
        tracing::info!("pod terminated and cleaned up");
        Ok(SyncOutcome::Terminated)
    }

    fn remove_log_dir(
        &self,
        uid: &str,
        rt: &RuntimePodStatus,
        pod: Option<&k8s_openapi::api::core::v1::Pod>,
    ) {
        let (ns, name) = match pod {
            Some(p) => (
                nodeagent_proto::k8s::pod_namespace(p).to_string(),
                nodeagent_proto::k8s::pod_name(p).to_string(),
            ),
            None => (rt.namespace.clone(), rt.name.clone()),
        };
        if name.is_empty() {
            return;
        }
        let dir = self.node.pod_logs_dir.join(format!("{ns}_{name}_{uid}"));
        if let Err(e) = std::fs::remove_dir_all(&dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot remove the pod log directory");
        }
    }
}
