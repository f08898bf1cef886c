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
#[cfg(test)]
use k8s_openapi::api::core::v1::ContainerState;
use k8s_openapi::api::core::v1::{ContainerStatus, HostIP, Pod, PodCondition, PodIP, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
#[cfg(test)]
use nodeagent_proto::api::RuntimeContainer;
use nodeagent_proto::api::RuntimePodStatus;
use nodeagent_proto::cri;
use std::collections::HashMap;

mod conditions;
mod containers;
pub(crate) mod merge;
mod phase;
pub use containers::instances;
use containers::{STATUS_UNKNOWN, container_status};
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

fn condition(kind: &str, ok: bool, reason: Option<&str>) -> PodCondition {
    PodCondition {
        type_: kind.into(),
        status: if ok { "True".into() } else { "False".into() },
        reason: reason.filter(|_| !ok).map(String::from),
        last_transition_time: Some(now()),
        ..Default::default()
    }
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
