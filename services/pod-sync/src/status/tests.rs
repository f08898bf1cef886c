use super::*;
use nodeagent_proto::api::RuntimeSandbox;

fn pod(policy: &str, probe: bool) -> Pod {
    let mut c = serde_json::json!({"name": "c", "image": "busybox:1.36"});
    if probe {
        c["readinessProbe"] = serde_json::json!({"exec": {"command": ["true"]}});
    }
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "uid": "u1"},
        "spec": {"restartPolicy": policy, "containers": [c]}
    }))
    .unwrap()
}

fn runtime(state: cri::ContainerState, exit: i32) -> RuntimePodStatus {
    RuntimePodStatus {
        uid: "u1".into(),
        sandboxes: vec![RuntimeSandbox {
            id: "s1".into(),
            state: 0,
            ip: "10.88.0.5".into(),
            created_at_unix_nanos: 1_000_000_000,
            ..Default::default()
        }],
        containers: vec![RuntimeContainer {
            id: "c1".into(),
            name: "c".into(),
            state: state as i32,
            exit_code: exit,
            started_at_unix_nanos: 2_000_000_000,
            finished_at_unix_nanos: if state == cri::ContainerState::ContainerExited {
                3_000_000_000
            } else {
                0
            },
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn compute_for(
    pod: &Pod,
    rt: Option<&RuntimePodStatus>,
    readiness: &HashMap<String, bool>,
) -> PodStatus {
    compute_waiting(pod, rt, readiness, &HashMap::new())
}

/// The status with waiting reasons recorded by a sync.
fn compute_waiting(
    pod: &Pod,
    rt: Option<&RuntimePodStatus>,
    readiness: &HashMap<String, bool>,
    waiting: &HashMap<String, Waiting>,
) -> PodStatus {
    compute(
        &StatusInputs {
            pod,
            runtime: rt,
            readiness,
            started: &Default::default(),
            waiting,
            node_ips: &crate::status::ips::NodeIps::single("192.0.2.1"),
            pod_failed: None,
            termination_messages: &HashMap::new(),
            terminated: false,
            resize: None,
            actuated: None,
        },
        None,
    )
}

fn waiting(reason: &str, message: &str) -> HashMap<String, Waiting> {
    HashMap::from([(
        "c".to_string(),
        Waiting {
            reason: reason.into(),
            message: message.into(),
        },
    )])
}

fn cond(s: &PodStatus, t: &str) -> String {
    s.conditions
        .as_ref()
        .unwrap()
        .iter()
        .find(|c| c.type_ == t)
        .unwrap()
        .status
        .clone()
}

#[test]
fn running_container_makes_a_ready_running_pod() {
    let p = pod("Always", false);
    let rt = runtime(cri::ContainerState::ContainerRunning, 0);
    let s = compute_for(&p, Some(&rt), &HashMap::new());
    assert_eq!(s.phase.as_deref(), Some("Running"));
    assert_eq!(s.pod_ip.as_deref(), Some("10.88.0.5"));
    assert_eq!(cond(&s, "Ready"), "True");
    assert_eq!(cond(&s, "PodReadyToStartContainers"), "True");
    let cs = &s.container_statuses.unwrap()[0];
    assert_eq!(cs.container_id.as_deref(), Some("containerd://c1"));
    assert!(cs.ready);
    assert_eq!(s.qos_class.as_deref(), Some("BestEffort"));
}

#[test]
fn readiness_probe_gates_ready() {
    let p = pod("Always", true);
    let rt = runtime(cri::ContainerState::ContainerRunning, 0);
    let s = compute_for(&p, Some(&rt), &HashMap::new());
    assert_eq!(cond(&s, "Ready"), "False");
    let s = compute_for(&p, Some(&rt), &HashMap::from([("c1".to_string(), true)]));
    assert_eq!(cond(&s, "Ready"), "True");
}

#[test]
fn readiness_gates_hold_ready_back_and_foreign_conditions_stay() {
    let mut p = pod("Always", false);
    p.spec.as_mut().unwrap().readiness_gates =
        Some(vec![k8s_openapi::api::core::v1::PodReadinessGate {
            condition_type: "example.com/lb".into(),
        }]);
    let rt = runtime(cri::ContainerState::ContainerRunning, 0);
    let ready = |s: &PodStatus| {
        s.conditions
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.type_ == "Ready")
            .cloned()
            .unwrap()
    };
    let s = compute_for(&p, Some(&rt), &HashMap::new());
    let r = ready(&s);
    assert_eq!(
        (r.status.as_str(), r.reason.as_deref(), r.message.as_deref()),
        (
            "False",
            Some("ReadinessGatesNotReady"),
            Some(
                "corresponding condition of pod readiness gate \"example.com/lb\" does not exist."
            )
        )
    );
    assert_eq!(cond(&s, "ContainersReady"), "True");
    // The API server's copy has the gate False, and a condition of someone else's.
    let gate = |status: &str| PodCondition {
        type_: "example.com/lb".into(),
        status: status.into(),
        ..Default::default()
    };
    let other = PodCondition {
        type_: "example.com/other".into(),
        status: "True".into(),
        ..Default::default()
    };
    p.status = Some(PodStatus {
        conditions: Some(vec![gate("False"), other.clone()]),
        ..Default::default()
    });
    let s = compute_for(&p, Some(&rt), &HashMap::new());
    assert_eq!(
        ready(&s).message.as_deref(),
        Some("the status of pod readiness gate \"example.com/lb\" is not \"True\", but False")
    );
    assert_eq!(cond(&s, "example.com/other"), "True", "kept as it is");
    assert_eq!(cond(&s, "example.com/lb"), "False");
    p.status = Some(PodStatus {
        conditions: Some(vec![gate("True"), other]),
        ..Default::default()
    });
    let s = compute_for(&p, Some(&rt), &HashMap::new());
    assert_eq!(cond(&s, "Ready"), "True");
    // Containers not ready: the containers' reason, as upstream.
    let s = compute_for(&pod("Always", true), Some(&rt), &HashMap::new());
    assert_eq!(ready(&s).reason.as_deref(), Some("ContainersNotReady"));
}

#[test]
fn phases_follow_restart_policy() {
    let exited0 = runtime(cri::ContainerState::ContainerExited, 0);
    let exited1 = runtime(cri::ContainerState::ContainerExited, 1);
    let phase = |policy: &str, rt: &RuntimePodStatus| {
        compute_for(&pod(policy, false), Some(rt), &HashMap::new())
            .phase
            .unwrap()
    };
    assert_eq!(phase("Never", &exited0), "Succeeded");
    assert_eq!(phase("Never", &exited1), "Failed");
    assert_eq!(phase("OnFailure", &exited0), "Succeeded");
    assert_eq!(phase("OnFailure", &exited1), "Running");
    assert_eq!(phase("Always", &exited0), "Running");
}

#[test]
fn nothing_yet_is_pending_and_creating() {
    let s = compute_for(&pod("Always", false), None, &HashMap::new());
    assert_eq!(s.phase.as_deref(), Some("Pending"));
    let w = s.container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap()
        .waiting
        .unwrap();
    assert_eq!(w.reason.as_deref(), Some("ContainerCreating"));
}

#[test]
fn a_recorded_error_is_the_waiting_reason() {
    let p = pod("Always", false);
    let s = compute_waiting(
        &p,
        None,
        &HashMap::new(),
        &waiting("ErrImageNeverPull", "m"),
    );
    let w = s.container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap()
        .waiting
        .unwrap();
    assert_eq!(w.reason.as_deref(), Some("ErrImageNeverPull"));
}

#[test]
fn a_failed_pod_and_termination_messages_show() {
    let p = pod("Never", false);
    let rt = runtime(cri::ContainerState::ContainerExited, 3);
    let failed = Waiting {
        reason: "DeadlineExceeded".into(),
        message: "too long".into(),
    };
    let messages = HashMap::from([("c1".to_string(), "bye".to_string())]);
    let s = compute(
        &StatusInputs {
            pod: &p,
            runtime: Some(&rt),
            readiness: &HashMap::new(),
            started: &Default::default(),
            waiting: &HashMap::new(),
            node_ips: &crate::status::ips::NodeIps::single(""),
            pod_failed: Some(&failed),
            termination_messages: &messages,
            terminated: false,
            resize: None,
            actuated: None,
        },
        None,
    );
    assert_eq!(s.phase.as_deref(), Some("Failed"));
    assert_eq!(s.reason.as_deref(), Some("DeadlineExceeded"));
    let t = s.container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap()
        .terminated
        .unwrap();
    assert_eq!((t.exit_code, t.message.as_deref()), (3, Some("bye")));
}

#[test]
fn a_failed_sync_does_not_override_a_running_container() {
    let p = pod("Always", false);
    let rt = runtime(cri::ContainerState::ContainerRunning, 0);
    let recorded = waiting(
        "CreateContainerConfigError",
        "volumes: the volume service is restarting",
    );
    let s = compute_waiting(&p, Some(&rt), &HashMap::new(), &recorded);
    assert_eq!(s.phase.as_deref(), Some("Running"));
    assert_eq!(cond(&s, "Ready"), "True");
    let c = &s.container_statuses.as_ref().unwrap()[0];
    assert!(c.state.as_ref().unwrap().running.is_some(), "{c:?}");
}

#[test]
fn after_a_restart_the_api_servers_copy_keeps_times_start_and_a_finished_pods_ip() {
    let mut p = pod("Never", false);
    let t0 = Time("2026-01-01T00:00:00Z".parse().unwrap());
    p.status = Some(PodStatus {
        start_time: Some(t0.clone()),
        pod_ip: Some("10.88.0.9".into()),
        conditions: Some(vec![PodCondition {
            type_: "PodScheduled".into(),
            status: "True".into(),
            last_transition_time: Some(t0.clone()),
            ..Default::default()
        }]),
        ..Default::default()
    });
    // The pod finished and its sandbox is stopped: no IP from the runtime.
    let mut rt = runtime(cri::ContainerState::ContainerExited, 0);
    rt.sandboxes[0].state = cri::PodSandboxState::SandboxNotready as i32;
    let s = compute_for(&p, Some(&rt), &HashMap::new());
    assert_eq!(s.phase.as_deref(), Some("Succeeded"));
    assert_eq!(s.pod_ip.as_deref(), Some("10.88.0.9"));
    assert_eq!(s.start_time, Some(t0.clone()));
    let scheduled = s
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "PodScheduled")
        .unwrap();
    assert_eq!(scheduled.last_transition_time, Some(t0));
}

#[test]
fn initialized_stays_true_once_a_regular_container_started() {
    let p: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "uid": "u1"},
        "spec": {
            "initContainers": [{"name": "side", "image": "i", "restartPolicy": "Always",
                "startupProbe": {"exec": {"command": ["true"]}}}],
            "containers": [{"name": "c", "image": "i"}]
        }
    }))
    .unwrap();
    let mut rt = runtime(cri::ContainerState::ContainerRunning, 0);
    // The sidecar restarts: exited, not started.
    rt.containers.push(RuntimeContainer {
        id: "s1".into(),
        name: "side".into(),
        state: cri::ContainerState::ContainerExited as i32,
        exit_code: 1,
        ..Default::default()
    });
    let s = compute_for(&p, Some(&rt), &HashMap::new());
    assert_eq!(cond(&s, "Initialized"), "True", "{:?}", s.conditions);
    // Before any regular container started, the sidecar holds initialization back.
    rt.containers.retain(|c| c.name == "side");
    let s = compute_for(&p, Some(&rt), &HashMap::new());
    assert_eq!(cond(&s, "Initialized"), "False");
}

#[test]
fn a_sidecars_readiness_counts_for_the_pod_and_a_finished_init_container_is_ready() {
    let p: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "uid": "u1"},
        "spec": {
            "initContainers": [
                {"name": "setup", "image": "i"},
                {"name": "side", "image": "i", "restartPolicy": "Always",
                 "readinessProbe": {"exec": {"command": ["true"]}}}
            ],
            "containers": [{"name": "c", "image": "i"}]
        }
    }))
    .unwrap();
    let mut rt = runtime(cri::ContainerState::ContainerRunning, 0);
    rt.containers.push(RuntimeContainer {
        id: "i1".into(),
        name: "setup".into(),
        state: cri::ContainerState::ContainerExited as i32,
        ..Default::default()
    });
    rt.containers.push(RuntimeContainer {
        id: "s1".into(),
        name: "side".into(),
        state: cri::ContainerState::ContainerRunning as i32,
        ..Default::default()
    });
    // Upstream GenerateContainersReadyCondition: the unready sidecar holds Ready back.
    let s = compute_for(&p, Some(&rt), &HashMap::from([("s1".to_string(), false)]));
    let init = s.init_container_statuses.as_ref().unwrap();
    assert!(init[0].ready, "a succeeded init container is ready");
    assert!(!init[1].ready);
    assert_eq!(cond(&s, "ContainersReady"), "False");
    assert_eq!(cond(&s, "Ready"), "False");
    let ready = s
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(ready.reason.as_deref(), Some("ContainersNotReady"));
    assert_eq!(
        ready.message.as_deref(),
        Some("containers with unready status: [side]")
    );
    let s = compute_for(&p, Some(&rt), &HashMap::from([("s1".to_string(), true)]));
    assert_eq!(cond(&s, "Ready"), "True", "{:?}", s.conditions);
}

#[test]
fn a_finished_pods_readiness_says_completed_or_failed() {
    let done = runtime(cri::ContainerState::ContainerExited, 0);
    let s = compute_for(&pod("Never", false), Some(&done), &HashMap::new());
    assert_eq!(s.phase.as_deref(), Some("Succeeded"));
    let ready = s
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "ContainersReady")
        .unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_deref()),
        ("False", Some("PodCompleted"))
    );
    let failed = runtime(cri::ContainerState::ContainerExited, 3);
    let s = compute_for(&pod("Never", false), Some(&failed), &HashMap::new());
    let ready = s
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_deref()),
        ("False", Some("PodFailed"))
    );
}

#[test]
fn a_terminated_pod_from_the_api_ends_succeeded_or_failed_a_static_one_keeps_its_phase() {
    let mut p = pod("Always", false);
    let annotate = |p: &mut Pod, source: &str| {
        p.metadata.annotations = Some(std::collections::BTreeMap::from([(
            nodeagent_proto::k8s::labels::CONFIG_SOURCE.to_string(),
            source.to_string(),
        )]));
    };
    annotate(&mut p, "api");
    let terminated = |p: &Pod, exit: i32| {
        let rt = runtime(cri::ContainerState::ContainerExited, exit);
        compute(
            &StatusInputs {
                pod: p,
                runtime: Some(&rt),
                readiness: &HashMap::new(),
                started: &Default::default(),
                waiting: &HashMap::new(),
                node_ips: &crate::status::ips::NodeIps::single(""),
                pod_failed: None,
                termination_messages: &HashMap::new(),
                terminated: true,
                resize: None,
                actuated: None,
            },
            None,
        )
    };
    // restartPolicy Always would say Running for a stopped container; a terminated pod's
    // phase is terminal (upstream getPhase with podIsTerminal).
    assert_eq!(terminated(&p, 0).phase.as_deref(), Some("Succeeded"));
    assert_eq!(terminated(&p, 143).phase.as_deref(), Some("Failed"));
    annotate(&mut p, "file");
    assert_eq!(terminated(&p, 143).phase.as_deref(), Some("Running"));
}

#[test]
fn a_sidecar_that_stopped_after_initialization_leaves_the_phase_alone() {
    // upstream: getPhase skips restartable init containers that ran once the pod has
    // initialized (HasAnyActiveRegularContainerStarted), whatever the restart policy.
    let side = |policy: &str| -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": "u1"},
            "spec": {
                "restartPolicy": policy,
                "initContainers": [{"name": "side", "image": "i", "restartPolicy": "Always"}],
                "containers": [{"name": "c", "image": "i"}]
            }
        }))
        .unwrap()
    };
    let mut rt = runtime(cri::ContainerState::ContainerRunning, 0);
    rt.containers[0].sandbox_id = "s1".into();
    rt.containers.push(RuntimeContainer {
        id: "x1".into(),
        name: "side".into(),
        state: cri::ContainerState::ContainerExited as i32,
        exit_code: 137,
        sandbox_id: "s1".into(),
        ..Default::default()
    });
    for policy in ["Always", "OnFailure", "Never"] {
        let s = compute_for(&side(policy), Some(&rt), &HashMap::new());
        assert_eq!(s.phase.as_deref(), Some("Running"), "{policy}");
    }
    // A sidecar waiting for its back-off (a recorded CrashLoopBackOff) is the same.
    let backoff = HashMap::from([(
        "side".to_string(),
        Waiting {
            reason: "CrashLoopBackOff".into(),
            message: String::new(),
        },
    )]);
    let s = compute_waiting(&side("Never"), Some(&rt), &HashMap::new(), &backoff);
    assert_eq!(s.phase.as_deref(), Some("Running"));
    // In a new sandbox no regular container exists yet: the pod initializes again...
    rt.containers[0].state = cri::ContainerState::ContainerExited as i32;
    rt.sandboxes.push(RuntimeSandbox {
        id: "s2".into(),
        created_at_unix_nanos: 5_000_000_000,
        ..Default::default()
    });
    rt.sandboxes[0].state = cri::PodSandboxState::SandboxNotready as i32;
    rt.containers.push(RuntimeContainer {
        id: "x2".into(),
        name: "side".into(),
        state: cri::ContainerState::ContainerRunning as i32,
        attempt: 1,
        sandbox_id: "s2".into(),
        ..Default::default()
    });
    let s = compute_for(&side("Always"), Some(&rt), &HashMap::new());
    assert_eq!(
        s.phase.as_deref(),
        Some("Running"),
        "a started sidecar, c to restart"
    );
    // ... and a sidecar whose startup probe has not passed holds it in Pending again.
    let mut probed = side("Always");
    probed
        .spec
        .as_mut()
        .unwrap()
        .init_containers
        .as_mut()
        .unwrap()[0]
        .startup_probe =
        serde_json::from_value(serde_json::json!({"exec": {"command": ["true"]}})).unwrap();
    let s = compute_for(&probed, Some(&rt), &HashMap::new());
    assert_eq!(s.phase.as_deref(), Some("Pending"));
}

#[test]
fn a_finished_pod_stays_finished_when_its_containers_and_sandbox_are_removed() {
    // restartPolicy Never, exited 0: Succeeded. Then the container GC (or anyone) removes
    // the dead container and the sandbox: the pod is still Succeeded, with its container's
    // last status (upstream's three-way merge in generateAPIPodStatus).
    let p = pod("Never", false);
    let rt = runtime(cri::ContainerState::ContainerExited, 0);
    let done = compute_for(&p, Some(&rt), &HashMap::new());
    assert_eq!(done.phase.as_deref(), Some("Succeeded"));
    let empty = RuntimePodStatus {
        uid: "u1".into(),
        ..Default::default()
    };
    let inputs = |rt: Option<&RuntimePodStatus>| -> PodStatus {
        compute(
            &StatusInputs {
                pod: &p,
                runtime: rt,
                readiness: &HashMap::new(),
                started: &Default::default(),
                waiting: &HashMap::new(),
                node_ips: &crate::status::ips::NodeIps::single("192.0.2.1"),
                pod_failed: None,
                termination_messages: &HashMap::new(),
                terminated: false,
                resize: None,
                actuated: None,
            },
            Some(&done),
        )
    };
    let after = inputs(Some(&empty));
    assert_eq!(after.phase.as_deref(), Some("Succeeded"));
    let cs = &after.container_statuses.unwrap()[0];
    let t = cs.state.as_ref().unwrap().terminated.as_ref().unwrap();
    assert_eq!(t.exit_code, 0);
    // No runtime view at all (pleg has nothing for the pod): still Succeeded.
    assert_eq!(inputs(None).phase.as_deref(), Some("Succeeded"));
    // Under restartPolicy Always getPhase alone would say Pending or Running for a pod
    // whose containers are gone; a terminal phase published before is kept, as is the
    // API server's (a restarted pod-sync has published nothing yet).
    let mut always = pod("Always", false);
    let with = |pod: &Pod, previous: Option<&PodStatus>| -> Option<String> {
        compute(
            &StatusInputs {
                pod,
                runtime: Some(&empty),
                readiness: &HashMap::new(),
                started: &Default::default(),
                waiting: &HashMap::new(),
                node_ips: &crate::status::ips::NodeIps::single("192.0.2.1"),
                pod_failed: None,
                termination_messages: &HashMap::new(),
                terminated: false,
                resize: None,
                actuated: None,
            },
            previous,
        )
        .phase
    };
    let failed = PodStatus {
        phase: Some("Failed".into()),
        ..Default::default()
    };
    assert_eq!(with(&always, Some(&failed)).as_deref(), Some("Failed"));
    assert_eq!(with(&always, None).as_deref(), Some("Pending"));
    always.status = Some(failed.clone());
    assert_eq!(with(&always, None).as_deref(), Some("Failed"));
}

/// upstream's `convertContainerStatusResources` (kubelet_pods.go): a running container's
/// `resources` has cpu and memory limits and the cpu request as it runs with them (a
/// resize not carried out yet), the memory request and everything else as allocated;
/// `allocatedResources` is the allocated requests. The resize conditions follow the
/// others, status True.
#[test]
fn a_resized_containers_resources_as_it_runs_and_as_allocated() {
    let mut p = pod("Always", false);
    p.spec.as_mut().unwrap().containers[0].resources = serde_json::from_value(serde_json::json!({
        "requests": {"cpu": "200m", "memory": "64Mi", "ephemeral-storage": "1Gi"},
        "limits": {"cpu": "400m", "memory": "128Mi"}
    }))
    .unwrap();
    let running_with: k8s_openapi::api::core::v1::ResourceRequirements =
        serde_json::from_value(serde_json::json!({
            "requests": {"cpu": "100m", "memory": "32Mi"},
            "limits": {"cpu": "200m", "memory": "96Mi"}
        }))
        .unwrap();
    let actuated = std::collections::BTreeMap::from([("c1".to_string(), running_with)]);
    let resize = crate::allocation::ResizeConditions {
        pending: None,
        in_progress: Some(crate::allocation::Condition {
            generation: Some(2),
            ..Default::default()
        }),
    };
    let rt = runtime(cri::ContainerState::ContainerRunning, 0);
    let s = compute(
        &StatusInputs {
            pod: &p,
            runtime: Some(&rt),
            readiness: &HashMap::new(),
            started: &Default::default(),
            waiting: &HashMap::new(),
            node_ips: &crate::status::ips::NodeIps::single("192.0.2.1"),
            pod_failed: None,
            termination_messages: &HashMap::new(),
            terminated: false,
            resize: Some(&resize),
            actuated: Some(&actuated),
        },
        None,
    );
    let cs = &s.container_statuses.as_ref().unwrap()[0];
    let json = serde_json::to_value(cs).unwrap();
    assert_eq!(
        json["resources"],
        serde_json::json!({
            "requests": {"cpu": "100m", "memory": "64Mi", "ephemeral-storage": "1Gi"},
            "limits": {"cpu": "200m", "memory": "96Mi"}
        })
    );
    assert_eq!(
        json["allocatedResources"],
        serde_json::json!({"cpu": "200m", "memory": "64Mi", "ephemeral-storage": "1Gi"})
    );
    let in_progress = s
        .conditions
        .as_ref()
        .unwrap()
        .iter()
        .find(|c| c.type_ == "PodResizeInProgress")
        .expect("PodResizeInProgress");
    assert_eq!(in_progress.status, "True");
    assert_eq!(in_progress.observed_generation, Some(2));
    // A container that does not run has no `resources`.
    let exited = runtime(cri::ContainerState::ContainerExited, 0);
    let s = compute_for(&p, Some(&exited), &HashMap::new());
    assert!(s.container_statuses.unwrap()[0].resources.is_none());
}
