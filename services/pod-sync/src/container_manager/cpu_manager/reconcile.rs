//! upstream's `reconcileState` loop: every `cpuManagerReconcilePeriod`, the CPUs of pods
//! no longer active go back to the shared set (`removeStaleState`), and each running
//! container whose cpuset is not what the state says gets it with
//! `UpdateContainerResources` (the shared set grows and shrinks as pods with CPUs of their
//! own come and go).

use crate::PodSync;
use nodeagent_cri::api::{LinuxContainerResources, UpdateContainerResourcesRequest};
use std::sync::Arc;
use std::time::Duration;

/// CRI's CONTAINER_RUNNING (as worker/sync.rs, plan.rs and gc.rs name it).
const RUNNING: i32 = nodeagent_proto::cri::ContainerState::ContainerRunning as i32;

pub async fn run(sync: Arc<PodSync>, period: Duration) {
    if !sync.cpu_manager.is_static() {
        return;
    }
    let mut tick = tokio::time::interval(period);
    loop {
        tokio::select! {
            _ = sync.shutdown.wait() => return,
            _ = tick.tick() => sync.reconcile_cpus().await,
        }
    }
}

impl PodSync {
    pub(crate) async fn reconcile_cpus(&self) {
        let (active, running) = {
            let st = self.lock();
            let running: Vec<(String, String, String)> = st
                .runtime
                .iter()
                .flat_map(|(uid, rt)| {
                    rt.containers
                        .iter()
                        .filter(|c| c.state == RUNNING)
                        .map(move |c| (c.id.clone(), uid.clone(), c.name.clone()))
                })
                .collect();
            (st.active_uids(), running)
        };
        // Until every source has listed its pods, a pod missing from them may only not
        // be known yet: nothing is released.
        if let Some(active) = active {
            for uid in self.cpu_manager.release_inactive(&active) {
                tracing::info!(k8s.pod.uid = %uid, "CPU manager: the pod's exclusive CPUs are shared again");
            }
        }
        for (id, cpus) in self.cpu_manager.out_of_date(&running) {
            let mut runtime = self.cri.runtime.clone();
            let request = self.cri.request(UpdateContainerResourcesRequest {
                container_id: id.clone(),
                linux: Some(LinuxContainerResources {
                    cpuset_cpus: cpus.clone(),
                    ..Default::default()
                }),
                ..Default::default()
            });
            match runtime.update_container_resources(request).await {
                Ok(_) => {
                    tracing::debug!(container.id = %id, cpuset = %cpus, "CPU manager: cpuset updated");
                    self.cpu_manager.applied(&id, &cpus);
                }
                // upstream's words; the next pass tries again.
                Err(e) => tracing::warn!(
                    container.id = %id, cpuset = %cpus, error = %e.message(),
                    "ReconcileState: failed to update container"
                ),
            }
        }
    }
}
