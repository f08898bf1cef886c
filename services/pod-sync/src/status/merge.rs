//! The last step of a pod's status before it is patched at the API server: upstream's
//! status manager `mergePodStatus` (pkg/kubelet/status/status_manager.go `syncPod`). The
//! conditions other writers own are taken from the API server's copy, the kubelet's own
//! from the new status; and the API server is not told a pod is terminal while any of its
//! containers may still run: its phase, reason and message stay as they were there, and
//! the DisruptionTarget condition of an eviction or a node shutdown waits, until the last
//! container has stopped (upstream since 1.27, so that a Job controller never counts a pod
//! done whose containers still hold its resources). A terminal pod is never Ready
//! (kubernetes #108594). The node's own /pods shows the status unmerged, as upstream's
//! status cache does.

use super::conditions::{POD_COMPLETED, POD_FAILED};
use super::{KUBELET_OWNED, is_terminal};
use k8s_openapi::api::core::v1::{PodCondition, PodStatus};

/// Upstream `kubetypes.PodConditionSharedByKubelet`.
const DISRUPTION_TARGET: &str = "DisruptionTarget";

/// `old`: the status as the API server has it (else what was last sent);
/// `new`: the status just computed; `could_have_running`: some container of the pod may
/// still run.
pub fn merge_pod_status(
    old: &PodStatus,
    mut new: PodStatus,
    could_have_running: bool,
) -> PodStatus {
    let old_conditions = old.conditions.as_deref().unwrap_or_default();
    let mut conditions: Vec<PodCondition> = old_conditions
        .iter()
        .filter(|c| !KUBELET_OWNED.contains(&c.type_.as_str()))
        .cloned()
        .collect();
    let transitioning = !is_terminal(old.phase.as_deref()) && is_terminal(new.phase.as_deref());
    for c in new.conditions.take().unwrap_or_default() {
        if KUBELET_OWNED.contains(&c.type_.as_str()) {
            conditions.push(c);
        } else if c.type_ == DISRUPTION_TARGET && transitioning && !could_have_running {
            match conditions.iter_mut().find(|o| o.type_ == c.type_) {
                Some(o) => *o = c,
                None => conditions.push(c),
            }
        }
    }
    new.conditions = Some(conditions);
    // Upstream: "ResourceClaimStatuses is not owned and not modified by kubelet" (the
    // resource claim controller writes it): what the API server has stays.
    new.resource_claim_statuses = old.resource_claim_statuses.clone();
    if transitioning && could_have_running {
        new.phase = old.phase.clone();
        new.reason = old.reason.clone();
        new.message = old.message.clone();
    }
    if let Some(phase) = new.phase.clone().filter(|p| is_terminal(Some(p))) {
        let reason = if phase == "Succeeded" {
            POD_COMPLETED
        } else {
            POD_FAILED
        };
        let conditions = new.conditions.get_or_insert_with(Vec::new);
        let ready = |t: &str| {
            conditions
                .iter()
                .any(|c| c.type_ == t && c.status == "True")
        };
        if ready("Ready") || ready("ContainersReady") {
            // Upstream's generate...ConditionForTerminalPhase, set with UpdatePodCondition.
            for t in ["ContainersReady", "Ready"] {
                let not_ready = PodCondition {
                    type_: t.into(),
                    status: "False".into(),
                    reason: Some(reason.into()),
                    last_transition_time: Some(super::now()),
                    ..Default::default()
                };
                match conditions.iter_mut().find(|c| c.type_ == t) {
                    Some(c) if c.status == "False" => {
                        let since = c.last_transition_time.take();
                        *c = PodCondition {
                            last_transition_time: since,
                            ..not_ready
                        };
                    }
                    Some(c) => *c = not_ready,
                    None => conditions.push(not_ready),
                }
            }
        }
    }
    new
}

/// Upstream `isPodStatusByKubeletEqual` on statuses `normalizeStatus` made (whose sort of
/// the container statuses by name is done here): the same status as far as the kubelet
/// writes it. The conditions it owns or shares are equal whole (status, reason, message,
/// times), the rest of the status is equal, and the conditions other writers own (a
/// readiness gate's, a controller's) do not count.
pub fn equal_by_kubelet(old: &PodStatus, new: &PodStatus) -> bool {
    let kubelets = |s: &PodStatus| -> std::collections::BTreeMap<String, PodCondition> {
        s.conditions
            .iter()
            .flatten()
            .filter(|c| KUBELET_OWNED.contains(&c.type_.as_str()) || c.type_ == DISRUPTION_TARGET)
            .map(|c| (c.type_.clone(), c.clone()))
            .collect()
    };
    let rest = |s: &PodStatus| {
        let mut s = s.clone();
        s.conditions = None;
        if let Some(list) = s.container_statuses.as_mut() {
            list.sort_by(|a, b| a.name.cmp(&b.name));
        }
        s
    };
    kubelets(old) == kubelets(new) && rest(old) == rest(new)
}

#[cfg(test)]
mod tests;
