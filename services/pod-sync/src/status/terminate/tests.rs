//! upstream: pkg/kubelet/status/status_manager_test.go TestTerminatePod_DefaultUnknownStatus,
//! its 14 cases under their names (the first three have none upstream: "phase ..."
//! below), and TestTerminatePod's container part. Upstream's table also checks the
//! phase, which `compute` decides here (its rows are in `status/tests.rs`); these check
//! the containers.

use super::*;
use k8s_openapi::api::core::v1::{Container, ContainerStateRunning, ContainerStateWaiting};

fn spec(init: usize, containers: usize) -> PodSpec {
    PodSpec {
        init_containers: Some(
            (0..init)
                .map(|i| Container {
                    name: format!("init-{i}"),
                    ..Default::default()
                })
                .collect(),
        ),
        containers: (0..containers)
            .map(|i| Container {
                name: i.to_string(),
                ..Default::default()
            })
            .collect(),
        restart_policy: Some("Never".into()),
        ..Default::default()
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum St {
    /// `State: {}` (no state at all).
    Empty,
    Waiting,
    Running,
    Terminated(i32),
    /// Waiting, with a last termination with this exit code.
    WaitingAfter(i32),
    /// No state, with a last termination with this exit code.
    EmptyAfter(i32),
}

fn status(name: &str, st: St) -> ContainerStatus {
    let term = |code| ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code: code,
            reason: Some("Test".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let wait = ContainerState {
        waiting: Some(ContainerStateWaiting::default()),
        ..Default::default()
    };
    let (state, last) = match st {
        St::Empty => (ContainerState::default(), None),
        St::Waiting => (wait, None),
        St::Running => (
            ContainerState {
                running: Some(ContainerStateRunning::default()),
                ..Default::default()
            },
            None,
        ),
        St::Terminated(c) => (term(c), None),
        St::WaitingAfter(c) => (wait, Some(term(c))),
        St::EmptyAfter(c) => (ContainerState::default(), Some(term(c))),
    };
    ContainerStatus {
        name: name.into(),
        state: Some(state),
        last_state: last,
        ..Default::default()
    }
}

/// What a state is after `terminate`: Unknown (upstream's `expectTerminatedUnknown`),
/// Terminated(code) or Waiting.
#[derive(Debug, PartialEq)]
enum Want {
    Unknown,
    Terminated(i32),
    Waiting,
}

fn seen(s: &ContainerStatus) -> Want {
    let st = s.state.clone().unwrap_or_default();
    match (&st.waiting, &st.running, &st.terminated) {
        (None, None, Some(t))
            if t.exit_code == 137
                && t.reason.as_deref() == Some(STATUS_UNKNOWN)
                && t.message.as_deref().is_some_and(|m| !m.is_empty()) =>
        {
            Want::Unknown
        }
        (None, None, Some(t)) => Want::Terminated(t.exit_code),
        (Some(_), None, None) => Want::Waiting,
        _ => panic!("unexpected state {st:?}"),
    }
}

struct Case {
    name: &'static str,
    init: Vec<St>,
    app: Vec<St>,
    want_init: Vec<Want>,
    want_app: Vec<Want>,
}

fn run(cases: Vec<Case>) {
    let mut failed = Vec::new();
    for c in &cases {
        let spec = spec(c.init.len(), c.app.len());
        let mut init: Vec<ContainerStatus> = c
            .init
            .iter()
            .enumerate()
            .map(|(i, st)| status(&format!("init-{i}"), *st))
            .collect();
        let mut app: Vec<ContainerStatus> = c
            .app
            .iter()
            .enumerate()
            .map(|(i, st)| status(&i.to_string(), *st))
            .collect();
        terminate(&spec, &mut init, &mut app);
        let got_init: Vec<Want> = init.iter().map(seen).collect();
        let got_app: Vec<Want> = app.iter().map(seen).collect();
        if got_init != c.want_init || got_app != c.want_app {
            failed.push(format!(
                "{}: want {:?} {:?}, got {:?} {:?}",
                c.name, c.want_init, c.want_app, got_init, got_app
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

fn case(
    name: &'static str,
    init: &[St],
    app: &[St],
    want_init: Vec<Want>,
    want_app: Vec<Want>,
) -> Case {
    Case {
        name,
        init: init.to_vec(),
        app: app.to_vec(),
        want_init,
        want_app,
    }
}

#[test]
fn test_terminate_pod_default_unknown_status() {
    use St::*;
    use Want::{Terminated as T, Unknown as U, Waiting as W};
    let cases = vec![
        // Upstream's first three rows have no name and check only the phase: no
        // container status (the first two), and one that terminated, which stays.
        case("phase Failed, no statuses", &[], &[], vec![], vec![]),
        case("phase Running, no statuses", &[], &[], vec![], vec![]),
        case(
            "phase Running, one terminated",
            &[],
            &[Terminated(2)],
            vec![],
            vec![T(2)],
        ),
        case(
            "last termination state set",
            &[],
            &[WaitingAfter(2)],
            vec![],
            vec![U],
        ),
        case("no previous state", &[], &[Waiting], vec![], vec![U]),
        case(
            "uninitialized pod defaults the first init container",
            &[Waiting],
            &[Waiting],
            vec![U],
            vec![W],
        ),
        case(
            "uninitialized pod defaults only the first init container",
            &[Waiting, Waiting],
            &[Waiting],
            vec![U, W],
            vec![W],
        ),
        case(
            "uninitialized pod defaults gaps",
            &[Waiting, Waiting, Terminated(1), Waiting],
            &[Waiting],
            vec![U, U, T(1), W],
            vec![W],
        ),
        case(
            "failed last container is uninitialized",
            &[Waiting, Waiting, Terminated(1)],
            &[Waiting],
            vec![U, U, T(1)],
            vec![W],
        ),
        case(
            "successful last container is initialized",
            &[Waiting, Waiting, Terminated(0)],
            &[Waiting],
            vec![U, U, T(0)],
            vec![U],
        ),
        case(
            "successful last previous container is initialized, and container state is overwritten",
            &[Waiting, Waiting, WaitingAfter(0)],
            &[Waiting],
            vec![U, U, U],
            vec![U],
        ),
        case(
            "running container proves initialization",
            &[Waiting],
            &[Running],
            vec![U],
            vec![U],
        ),
        case(
            "evidence of terminated container proves initialization",
            &[Waiting],
            &[Terminated(0)],
            vec![U],
            vec![T(0)],
        ),
        case(
            "evidence of previously terminated container proves initialization",
            &[Waiting],
            &[EmptyAfter(0)],
            vec![U],
            vec![U],
        ),
    ];
    run(cases);
}

// upstream: TestTerminatePodWaiting (its container checks): init containers "not
// started, done, waiting" become unknown, kept, kept (the waiting one is the suffix that
// never tried); containers "not started, done, waiting" become unknown, kept, unknown.
#[test]
fn test_terminate_pod_waiting() {
    use St::*;
    use Want::{Terminated as T, Unknown as U, Waiting as W};
    run(vec![case(
        "TestTerminatePodWaiting",
        &[Empty, Terminated(0), Waiting],
        &[Empty, Terminated(2), Waiting],
        vec![U, T(0), W],
        vec![U, T(2), U],
    )]);
}

// upstream: TestTerminatePod (its container checks): init-test-1 with no state, init-test-2
// and -3 terminated (InitTest, 0 and 3); test-1 with no state, test-2 and -3 terminated
// (Test, 2 and 0). The two without a state become ContainerStatusUnknown (137), the
// others keep their terminations. (Its phase check, a Failed status kept over a stale
// Running one, is `compute`'s: `status/tests.rs`.)
#[test]
fn test_terminate_pod() {
    use St::*;
    use Want::{Terminated as T, Unknown as U};
    run(vec![case(
        "TestTerminatePod",
        &[Empty, Terminated(0), Terminated(3)],
        &[Empty, Terminated(2), Terminated(0)],
        vec![U, T(0), T(3)],
        vec![U, T(2), T(0)],
    )]);
}
