//! Pod status as upstream computes it (`kubelet_pods.go` `generateAPIPodStatus`), from
//! the pod spec, the runtime's view (pleg), probe results and the errors of our own
//! last actions.

pub(crate) mod api_status;
pub(crate) mod finished;
pub(crate) mod ips;
pub(crate) mod normalize;
pub(crate) mod probe_state;
pub(crate) mod reasons;
mod terminate;

use crate::container_manager::cgroups::qos_class;
use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, HostIP, Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use nodeagent_proto::api::{RuntimeContainer, RuntimePodStatus};
use nodeagent_proto::cri;
use std::collections::HashMap;

mod conditions;
pub(crate) mod merge;
mod phase;
use phase::pod_phase;
pub(crate) use phase::{is_terminal, may_start};

/// Why a container is waiting, as recorded by the last sync (e.g. ErrImagePull).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    pub reason: String,
    pub message: String,
}

pub struct StatusInputs<'a> {
    pub pod: &'a Pod,
    pub runtime: Option<&'a RuntimePodStatus>,
    /// container id -> ready, from readiness probes.
    pub readiness: &'a HashMap<String, bool>,
    /// Containers whose startup probe has succeeded.
    pub started: &'a std::collections::HashSet<String>,
    /// container name -> why it is waiting.
    pub waiting: &'a HashMap<String, Waiting>,
    /// The node's IPs: `hostIPs`, and a host-network pod's IPs.
    pub node_ips: &'a ips::NodeIps,
    /// Why the whole pod failed (activeDeadlineSeconds), if it did.
    pub pod_failed: Option<&'a Waiting>,
    /// container id -> termination message (from its file, or its log's tail).
    pub termination_messages: &'a HashMap<String, String>,
    /// The pod is being terminated and none of its containers runs any more: its phase is
    /// terminal (upstream `getPhase` with `podIsTerminal`; static pods keep theirs).
    pub terminated: bool,
    /// The pod's resize conditions (`PodResizePending`, `PodResizeInProgress`).
    pub resize: Option<&'a crate::allocation::ResizeConditions>,
    /// container id -> the resources it runs with where they are not its allocation (a
    /// resize not carried out yet).
    pub actuated: Option<
        &'a std::collections::BTreeMap<String, k8s_openapi::api::core::v1::ResourceRequirements>,
    >,
}

pub fn time(nanos: i64) -> Option<Time> {
    if nanos <= 0 {
        return None;
    }
    k8s_openapi::jiff::Timestamp::from_nanosecond(nanos as i128)
        .ok()
        .map(Time)
}

fn now() -> Time {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or_default();
    time(nanos).unwrap_or(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH))
}

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

fn state_of(c: &RuntimeContainer, messages: &HashMap<String, String>) -> ContainerState {
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

/// Upstream `kubetypes.PodConditionByKubelet`: the condition types the kubelet owns.
const KUBELET_OWNED: [&str; 7] = [
    "PodScheduled",
    "Ready",
    "Initialized",
    "ContainersReady",
    "PodReadyToStartContainers",
    "PodResizePending",
    "PodResizeInProgress",
];

/// Upstream `kubecontainer.ContainerReasonStatusUnknown`.
const STATUS_UNKNOWN: &str = "ContainerStatusUnknown";

/// Upstream `ShouldContainerBeRestarted` (with `ContainerShouldRestart` for a container's
/// own restartPolicy): whether the next sync starts this container again, so a recorded
/// start failure is what its status shows.
fn should_restart(pod: &Pod, c: &Container, latest: Option<&RuntimeContainer>) -> bool {
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

fn container_status(
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
fn status_resources(
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

fn condition(kind: &str, ok: bool, reason: Option<&str>) -> PodCondition {
    PodCondition {
        type_: kind.into(),
        status: if ok { "True".into() } else { "False".into() },
        reason: reason.filter(|_| !ok).map(String::from),
        last_transition_time: Some(now()),
        ..Default::default()
    }
}

/// Upstream `HasAnyRegularContainerCreated`: the runtime has a regular container that was
/// created, runs or exited.
fn any_regular_created(inputs: &StatusInputs<'_>) -> bool {
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

fn is_terminated(s: &ContainerStatus) -> Option<i32> {
    s.state.as_ref()?.terminated.as_ref().map(|t| t.exit_code)
}

/// The phase of a pod the node has terminated (upstream's status manager `TerminatePod`,
/// since 1.27): a phase that is not terminal becomes Failed, whatever it was (Pending,
/// Running, Unknown or anything else); Succeeded and Failed stay. Static pods are not
/// given a terminal phase at all (kubernetes #116484): the caller does not ask for them.
pub fn terminal_phase(phase: &str) -> &str {
    if phase::is_terminal(Some(phase)) {
        phase
    } else {
        "Failed"
    }
}

/// The kubelet's conditions' `lastTransitionTime`s (upstream's `updateLastTransitionTime`
/// in the status manager): a condition whose status is what it was keeps its time; a new
/// one, or one whose status flipped, gets `now` (unless it was computed with a time).
pub fn transition_times(
    conditions: &mut [PodCondition],
    previous: Option<&[PodCondition]>,
    now: Time,
) {
    for c in conditions.iter_mut() {
        c.last_transition_time.get_or_insert_with(|| now.clone());
        if let Some(old) = previous
            .into_iter()
            .flatten()
            .find(|o| o.type_ == c.type_ && o.status == c.status)
        {
            c.last_transition_time = old.last_transition_time.clone();
        }
    }
}

/// Computes the pod's status. `previous` (what was published last or, after a restart,
/// the API server's copy) keeps condition transition times, the start time and a finished
/// pod's IP stable.
pub fn compute(inputs: &StatusInputs<'_>, previous: Option<&PodStatus>) -> PodStatus {
    let pod = inputs.pod;
    let published_phase = previous.and_then(|p| p.phase.clone());
    let previous = previous.or(pod.status.as_ref());
    let spec = pod.spec.clone().unwrap_or_default();
    let rt = inputs.runtime;
    let sandbox = rt.and_then(|r| {
        r.sandboxes
            .iter()
            .filter(|s| s.state == cri::PodSandboxState::SandboxReady as i32)
            .max_by_key(|s| s.created_at_unix_nanos)
    });
    let old_statuses = |list: fn(&PodStatus) -> Option<&Vec<ContainerStatus>>| {
        previous
            .and_then(list)
            .into_iter()
            .flatten()
            .map(|s| (s.name.as_str(), s))
            .collect::<HashMap<&str, &ContainerStatus>>()
    };
    let old_init = old_statuses(|p| p.init_container_statuses.as_ref());
    let old_app = old_statuses(|p| p.container_statuses.as_ref());
    let old_ephemeral = old_statuses(|p| p.ephemeral_container_statuses.as_ref());
    let api_phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    let finished = phase::is_terminal(published_phase.as_deref()) || phase::is_terminal(api_phase);
    // Upstream: with init containers, every container waits in PodInitializing until it
    // is created, else in ContainerCreating.
    let has_init = spec.init_containers.as_ref().is_some_and(|i| !i.is_empty());
    let default_waiting = if has_init {
        "PodInitializing"
    } else {
        "ContainerCreating"
    };
    let mut init: Vec<ContainerStatus> = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| {
            let old = old_init.get(c.name.as_str()).copied();
            let mut s = container_status(c, inputs, default_waiting, old, true, finished);
            if !crate::worker::init_plan::is_sidecar(c) {
                // Upstream: a regular init container is ready once it succeeded.
                s.ready = is_terminated(&s) == Some(0);
            }
            s
        })
        .collect();
    let mut app: Vec<ContainerStatus> = spec
        .containers
        .iter()
        .map(|c| {
            let old = old_app.get(c.name.as_str()).copied();
            container_status(c, inputs, default_waiting, old, false, finished)
        })
        .collect();
    // Upstream sorts regular container statuses by name (`SortedContainerStatuses`); init
    // containers keep the spec's order.
    app.sort_by(|a, b| a.name.cmp(&b.name));
    // Ephemeral containers: converted as regular ones, sorted by name, and never ready
    // nor `started` (upstream's prober manager sets those for the other two lists only).
    // They count for neither the phase nor a condition.
    let mut ephemeral: Vec<ContainerStatus> = spec
        .ephemeral_containers
        .iter()
        .flatten()
        .map(|e| {
            let c = nodeagent_proto::k8s::ephemeral_as_container(e);
            let old = old_ephemeral.get(c.name.as_str()).copied();
            let mut s = container_status(&c, inputs, default_waiting, old, false, finished);
            s.ready = false;
            s.started = None;
            s
        })
        .collect();
    ephemeral.sort_by(|a, b| a.name.cmp(&b.name));

    // Upstream assigns static pods no terminal phase (kubernetes #116484).
    let pod_is_terminal = inputs.terminated && !api_status::is_static(pod);
    let pod_has_initialized = rt.is_some_and(|r| has_active_regular_container(&spec, r));
    let mut phase = pod_phase(&spec, &init, &app, pod_is_terminal, pod_has_initialized);
    if pod_is_terminal {
        phase = terminal_phase(phase);
    }
    // A finished pod stays finished (upstream's three-way merge): the runtime may have lost
    // its containers or sandbox since.
    let phase = phase::keep_terminal(phase, published_phase.as_deref(), api_phase);
    // Upstream's TerminatePod, once nothing of a terminated or finished pod runs (failed
    // as a whole, by its deadline or an eviction, too): no container of an initialized
    // pod is left waiting (the phase is decided already).
    let ended = inputs.terminated || inputs.pod_failed.is_some() || phase::is_terminal(Some(phase));
    if ended && !could_have_running_containers(rt) {
        terminate::terminate(&spec, &mut init, &mut app);
    }
    // Upstream's generate.go, from the statuses just computed (init containers' first):
    // ContainersReady (sidecars count, regular init containers do not; a finished pod's
    // containers are not ready, with the phase as the reason), Ready (that, then the
    // readiness gates) and Initialized (once a regular container has started the pod stays
    // initialized, even while a sidecar restarts).
    let all: Vec<ContainerStatus> = init.iter().chain(app.iter()).cloned().collect();
    let effective_phase = inputs.pod_failed.map(|_| "Failed").unwrap_or(phase);
    // Conditions others set on the pod (readiness gates, DisruptionTarget from an API
    // eviction), as the API server has them.
    let api_conditions: &[PodCondition] = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    let containers_ready_condition =
        conditions::containers_ready(&spec, Some(&all), effective_phase);
    let ready = conditions::pod_ready(&spec, api_conditions, Some(&all), effective_phase);
    let initialized_condition = conditions::initialized(&spec, Some(&all), effective_phase);
    let mut conditions = vec![
        condition("PodReadyToStartContainers", sandbox.is_some(), None),
        initialized_condition,
        ready,
        containers_ready_condition,
        condition("PodScheduled", true, None),
    ];
    transition_times(
        &mut conditions,
        previous.and_then(|p| p.conditions.as_deref()),
        now(),
    );
    if let Some(resize) = inputs.resize {
        let prev = previous
            .and_then(|p| p.conditions.as_deref())
            .unwrap_or_default();
        conditions.extend(resize.to_api(prev, &now()));
    }
    // The sandbox's IPs, sorted and one of each family as upstream's sortPodIPs; a
    // finished pod's sandbox is stopped and it keeps the IPs it had, as upstream.
    let mut runtime_ips: Vec<String> = sandbox
        .into_iter()
        .flat_map(|s| std::iter::once(&s.ip).chain(&s.additional_ips))
        .filter(|ip| !ip.is_empty())
        .cloned()
        .collect();
    if runtime_ips.is_empty()
        && let Some(p) = previous
    {
        // Its podIPs, or a podIP alone (a status written without podIPs).
        runtime_ips = p.pod_ips.iter().flatten().map(|ip| ip.ip.clone()).collect();
        if runtime_ips.is_empty() {
            runtime_ips.extend(p.pod_ip.clone());
        }
    }
    let node_ips = inputs.node_ips;
    let pod_ips = ips::pod_ips(
        node_ips.ipv6_primary,
        &node_ips.host_ips,
        &runtime_ips,
        spec.host_network.unwrap_or(false),
    );
    let pod_ip = pod_ips.first().cloned();
    let pod_ips: Vec<PodIP> = pod_ips.into_iter().map(|ip| PodIP { ip }).collect();
    let start_time = previous.and_then(|p| p.start_time.clone()).or_else(|| {
        rt.and_then(|r| r.sandboxes.iter().map(|s| s.created_at_unix_nanos).min())
            .and_then(time)
    });
    // An evicted or preempted pod, or one stopped for a node shutdown, says so in a
    // DisruptionTarget condition (upstream, since 1.26).
    let mut disruption = None;
    if let Some(f) = inputs.pod_failed.filter(|f| {
        f.reason == reasons::EVICTED
            || f.reason == reasons::PREEMPTED_REASON
            || (f.reason == reasons::SHUTDOWN_REASON && f.message == reasons::SHUTDOWN_MESSAGE)
    }) {
        let mut c = condition("DisruptionTarget", true, None);
        c.reason = Some("TerminationByKubelet".into());
        c.message = Some(if f.reason == reasons::PREEMPTED_REASON {
            reasons::PREEMPTED_DISRUPTION_MESSAGE.into()
        } else {
            f.message.clone()
        });
        if let Some(old) = previous
            .and_then(|p| p.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|o| o.type_ == c.type_))
        {
            c.last_transition_time = old.last_transition_time.clone();
        }
        disruption = Some(c);
    }
    // Upstream generateAPIPodStatus (and the status manager's mergePodStatus): first the
    // conditions the kubelet does not own, as they are, with DisruptionTarget replaced or
    // appended; then the kubelet's own.
    let mut merged: Vec<PodCondition> = api_conditions
        .iter()
        .filter(|c| !KUBELET_OWNED.contains(&c.type_.as_str()))
        .cloned()
        .collect();
    if let Some(d) = disruption {
        match merged.iter_mut().find(|c| c.type_ == d.type_) {
            Some(c) => *c = d,
            None => merged.push(d),
        }
    }
    merged.extend(conditions);
    let conditions = merged;
    let (phase, reason, message) = match inputs.pod_failed {
        Some(f) => ("Failed", Some(f.reason.clone()), Some(f.message.clone())),
        None => (phase, None, None),
    };
    normalize::truncate_messages([&mut init, &mut app, &mut ephemeral]);
    PodStatus {
        phase: Some(phase.into()),
        reason,
        message,
        conditions: Some(conditions),
        host_ip: Some(node_ips.host_ip().to_string()),
        host_ips: Some(
            node_ips
                .host_ips
                .iter()
                .map(|ip| HostIP { ip: ip.clone() })
                .collect(),
        ),
        pod_ip,
        pod_ips: Some(pod_ips),
        start_time: start_time.or_else(|| Some(now())),
        qos_class: Some(qos_class(pod).as_str().into()),
        init_container_statuses: (!init.is_empty()).then_some(init),
        container_statuses: Some(app),
        ephemeral_container_statuses: (!ephemeral.is_empty()).then_some(ephemeral),
        ..Default::default()
    }
}

/// Whether a container of the pod may still run (upstream's
/// `PodCouldHaveRunningContainers`): one the runtime shows running or in an unknown state.
pub fn could_have_running_containers(rt: Option<&RuntimePodStatus>) -> bool {
    rt.is_some_and(|r| {
        r.containers.iter().any(|c| {
            matches!(
                cri::ContainerState::try_from(c.state),
                Ok(cri::ContainerState::ContainerRunning | cri::ContainerState::ContainerUnknown)
            )
        })
    })
}

/// Upstream `HasAnyActiveRegularContainerStarted`: some regular container exists in the
/// pod's current sandbox (the newest, while it is ready), so the pod has initialized there.
fn has_active_regular_container(
    spec: &k8s_openapi::api::core::v1::PodSpec,
    rt: &RuntimePodStatus,
) -> bool {
    let newest = rt.sandboxes.iter().max_by_key(|s| s.created_at_unix_nanos);
    newest
        .filter(|s| s.state == cri::PodSandboxState::SandboxReady as i32)
        .is_some_and(|s| {
            rt.containers
                .iter()
                .any(|c| c.sandbox_id == s.id && spec.containers.iter().any(|a| a.name == c.name))
        })
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod upstream_tests;
