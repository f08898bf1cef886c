//! What pod-sync knows at any moment. None of it is a source of truth: the desired pods
//! come from config-source's snapshot, the actual state from pleg's, and both are
//! replaced wholesale when their streams reconnect.

use crate::status::Waiting;
use k8s_openapi::api::core::v1::Pod;
use nodeagent_proto::api::RuntimePodStatus;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

/// An exponential back-off entry: how many failures so far, until when to wait, and what
/// the last failure said (shown during the back-off, as upstream's `prevPullErrMsg`).
#[derive(Debug, Clone)]
pub struct Backoff {
    pub failures: u32,
    /// When the last failure was recorded.
    pub at: Instant,
    pub until: Instant,
    pub last_error: String,
}

/// upstream's image pull back-off (`flowcontrol.NewBackOff(backOffPeriod,
/// MaxContainerBackOff)`): 10 s doubling to 300 s.
pub const IMAGE_BACKOFF: (Duration, Duration) = (Duration::from_secs(10), Duration::from_secs(300));

impl Backoff {
    /// Records one more failure with the upstream image back-off.
    pub fn next(previous: Option<&Backoff>, now: Instant, error: String) -> Backoff {
        Self::next_within(previous, now, error, IMAGE_BACKOFF)
    }

    /// upstream `flowcontrol.Backoff.Next` with `(initial, max)`: the first failure waits
    /// `initial`, each further one twice the last, up to `max`; one that comes more than
    /// twice `max` after the last starts again from `initial` (`hasExpired`: "consider
    /// stable if it's ok for twice the maxDuration").
    pub fn next_within(
        previous: Option<&Backoff>,
        now: Instant,
        error: String,
        (initial, max): (Duration, Duration),
    ) -> Backoff {
        let failures = match previous {
            Some(b) if now.saturating_duration_since(b.at) <= max * 2 => b.failures + 1,
            _ => 1,
        };
        let delay = initial
            .saturating_mul(1u32 << (failures - 1).min(16))
            .min(max);
        Backoff {
            failures,
            at: now,
            until: now + delay,
            last_error: error,
        }
    }

    /// upstream `IsInBackOffSinceUpdate`: still waiting at `now`.
    pub fn waiting(&self, now: Instant) -> bool {
        now < self.until
    }
}

/// A kill of a pod the node decided (eviction, preemption), handed to the pod's worker so
/// that every kill goes through one path (upstream's `KillPodOptions`).
#[derive(Default)]
pub struct KillRequest {
    /// The grace period to stop the containers with, if not the pod's own.
    pub grace_override: Option<i64>,
    /// Told once the worker has stopped everything of the pod.
    pub done: Vec<tokio::sync::oneshot::Sender<()>>,
}

#[derive(Default)]
pub struct State {
    /// uid -> desired pod.
    pub desired: HashMap<String, Pod>,
    /// uid -> pod that a source removed or deleted, kept until it is terminated (for its
    /// name and grace period).
    pub terminating: HashMap<String, Pod>,
    /// uid -> the terminal status of a pod torn down here that the API server has not
    /// taken yet (a failed patch, or a failed deletion after it): the pod stays until it
    /// has, and its next pass sends this again (its containers are gone by then).
    pub unsent_terminal: HashMap<String, k8s_openapi::api::core::v1::PodStatus>,
    /// uid -> where a newer, shorter deletion grace period of a pod being terminated goes
    /// (the kills in progress follow it).
    pub grace_updates: HashMap<String, crate::worker::kill_order::GraceUpdates>,
    /// Woken whenever the desired pods change (an image pull waits on it to learn that its
    /// pod went).
    pub desired_changed: std::sync::Arc<tokio::sync::Notify>,
    /// A config-source snapshot has been received.
    pub config_synced: bool,
    /// Every configured source has delivered its first list: a runtime pod that no
    /// source wants may now be removed.
    pub sources_ready: bool,
    /// Every configured source has delivered a list, or a checkpoint of its last one: the
    /// desired set is as complete as it can be (statuses may be served; no removals yet).
    pub sources_served: bool,
    /// uid -> the runtime's view, from pleg.
    pub runtime: HashMap<String, RuntimePodStatus>,
    /// A pleg snapshot has been received.
    pub pleg_synced: bool,
    /// container id -> ready (readiness probe result).
    pub readiness: HashMap<String, bool>,
    /// Containers whose liveness probe failed: they are killed and restarted by policy.
    pub liveness_failed: HashSet<String>,
    /// Containers whose startup probe has succeeded.
    pub started: HashSet<String>,
    /// uid -> container name -> why it waits (image pull errors, back-off, ...).
    pub waiting: HashMap<String, HashMap<String, Waiting>>,
    /// uid -> when our last CRI action on the pod finished (unix nanos); we never act on
    /// a runtime status older than that.
    pub last_action: HashMap<String, i64>,
    /// uid -> pod with its computed status, as served to node-status and http-server.
    pub statuses: BTreeMap<String, Pod>,
    /// (uid, image) -> image pull back-off.
    pub pull_backoff: HashMap<(String, String), Backoff>,
    /// uid -> the terminal status of a pod that finished (kept on disk: `finished`).
    pub finished: crate::status::finished::Finished,
    /// uid -> why the whole pod failed (e.g. activeDeadlineSeconds): nothing runs again.
    pub pod_failed: HashMap<String, Waiting>,
    /// uid -> a kill the node asked of the pod's worker (eviction, preemption), which
    /// waits for it: upstream's `killPodNow` through the pod workers.
    pub kill_requests: HashMap<String, KillRequest>,
    /// Pods admitted against the node's resources (`admission`), until they are gone.
    pub admitted: HashSet<String>,
    /// The node's pressure conditions whose thresholds the eviction manager found met at
    /// its last pass (new pods are admitted against them).
    pub pressure: std::collections::BTreeSet<nodeagent_config::eviction::Condition>,
    /// logind announced a shutdown: pods are being stopped and new ones are refused.
    pub shutting_down: bool,
    /// container id -> its termination message, read once after it exited.
    pub termination_messages: HashMap<String, String>,
    /// uid -> where its worker is (syncing, terminating, terminated).
    pub worker_states: HashMap<String, crate::worker::workers::PodWorkerState>,
    /// uid -> trace context of the change that last touched the pod; the next sync of
    /// the pod joins that trace.
    pub pending_trace: HashMap<String, nodeagent_proto::api::TraceContext>,
    pub status_revision: u64,
    /// uid -> the IP its current sandbox got (a finished pod keeps it in its status).
    pub sandbox_ips: HashMap<String, String>,
    /// When the housekeeping loop last ran (the watchdog follows it).
    pub heartbeat: Option<Instant>,
    /// Every desired pod has had its status computed since this process started. Until
    /// then statuses are not served: a restarted pod-sync that answered with what little it
    /// knew would make running pods vanish from `/pods` and from the API's view.
    pub statuses_complete: bool,
    /// When the full desired set and the runtime snapshot were first seen: a pod whose first
    /// sync is slow (a long image pull) must not hide every other pod's status for long.
    pub snapshots_seen_at: Option<Instant>,
    /// A probe results snapshot has been received since this process started.
    pub probe_synced: bool,
    /// Pods whose status was computed after the first probe snapshot: only those statuses
    /// carry the probe results a restarted pod-sync may not have had on disk.
    pub published_since_probe: HashSet<String>,
    /// Each pod's allocated resources, what its spec asks beyond them, and what each
    /// container runs with (in-place resize; kept on disk).
    pub allocations: crate::allocation::Allocations,
    /// uid -> its resize conditions (`PodResizePending`, `PodResizeInProgress`).
    pub resize: HashMap<String, crate::allocation::ResizeConditions>,
}

/// How long statuses stay hidden, after both snapshots arrived, waiting for probe's
/// results (a dead probe service must not hide every status for long).
const STATUS_GATE_MAX: Duration = Duration::from_secs(15);
/// How long at most they stay hidden while a desired pod has no status at all (its
/// runtime state cannot be read: pleg or containerd restarting). Until then http-server
/// serves its last complete list (marked, up to 60 s old); serving earlier would list the
/// node without a pod that runs (the chaos suite saw it vanish from `/pods`).
const STATUS_GATE_HARD_MAX: Duration = Duration::from_secs(45);

impl State {
    /// The requests (as allocated) of every pod but `uid` that was admitted or runs and
    /// has not finished: what a pod's admission, or a resize, must fit beside.
    pub fn admitted_requests(&self, uid: &str) -> Vec<crate::node::admission::Requests> {
        self.admitted_pods(uid)
            .map(crate::node::admission::requests)
            .collect()
    }

    /// Every pod but `uid` (as allocated) that was admitted or runs and has not finished:
    /// upstream's active pods, which a critical pod may preempt.
    pub fn admitted_pods<'a>(&'a self, uid: &'a str) -> impl Iterator<Item = &'a Pod> + 'a {
        self.desired
            .iter()
            .filter(move |(u, _)| u.as_str() != uid && !self.pod_finished(u))
            .filter(|(u, _)| {
                self.admitted.contains(*u)
                    || self
                        .runtime
                        .get(*u)
                        .is_some_and(|r| !r.sandboxes.is_empty() || !r.containers.is_empty())
            })
            .map(|(_, p)| p)
    }

    /// The pod has finished for good: failed as a whole (admission, deadline, eviction),
    /// its published phase is terminal, or it was recorded finished before pod-sync's
    /// restart (so that a refused pod is not active again until its worker runs: the
    /// cgroup v2 guest's CI run saw one back in the pod-resources list after a SIGKILL).
    pub fn pod_finished(&self, uid: &str) -> bool {
        self.finished.contains_key(uid)
            || self.pod_failed.contains_key(uid)
            || self
                .statuses
                .get(uid)
                .and_then(|p| p.status.as_ref())
                .and_then(|s| s.phase.as_deref())
                .is_some_and(|phase| matches!(phase, "Succeeded" | "Failed"))
    }

    /// upstream's active pods: wanted by a source or still being terminated, and not
    /// finished.
    pub fn active_pods(&self) -> impl Iterator<Item = (&String, &Pod)> {
        self.desired
            .iter()
            .chain(self.terminating.iter())
            .filter(|(uid, _)| !self.pod_finished(uid))
    }

    /// The active pods' UIDs, once every source has listed its pods (`None` before: a pod
    /// missing from them may only not be known yet). The CPU and device managers release
    /// what the pods not in it held.
    pub fn active_uids(&self) -> Option<BTreeSet<String>> {
        self.sources_ready
            .then(|| self.active_pods().map(|(uid, _)| uid.clone()).collect())
    }

    /// Every pod uid anyone knows of.
    pub fn all_uids(&self) -> HashSet<String> {
        self.desired
            .keys()
            .chain(self.runtime.keys())
            .chain(self.terminating.keys())
            .chain(self.statuses.keys())
            .chain(self.pending_trace.keys())
            .cloned()
            .collect()
    }

    /// Whether the wanted pod `uid` is synced again on its timer: while it is synced
    /// (not finished), and after it finished while anything of it still runs (a kill that
    /// failed is tried again, as upstream's worker re-queues a failed `syncTerminatingPod`).
    pub fn resyncs(&self, uid: &str) -> bool {
        use crate::worker::workers::PodWorkerState;
        if !self.desired.contains_key(uid) {
            return false;
        }
        match self.worker_states.get(uid) {
            Some(PodWorkerState::Terminated) => self
                .runtime
                .get(uid)
                .is_some_and(RuntimePodStatus::anything_runs),
            _ => true,
        }
    }

    /// The pods the periodic pass wakes: those no source wants (any more), whose teardown
    /// it retries. A wanted pod is synced again on its own timer, `syncFrequency` after
    /// its last sync with jitter, as upstream re-queues each pod worker, and not at all
    /// once it finished here (refused at admission, evicted, or done): upstream starts no
    /// worker for a pod `rejectPod` refused, and `UpdatePod` drops every update to a
    /// finished pod ("Pod is finished processing, no further updates", pod_workers.go).
    /// Runtime events, a kill or a new spec still wake any pod, by their own triggers.
    pub fn resync_uids(&self) -> HashSet<String> {
        let mut uids = self.all_uids();
        uids.retain(|uid| !self.desired.contains_key(uid));
        uids
    }

    /// Whether statuses may be served; latches once every desired pod has a status computed
    /// after the config, runtime and probe snapshots arrived, or after a bounded wait once
    /// every desired pod has some status (a dead probe service cannot hide every status
    /// for long), or after a longer bound whatever is missing (nor can one pod whose
    /// runtime state cannot be read).
    pub fn statuses_servable(&mut self) -> bool {
        // Until every source has listed, the desired set is partial (config-source is
        // restarting): even an empty one says nothing, so nothing is served yet.
        if self.statuses_complete
            || !(self.config_synced && self.sources_served && self.pleg_synced)
        {
            return self.statuses_complete;
        }
        let since = *self.snapshots_seen_at.get_or_insert_with(Instant::now);
        let complete = self.probe_synced
            && self
                .desired
                .keys()
                .all(|uid| self.published_since_probe.contains(uid));
        let every_pod_listed = self
            .desired
            .keys()
            .all(|uid| self.statuses.contains_key(uid));
        let waited = since.elapsed();
        if complete
            || (every_pod_listed && waited >= STATUS_GATE_MAX)
            || waited >= STATUS_GATE_HARD_MAX
        {
            self.statuses_complete = true;
        }
        self.statuses_complete
    }

    /// A pod no source wants may be torn down only once we know the sources' full set.
    pub fn may_remove(&self, uid: &str) -> bool {
        !self.desired.contains_key(uid)
            && (self.terminating.contains_key(uid) || (self.config_synced && self.sources_ready))
    }
}

#[cfg(test)]
mod tests;

impl State {
    /// Takes a pod's runtime status (an empty one: the pod is gone from the runtime) unless
    /// the one held was built from a later list: a pleg event that was on its way while
    /// pod-sync read a fresher status must not undo it. A status without a timestamp (an
    /// older pleg's) is taken as it is. Returns whether it was taken.
    pub fn apply_runtime(&mut self, uid: &str, status: RuntimePodStatus) -> bool {
        let stale = status.timestamp_unix_nanos > 0
            && self
                .runtime
                .get(uid)
                .is_some_and(|held| held.timestamp_unix_nanos > status.timestamp_unix_nanos);
        if stale {
            return false;
        }
        if status.sandboxes.is_empty() && status.containers.is_empty() {
            self.runtime.remove(uid);
        } else {
            self.runtime.insert(uid.to_string(), status);
        }
        true
    }

    /// Drops what is kept per container ID for containers the runtime no longer has
    /// (removed by the restart policy's garbage collection or by hand), so that these maps
    /// follow the runtime instead of growing with every restart. Only after pleg's first
    /// snapshot: before it, the runtime view is empty, not known.
    pub fn prune_containers(&mut self) {
        if !self.pleg_synced {
            return;
        }
        let live: HashSet<&str> = self
            .runtime
            .values()
            .flat_map(|p| p.containers.iter().map(|c| c.id.as_str()))
            .collect();
        self.termination_messages
            .retain(|id, _| live.contains(id.as_str()));
        self.liveness_failed.retain(|id| live.contains(id.as_str()));
    }
}

#[cfg(test)]
mod apply_runtime_tests;

#[cfg(test)]
mod prune_tests;
