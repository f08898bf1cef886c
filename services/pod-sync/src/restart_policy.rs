//! Whether a container runs again, as upstream's `pkg/api/v1/pod` decides it since the
//! ContainerRestartRules feature (beta and on by default since 1.35): a regular or init
//! container's own `restartPolicy` overrides the pod's, and its `restartPolicyRules`
//! (first match wins, on the exit code) come before both. Used by the planners
//! (`worker/sync/plan.rs`, `worker/init_plan.rs`), the phase and the status.

use k8s_openapi::api::core::v1::{Container, ContainerRestartRule, PodSpec};

/// The rule action this node carries out (`RestartAllContainers`, alpha in 1.35, is
/// refused by config-source).
pub const RESTART: &str = "Restart";

/// upstream's `findMatchingContainerRestartRule`: the first rule whose exit codes match.
pub fn matching_rule(c: &Container, exit_code: i32) -> Option<&ContainerRestartRule> {
    c.restart_policy_rules.iter().flatten().find(|rule| {
        let Some(codes) = &rule.exit_codes else {
            return false;
        };
        let listed = codes.values.iter().flatten().any(|v| *v == exit_code);
        match codes.operator.as_str() {
            "In" => listed,
            "NotIn" => !listed,
            _ => false,
        }
    })
}

fn by_policy(policy: &str, exit_code: i32) -> bool {
    match policy {
        "Never" => false,
        "OnFailure" => exit_code != 0,
        _ => true,
    }
}

/// upstream's `ContainerShouldRestart`: the container's rules (only with its own policy
/// set), then its policy, then the pod's (Always when unset).
pub fn container_should_restart(c: &Container, spec: &PodSpec, exit_code: i32) -> bool {
    if let Some(policy) = c.restart_policy.as_deref() {
        if matching_rule(c, exit_code).is_some_and(|r| r.action == RESTART) {
            return true;
        }
        if matches!(policy, "Always" | "OnFailure" | "Never") {
            return by_policy(policy, exit_code);
        }
    }
    by_policy(
        spec.restart_policy.as_deref().unwrap_or("Always"),
        exit_code,
    )
}

/// Whether a container killed while it ran (a failed probe) or an init container that
/// failed runs again (upstream's computePodActions and computeInitContainerActions): its
/// own policy when set ("Container-level restart rules are not evaluated because the
/// container is still running"), else the pod's (`pod_restarts`: not Never).
pub fn restarts_after_kill(c: &Container, pod_restarts: bool) -> bool {
    c.restart_policy
        .as_deref()
        .map_or(pod_restarts, |p| p != "Never")
}

#[cfg(test)]
mod tests;
