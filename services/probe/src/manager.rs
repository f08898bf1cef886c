//! The probe manager: which containers get which probe workers (from pod-sync's status
//! stream), the workers themselves, and the results stream.

use crate::check::{Checked, ProbeCheck, run_check};
use crate::metrics::probe_kind_name;
use crate::shard::Ownership;
use k8s_openapi::api::core::v1::{Container, Pod, Probe};
use nodeagent_config::events::{EventRecorder, EventType};
use nodeagent_cri::Cri;
use nodeagent_proto::api::pod_sync_client::PodSyncClient;
use nodeagent_proto::api::prober_server::Prober;
use nodeagent_proto::api::{
    PodStatusUpdate, ProbeResult, ProbeResultUpdate, RegisterProberRequest, WatchPodStatusRequest,
    WatchProbeResultsRequest, probe_result::Kind, probe_result::Outcome,
};
use nodeagent_proto::k8s;
use nodeagent_transport::WithLimits;
use nodeagent_transport::{
    Channel, Shutdown, WatchEvent, WatchStream, snapshot_then_deltas, watch_with_retry,
};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use tracing::Instrument;

/// (pod uid, container name, probe kind).
type WorkerKey = (String, String, i32);

struct Worker {
    container_id: String,
    handle: JoinHandle<()>,
}

struct Inner {
    /// Which of `pods` this instance probes.
    ownership: Ownership,
    /// Shared with the workers that probe it (one copy of each pod, not one per probe).
    pods: BTreeMap<String, Arc<Pod>>,
    workers: HashMap<WorkerKey, Worker>,
    results: BTreeMap<WorkerKey, ProbeResult>,
    revision: u64,
}

pub struct ProbeManager {
    cri: Cri,
    /// Unhealthy and ProbeWarning events, as upstream's prober records them.
    events: EventRecorder,
    /// When this process began probing: workers started within one period of it spread
    /// their first run over that period (upstream's start-up jitter).
    started: std::time::Instant,
    shutdown: Shutdown,
    inner: Mutex<Inner>,
    tx: broadcast::Sender<ProbeResultUpdate>,
}

impl ProbeManager {
    pub fn new(cri: Cri, events: EventRecorder, shutdown: Shutdown, ownership: Ownership) -> Self {
        let (tx, _) = broadcast::channel(1024);
        Self {
            cri,
            events,
            started: std::time::Instant::now(),
            shutdown,
            inner: Mutex::new(Inner {
                ownership,
                pods: BTreeMap::new(),
                workers: HashMap::new(),
                results: BTreeMap::new(),
                revision: 0,
            }),
            tx,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn stop_all(&self) {
        for (_, w) in self.lock().workers.drain() {
            w.handle.abort();
        }
    }

    pub async fn follow_pod_sync(self: Arc<Self>, channel: Channel) {
        let client = PodSyncClient::new(channel).with_limits();
        let mut rx = watch_with_retry("pod-sync", self.shutdown.clone(), move || {
            let mut c = client.clone();
            async move {
                Ok(c.watch_pod_status(WatchPodStatusRequest {
                    accept_chunked_snapshot: true,
                })
                .await?
                .into_inner())
            }
        });
        while let Some(event) = rx.recv().await {
            match event {
                WatchEvent::Connected => tracing::info!("following pod-sync"),
                WatchEvent::Disconnected(reason) => {
                    tracing::debug!(%reason, "pod-sync stream broken")
                }
                WatchEvent::Message(update) => self.apply(update),
            }
        }
    }

    /// Registers this instance with pod-sync for as long as it lives and follows the member
    /// list. While pod-sync is away (restarting) the last list stays: its pods keep their
    /// workers rather than moving twice.
    pub async fn register(
        self: Arc<Self>,
        channel: Channel,
        instance_id: String,
        endpoint: String,
    ) {
        let client = PodSyncClient::new(channel).with_limits();
        let request = RegisterProberRequest {
            instance_id,
            endpoint,
        };
        let mut rx = watch_with_retry("pod-sync registration", self.shutdown.clone(), move || {
            let mut c = client.clone();
            let request = request.clone();
            async move { Ok(c.register_prober(request).await?.into_inner()) }
        });
        while let Some(event) = rx.recv().await {
            match event {
                WatchEvent::Connected => tracing::info!("registered with pod-sync"),
                WatchEvent::Disconnected(reason) => {
                    tracing::info!(%reason, "registration with pod-sync broken; keeping the last member list")
                }
                WatchEvent::Message(m) => self.set_members(m.instance_ids),
            }
        }
    }

    fn set_members(self: &Arc<Self>, members: Vec<String>) {
        {
            let mut inner = self.lock();
            let next = inner.ownership.with_members(members);
            if next == inner.ownership {
                return;
            }
            tracing::info!(ownership = ?next, "probe members changed");
            inner.ownership = next;
        }
        self.reconcile_workers();
    }

    fn apply(self: &Arc<Self>, update: PodStatusUpdate) {
        {
            let mut inner = self.lock();
            if update.snapshot {
                inner.pods.clear();
            }
            for bytes in &update.pods_json {
                match k8s::decode_pod(bytes) {
                    Ok(p) => {
                        inner.pods.insert(k8s::pod_uid(&p).to_string(), Arc::new(p));
                    }
                    Err(e) => tracing::error!(error = %e, "undecodable pod from pod-sync"),
                }
            }
            for uid in &update.removed_uids {
                inner.pods.remove(uid);
            }
        }
        self.reconcile_workers();
    }

    /// Starts a worker for every probe of every running container, stops the rest.
    fn reconcile_workers(self: &Arc<Self>) {
        let mut inner = self.lock();
        let mut wanted: HashMap<WorkerKey, (String, ProbeCheck, Arc<Pod>)> = HashMap::new();
        // (pod uid, container name, container id) of every running container.
        let mut live: HashSet<(String, String, String)> = HashSet::new();
        for (uid, pod) in &inner.pods {
            // Another instance's pod: its workers stop and its results go (below), so a
            // later snapshot of ours never carries an old value over the new owner's.
            if !inner.ownership.owns(uid) {
                continue;
            }
            let spec = pod.spec.clone().unwrap_or_default();
            let status = pod.status.clone().unwrap_or_default();
            let pod_ip = status.pod_ip.clone().unwrap_or_default();
            // Regular containers and sidecars (restartable init containers) are probed.
            let statuses = status
                .container_statuses
                .iter()
                .flatten()
                .chain(status.init_container_statuses.iter().flatten());
            for cs in statuses {
                let running = cs.state.as_ref().is_some_and(|s| s.running.is_some());
                let Some(id) = cs
                    .container_id
                    .as_deref()
                    .and_then(|i| i.split("://").nth(1))
                else {
                    continue;
                };
                let sidecars = spec
                    .init_containers
                    .iter()
                    .flatten()
                    .filter(|c| c.restart_policy.as_deref() == Some("Always"));
                let Some(c) = spec
                    .containers
                    .iter()
                    .chain(sidecars)
                    .find(|c| c.name == cs.name)
                else {
                    continue;
                };
                if !running {
                    continue;
                }
                live.insert((uid.clone(), c.name.clone(), id.to_string()));
                // Upstream: with a startup probe, liveness and readiness wait until it
                // has succeeded once, and it stops once pod-sync reports the container
                // started (which pod-sync keeps across restarts of either service).
                let reported_started = cs.started == Some(true);
                let started = c.startup_probe.is_none()
                    || reported_started
                    || inner
                        .results
                        .get(&(uid.clone(), c.name.clone(), Kind::Startup as i32))
                        .is_some_and(|r| r.container_id == id && r.outcome() == Outcome::Success);
                let started_at = cs
                    .state
                    .as_ref()
                    .and_then(|s| s.running.as_ref()?.started_at.as_ref())
                    .map(|t| std::time::SystemTime::from(t.0));
                for (kind, probe) in probes(c) {
                    let skip = match kind {
                        Kind::Startup => reported_started,
                        _ => !started,
                    };
                    if skip {
                        continue;
                    }
                    let check = ProbeCheck {
                        probe,
                        container_id: id.to_string(),
                        pod_ip: pod_ip.clone(),
                        named_ports: nodeagent_cri::actions::named_ports(c),
                        started_at,
                    };
                    wanted.insert(
                        (uid.clone(), c.name.clone(), kind as i32),
                        (id.to_string(), check, pod.clone()),
                    );
                }
            }
        }
        let stale: Vec<WorkerKey> = inner
            .workers
            .iter()
            .filter(|(k, w)| {
                wanted
                    .get(*k)
                    .is_none_or(|(id, _, _)| *id != w.container_id)
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in stale {
            if let Some(w) = inner.workers.remove(&k) {
                w.handle.abort();
            }
            // A finished startup probe's success stays in the results while its container
            // runs: a pod-sync that restarts without it on disk (an older build, a lost
            // file) learns it from our snapshot instead of seeing `started` flip back.
            let container_runs = inner.results.get(&k).is_some_and(|r| {
                live.contains(&(k.0.clone(), k.1.clone(), r.container_id.clone()))
            });
            if !container_runs {
                inner.results.remove(&k);
            }
        }
        // A kept startup success has no worker left to stop: drop those of pods now owned
        // by another instance too.
        let Inner {
            ownership, results, ..
        } = &mut *inner;
        results.retain(|k, _| ownership.owns(&k.0));
        for (key, (id, check, pod)) in wanted {
            if inner.workers.contains_key(&key) {
                continue;
            }
            // A root span: a worker started by another one (a startup probe that passed
            // starts the others) is not its child.
            let span = tracing::info_span!(
                parent: None,
                "probe_worker",
                k8s.pod.uid = %key.0,
                k8s.pod.name = %k8s::pod_name(&pod),
                k8s.namespace.name = %k8s::pod_namespace(&pod),
                k8s.container.name = %key.1,
                probe = ?Kind::try_from(key.2).unwrap_or(Kind::Unspecified),
            );
            let metrics = crate::metrics::ProbeMetrics::new(
                key.2,
                &key.1,
                k8s::pod_name(&pod),
                k8s::pod_namespace(&pod),
                &key.0,
            );
            let handle = tokio::spawn(
                self.clone()
                    .worker(key.clone(), check, pod, metrics)
                    .instrument(span),
            );
            inner.workers.insert(
                key,
                Worker {
                    container_id: id,
                    handle,
                },
            );
        }
    }

    async fn worker(
        self: Arc<Self>,
        key: WorkerKey,
        check: ProbeCheck,
        pod: Arc<Pod>,
        metrics: crate::metrics::ProbeMetrics,
    ) {
        let kind = probe_kind_name(key.2);
        let p = check.probe.clone();
        let period = Duration::from_secs(p.period_seconds.unwrap_or(10).max(1) as u64);
        let success_threshold = p.success_threshold.unwrap_or(1).max(1);
        let failure_threshold = p.failure_threshold.unwrap_or(3).max(1);
        // Upstream: a prober that has just started (a restart) would otherwise probe every
        // container at once; each worker first waits a random part of its period. A
        // container that starts later is probed at once.
        if period > self.started.elapsed() {
            tokio::time::sleep(start_jitter(&key, period)).await;
        }
        tokio::time::sleep(initial_delay(
            &p,
            check.started_at,
            std::time::SystemTime::now(),
        ))
        .await;
        let (mut successes, mut failures) = (0, 0);
        let mut current: Option<Outcome> = None;
        let mut tick = tokio::time::interval(period);
        loop {
            tick.tick().await;
            let probed = std::time::Instant::now();
            // Boxed: a check's state (an HTTP or gRPC client call, about 11 KiB) is held
            // only while it runs, not by every waiting worker.
            let verdict = verdict(kind, Box::pin(run_check(&self.cri, &check)).await);
            if let Some((reason, message)) = &verdict.event {
                self.events
                    .container(&pod, &key.1, EventType::Warning, reason, message);
            }
            let Some(result) = verdict.result else {
                tracing::warn!(message = ?verdict.event, "probe errored");
                continue;
            };
            metrics.observe(result.is_ok(), probed.elapsed().as_secs_f64());
            let outcome = match &result {
                Ok(()) => {
                    successes += 1;
                    failures = 0;
                    (successes >= success_threshold).then_some(Outcome::Success)
                }
                Err(reason) => {
                    failures += 1;
                    successes = 0;
                    tracing::debug!(%reason, failures, "probe failed");
                    (failures >= failure_threshold).then_some(Outcome::Failure)
                }
            };
            if let Some(o) = outcome
                && current != Some(o)
            {
                current = Some(o);
                tracing::info!(outcome = ?o, message = %result.as_ref().err().cloned().unwrap_or_default(), "probe result changed");
                self.publish(
                    &key,
                    &check.container_id,
                    o,
                    result.err().unwrap_or_default(),
                );
                if key.2 == Kind::Startup as i32 && o == Outcome::Success {
                    // A startup probe is done once it succeeds; the others start now.
                    self.reconcile_workers();
                    return;
                }
            }
        }
    }

    fn publish(&self, key: &WorkerKey, container_id: &str, outcome: Outcome, message: String) {
        let mut inner = self.lock();
        if !inner.workers.contains_key(key) {
            return;
        }
        let result = ProbeResult {
            pod_uid: key.0.clone(),
            container_name: key.1.clone(),
            container_id: container_id.to_string(),
            kind: key.2,
            outcome: outcome as i32,
            message,
            trace: nodeagent_telemetry::current_trace_context(),
        };
        inner.results.insert(key.clone(), result.clone());
        inner.revision += 1;
        let _ = self.tx.send(ProbeResultUpdate {
            revision: inner.revision,
            snapshot: false,
            results: vec![result],
            snapshot_continues: false,
        });
    }
}

/// What one run of a probe means (upstream `prober.probe`).
#[derive(Debug, PartialEq, Eq)]
struct Verdict {
    /// What the counters see; `None` for a prober error, which upstream throws away (no
    /// result, no metric, counters unchanged).
    result: Option<Result<(), String>>,
    /// A Warning event to record on the container: (reason, message).
    event: Option<(&'static str, String)>,
}

fn verdict(kind: &str, checked: Checked) -> Verdict {
    match checked {
        Checked::Success => Verdict {
            result: Some(Ok(())),
            event: None,
        },
        Checked::Warning(output) => Verdict {
            result: Some(Ok(())),
            event: Some(("ProbeWarning", format!("{kind} probe warning: {output}"))),
        },
        Checked::Failure(reason) => Verdict {
            event: Some(("Unhealthy", format!("{kind} probe failed: {reason}"))),
            result: Some(Err(reason)),
        },
        Checked::Error(reason) => Verdict {
            result: None,
            event: Some((
                "Unhealthy",
                format!("{kind} probe errored and resulted in unknown state: {reason}"),
            )),
        },
    }
}

/// A random part of `period` (upstream `rand.Float64() * period`), drawn from the
/// process's random hash keys.
fn start_jitter(key: &WorkerKey, period: Duration) -> Duration {
    use std::hash::BuildHasher;
    let draw = std::collections::hash_map::RandomState::new().hash_one(key);
    period.mul_f64((draw % 1_000_000) as f64 / 1_000_000.0)
}

/// What is left of initialDelaySeconds, counted from the container's StartedAt as
/// upstream (not from when this worker began: a restarted probe does not wait again).
fn initial_delay(
    p: &Probe,
    started_at: Option<std::time::SystemTime>,
    now: std::time::SystemTime,
) -> Duration {
    let delay = Duration::from_secs(p.initial_delay_seconds.unwrap_or(0).max(0) as u64);
    let running_for = started_at
        .and_then(|t| now.duration_since(t).ok())
        .unwrap_or_default();
    delay.saturating_sub(running_for)
}

fn probes(c: &Container) -> Vec<(Kind, Probe)> {
    [
        (Kind::Readiness, &c.readiness_probe),
        (Kind::Liveness, &c.liveness_probe),
        (Kind::Startup, &c.startup_probe),
    ]
    .into_iter()
    .filter_map(|(k, p)| Some((k, p.clone()?)))
    .collect()
}

pub struct ProberService(pub Arc<ProbeManager>);

#[tonic::async_trait]
impl Prober for ProberService {
    type WatchStream = WatchStream<ProbeResultUpdate>;

    async fn watch(
        &self,
        request: tonic::Request<WatchProbeResultsRequest>,
    ) -> Result<tonic::Response<Self::WatchStream>, tonic::Status> {
        let (snapshot, rx) = {
            let inner = self.0.lock();
            let snapshot = ProbeResultUpdate {
                revision: inner.revision,
                snapshot: true,
                results: inner.results.values().cloned().collect(),
                snapshot_continues: false,
            };
            (snapshot, self.0.tx.subscribe())
        };
        Ok(tonic::Response::new(snapshot_then_deltas(
            snapshot,
            rx,
            self.0.shutdown.clone(),
            request.get_ref().accept_chunked_snapshot,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    #[test]
    fn verdicts_and_events_as_upstream() {
        let ok = Some(Ok(()));
        // (what the check found, result counted, event recorded)
        type Row = (
            Checked,
            Option<Result<(), String>>,
            Option<(&'static str, &'static str)>,
        );
        let rows: Vec<Row> = vec![
            (Checked::Success, ok.clone(), None),
            (
                Checked::Warning("Probe terminated redirects, Response body: x".into()),
                ok,
                Some((
                    "ProbeWarning",
                    "Liveness probe warning: Probe terminated redirects, Response body: x",
                )),
            ),
            (
                Checked::Failure("HTTP probe failed with statuscode: 503".into()),
                Some(Err("HTTP probe failed with statuscode: 503".into())),
                Some((
                    "Unhealthy",
                    "Liveness probe failed: HTTP probe failed with statuscode: 503",
                )),
            ),
            (
                Checked::Error("exec failed: gone".into()),
                None,
                Some((
                    "Unhealthy",
                    "Liveness probe errored and resulted in unknown state: exec failed: gone",
                )),
            ),
        ];
        for (checked, result, event) in rows {
            let what = format!("{checked:?}");
            let v = verdict("Liveness", checked);
            assert_eq!(v.result, result, "{what}");
            assert_eq!(
                v.event.as_ref().map(|(r, m)| (*r, m.as_str())),
                event,
                "{what}"
            );
        }
    }

    #[test]
    fn start_jitter_stays_within_the_period_and_varies() {
        let period = Duration::from_secs(10);
        let draws: HashSet<Duration> = (0..20)
            .map(|i| start_jitter(&("uid".into(), format!("c{i}"), 1), period))
            .collect();
        assert!(draws.iter().all(|d| *d < period), "{draws:?}");
        assert!(draws.len() > 10, "spread, not one value: {draws:?}");
    }

    #[test]
    fn initial_delay_counts_from_started_at() {
        let p = Probe {
            initial_delay_seconds: Some(60),
            ..Default::default()
        };
        let now = SystemTime::now();
        let ago = |s| Some(now - Duration::from_secs(s));
        // A container that started 5 minutes ago (a restarted probe): probe at once.
        assert_eq!(initial_delay(&p, ago(300), now), Duration::ZERO);
        assert_eq!(initial_delay(&p, ago(20), now), Duration::from_secs(40));
        assert_eq!(initial_delay(&p, None, now), Duration::from_secs(60));
        // A StartedAt in the future (clock skew) waits the full delay, no more.
        assert_eq!(
            initial_delay(&p, Some(now + Duration::from_secs(5)), now),
            Duration::from_secs(60)
        );
    }
}
