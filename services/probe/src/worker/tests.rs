//! Upstream's `pkg/kubelet/prober/worker_test.go`, case by case, under its names, against
//! the pure worker. Upstream's fixtures (`common_test.go`) are kept: one container
//! `cOnTaInEr_NaMe` with ID `test://cOnTaInEr_Id`, restart policy Never, probes defaulting
//! to period 1, timeout 1 and thresholds 1; the fake exec prober is the value handed to
//! `after_probe`. Upstream's `resultsManager.Get(testContainerID)` is the state's `result`
//! while it follows that container.
//!
//! Not ported, with the reason: `TestCleanUp` and `TestHandleCrash` drive the worker's
//! goroutine; the manager's own test (`manager::tests::a_removed_pod_ends_its_workers_and_results`)
//! covers the clean-up on a real worker task, and a Rust worker does not recover from a
//! panic (the task ends; see the manager).

use super::*;
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ExecAction, PodSpec, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

fn now() -> Timestamp {
    Timestamp::now()
}

const NAME: &str = "cOnTaInEr_NaMe";
const ID: &str = "test://cOnTaInEr_Id";
const KINDS: [Kind; 3] = [Kind::Liveness, Kind::Readiness, Kind::Startup];

/// Upstream's `setTestProbe` defaults: exec, timeout and period 1, thresholds 1.
fn probe(mut p: Probe) -> Probe {
    p.exec = Some(ExecAction::default());
    for (field, default) in [
        (&mut p.timeout_seconds, 1),
        (&mut p.period_seconds, 1),
        (&mut p.success_threshold, 1),
        (&mut p.failure_threshold, 1),
    ] {
        if field.unwrap_or(0) == 0 {
            *field = Some(default);
        }
    }
    p
}

/// Upstream's `getTestRunningStatusWithStarted`.
fn running_status(started: bool) -> PodStatus {
    PodStatus {
        phase: Some("Running".into()),
        container_statuses: Some(vec![ContainerStatus {
            name: NAME.into(),
            container_id: Some(ID.into()),
            state: Some(ContainerState {
                running: Some(ContainerStateRunning {
                    started_at: Some(Time(now())),
                }),
                ..Default::default()
            }),
            started: Some(started),
            ..Default::default()
        }]),
        ..Default::default()
    }
}

/// A worker of upstream's test pod (`getTestPod`, `newTestWorker`), the status its status
/// manager holds, and the fake prober's answer.
struct Harness {
    state: WorkerState,
    pod: Pod,
    status: Option<PodStatus>,
    prober: Value,
}

impl Harness {
    fn new(kind: Kind, p: Probe) -> Self {
        let p = probe(p);
        let mut container = Container {
            name: NAME.into(),
            ..Default::default()
        };
        match kind {
            Kind::Readiness => container.readiness_probe = Some(p.clone()),
            Kind::Liveness => container.liveness_probe = Some(p.clone()),
            _ => container.startup_probe = Some(p.clone()),
        }
        let state = WorkerState::new(kind, &p, &container);
        let mut pod = Pod::default();
        pod.metadata.name = Some("testPod".into());
        pod.metadata.uid = Some("pOd_UiD".into());
        pod.spec = Some(PodSpec {
            containers: vec![container],
            restart_policy: Some("Never".into()),
            ..Default::default()
        });
        Self {
            state,
            pod,
            status: None,
            prober: Value::Success,
        }
    }

    /// Upstream's `w.doProbe()`: true to go on.
    fn do_probe(&mut self) -> bool {
        let pod = self.status.clone().map(|status| Pod {
            status: Some(status),
            ..self.pod.clone()
        });
        match self
            .state
            .before_probe(NAME, pod.as_ref(), SystemTime::now())
            .0
        {
            Next::Stop => false,
            Next::Wait => true,
            Next::Probe { container_id } => {
                let followed = self.state.container_id.as_deref().unwrap_or_default();
                assert_eq!(
                    format!("test://{container_id}"),
                    followed,
                    "the ID, no scheme"
                );
                self.state.after_probe(self.prober);
                true
            }
        }
    }

    /// Upstream's `resultsManager.Get(id)`.
    fn get(&self, id: &str) -> Option<Value> {
        (self.state.container_id.as_deref() == Some(id))
            .then_some(self.state.result)
            .flatten()
    }

    /// Upstream's `expectContinue` and `expectResult` (against the worker's container).
    fn expect(&mut self, want: Value, msg: &str) {
        let kind = self.state.kind;
        assert!(self.do_probe(), "[{kind:?} - {msg}] expected to continue");
        let id = self.state.container_id.clone().unwrap_or_default();
        assert_eq!(self.get(&id), Some(want), "[{kind:?} - {msg}]");
    }
}

#[test]
fn test_do_probe() {
    struct Row {
        what: &'static str,
        probe: Probe,
        status: Option<fn(bool) -> PodStatus>,
        deletion: bool,
        /// expectContinue for liveness, readiness, startup.
        cont: [bool; 3],
        /// expectSet and expectedResult.
        set: Option<Value>,
    }
    fn pending(started: bool) -> PodStatus {
        let mut s = running_status(started);
        s.container_statuses.as_mut().unwrap()[0].state = Some(ContainerState::default());
        s
    }
    fn terminated(started: bool) -> PodStatus {
        let mut s = running_status(started);
        s.container_statuses.as_mut().unwrap()[0].state = Some(ContainerState {
            terminated: Some(ContainerStateTerminated {
                started_at: Some(Time(now())),
                ..Default::default()
            }),
            ..Default::default()
        });
        s
    }
    fn other(started: bool) -> PodStatus {
        let mut s = running_status(started);
        s.container_statuses.as_mut().unwrap()[0].name = "otherContainer".into();
        s
    }
    fn failed(started: bool) -> PodStatus {
        PodStatus {
            phase: Some("Failed".into()),
            ..running_status(started)
        }
    }
    let rows = [
        Row {
            what: "No status.",
            probe: Probe::default(),
            status: None,
            deletion: false,
            cont: [true, true, true],
            set: None,
        },
        Row {
            what: "Pod failed",
            probe: Probe::default(),
            status: Some(failed),
            deletion: false,
            cont: [false, false, false],
            set: None,
        },
        Row {
            what: "Pod deletion",
            probe: Probe::default(),
            status: Some(running_status),
            deletion: true,
            cont: [false, true, false],
            set: Some(Value::Success),
        },
        Row {
            what: "No container status",
            probe: Probe::default(),
            status: Some(other),
            deletion: false,
            cont: [true, true, true],
            set: None,
        },
        Row {
            what: "Container waiting",
            probe: Probe::default(),
            status: Some(pending),
            deletion: false,
            cont: [true, true, true],
            set: Some(Value::Failure),
        },
        Row {
            what: "Container terminated",
            probe: Probe::default(),
            status: Some(terminated),
            deletion: false,
            cont: [false, false, false],
            set: Some(Value::Failure),
        },
        Row {
            what: "Probe successful.",
            probe: Probe::default(),
            status: Some(running_status),
            deletion: false,
            cont: [true, true, true],
            set: Some(Value::Success),
        },
        Row {
            what: "Initial delay passed",
            probe: Probe {
                initial_delay_seconds: Some(-100),
                ..Default::default()
            },
            status: Some(running_status),
            deletion: false,
            cont: [true, true, true],
            set: Some(Value::Success),
        },
    ];
    for (k, kind) in KINDS.into_iter().enumerate() {
        for (i, row) in rows.iter().enumerate() {
            let mut h = Harness::new(kind, row.probe.clone());
            // Upstream: started unless this is the startup probe's worker.
            h.status = row.status.map(|s| s(kind != Kind::Startup));
            if row.deletion {
                h.pod.metadata.deletion_timestamp = Some(Time(now()));
            }
            let what = format!("[{kind:?}-{i}] {}", row.what);
            assert_eq!(h.do_probe(), row.cont[k], "{what}: continue");
            assert_eq!(h.get(ID), row.set, "{what}: result");
        }
    }
}

#[test]
fn test_initial_delay() {
    for kind in KINDS {
        let mut h = Harness::new(
            kind,
            Probe {
                initial_delay_seconds: Some(10),
                ..Default::default()
            },
        );
        h.status = Some(running_status(kind != Kind::Startup));
        // The default value depends on the probe: Success for liveness, Failure for
        // readiness, Unknown for startup.
        h.expect(initial_value(kind), "during initial delay");
        // 100 seconds later...
        let mut later = running_status(kind != Kind::Startup);
        later.container_statuses.as_mut().unwrap()[0]
            .state
            .as_mut()
            .unwrap()
            .running = Some(ContainerStateRunning {
            started_at: Some(Time(
                now() - k8s_openapi::jiff::SignedDuration::from_secs(100),
            )),
        });
        h.status = Some(later);
        // The second call succeeds (already waited).
        h.expect(Value::Success, "after initial delay");
    }
}

#[test]
fn test_failure_threshold() {
    let mut h = Harness::new(
        Kind::Readiness,
        Probe {
            success_threshold: Some(1),
            failure_threshold: Some(3),
            ..Default::default()
        },
    );
    h.status = Some(running_status(true));
    for i in 0..2 {
        // The first probes succeed.
        h.prober = Value::Success;
        for j in 0..3 {
            h.expect(Value::Success, &format!("{} success ({i})", j + 1));
        }
        // The prober starts failing: the next 2 probes are still "success".
        h.prober = Value::Failure;
        for j in 0..2 {
            h.expect(Value::Success, &format!("{} failing ({i})", j + 1));
        }
        // The third and following fail.
        for j in 0..3 {
            h.expect(Value::Failure, &format!("{} failure ({i})", j + 3));
        }
    }
}

#[test]
fn test_success_threshold() {
    let mut h = Harness::new(
        Kind::Readiness,
        Probe {
            success_threshold: Some(3),
            failure_threshold: Some(1),
            ..Default::default()
        },
    );
    h.status = Some(running_status(true));
    // Starts out failure (readiness' initial value).
    for i in 0..2 {
        // The probe defaults to Failure.
        for j in 0..2 {
            h.expect(Value::Failure, &format!("{} success ({i})", j + 1));
        }
        // Continuing success!
        for j in 0..3 {
            h.expect(Value::Success, &format!("{} success ({i})", j + 3));
        }
        // The prober flakes.
        h.prober = Value::Failure;
        h.expect(Value::Failure, &format!("1 failure ({i})"));
        // Back to success.
        h.prober = Value::Success;
    }
}

#[test]
fn test_startup_probe_success_threshold() {
    let (success_threshold, failure_threshold) = (1, 3);
    let mut h = Harness::new(
        Kind::Startup,
        Probe {
            success_threshold: Some(success_threshold),
            failure_threshold: Some(failure_threshold),
            ..Default::default()
        },
    );
    h.status = Some(running_status(false));
    h.prober = Value::Success;
    for i in 0..=success_threshold {
        if i < success_threshold {
            // Not on hold: it runs until successThreshold is met.
            assert!(!h.state.on_hold, "should not be on hold");
            h.expect(Value::Success, &format!("{} success", i + 1));
        } else {
            // On hold once successThreshold is met, and resultRun back to 0.
            assert!(h.state.on_hold, "on hold: successThreshold is exceeded");
            assert_eq!(h.state.result_run, 0);
        }
    }
}

#[test]
fn test_startup_probe_failure_threshold() {
    let (success_threshold, failure_threshold) = (1, 3);
    let mut h = Harness::new(
        Kind::Startup,
        Probe {
            success_threshold: Some(success_threshold),
            failure_threshold: Some(failure_threshold),
            ..Default::default()
        },
    );
    h.status = Some(running_status(false));
    h.prober = Value::Failure;
    for i in 0..=failure_threshold as u32 {
        if i < failure_threshold as u32 {
            assert!(!h.state.on_hold, "should not be on hold");
            let msg = format!("{} failure", i + 1);
            match i {
                // Unknown until failureThreshold is reached; resultRun counts up.
                0 | 1 => {
                    h.expect(Value::Unknown, &msg);
                    assert_eq!(h.state.result_run, i + 1, "{msg}");
                }
                // Failure once it is, and resultRun back to 0.
                _ => {
                    h.expect(Value::Failure, &msg);
                    assert_eq!(h.state.result_run, 0, "{msg}");
                }
            }
        } else {
            assert!(h.state.on_hold, "on hold: failureThreshold is exceeded");
            assert_eq!(h.state.result_run, 0);
        }
    }
}

#[test]
fn test_on_hold_on_liveness_or_startup_check_failure() {
    for kind in [Kind::Liveness, Kind::Startup] {
        let mut h = Harness::new(
            kind,
            Probe {
                success_threshold: Some(1),
                failure_threshold: Some(1),
                ..Default::default()
            },
        );
        let mut status = running_status(kind != Kind::Startup);
        h.status = Some(status.clone());
        // The first probe fails.
        h.prober = Value::Failure;
        h.expect(Value::Failure, "first probe");
        assert!(h.state.on_hold, "{kind:?}: on hold after the failure");
        // The prober would succeed now, but the worker is on hold and does not probe.
        h.prober = Value::Success;
        h.expect(Value::Failure, "while on hold");
        assert!(h.state.on_hold, "{kind:?}: on hold after the failure");
        // A new container ID lifts the hold; the next probe succeeds.
        status.container_statuses.as_mut().unwrap()[0].container_id =
            Some("test://newCont_ID".into());
        h.status = Some(status);
        h.expect(Value::Success, "hold lifted");
        match kind {
            Kind::Liveness => assert!(!h.state.on_hold, "no longer on hold"),
            _ => assert!(
                h.state.on_hold,
                "on hold again: the startup probe succeeded"
            ),
        }
    }
}

#[test]
fn test_result_run_on_liveness_check_failure() {
    let mut h = Harness::new(
        Kind::Liveness,
        Probe {
            success_threshold: Some(1),
            failure_threshold: Some(3),
            ..Default::default()
        },
    );
    h.status = Some(running_status(true));
    h.prober = Value::Success;
    h.expect(Value::Success, "initial probe success");
    assert_eq!(h.state.result_run, 1);
    h.prober = Value::Failure;
    h.expect(Value::Success, "probe failure, result success");
    assert_eq!(h.state.result_run, 1);
    h.expect(Value::Success, "2nd probe failure, result success");
    assert_eq!(h.state.result_run, 2);
    // Reaching failureThreshold resets resultRun, so that the restarted container gets
    // failureThreshold attempts too.
    h.expect(Value::Failure, "3rd probe failure, result failure");
    assert_eq!(h.state.result_run, 0);
}

#[test]
fn test_result_run_on_startup_check_failure() {
    let mut h = Harness::new(
        Kind::Startup,
        Probe {
            success_threshold: Some(1),
            failure_threshold: Some(3),
            ..Default::default()
        },
    );
    h.status = Some(running_status(false));
    // Below failureThreshold the value stays: Unknown, for startup.
    h.prober = Value::Failure;
    h.expect(Value::Unknown, "probe failure, result unknown");
    assert_eq!(h.state.result_run, 1);
    h.expect(Value::Unknown, "2nd probe failure, result unknown");
    assert_eq!(h.state.result_run, 2);
    h.expect(Value::Failure, "3rd probe failure, result failure");
    assert_eq!(h.state.result_run, 0);
}

#[test]
fn test_liveness_probe_disabled_by_started() {
    let mut h = Harness::new(
        Kind::Liveness,
        Probe {
            success_threshold: Some(1),
            failure_threshold: Some(1),
            ..Default::default()
        },
    );
    h.status = Some(running_status(false));
    // The liveness probe would fail, but it is disabled until the container started.
    h.prober = Value::Failure;
    h.expect(Value::Success, "Not started, probe failure, result success");
    // Started (upstream's SetContainerStartup): it runs, and fails.
    h.status = Some(running_status(true));
    h.expect(Value::Failure, "Started, probe failure, result failure");
}

#[test]
fn test_startup_probe_disabled_by_started() {
    let mut h = Harness::new(
        Kind::Startup,
        Probe {
            success_threshold: Some(1),
            failure_threshold: Some(2),
            ..Default::default()
        },
    );
    h.status = Some(running_status(false));
    // Fails below failureThreshold: stays Unknown.
    h.prober = Value::Failure;
    h.expect(Value::Unknown, "Not started, probe failure, result unknown");
    h.prober = Value::Success;
    h.expect(Value::Success, "Started, probe success, result success");
    // Started: the startup probe no longer runs, a failure changes nothing.
    h.status = Some(running_status(true));
    h.prober = Value::Failure;
    h.expect(Value::Success, "Started, probe failure, result success");
}

// ---- Ours: what pod-sync is told (upstream's results manager tells the kubelet of every
// change; pod-sync keeps its values across a restart of either service, so the initial
// value is never told).

#[test]
fn a_new_container_is_told_its_first_decided_value_never_its_initial_one() {
    let mut h = Harness::new(
        Kind::Readiness,
        Probe {
            failure_threshold: Some(2),
            ..Default::default()
        },
    );
    h.status = Some(running_status(true));
    let pod = Pod {
        status: h.status.clone(),
        ..h.pod.clone()
    };
    let now = SystemTime::now();
    let step = |s: &mut WorkerState| s.before_probe(NAME, Some(&pod), now);
    // A restarted probe service, a container pod-sync holds ready: failures below the
    // threshold tell nothing, then Failure is told although it equals the initial value.
    assert_eq!(step(&mut h.state).1, None);
    assert_eq!(h.state.after_probe(Value::Failure), None);
    assert_eq!(h.state.after_probe(Value::Failure), Some(Value::Failure));
    assert_eq!(h.state.after_probe(Value::Failure), None, "told once");
    assert_eq!(h.state.after_probe(Value::Success), Some(Value::Success));
    assert_eq!(h.state.after_probe(Value::Success), None, "told once");
}

#[test]
fn a_deleted_pod_tells_liveness_success_once_and_stops() {
    let mut h = Harness::new(Kind::Liveness, Probe::default());
    h.status = Some(running_status(true));
    h.pod.metadata.deletion_timestamp = Some(Time(now()));
    let pod = Pod {
        status: h.status.clone(),
        ..h.pod.clone()
    };
    assert_eq!(
        h.state.before_probe(NAME, Some(&pod), SystemTime::now()),
        (Next::Stop, Some(Value::Success))
    );
    // A liveness probe that failed is on hold while its container is killed: the deletion
    // changes nothing until a new container comes (upstream checks the hold first).
    let mut h = Harness::new(Kind::Liveness, Probe::default());
    h.status = Some(running_status(true));
    h.prober = Value::Failure;
    h.expect(Value::Failure, "failed before the deletion");
    h.pod.metadata.deletion_timestamp = Some(Time(now()));
    assert!(h.do_probe());
    assert_eq!(h.get(ID), Some(Value::Failure));
}

#[test]
fn a_sidecar_that_ended_under_never_is_still_probed() {
    // Upstream: the worker of a restartable init container goes on when it terminated,
    // whatever the pod's policy (it will be restarted).
    let p = probe(Probe::default());
    let sidecar = Container {
        name: NAME.into(),
        restart_policy: Some("Always".into()),
        readiness_probe: Some(p.clone()),
        ..Default::default()
    };
    let mut state = WorkerState::new(Kind::Readiness, &p, &sidecar);
    let mut status = running_status(true);
    let mut c = status.container_statuses.take().unwrap();
    c[0].state = Some(ContainerState {
        terminated: Some(ContainerStateTerminated::default()),
        ..Default::default()
    });
    status.init_container_statuses = Some(c);
    let pod = Pod {
        spec: Some(PodSpec {
            init_containers: Some(vec![sidecar]),
            restart_policy: Some("Never".into()),
            ..Default::default()
        }),
        status: Some(status),
        ..Default::default()
    };
    assert_eq!(
        state.before_probe(NAME, Some(&pod), SystemTime::now()),
        (Next::Wait, None)
    );
    assert_eq!(state.result, Some(Value::Failure));
}
