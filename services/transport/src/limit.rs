//! A bound on how many calls of some methods are under way at once over one channel: a
//! fixed number, or one that follows what the peer can take (pod-sync's bound on the
//! runtime's expensive calls, issue 29).
//!
//! The adaptive bound climbs the throughput hill. Calls are counted in windows of at least
//! `4 × limit` completions; a window in which no call had to wait for a permit says
//! nothing about the bound (the callers, not the bound, set the pace) and is dropped. Of a
//! window where calls waited, the throughput is its work per second, a call's work being
//! the fastest latency its method has shown (so that a burst of slow sandbox starts and one
//! of quick container starts weigh the same per unit of the runtime's effort). Then:
//!
//! - after a step up, a window with more than [`GAIN`] more throughput keeps the step and
//!   takes another; one without goes back to the bound before the step;
//! - after a step down, a window with no less than `1 − GAIN` of the throughput keeps the
//!   step (the same work with fewer calls in flight: each waits less in the runtime) and
//!   takes another; one with less goes back;
//! - a bound that held for [`HOLD_WINDOWS`] windows probes again, up and down in turn.
//!
//! So the bound rises while the runtime turns more concurrency into more work, and settles
//! at the least concurrency that gives the most work; when the runtime slows down (a busy
//! node, a slower disk) the next down-probe finds that fewer calls do as much.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The throughput change a probe must show to be kept (noise below it is ignored).
pub const GAIN: f64 = 0.05;
/// Windows a bound holds before it probes again.
pub const HOLD_WINDOWS: u32 = 3;
/// The fewest completions in a window.
const MIN_WINDOW: usize = 16;

/// The range an adaptive bound moves in, and where it starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Adaptive {
    pub initial: usize,
    pub min: usize,
    pub max: usize,
}

/// A bound on how many calls of some methods are under way at once over one channel,
/// shared by its clones. A limited call waits for a permit before it is sent, holds it
/// until its response arrives, and only then starts its span's clock; other methods pass
/// untouched. pod-sync uses it to bound the runtime's expensive calls (sandbox and
/// container creation and removal) instead of bounding whole pod syncs, which wait out
/// grace periods, hooks and image pulls.
#[derive(Clone)]
pub struct CallLimit {
    shared: Arc<Shared>,
    /// Whether a call's path ("/runtime.v1.RuntimeService/RunPodSandbox") is limited.
    pub(crate) covers: fn(&str) -> bool,
}

struct Shared {
    permits: Arc<Semaphore>,
    bound: Bound,
}

enum Bound {
    Fixed(usize),
    Adaptive(Mutex<Control>),
}

impl Shared {
    fn control(&self) -> Option<&Mutex<Control>> {
        match &self.bound {
            Bound::Fixed(_) => None,
            Bound::Adaptive(control) => Some(control),
        }
    }
}

impl CallLimit {
    /// At most `concurrent` covered calls at once.
    pub fn new(concurrent: usize, covers: fn(&str) -> bool) -> Self {
        let concurrent = concurrent.max(1);
        publish(concurrent);
        Self {
            shared: Arc::new(Shared {
                permits: Arc::new(Semaphore::new(concurrent)),
                bound: Bound::Fixed(concurrent),
            }),
            covers,
        }
    }

    /// A bound that follows the peer's throughput (see the module's text).
    pub fn adaptive(range: Adaptive, covers: fn(&str) -> bool) -> Self {
        let min = range.min.max(1);
        let max = range.max.max(min);
        let initial = range.initial.clamp(min, max);
        publish(initial);
        Self {
            shared: Arc::new(Shared {
                permits: Arc::new(Semaphore::new(initial)),
                bound: Bound::Adaptive(Mutex::new(Control::new(initial, min, max))),
            }),
            covers,
        }
    }

    /// The bound now.
    pub fn limit(&self) -> usize {
        match &self.shared.bound {
            Bound::Fixed(n) => *n,
            Bound::Adaptive(c) => c.lock().unwrap_or_else(|e| e.into_inner()).limit,
        }
    }

    /// Waits for a permit for a call of `path`; the guard, once [`Permit::done`] marks the
    /// call answered and it is dropped, counts the call's latency.
    pub(crate) async fn acquire(&self, path: &str) -> Permit {
        if let Some(control) = self.shared.control()
            && self.shared.permits.available_permits() == 0
        {
            control
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .window
                .waited = true;
        }
        // The semaphore is never closed; were it, the call would go unbounded.
        let permit = self.shared.permits.clone().acquire_owned().await.ok();
        Permit {
            permit,
            shared: self.shared.clone(),
            path: path.to_string(),
            started: Instant::now(),
            done: false,
        }
    }
}

impl std::fmt::Debug for CallLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallLimit")
            .field("limit", &self.limit())
            .field("available", &self.shared.permits.available_permits())
            .finish()
    }
}

/// A covered call's permit: returned (or, while the bound shrinks, forgotten) on drop.
pub(crate) struct Permit {
    permit: Option<OwnedSemaphorePermit>,
    shared: Arc<Shared>,
    path: String,
    started: Instant,
    done: bool,
}

impl Permit {
    /// The call was answered (a cancelled call's time says nothing of the peer).
    pub(crate) fn done(&mut self) {
        self.done = true;
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let Some(control) = self.shared.control() else {
            return;
        };
        let mut c = control.lock().unwrap_or_else(|e| e.into_inner());
        if self.done {
            let change = c.complete(&self.path, self.started.elapsed(), Instant::now());
            if change > 0 {
                self.shared.permits.add_permits(change as usize);
            } else if change < 0 {
                let want = change.unsigned_abs() as usize;
                let forgotten = self.shared.permits.forget_permits(want);
                c.debt += want - forgotten;
            }
        }
        if c.debt > 0
            && let Some(permit) = self.permit.take()
        {
            c.debt -= 1;
            permit.forget();
        }
    }
}

/// The bound as `nodeagent_runtime_call_limit` shows it (pod-sync holds the one bound).
fn publish(limit: usize) {
    nodeagent_telemetry::metrics::kubelet::RUNTIME_CALL_LIMIT.set(limit as i64);
}

#[derive(Debug, Default)]
struct Window {
    since: Option<Instant>,
    calls: usize,
    work: f64,
    /// A call found no permit free.
    waited: bool,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Step {
    Up,
    Down,
}

#[derive(Debug)]
struct Control {
    limit: usize,
    min: usize,
    max: usize,
    /// Permits still to forget as calls finish (a shrink while they were in use).
    debt: usize,
    /// The fastest latency seen per method (seconds): a call's work.
    floor: HashMap<String, f64>,
    window: Window,
    /// The bound held and its throughput.
    base: Option<(usize, f64)>,
    /// The probe under way, if any.
    probe: Option<Step>,
    /// Windows left before the next probe, and which way it goes.
    hold: u32,
    next: Step,
}

impl Control {
    fn new(limit: usize, min: usize, max: usize) -> Self {
        Self {
            limit,
            min,
            max,
            debt: 0,
            floor: HashMap::new(),
            window: Window::default(),
            base: None,
            probe: None,
            hold: 0,
            next: Step::Up,
        }
    }

    /// Counts one answered call; returns the change of the bound (permits to add, or to
    /// take away when negative). Every change is published, whichever rule made it.
    fn complete(&mut self, path: &str, took: Duration, now: Instant) -> i64 {
        let before = self.limit;
        let window = self.account(path, took, now);
        let after = self.limit;
        self.limit = before;
        let change = self.set(after);
        if change != 0 {
            publish(self.limit);
            tracing::debug!(
                limit = self.limit,
                throughput = window.map(|(_, t)| t),
                calls = window.map(|(c, _)| c),
                "the bound on concurrent calls moved"
            );
        }
        change
    }

    /// Counts one answered call and moves `limit` where a full window says so; the
    /// window's calls and throughput when one was measured.
    fn account(&mut self, path: &str, took: Duration, now: Instant) -> Option<(usize, f64)> {
        let took = took.as_secs_f64().max(1e-6);
        let floor = match self.floor.get_mut(path) {
            Some(f) => {
                *f = f.min(took);
                *f
            }
            None => {
                self.floor.insert(path.to_string(), took);
                took
            }
        };
        let since = *self.window.since.get_or_insert(now);
        self.window.calls += 1;
        self.window.work += floor;
        if self.window.calls < (4 * self.limit).max(MIN_WINDOW) {
            return None;
        }
        let window = std::mem::take(&mut self.window);
        let elapsed = now.duration_since(since).as_secs_f64();
        if !window.waited || elapsed <= 0.0 {
            // The callers set the pace: nothing learnt; a later burst starts afresh.
            if self.probe.take().is_some()
                && let Some((held, _)) = self.base
            {
                self.limit = held;
            } else {
                self.base = None;
            }
            return None;
        }
        let throughput = window.work / elapsed;
        match (self.base, self.probe) {
            (None, _) => {
                self.base = Some((self.limit, throughput));
                self.start_probe(Step::Up);
            }
            (Some((held, base)), Some(Step::Up)) => {
                if throughput > base * (1.0 + GAIN) {
                    self.base = Some((self.limit, throughput));
                    self.start_probe(Step::Up);
                } else {
                    self.settle(held, base, Step::Down);
                }
            }
            (Some((held, base)), Some(Step::Down)) => {
                if throughput >= base * (1.0 - GAIN) {
                    // Measured against the best: steps down cannot each lose a little.
                    self.base = Some((self.limit, base.max(throughput)));
                    self.start_probe(Step::Down);
                } else {
                    self.settle(held, base, Step::Up);
                }
            }
            (Some((held, base)), None) => {
                // Holding: the throughput at this bound, refreshed.
                self.base = Some((held, (base + throughput) / 2.0));
                if self.hold > 0 {
                    self.hold -= 1;
                } else {
                    self.start_probe(self.next);
                }
            }
        }
        Some((window.calls, throughput))
    }

    /// Probes one step `step`, or holds where a step is not possible.
    fn start_probe(&mut self, step: Step) {
        let to = match step {
            Step::Up => (self.limit + (self.limit / 2).max(1)).min(self.max),
            Step::Down => self
                .limit
                .saturating_sub((self.limit / 3).max(1))
                .max(self.min),
        };
        if to == self.limit {
            self.probe = None;
            self.hold = HOLD_WINDOWS;
            self.next = match step {
                Step::Up => Step::Down,
                Step::Down => Step::Up,
            };
        } else {
            self.probe = Some(step);
            self.limit = to;
        }
    }

    /// A probe that did not pay: back to `held`, which holds; the next probe goes `next`.
    fn settle(&mut self, held: usize, base: f64, next: Step) {
        self.base = Some((held, base));
        self.probe = None;
        self.hold = HOLD_WINDOWS;
        self.next = next;
        self.limit = held;
    }

    /// Moves the bound to `to`; the change in permits.
    fn set(&mut self, to: usize) -> i64 {
        let change = to as i64 - self.limit as i64;
        self.limit = to;
        change
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer whose throughput (work per second) at `limit` concurrent calls is
    /// `capacity(limit)`: each window of calls lasts as long as that work takes.
    fn run(control: &mut Control, capacity: impl Fn(usize) -> f64, windows: usize) -> Vec<usize> {
        let mut now = Instant::now();
        let mut seen = Vec::new();
        for _ in 0..windows {
            let calls = (4 * control.limit).max(MIN_WINDOW);
            // Every call's work is 0.1 s (its floor); the window lasts work / throughput.
            let step = Duration::from_secs_f64(0.1 / capacity(control.limit));
            control.window.waited = true;
            for _ in 0..calls {
                now += step;
                control.complete("/s.S/Heavy", Duration::from_millis(100), now);
            }
            seen.push(control.limit);
        }
        seen
    }

    /// A peer that gains up to 12 calls at once and no further climbs there and stays
    /// near it: it never settles below the knee, nor far above it.
    #[test]
    fn climbs_to_the_knee_and_stays_near_it() {
        let mut c = Control::new(4, 1, 64);
        let seen = run(&mut c, |l| l.min(12) as f64, 60);
        let held = held(&seen[20..]);
        assert!((12..=18).contains(&held), "{seen:?}");
    }

    /// The bound most windows of `seen` had (probes last a window each), once it is
    /// held in at least 60 % of them.
    fn held(seen: &[usize]) -> usize {
        let mut counts = HashMap::new();
        for l in seen {
            *counts.entry(*l).or_insert(0) += 1;
        }
        let (held, n) = counts.into_iter().max_by_key(|(_, n)| *n).unwrap();
        assert!(n * 10 >= seen.len() * 6, "{seen:?}");
        held
    }

    /// A peer that does most at 4 calls at once, and less the more it is given beyond:
    /// the bound comes down from 16 to 4.
    #[test]
    fn comes_down_when_concurrency_costs_throughput() {
        let mut c = Control::new(16, 1, 64);
        let seen = run(
            &mut c,
            |l| {
                if l <= 3 {
                    l as f64
                } else {
                    3.0 * 3.0 / l as f64 + 2.0
                }
            },
            60,
        );
        assert_eq!(held(&seen[30..]), 4, "{seen:?}");
    }

    /// A flat peer (the same throughput at any bound) is given the least concurrency.
    #[test]
    fn a_flat_peer_gets_the_least_concurrency() {
        let mut c = Control::new(8, 1, 64);
        let seen = run(&mut c, |_| 5.0, 60);
        assert!(seen[40..].iter().all(|l| *l <= 2), "{seen:?}");
    }

    /// Windows where no call waited teach nothing: the bound stays, a probe is undone.
    #[test]
    fn unsaturated_windows_leave_the_bound() {
        let mut c = Control::new(4, 1, 64);
        let mut now = Instant::now();
        for _ in 0..200 {
            now += Duration::from_millis(50);
            assert_eq!(c.complete("/s.S/Heavy", Duration::from_millis(10), now), 0);
        }
        assert_eq!(c.limit, 4);
        assert_eq!(c.base, None);
    }

    /// A probe undone by a window where no call waited shows in the gauge too (it once
    /// moved the bound back and left `nodeagent_runtime_call_limit` at the probe's value).
    /// The gauge is process-wide: nextest runs each test in its own process.
    #[test]
    fn an_undone_probe_is_published() {
        let gauge = &nodeagent_telemetry::metrics::kubelet::RUNTIME_CALL_LIMIT;
        let mut c = Control::new(4, 1, 64);
        let mut now = Instant::now();
        c.window.waited = true;
        let mut change = 0;
        for _ in 0..MIN_WINDOW {
            now += Duration::from_millis(10);
            change += c.complete("/s.S/Heavy", Duration::from_millis(10), now);
        }
        assert_eq!((change, c.probe), (2, Some(Step::Up)), "a first probe up");
        assert_eq!(gauge.get(), 6);
        change = 0;
        for _ in 0..(4 * c.limit).max(MIN_WINDOW) {
            now += Duration::from_millis(10);
            change += c.complete("/s.S/Heavy", Duration::from_millis(10), now);
        }
        assert_eq!((change, c.limit, c.probe), (-2, 4, None));
        assert_eq!(gauge.get(), 4, "the gauge follows the bound back");
    }

    /// Thousands of calls with varied latencies through an adaptive bound all finish, and
    /// afterwards the semaphore holds exactly the bound's permits.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_permit_is_lost_under_load() {
        let limit = CallLimit::adaptive(
            Adaptive {
                initial: 4,
                min: 1,
                max: 64,
            },
            |_| true,
        );
        let mut tasks = tokio::task::JoinSet::new();
        for n in 0..3000u64 {
            let limit = limit.clone();
            tasks.spawn(async move {
                let path = ["/s.S/A", "/s.S/B", "/s.S/C"][(n % 3) as usize];
                let mut permit = limit.acquire(path).await;
                tokio::time::sleep(Duration::from_micros(100 + (n * 7919) % 3000)).await;
                if n % 11 != 0 {
                    permit.done();
                }
            });
        }
        tokio::time::timeout(Duration::from_secs(60), async {
            while tasks.join_next().await.is_some() {}
        })
        .await
        .expect("every call finished");
        let c = limit.shared.control().unwrap().lock().unwrap();
        assert_eq!(c.debt, 0, "{c:?}");
        assert_eq!(limit.shared.permits.available_permits(), c.limit, "{c:?}");
    }

    /// A fixed bound reads the same with its permits in use.
    #[tokio::test]
    async fn a_fixed_bound_is_its_number() {
        let limit = CallLimit::new(3, |_| true);
        let _held = limit.acquire("/s.S/Heavy").await;
        assert_eq!(limit.limit(), 3);
    }

    /// The bound's moves reach the semaphore: a shrink while every permit is in use is
    /// paid back as the calls finish.
    #[tokio::test]
    async fn a_shrink_while_permits_are_held_is_paid_back() {
        let limit = CallLimit::adaptive(
            Adaptive {
                initial: 6,
                min: 1,
                max: 64,
            },
            |_| true,
        );
        let mut held = Vec::new();
        for _ in 0..6 {
            held.push(limit.acquire("/s.S/Heavy").await);
        }
        {
            let mut c = limit.shared.control().unwrap().lock().unwrap();
            let change = c.set(2);
            assert_eq!(change, -4);
            let forgotten = limit.shared.permits.forget_permits(4);
            c.debt += 4 - forgotten;
        }
        drop(held);
        assert_eq!(limit.shared.permits.available_permits(), 2);
        assert_eq!(limit.limit(), 2);
    }
}
