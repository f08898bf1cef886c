//! Pod workers: one task per pod UID, woken by triggers that coalesce (a burst of events
//! is one sync), limited to a few concurrent syncs.

use crate::PodSync;
use nodeagent_proto::k8s;
use nodeagent_transport::Shutdown;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::AbortHandle;
use tokio::time::Instant;
use tracing::Instrument;

/// Where a pod is in its life on this node (upstream `pod_workers.go`): syncing (its
/// containers are driven to the spec), terminating (no source wants it, or it finished:
/// its containers and sandbox are being stopped), terminated (nothing of it runs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodWorkerState {
    Syncing,
    Terminating,
    Terminated,
}

/// At most one pending delayed trigger per pod: the one with the earliest deadline. A pod
/// that keeps asking to be retried (every sync and every error does) would otherwise pile up
/// one sleeping task per request.
#[derive(Default)]
pub struct DelayedTriggers {
    pending: Mutex<HashMap<String, (Instant, AbortHandle)>>,
}

impl DelayedTriggers {
    /// Runs `fire` after `after`, unless a trigger for `uid` is already due by then; a
    /// pending later one is replaced.
    pub fn schedule(
        self: &Arc<Self>,
        uid: &str,
        after: Duration,
        shutdown: Shutdown,
        fire: impl FnOnce() + Send + 'static,
    ) {
        let deadline = Instant::now() + after;
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((due, task)) = pending.get(uid) {
            if *due <= deadline {
                return;
            }
            task.abort();
        }
        let this = self.clone();
        let key = uid.to_string();
        let task = tokio::spawn(async move {
            tokio::select! {
                _ = shutdown.wait() => {}
                _ = tokio::time::sleep_until(deadline) => {
                    let mut pending = this.pending.lock().unwrap_or_else(|e| e.into_inner());
                    // Only the current entry's task gets here: a replaced one was aborted.
                    if pending.get(&key).is_some_and(|(due, _)| *due == deadline) {
                        pending.remove(&key);
                    }
                    drop(pending);
                    fire();
                }
            }
        });
        pending.insert(uid.to_string(), (deadline, task.abort_handle()));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// upstream's `events.ExceededGracePeriod` and the text `killPodNow` gives it.
pub const EXCEEDED_GRACE_PERIOD: &str = "ExceededGracePeriod";
pub const EXCEEDED_GRACE_PERIOD_MESSAGE: &str =
    "Container runtime did not kill the pod within specified grace period.";

/// How long [`PodSync::kill_pod_now`] waits: upstream `killPodNow`'s grace period and a
/// half, at least 10 s ("to wait for kubelet->runtime traffic to complete in sigkill").
pub fn kill_timeout(grace_seconds: i64) -> Duration {
    let timeout = grace_seconds.saturating_add(grace_seconds / 2).max(10);
    Duration::from_secs(timeout as u64)
}

/// When a pod is synced again after a sync: upstream's `wait.Jitter(resyncInterval, 0.5)`,
/// `period` and a random part of half of it.
pub fn resync_after(period: Duration) -> Duration {
    nodeagent_config::duration::jitter(period, 0.5)
}

/// What one sync concluded.
#[derive(Debug, PartialEq)]
pub enum SyncOutcome {
    /// Nothing more to do until the next event.
    Idle,
    /// Sync again after this long (back-off, waiting for a peer).
    RetryAfter(Duration),
    /// The pod is gone from the node; the worker may end.
    Terminated,
}

impl PodSync {
    /// Wakes the worker of `uid`, starting one if needed.
    pub fn trigger(self: &Arc<Self>, uid: &str) {
        let mut workers = self.workers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(tx) = workers.get(uid)
            && !tx.is_closed()
        {
            let _ = tx.try_send(()); // full means a sync is already pending
            return;
        }
        let (tx, rx) = mpsc::channel(1);
        let _ = tx.try_send(());
        workers.insert(uid.to_string(), tx);
        tokio::spawn(self.clone().worker(uid.to_string(), rx));
    }

    pub fn trigger_all(self: &Arc<Self>) {
        let uids = self.lock().all_uids();
        for uid in uids {
            self.trigger(&uid);
        }
    }

    /// The periodic pass over the pods no source wants ([`crate::state::State::resync_uids`]);
    /// a wanted pod is synced again on its own timer ([`resync_after`]).
    pub fn trigger_resync(self: &Arc<Self>) {
        let mut uids = self.lock().resync_uids();
        // And a wanted pod whose worker is gone (a sync that panicked ends its task and
        // with it the pod's timer): a new worker picks it up.
        {
            let workers = self.workers.lock().unwrap_or_else(|e| e.into_inner());
            let st = self.lock();
            uids.extend(
                st.desired
                    .keys()
                    .filter(|uid| workers.get(*uid).is_none_or(|tx| tx.is_closed()))
                    .cloned(),
            );
        }
        for uid in uids {
            self.trigger(&uid);
        }
    }

    /// Has the pod's worker stop everything of `pod`, which the node has ended (its
    /// `pod_failed` reason set), with `grace_override` or the pod's own grace period, and
    /// waits for it: upstream's `killPodNow`. Every kill thus goes through the worker, with
    /// its ordering, preStop hooks and Killing events, and never twice at once. Past
    /// upstream's timeout, an `ExceededGracePeriod` Warning event says so.
    pub(crate) async fn kill_pod_now(
        self: &Arc<Self>,
        pod: &k8s_openapi::api::core::v1::Pod,
        grace_override: Option<i64>,
    ) {
        let uid = k8s::pod_uid(pod).to_string();
        let grace = grace_override.unwrap_or_else(|| crate::worker::kill_order::grace_seconds(pod));
        let (done, finished) = tokio::sync::oneshot::channel();
        {
            let mut st = self.lock();
            let request = st.kill_requests.entry(uid.clone()).or_default();
            request.grace_override = grace_override;
            request.done.push(done);
        }
        self.trigger(&uid);
        // A dropped request (the pod was forgotten meanwhile) is as good as done.
        if tokio::time::timeout(kill_timeout(grace), finished)
            .await
            .is_ok()
        {
            return;
        }
        tracing::warn!(pod = %k8s::pod_full_name(pod), grace, "timeout waiting to kill pod");
        self.events.pod(
            pod,
            nodeagent_config::events::EventType::Warning,
            EXCEEDED_GRACE_PERIOD,
            EXCEEDED_GRACE_PERIOD_MESSAGE,
        );
    }

    /// The worker has stopped everything of `uid`: whoever waits in [`Self::kill_pod_now`]
    /// is told.
    fn kill_completed(&self, uid: &str) {
        let request = self.lock().kill_requests.remove(uid);
        for done in request.into_iter().flat_map(|r| r.done) {
            let _ = done.send(());
        }
    }

    /// Wakes the worker of `uid` after `after`, or sooner if an earlier wake-up is
    /// already pending (see [`DelayedTriggers`]).
    fn trigger_later(self: &Arc<Self>, uid: &str, after: Duration) {
        let this = self.clone();
        let target = uid.to_string();
        self.delayed
            .schedule(uid, after, self.shutdown.clone(), move || {
                this.trigger(&target)
            });
    }

    async fn worker(self: Arc<Self>, uid: String, mut rx: mpsc::Receiver<()>) {
        while rx.recv().await.is_some() {
            if self.shutdown.is_triggered() {
                return;
            }
            let (name, namespace, trace) = {
                let st = self.lock();
                // Kept until a sync gets the pod to a steady state, so that retries (waiting for
                // pleg, back-offs) stay in the trace of the change that caused them.
                let trace = st.pending_trace.get(&uid).cloned();
                let pod = st.desired.get(&uid).or_else(|| st.terminating.get(&uid));
                let (name, namespace) = match pod {
                    Some(p) => (
                        k8s::pod_name(p).to_string(),
                        k8s::pod_namespace(p).to_string(),
                    ),
                    None => st
                        .runtime
                        .get(&uid)
                        .map(|r| (r.name.clone(), r.namespace.clone()))
                        .unwrap_or_default(),
                };
                (name, namespace, trace)
            };
            let span = tracing::info_span!(
                "sync_pod",
                k8s.pod.uid = %uid,
                k8s.pod.name = %name,
                k8s.namespace.name = %namespace,
            );
            nodeagent_telemetry::set_parent_from(&span, trace.as_ref());
            // Boxed: a sync's state (about 24 KiB) is held only while it runs, not by every
            // idle worker (issue 13's memory budget).
            let outcome = Box::pin(self.sync_once(&uid))
                .instrument(span.clone())
                .await;
            if matches!(outcome, Ok(SyncOutcome::Idle | SyncOutcome::Terminated)) {
                let mut st = self.lock();
                if st.pending_trace.get(&uid) == trace.as_ref() {
                    st.pending_trace.remove(&uid);
                }
            }
            match outcome {
                // Synced again after `syncFrequency` and a random part of half of it, so
                // that hundreds of pods do not all resync at one tick (upstream re-queues
                // each worker so); sooner when the sync asked to be retried sooner. A pod
                // that finished here and of which nothing runs is not.
                Ok(SyncOutcome::Idle) => {
                    if self.lock().resyncs(&uid) {
                        self.trigger_later(&uid, resync_after(self.resync));
                    }
                }
                Ok(SyncOutcome::RetryAfter(d)) => {
                    // A long back-off (up to 5 minutes) does not hold back what every sync
                    // does (volume contents, the deadline, the status) past a resync.
                    let d = match self.lock().resyncs(&uid) {
                        true => d.min(resync_after(self.resync)),
                        false => d,
                    };
                    self.trigger_later(&uid, d)
                }
                Ok(SyncOutcome::Terminated) => {
                    let mut workers = self.workers.lock().unwrap_or_else(|e| e.into_inner());
                    // A trigger that arrived meanwhile means there is more to do.
                    let mut st = self.lock();
                    if rx.try_recv().is_err() && st.may_remove(&uid) {
                        st.worker_states.remove(&uid);
                        drop(st);
                        workers.remove(&uid);
                        return;
                    }
                    drop(st);
                    drop(workers);
                    self.trigger(&uid);
                }
                Err(e) => {
                    span.in_scope(|| tracing::warn!(error = %e, "sync failed; will retry"));
                    self.trigger_later(&uid, Duration::from_secs(2));
                }
            }
        }
    }

    /// One pass for one pod: bring it up, or tear it down.
    async fn sync_once(self: &Arc<Self>, uid: &str) -> anyhow::Result<SyncOutcome> {
        let (desired, pleg_synced, may_remove, newer_than) = {
            let st = self.lock();
            (
                st.desired.get(uid).cloned(),
                st.pleg_synced,
                st.may_remove(uid),
                st.last_action.get(uid).copied().unwrap_or(0),
            )
        };
        if !pleg_synced {
            // Acting without knowing what runs could start a second copy of a pod.
            return Ok(SyncOutcome::RetryAfter(Duration::from_millis(500)));
        }
        let runtime = self.runtime_status(uid, newer_than).await?;
        // kubelet_pod_worker_duration_seconds, by upstream's SyncPodType.
        let operation = match (&desired, runtime.sandboxes.is_empty()) {
            (None, _) => "kill",
            (Some(_), true) => "create",
            (Some(_), false) => "sync",
        };
        let started = std::time::Instant::now();
        let (state, outcome) = match desired {
            Some(pod) => {
                let outcome = self.sync_pod(&pod, &runtime).await;
                // A finished pod (every container done, none to restart) is terminated:
                // its sandbox was stopped, its record stays until its source drops it.
                let finished = matches!(outcome, Ok(SyncOutcome::Terminated));
                let state = if finished {
                    PodWorkerState::Terminated
                } else {
                    PodWorkerState::Syncing
                };
                (
                    state,
                    outcome.map(|o| if finished { SyncOutcome::Idle } else { o }),
                )
            }
            None if may_remove => {
                self.set_worker_state(uid, PodWorkerState::Terminating);
                let outcome = self.kill_pod(uid, &runtime).await;
                (PodWorkerState::Terminated, outcome)
            }
            None => return Ok(SyncOutcome::Idle),
        };
        nodeagent_telemetry::metrics::kubelet::POD_WORKER_DURATION
            .get_or_create(&vec![("operation_type", operation.to_string())])
            .observe(started.elapsed().as_secs_f64());
        if outcome.is_ok() {
            self.set_worker_state(uid, state);
            if state == PodWorkerState::Terminated {
                self.kill_completed(uid);
            }
        }
        outcome
    }

    fn set_worker_state(&self, uid: &str, state: PodWorkerState) {
        let mut st = self.lock();
        let previous = st.worker_states.insert(uid.to_string(), state);
        if previous != Some(state) {
            tracing::debug!(pod.uid = %uid, ?previous, ?state, "pod worker state");
        }
    }

    /// The runtime's view of the pod, no older than our last action on it.
    pub(crate) async fn runtime_status(
        &self,
        uid: &str,
        newer_than: i64,
    ) -> anyhow::Result<nodeagent_proto::api::RuntimePodStatus> {
        let mut pleg = self.pleg.clone();
        let status = pleg
            .get_pod_status(nodeagent_proto::api::GetPodStatusRequest {
                pod_uid: uid.to_string(),
                newer_than_unix_nanos: newer_than,
            })
            .await
            .map_err(|e| anyhow::anyhow!("pleg GetPodStatus: {}", e.message()))?
            .into_inner();
        self.lock().apply_runtime(uid, status.clone());
        Ok(status)
    }

    /// Reads the pod from the runtime after this sync changed it, so that the status
    /// published now shows what the sync did (a container started: Running) instead of
    /// waiting for pleg's next relist. The read is as new as its lists; pleg's later
    /// statuses replace it as usual, older ones do not.
    pub(crate) async fn observe(&self, uid: &str) {
        match self.cri.pod_status(uid).await {
            Ok(status) => {
                self.lock().apply_runtime(uid, status);
            }
            Err(e) => {
                tracing::debug!(error = %e.message(), "could not read the pod after changing it; pleg's next relist will show it");
            }
        }
    }

    /// Marks that we just changed the pod in the runtime.
    pub(crate) fn acted(&self, uid: &str) {
        self.lock().last_action.insert(uid.to_string(), now_nanos());
    }
}

pub use nodeagent_cri::now_nanos;

#[cfg(test)]
mod tests {
    /// upstream `killPodNow`: `timeout := gracePeriod + (gracePeriod / 2)`, at least
    /// `minTimeout := 10` seconds.
    #[test]
    fn a_kill_is_waited_for_as_upstream_waits() {
        let s = Duration::from_secs;
        for (grace, want) in [(0, s(10)), (6, s(10)), (7, s(10)), (8, s(12)), (30, s(45))] {
            assert_eq!(super::kill_timeout(grace), want, "grace {grace}");
        }
    }

    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// upstream `wait.Jitter(resyncInterval, workerResyncIntervalJitterFactor = 0.5)`: the
    /// period and up to half of it again, drawn anew each time, so that 500 pods' resyncs
    /// spread over half a period instead of coming at one tick.
    #[test]
    fn resyncs_come_after_the_period_spread_over_half_of_it() {
        let period = Duration::from_secs(60);
        let draws: Vec<Duration> = (0..500).map(|_| resync_after(period)).collect();
        assert!(
            draws
                .iter()
                .all(|d| *d >= period && *d < period.mul_f64(1.5))
        );
        let (min, max) = (draws.iter().min().unwrap(), draws.iter().max().unwrap());
        assert!(*max - *min > Duration::from_secs(20), "{min:?}..{max:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn delayed_triggers_of_a_pod_coalesce_to_the_earliest() {
        let (_trigger, shutdown) = nodeagent_transport::shutdown_channel();
        let delayed = Arc::new(DelayedTriggers::default());
        let fired = Arc::new(AtomicUsize::new(0));
        let metrics = tokio::runtime::Handle::current().metrics();
        let before = metrics.num_alive_tasks();
        for n in 0..1000u64 {
            let fired = fired.clone();
            // Mostly later deadlines, and one earlier one in the middle.
            let after = if n == 500 { 1 } else { 10 + n };
            delayed.schedule(
                "u1",
                Duration::from_secs(after),
                shutdown.clone(),
                move || {
                    fired.fetch_add(1, Ordering::SeqCst);
                },
            );
        }
        tokio::task::yield_now().await;
        assert_eq!(delayed.len(), 1);
        assert_eq!(metrics.num_alive_tasks() - before, 1, "one task, not 1000");
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(
            fired.load(Ordering::SeqCst),
            1,
            "the earliest deadline fired"
        );
        assert_eq!(delayed.len(), 0);
        tokio::time::sleep(Duration::from_secs(2000)).await;
        assert_eq!(
            fired.load(Ordering::SeqCst),
            1,
            "the replaced ones never fire"
        );
        assert_eq!(metrics.num_alive_tasks(), before);
    }

    #[tokio::test(start_paused = true)]
    async fn a_trigger_after_one_fired_schedules_again() {
        let (_trigger, shutdown) = nodeagent_transport::shutdown_channel();
        let delayed = Arc::new(DelayedTriggers::default());
        let fired = Arc::new(AtomicUsize::new(0));
        for _ in 0..2 {
            let f = fired.clone();
            delayed.schedule("u1", Duration::from_secs(1), shutdown.clone(), move || {
                f.fetch_add(1, Ordering::SeqCst);
            });
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        assert_eq!(fired.load(Ordering::SeqCst), 2);
    }
}
