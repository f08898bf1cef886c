//! Upstream's own tables for `computePodActions`, ported case by case from
//! kubernetes/kubernetes `pkg/kubelet/kuberuntime/kuberuntime_manager_test.go` (the 1.33
//! version): `TestComputePodActions` and `TestComputePodActionsWithInitContainers`, each
//! case under upstream's name, with upstream's `makeBasePodAndStatus*` as `base` below.
//!
//! Adaptations, the same for every case:
//! - `compute_pod_actions` puts our plans together as `sync.rs` carries them out (the
//!   sandbox, then init containers, then regular containers once initialized) and reads
//!   them as upstream's `podActions`;
//! - containers to kill are compared by id, as upstream's `verifyActions` clears the
//!   message and reason; nil and empty lists are not told apart;
//! - upstream's `Attempt` of a pod that gets no new sandbox is not carried (no sandbox is
//!   made with it); the rows say where;
//! - every container of upstream's status is in the one sandbox `sandboxID`; `Hash` is
//!   our upstream hash of the spec container.

use super::*;
use crate::worker::init_plan;
use cri::ContainerState as S;

/// Upstream's `podActions`, the fields these tables compare.
#[derive(Debug, Default, PartialEq)]
struct Actions {
    kill_pod: bool,
    create_sandbox: bool,
    sandbox_id: String,
    attempt: u32,
    init_containers_to_start: Vec<usize>,
    containers_to_start: Vec<usize>,
    containers_to_kill: Vec<String>,
    ephemeral_containers_to_start: Vec<usize>,
}

/// Our plans, in the order `sync_pod_inner` carries them out, as upstream's `podActions`.
fn compute_pod_actions(pod: &Pod, rt: &RuntimePodStatus, probes: ProbeResults<'_>) -> Actions {
    let spec = pod.spec.clone().unwrap_or_default();
    let newest = rt.sandboxes.iter().max_by_key(|s| s.created_at_unix_nanos);
    let mut a = Actions {
        sandbox_id: newest.map(|s| s.id.clone()).unwrap_or_default(),
        ..Default::default()
    };
    let sandbox = match plan_sandbox(pod, rt) {
        SandboxPlan::Finished => {
            a.kill_pod = true;
            return a;
        }
        SandboxPlan::Create { attempt, .. } => {
            (a.kill_pod, a.create_sandbox, a.attempt) = (true, true, attempt);
            None
        }
        SandboxPlan::Keep { id, .. } => Some(id),
    };
    // Upstream plans ephemeral containers before it looks at initialization.
    if sandbox.is_some() {
        a.ephemeral_containers_to_start = plan_ephemeral(pod, rt, &HashSet::new());
    }
    let in_sandbox = |name: &str| {
        instances(Some(rt), name)
            .into_iter()
            .find(|c| sandbox.as_deref().is_some_and(|s| c.sandbox_id == s))
    };
    let init = spec.init_containers.clone().unwrap_or_default();
    let views: Vec<InitView> = init
        .iter()
        .map(|c| init_view(c, in_sandbox(&c.name), probes))
        .collect();
    let app_exists = spec
        .containers
        .iter()
        .any(|c| in_sandbox(&c.name).is_some());
    let init_plan = init_plan::compute(&init, &views, app_exists, restart_policy(pod) != "Never");
    a.containers_to_kill
        .extend(init_plan.to_kill.iter().map(|k| k.id.clone()));
    if init_plan.kill_pod {
        a.kill_pod = true;
        return a;
    }
    a.init_containers_to_start = init_plan.to_start;
    if !init_plan.initialized {
        return a;
    }
    let app = plan_app_containers(pod, rt, sandbox.as_deref(), probes);
    a.kill_pod |= app.kill_pod;
    a.containers_to_start = app.to_start.iter().map(|(i, _)| *i).collect();
    a.containers_to_kill
        .extend(app.to_kill.iter().map(|k| k.id.clone()));
    a
}

fn container(name: &str, image: &str) -> Container {
    Container {
        name: name.into(),
        image: Some(image.into()),
        ..Default::default()
    }
}

fn status_of(id: &str, c: &Container, state: S) -> RuntimeContainer {
    RuntimeContainer {
        id: id.into(),
        name: c.name.clone(),
        state: state as i32,
        sandbox_id: "sandboxID".into(),
        created_at_unix_nanos: 1,
        upstream_hash: crate::runtime_spec::upstream_hash(c),
        ..Default::default()
    }
}

/// Upstream's `makeBasePodAndStatus` (every container running in a ready sandbox),
/// `makeBasePodAndStatusWithInitContainers` (three init containers that exited 0 in place
/// of the regular containers' statuses) and
/// `makeBasePodAndStatusWithRestartableInitContainers` (three running sidecars there, the
/// second and third with liveness and startup probes).
fn base(kind: Base) -> (Pod, RuntimePodStatus) {
    let containers: Vec<Container> = ["foo1", "foo2", "foo3"]
        .iter()
        .map(|n| container(n, "busybox"))
        .collect();
    let mut pod = Pod::default();
    pod.metadata.uid = Some("12345678".into());
    pod.metadata.name = Some("foo".into());
    pod.metadata.namespace = Some("foo-ns".into());
    let mut statuses: Vec<RuntimeContainer> = containers
        .iter()
        .enumerate()
        .map(|(i, c)| status_of(&format!("id{}", i + 1), c, S::ContainerRunning))
        .collect();
    let mut spec = k8s_openapi::api::core::v1::PodSpec {
        containers,
        ..Default::default()
    };
    let (names, state) = match kind {
        Base::Plain => (vec![], S::ContainerRunning),
        Base::InitContainers => (vec!["init1", "init2", "init3"], S::ContainerExited),
        Base::RestartableInitContainers => (
            vec![
                "restartable-init-1",
                "restartable-init-2",
                "restartable-init-3",
            ],
            S::ContainerRunning,
        ),
        Base::InitAndEphemeralContainers => {
            // Upstream's makeBasePodAndStatusWithInitAndEphemeralContainers: the regular
            // containers' statuses kept, init1 exited and the debug container running
            // after them.
            let init1 = container("init1", "bar-image");
            let debug = container("debug", "busybox");
            statuses.push(status_of("initid1", &init1, S::ContainerExited));
            statuses.push(status_of("debug1", &debug, S::ContainerRunning));
            spec.init_containers = Some(vec![init1]);
            spec.ephemeral_containers = Some(vec![ephemeral("debug", "busybox")]);
            (vec![], S::ContainerRunning)
        }
    };
    if !names.is_empty() {
        let inits: Vec<Container> = names
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let mut c = container(n, "bar-image");
                if matches!(kind, Base::RestartableInitContainers) {
                    c.restart_policy = Some("Always".into());
                    if i > 0 {
                        c.liveness_probe = Some(Default::default());
                        c.startup_probe = Some(Default::default());
                    }
                }
                c
            })
            .collect();
        statuses = inits
            .iter()
            .enumerate()
            .map(|(i, c)| status_of(&format!("initid{}", i + 1), c, state))
            .collect();
        spec.init_containers = Some(inits);
    }
    pod.spec = Some(spec);
    let rt = RuntimePodStatus {
        uid: "12345678".into(),
        name: "foo".into(),
        namespace: "foo-ns".into(),
        sandboxes: vec![RuntimeSandbox {
            id: "sandboxID".into(),
            state: SANDBOX_READY,
            attempt: 0,
            created_at_unix_nanos: 1,
            ip: "10.0.0.1".into(),
            ..Default::default()
        }],
        containers: statuses,
        timestamp_unix_nanos: 1,
    };
    (pod, rt)
}

fn policy(p: &str) -> impl Fn(&mut Pod) {
    let p = p.to_string();
    move |pod: &mut Pod| pod.spec.as_mut().unwrap().restart_policy = Some(p.clone())
}

const NOT_READY: i32 = cri::PodSandboxState::SandboxNotready as i32;

fn exited(rt: &mut RuntimePodStatus, i: usize, code: i32) {
    rt.containers[i].state = EXITED;
    rt.containers[i].exit_code = code;
}

/// `noAction`: the ready sandbox, nothing to start or kill.
fn no_action() -> Actions {
    Actions {
        sandbox_id: "sandboxID".into(),
        ..Default::default()
    }
}

/// The dead sandbox replaced (attempt 1) and the first init container started in it: the
/// expected actions of several rows of the init container tables.
fn recreate_first_init() -> Actions {
    Actions {
        kill_pod: true,
        create_sandbox: true,
        sandbox_id: "sandboxID".into(),
        attempt: 1,
        init_containers_to_start: vec![0],
        ..Default::default()
    }
}

fn starts(sandbox_id: &str, containers: &[usize]) -> Actions {
    Actions {
        sandbox_id: sandbox_id.into(),
        containers_to_start: containers.to_vec(),
        ..Default::default()
    }
}

/// A case: upstream's name, what it does to the pod and the status, the containers whose
/// liveness (or, where it has one, startup) probe failed, the actions expected.
struct Case {
    name: &'static str,
    pod: Box<dyn Fn(&mut Pod)>,
    status: Box<dyn Fn(&mut RuntimePodStatus)>,
    unhealthy: &'static [&'static str],
    /// Running containers whose startup probe has not passed (every other has passed).
    not_started: &'static [&'static str],
    want: Actions,
}

fn case(
    name: &'static str,
    pod: impl Fn(&mut Pod) + 'static,
    status: impl Fn(&mut RuntimePodStatus) + 'static,
    want: Actions,
) -> Case {
    Case {
        name,
        pod: Box::new(pod),
        status: Box::new(status),
        unhealthy: &[],
        not_started: &[],
        want,
    }
}

/// Which of upstream's base pods a table starts from.
#[derive(Clone, Copy)]
enum Base {
    Plain,
    InitContainers,
    RestartableInitContainers,
    InitAndEphemeralContainers,
}

fn ephemeral(name: &str, image: &str) -> k8s_openapi::api::core::v1::EphemeralContainer {
    k8s_openapi::api::core::v1::EphemeralContainer {
        name: name.into(),
        image: Some(image.into()),
        ..Default::default()
    }
}

fn run(kind: Base, cases: Vec<Case>) {
    let mut failed = Vec::new();
    for c in &cases {
        let (mut pod, mut rt) = base(kind);
        (c.pod)(&mut pod);
        (c.status)(&mut rt);
        let unhealthy: HashSet<String> = c.unhealthy.iter().map(|s| s.to_string()).collect();
        let started: HashSet<String> = rt
            .containers
            .iter()
            .map(|c| c.id.clone())
            .filter(|id| !c.not_started.contains(&id.as_str()))
            .collect();
        let probes = ProbeResults {
            unhealthy: Some(&unhealthy),
            started: Some(&started),
        };
        let got = compute_pod_actions(&pod, &rt, probes);
        if got != c.want {
            failed.push(format!(
                "{}:\n  want {:?}\n  got  {:?}",
                c.name, c.want, got
            ));
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {} cases:\n{}",
        failed.len(),
        cases.len(),
        failed.join("\n")
    );
}

fn keep(_: &mut Pod) {}
fn same(_: &mut RuntimePodStatus) {}

// upstream: kuberuntime_manager_test.go TestComputePodActions, its 17 cases.
#[test]
fn test_compute_pod_actions() {
    let mut cases = vec![
        case("everything is good; do nothing", keep, same, no_action()),
        case(
            "start pod sandbox and all containers for a new pod",
            keep,
            |rt| {
                rt.sandboxes.clear();
                rt.containers.clear();
            },
            Actions {
                kill_pod: true,
                create_sandbox: true,
                attempt: 0,
                containers_to_start: vec![0, 1, 2],
                ..Default::default()
            },
        ),
        case(
            "restart exited containers if RestartPolicy == Always",
            policy("Always"),
            |rt| {
                exited(rt, 0, 0);
                exited(rt, 1, 111);
            },
            starts("sandboxID", &[0, 1]),
        ),
        case(
            "restart failed containers if RestartPolicy == OnFailure",
            policy("OnFailure"),
            |rt| {
                exited(rt, 0, 0);
                exited(rt, 1, 111);
            },
            starts("sandboxID", &[1]),
        ),
        case(
            "restart created but not started containers if RestartPolicy == OnFailure",
            policy("OnFailure"),
            |rt| {
                exited(rt, 0, 0);
                rt.containers[1].state = CREATED;
            },
            starts("sandboxID", &[1]),
        ),
        case(
            "don't restart containers if RestartPolicy == Never",
            policy("Never"),
            |rt| {
                exited(rt, 0, 0);
                exited(rt, 1, 111);
            },
            no_action(),
        ),
        case(
            "Kill pod and recreate everything if the pod sandbox is dead, and RestartPolicy == Always",
            policy("Always"),
            |rt| rt.sandboxes[0].state = NOT_READY,
            Actions {
                kill_pod: true,
                create_sandbox: true,
                sandbox_id: "sandboxID".into(),
                attempt: 1,
                containers_to_start: vec![0, 1, 2],
                ..Default::default()
            },
        ),
        case(
            "Kill pod and recreate all containers (except for the succeeded one) if the pod sandbox is dead, and RestartPolicy == OnFailure",
            policy("OnFailure"),
            |rt| {
                rt.sandboxes[0].state = NOT_READY;
                exited(rt, 1, 0);
            },
            Actions {
                kill_pod: true,
                create_sandbox: true,
                sandbox_id: "sandboxID".into(),
                attempt: 1,
                containers_to_start: vec![0, 2],
                ..Default::default()
            },
        ),
        // Upstream: KillPod, CreateSandbox, Attempt 1, ContainersToStart [0 1 2]. Ours keeps
        // the sandbox on purpose (plan.rs says why: an empty IP here may be a failed
        // PodSandboxStatus call, not a lost network).
        case(
            "Kill pod and recreate all containers if the PodSandbox does not have an IP",
            keep,
            |rt| rt.sandboxes[0].ip.clear(),
            no_action(),
        ),
        case(
            "Kill and recreate the container if the container's spec changed",
            policy("Always"),
            |rt| rt.containers[1].upstream_hash = "432423432".into(),
            Actions {
                containers_to_kill: vec!["id2".into()],
                ..starts("sandboxID", &[1])
            },
        ),
        Case {
            unhealthy: &["id2"],
            ..case(
                "Kill and recreate the container if the liveness check has failed",
                policy("Always"),
                same,
                Actions {
                    containers_to_kill: vec!["id2".into()],
                    ..starts("sandboxID", &[1])
                },
            )
        },
        // Upstream's foo2 has no startup probe; its startup manager holds a Failure anyway.
        // Here a failure before the startup probe passed is a startup failure only for a
        // container that has one, so foo2 gets one.
        Case {
            unhealthy: &["id2"],
            ..case(
                "Kill and recreate the container if the startup check has failed",
                |pod| {
                    policy("Always")(pod);
                    pod.spec.as_mut().unwrap().containers[1].startup_probe =
                        Some(Default::default());
                },
                same,
                Actions {
                    containers_to_kill: vec!["id2".into()],
                    ..starts("sandboxID", &[1])
                },
            )
        },
        // Upstream's Attempt 2 is not carried: no sandbox is made.
        case(
            "Verify we do not create a pod sandbox if no ready sandbox for pod with RestartPolicy=Never and all containers exited",
            policy("Never"),
            |rt| {
                rt.sandboxes[0].state = NOT_READY;
                rt.sandboxes[0].attempt = 1;
                for i in 0..rt.containers.len() {
                    exited(rt, i, 0);
                }
            },
            Actions {
                kill_pod: true,
                sandbox_id: "sandboxID".into(),
                ..Default::default()
            },
        ),
        // Upstream's Attempt 2 is not carried: no sandbox is made.
        case(
            "Verify we do not create a pod sandbox if no ready sandbox for pod with RestartPolicy=OnFailure and all containers succeeded",
            policy("OnFailure"),
            |rt| {
                rt.sandboxes[0].state = NOT_READY;
                rt.sandboxes[0].attempt = 1;
                for i in 0..rt.containers.len() {
                    exited(rt, i, 0);
                }
            },
            Actions {
                kill_pod: true,
                sandbox_id: "sandboxID".into(),
                ..Default::default()
            },
        ),
        case(
            "Verify we create a pod sandbox if no ready sandbox for pod with RestartPolicy=Never and no containers have ever been created",
            policy("Never"),
            |rt| {
                rt.sandboxes[0].state = NOT_READY;
                rt.sandboxes[0].attempt = 2;
                rt.containers.clear();
            },
            Actions {
                kill_pod: true,
                create_sandbox: true,
                sandbox_id: "sandboxID".into(),
                attempt: 3,
                containers_to_start: vec![0, 1, 2],
                ..Default::default()
            },
        ),
        case(
            "Kill and recreate the container if the container is in unknown state",
            policy("Never"),
            |rt| rt.containers[1].state = S::ContainerUnknown as i32,
            Actions {
                containers_to_kill: vec!["id2".into()],
                ..starts("sandboxID", &[1])
            },
        ),
        case(
            "Restart the container if the container is in created state",
            policy("Never"),
            |rt| rt.containers[1].state = CREATED,
            starts("sandboxID", &[1]),
        ),
    ];
    // Ours, beside upstream's: the departures plan.rs names, and a deleted pod.
    cases.extend([
        // Upstream: KillPod, CreateSandbox, Attempt 1, every container started again.
        case(
            "two ready sandboxes: the newest is kept, its containers untouched",
            keep,
            |rt| {
                let mut older = rt.sandboxes[0].clone();
                older.id = "older".into();
                older.created_at_unix_nanos = 0;
                rt.sandboxes.push(older);
            },
            no_action(),
        ),
        case(
            "a pod being deleted restarts nothing (ShouldContainerBeRestarted)",
            |pod| {
                pod.metadata.deletion_timestamp = Some(
                    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()),
                );
            },
            |rt| {
                exited(rt, 0, 1);
                exited(rt, 1, 1);
                exited(rt, 2, 1);
            },
            Actions {
                kill_pod: true,
                ..no_action()
            },
        ),
        case(
            "a crashed container of a dead sandbox waits out its back-off in the new one",
            policy("Always"),
            |rt| {
                rt.sandboxes[0].state = NOT_READY;
                exited(rt, 0, 1);
            },
            Actions {
                kill_pod: true,
                create_sandbox: true,
                sandbox_id: "sandboxID".into(),
                attempt: 1,
                containers_to_start: vec![0, 1, 2],
                ..Default::default()
            },
        ),
    ]);
    run(Base::Plain, cases);
}

// upstream: kuberuntime_manager_test.go TestComputePodActionsWithInitContainers, its 15 cases.
#[test]
fn test_compute_pod_actions_with_init_containers() {
    let init_starts = |i: &[usize]| Actions {
        init_containers_to_start: i.to_vec(),
        ..no_action()
    };
    let killed_pod = || Actions {
        kill_pod: true,
        ..no_action()
    };
    let unknown = |rt: &mut RuntimePodStatus| rt.containers[2].state = S::ContainerUnknown as i32;
    let cases = vec![
        case(
            "initialization completed; start all containers",
            keep,
            same,
            starts("sandboxID", &[0, 1, 2]),
        ),
        case(
            "no init containers have been started; start the first one",
            keep,
            |rt| rt.containers.clear(),
            init_starts(&[0]),
        ),
        case(
            "initialization in progress; do nothing",
            policy("Always"),
            |rt| rt.containers[2].state = RUNNING,
            no_action(),
        ),
        case(
            "Kill pod and restart the first init container if the pod sandbox is dead",
            policy("Always"),
            |rt| rt.sandboxes[0].state = NOT_READY,
            recreate_first_init(),
        ),
        case(
            "initialization failed; restart the last init container if RestartPolicy == Always",
            policy("Always"),
            |rt| rt.containers[2].exit_code = 137,
            init_starts(&[2]),
        ),
        case(
            "initialization failed; restart the last init container if RestartPolicy == OnFailure",
            policy("OnFailure"),
            |rt| rt.containers[2].exit_code = 137,
            init_starts(&[2]),
        ),
        case(
            "initialization failed; kill pod if RestartPolicy == Never",
            policy("Never"),
            |rt| rt.containers[2].exit_code = 137,
            killed_pod(),
        ),
        case(
            "init container state unknown; kill and recreate the last init container if RestartPolicy == Always",
            policy("Always"),
            unknown,
            Actions {
                containers_to_kill: vec!["initid3".into()],
                ..init_starts(&[2])
            },
        ),
        case(
            "init container state unknown; kill and recreate the last init container if RestartPolicy == OnFailure",
            policy("OnFailure"),
            unknown,
            Actions {
                containers_to_kill: vec!["initid3".into()],
                ..init_starts(&[2])
            },
        ),
        case(
            "init container state unknown; kill pod if RestartPolicy == Never",
            policy("Never"),
            unknown,
            killed_pod(),
        ),
        // Upstream's Attempt 1 is not carried: no sandbox is made.
        case(
            "Pod sandbox not ready, init container failed, but RestartPolicy == Never; kill pod only",
            policy("Never"),
            |rt| rt.sandboxes[0].state = NOT_READY,
            killed_pod(),
        ),
        case(
            "Pod sandbox not ready, and RestartPolicy == Never, but no visible init containers;  create a new pod sandbox",
            policy("Never"),
            |rt| {
                rt.sandboxes[0].state = NOT_READY;
                rt.containers.clear();
            },
            recreate_first_init(),
        ),
        case(
            "Pod sandbox not ready, init container failed, and RestartPolicy == OnFailure; create a new pod sandbox",
            policy("OnFailure"),
            |rt| {
                rt.sandboxes[0].state = NOT_READY;
                rt.containers[2].exit_code = 137;
            },
            recreate_first_init(),
        ),
        case(
            "some of the init container statuses are missing but the last init container is running, don't restart preceding ones",
            policy("Always"),
            |rt| {
                rt.containers[2].state = RUNNING;
                rt.containers.drain(..2);
            },
            no_action(),
        ),
        case(
            "an init container is in the created state due to an unknown error when starting container; restart it",
            policy("Always"),
            |rt| rt.containers[2].state = CREATED,
            init_starts(&[2]),
        ),
    ];
    run(Base::InitContainers, cases);
}

/// The regular containers' statuses appended to a table's base status (upstream's 4.22 and
/// 4.23 append `id1`..`id3`).
fn with_regular(rt: &mut RuntimePodStatus, state: S) {
    for i in 1..=3 {
        let c = container(&format!("foo{i}"), "busybox");
        rt.containers.push(status_of(&format!("id{i}"), &c, state));
    }
}

// upstream: kuberuntime_manager_test.go TestComputePodActionsWithRestartableInitContainers,
// its 24 cases. Upstream's probe managers hold Success for initid2 and initid3 before each
// case: here every running container has passed its startup probe unless a row says not.
#[test]
fn test_compute_pod_actions_with_restartable_init_containers() {
    let init_starts = |i: &[usize]| Actions {
        init_containers_to_start: i.to_vec(),
        ..no_action()
    };
    let first_two = |rt: &mut RuntimePodStatus| rt.containers.truncate(2);
    let last_failed = |rt: &mut RuntimePodStatus| exited(rt, 2, 137);
    let last_failed_in_dead_sandbox = |rt: &mut RuntimePodStatus| {
        rt.sandboxes[0].state = NOT_READY;
        exited(rt, 2, 137);
    };
    let cases = vec![
        case(
            "initialization completed; start all containers",
            keep,
            same,
            starts("sandboxID", &[0, 1, 2]),
        ),
        case(
            "no init containers have been started; start the first one",
            keep,
            |rt| rt.containers.clear(),
            init_starts(&[0]),
        ),
        case(
            "an init container is stuck in the created state; restart it",
            policy("Always"),
            |rt| rt.containers[2].state = CREATED,
            init_starts(&[2]),
        ),
        case(
            "restartable init container has started; start the next",
            policy("Always"),
            |rt| rt.containers.truncate(1),
            init_starts(&[1]),
        ),
        // Upstream's name says "nothing"; its expectation starts the next, as here: a
        // liveness probe that has not run holds nothing back.
        case(
            "livenessProbe has not been run; start the nothing",
            policy("Always"),
            first_two,
            init_starts(&[2]),
        ),
        // A liveness result of Unknown is not a failure.
        case(
            "livenessProbe in progress; start the next",
            policy("Always"),
            first_two,
            init_starts(&[2]),
        ),
        case(
            "livenessProbe has completed; start the next",
            policy("Always"),
            first_two,
            init_starts(&[2]),
        ),
        Case {
            unhealthy: &["initid3"],
            ..case(
                "kill and recreate the restartable init container if the liveness check has failed",
                policy("Always"),
                same,
                Actions {
                    containers_to_kill: vec!["initid3".into()],
                    ..Actions {
                        init_containers_to_start: vec![2],
                        ..starts("sandboxID", &[0, 1, 2])
                    }
                },
            )
        },
        Case {
            not_started: &["initid2"],
            ..case(
                "startupProbe has not been run; do nothing",
                policy("Always"),
                first_two,
                no_action(),
            )
        },
        // A startup result of Unknown: not passed.
        Case {
            not_started: &["initid2"],
            ..case(
                "startupProbe in progress; do nothing",
                policy("Always"),
                first_two,
                no_action(),
            )
        },
        case(
            "startupProbe has completed; start the next",
            policy("Always"),
            first_two,
            init_starts(&[2]),
        ),
        Case {
            unhealthy: &["initid3"],
            not_started: &["initid3"],
            ..case(
                "kill and recreate the restartable init container if the startup check has failed",
                policy("Always"),
                same,
                Actions {
                    containers_to_kill: vec!["initid3".into()],
                    ..init_starts(&[2])
                },
            )
        },
        case(
            "kill and recreate the restartable init container if the container definition changes",
            |pod| {
                policy("Always")(pod);
                pod.spec.as_mut().unwrap().init_containers.as_mut().unwrap()[2].image =
                    Some("foo-image".into());
            },
            same,
            Actions {
                containers_to_kill: vec!["initid3".into()],
                ..Actions {
                    init_containers_to_start: vec![2],
                    ..starts("sandboxID", &[0, 1, 2])
                }
            },
        ),
        case(
            "restart terminated restartable init container and next init container",
            policy("Always"),
            |rt| {
                exited(rt, 0, 0);
                exited(rt, 2, 0);
            },
            init_starts(&[0, 2]),
        ),
        case(
            "restart terminated restartable init container and regular containers",
            policy("Always"),
            |rt| exited(rt, 0, 0),
            Actions {
                init_containers_to_start: vec![0],
                ..starts("sandboxID", &[0, 1, 2])
            },
        ),
        // Upstream's Attempt 1 is not carried: no sandbox is made.
        case(
            "Pod sandbox not ready, restartable init container failed, but RestartPolicy == Never; kill pod only",
            policy("Never"),
            last_failed_in_dead_sandbox,
            Actions {
                kill_pod: true,
                ..no_action()
            },
        ),
        case(
            "Pod sandbox not ready, and RestartPolicy == Never, but no visible restartable init containers;  create a new pod sandbox",
            policy("Never"),
            |rt| {
                rt.sandboxes[0].state = NOT_READY;
                rt.containers.clear();
            },
            recreate_first_init(),
        ),
        case(
            "Pod sandbox not ready, restartable init container failed, and RestartPolicy == OnFailure; create a new pod sandbox",
            policy("OnFailure"),
            last_failed_in_dead_sandbox,
            recreate_first_init(),
        ),
        case(
            "Pod sandbox not ready, restartable init container failed, and RestartPolicy == Always; create a new pod sandbox",
            policy("Always"),
            last_failed_in_dead_sandbox,
            recreate_first_init(),
        ),
        case(
            "initialization failed; restart the last restartable init container even if pod's RestartPolicy == Never",
            policy("Never"),
            last_failed,
            init_starts(&[2]),
        ),
        case(
            "restartable init container state unknown; kill and recreate the last restartable init container even if pod's RestartPolicy == Never",
            policy("Never"),
            |rt| rt.containers[2].state = S::ContainerUnknown as i32,
            Actions {
                containers_to_kill: vec!["initid3".into()],
                ..init_starts(&[2])
            },
        ),
        case(
            "restart restartable init container if regular containers are running even if pod's RestartPolicy == Never",
            policy("Never"),
            |rt| {
                exited(rt, 2, 137);
                with_regular(rt, S::ContainerRunning);
            },
            init_starts(&[2]),
        ),
        case(
            "kill the pod if all main containers succeeded if pod's RestartPolicy == Never",
            policy("Never"),
            |rt| with_regular(rt, S::ContainerExited),
            Actions {
                kill_pod: true,
                ..no_action()
            },
        ),
        case(
            "some of the init container statuses are missing but the last init container is running, restart restartable init and regular containers",
            policy("Always"),
            |rt| {
                rt.containers.drain(..2);
            },
            Actions {
                init_containers_to_start: vec![0, 1],
                ..starts("sandboxID", &[0, 1, 2])
            },
        ),
    ];
    run(Base::RestartableInitContainers, cases);
}

/// How each container of a plan is started, beside upstream's indexes: a crashed one after
/// its back-off (also in a new sandbox, as upstream's doBackOff looks at every sandbox), a
/// changed one replaced at once, one killed by a probe by the next sync, a created one
/// started as it is, an unknown one anew with the next attempt.
#[test]
fn how_each_container_is_started() {
    let (mut pod, mut rt) = base(Base::Plain);
    pod.spec.as_mut().unwrap().restart_policy = Some("Always".into());
    exited(&mut rt, 0, 1);
    rt.containers[1].upstream_hash = "changed".into();
    rt.containers[2].state = S::ContainerUnknown as i32;
    rt.containers[2].attempt = 4;
    let none = HashSet::new();
    let probes = ProbeResults {
        unhealthy: Some(&none),
        started: Some(&none),
    };
    let plan = plan_app_containers(&pod, &rt, Some("sandboxID"), probes);
    assert_eq!(
        plan.to_start,
        [
            (
                0,
                Start::AfterBackoff {
                    previous: "id1".into()
                }
            ),
            (
                1,
                Start::Replacing {
                    killed: "id2".into()
                }
            ),
            (
                2,
                Start::New {
                    attempt: 5,
                    backoff_base: 0
                }
            ),
        ]
    );
    let kills: Vec<(&str, &str)> = plan
        .to_kill
        .iter()
        .map(|k| (k.id.as_str(), k.message.as_str()))
        .collect();
    assert_eq!(
        kills,
        [
            (
                "id2",
                "Container foo2 definition changed, will be restarted"
            ),
            (
                "id3",
                "Container is in \"unknown\" state, try killing it before restart"
            ),
        ]
    );
    // In a new sandbox, the crashed one still waits out its back-off.
    let plan = plan_app_containers(&pod, &rt, None, probes);
    assert_eq!(
        plan.to_start[0],
        (
            0,
            Start::AfterBackoff {
                previous: "id1".into()
            }
        )
    );
    // A liveness failure under Never: killed, not restarted, and with nothing else
    // running or to start the pod is done (upstream's KillPod).
    let (mut pod, mut rt) = base(Base::Plain);
    pod.spec.as_mut().unwrap().restart_policy = Some("Never".into());
    exited(&mut rt, 0, 0);
    exited(&mut rt, 2, 0);
    rt.containers[1].state = S::ContainerCreated as i32;
    let plan = plan_app_containers(&pod, &rt, Some("sandboxID"), probes);
    assert_eq!(plan.to_start, [(1, Start::Created { id: "id2".into() })]);
    rt.containers[1].state = RUNNING;
    let unhealthy: HashSet<String> = ["id2".to_string()].into();
    let probes = ProbeResults {
        unhealthy: Some(&unhealthy),
        started: Some(&none),
    };
    let plan = plan_app_containers(&pod, &rt, Some("sandboxID"), probes);
    assert!(plan.to_start.is_empty(), "{plan:?}");
    assert_eq!(
        plan.to_kill[0].message,
        "Container foo2 failed liveness probe"
    );
    assert!(plan.kill_pod);
}

// upstream: kuberuntime_manager_test.go TestComputePodActionsWithInitAndEphemeralContainers,
// its 9 cases (upstream first runs TestComputePodActions and ...WithInitContainers again
// with the feature on: ours have no feature gate, those tables run above).
#[test]
fn test_compute_pod_actions_with_init_and_ephemeral_containers() {
    let ephemeral_starts = |i: &[usize]| Actions {
        ephemeral_containers_to_start: i.to_vec(),
        ..no_action()
    };
    let without_debug = |rt: &mut RuntimePodStatus| rt.containers.truncate(4);
    let cases = vec![
        case(
            "steady state; do nothing; ignore ephemeral container",
            keep,
            same,
            no_action(),
        ),
        case(
            "No ephemeral containers running; start one",
            keep,
            without_debug,
            ephemeral_starts(&[0]),
        ),
        case(
            "Start second ephemeral container",
            |pod| {
                let spec = pod.spec.as_mut().unwrap();
                let list = spec.ephemeral_containers.get_or_insert_with(Vec::new);
                list.push(ephemeral("debug2", "busybox"));
            },
            same,
            ephemeral_starts(&[1]),
        ),
        case(
            "Ephemeral container exited; do not restart",
            policy("Always"),
            |rt| rt.containers[4].state = EXITED,
            no_action(),
        ),
        case(
            "initialization in progress; start ephemeral container",
            keep,
            |rt| {
                rt.containers[3].state = RUNNING;
                rt.containers.truncate(4);
            },
            ephemeral_starts(&[0]),
        ),
        case(
            "Create a new pod sandbox if the pod sandbox is dead, init container failed and RestartPolicy == OnFailure",
            policy("OnFailure"),
            |rt| {
                rt.sandboxes[0].state = NOT_READY;
                rt.containers.drain(..3);
                rt.containers[0].exit_code = 137;
            },
            recreate_first_init(),
        ),
        case(
            "Kill pod and do not restart ephemeral container if the pod sandbox is dead",
            policy("Always"),
            |rt| rt.sandboxes[0].state = NOT_READY,
            recreate_first_init(),
        ),
        case(
            "Kill pod if all containers exited except ephemeral container",
            policy("Never"),
            |rt| (0..3).for_each(|i| exited(rt, i, 0)),
            Actions {
                kill_pod: true,
                ..no_action()
            },
        ),
        case(
            "Ephemeral container is in unknown state; leave it alone",
            policy("Never"),
            |rt| rt.containers[4].state = S::ContainerUnknown as i32,
            no_action(),
        ),
    ];
    run(Base::InitAndEphemeralContainers, cases);
}

/// Ours, beyond upstream's table: an ephemeral container whose status shows it ran is not
/// started again once its dead container is gone (upstream would start it again).
#[test]
fn an_ephemeral_container_that_ran_is_not_started_again_when_its_container_is_gone() {
    let (pod, mut rt) = base(Base::InitAndEphemeralContainers);
    rt.containers.truncate(4);
    assert_eq!(plan_ephemeral(&pod, &rt, &HashSet::new()), vec![0]);
    assert!(plan_ephemeral(&pod, &rt, &HashSet::from(["debug"])).is_empty());
}
