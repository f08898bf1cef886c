//! Tearing a pod down: stop its containers within the grace period, stop and remove its
//! sandboxes and containers, release its volumes, and remove what the runtime leaves
//! behind (the pod cgroup and the log directory).

use crate::PodSync;
use crate::worker::kill_order::{GraceClock, TerminationOrder};
use crate::worker::workers::SyncOutcome;
use k8s_openapi::api::core::v1::{Container, Lifecycle, Pod, PodSpec};
use nodeagent_proto::api::{ReleasePodRequest, RuntimePodStatus};
use nodeagent_proto::cri;
use nodeagent_proto::k8s::labels;
use std::collections::HashMap;
use std::sync::Arc;

impl PodSync {
    /// Unmounts and removes the pod's volumes (idempotent).
    pub(crate) async fn release_volumes(&self, uid: &str) -> anyhow::Result<()> {
        let mut volume = self.volume.clone();
        volume
            .release_pod(ReleasePodRequest {
                pod_uid: uid.to_string(),
                trace: nodeagent_telemetry::current_trace_context(),
            })
            .await
            .map_err(|e| anyhow::anyhow!("releasing volumes: {}", e.message()))?;
        Ok(())
    }

    pub(crate) async fn kill_pod(
        self: &Arc<Self>,
        uid: &str,
        rt: &RuntimePodStatus,
    ) -> anyhow::Result<SyncOutcome> {
        let pod = self.lock().terminating.get(uid).cloned();
        // Unknown pod (removed while we were down): each container's own annotations say.
        let grace = pod.as_ref().map(crate::worker::kill_order::grace_seconds);
        let running: Vec<_> = rt
            .containers
            .iter()
            .filter(|c| c.state == cri::ContainerState::ContainerRunning as i32)
            .collect();
        if !rt.sandboxes.is_empty() || !rt.containers.is_empty() {
            tracing::info!(
                containers = rt.containers.len(),
                sandboxes = rt.sandboxes.len(),
                grace_seconds = ?grace,
                "terminating pod"
            );
        }
        // A shorter deletion that arrives meanwhile shortens the kills under way.
        let clock = pod.as_ref().map(|p| {
            let (clock, updates) =
                GraceClock::shrinkable(crate::worker::kill_order::grace_seconds(p));
            self.lock().grace_updates.insert(uid.to_string(), updates);
            clock
        });
        // Regular containers first, then sidecars in reverse order (upstream).
        let names: Vec<&str> = running.iter().map(|c| c.name.as_str()).collect();
        let order = pod
            .as_ref()
            .map(|p| Arc::new(TerminationOrder::new(p, &names)));
        let mut stops = tokio::task::JoinSet::new();
        for c in running {
            let this = self.clone();
            let (id, name, pod) = (c.id.clone(), c.name.clone(), pod.clone());
            let (clock, order) = (clock.clone(), order.clone());
            let rt = rt.clone();
            stops.spawn(async move {
                let pod = match pod {
                    Some(p) => p,
                    None => this.restore_pod(&rt, &id, &name).await,
                };
                let clock = clock.unwrap_or_else(|| {
                    GraceClock::fixed(crate::worker::kill_order::grace_seconds(&pod))
                });
                this.kill_container_ordered(Some(&pod), &name, &id, &clock, None, order.as_deref())
                    .await
            });
        }
        self.publish_status(uid).await;
        while stops.join_next().await.is_some() {}
        self.lock().grace_updates.remove(uid);
        // The final status, from the runtime's view of the stopped containers (before they
        // are removed), goes to the API server before the pod is deleted there.
        let terminal = match (&self.api, &pod) {
            (Some(_), Some(_)) if !rt.containers.is_empty() => {
                self.acted(uid);
                self.terminal_status(uid).await
            }
            _ => None,
        };
        // Kept until the API server has it: a later pass (this one failing below, or its
        // patch refused) finds the containers gone and cannot compute it again.
        if let Some(status) = &terminal {
            self.lock()
                .unsent_terminal
                .insert(uid.to_string(), status.clone());
        }
        for s in &rt.sandboxes {
            self.stop_sandbox(&s.id).await;
        }
        for c in &rt.containers {
            self.remove_container(&c.id).await;
        }
        for s in &rt.sandboxes {
            self.remove_sandbox(&s.id)
                .await
                .map_err(anyhow::Error::msg)?;
        }
        if !rt.sandboxes.is_empty() || !rt.containers.is_empty() {
            self.acted(uid);
        }

        self.release_volumes(uid).await?;

        if let Some(pod) = &pod {
            if let Some(name) = crate::container_manager::cgroups::pod_cgroup_name(
                pod,
                self.node.cgroups_per_qos,
                &self.node.cgroup_root,
            ) && let Err(e) = self.cgroups.remove(&name).await
            {
                let cgroup = name.path(self.node.cgroup_driver);
                tracing::warn!(%cgroup, error = %e, "cannot remove the pod cgroup yet");
            }
        } else if let Ok(uid) = nodeagent_hostpath::uid(uid)
            && self.node.cgroups_per_qos
        {
            // The pod is unknown (we restarted meanwhile): look for it under every QoS class.
            // Its UID comes from a runtime label, so it is checked like any other.
            for qos in nodeagent_config::cgroup_name::QOS_PARTS {
                let name = nodeagent_config::cgroup_name::pod_cgroup_name(
                    &self.node.cgroup_root,
                    qos,
                    uid,
                );
                let _ = self.cgroups.remove(&name).await;
            }
        }
        self.remove_log_dir(uid, rt, pod.as_ref());
        if let (Some(client), Some(pod)) = (&self.api, &pod) {
            // The API server learns the terminal phase before the pod goes (upstream's
            // status manager deletes only a pod whose phase is terminal there,
            // `canBeDeleted`). When it cannot be told, or the deletion fails, the pod stays
            // (here and there) and this pass runs again: a watcher never sees a pod go
            // that still said Running.
            let terminal = terminal.or_else(|| self.lock().unsent_terminal.get(uid).cloned());
            if !crate::status::api_status::finish_removal(client, pod, terminal.as_ref()).await {
                tracing::warn!(
                    "the pod stays until the API server has its terminal status and its deletion; trying again"
                );
                return Ok(SyncOutcome::RetryAfter(
                    crate::status::api_status::STATUS_RESYNC,
                ));
            }
        }

        let was_finished = {
            let mut st = self.lock();
            st.terminating.remove(uid);
            st.unsent_terminal.remove(uid);
            st.runtime.remove(uid);
            st.waiting.remove(uid);
            st.pod_failed.remove(uid);
            // Whoever still waits for a kill of it learns that it is gone.
            st.kill_requests.remove(uid);
            let was_finished = st.finished.remove(uid).is_some();
            st.admitted.remove(uid);
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
            was_finished
        };
        if was_finished {
            self.save_finished().await;
        }
        tracing::info!("pod terminated and cleaned up");
        Ok(SyncOutcome::Terminated)
    }

    /// The status of a pod whose containers have all stopped, from the runtime's view after
    /// our last action (so it shows their exit codes).
    async fn terminal_status(
        self: &Arc<Self>,
        uid: &str,
    ) -> Option<k8s_openapi::api::core::v1::PodStatus> {
        let newer_than = self.lock().last_action.get(uid).copied().unwrap_or(0);
        if let Err(e) = self.runtime_status(uid, newer_than).await {
            tracing::warn!(error = %e, "no runtime status for the terminal pod status");
        }
        self.publish_status(uid).await;
        self.lock().statuses.get(uid)?.status.clone()
    }

    /// What a container's annotations keep of its pod (upstream
    /// `restoreSpecsFromContainerLabels`), to stop it as its spec asked.
    async fn restore_pod(&self, rt: &RuntimePodStatus, id: &str, name: &str) -> Pod {
        let annotations = match self.cri.container_status(id).await {
            Ok(r) => r.status.map(|s| s.annotations).unwrap_or_default(),
            Err(e) => {
                tracing::warn!(container.id = %id, error = %e.message(), "cannot read the container's annotations; stopping it with the default grace period");
                HashMap::new()
            }
        };
        restored_pod(rt, name, &annotations)
    }

    fn remove_log_dir(&self, uid: &str, rt: &RuntimePodStatus, pod: Option<&Pod>) {
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

/// A stand-in for a gone pod with one container, from that container's annotations: the
/// grace period, the preStop handler and the ports it may name. What is missing or
/// unreadable falls back to the defaults (30 s, no hook).
pub(crate) fn restored_pod(
    rt: &RuntimePodStatus,
    name: &str,
    annotations: &HashMap<String, String>,
) -> Pod {
    fn json<T: k8s_openapi::serde::de::DeserializeOwned>(
        a: &HashMap<String, String>,
        key: &str,
    ) -> Option<T> {
        a.get(key).and_then(|v| serde_json::from_str(v).ok())
    }
    let grace = annotations
        .get(labels::POD_TERMINATION_GRACE_PERIOD)
        .and_then(|v| v.parse::<i64>().ok());
    let container = Container {
        name: name.to_string(),
        ports: json(annotations, labels::CONTAINER_PORTS),
        lifecycle: json(annotations, labels::CONTAINER_PRE_STOP_HANDLER).map(|h| Lifecycle {
            pre_stop: Some(h),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut pod = Pod::default();
    pod.metadata.uid = Some(rt.uid.clone());
    pod.metadata.name = Some(rt.name.clone());
    pod.metadata.namespace = Some(rt.namespace.clone());
    pod.spec = Some(PodSpec {
        containers: vec![container],
        termination_grace_period_seconds: grace,
        ..Default::default()
    });
    pod
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt() -> RuntimePodStatus {
        RuntimePodStatus {
            uid: "u1".into(),
            name: "web".into(),
            namespace: "default".into(),
            ..Default::default()
        }
    }

    #[test]
    fn an_orphan_keeps_its_grace_period_pre_stop_and_ports() {
        let annotations = HashMap::from([
            (
                labels::POD_TERMINATION_GRACE_PERIOD.to_string(),
                "5".to_string(),
            ),
            (
                labels::CONTAINER_PRE_STOP_HANDLER.to_string(),
                r#"{"httpGet":{"path":"/quit","port":"http"}}"#.to_string(),
            ),
            (
                labels::CONTAINER_PORTS.to_string(),
                r#"[{"name":"http","containerPort":8080}]"#.to_string(),
            ),
        ]);
        let pod = restored_pod(&rt(), "app", &annotations);
        assert_eq!(crate::worker::kill_order::grace_seconds(&pod), 5);
        assert_eq!(nodeagent_proto::k8s::pod_uid(&pod), "u1");
        let c = &pod.spec.as_ref().unwrap().containers[0];
        assert_eq!(c.name, "app");
        let hook = c.lifecycle.as_ref().unwrap().pre_stop.as_ref().unwrap();
        assert_eq!(
            hook.http_get.as_ref().unwrap().path.as_deref(),
            Some("/quit")
        );
        assert_eq!(
            nodeagent_cri::actions::named_ports(c),
            vec![("http".to_string(), 8080)]
        );
    }

    #[test]
    fn create_container_annotations_round_trip_to_the_restored_pod() {
        use crate::runtime_spec::{ContainerInputs, EnvRefs, NodeContext, container_config};
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "u1"},
            "spec": {"terminationGracePeriodSeconds": 7, "containers": [{
                "name": "app", "image": "busybox:1.36",
                "ports": [{"name": "http", "containerPort": 8080}],
                "lifecycle": {"preStop": {"exec": {"command": ["sh", "-c", "echo bye"]}}}
            }]}
        }))
        .unwrap();
        let node = NodeContext::for_unit_tests("nodeagent-kill-unit");
        let c = &pod.spec.as_ref().unwrap().containers[0];
        let cfg = container_config(ContainerInputs {
            pod: &pod,
            container: c,
            attempt: 0,
            backoff_base: 0,
            volumes: &HashMap::new(),
            pod_ip: "",
            node: &node,
            env_refs: &EnvRefs::default(),
        })
        .unwrap();
        let restored = restored_pod(&rt(), "app", &cfg.annotations);
        assert_eq!(crate::worker::kill_order::grace_seconds(&restored), 7);
        let r = &restored.spec.as_ref().unwrap().containers[0];
        assert_eq!(r.lifecycle, c.lifecycle);
        assert_eq!(r.ports, c.ports);
    }

    #[test]
    fn an_orphan_without_annotations_gets_the_defaults() {
        let bad = HashMap::from([(
            labels::CONTAINER_PRE_STOP_HANDLER.to_string(),
            "{not json".to_string(),
        )]);
        let pod = restored_pod(&rt(), "app", &bad);
        assert_eq!(crate::worker::kill_order::grace_seconds(&pod), 30);
        assert!(pod.spec.unwrap().containers[0].lifecycle.is_none());
    }
}
