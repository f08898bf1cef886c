//! What a terminated pod's container statuses say: upstream's status manager
//! `TerminatePod` (pkg/kubelet/status/status_manager.go). Once the pod has initialized,
//! a container with no terminated state (never created, or lost) is reported terminated
//! with upstream's ContainerStatusUnknown (exit 137); of the init containers, every one
//! up to the last that tried to start is. A user's `kubectl get pod -o yaml` of a
//! deleted or finished pod then shows no container still "waiting" to start.

use super::STATUS_UNKNOWN;
use crate::worker::init_plan::is_sidecar;
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateTerminated, ContainerStatus, PodSpec,
};

/// Upstream's message for a container defaulted at termination.
const TERMINATED_UNKNOWN_MESSAGE: &str =
    "The container could not be located when the pod was terminated";

fn terminated_unknown() -> ContainerState {
    ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code: 137,
            reason: Some(STATUS_UNKNOWN.into()),
            message: Some(TERMINATED_UNKNOWN_MESSAGE.into()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn terminated(s: &ContainerStatus) -> Option<&ContainerStateTerminated> {
    s.state.as_ref()?.terminated.as_ref()
}

fn waiting(s: &ContainerStatus) -> bool {
    s.state.as_ref().is_some_and(|st| st.waiting.is_some())
}

fn last_terminated(s: &ContainerStatus) -> Option<&ContainerStateTerminated> {
    s.last_state.as_ref()?.terminated.as_ref()
}

/// Upstream's `hasPodInitialized`: no init containers, a regular container that has left
/// waiting (or has a last termination), or a last init container that completed (a
/// sidecar: that started).
fn has_initialized(spec: &PodSpec, init: &[ContainerStatus], app: &[ContainerStatus]) -> bool {
    let init_spec = spec.init_containers.as_deref().unwrap_or_default();
    if init_spec.is_empty() {
        return true;
    }
    if app
        .iter()
        .any(|s| last_terminated(s).is_some() || !waiting(s))
    {
        return true;
    }
    let Some(last) = init.last() else {
        return false;
    };
    let Some(c) = init_spec.iter().find(|c| c.name == last.name) else {
        return false;
    };
    if is_sidecar(c) {
        let running = last.state.as_ref().is_some_and(|st| st.running.is_some());
        return running && last.started == Some(true);
    }
    let zero = |t: Option<&ContainerStateTerminated>| t.is_some_and(|t| t.exit_code == 0);
    zero(last_terminated(last)) || zero(terminated(last))
}

/// Upstream's `initializedContainers`: how many init containers, from the first, tried
/// to start (all but the suffix still waiting with no last termination; at least one).
fn initialized_init_containers(init: &[ContainerStatus]) -> usize {
    init.iter()
        .rposition(|s| !waiting(s) || last_terminated(s).is_some())
        .map_or(init.len().min(1), |i| i + 1)
}

/// Upstream's `TerminatePod`, on the statuses just computed for a terminated pod (the
/// phase is decided before, as upstream's is).
pub fn terminate(spec: &PodSpec, init: &mut [ContainerStatus], app: &mut [ContainerStatus]) {
    if has_initialized(spec, init, app) {
        for s in app.iter_mut().filter(|s| terminated(s).is_none()) {
            s.state = Some(terminated_unknown());
        }
    }
    let tried = initialized_init_containers(init);
    for s in init[..tried].iter_mut().filter(|s| terminated(s).is_none()) {
        s.state = Some(terminated_unknown());
    }
}

#[cfg(test)]
mod tests;
