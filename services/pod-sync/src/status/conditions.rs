//! The pod conditions the kubelet owns, as upstream's `pkg/kubelet/status/generate.go`
//! computes them from the pod's spec, its container statuses (init containers' first, as
//! `generateAPIPodStatus` passes them) and its phase. Pure functions, driven by upstream's
//! own tables (`conditions/tests.rs`). Transition times are set by the caller.

use crate::worker::init_plan::is_sidecar;
use k8s_openapi::api::core::v1::{ContainerStatus, PodCondition, PodSpec};

pub const UNKNOWN_CONTAINER_STATUSES: &str = "UnknownContainerStatuses";
pub const CONTAINERS_NOT_READY: &str = "ContainersNotReady";
pub const CONTAINERS_NOT_INITIALIZED: &str = "ContainersNotInitialized";
pub const READINESS_GATES_NOT_READY: &str = "ReadinessGatesNotReady";
pub const POD_COMPLETED: &str = "PodCompleted";
pub const POD_FAILED: &str = "PodFailed";

fn cond(kind: &str, ok: bool, reason: &str, message: String) -> PodCondition {
    PodCondition {
        type_: kind.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: (!reason.is_empty()).then(|| reason.into()),
        message: (!message.is_empty()).then_some(message),
        ..Default::default()
    }
}

fn status_of<'a>(statuses: &'a [ContainerStatus], name: &str) -> Option<&'a ContainerStatus> {
    statuses.iter().find(|s| s.name == name)
}

/// Go's `%s` of a `[]string`: `[a b]`.
fn go_list(names: &[&str]) -> String {
    format!("[{}]", names.join(" "))
}

/// Upstream's "containers with unknown status: [a], containers with `what` status: [b]"
/// (empty when both lists are).
fn not_ok_message(unknown: &[&str], what: &str, others: &[&str]) -> String {
    let mut messages = Vec::new();
    if !unknown.is_empty() {
        messages.push(format!(
            "containers with unknown status: {}",
            go_list(unknown)
        ));
    }
    if !others.is_empty() {
        messages.push(format!(
            "containers with {what} status: {}",
            go_list(others)
        ));
    }
    messages.join(", ")
}

/// Upstream `GenerateContainersReadyCondition`: the sidecars and the regular containers,
/// in the spec's order, must all have a ready status. `statuses` None: nothing is known.
pub fn containers_ready(
    spec: &PodSpec,
    statuses: Option<&[ContainerStatus]>,
    phase: &str,
) -> PodCondition {
    const KIND: &str = "ContainersReady";
    let Some(statuses) = statuses else {
        return cond(KIND, false, UNKNOWN_CONTAINER_STATUSES, String::new());
    };
    let (mut unknown, mut unready) = (Vec::new(), Vec::new());
    let counted = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| is_sidecar(c))
        .chain(spec.containers.iter());
    for c in counted {
        match status_of(statuses, &c.name) {
            Some(s) if !s.ready => unready.push(c.name.as_str()),
            Some(_) => {}
            None => unknown.push(c.name.as_str()),
        }
    }
    // All known and the pod succeeded, or the pod failed (its containers may still be
    // terminating): not ready, with the phase as the reason.
    if (phase == "Succeeded" && unknown.is_empty()) || phase == "Failed" {
        let reason = if phase == "Succeeded" {
            POD_COMPLETED
        } else {
            POD_FAILED
        };
        return cond(KIND, false, reason, String::new());
    }
    let message = not_ok_message(&unknown, "unready", &unready);
    if message.is_empty() {
        cond(KIND, true, "", message)
    } else {
        cond(KIND, false, CONTAINERS_NOT_READY, message)
    }
}

/// Upstream `GeneratePodReadyCondition`: ContainersReady's answer when it is not True,
/// else every readiness gate needs a condition of its type with status True.
pub fn pod_ready(
    spec: &PodSpec,
    conditions: &[PodCondition],
    statuses: Option<&[ContainerStatus]>,
    phase: &str,
) -> PodCondition {
    const KIND: &str = "Ready";
    let containers = containers_ready(spec, statuses, phase);
    if containers.status != "True" {
        return PodCondition {
            type_: KIND.into(),
            ..containers
        };
    }
    let gates: Vec<String> = spec
        .readiness_gates
        .iter()
        .flatten()
        .filter_map(|g| {
            let t = &g.condition_type;
            match conditions.iter().find(|c| &c.type_ == t) {
                None => Some(format!(
                    "corresponding condition of pod readiness gate \"{t}\" does not exist."
                )),
                Some(c) if c.status != "True" => Some(format!(
                    "the status of pod readiness gate \"{t}\" is not \"True\", but {}",
                    c.status
                )),
                Some(_) => None,
            }
        })
        .collect();
    if gates.is_empty() {
        cond(KIND, true, "", String::new())
    } else {
        cond(KIND, false, READINESS_GATES_NOT_READY, gates.join(", "))
    }
}

/// Upstream `HasAnyRegularContainerStarted`: a regular container is running or has run.
pub fn any_regular_container_started(spec: &PodSpec, statuses: &[ContainerStatus]) -> bool {
    statuses.iter().any(|s| {
        spec.containers.iter().any(|c| c.name == s.name)
            && s.state
                .as_ref()
                .is_some_and(|st| st.running.is_some() || st.terminated.is_some())
    })
}

/// Upstream `GeneratePodInitializedCondition`: every regular init container ready (it
/// succeeded) and every sidecar started; or a regular container has started (the pod was
/// initialized, whatever its sidecars do now); a succeeded pod is PodCompleted.
pub fn initialized(
    spec: &PodSpec,
    statuses: Option<&[ContainerStatus]>,
    phase: &str,
) -> PodCondition {
    const KIND: &str = "Initialized";
    let init = spec.init_containers.as_deref().unwrap_or_default();
    let Some(statuses) = statuses else {
        return if init.is_empty() {
            cond(KIND, true, "", String::new())
        } else {
            cond(KIND, false, UNKNOWN_CONTAINER_STATUSES, String::new())
        };
    };
    let (mut unknown, mut incomplete) = (Vec::new(), Vec::new());
    for c in init {
        let Some(s) = status_of(statuses, &c.name) else {
            unknown.push(c.name.as_str());
            continue;
        };
        let done = if is_sidecar(c) {
            s.started == Some(true)
        } else {
            s.ready
        };
        if !done {
            incomplete.push(c.name.as_str());
        }
    }
    if phase == "Succeeded" && unknown.is_empty() {
        return cond(KIND, true, POD_COMPLETED, String::new());
    }
    if any_regular_container_started(spec, statuses) {
        return cond(KIND, true, "", String::new());
    }
    let message = not_ok_message(&unknown, "incomplete", &incomplete);
    if message.is_empty() {
        cond(KIND, true, "", message)
    } else {
        cond(KIND, false, CONTAINERS_NOT_INITIALIZED, message)
    }
}

#[cfg(test)]
mod tests;
