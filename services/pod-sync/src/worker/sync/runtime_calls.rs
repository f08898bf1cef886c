//! The CRI calls a sync makes on sandboxes and containers, the volumes it asks for, and
//! the waiting reasons it records between syncs.

use super::*;

impl PodSync {
    /// Sets `kubepods` and the QoS tiers (`cgroups::qos_cgroups`) for the active pods (the
    /// admitted desired ones and those still terminating), when that changed since the
    /// last time; a failure is logged and retried at the next housekeeping, and a pod
    /// starts anyway, as upstream's syncPod goes on.
    pub(crate) async fn update_qos_cgroups(&self) {
        if !self.node.cgroups_per_qos {
            return;
        }
        let mut set = self.qos_set.lock().await;
        let tiers = {
            let st = self.lock();
            let mut active: HashMap<&str, &Pod> = st
                .desired
                .iter()
                .filter(|(uid, _)| st.admitted.contains(*uid))
                .map(|(uid, p)| (uid.as_str(), p))
                .collect();
            for (uid, p) in &st.terminating {
                active.entry(uid.as_str()).or_insert(p);
            }
            crate::container_manager::cgroups::qos_cgroups(
                &self.node.cgroup_root,
                self.node.pods_limits,
                active.into_values(),
                self.node.memory_qos.is_some(),
            )
        };
        if *set == tiers {
            return;
        }
        match self.cgroups.ensure_qos(&tiers).await {
            Ok(()) => {
                let shares: Vec<String> = tiers
                    .iter()
                    .map(|(n, r, _)| {
                        format!("{}={}", n.path(self.node.cgroup_driver), r.cpu_shares)
                    })
                    .collect();
                tracing::debug!(shares = ?shares, "QoS cgroups set");
                *set = tiers;
            }
            Err(e) => tracing::warn!(error = %e, "cannot set the QoS cgroups"),
        }
    }

    pub(crate) async fn ensure_volumes(
        &self,
        pod: &Pod,
    ) -> Result<nodeagent_proto::api::EnsurePodVolumesResponse, tonic::Status> {
        let mut volume = self.volume.clone();
        volume
            .ensure_pod_volumes(EnsurePodVolumesRequest {
                pod_json: k8s::encode_pod(pod),
                trace: nodeagent_telemetry::current_trace_context(),
            })
            .await
            .map(|r| r.into_inner())
    }

    pub(crate) async fn run_sandbox(
        &self,
        pod: &Pod,
        attempt: u32,
    ) -> anyhow::Result<(String, String)> {
        let uid = k8s::pod_uid(pod).to_string();
        let runtime_handler = self
            .runtime_classes
            .handler(
                pod.spec
                    .as_ref()
                    .and_then(|s| s.runtime_class_name.as_deref()),
            )
            .map_err(anyhow::Error::msg)?;
        let config = runtime_spec::sandbox_config(pod, attempt, &self.node);
        if let Some(name) = crate::container_manager::cgroups::pod_cgroup_name(
            pod,
            self.node.cgroups_per_qos,
            &self.node.cgroup_root,
        ) {
            // The tiers first, with this pod among the active ones (upstream's syncPod calls
            // UpdateQOSCgroups before it makes a pod cgroup).
            self.update_qos_cgroups().await;
            let mut res = crate::container_manager::cgroups::pod_resources(pod);
            if self.node.memory_qos.is_some() {
                res.memory_min = crate::container_manager::memory_qos::pod_memory_min(pod);
            }
            self.cgroups
                .ensure(&name, &res, self.node.pod_pids_limit)
                .await
                .map_err(|e| {
                    anyhow::anyhow!(
                        "creating the pod cgroup {}: {e}",
                        name.path(self.node.cgroup_driver)
                    )
                })?;
        }
        std::fs::create_dir_all(&config.log_directory).map_err(|e| {
            anyhow::anyhow!("create pod log directory {}: {e}", config.log_directory)
        })?;
        let mut runtime = self.cri.runtime.clone();
        let resp = runtime
            .run_pod_sandbox(self.cri.request(RunPodSandboxRequest {
                config: Some(config),
                runtime_handler,
            }))
            .await;
        self.acted(&uid);
        let id = resp
            .map_err(|e| anyhow::anyhow!("RunPodSandbox: {}", e.message()))?
            .into_inner()
            .pod_sandbox_id;
        let ip = self
            .cri
            .sandbox_status(&id)
            .await
            .ok()
            .and_then(|s| s.network)
            .map(|n| n.ip)
            .unwrap_or_default();
        tracing::info!(sandbox.id = %id, pod.ip = %ip, attempt, "sandbox running");
        if !ip.is_empty() {
            self.lock().sandbox_ips.insert(uid.clone(), ip.clone());
        }
        Ok((id, ip))
    }

    pub(crate) async fn stop_container(&self, id: &str, grace_seconds: i64) {
        let mut runtime = self.cri.runtime.clone();
        if let Err(e) = runtime
            .stop_container(stop_request(id, grace_seconds))
            .await
            && !nodeagent_cri::is_not_found(&e)
        {
            tracing::warn!(container.id = %id, error = %e.message(), "StopContainer failed");
        }
    }

    pub(crate) async fn stop_sandbox(&self, id: &str) {
        let mut runtime = self.cri.runtime.clone();
        if let Err(e) = runtime
            .stop_pod_sandbox(self.cri.request(StopPodSandboxRequest {
                pod_sandbox_id: id.to_string(),
            }))
            .await
            && !nodeagent_cri::is_not_found(&e)
        {
            tracing::warn!(sandbox.id = %id, error = %e.message(), "StopPodSandbox failed");
        }
    }

    pub(crate) async fn remove_container(&self, id: &str) {
        let mut runtime = self.cri.runtime.clone();
        if let Err(e) = runtime
            .remove_container(self.cri.request(RemoveContainerRequest {
                container_id: id.to_string(),
            }))
            .await
            && !nodeagent_cri::is_not_found(&e)
        {
            tracing::warn!(container.id = %id, error = %e.message(), "RemoveContainer failed");
        }
    }

    /// Removes a sandbox (stopped or not); one already gone is fine.
    pub(crate) async fn remove_sandbox(&self, id: &str) -> Result<(), String> {
        let mut runtime = self.cri.runtime.clone();
        let req = self.cri.request(cri::RemovePodSandboxRequest {
            pod_sandbox_id: id.to_string(),
        });
        match runtime.remove_pod_sandbox(req).await {
            Err(e) if !nodeagent_cri::is_not_found(&e) => {
                Err(format!("RemovePodSandbox {id}: {}", e.message()))
            }
            _ => Ok(()),
        }
    }

    /// Dead containers of one name beyond the GC's keep count are removed, `keep` (the one
    /// just replaced, whose state the status reports) always kept, as the container GC
    /// would at its next pass.
    pub(crate) async fn remove_dead_except(&self, uid: &str, name: &str, keep: &str) {
        let max = self.gc.max_per_container;
        if max < 0 {
            return;
        }
        let dead: Vec<String> = {
            let st = self.lock();
            let mut others: Vec<_> = st
                .runtime
                .get(uid)
                .map(|r| {
                    r.containers
                        .iter()
                        .filter(|c| c.name == name && c.state == EXITED && c.id != keep)
                        .collect()
                })
                .unwrap_or_default();
            others.sort_by_key(|c| std::cmp::Reverse(c.created_at_unix_nanos));
            others
                .into_iter()
                .skip((max as usize).saturating_sub(1))
                .map(|c| c.id.clone())
                .collect()
        };
        for id in dead {
            self.remove_container(&id).await;
        }
    }

    pub(crate) fn set_waiting(&self, uid: &str, name: &str, reason: &str, message: &str) {
        self.lock()
            .waiting
            .entry(uid.to_string())
            .or_default()
            .insert(
                name.to_string(),
                Waiting {
                    reason: reason.to_string(),
                    message: message.to_string(),
                },
            );
    }

    pub(crate) fn set_waiting_all(&self, pod: &Pod, reason: &str, message: &str) {
        let spec = pod.spec.clone().unwrap_or_default();
        for c in spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
        {
            self.set_waiting(k8s::pod_uid(pod), &c.name, reason, message);
        }
    }

    pub(crate) fn clear_waiting(&self, uid: &str, name: &str) {
        if let Some(m) = self.lock().waiting.get_mut(uid) {
            m.remove(name);
        }
    }
}
