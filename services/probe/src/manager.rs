//! The probe manager: which containers get which probe workers (from pod-sync's status
//! stream), the workers themselves, and the results stream.

use crate::check::{Checked, ProbeCheck, run_check};
use crate::metrics::probe_kind_name;
use crate::shard::Ownership;
use crate::worker::{Next, Value, Watched, WorkerState, bare_id};
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
    /// Tells this worker's task from an earlier one under the same key.
    generation: u64,
    handle: JoinHandle<()>,
    /// Wakes the worker before its next tick.
    trigger: Arc<tokio::sync::Notify>,
    /// What it reads of its pod, as last seen by the manager.
    watched: Watched,
}

struct Inner {
    /// Which of `pods` this instance probes.
    ownership: Ownership,
    /// Shared with the workers that probe it (one copy of each pod, not one per probe).
    pods: BTreeMap<String, Arc<Pod>>,
    workers: HashMap<WorkerKey, Worker>,
    results: BTreeMap<WorkerKey, ProbeResult>,
    revision: u64,
    /// The last worker generation handed out.
    generation: u64,
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
                generation: 0,
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

    /// Upstream's `AddPod` and `CleanupPods` at once: a worker for every probe of every
    /// container (regular ones and sidecars) of every pod of ours, for as long as the pod
    /// has it; the workers of pods gone, or no longer ours, stop. A worker follows its
    /// container's restarts itself, and is woken when what it reads of the pod moved.
    fn reconcile_workers(self: &Arc<Self>) {
        let mut inner = self.lock();
        let mut wanted: HashSet<WorkerKey> = HashSet::new();
        let mut create = Vec::new();
        for (uid, pod) in &inner.pods {
            // Another instance's pod: its workers stop and its results go (below), so a
            // later snapshot of ours never carries an old value over the new owner's.
            if !inner.ownership.owns(uid) {
                continue;
            }
            let spec = pod.spec.as_ref();
            let terminal = matches!(
                pod.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Failed" | "Succeeded")
            );
            let deleting = pod.metadata.deletion_timestamp.is_some();
            let sidecars = spec
                .and_then(|s| s.init_containers.as_ref())
                .into_iter()
                .flatten()
                .filter(|c| c.restart_policy.as_deref() == Some("Always"));
            let containers = spec.map(|s| s.containers.as_slice()).unwrap_or_default();
            for c in containers.iter().chain(sidecars) {
                for (kind, probe) in probes(c) {
                    let key = (uid.clone(), c.name.clone(), kind as i32);
                    wanted.insert(key.clone());
                    let alive = inner
                        .workers
                        .get(&key)
                        .is_some_and(|w| !w.handle.is_finished());
                    // A worker that ended itself (its pod finished, or is being deleted
                    // and this probe may not restart it) is not made again.
                    let ended = terminal || (deleting && kind != Kind::Readiness);
                    if !alive && !ended {
                        create.push((key, probe, c.clone(), pod.clone()));
                    }
                }
            }
        }
        let gone: Vec<WorkerKey> = inner
            .workers
            .keys()
            .filter(|k| !wanted.contains(*k))
            .cloned()
            .collect();
        for k in gone {
            if let Some(w) = inner.workers.remove(&k) {
                w.handle.abort();
            }
            inner.results.remove(&k);
        }
        // A kept result has no worker left to drop it: drop those of pods now owned by
        // another instance too.
        let Inner {
            ownership, results, ..
        } = &mut *inner;
        results.retain(|k, _| ownership.owns(&k.0));
        // Wake the workers whose view of their pod moved (a new container, started, the
        // pod deleted or finished), as upstream's status updates trigger them.
        let Inner { pods, workers, .. } = &mut *inner;
        for (key, w) in workers.iter_mut() {
            let Some(pod) = pods.get(&key.0) else {
                continue;
            };
            let watched = WorkerState::watched(&key.1, pod);
            if watched != w.watched {
                w.watched = watched;
                w.trigger.notify_one();
            }
        }
        for (key, probe, container, pod) in create {
            inner.generation += 1;
            let generation = inner.generation;
            // A root span: a worker started while another one runs is not its child.
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
            let trigger = Arc::new(tokio::sync::Notify::new());
            let handle = tokio::spawn(
                self.clone()
                    .worker(
                        Spawned {
                            key: key.clone(),
                            generation,
                            probe,
                            container,
                            trigger: trigger.clone(),
                        },
                        metrics,
                    )
                    .instrument(span),
            );
            let watched = WorkerState::watched(&key.1, &pod);
            inner.workers.insert(
                key,
                Worker {
                    generation,
                    handle,
                    trigger,
                    watched,
                },
            );
        }
    }

    /// One probe of one container of a pod, until the pod no longer wants it: waits for its
    /// period (or a wake-up), asks the pure worker (`worker.rs`) what to do, runs the check
    /// it is told to and publishes what it is told to.
    async fn worker(self: Arc<Self>, w: Spawned, metrics: crate::metrics::ProbeMetrics) {
        let Spawned {
            key,
            generation,
            probe,
            container,
            trigger,
        } = w;
        let kind = probe_kind_name(key.2);
        let period = Duration::from_secs(probe.period_seconds.unwrap_or(10).max(1) as u64);
        // Upstream: a prober that has just started (a restart) would otherwise probe every
        // container at once; each worker first waits a random part of its period. A
        // container that starts later is probed at once.
        if period > self.started.elapsed() {
            tokio::time::sleep(start_jitter(period)).await;
        }
        let mut state = WorkerState::new(
            Kind::try_from(key.2).unwrap_or(Kind::Unspecified),
            &probe,
            &container,
        );
        let named_ports = nodeagent_cri::actions::named_ports(&container);
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        tick.tick().await;
        loop {
            let pod = self.lock().pods.get(&key.0).cloned();
            let followed = state.container_id.clone();
            let (next, told) =
                state.before_probe(&key.1, pod.as_deref(), std::time::SystemTime::now());
            let bare = bare_id(state.container_id.as_deref());
            if state.container_id != followed {
                // A new container: the old one's result goes (upstream's Remove).
                self.lock().results.remove(&key);
            }
            if let Some(value) = told {
                self.publish(&key, generation, &bare, value, String::new());
            }
            match (next, pod) {
                (Next::Stop, _) => break,
                (Next::Probe { container_id }, Some(pod)) => {
                    let check = ProbeCheck {
                        probe: probe.clone(),
                        container_id,
                        pod_ip: pod
                            .status
                            .as_ref()
                            .and_then(|s| s.pod_ip.clone())
                            .unwrap_or_default(),
                        named_ports: named_ports.clone(),
                    };
                    let probed = std::time::Instant::now();
                    // Boxed: a check's state (an HTTP or gRPC client call, about 11 KiB) is
                    // held only while it runs, not by every waiting worker.
                    let verdict = verdict(kind, Box::pin(run_check(&self.cri, &check)).await);
                    if let Some((reason, message)) = &verdict.event {
                        self.events
                            .container(&pod, &key.1, EventType::Warning, reason, message);
                    }
                    match verdict.result {
                        None => tracing::warn!(message = ?verdict.event, "probe errored"),
                        Some(result) => {
                            metrics.observe(result.is_ok(), probed.elapsed().as_secs_f64());
                            let value = match &result {
                                Ok(()) => Value::Success,
                                Err(reason) => {
                                    tracing::debug!(%reason, "probe failed");
                                    Value::Failure
                                }
                            };
                            if let Some(value) = state.after_probe(value) {
                                let message = result.err().unwrap_or_default();
                                tracing::info!(outcome = ?value, %message, "probe result changed");
                                self.publish(&key, generation, &bare, value, message);
                            }
                        }
                    }
                }
                _ => {}
            }
            tokio::select! {
                _ = tick.tick() => {}
                _ = trigger.notified() => {}
            }
        }
        // Ended by itself: its result goes with it (upstream's clean-up), and the manager
        // does not make it again (see `reconcile_workers`).
        let mut inner = self.lock();
        if inner
            .workers
            .get(&key)
            .is_some_and(|w| w.generation == generation)
        {
            inner.workers.remove(&key);
            inner.results.remove(&key);
        }
    }

    fn publish(
        &self,
        key: &WorkerKey,
        generation: u64,
        container_id: &str,
        value: Value,
        message: String,
    ) {
        let outcome = match value {
            Value::Success => Outcome::Success,
            Value::Failure => Outcome::Failure,
            Value::Unknown => return,
        };
        let mut inner = self.lock();
        // A worker stopped meanwhile (its pod gone, or handed to another instance) tells
        // nothing more.
        if inner
            .workers
            .get(key)
            .is_none_or(|w| w.generation != generation)
        {
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

/// What a new worker task is given.
struct Spawned {
    key: WorkerKey,
    generation: u64,
    probe: Probe,
    container: Container,
    trigger: Arc<tokio::sync::Notify>,
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

/// A random part of `period` (upstream `rand.Float64() * period`).
fn start_jitter(period: Duration) -> Duration {
    period.mul_f64(nodeagent_config::duration::random_fraction())
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
        let draws: HashSet<Duration> = (0..20).map(|_| start_jitter(period)).collect();
        assert!(draws.iter().all(|d| *d < period), "{draws:?}");
        assert!(draws.len() > 10, "spread, not one value: {draws:?}");
    }

    /// A pod of one container with a tcpSocket readiness and liveness probe against
    /// `port` on 127.0.0.1 (no runtime needed), running and started.
    fn tcp_pod(port: u16) -> Pod {
        use k8s_openapi::api::core::v1::{
            ContainerState, ContainerStateRunning, ContainerStatus, PodSpec, PodStatus,
        };
        let probe = Probe {
            tcp_socket: Some(k8s_openapi::api::core::v1::TCPSocketAction {
                port: k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(port.into()),
                host: None,
            }),
            period_seconds: Some(1),
            ..Default::default()
        };
        let mut pod = Pod::default();
        pod.metadata.name = Some(format!("p{port}"));
        pod.metadata.namespace = Some("default".into());
        pod.metadata.uid = Some("uid-1".into());
        pod.spec = Some(PodSpec {
            containers: vec![Container {
                name: "c".into(),
                readiness_probe: Some(probe.clone()),
                liveness_probe: Some(probe),
                ..Default::default()
            }],
            ..Default::default()
        });
        pod.status = Some(PodStatus {
            phase: Some("Running".into()),
            pod_ip: Some("127.0.0.1".into()),
            container_statuses: Some(vec![ContainerStatus {
                name: "c".into(),
                container_id: Some("containerd://c1".into()),
                state: Some(ContainerState {
                    running: Some(ContainerStateRunning { started_at: None }),
                    ..Default::default()
                }),
                started: Some(true),
                ..Default::default()
            }]),
            ..Default::default()
        });
        pod
    }

    fn manager() -> Arc<ProbeManager> {
        let cri = Cri::connect(
            &nodeagent_config::Address::Unix("/nonexistent/cri.sock".into()),
            Duration::from_secs(1),
        );
        Arc::new(ProbeManager::new(
            cri,
            EventRecorder::new(None, "node"),
            Shutdown::never(),
            Ownership::All,
        ))
    }

    fn update(pods: &[&Pod], removed: &[&str]) -> PodStatusUpdate {
        PodStatusUpdate {
            pods_json: pods.iter().map(|p| k8s::encode_pod(p)).collect(),
            removed_uids: removed.iter().map(|u| u.to_string()).collect(),
            ..Default::default()
        }
    }

    async fn until(what: &str, mut cond: impl FnMut() -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !cond() {
            assert!(std::time::Instant::now() < deadline, "timed out: {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Upstream's `TestCleanUp` (worker_test.go), on real worker tasks: once a worker has
    /// produced its result, stopping it (here: its pod leaves pod-sync's status) clears
    /// the result and the worker.
    #[tokio::test]
    async fn a_removed_pod_ends_its_workers_and_results() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let m = manager();
        let pod = tcp_pod(port);
        m.apply(update(&[&pod], &[]));
        let readiness = ("uid-1".to_string(), "c".to_string(), Kind::Readiness as i32);
        until("readiness Success", || {
            m.lock()
                .results
                .get(&readiness)
                .is_some_and(|r| r.outcome() == Outcome::Success && r.container_id == "c1")
        })
        .await;
        assert_eq!(m.lock().workers.len(), 2, "readiness and liveness");
        m.apply(update(&[], &["uid-1"]));
        let inner = m.lock();
        assert!(inner.workers.is_empty(), "workers cleared");
        assert!(inner.results.is_empty(), "results cleared");
    }

    /// Upstream's graceful deletion (worker.go): once the pod is being deleted, the
    /// liveness worker says Success and ends, and is not made again; readiness goes on.
    #[tokio::test]
    async fn a_deleted_pod_ends_its_liveness_worker_with_success() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        // The liveness probe fails, below its threshold: a port just closed.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let closed_port = closed.local_addr().unwrap().port();
        drop(closed);
        let m = manager();
        let mut pod = tcp_pod(port);
        let c = &mut pod.spec.as_mut().unwrap().containers[0];
        if let Some(p) = c.liveness_probe.as_mut() {
            p.tcp_socket.as_mut().unwrap().port =
                k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(closed_port.into());
            p.failure_threshold = Some(1000);
        }
        let mut rx = m.tx.subscribe();
        m.apply(update(&[&pod], &[]));
        let liveness = ("uid-1".to_string(), "c".to_string(), Kind::Liveness as i32);
        until("liveness worker", || {
            m.lock().workers.contains_key(&liveness)
        })
        .await;
        pod.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
        m.apply(update(&[&pod], &[]));
        until("liveness worker ended", || {
            !m.lock().workers.contains_key(&liveness)
        })
        .await;
        // It told Success on its way out.
        let mut told = Vec::new();
        while let Ok(u) = rx.try_recv() {
            told.extend(
                u.results
                    .into_iter()
                    .filter(|r| r.kind == Kind::Liveness as i32),
            );
        }
        assert_eq!(
            told.iter().map(|r| r.outcome()).collect::<Vec<_>>(),
            vec![Outcome::Success],
            "{told:?}"
        );
        // Another update of the deleted pod makes no new liveness worker; readiness stays.
        m.apply(update(&[&pod], &[]));
        let inner = m.lock();
        assert!(!inner.workers.contains_key(&liveness));
        assert!(
            inner
                .workers
                .contains_key(&("uid-1".into(), "c".into(), Kind::Readiness as i32))
        );
    }
}
