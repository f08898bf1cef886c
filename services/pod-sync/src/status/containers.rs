//! One container's status as upstream's `convertToAPIContainerStatuses` makes it: its
//! state from the runtime's latest instance, its last state from the one before (or from
//! the previous status when the runtime no longer knows it), what the last sync recorded
//! while it waits to start again, readiness and startup from the probes, and the
//! resources it was allocated and runs with.

use super::{StatusInputs, time};
use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, Pod,
};
use nodeagent_proto::api::{RuntimeContainer, RuntimePodStatus};
use nodeagent_proto::cri;
use std::collections::HashMap;

/// The latest and the previous instance of each container name, newest first by attempt.
pub fn instances<'a>(rt: Option<&'a RuntimePodStatus>, name: &str) -> Vec<&'a RuntimeContainer> {
    let mut v: Vec<&RuntimeContainer> = rt
        .map(|r| r.containers.iter().filter(|c| c.name == name).collect())
        .unwrap_or_default();
    v.sort_by(|a, b| {
        (b.attempt, b.created_at_unix_nanos).cmp(&(a.attempt, a.created_at_unix_nanos))
    });
    v
}

pub(super) fn state_of(c: &RuntimeContainer, messages: &HashMap<String, String>) -> ContainerState {
    match cri::ContainerState::try_from(c.state) {
        Ok(cri::ContainerState::ContainerRunning) => ContainerState {
            running: Some(ContainerStateRunning {
                started_at: time(c.started_at_unix_nanos),
            }),
            ..Default::default()
        },
        Ok(cri::ContainerState::ContainerExited) => ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: c.exit_code,
                reason: Some(if c.reason.is_empty() {
                    if c.exit_code == 0 {
                        "Completed".into()
                    } else {
                        "Error".into()
                    }
                } else {
                    c.reason.clone()
                }),
                message: messages
                    .get(&c.id)
                    .filter(|m| !m.is_empty())
                    .cloned()
                    .or_else(|| (!c.message.is_empty()).then(|| c.message.clone())),
                started_at: time(c.started_at_unix_nanos),
                finished_at: time(c.finished_at_unix_nanos),
                container_id: Some(format!("containerd://{}", c.id)),
                ..Default::default()
            }),
            ..Default::default()
        },
        // Upstream: a created container waits with no reason, and so does one in an unknown
        // state (but see `container_status` for one that was running).
        _ => ContainerState {
            waiting: Some(ContainerStateWaiting::default()),
            ..Default::default()
        },
    }
}

/// Upstream `kubecontainer.ContainerReasonStatusUnknown`.
pub(super) const STATUS_UNKNOWN: &str = "ContainerStatusUnknown";

/// Upstream `ShouldContainerBeRestarted` (with `ContainerShouldRestart` for a container's
/// own restartPolicy): whether the next sync starts this container again, so a recorded
/// start failure is what its status shows.
pub(super) fn should_restart(pod: &Pod, c: &Container, latest: Option<&RuntimeContainer>) -> bool {
    if pod.metadata.deletion_timestamp.is_some() {
        return false;
    }
    let Some(latest) = latest else {
        return true;
    };
    match cri::ContainerState::try_from(latest.state) {
        Ok(cri::ContainerState::ContainerRunning) => false,
        Ok(cri::ContainerState::ContainerExited) => {
            let no_spec = k8s_openapi::api::core::v1::PodSpec::default();
            let spec = pod.spec.as_ref().unwrap_or(&no_spec);
            crate::restart_policy::container_should_restart(c, spec, latest.exit_code)
        }
        // Created or unknown: always (re)started.
        _ => true,
    }
}

pub(super) fn container_status(
    c: &Container,
    inputs: &StatusInputs<'_>,
    default_waiting: &str,
    old: Option<&ContainerStatus>,
    is_init: bool,
    finished: bool,
) -> ContainerStatus {
    let all = instances(inputs.runtime, &c.name);
    let latest = all.first().copied();
    let previous = all.get(1).copied();
    let msgs = inputs.termination_messages;
    let default_state = || ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(default_waiting.into()),
            message: None,
        }),
        ..Default::default()
    };
    // Upstream `convertToAPIContainerStatuses`: a container the runtime does not know
    // (any more) keeps what its previous status said: all of it when it had terminated,
    // else its restart count and last state; one that was running has terminated in a
    // way nobody saw. Only with a runtime view (without one nothing is known to be gone),
    // or once the pod has finished: its containers are gone for good (removed by the
    // container GC with its sandbox) and their last words stand.
    let known = inputs.runtime.is_some() || finished;
    let old = old.filter(|_| known);
    if latest.is_none()
        && let Some(o) = old.filter(|o| o.state.as_ref().is_some_and(|s| s.terminated.is_some()))
    {
        let mut s = o.clone();
        if should_restart(inputs.pod, c, None)
            && let Some(w) = inputs.waiting.get(&c.name)
        {
            s.last_state = s.state.take();
            s.state = Some(ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some(w.reason.clone()),
                    message: (!w.message.is_empty()).then(|| w.message.clone()),
                }),
                ..Default::default()
            });
        }
        return s;
    }
    let mut restart_count = latest.map(|l| l.attempt as i32).unwrap_or(0);
    let mut state = latest
        .map(|l| state_of(l, msgs))
        .unwrap_or_else(default_state);
    let old_running = old.is_some_and(|o| o.state.as_ref().is_some_and(|s| s.running.is_some()));
    let mut last_state = previous.map(|p| state_of(p, msgs));
    if latest.is_some_and(|l| l.state == cri::ContainerState::ContainerUnknown as i32)
        && old_running
    {
        // Upstream: a container that was running and whose state is now unknown has
        // terminated, not gone back to waiting.
        state = ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: 137,
                reason: Some(STATUS_UNKNOWN.into()),
                message: Some(
                    "The container could not be located when the pod was terminated".into(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        };
        restart_count = old.map_or(0, |o| o.restart_count) + 1;
    }
    if latest.is_none()
        && let Some(o) = old
    {
        restart_count = o.restart_count;
        last_state = o
            .last_state
            .clone()
            .filter(|s| *s != ContainerState::default());
        if old_running && last_state.as_ref().is_none_or(|s| s.terminated.is_none()) {
            last_state = Some(ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: 137,
                    reason: Some(STATUS_UNKNOWN.into()),
                    message: Some("The container could not be located when the pod was deleted.  The container used to be Running".into()),
                    ..Default::default()
                }),
                ..Default::default()
            });
            if inputs.pod.metadata.deletion_timestamp.is_none() {
                restart_count += 1;
            }
        }
    }
    // Upstream: a regular init container the runtime no longer knows, in a pod whose
    // regular containers were created, has completed.
    let lost_init = is_init
        && latest.is_none()
        && !crate::worker::init_plan::is_sidecar(c)
        && state.waiting.is_some()
        && any_regular_created(inputs);
    if lost_init {
        state = ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: 0,
                reason: Some("Completed".into()),
                message: Some("Unable to get init container status from container runtime and pod has been initialized, treat it as exited normally".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
    }
    // What the last sync recorded (an image pull error, a back-off) shows only for a
    // container the next sync starts again (upstream's reason cache behind
    // `ShouldContainerBeRestarted`); an init container that succeeded is never restarted.
    let restarts = should_restart(inputs.pod, c, latest)
        && !(is_init
            && latest.is_some_and(|l| {
                l.state == cri::ContainerState::ContainerExited as i32 && l.exit_code == 0
            }));
    let waiting = inputs
        .waiting
        .get(&c.name)
        .filter(|_| restarts && !lost_init);
    if let Some(w) = waiting {
        // A container waiting to be (re)started shows its last run as lastState.
        if state.terminated.is_some() {
            last_state = Some(state.clone());
        }
        state = ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(w.reason.clone()),
                message: (!w.message.is_empty()).then(|| w.message.clone()),
            }),
            ..Default::default()
        };
    }
    let running = state.running.is_some();
    // With a startup probe, a container has started only once that probe succeeded.
    let started = running
        && (c.startup_probe.is_none() || latest.is_some_and(|l| inputs.started.contains(&l.id)));
    let ready = started
        && latest.is_some_and(|l| {
            inputs
                .readiness
                .get(&l.id)
                .copied()
                .unwrap_or(c.readiness_probe.is_none())
        });
    let allocated = c.resources.clone().unwrap_or_default();
    // Upstream (InPlacePodVerticalScaling, GA): what the node allocated the container, and
    // what a running one runs with (its cpu and memory as carried out; the rest as
    // allocated).
    let resources = latest.filter(|_| running).map(|l| {
        let actuated = inputs
            .actuated
            .and_then(|a| a.get(&l.id))
            .unwrap_or(&allocated);
        status_resources(&allocated, actuated)
    });
    ContainerStatus {
        name: c.name.clone(),
        image: c.image.clone().unwrap_or_default(),
        image_id: latest.map(|l| l.image_ref.clone()).unwrap_or_default(),
        container_id: latest.map(|l| format!("containerd://{}", l.id)),
        restart_count,
        ready,
        started: Some(started),
        state: Some(state),
        last_state: Some(last_state.unwrap_or_default()),
        allocated_resources: allocated.requests.clone().filter(|r| !r.is_empty()),
        resources,
        ..Default::default()
    }
}

/// upstream's `convertContainerStatusResources`: limits only where the container has
/// limits, requests only where it has requests; cpu and memory as the container runs with
/// them (a request of memory is not carried out anywhere: the allocated one), the rest as
/// allocated.
pub(super) fn status_resources(
    allocated: &k8s_openapi::api::core::v1::ResourceRequirements,
    actuated: &k8s_openapi::api::core::v1::ResourceRequirements,
) -> k8s_openapi::api::core::v1::ResourceRequirements {
    type List =
        std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>;
    let pick = |alloc: Option<&List>, run: Option<&List>, from_runtime: &[&str]| {
        alloc.map(|a| {
            a.iter()
                .filter(|(k, _)| matches!(k.as_str(), "cpu" | "memory" | "ephemeral-storage"))
                .map(|(k, v)| {
                    let v = if from_runtime.contains(&k.as_str()) {
                        run.and_then(|r| r.get(k)).unwrap_or(v)
                    } else {
                        v
                    };
                    (k.clone(), v.clone())
                })
                .collect::<List>()
        })
    };
    k8s_openapi::api::core::v1::ResourceRequirements {
        limits: pick(
            allocated.limits.as_ref(),
            actuated.limits.as_ref(),
            &["cpu", "memory"],
        ),
        requests: pick(
            allocated.requests.as_ref(),
            actuated.requests.as_ref(),
            &["cpu"],
        ),
        ..Default::default()
    }
}

/// Upstream `HasAnyRegularContainerCreated`: the runtime has a regular container that was
/// created, runs or exited.
pub(super) fn any_regular_created(inputs: &StatusInputs<'_>) -> bool {
    let spec = inputs.pod.spec.as_ref();
    spec.is_some_and(|spec| {
        spec.containers.iter().any(|c| {
            instances(inputs.runtime, &c.name).first().is_some_and(|l| {
                matches!(
                    cri::ContainerState::try_from(l.state),
                    Ok(cri::ContainerState::ContainerCreated
                        | cri::ContainerState::ContainerRunning
                        | cri::ContainerState::ContainerExited)
                )
            })
        })
    })
}
