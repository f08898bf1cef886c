//! pleg's metrics, with upstream's names, in the process's registry (served by the
//! transport's Metrics service): `kubelet_pleg_relist_duration_seconds`,
//! `kubelet_pleg_relist_interval_seconds`, `kubelet_pleg_last_seen_seconds`, and, from
//! each relist's view of the runtime, `kubelet_running_pods` and
//! `kubelet_running_containers{container_state}`.

use nodeagent_proto::cri::{ContainerState, PodSandboxState};
use nodeagent_telemetry::metrics::kubelet;
use std::time::SystemTime;

/// One relist took `seconds`.
pub fn observe_relist_duration(seconds: f64) {
    kubelet::PLEG_RELIST_DURATION.observe(seconds);
}

/// A successful relist at `now`, `interval` after the previous one.
pub fn observe_relist(now: SystemTime, interval: Option<f64>) {
    if let Some(interval) = interval {
        kubelet::PLEG_RELIST_INTERVAL.observe(interval);
    }
    if let Ok(since_epoch) = now.duration_since(SystemTime::UNIX_EPOCH) {
        kubelet::PLEG_LAST_SEEN.set(since_epoch.as_secs_f64());
    }
}

/// Upstream's `container_state` label: the lower-case kubecontainer state.
fn container_state(state: i32) -> &'static str {
    match ContainerState::try_from(state) {
        Ok(ContainerState::ContainerCreated) => "created",
        Ok(ContainerState::ContainerRunning) => "running",
        Ok(ContainerState::ContainerExited) => "exited",
        _ => "unknown",
    }
}

/// Pods with a ready sandbox, and containers by state, as the runtime listed them.
pub fn record_runtime_view(sandbox_states: &[i32], container_states: &[i32]) {
    let ready = sandbox_states
        .iter()
        .filter(|s| **s == PodSandboxState::SandboxReady as i32)
        .count();
    kubelet::RUNNING_PODS.set(i64::try_from(ready).unwrap_or(i64::MAX));
    for state in ["created", "running", "exited", "unknown"] {
        let n = container_states
            .iter()
            .filter(|s| container_state(**s) == state)
            .count();
        kubelet::RUNNING_CONTAINERS
            .get_or_create(&vec![("container_state", state.to_string())])
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_ready_sandboxes_and_containers_by_state() {
        record_runtime_view(
            &[
                PodSandboxState::SandboxReady as i32,
                PodSandboxState::SandboxNotready as i32,
            ],
            &[
                ContainerState::ContainerRunning as i32,
                ContainerState::ContainerRunning as i32,
                ContainerState::ContainerExited as i32,
            ],
        );
        observe_relist_duration(0.003);
        let text = nodeagent_telemetry::metrics::encode();
        assert!(text.contains("kubelet_running_pods 1\n"), "{text}");
        assert!(
            text.contains("kubelet_running_containers{container_state=\"running\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("kubelet_running_containers{container_state=\"exited\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("kubelet_pleg_relist_duration_seconds_bucket{le=\"0.005\"} 1\n"),
            "{text}"
        );
    }
}
