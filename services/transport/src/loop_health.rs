//! Whether a service's own main loops still run. Each loop registers a name and how long
//! it may stay silent, then beats every round; the server reports NOT_SERVING and stops
//! pinging the systemd watchdog while any loop is stale, so a stuck loop is never
//! reported healthy.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// Whether one part of the service is alive, asked on every health round (e.g. "is the
/// state lock free"). A failure counts only once it lasts [`CHECK_GRACE`].
pub type LivenessCheck = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// How long a [`LivenessCheck`] must keep failing before it counts: a lock that happens
/// to be held at the moment of one sample is not a stall.
pub const CHECK_GRACE: Duration = Duration::from_secs(5);

enum Watched {
    Beats {
        last: Instant,
        max_silence: Duration,
    },
    Check {
        check: LivenessCheck,
        failing_since: Option<Instant>,
    },
}

/// The registry of a service's main loops. Clones share it.
#[derive(Clone, Default)]
pub struct LoopHealth {
    loops: Arc<Mutex<BTreeMap<String, Watched>>>,
}

/// One registered loop's handle: call [`Heartbeat::beat`] every round.
#[derive(Clone)]
pub struct Heartbeat {
    name: String,
    loops: Arc<Mutex<BTreeMap<String, Watched>>>,
}

impl Heartbeat {
    pub fn beat(&self) {
        let mut loops = self.loops.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(Watched::Beats { last, .. }) = loops.get_mut(&self.name) {
            *last = Instant::now();
        }
    }
}

impl LoopHealth {
    /// Registers a loop that must beat at least every `max_silence`; it counts as alive
    /// from now. Registering a name again replaces the earlier entry.
    pub fn register(&self, name: &str, max_silence: Duration) -> Heartbeat {
        let watched = Watched::Beats {
            last: Instant::now(),
            max_silence,
        };
        self.lock().insert(name.to_string(), watched);
        Heartbeat {
            name: name.to_string(),
            loops: self.loops.clone(),
        }
    }

    /// Adds a check asked on every health round (see [`CHECK_GRACE`]).
    pub fn add_check(&self, name: &str, check: LivenessCheck) {
        let watched = Watched::Check {
            check,
            failing_since: None,
        };
        self.lock().insert(name.to_string(), watched);
    }

    /// Ok while every loop is alive; otherwise says which are not and why.
    pub fn check(&self) -> Result<(), String> {
        let now = Instant::now();
        let mut stale = Vec::new();
        for (name, watched) in self.lock().iter_mut() {
            if let Err(why) = watched.evaluate(now) {
                stale.push(format!("{name}: {why}"));
            }
        }
        if stale.is_empty() {
            Ok(())
        } else {
            Err(stale.join("; "))
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Watched>> {
        self.loops.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Watched {
    fn evaluate(&mut self, now: Instant) -> Result<(), String> {
        match self {
            Watched::Beats { last, max_silence } => {
                let silent = now.saturating_duration_since(*last);
                if silent > *max_silence {
                    return Err(format!("no beat for {silent:?} (limit {max_silence:?})"));
                }
                Ok(())
            }
            Watched::Check {
                check,
                failing_since,
            } => match check() {
                Ok(()) => {
                    *failing_since = None;
                    Ok(())
                }
                Err(why) => {
                    let since = *failing_since.get_or_insert(now);
                    if now.saturating_duration_since(since) >= CHECK_GRACE {
                        return Err(why);
                    }
                    Ok(())
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[tokio::test(start_paused = true)]
    async fn a_loop_that_stops_beating_goes_stale_and_recovers_on_its_next_beat() {
        let health = LoopHealth::default();
        let relist = health.register("relist", Duration::from_secs(10));
        let other = health.register("other", Duration::from_secs(60));
        assert_eq!(health.check(), Ok(()));
        tokio::time::advance(Duration::from_secs(8)).await;
        relist.beat();
        tokio::time::advance(Duration::from_secs(8)).await;
        assert_eq!(health.check(), Ok(()), "beaten 8 s ago");
        tokio::time::advance(Duration::from_secs(3)).await;
        let err = health.check().unwrap_err();
        assert!(err.starts_with("relist: no beat for 11"), "{err}");
        assert!(!err.contains("other"), "{err}");
        relist.beat();
        assert_eq!(health.check(), Ok(()));
        other.beat();
    }

    #[tokio::test(start_paused = true)]
    async fn a_check_counts_only_once_it_keeps_failing_for_the_grace_period() {
        let health = LoopHealth::default();
        let held = Arc::new(AtomicBool::new(true));
        let flag = held.clone();
        health.add_check(
            "state lock",
            Arc::new(move || {
                if flag.load(Ordering::SeqCst) {
                    Err("the state lock is held".into())
                } else {
                    Ok(())
                }
            }),
        );
        assert_eq!(
            health.check(),
            Ok(()),
            "a single failing sample is no stall"
        );
        tokio::time::advance(CHECK_GRACE).await;
        assert_eq!(
            health.check(),
            Err("state lock: the state lock is held".into())
        );
        held.store(false, Ordering::SeqCst);
        assert_eq!(health.check(), Ok(()));
        held.store(true, Ordering::SeqCst);
        assert_eq!(health.check(), Ok(()), "the grace starts again");
    }
}
