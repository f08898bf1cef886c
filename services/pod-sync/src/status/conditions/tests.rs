//! Upstream's tables from `pkg/kubelet/status/generate_test.go`, row by row in upstream's
//! order: `TestGenerateContainersReadyCondition` (11 rows), `TestGeneratePodReadyCondition`
//! (14) and `TestGeneratePodInitializedCondition` (11; upstream compares type, status and
//! reason there, and so does this). `TestGeneratePodReadyToStartContainersCondition`'s
//! reasons and messages are constants of an unreleased upstream (`kubetypes.PodSandboxNotReady*`)
//! that we do not have the texts of; its status part is `status/tests.rs`'s.

use super::*;
use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, PodReadinessGate,
};

fn spec(init: &[&str], sidecars: &[&str], containers: &[&str], gates: &[&str]) -> PodSpec {
    let c = |name: &&str| Container {
        name: name.to_string(),
        ..Default::default()
    };
    let mut init_containers: Vec<Container> = init.iter().map(c).collect();
    init_containers.extend(sidecars.iter().map(|n| Container {
        restart_policy: Some("Always".into()),
        ..c(n)
    }));
    PodSpec {
        init_containers: (!init_containers.is_empty()).then_some(init_containers),
        containers: containers.iter().map(c).collect(),
        readiness_gates: (!gates.is_empty()).then(|| {
            gates
                .iter()
                .map(|g| PodReadinessGate {
                    condition_type: g.to_string(),
                })
                .collect()
        }),
        ..Default::default()
    }
}

fn ready(name: &str) -> ContainerStatus {
    ContainerStatus {
        name: name.into(),
        ready: true,
        ..Default::default()
    }
}

fn not_ready(name: &str) -> ContainerStatus {
    ContainerStatus {
        name: name.into(),
        ..Default::default()
    }
}

fn started(name: &str, yes: bool) -> ContainerStatus {
    ContainerStatus {
        name: name.into(),
        started: Some(yes),
        ..Default::default()
    }
}

fn in_state(name: &str, state: ContainerState) -> ContainerStatus {
    ContainerStatus {
        name: name.into(),
        state: Some(state),
        ..Default::default()
    }
}

fn gate(kind: &str, status: &str) -> PodCondition {
    PodCondition {
        type_: kind.into(),
        status: status.into(),
        ..Default::default()
    }
}

/// (type, status, reason, message) as upstream's `getPodCondition`.
fn want(kind: &str, status: &str, reason: &str, message: &str) -> PodCondition {
    PodCondition {
        type_: kind.into(),
        status: status.into(),
        reason: (!reason.is_empty()).then(|| reason.into()),
        message: (!message.is_empty()).then(|| message.into()),
        ..Default::default()
    }
}

type Row = (
    PodSpec,
    Option<Vec<ContainerStatus>>,
    &'static str,
    (&'static str, &'static str, &'static str),
);

/// The rows `TestGenerateContainersReadyCondition` and the first seven of
/// `TestGeneratePodReadyCondition` share, with (status, reason, message).
fn shared_rows() -> Vec<Row> {
    vec![
        (
            spec(&[], &[], &[], &[]),
            None,
            "Running",
            ("False", UNKNOWN_CONTAINER_STATUSES, ""),
        ),
        (
            spec(&[], &[], &[], &[]),
            Some(vec![]),
            "Running",
            ("True", "", ""),
        ),
        (
            spec(&[], &[], &["1234"], &[]),
            Some(vec![]),
            "Running",
            (
                "False",
                CONTAINERS_NOT_READY,
                "containers with unknown status: [1234]",
            ),
        ),
        (
            spec(&[], &[], &["1234", "5678"], &[]),
            Some(vec![ready("1234"), ready("5678")]),
            "Running",
            ("True", "", ""),
        ),
        (
            spec(&[], &[], &["1234", "5678"], &[]),
            Some(vec![ready("1234")]),
            "Running",
            (
                "False",
                CONTAINERS_NOT_READY,
                "containers with unknown status: [5678]",
            ),
        ),
        (
            spec(&[], &[], &["1234", "5678"], &[]),
            Some(vec![ready("1234"), not_ready("5678")]),
            "Running",
            (
                "False",
                CONTAINERS_NOT_READY,
                "containers with unready status: [5678]",
            ),
        ),
        (
            spec(&[], &[], &["1234"], &[]),
            Some(vec![not_ready("1234")]),
            "Succeeded",
            ("False", POD_COMPLETED, ""),
        ),
    ]
}

#[test]
fn generate_containers_ready_condition() {
    let sidecars = |s: &[&'static str]| spec(&[], s, &["regular-1"], &[]);
    let mut rows = shared_rows();
    rows.extend([
        (
            sidecars(&["restartable-init-1"]),
            Some(vec![ready("regular-1")]),
            "Running",
            (
                "False",
                CONTAINERS_NOT_READY,
                "containers with unknown status: [restartable-init-1]",
            ),
        ),
        (
            sidecars(&["restartable-init-1", "restartable-init-2"]),
            Some(vec![
                ready("restartable-init-1"),
                ready("restartable-init-2"),
                ready("regular-1"),
            ]),
            "Running",
            ("True", "", ""),
        ),
        (
            sidecars(&["restartable-init-1", "restartable-init-2"]),
            Some(vec![ready("restartable-init-1"), ready("regular-1")]),
            "Running",
            (
                "False",
                CONTAINERS_NOT_READY,
                "containers with unknown status: [restartable-init-2]",
            ),
        ),
        (
            sidecars(&["restartable-init-1", "restartable-init-2"]),
            Some(vec![
                ready("restartable-init-1"),
                not_ready("restartable-init-2"),
                ready("regular-1"),
            ]),
            "Running",
            (
                "False",
                CONTAINERS_NOT_READY,
                "containers with unready status: [restartable-init-2]",
            ),
        ),
    ]);
    assert_eq!(rows.len(), 11);
    for (i, (spec, statuses, phase, (status, reason, message))) in rows.into_iter().enumerate() {
        let got = containers_ready(&spec, statuses.as_deref(), phase);
        assert_eq!(
            got,
            want("ContainersReady", status, reason, message),
            "row {i}"
        );
    }
}

#[test]
fn generate_pod_ready_condition() {
    let mut rows: Vec<(Row, Vec<PodCondition>)> =
        shared_rows().into_iter().map(|r| (r, vec![])).collect();
    let gates = |g: &[&'static str]| spec(&[], &[], &[], g);
    let gate_message_1 = "corresponding condition of pod readiness gate \"gate1\" does not exist.";
    rows.extend([
        (
            (
                gates(&["gate1"]),
                Some(vec![]),
                "Running",
                ("False", READINESS_GATES_NOT_READY, gate_message_1),
            ),
            vec![],
        ),
        (
            (
                gates(&["gate1"]),
                Some(vec![]),
                "Running",
                (
                    "False",
                    READINESS_GATES_NOT_READY,
                    "the status of pod readiness gate \"gate1\" is not \"True\", but False",
                ),
            ),
            vec![gate("gate1", "False")],
        ),
        (
            (gates(&["gate1"]), Some(vec![]), "Running", ("True", "", "")),
            vec![gate("gate1", "True")],
        ),
        (
            (
                gates(&["gate1", "gate2"]),
                Some(vec![]),
                "Running",
                (
                    "False",
                    READINESS_GATES_NOT_READY,
                    "corresponding condition of pod readiness gate \"gate2\" does not exist.",
                ),
            ),
            vec![gate("gate1", "True")],
        ),
        (
            (
                gates(&["gate1", "gate2"]),
                Some(vec![]),
                "Running",
                (
                    "False",
                    READINESS_GATES_NOT_READY,
                    "the status of pod readiness gate \"gate2\" is not \"True\", but False",
                ),
            ),
            vec![gate("gate1", "True"), gate("gate2", "False")],
        ),
        (
            (
                gates(&["gate1", "gate2"]),
                Some(vec![]),
                "Running",
                ("True", "", ""),
            ),
            vec![gate("gate1", "True"), gate("gate2", "True")],
        ),
        (
            (
                spec(&[], &[], &["1234"], &["gate1"]),
                Some(vec![not_ready("1234")]),
                "Running",
                (
                    "False",
                    CONTAINERS_NOT_READY,
                    "containers with unready status: [1234]",
                ),
            ),
            vec![gate("gate1", "True")],
        ),
    ]);
    assert_eq!(rows.len(), 14);
    for (i, ((spec, statuses, phase, (status, reason, message)), conditions)) in
        rows.into_iter().enumerate()
    {
        let got = pod_ready(&spec, &conditions, statuses.as_deref(), phase);
        assert_eq!(got, want("Ready", status, reason, message), "row {i}");
    }
}

#[test]
fn generate_pod_initialized_condition() {
    let no_init = spec(&[], &[], &[], &[]);
    let one_init = spec(&["1234"], &[], &["regular"], &[]);
    let two_init = spec(&["1234", "5678"], &[], &["regular"], &[]);
    let one_sidecar = spec(&[], &["1234"], &["regular"], &[]);
    let running = ContainerState {
        running: Some(ContainerStateRunning::default()),
        ..Default::default()
    };
    let waiting = ContainerState {
        waiting: Some(ContainerStateWaiting::default()),
        ..Default::default()
    };
    let terminated = ContainerState {
        terminated: Some(ContainerStateTerminated::default()),
        ..Default::default()
    };
    /// (spec, statuses, phase, (status, reason)).
    type InitRow<'a> = (
        &'a PodSpec,
        Option<Vec<ContainerStatus>>,
        &'a str,
        (&'a str, &'a str),
    );
    let rows: Vec<InitRow> = vec![
        (
            &two_init,
            None,
            "Running",
            ("False", UNKNOWN_CONTAINER_STATUSES),
        ),
        (&no_init, Some(vec![]), "Running", ("True", "")),
        (
            &one_init,
            Some(vec![]),
            "Running",
            ("False", CONTAINERS_NOT_INITIALIZED),
        ),
        (
            &two_init,
            Some(vec![ready("1234"), ready("5678")]),
            "Running",
            ("True", ""),
        ),
        (
            &two_init,
            Some(vec![ready("1234")]),
            "Running",
            ("False", CONTAINERS_NOT_INITIALIZED),
        ),
        (
            &two_init,
            Some(vec![ready("1234"), not_ready("5678")]),
            "Running",
            ("False", CONTAINERS_NOT_INITIALIZED),
        ),
        (
            &one_init,
            Some(vec![ready("1234")]),
            "Succeeded",
            ("True", POD_COMPLETED),
        ),
        (
            &one_sidecar,
            Some(vec![started("1234", false)]),
            "Pending",
            ("False", CONTAINERS_NOT_INITIALIZED),
        ),
        (
            &one_sidecar,
            Some(vec![started("1234", true)]),
            "Running",
            ("True", ""),
        ),
        (
            &one_sidecar,
            Some(vec![started("1234", false), in_state("regular", running)]),
            "Running",
            ("True", ""),
        ),
        (
            &one_init,
            Some(vec![
                in_state("1234", waiting),
                in_state("regular", terminated),
            ]),
            "Running",
            ("True", ""),
        ),
    ];
    assert_eq!(rows.len(), 11);
    for (i, (spec, statuses, phase, (status, reason))) in rows.into_iter().enumerate() {
        let got = initialized(spec, statuses.as_deref(), phase);
        assert_eq!(got.type_, "Initialized", "row {i}");
        assert_eq!(
            (
                got.status.as_str(),
                got.reason.as_deref().unwrap_or_default()
            ),
            (status, reason),
            "row {i}"
        );
    }
}
