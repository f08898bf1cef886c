//! The container garbage collector, as upstream's `kuberuntime_gc.go` for pods that still
//! exist: every minute, dead containers beyond `--maximum-dead-containers-per-container`
//! per (pod, container name) are removed, oldest first, once older than
//! `--minimum-container-ttl-duration`; then sandboxes that are not ready and hold no
//! container are removed, except each pod's newest. Pods that no source wants are removed
//! whole by their own worker (housekeeping), as before.

use crate::PodSync;
use nodeagent_proto::api::RuntimePodStatus;
use nodeagent_proto::cri;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

const RUNNING: i32 = cri::ContainerState::ContainerRunning as i32;
const SANDBOX_READY: i32 = cri::PodSandboxState::SandboxReady as i32;

/// The keep count and minimum age.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    /// Dead containers kept per container name; < 0 keeps all.
    pub max_per_container: i32,
    pub min_age: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            max_per_container: 1,
            min_age: Duration::ZERO,
        }
    }
}

/// What the GC removes of one pod.
#[derive(Debug, Default, PartialEq)]
pub struct Plan {
    pub containers: Vec<String>,
    pub sandboxes: Vec<String>,
}

/// The plan for one pod that still exists, at `now` (nanoseconds since the epoch).
pub fn plan(pod: &RuntimePodStatus, policy: Policy, now_nanos: i64) -> Plan {
    let mut out = Plan::default();
    let min_age = policy.min_age.as_nanos() as i64;
    if policy.max_per_container >= 0 {
        let mut dead: BTreeMap<&str, Vec<&nodeagent_proto::api::RuntimeContainer>> =
            BTreeMap::new();
        for c in &pod.containers {
            if c.state != RUNNING && c.created_at_unix_nanos.saturating_add(min_age) <= now_nanos {
                dead.entry(c.name.as_str()).or_default().push(c);
            }
        }
        for (_, mut cs) in dead {
            cs.sort_by_key(|c| std::cmp::Reverse(c.created_at_unix_nanos));
            out.containers.extend(
                cs.into_iter()
                    .skip(policy.max_per_container as usize)
                    .map(|c| c.id.clone()),
            );
        }
    }
    let holds_container = |sandbox: &str| {
        pod.containers
            .iter()
            .any(|c| c.sandbox_id == sandbox && !out.containers.contains(&c.id))
    };
    let newest = pod
        .sandboxes
        .iter()
        .max_by_key(|s| s.created_at_unix_nanos)
        .map(|s| s.id.as_str());
    out.sandboxes = pod
        .sandboxes
        .iter()
        .filter(|s| {
            s.state != SANDBOX_READY && Some(s.id.as_str()) != newest && !holds_container(&s.id)
        })
        .map(|s| s.id.clone())
        .collect();
    out
}

impl PodSync {
    /// One GC pass over the pods that some source still wants (only once every source
    /// and pleg are synced, so a pod is never judged on a partial view).
    pub async fn collect_garbage(&self, policy: Policy) {
        let pods: Vec<RuntimePodStatus> = {
            let st = self.lock();
            if !(st.config_synced && st.sources_ready && st.pleg_synced) {
                return;
            }
            st.runtime
                .iter()
                .filter(|(uid, _)| st.desired.contains_key(*uid))
                .map(|(_, rt)| rt.clone())
                .collect()
        };
        let now = nodeagent_cri::now_nanos();
        for pod in pods {
            let plan = plan(&pod, policy, now);
            if plan == Plan::default() {
                continue;
            }
            tracing::info!(
                pod.uid = %pod.uid,
                containers = plan.containers.len(),
                sandboxes = plan.sandboxes.len(),
                "container GC: removing dead containers and sandboxes"
            );
            for id in &plan.containers {
                self.remove_container(id).await;
            }
            for id in &plan.sandboxes {
                if let Err(e) = self.remove_sandbox(id).await {
                    tracing::warn!(sandbox.id = %id, error = %e, "container GC: RemovePodSandbox failed");
                }
            }
        }
    }
}

/// Runs a pass every `period` (`--container-gc-period`, upstream's `ContainerGCPeriod` of
/// 1m by default) until shutdown.
pub async fn run(sync: Arc<PodSync>, policy: Policy, period: std::time::Duration) {
    let mut tick = tokio::time::interval(period);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = sync.shutdown.wait() => return,
            _ = tick.tick() => sync.collect_garbage(policy).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodeagent_proto::api::{RuntimeContainer, RuntimeSandbox};

    const EXITED: i32 = cri::ContainerState::ContainerExited as i32;
    const NOT_READY: i32 = cri::PodSandboxState::SandboxNotready as i32;

    fn c(id: &str, name: &str, state: i32, created: i64, sandbox: &str) -> RuntimeContainer {
        RuntimeContainer {
            id: id.into(),
            name: name.into(),
            state,
            created_at_unix_nanos: created,
            sandbox_id: sandbox.into(),
            ..Default::default()
        }
    }

    fn s(id: &str, state: i32, created: i64) -> RuntimeSandbox {
        RuntimeSandbox {
            id: id.into(),
            state,
            created_at_unix_nanos: created,
            ..Default::default()
        }
    }

    /// Three sandboxes (the pod's infrastructure died twice), a dead `main` in each old
    /// one, a running `main` and a dead `init` in the newest.
    fn pod() -> RuntimePodStatus {
        RuntimePodStatus {
            uid: "u".into(),
            sandboxes: vec![
                s("s1", NOT_READY, 10),
                s("s2", NOT_READY, 20),
                s("s3", SANDBOX_READY, 30),
            ],
            containers: vec![
                c("m1", "main", EXITED, 11, "s1"),
                c("m2", "main", EXITED, 21, "s2"),
                c("i3", "init", EXITED, 31, "s3"),
                c("m3", "main", RUNNING, 32, "s3"),
            ],
            ..Default::default()
        }
    }

    #[test]
    fn keeps_the_newest_dead_per_name_and_drops_emptied_old_sandboxes() {
        let p = plan(&pod(), Policy::default(), 100);
        assert_eq!(p.containers, ["m1"]);
        // s1 is emptied; s2 still holds the dead main that is kept.
        assert_eq!(p.sandboxes, ["s1"]);
        let two = Policy {
            max_per_container: 2,
            ..Policy::default()
        };
        assert_eq!(plan(&pod(), two, 100), Plan::default());
        let none = Policy {
            max_per_container: 0,
            ..Policy::default()
        };
        let p = plan(&pod(), none, 100);
        assert_eq!(p.containers, ["i3", "m2", "m1"]);
        assert_eq!(p.sandboxes, ["s1", "s2"]);
        let all = Policy {
            max_per_container: -1,
            ..Policy::default()
        };
        assert_eq!(plan(&pod(), all, 100), Plan::default());
    }

    #[test]
    fn young_containers_and_the_newest_sandbox_stay() {
        let young = Policy {
            max_per_container: 0,
            min_age: Duration::from_nanos(80),
        };
        // Only m1 (created at 11) is 80 ns old at 95.
        assert_eq!(plan(&pod(), young, 95).containers, ["m1"]);
        // A pod whose only sandbox is dead and empty keeps it (its worker decides).
        let lone = RuntimePodStatus {
            uid: "u".into(),
            sandboxes: vec![s("s1", NOT_READY, 10)],
            ..Default::default()
        };
        assert_eq!(plan(&lone, Policy::default(), 100), Plan::default());
    }
}
