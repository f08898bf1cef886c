//! Upstream's own tables for the pod phase, ported row by row: each test is one
//! `TestPodPhaseWith*` function of kubernetes/kubernetes `pkg/kubelet/kubelet_pods_test.go`
//! (commit 001a80e975bb880d0fe60b304d30950fe661f278), each row keeps upstream's description.
//! Upstream hands `getPhase` one list of statuses looked up by name; here init container
//! statuses and regular container statuses are the two lists `compute` has.

use super::pod_phase;
use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, PodSpec,
};

fn container(name: &str) -> Container {
    Container {
        name: name.into(),
        ..Default::default()
    }
}

/// An init container with `restartPolicy: Always` (upstream `containerRestartPolicyAlways`).
fn sidecar(name: &str) -> Container {
    Container {
        restart_policy: Some("Always".into()),
        ..container(name)
    }
}

fn spec(init: Vec<Container>, containers: &[&str], restart_policy: &str) -> PodSpec {
    PodSpec {
        node_name: Some("machine".into()),
        init_containers: (!init.is_empty()).then_some(init),
        containers: containers.iter().map(|n| container(n)).collect(),
        restart_policy: Some(restart_policy.into()),
        ..Default::default()
    }
}

// The status helpers of upstream's test file, same names and contents.

fn with_state(name: &str, state: ContainerState) -> ContainerStatus {
    ContainerStatus {
        name: name.into(),
        state: Some(state),
        ..Default::default()
    }
}

fn waiting() -> ContainerState {
    ContainerState {
        waiting: Some(ContainerStateWaiting::default()),
        ..Default::default()
    }
}

fn terminated(exit_code: i32) -> ContainerState {
    ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn waiting_state(name: &str) -> ContainerStatus {
    with_state(name, waiting())
}

fn waiting_state_with_last_termination(name: &str) -> ContainerStatus {
    ContainerStatus {
        last_state: Some(terminated(0)),
        ..waiting_state(name)
    }
}

fn waiting_state_with_non_zero_termination(name: &str) -> ContainerStatus {
    ContainerStatus {
        last_state: Some(terminated(-1)),
        ..waiting_state(name)
    }
}

fn running_state(name: &str) -> ContainerStatus {
    with_state(
        name,
        ContainerState {
            running: Some(ContainerStateRunning::default()),
            ..Default::default()
        },
    )
}

fn started_state(name: &str) -> ContainerStatus {
    ContainerStatus {
        started: Some(true),
        ..running_state(name)
    }
}

/// Upstream's `stoppedState` is a `Terminated{}`: exit code 0.
fn stopped_state(name: &str) -> ContainerStatus {
    with_state(name, terminated(0))
}

fn succeeded_state(name: &str) -> ContainerStatus {
    with_state(name, terminated(0))
}

fn failed_state(name: &str) -> ContainerStatus {
    with_state(name, terminated(-1))
}

/// One upstream row: its description, the statuses, `podIsTerminal`,
/// `podHasInitialized` and the expected phase.
struct Case {
    test: &'static str,
    init: Vec<ContainerStatus>,
    app: Vec<ContainerStatus>,
    pod_is_terminal: bool,
    pod_has_initialized: bool,
    phase: &'static str,
}

fn case(
    test: &'static str,
    init: Vec<ContainerStatus>,
    app: Vec<ContainerStatus>,
    (pod_is_terminal, pod_has_initialized): (bool, bool),
    phase: &'static str,
) -> Case {
    Case {
        test,
        init,
        app,
        pod_is_terminal,
        pod_has_initialized,
        phase,
    }
}

/// Runs every row and reports all that differ at once.
fn check(spec: &PodSpec, cases: Vec<Case>) {
    let total = cases.len();
    let failed: Vec<String> = cases
        .into_iter()
        .filter_map(|c| {
            let got = pod_phase(
                spec,
                &c.init,
                &c.app,
                c.pod_is_terminal,
                c.pod_has_initialized,
            );
            (got != c.phase).then(|| format!("[test {}] expected {}, got {got}", c.test, c.phase))
        })
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {total} rows differ from upstream:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

const NOT: (bool, bool) = (false, false);
const INITIALIZED: (bool, bool) = (false, true);
const TERMINAL: (bool, bool) = (true, false);
const TERMINAL_INITIALIZED: (bool, bool) = (true, true);

// upstream: TestPodPhaseWithRestartAlways (podHasInitialized is false in every row).
#[test]
fn pod_phase_with_restart_always() {
    let spec = spec(vec![], &["containerA", "containerB"], "Always");
    let (a, b) = ("containerA", "containerB");
    check(
        &spec,
        vec![
            case("waiting", vec![], vec![], NOT, "Pending"),
            case(
                "all running",
                vec![],
                vec![running_state(a), running_state(b)],
                NOT,
                "Running",
            ),
            case(
                "all stopped with restart always",
                vec![],
                vec![stopped_state(a), stopped_state(b)],
                NOT,
                "Running",
            ),
            case(
                "all succeeded with restart always, but the pod is terminal",
                vec![],
                vec![succeeded_state(a), succeeded_state(b)],
                TERMINAL,
                "Succeeded",
            ),
            case(
                "all stopped with restart always, but the pod is terminal",
                vec![],
                vec![succeeded_state(a), failed_state(b)],
                TERMINAL,
                "Failed",
            ),
            case(
                "mixed state #1 with restart always",
                vec![],
                vec![running_state(a), stopped_state(b)],
                NOT,
                "Running",
            ),
            case(
                "mixed state #2 with restart always",
                vec![],
                vec![running_state(a)],
                NOT,
                "Pending",
            ),
            case(
                "mixed state #3 with restart always",
                vec![],
                vec![running_state(a), waiting_state(b)],
                NOT,
                "Pending",
            ),
            case(
                "backoff crashloop container with restart always",
                vec![],
                vec![running_state(a), waiting_state_with_last_termination(b)],
                NOT,
                "Running",
            ),
        ],
    );
}

// upstream: TestPodPhaseWithRestartAlwaysInitContainers (podIsTerminal and
// podHasInitialized are false in every row).
#[test]
fn pod_phase_with_restart_always_init_containers() {
    let spec = spec(
        vec![container("containerX")],
        &["containerA", "containerB"],
        "Always",
    );
    let (x, a, b) = ("containerX", "containerA", "containerB");
    check(
        &spec,
        vec![
            case("empty, waiting", vec![], vec![], NOT, "Pending"),
            case(
                "init container running",
                vec![running_state(x)],
                vec![],
                NOT,
                "Pending",
            ),
            case(
                "init container terminated non-zero",
                vec![failed_state(x)],
                vec![],
                NOT,
                "Pending",
            ),
            case(
                "init container waiting, terminated zero",
                vec![waiting_state_with_last_termination(x)],
                vec![],
                NOT,
                "Pending",
            ),
            case(
                "init container waiting, terminated non-zero",
                vec![waiting_state_with_non_zero_termination(x)],
                vec![],
                NOT,
                "Pending",
            ),
            case(
                "init container waiting, not terminated",
                vec![waiting_state(x)],
                vec![],
                NOT,
                "Pending",
            ),
            case(
                "init container succeeded",
                vec![succeeded_state(x)],
                vec![running_state(a), running_state(b)],
                NOT,
                "Running",
            ),
        ],
    );
}

// upstream: TestPodPhaseWithRestartAlwaysRestartableInitContainers.
#[test]
fn pod_phase_with_restart_always_restartable_init_containers() {
    let spec = spec(
        vec![sidecar("containerX")],
        &["containerA", "containerB"],
        "Always",
    );
    let (x, a, b) = ("containerX", "containerA", "containerB");
    check(
        &spec,
        vec![
            case("empty, waiting", vec![], vec![], NOT, "Pending"),
            case(
                "restartable init container running",
                vec![running_state(x)],
                vec![],
                NOT,
                "Pending",
            ),
            case(
                "restartable init container stopped",
                vec![stopped_state(x)],
                vec![],
                NOT,
                "Pending",
            ),
            case(
                "restartable init container waiting, terminated zero",
                vec![waiting_state_with_last_termination(x)],
                vec![],
                NOT,
                "Pending",
            ),
            case(
                "restartable init container waiting, terminated non-zero",
                vec![waiting_state_with_non_zero_termination(x)],
                vec![],
                NOT,
                "Pending",
            ),
            case(
                "restartable init container waiting, not terminated",
                vec![waiting_state(x)],
                vec![],
                NOT,
                "Pending",
            ),
            case(
                "restartable init container started, 1/2 regular container running",
                vec![started_state(x)],
                vec![running_state(a)],
                INITIALIZED,
                "Pending",
            ),
            case(
                "restartable init container started, all regular containers running",
                vec![started_state(x)],
                vec![running_state(a), running_state(b)],
                INITIALIZED,
                "Running",
            ),
            case(
                "restartable init container running, all regular containers running",
                vec![running_state(x)],
                vec![running_state(a), running_state(b)],
                INITIALIZED,
                "Running",
            ),
            case(
                "restartable init container stopped, all regular containers running",
                vec![stopped_state(x)],
                vec![running_state(a), running_state(b)],
                INITIALIZED,
                "Running",
            ),
            case(
                "backoff crashloop restartable init container, all regular containers running",
                vec![waiting_state_with_last_termination(x)],
                vec![running_state(a), running_state(b)],
                INITIALIZED,
                "Running",
            ),
            case(
                "all regular containers succeeded and restartable init container failed with \
                 restart always, but the pod is terminal",
                vec![failed_state(x)],
                vec![succeeded_state(a), succeeded_state(b)],
                TERMINAL_INITIALIZED,
                "Succeeded",
            ),
            case(
                "all regular containers succeeded and restartable init container succeeded \
                 with restart always, but the pod is terminal",
                vec![succeeded_state(x)],
                vec![succeeded_state(a), succeeded_state(b)],
                TERMINAL_INITIALIZED,
                "Succeeded",
            ),
            case(
                "re-initializing the pod after the sandbox is recreated",
                vec![running_state(x)],
                vec![running_state(a), running_state(b)],
                NOT,
                "Pending",
            ),
        ],
    );
}

// upstream: TestPodPhaseWithRestartAlwaysAndPodHasRun (podIsTerminal is false in every row).
#[test]
fn pod_phase_with_restart_always_and_pod_has_run() {
    let spec = spec(
        vec![container("containerX"), sidecar("containerY")],
        &["containerA"],
        "Always",
    );
    let (x, y, a) = ("containerX", "containerY", "containerA");
    check(
        &spec,
        vec![
            case(
                "regular init containers, restartable init container and regular container \
                 are all running",
                vec![running_state(x), running_state(y)],
                vec![running_state(a)],
                NOT,
                "Pending",
            ),
            case(
                "regular containers is stopped, restartable init container and regular int \
                 container are both running",
                vec![running_state(x), running_state(y)],
                vec![stopped_state(a)],
                NOT,
                "Pending",
            ),
            case(
                "re-created sandbox: regular init container is succeeded, restartable init \
                 container is running, old regular containers is stopped",
                vec![succeeded_state(x), running_state(y)],
                vec![stopped_state(a)],
                NOT,
                "Pending",
            ),
            case(
                "regular init container is succeeded, restartable init container is running, \
                 regular containers is stopped",
                vec![succeeded_state(x), running_state(y)],
                vec![stopped_state(a)],
                INITIALIZED,
                "Running",
            ),
            case(
                "regular init container is succeeded, restartable init container and regular \
                 containers are both running",
                vec![succeeded_state(x), running_state(y)],
                vec![running_state(a)],
                INITIALIZED,
                "Running",
            ),
        ],
    );
}

// upstream: TestPodPhaseWithRestartNever (podIsTerminal and podHasInitialized are false in
// every row).
#[test]
fn pod_phase_with_restart_never() {
    let spec = spec(vec![], &["containerA", "containerB"], "Never");
    let (a, b) = ("containerA", "containerB");
    check(
        &spec,
        vec![
            case("waiting", vec![], vec![], NOT, "Pending"),
            case(
                "all running with restart never",
                vec![],
                vec![running_state(a), running_state(b)],
                NOT,
                "Running",
            ),
            case(
                "all succeeded with restart never",
                vec![],
                vec![succeeded_state(a), succeeded_state(b)],
                NOT,
                "Succeeded",
            ),
            case(
                "all failed with restart never",
                vec![],
                vec![failed_state(a), failed_state(b)],
                NOT,
                "Failed",
            ),
            case(
                "mixed state #1 with restart never",
                vec![],
                vec![running_state(a), succeeded_state(b)],
                NOT,
                "Running",
            ),
            case(
                "mixed state #2 with restart never",
                vec![],
                vec![running_state(a)],
                NOT,
                "Pending",
            ),
            case(
                "mixed state #3 with restart never",
                vec![],
                vec![running_state(a), waiting_state(b)],
                NOT,
                "Pending",
            ),
        ],
    );
}

// upstream: TestPodPhaseWithRestartNeverInitContainers (podIsTerminal and
// podHasInitialized are false in every row).
#[test]
fn pod_phase_with_restart_never_init_containers() {
    let spec = spec(
        vec![container("containerX")],
        &["containerA", "containerB"],
        "Never",
    );
    let (x, a, b) = ("containerX", "containerA", "containerB");
    check(
        &spec,
        vec![
            case("empty, waiting", vec![], vec![], NOT, "Pending"),
            case(
                "init container running",
                vec![running_state(x)],
                vec![],
                NOT,
                "Pending",
            ),
            case(
                "init container terminated non-zero",
                vec![failed_state(x)],
                vec![],
                NOT,
                "Failed",
            ),
            case(
                "init container waiting, terminated zero",
                vec![waiting_state_with_last_termination(x)],
                vec![],
                NOT,
                "Pending",
            ),
            case(
                "init container waiting, terminated non-zero",
                vec![waiting_state_with_non_zero_termination(x)],
                vec![],
                NOT,
                "Failed",
            ),
            case(
                "init container waiting, not terminated",
                vec![waiting_state(x)],
                vec![],
                NOT,
                "Pending",
            ),
            case(
                "init container succeeded",
                vec![succeeded_state(x)],
                vec![running_state(a), running_state(b)],
                NOT,
                "Running",
            ),
        ],
    );
}

// upstream: TestPodPhaseWithRestartNeverRestartableInitContainers (podIsTerminal is false
// in every row).
#[test]
fn pod_phase_with_restart_never_restartable_init_containers() {
    let spec = spec(
        vec![sidecar("containerX")],
        &["containerA", "containerB"],
        "Never",
    );
    let (x, a, b) = ("containerX", "containerA", "containerB");
    check(
        &spec,
        vec![
            case("empty, waiting", vec![], vec![], NOT, "Pending"),
            case(
                "restartable init container running",
                vec![running_state(x)],
                vec![],
                NOT,
                "Pending",
            ),
            case(
                "restartable init container stopped",
                vec![stopped_state(x)],
                vec![],
                NOT,
                "Pending",
            ),
            case(
                "restartable init container waiting, terminated zero",
                vec![waiting_state_with_last_termination(x)],
                vec![],
                NOT,
                "Pending",
            ),
            case(
                "restartable init container waiting, terminated non-zero",
                vec![waiting_state_with_non_zero_termination(x)],
                vec![],
                NOT,
                "Pending",
            ),
            case(
                "restartable init container waiting, not terminated",
                vec![waiting_state(x)],
                vec![],
                NOT,
                "Pending",
            ),
            case(
                "restartable init container started, one main container running",
                vec![started_state(x)],
                vec![running_state(a)],
                INITIALIZED,
                "Pending",
            ),
            case(
                "restartable init container started, main containers succeeded",
                vec![started_state(x)],
                vec![succeeded_state(a), succeeded_state(b)],
                INITIALIZED,
                "Running",
            ),
            case(
                "restartable init container re-running, main containers succeeded",
                vec![running_state(x)],
                vec![succeeded_state(a), succeeded_state(b)],
                INITIALIZED,
                "Running",
            ),
            case(
                "all containers succeeded",
                vec![succeeded_state(x)],
                vec![succeeded_state(a), succeeded_state(b)],
                INITIALIZED,
                "Succeeded",
            ),
            case(
                "restartable init container terminated non-zero, main containers succeeded",
                vec![failed_state(x)],
                vec![succeeded_state(a), succeeded_state(b)],
                INITIALIZED,
                "Succeeded",
            ),
            case(
                "backoff crashloop restartable init container, main containers succeeded",
                vec![waiting_state_with_last_termination(x)],
                vec![succeeded_state(a), succeeded_state(b)],
                INITIALIZED,
                "Succeeded",
            ),
            case(
                "backoff crashloop with non-zero restartable init container, main containers \
                 succeeded",
                vec![waiting_state_with_non_zero_termination(x)],
                vec![succeeded_state(a), succeeded_state(b)],
                INITIALIZED,
                "Succeeded",
            ),
        ],
    );
}

// upstream: TestPodPhaseWithRestartOnFailure (podIsTerminal and podHasInitialized are
// false in every row).
#[test]
fn pod_phase_with_restart_on_failure() {
    let spec = spec(vec![], &["containerA", "containerB"], "OnFailure");
    let (a, b) = ("containerA", "containerB");
    check(
        &spec,
        vec![
            case("waiting", vec![], vec![], NOT, "Pending"),
            case(
                "all running with restart onfailure",
                vec![],
                vec![running_state(a), running_state(b)],
                NOT,
                "Running",
            ),
            case(
                "all succeeded with restart onfailure",
                vec![],
                vec![succeeded_state(a), succeeded_state(b)],
                NOT,
                "Succeeded",
            ),
            // (sic: upstream's description says "never"; the pod's policy is OnFailure.)
            case(
                "all failed with restart never",
                vec![],
                vec![failed_state(a), failed_state(b)],
                NOT,
                "Running",
            ),
            case(
                "mixed state #1 with restart onfailure",
                vec![],
                vec![running_state(a), succeeded_state(b)],
                NOT,
                "Running",
            ),
            case(
                "mixed state #2 with restart onfailure",
                vec![],
                vec![running_state(a)],
                NOT,
                "Pending",
            ),
            case(
                "mixed state #3 with restart onfailure",
                vec![],
                vec![running_state(a), waiting_state(b)],
                NOT,
                "Pending",
            ),
            case(
                "backoff crashloop container with restart onfailure",
                vec![],
                vec![running_state(a), waiting_state_with_last_termination(b)],
                NOT,
                "Running",
            ),
        ],
    );
}

/// A regular or init container with its own `restartPolicy` (upstream's
/// `containerRestartPolicy*`, the ContainerRestartRules feature).
fn with_policy(name: &str, policy: &str) -> Container {
    Container {
        restart_policy: Some(policy.into()),
        ..container(name)
    }
}

/// A pod of `containers` (each with its own policy, or none) under `restart_policy`.
fn spec_with(init: Vec<Container>, containers: Vec<Container>, restart_policy: &str) -> PodSpec {
    PodSpec {
        containers,
        ..spec(init, &[], restart_policy)
    }
}

// upstream: TestPodPhaseWithContainerRestartPolicy, its 6 rows (podIsTerminal false,
// podHasInitialized true): a regular container's own policy decides whether it runs
// again, whatever the pod's.
#[test]
fn pod_phase_with_container_restart_policy() {
    let one = |policy: &str| {
        spec_with(
            vec![],
            vec![with_policy("failed-container", policy)],
            "Always",
        )
    };
    let failed = || vec![failed_state("failed-container")];
    check(
        &one("Never"),
        vec![case(
            "container with restart policy Never failed",
            vec![],
            failed(),
            INITIALIZED,
            "Failed",
        )],
    );
    check(
        &one("OnFailure"),
        vec![case(
            "container with restart policy OnFailure failed",
            vec![],
            failed(),
            INITIALIZED,
            "Running",
        )],
    );
    check(
        &one("Always"),
        vec![case(
            "container with restart policy Always failed",
            vec![],
            failed(),
            INITIALIZED,
            "Running",
        )],
    );
    let (a, b) = ("containerA", "containerB");
    check(
        &spec_with(
            vec![],
            vec![with_policy(a, "Always"), container(b)],
            "Never",
        ),
        vec![case(
            "At least one container with restartable container-level restart policy failed",
            vec![],
            vec![succeeded_state(a), failed_state(b)],
            INITIALIZED,
            "Running",
        )],
    );
    let never_and_on_failure = spec_with(
        vec![],
        vec![with_policy(a, "Never"), with_policy(b, "OnFailure")],
        "Always",
    );
    check(
        &never_and_on_failure,
        vec![
            case(
                "All containers without restartable container-level restart policy failed",
                vec![],
                vec![failed_state(a), succeeded_state(b)],
                INITIALIZED,
                "Failed",
            ),
            case(
                "All containers succeeded",
                vec![],
                vec![succeeded_state(a), succeeded_state(b)],
                INITIALIZED,
                "Succeeded",
            ),
        ],
    );
}

// upstream: TestPodPhaseWithContainerRestartPolicyInitContainers, its 3 rows (upstream
// passes all statuses in one list, podHasInitialized true, podIsTerminal false): a regular
// init container's own policy decides whether its failure fails the pod; one with
// `restartPolicy: Always` is a sidecar.
#[test]
fn pod_phase_with_container_restart_policy_init_containers() {
    let failed = || vec![failed_state("failed-container")];
    check(
        &spec(
            vec![with_policy("failed-container", "Never")],
            &["container"],
            "Always",
        ),
        vec![case(
            "init container with restart policy Never failed",
            failed(),
            vec![],
            INITIALIZED,
            "Failed",
        )],
    );
    check(
        &spec(
            vec![with_policy("failed-container", "OnFailure")],
            &["container"],
            "Never",
        ),
        vec![case(
            "init container with restart policy OnFailure failed",
            failed(),
            vec![],
            INITIALIZED,
            "Pending",
        )],
    );
    check(
        &spec(vec![sidecar("failed-container")], &["container"], "Never"),
        vec![case(
            "container with restart policy Always failed",
            failed(),
            vec![],
            INITIALIZED,
            "Pending",
        )],
    );
}

// upstream: TestPodPhaseWithRestartAllContainers: none of its 15 rows is ported. Every row's
// container carries `restartPolicyRules` with action RestartAllContainers (the alpha
// RestartAllContainersOnContainerExits feature), and its statuses carry upstream's
// RestartingAllContainers reason; pod-sync implements neither.

// The terminal phase is sticky: upstream `IsPodPhaseTerminal` (pkg/api/v1/pod/util.go),
// the three-way merge of `generateAPIPodStatus` and the early return of `SyncPod`
// (kubelet.go) for a pod whose merged phase is terminal.
mod terminal {
    use super::super::{is_terminal, keep_terminal, may_start};

    #[test]
    fn only_succeeded_and_failed_are_terminal() {
        // upstream IsPodPhaseTerminal: phase == PodFailed || phase == PodSucceeded.
        for (phase, terminal) in [
            (Some("Succeeded"), true),
            (Some("Failed"), true),
            (Some("Running"), false),
            (Some("Pending"), false),
            (Some("Unknown"), false),
            (Some(""), false),
            (None, false),
        ] {
            assert_eq!(is_terminal(phase), terminal, "{phase:?}");
        }
    }

    // Rows of upstream Test_generateAPIPodStatus (pkg/kubelet/kubelet_pods_test.go), phase
    // only: (description, phase getPhase computes from the runtime, status manager's phase,
    // API server's phase, expected).
    #[test]
    fn upstream_generate_api_pod_status_rows() {
        type Row = (
            &'static str,
            &'static str,
            Option<&'static str>,
            Option<&'static str>,
            &'static str,
        );
        let rows: [Row; 4] = [
            (
                // Runtime empty, previous statuses running: getPhase says Running
                // (restartAlways, containers waiting to restart); the API says Succeeded.
                "terminal phase cannot be changed (apiserver previous is succeeded)",
                "Running",
                Some(""),
                Some("Succeeded"),
                "Succeeded",
            ),
            (
                "terminal phase from previous status must remain terminal, restartAlways",
                "Running",
                Some("Succeeded"),
                Some("Running"),
                "Succeeded",
            ),
            (
                "terminal phase from previous status must remain terminal, restartNever",
                "Succeeded",
                Some("Succeeded"),
                Some("Running"),
                "Succeeded",
            ),
            (
                "running can revert to pending",
                "Pending",
                Some(""),
                Some("Running"),
                "Pending",
            ),
        ];
        for (name, computed, published, api, expected) in rows {
            assert_eq!(keep_terminal(computed, published, api), expected, "{name}");
        }
    }

    #[test]
    fn the_status_managers_terminal_phase_wins_over_the_api_servers() {
        // upstream's switch tests oldPodStatus first, pod.Status second.
        assert_eq!(
            keep_terminal("Pending", Some("Failed"), Some("Succeeded")),
            "Failed"
        );
        assert_eq!(keep_terminal("Pending", None, Some("Failed")), "Failed");
        // A computed terminal phase is kept as it is.
        assert_eq!(keep_terminal("Failed", Some("Succeeded"), None), "Failed");
        assert_eq!(keep_terminal("Running", None, None), "Running");
    }

    #[test]
    fn a_pod_known_finished_never_starts_again() {
        for (published, api, start) in [
            (None, None, true),
            (None, Some("Pending"), true), // a static pod's manifest says Pending
            (Some("Pending"), Some("Pending"), true),
            (Some("Running"), Some("Running"), true),
            (Some("Succeeded"), None, false),
            (Some("Failed"), Some("Pending"), false),
            // A restarted pod-sync: nothing published yet, the API server's copy is terminal
            // (upstream pod_workers UpdatePod treats the pod as terminated).
            (None, Some("Succeeded"), false),
            (None, Some("Failed"), false),
            // Our own status is terminal, the API server has not caught up yet.
            (Some("Succeeded"), Some("Running"), false),
        ] {
            assert_eq!(may_start(published, api), start, "{published:?} {api:?}");
        }
    }
}
