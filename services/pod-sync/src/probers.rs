//! The probe instances registered with pod-sync (`RegisterProber`, issue 11): an instance
//! is a member while its registration stream is open, every member is told the member
//! list on open and on each change, and each member's results are followed at the endpoint
//! it registered, by one follower task that stops when the member leaves.
//!
//! Membership is the open stream, not a lease or a heartbeat: a killed instance's socket
//! closes at once, so its pods move within one round trip, and there is nothing to expire.
//! Readiness does not flip on the move because pod-sync keeps every value by container ID
//! and only a result a worker produced changes one (see `probe_state`).

use nodeagent_config::Address;
use nodeagent_proto::api::{ProbeResultUpdate, ProberMembership};
use nodeagent_transport::{Shutdown, WatchStream};
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// After pod-sync starts, the first member list waits this long so that the instances
/// that were registered before the restart can all register again: a list sent at once
/// would name only the quickest one, which would take every pod for a moment. Instances
/// keep their last list meanwhile, so the wait costs nothing.
const SETTLE_AFTER_START: Duration = Duration::from_secs(2);

/// Messages queued for one member's registration stream.
const MEMBER_QUEUE: usize = 8;

struct Member {
    /// Which registration this is: a re-registration under the same id replaces the
    /// member, and the replaced stream's end must not remove its successor.
    generation: u64,
    follower: JoinHandle<()>,
}

/// Why a registration was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RegisterError {
    /// The instance id is empty, too long or has a character outside [A-Za-z0-9._-].
    #[error("instance id {0:?}: want 1 to 63 of [A-Za-z0-9._-]")]
    InstanceId(String),
    /// The endpoint is not an address pod-sync can dial.
    #[error("endpoint {0:?}: {1}")]
    Endpoint(String, String),
}

impl From<RegisterError> for tonic::Status {
    fn from(e: RegisterError) -> Self {
        tonic::Status::invalid_argument(e.to_string())
    }
}

/// Starts the results follower of a member at its endpoint; the results go to the one
/// task that applies and saves probe values.
pub type SpawnFollower = Box<dyn Fn(String, Address) -> JoinHandle<()> + Send + Sync>;

pub struct Probers {
    members: Mutex<(BTreeMap<String, Member>, u64)>,
    list: watch::Sender<Vec<String>>,
    spawn_follower: SpawnFollower,
    settle_until: Instant,
    shutdown: Shutdown,
}

impl Probers {
    pub fn new(spawn_follower: SpawnFollower, shutdown: Shutdown) -> Self {
        Self {
            members: Mutex::new((BTreeMap::new(), 0)),
            list: watch::Sender::new(Vec::new()),
            spawn_follower,
            settle_until: Instant::now() + SETTLE_AFTER_START,
            shutdown,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (BTreeMap<String, Member>, u64)> {
        self.members.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds (or replaces) member `id` and returns its registration stream, whose end (the
    /// instance went away, or we shut down) removes it.
    pub fn register(
        self: &std::sync::Arc<Self>,
        id: &str,
        endpoint: &str,
    ) -> Result<WatchStream<ProberMembership>, RegisterError> {
        let valid_id = !id.is_empty()
            && id.len() <= 63
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if !valid_id {
            return Err(RegisterError::InstanceId(id.to_string()));
        }
        let address: Address = endpoint
            .parse()
            .map_err(|e| RegisterError::Endpoint(endpoint.to_string(), e))?;
        let generation = {
            let mut guard = self.lock();
            let (members, next) = &mut *guard;
            *next += 1;
            let follower = (self.spawn_follower)(id.to_string(), address);
            if let Some(old) = members.insert(
                id.to_string(),
                Member {
                    generation: *next,
                    follower,
                },
            ) {
                old.follower.abort();
            }
            self.push(members);
            *next
        };
        tracing::info!(probe.instance = %id, %endpoint, "probe instance registered");
        let (tx, rx) = mpsc::channel(MEMBER_QUEUE);
        let mut lists = self.list.subscribe();
        let this = self.clone();
        let id = id.to_string();
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep_until(this.settle_until) => {}
                _ = tx.closed() => {}
                _ = this.shutdown.wait() => {}
            }
            loop {
                if tx.is_closed() || this.shutdown.is_triggered() {
                    break;
                }
                let ids = lists.borrow_and_update().clone();
                if tx
                    .send(Ok(ProberMembership { instance_ids: ids }))
                    .await
                    .is_err()
                {
                    break;
                }
                tokio::select! {
                    _ = this.shutdown.wait() => break,
                    _ = tx.closed() => break,
                    changed = lists.changed() => if changed.is_err() { break },
                }
            }
            this.leave(&id, generation);
        });
        Ok(tokio_stream::wrappers::ReceiverStream::new(rx))
    }

    fn leave(&self, id: &str, generation: u64) {
        let mut guard = self.lock();
        let (members, _) = &mut *guard;
        if members.get(id).is_some_and(|m| m.generation == generation) {
            if let Some(m) = members.remove(id) {
                m.follower.abort();
            }
            tracing::info!(probe.instance = %id, "probe instance left; its pods go to the others");
            self.push(members);
        }
    }

    /// Tells every registration stream the new member list.
    fn push(&self, members: &BTreeMap<String, Member>) {
        let ids: Vec<String> = members.keys().cloned().collect();
        self.list.send_if_modified(|held| {
            let changed = *held != ids;
            *held = ids;
            changed
        });
    }

    /// The ids registered now.
    #[cfg(test)]
    fn ids(&self) -> Vec<String> {
        self.lock().0.keys().cloned().collect()
    }
}

/// A member's results as they arrive: forwarded to the single applier.
pub type ResultsTx = mpsc::Sender<ProbeResultUpdate>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tokio_stream::StreamExt;

    fn probers() -> Arc<Probers> {
        let (_trigger, shutdown) = nodeagent_transport::shutdown_channel();
        std::mem::forget(_trigger);
        Arc::new(Probers::new(
            Box::new(|_, _| tokio::spawn(std::future::pending())),
            shutdown,
        ))
    }

    async fn next(s: &mut WatchStream<ProberMembership>) -> Vec<String> {
        s.next().await.expect("open").expect("ok").instance_ids
    }

    #[tokio::test(start_paused = true)]
    async fn members_join_and_leave_with_their_streams() {
        let p = probers();
        let mut a = p.register("a", "unix:///run/p-a.sock").unwrap();
        let mut b = p.register("b", "unix:///run/p-b.sock").unwrap();
        // The first list waits for the settle time after start, then names both.
        assert_eq!(next(&mut a).await, ["a", "b"]);
        assert_eq!(next(&mut b).await, ["a", "b"]);
        drop(b);
        assert_eq!(next(&mut a).await, ["a"], "b's stream ended: b left");
        assert_eq!(p.ids(), ["a"]);
        // A re-registration replaces the member; the old stream's end removes nothing.
        let mut a2 = p.register("a", "unix:///run/p-a.sock").unwrap();
        assert_eq!(next(&mut a2).await, ["a"]);
        drop(a);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(p.ids(), ["a"]);
    }

    #[tokio::test]
    async fn bad_registrations_are_refused() {
        let p = probers();
        assert!(matches!(
            p.register("../x", "unix:///run/p.sock"),
            Err(RegisterError::InstanceId(_))
        ));
        assert!(matches!(
            p.register("a", "http://x"),
            Err(RegisterError::Endpoint(..))
        ));
        assert!(p.ids().is_empty());
    }
}
