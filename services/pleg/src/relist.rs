//! The relist loop: list every sandbox and container (cheap), diff against the previous
//! relist, and read full status only for the pods that changed (expensive).

use nodeagent_cri::{Cri, Status, api, now_nanos};
use nodeagent_proto::api::{
    PlegWatchResponse, PodLifecycleEvent, RuntimePodStatus, pleg_watch_response::Kind,
    pod_lifecycle_event::Type,
};
use nodeagent_proto::k8s::labels;
use nodeagent_transport::Shutdown;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::broadcast;
use tracing::Instrument;

/// What the last relist saw, and the status cache.
#[derive(Default)]
pub struct RelistCache {
    /// container id -> (pod uid, CRI state) as of the last relist.
    containers: HashMap<String, (String, i32)>,
    /// sandbox id -> (pod uid, CRI state).
    sandboxes: HashMap<String, (String, i32)>,
    pub pods: BTreeMap<String, RuntimePodStatus>,
    pub revision: u64,
    /// When the last completed relist listed the runtime (taken before the list, so a
    /// change made after it is never taken as seen).
    pub listed_at_unix_nanos: i64,
    /// Pods whose inspection failed: inspected again at the next relist even if nothing
    /// changes (upstream's `podsToReinspect`); GetPodStatus reads them anew.
    pub reinspect: HashSet<String>,
    pub last_relist: Option<SystemTime>,
    pub last_relist_duration: Duration,
    pub last_error: Option<String>,
}

impl RelistCache {
    pub fn snapshot(&self) -> PlegWatchResponse {
        PlegWatchResponse {
            kind: Some(Kind::Snapshot(nodeagent_proto::api::PlegSnapshot {
                revision: self.revision,
                pods: self.pods.values().cloned().collect(),
                snapshot_continues: false,
            })),
        }
    }
}

/// The events that turn `old` (id -> (uid, state)) into `new`.
pub fn diff_events(
    old: &HashMap<String, (String, i32)>,
    new: &HashMap<String, (String, i32)>,
) -> Vec<(String, Type, String)> {
    let mut events = Vec::new();
    for (id, (uid, state)) in new {
        let before = old.get(id).map(|(_, s)| *s);
        let ty = match (before, *state) {
            (Some(b), s) if b == s => continue,
            (_, s) if s == api::ContainerState::ContainerRunning as i32 => Type::ContainerStarted,
            (_, s) if s == api::ContainerState::ContainerExited as i32 => Type::ContainerDied,
            _ => Type::ContainerChanged,
        };
        events.push((uid.clone(), ty, id.clone()));
    }
    for (id, (uid, _)) in old {
        if !new.contains_key(id) {
            events.push((uid.clone(), Type::ContainerRemoved, id.clone()));
        }
    }
    events.sort();
    events
}

pub(crate) struct Relister {
    cri: Cri,
    cache: Arc<Mutex<RelistCache>>,
    events: broadcast::Sender<PlegWatchResponse>,
}

impl Relister {
    pub fn new(
        cri: Cri,
        cache: Arc<Mutex<RelistCache>>,
        events: broadcast::Sender<PlegWatchResponse>,
    ) -> Self {
        Self { cri, cache, events }
    }

    /// Relists every `period` until `shutdown`, beating `heartbeat` after each relist.
    pub async fn run(
        self,
        period: Duration,
        shutdown: Shutdown,
        heartbeat: nodeagent_transport::Heartbeat,
    ) {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.wait() => return,
                _ = tick.tick() => {}
            }
            let started = Instant::now();
            // One span per relist: its CRI calls form one trace rather than one each.
            let result = self
                .relist()
                .instrument(tracing::info_span!("relist"))
                .await;
            let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            cache.last_relist_duration = started.elapsed();
            heartbeat.beat();
            let took = cache.last_relist_duration.as_secs_f64();
            crate::metrics::observe_relist_duration(took);
            match result {
                Ok(()) => {
                    let now = SystemTime::now();
                    let interval = cache.last_relist.and_then(|t| now.duration_since(t).ok());
                    crate::metrics::observe_relist(now, interval.map(|i| i.as_secs_f64()));
                    cache.last_relist = Some(now);
                    cache.last_error = None;
                }
                Err(e) => {
                    if cache.last_error.as_deref() != Some(e.message()) {
                        tracing::warn!(error = %e.message(), "relist failed");
                    }
                    cache.last_error = Some(e.message().to_string());
                }
            }
        }
    }

    async fn relist(&self) -> Result<(), Status> {
        // Every status built from this list is as old as the list, not as its inspection.
        let listed_at = now_nanos();
        let sandboxes = self.cri.list_sandboxes(None).await?;
        let containers = self.cri.list_containers(None).await?;
        crate::metrics::record_runtime_view(
            &sandboxes.iter().map(|s| s.state).collect::<Vec<_>>(),
            &containers.iter().map(|c| c.state).collect::<Vec<_>>(),
        );
        let uid_of = |l: &HashMap<String, String>| l.get(labels::POD_UID).cloned();
        let new_containers: HashMap<String, (String, i32)> = containers
            .iter()
            .filter_map(|c| Some((c.id.clone(), (uid_of(&c.labels)?, c.state))))
            .collect();
        let new_sandboxes: HashMap<String, (String, i32)> = sandboxes
            .iter()
            .filter_map(|s| Some((s.id.clone(), (uid_of(&s.labels)?, s.state))))
            .collect();

        let (container_events, mut changed_pods) = {
            let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            let events = diff_events(&cache.containers, &new_containers);
            let mut changed: HashSet<String> =
                events.iter().map(|(uid, _, _)| uid.clone()).collect();
            for (uid, _, _) in diff_events(&cache.sandboxes, &new_sandboxes) {
                changed.insert(uid);
            }
            (events, changed)
        };
        // Pods that exist but were never inspected (first relist), and pods whose last
        // inspection failed, are "changed" too.
        {
            let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            for (uid, _) in new_sandboxes.values().chain(new_containers.values()) {
                if !cache.pods.contains_key(uid) || cache.reinspect.contains(uid) {
                    changed_pods.insert(uid.clone());
                }
            }
        }
        let mut failed = HashSet::new();

        let mut fresh = HashMap::new();
        for uid in &changed_pods {
            let sbs: Vec<_> = sandboxes
                .iter()
                .filter(|s| uid_of(&s.labels).as_ref() == Some(uid))
                .cloned()
                .collect();
            let cs: Vec<_> = containers
                .iter()
                .filter(|c| uid_of(&c.labels).as_ref() == Some(uid))
                .cloned()
                .collect();
            if sbs.is_empty() && cs.is_empty() {
                continue; // gone entirely
            }
            match nodeagent_cri::inspect_pod(&self.cri, uid, &sbs, &cs, listed_at).await {
                Ok(status) => {
                    fresh.insert(uid.clone(), status);
                }
                // Upstream: no events for it now, and it is inspected again next time,
                // whether or not anything changes (else its cached status stays stale).
                Err(e) => {
                    tracing::info!(pod.uid = %uid, error = %e.message(), "status read failed; inspecting again at the next relist");
                    failed.insert(uid.clone());
                }
            }
        }
        changed_pods.retain(|uid| !failed.contains(uid));

        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        cache.containers = new_containers;
        cache.sandboxes = new_sandboxes;
        cache.listed_at_unix_nanos = listed_at;
        cache.reinspect = failed;
        let live: HashSet<&String> = cache
            .containers
            .values()
            .chain(cache.sandboxes.values())
            .map(|(u, _)| u)
            .collect();
        let gone: Vec<String> = cache
            .pods
            .keys()
            .filter(|u| !live.contains(u))
            .cloned()
            .collect();
        for uid in &gone {
            cache.pods.remove(uid);
        }
        for (uid, status) in fresh {
            cache.pods.insert(uid, status);
        }
        let mut pod_events: Vec<(String, Type, String)> = container_events
            .into_iter()
            .filter(|(uid, _, _)| !cache.reinspect.contains(uid))
            .collect();
        for uid in changed_pods.iter().chain(gone.iter()) {
            if !pod_events.iter().any(|(u, _, _)| u == uid) {
                pod_events.push((uid.clone(), Type::PodSync, String::new()));
            }
        }
        for (uid, ty, container_id) in pod_events {
            cache.revision += 1;
            let event = PodLifecycleEvent {
                revision: cache.revision,
                // A pod gone from the list is gone as of that list.
                status: cache.pods.get(&uid).cloned().or_else(|| {
                    Some(RuntimePodStatus {
                        uid: uid.clone(),
                        timestamp_unix_nanos: listed_at,
                        ..Default::default()
                    })
                }),
                pod_uid: uid,
                r#type: ty as i32,
                container_id,
                trace: None,
            };
            tracing::debug!(pod.uid = %event.pod_uid, event = ?ty, container.id = %event.container_id, "lifecycle event");
            let _ = self.events.send(PlegWatchResponse {
                kind: Some(Kind::Event(event)),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(items: &[(&str, &str, i32)]) -> HashMap<String, (String, i32)> {
        items
            .iter()
            .map(|(id, uid, s)| (id.to_string(), (uid.to_string(), *s)))
            .collect()
    }

    #[test]
    fn diff_names_each_transition() {
        let running = api::ContainerState::ContainerRunning as i32;
        let exited = api::ContainerState::ContainerExited as i32;
        let created = api::ContainerState::ContainerCreated as i32;
        let old = m(&[
            ("a", "p1", running),
            ("b", "p1", running),
            ("c", "p2", exited),
        ]);
        let new = m(&[
            ("a", "p1", running),
            ("b", "p1", exited),
            ("d", "p2", created),
        ]);
        let events = diff_events(&old, &new);
        assert_eq!(
            events,
            vec![
                ("p1".into(), Type::ContainerDied, "b".into()),
                ("p2".into(), Type::ContainerRemoved, "c".into()),
                ("p2".into(), Type::ContainerChanged, "d".into()),
            ]
        );
        assert!(diff_events(&new, &new).is_empty());
    }
}
