//! One probe worker's decisions, as upstream's prober worker (`pkg/kubelet/prober/worker.go`,
//! `doProbe`): pure, so that upstream's `worker_test.go` drives it case by case
//! (`worker/tests.rs`). The manager's task around it only waits for ticks, runs the check
//! it is told to and publishes what it is told to.
//!
//! One worker serves one probe of one container of a pod for as long as the pod wants it,
//! across the container's restarts (upstream's worker, keyed by pod, container name and
//! probe type): it follows the container ID in the pod's status, starts each new container
//! from the probe type's initial value, and holds a liveness or startup probe that decided
//! until a new container comes (kubernetes #21751, #117153).

use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod, Probe};
use nodeagent_proto::api::probe_result::Kind;
use std::time::SystemTime;

/// A probe's value as upstream's results manager keeps it (`results.Result`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value {
    Unknown,
    Success,
    Failure,
}

/// Upstream's `initialValue`: what a new container's probe holds before it has run.
/// Readiness starts failed (not ready), liveness passed (nothing to restart), startup
/// unknown (not started).
pub fn initial_value(kind: Kind) -> Value {
    match kind {
        Kind::Readiness => Value::Failure,
        Kind::Liveness => Value::Success,
        Kind::Startup | Kind::Unspecified => Value::Unknown,
    }
}

/// What the worker does after `before_probe`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Run the probe against this container (its ID without the runtime's scheme) and hand
    /// what it found to `after_probe`.
    Probe { container_id: String },
    /// Nothing to run at this tick; the worker goes on (upstream's `return true`).
    Wait,
    /// The worker ends (upstream's `return false`): its pod finished, the container ended
    /// for good, or the pod is being deleted and this is a liveness or startup probe.
    Stop,
}

/// One worker's state (upstream's `worker` fields that `doProbe` reads and writes).
#[derive(Debug, Clone)]
pub struct WorkerState {
    kind: Kind,
    initial_delay_seconds: i64,
    success_threshold: u32,
    failure_threshold: u32,
    /// A sidecar: it is restarted whatever the pod's restart policy says.
    restartable_init: bool,
    /// The container this worker follows, as its status names it (`containerd://<id>`).
    pub container_id: Option<String>,
    /// What upstream's results manager holds for `container_id`.
    pub result: Option<Value>,
    /// The last value this worker told pod-sync for `container_id` (`None`: nothing yet; a
    /// new container's initial value is never told, pod-sync assumes it, so a restarted
    /// probe service does not make a ready container unready while it re-proves it).
    published: Option<Value>,
    last_result: Value,
    /// How many runs in a row gave `last_result`.
    pub result_run: u32,
    /// A liveness probe that failed, or a startup probe that decided: no more runs until a
    /// new container comes.
    pub on_hold: bool,
}

impl WorkerState {
    /// A worker for `kind` of `container` (a regular container or a sidecar of `pod`).
    pub fn new(kind: Kind, probe: &Probe, container: &Container) -> Self {
        Self {
            kind,
            initial_delay_seconds: i64::from(probe.initial_delay_seconds.unwrap_or(0)),
            success_threshold: probe.success_threshold.unwrap_or(1).max(1) as u32,
            failure_threshold: probe.failure_threshold.unwrap_or(3).max(1) as u32,
            restartable_init: container.restart_policy.as_deref() == Some("Always"),
            container_id: None,
            result: None,
            published: None,
            last_result: Value::Unknown,
            result_run: 0,
            on_hold: false,
        }
    }

    /// Upstream's `doProbe` up to the probe's run, against the pod as pod-sync last
    /// published it (`None`: pod-sync has not published it, or no longer does). Returns
    /// what to do and, where upstream's results manager would tell the kubelet something
    /// that is not a probe's run (a deletion), what to publish.
    pub fn before_probe(
        &mut self,
        name: &str,
        pod: Option<&Pod>,
        now: SystemTime,
    ) -> (Next, Option<Value>) {
        // No status: the pod has not been created yet, or it was deleted.
        let Some(pod) = pod else {
            return (Next::Wait, None);
        };
        let status = pod.status.as_ref();
        let phase = status.and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Failed" | "Succeeded")) {
            return (Next::Stop, None);
        }
        let Some(c) = container_status(name, pod).cloned() else {
            // The container has not been created yet, or it was removed.
            return (Next::Wait, None);
        };
        let id = c.container_id.clone().unwrap_or_default();
        if self.container_id.as_deref() != Some(id.as_str()) {
            // A new container: the old one's result goes, the new one starts from the
            // initial value, and a hold ends.
            self.container_id = Some(id.clone());
            self.result = Some(initial_value(self.kind));
            self.published = None;
            self.on_hold = false;
        }
        if self.on_hold {
            return (Next::Wait, None);
        }
        let state = c.state.unwrap_or_default();
        let Some(running) = state.running else {
            self.result = Some(Value::Failure);
            // Ends unless the container will run again.
            let never =
                pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref()) == Some("Never");
            let goes_on = state.terminated.is_none() || !never || self.restartable_init;
            return (if goes_on { Next::Wait } else { Next::Stop }, None);
        };
        // A pod being deleted: a liveness or startup probe says Success once more and ends,
        // so that the container is not restarted while it terminates.
        if pod.metadata.deletion_timestamp.is_some()
            && matches!(self.kind, Kind::Liveness | Kind::Startup)
        {
            return (Next::Stop, self.set(Value::Success));
        }
        // Probes wait for initialDelaySeconds, counted from the container's start.
        let running_for = running
            .started_at
            .map(|t| {
                now.duration_since(SystemTime::from(t.0))
                    .map_or(0, |d| d.as_secs() as i64)
            })
            .unwrap_or(0);
        if running_for < self.initial_delay_seconds {
            return (Next::Wait, None);
        }
        if c.started == Some(true) {
            // Once started, the startup probe stays (for the next container) but idles.
            if self.kind == Kind::Startup {
                return (Next::Wait, None);
            }
        } else if self.kind != Kind::Startup {
            // Liveness and readiness wait until the container has started.
            return (Next::Wait, None);
        }
        (
            Next::Probe {
                container_id: bare_id(Some(&id)),
            },
            None,
        )
    }

    /// Upstream's `doProbe` after the probe ran and gave `result` (Success or Failure; a
    /// prober error is thrown away before this): counts the run against the thresholds and
    /// returns the value to publish, if pod-sync is to learn one.
    pub fn after_probe(&mut self, result: Value) -> Option<Value> {
        if self.last_result == result {
            self.result_run += 1;
        } else {
            self.last_result = result;
            self.result_run = 1;
        }
        let threshold = match result {
            Value::Failure => self.failure_threshold,
            Value::Success => self.success_threshold,
            Value::Unknown => 1,
        };
        if self.result_run < threshold {
            // Below the threshold: the value stays as it was.
            return None;
        }
        let publish = self.set(result);
        // A liveness failure restarts the container, and a startup probe has decided either
        // way: no more runs until a new container (no exec into a container being stopped,
        // kubernetes #21751; no runs after a startup decision, #117153), and the next one
        // gets the full thresholds again.
        if (self.kind == Kind::Liveness && result == Value::Failure) || self.kind == Kind::Startup {
            self.on_hold = true;
            self.result_run = 0;
        }
        publish
    }

    /// Sets the results manager's value; returns it when pod-sync has not been told it yet.
    fn set(&mut self, value: Value) -> Option<Value> {
        self.result = Some(value);
        if self.published == Some(value) {
            return None;
        }
        self.published = Some(value);
        Some(value)
    }

    /// What the worker watches in the pod, to be woken when it changes (upstream triggers
    /// a worker on a status update; here only when something it reads moved, so that a
    /// busy pod does not run a probe more often than its period).
    pub fn watched(name: &str, pod: &Pod) -> Watched {
        let c = container_status(name, pod);
        Watched {
            phase: pod.status.as_ref().and_then(|s| s.phase.clone()),
            deleting: pod.metadata.deletion_timestamp.is_some(),
            container_id: c.and_then(|c| c.container_id.clone()),
            running: c.is_some_and(|c| c.state.as_ref().is_some_and(|s| s.running.is_some())),
            started: c.and_then(|c| c.started),
        }
    }
}

/// A container ID without the runtime's scheme (`containerd://<id>` -> `<id>`).
pub fn bare_id(id: Option<&str>) -> String {
    let id = id.unwrap_or_default();
    id.split_once("://")
        .map_or(id, |(_, bare)| bare)
        .to_string()
}

/// The status of the container `name` that has an ID: among the regular containers first,
/// then the init containers (sidecars), as upstream's worker looks.
fn container_status<'a>(name: &str, pod: &'a Pod) -> Option<&'a ContainerStatus> {
    let status = pod.status.as_ref()?;
    let has_id = |c: &&ContainerStatus| {
        c.name == name && c.container_id.as_deref().is_some_and(|i| !i.is_empty())
    };
    let find = |list: &'a Option<Vec<ContainerStatus>>| list.iter().flatten().find(has_id);
    find(&status.container_statuses).or_else(|| find(&status.init_container_statuses))
}

/// The parts of a pod a worker's next step depends on, besides time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Watched {
    phase: Option<String>,
    deleting: bool,
    container_id: Option<String>,
    running: bool,
    started: Option<bool>,
}

#[cfg(test)]
mod tests;
