//! Pod status as upstream computes it (`kubelet_pods.go` `generateAPIPodStatus`), from
//! the pod spec, the runtime's view (pleg), probe results and the errors of our own
//! last actions.

use crate::cgroups::qos_class;
use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, HostIP, Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use nodeagent_proto::api::{RuntimeContainer, RuntimePodStatus};
use nodeagent_proto::cri;
use std::collections::HashMap;

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
    pub host_ip: &'a str,
    /// Why the whole pod failed (activeDeadlineSeconds), if it did.
    pub pod_failed: Option<&'a Waiting>,
    /// container id -> termination message (from its file, or its log's tail).
    pub termination_messages: &'a HashMap<String, String>,
    /// The pod is being terminated and none of its containers runs any more: its phase is
    /// terminal (upstream `getPhase` with `podIsTerminal`; static pods keep theirs).
    pub terminated: bool,
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
        _ => ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some("ContainerCreating".into()),
                message: None,
            }),
            ..Default::default()
        },
    }
}

fn container_status(
    c: &Container,
    inputs: &StatusInputs<'_>,
    default_waiting: &str,
) -> ContainerStatus {
    let all = instances(inputs.runtime, &c.name);
    let latest = all.first().copied();
    let previous = all.get(1).copied();
    let waiting = inputs.waiting.get(&c.name);
    let msgs = inputs.termination_messages;
    let mut state = latest
        .map(|l| state_of(l, msgs))
        .unwrap_or_else(|| ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(default_waiting.into()),
                message: None,
            }),
            ..Default::default()
        });
    let mut last_state = previous
        .map(|p| state_of(p, msgs))
        .filter(|s| s.terminated.is_some());
    // What the last sync recorded (an image pull error, a failed volume setup) concerns a
    // container that is not running: a running one shows what the runtime says, so a sync
    // that failed for a moment (a peer restarting) changes nothing a user sees of it.
    if let Some(w) = waiting.filter(|_| state.running.is_none()) {
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
    ContainerStatus {
        name: c.name.clone(),
        image: c.image.clone().unwrap_or_default(),
        image_id: latest.map(|l| l.image_ref.clone()).unwrap_or_default(),
        container_id: latest.map(|l| format!("containerd://{}", l.id)),
        restart_count: latest.map(|l| l.attempt as i32).unwrap_or(0),
        ready,
        started: Some(started),
        state: Some(state),
        last_state: Some(last_state.unwrap_or_default()),
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

/// Why each of the pod's readiness gates is not satisfied, in upstream's words (empty
/// when all are): a gate needs a condition of its type with status True.
fn readiness_gates_not_ready(
    spec: &k8s_openapi::api::core::v1::PodSpec,
    conditions: &[PodCondition],
) -> Vec<String> {
    spec.readiness_gates
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
        .collect()
}

/// Upstream `HasAnyRegularContainerStarted`: running or terminated.
fn has_started(s: &ContainerStatus) -> bool {
    s.state
        .as_ref()
        .is_some_and(|st| st.running.is_some() || st.terminated.is_some())
}

fn is_terminated(s: &ContainerStatus) -> Option<i32> {
    s.state.as_ref()?.terminated.as_ref().map(|t| t.exit_code)
}

/// Computes the pod's status. `previous` (what was published last or, after a restart,
/// the API server's copy) keeps condition transition times, the start time and a finished
/// pod's IP stable.
pub fn compute(inputs: &StatusInputs<'_>, previous: Option<&PodStatus>) -> PodStatus {
    let pod = inputs.pod;
    let previous = previous.or(pod.status.as_ref());
    let spec = pod.spec.clone().unwrap_or_default();
    let rt = inputs.runtime;
    let sandbox = rt.and_then(|r| {
        r.sandboxes
            .iter()
            .filter(|s| s.state == cri::PodSandboxState::SandboxReady as i32)
            .max_by_key(|s| s.created_at_unix_nanos)
    });
    let init: Vec<ContainerStatus> = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| {
            let mut s = container_status(c, inputs, "PodInitializing");
            if !crate::init_plan::is_sidecar(c) {
                // Upstream: a regular init container is ready once it succeeded.
                s.ready = is_terminated(&s) == Some(0);
            }
            s
        })
        .collect();
    let initialized = init
        .iter()
        .all(|s| is_terminated(s) == Some(0) || restartable_running(&spec, s));
    let app_default = if initialized {
        "ContainerCreating"
    } else {
        "PodInitializing"
    };
    let app: Vec<ContainerStatus> = spec
        .containers
        .iter()
        .map(|c| container_status(c, inputs, app_default))
        .collect();

    let restart_policy = spec.restart_policy.as_deref().unwrap_or("Always");
    let mut phase = pod_phase(
        &app,
        initialized,
        restart_policy,
        init.iter()
            .any(|s| is_terminated(s).is_some_and(|c| c != 0)),
    );
    if inputs.terminated && !crate::api_status::is_static(pod) {
        // Succeeded only if every regular container succeeded, as upstream.
        let all_succeeded = app.iter().all(|s| is_terminated(s) == Some(0));
        phase = if all_succeeded { "Succeeded" } else { "Failed" };
    }
    // Upstream GenerateContainersReadyCondition: sidecars count, regular init containers
    // do not; a finished pod's containers are not ready, with the phase as the reason.
    let sidecars = init.iter().filter(|s| {
        spec.init_containers
            .iter()
            .flatten()
            .any(|c| c.name == s.name && crate::init_plan::is_sidecar(c))
    });
    let unready: Vec<&str> = sidecars
        .chain(app.iter())
        .filter(|s| !s.ready)
        .map(|s| s.name.as_str())
        .collect();
    let containers_ready = !app.is_empty() && unready.is_empty();
    let terminal_phase = match inputs.pod_failed.map(|_| "Failed").unwrap_or(phase) {
        "Succeeded" => Some("PodCompleted"),
        "Failed" => Some("PodFailed"),
        _ => None,
    };
    let mut containers_ready_condition = condition(
        "ContainersReady",
        containers_ready && terminal_phase.is_none(),
        Some(terminal_phase.unwrap_or("ContainersNotReady")),
    );
    if terminal_phase.is_none() && !unready.is_empty() {
        containers_ready_condition.message = Some(format!(
            "containers with unready status: [{}]",
            unready.join(" ")
        ));
    }
    // Conditions others set on the pod (readiness gates, DisruptionTarget from an API
    // eviction), as the API server has them.
    let api_conditions: &[PodCondition] = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    let mut ready = condition(
        "Ready",
        containers_ready && phase == "Running" && terminal_phase.is_none(),
        containers_ready_condition.reason.as_deref(),
    );
    ready.message = containers_ready_condition.message.clone();
    let gates = readiness_gates_not_ready(&spec, api_conditions);
    if ready.status == "True" && !gates.is_empty() {
        ready.status = "False".into();
        ready.reason = Some("ReadinessGatesNotReady".into());
        ready.message = Some(gates.join(", "));
    }
    let mut conditions = vec![
        condition("PodReadyToStartContainers", sandbox.is_some(), None),
        // Upstream: once any regular container has started, the pod stays initialized,
        // even while a sidecar restarts.
        condition(
            "Initialized",
            initialized || app.iter().any(has_started),
            Some("ContainersNotInitialized"),
        ),
        ready,
        containers_ready_condition,
        condition("PodScheduled", true, None),
    ];
    if let Some(prev) = previous.and_then(|p| p.conditions.as_ref()) {
        for c in &mut conditions {
            if let Some(old) = prev
                .iter()
                .find(|o| o.type_ == c.type_ && o.status == c.status)
            {
                c.last_transition_time = old.last_transition_time.clone();
            }
        }
    }
    // A finished pod's sandbox is stopped; it keeps the IP it had, as upstream.
    let pod_ip = sandbox
        .map(|s| s.ip.clone())
        .filter(|ip| !ip.is_empty())
        .or_else(|| previous.and_then(|p| p.pod_ip.clone()));
    let mut pod_ips: Vec<PodIP> = pod_ip.iter().map(|ip| PodIP { ip: ip.clone() }).collect();
    pod_ips.extend(
        sandbox
            .into_iter()
            .flat_map(|s| s.additional_ips.iter().map(|ip| PodIP { ip: ip.clone() })),
    );
    let (pod_ip, pod_ips) = if spec.host_network.unwrap_or(false) {
        (
            Some(inputs.host_ip.to_string()),
            vec![PodIP {
                ip: inputs.host_ip.to_string(),
            }],
        )
    } else {
        (pod_ip, pod_ips)
    };
    let start_time = previous.and_then(|p| p.start_time.clone()).or_else(|| {
        rt.and_then(|r| r.sandboxes.iter().map(|s| s.created_at_unix_nanos).min())
            .and_then(time)
    });
    // An evicted pod, or one stopped for a node shutdown, says so in a DisruptionTarget
    // condition (upstream, since 1.26).
    if let Some(f) = inputs.pod_failed.filter(|f| {
        f.reason == crate::evict::EVICTED
            || (f.reason == crate::shutdown::REASON && f.message == crate::shutdown::MESSAGE)
    }) {
        let mut c = condition("DisruptionTarget", true, None);
        c.reason = Some("TerminationByKubelet".into());
        c.message = Some(f.message.clone());
        if let Some(old) = previous
            .and_then(|p| p.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|o| o.type_ == c.type_))
        {
            c.last_transition_time = old.last_transition_time.clone();
        }
        conditions.push(c);
    }
    // Upstream's mergePodStatus: conditions the kubelet does not own stay as they are.
    for c in api_conditions {
        if !conditions.iter().any(|o| o.type_ == c.type_) {
            conditions.push(c.clone());
        }
    }
    let (phase, reason, message) = match inputs.pod_failed {
        Some(f) => ("Failed", Some(f.reason.clone()), Some(f.message.clone())),
        None => (phase, None, None),
    };
    PodStatus {
        phase: Some(phase.into()),
        reason,
        message,
        conditions: Some(conditions),
        host_ip: Some(inputs.host_ip.to_string()),
        host_ips: Some(vec![HostIP {
            ip: inputs.host_ip.to_string(),
        }]),
        pod_ip,
        pod_ips: Some(pod_ips),
        start_time: start_time.or_else(|| Some(now())),
        qos_class: Some(qos_class(pod).as_str().into()),
        init_container_statuses: (!init.is_empty()).then_some(init),
        container_statuses: Some(app),
        ..Default::default()
    }
}

fn restartable_running(spec: &k8s_openapi::api::core::v1::PodSpec, s: &ContainerStatus) -> bool {
    let sidecar = spec
        .init_containers
        .iter()
        .flatten()
        .any(|c| c.name == s.name && c.restart_policy.as_deref() == Some("Always"));
    sidecar && s.started == Some(true)
}

/// Upstream `getPhase`.
fn pod_phase(
    app: &[ContainerStatus],
    initialized: bool,
    restart_policy: &str,
    init_failed: bool,
) -> &'static str {
    if !initialized {
        return if init_failed && restart_policy == "Never" {
            "Failed"
        } else {
            "Pending"
        };
    }
    let (mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0);
    for s in app {
        let st = s.state.clone().unwrap_or_default();
        if st.running.is_some() {
            running += 1;
        } else if let Some(t) = st.terminated {
            stopped += 1;
            if t.exit_code == 0 {
                succeeded += 1;
            }
        } else if st.waiting.is_some() {
            let has_last = s
                .last_state
                .as_ref()
                .is_some_and(|l| l.terminated.is_some());
            if has_last { stopped += 1 } else { waiting += 1 }
        }
    }
    if waiting > 0 {
        return "Pending";
    }
    if running > 0 {
        return "Running";
    }
    if stopped == app.len() && !app.is_empty() {
        return match restart_policy {
            "Always" => "Running",
            "OnFailure" if succeeded == stopped => "Succeeded",
            "OnFailure" => "Running",
            _ if succeeded == stopped => "Succeeded",
            _ => "Failed",
        };
    }
    "Pending"
}

#[cfg(test)]
mod tests;
