//! The pod's phase, as upstream's `getPhase`: a pure function of the spec and the
//! container statuses, tested with upstream's own tables (`phase/tests.rs`).

use k8s_openapi::api::core::v1::{Container, ContainerStatus, PodSpec};

/// How `pod_phase` sees one container status, in the order upstream's switch tests them.
enum Seen {
    Running,
    Terminated(i32),
    /// Waiting, with the exit code of its last run if it ran before.
    Waiting(Option<i32>),
    Unknown,
}

/// Upstream `podutil.GetContainerStatus`.
fn by_name<'a>(statuses: &'a [ContainerStatus], name: &str) -> Option<&'a ContainerStatus> {
    statuses.iter().find(|s| s.name == name)
}

fn seen(s: &ContainerStatus) -> Seen {
    let state = s.state.clone().unwrap_or_default();
    if state.running.is_some() {
        Seen::Running
    } else if let Some(t) = state.terminated {
        Seen::Terminated(t.exit_code)
    } else if state.waiting.is_some() {
        let last = s.last_state.as_ref().and_then(|l| l.terminated.as_ref());
        Seen::Waiting(last.map(|t| t.exit_code))
    } else {
        Seen::Unknown
    }
}

/// Upstream `getPhase` (`kubelet_pods.go`), ported case by case (`phase/tests.rs` holds
/// upstream's tables). `init` and `app` are the init and regular container statuses;
/// `pod_is_terminal` is upstream's `podIsTerminal` for a pod that is not static;
/// `pod_has_initialized` is upstream's `HasAnyActiveRegularContainerStarted`: some regular
/// container exists in the current sandbox. Sidecars (restartable init containers) hold
/// the pod in Pending only until it has initialized; after that a sidecar that exited or
/// waits to restart does not count at all.
///
/// Whether a stopped container will run again is upstream's `ContainerShouldRestart` (the
/// ContainerRestartRules path, on by default since 1.35): the container's rules and
/// policy, then the pod's.
pub(crate) fn pod_phase(
    spec: &PodSpec,
    init: &[ContainerStatus],
    app: &[ContainerStatus],
    pod_is_terminal: bool,
    pod_has_initialized: bool,
) -> &'static str {
    let should_restart = |c: &Container, exit_code: i32| {
        crate::restart_policy::container_should_restart(c, spec, exit_code)
    };
    let init_containers = spec.init_containers.iter().flatten();
    let (mut pending_init, mut pending_sidecars, mut failed_init) = (0, 0, 0);
    for c in init_containers
        .clone()
        .filter(|c| !crate::worker::init_plan::is_sidecar(c))
    {
        match by_name(init, &c.name).map(seen) {
            Some(Seen::Terminated(code) | Seen::Waiting(Some(code))) => {
                if code != 0 && !should_restart(c, code) {
                    failed_init += 1;
                }
            }
            _ => pending_init += 1,
        }
    }
    let (mut unknown, mut running, mut waiting) = (0, 0, 0);
    let (mut stopped, mut stopped_for_good, mut succeeded) = (0, 0, 0);
    for c in init_containers.filter(|c| crate::worker::init_plan::is_sidecar(c)) {
        let s = by_name(init, &c.name);
        match s.map(seen) {
            None => unknown += 1,
            Some(Seen::Running) => {
                if s.and_then(|s| s.started) != Some(true) {
                    pending_sidecars += 1;
                }
                running += 1;
            }
            // A sidecar that ran and stopped never counts for the phase.
            Some(Seen::Terminated(_) | Seen::Waiting(Some(_))) => {}
            Some(Seen::Waiting(None)) => {
                pending_sidecars += 1;
                waiting += 1;
            }
            Some(Seen::Unknown) => {
                pending_sidecars += 1;
                unknown += 1;
            }
        }
    }
    for c in &spec.containers {
        match by_name(app, &c.name).map(seen) {
            None | Some(Seen::Unknown) => unknown += 1,
            Some(Seen::Running) => running += 1,
            Some(Seen::Waiting(None)) => waiting += 1,
            Some(Seen::Terminated(code)) => {
                stopped += 1;
                stopped_for_good += usize::from(!should_restart(c, code));
                succeeded += usize::from(code == 0);
            }
            // Waiting after a run: stopped, but not succeeded.
            Some(Seen::Waiting(Some(code))) => {
                stopped += 1;
                stopped_for_good += usize::from(!should_restart(c, code));
            }
        }
    }
    if failed_init > 0 {
        return "Failed";
    }
    if pending_init > 0 || (pending_sidecars > 0 && !pod_has_initialized) || waiting > 0 {
        return "Pending";
    }
    if running > 0 && unknown == 0 {
        return "Running";
    }
    if running == 0 && stopped > 0 && unknown == 0 {
        if pod_is_terminal || stopped == stopped_for_good {
            return if stopped == succeeded {
                "Succeeded"
            } else {
                "Failed"
            };
        }
        return "Running"; // some container is restarting
    }
    "Pending"
}

/// Upstream `IsPodPhaseTerminal` (`pkg/api/v1/pod/util.go`): Succeeded and Failed are the
/// phases a pod never leaves.
pub(crate) fn is_terminal(phase: Option<&str>) -> bool {
    matches!(phase, Some("Succeeded" | "Failed"))
}

/// Upstream `generateAPIPodStatus`' three-way merge (`kubelet_pods.go`): a `computed` phase
/// that is not terminal gives way to the terminal phase of the status published last
/// (`published`, upstream's status manager copy), else to that of the API server's copy
/// (`api`). A finished pod stays finished whatever the runtime shows afterwards.
pub(crate) fn keep_terminal(
    computed: &'static str,
    published: Option<&str>,
    api: Option<&str>,
) -> &'static str {
    if is_terminal(Some(computed)) {
        return computed;
    }
    let known = [published, api].into_iter().find(|p| is_terminal(*p));
    match known.flatten() {
        Some("Succeeded") => "Succeeded",
        Some("Failed") => "Failed",
        _ => computed,
    }
}

/// Whether pod-sync may make a sandbox or start a container for a pod whose last published
/// phase is `published` and whose API server copy (for a pod from the API) says `api`.
/// Upstream's `SyncPod` (`kubelet.go`) returns before any sandbox or container is made once
/// the merged phase is terminal, and its pod workers (`pod_workers.go` `UpdatePod`) treat a
/// pod whose API phase is terminal as terminated: it never runs again.
pub(crate) fn may_start(published: Option<&str>, api: Option<&str>) -> bool {
    !is_terminal(published) && !is_terminal(api)
}

#[cfg(test)]
mod tests;
