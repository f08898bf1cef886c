//! When each container of a terminating pod may be stopped, and how long it has.
//!
//! - [`TerminationOrder`] is upstream's `terminationOrdering`: regular containers are
//!   stopped at once; a sidecar (restartable init container) waits until every regular
//!   container and every sidecar declared after it has stopped, so sidecars go last, in
//!   reverse order. Every preStop hook still starts at once, as upstream.
//! - [`GraceClock`] is the grace period of one termination, which can only shrink: a
//!   second deletion with a shorter period (or a force delete) takes effect on kills
//!   already in progress (upstream `calculateEffectiveGracePeriod`).

use k8s_openapi::api::core::v1::Pod;
use std::collections::{HashMap, HashSet};
use tokio::sync::watch;
use tokio::time::{Duration, Instant};

/// The order in which a pod's running containers are stopped.
#[derive(Debug)]
pub struct TerminationOrder {
    /// container name -> names that must have stopped before it.
    prerequisites: HashMap<String, Vec<String>>,
    stopped: watch::Sender<HashSet<String>>,
}

impl TerminationOrder {
    /// The order for `running` containers of `pod`. Containers that do not run are not
    /// waited for.
    pub fn new(pod: &Pod, running: &[&str]) -> Self {
        let spec = pod.spec.clone().unwrap_or_default();
        let runs = |name: &str| running.contains(&name);
        let regular: Vec<String> = spec
            .containers
            .iter()
            .map(|c| c.name.clone())
            .filter(|n| runs(n))
            .collect();
        let mut prerequisites = HashMap::new();
        let mut later_sidecars: Vec<String> = Vec::new();
        for c in spec.init_containers.iter().flatten().rev() {
            if !crate::worker::init_plan::is_sidecar(c) {
                continue;
            }
            let mut before = regular.clone();
            before.extend(later_sidecars.iter().cloned());
            prerequisites.insert(c.name.clone(), before);
            if runs(&c.name) {
                later_sidecars.push(c.name.clone());
            }
        }
        Self {
            prerequisites,
            stopped: watch::channel(HashSet::new()).0,
        }
    }

    /// Waits until `name` may be stopped.
    pub async fn wait_for_turn(&self, name: &str) {
        let Some(before) = self.prerequisites.get(name).filter(|b| !b.is_empty()) else {
            return;
        };
        let mut rx = self.stopped.subscribe();
        // The sender lives as long as `self`: wait_for only ends when all have stopped.
        let _ = rx
            .wait_for(|stopped| before.iter().all(|b| stopped.contains(b)))
            .await;
    }

    /// Records that `name` has stopped (or given up): those waiting on it may go.
    pub fn stopped(&self, name: &str) {
        self.stopped.send_modify(|s| {
            s.insert(name.to_string());
        });
    }
}

/// The grace period of one termination, from its start; it can only shrink.
#[derive(Debug, Clone)]
pub struct GraceClock {
    start: Instant,
    grace: watch::Receiver<i64>,
}

/// The sending half: the pod's newest deletion grace period goes here.
pub type GraceUpdates = watch::Sender<i64>;

impl GraceClock {
    /// A grace period that never changes.
    pub fn fixed(grace_seconds: i64) -> Self {
        let (tx, grace) = watch::channel(grace_seconds.max(0));
        drop(tx);
        Self {
            start: Instant::now(),
            grace,
        }
    }

    /// A grace period that `GraceUpdates::shorten` may shrink.
    pub fn shrinkable(grace_seconds: i64) -> (Self, GraceUpdates) {
        let (tx, grace) = watch::channel(grace_seconds.max(0));
        (
            Self {
                start: Instant::now(),
                grace,
            },
            tx,
        )
    }

    pub fn grace_seconds(&self) -> i64 {
        *self.grace.borrow()
    }

    /// When the grace period ends.
    pub fn deadline(&self) -> Instant {
        self.start + Duration::from_secs(self.grace_seconds() as u64)
    }

    /// Whole seconds left, at least `minimum`: as upstream, the time spent is truncated
    /// to whole seconds before it is taken off, so 0.6 s spent of 4 leaves 4, not 3.
    pub fn seconds_left(&self, minimum: i64) -> i64 {
        let spent = self.start.elapsed().as_secs() as i64;
        (self.grace_seconds() - spent).max(minimum)
    }

    /// Resolves when the grace period shrinks; never, once it cannot any more.
    pub async fn shortened(&mut self) {
        if self.grace.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Resolves when the grace period has run out (following any shrink).
    pub async fn expired(&self) {
        let mut clock = self.clone();
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(clock.deadline()) => return,
                _ = clock.shortened() => {}
            }
        }
    }
}

/// Shrinks the grace period to `grace_seconds` if that is shorter; true if it did.
pub fn shorten(updates: &GraceUpdates, grace_seconds: i64) -> bool {
    updates.send_if_modified(|g| {
        let shorter = grace_seconds.max(0) < *g;
        if shorter {
            *g = grace_seconds.max(0);
        }
        shorter
    })
}

/// The grace period to stop the pod's containers with: the deletion's own period when the
/// pod is being deleted, else `terminationGracePeriodSeconds` (default 30).
pub fn grace_seconds(pod: &Pod) -> i64 {
    pod.metadata
        .deletion_grace_period_seconds
        .or_else(|| {
            pod.spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds)
        })
        .unwrap_or(30)
        .max(0)
}

/// The grace period of a kill for a failed liveness or startup probe: the probe's own
/// `terminationGracePeriodSeconds` where it has one, unless the pod is being deleted
/// (upstream `setTerminationGracePeriod`).
pub fn probe_kill_grace(pod: &Pod, probe: Option<&k8s_openapi::api::core::v1::Probe>) -> i64 {
    match probe.and_then(|p| p.termination_grace_period_seconds) {
        Some(g) if pod.metadata.deletion_grace_period_seconds.is_none() => g.max(0),
        _ => grace_seconds(pod),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": "u"},
            "spec": {
                "initContainers": [
                    {"name": "s1", "restartPolicy": "Always"},
                    {"name": "init"},
                    {"name": "s2", "restartPolicy": "Always"},
                ],
                "containers": [{"name": "a"}, {"name": "b"}]
            }
        }))
        .unwrap()
    }

    /// Runs a "stop" of every name, each recording when it began, in the order allowed.
    async fn stop_order(order: Arc<TerminationOrder>, names: &[&str]) -> Vec<String> {
        let log = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut tasks = tokio::task::JoinSet::new();
        for (i, name) in names.iter().enumerate() {
            let (order, log, name) = (order.clone(), log.clone(), name.to_string());
            tasks.spawn(async move {
                // Regular containers take a while to stop, the later the longer.
                order.wait_for_turn(&name).await;
                log.lock().unwrap().push(name.clone());
                tokio::time::sleep(Duration::from_millis(10 * (i as u64 + 1))).await;
                order.stopped(&name);
            });
        }
        while tasks.join_next().await.is_some() {}
        Arc::try_unwrap(log).unwrap().into_inner().unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn sidecars_stop_after_the_regular_containers_in_reverse_order() {
        let running = ["s1", "s2", "a", "b"];
        let order = Arc::new(TerminationOrder::new(&pod(), &running));
        let got = stop_order(order, &running).await;
        assert_eq!(got[..2].iter().collect::<HashSet<_>>().len(), 2);
        assert!(got[..2].contains(&"a".to_string()) && got[..2].contains(&"b".to_string()));
        assert_eq!(got[2..], ["s2".to_string(), "s1".to_string()]);
    }

    #[tokio::test(start_paused = true)]
    async fn containers_that_do_not_run_are_not_waited_for() {
        // Only s1 and a run: s1 waits for a alone (s2 and b are not there).
        let running = ["s1", "a"];
        let order = Arc::new(TerminationOrder::new(&pod(), &running));
        assert_eq!(stop_order(order.clone(), &running).await, ["a", "s1"]);
        // Only sidecars run (the regular containers finished): the later one first.
        let running = ["s1", "s2"];
        let order = Arc::new(TerminationOrder::new(&pod(), &running));
        assert_eq!(stop_order(order, &running).await, ["s2", "s1"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_grace_period_only_shrinks_and_wakes_the_waiters() {
        let (clock, updates) = GraceClock::shrinkable(60);
        assert!(!shorten(&updates, 90), "a longer period is ignored");
        assert_eq!(clock.grace_seconds(), 60);
        let started = Instant::now();
        let waiter = tokio::spawn({
            let clock = clock.clone();
            async move { clock.expired().await }
        });
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(shorten(&updates, 1), "a shorter one applies");
        waiter.await.unwrap();
        // Expired at start + 1 s: already past when it shrank, so at once.
        assert!(started.elapsed() < Duration::from_secs(6));
        assert_eq!(clock.seconds_left(2), 2);
        assert_eq!(GraceClock::fixed(30).seconds_left(2), 30);
    }

    #[tokio::test(start_paused = true)]
    async fn the_time_spent_is_truncated_before_it_is_taken_off() {
        let clock = GraceClock::fixed(4);
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(
            clock.seconds_left(2),
            4,
            "0.6 s spent leaves 4 s, as upstream"
        );
        tokio::time::sleep(Duration::from_millis(900)).await;
        assert_eq!(clock.seconds_left(2), 3);
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(clock.seconds_left(2), 2, "never less than the minimum");
    }
}
