//! The chaos harness: many probed pods with volumes, churn, and SIGKILLs of random services
//! at random moments, checked against records the test keeps itself (never against the
//! agent's own idea of what happened).
//!
//! Two views are watched, as a user would: pod-sync's `WatchPodStatus` stream (what the API
//! server's status and http-server are fed from) and `/pods` on the read-only port. Every
//! change of a container's `ready` or `started`, every phase change and every pod that drops
//! out of a view is recorded with its time; the rules in [`Records::violations`] then say
//! which of them a restart must never cause.

use crate::Node;
use nodeagent_config::Service;
use nodeagent_proto::api::pod_sync_client::PodSyncClient;
use nodeagent_proto::api::{PodStatusUpdate, WatchPodStatusRequest};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// splitmix64: a small deterministic generator, so that a seed replays the same run.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    pub fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi.saturating_sub(lo) + 1))
    }

    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }
}

/// What a run does; read from the environment so that the same test serves CI's short run
/// and a long run by hand (`CHAOS_SECONDS=1200 CHAOS_SEED=7 ...`).
#[derive(Debug, Clone)]
pub struct ChaosSettings {
    pub seconds: u64,
    pub seed: u64,
    pub pods: usize,
}

impl ChaosSettings {
    pub fn from_env(default_seconds: u64, default_pods: usize) -> Self {
        let num = |name: &str, default: u64| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(default)
        };
        ChaosSettings {
            seconds: num("CHAOS_SECONDS", default_seconds),
            seed: num("CHAOS_SEED", 1),
            pods: num("CHAOS_PODS", default_pods as u64) as usize,
        }
    }
}

/// The three probe handlers, rotated so that every pod uses each for one probe kind.
fn probe(kind: usize, period: u32, failure_threshold: u32) -> Value {
    let handler = match kind % 3 {
        0 => json!({"exec": {"command": ["cat", "/www/index.html"]}}),
        1 => json!({"httpGet": {"path": "/index.html", "port": 8080}}),
        _ => json!({"tcpSocket": {"port": 8080}}),
    };
    let mut p = handler;
    // Generous timeouts: on two loaded cores a probe must not fail for slowness, or the
    // test could not tell a real failure from a flip caused by a restart.
    p["periodSeconds"] = json!(period);
    p["timeoutSeconds"] = json!(10);
    p["failureThreshold"] = json!(failure_threshold);
    p
}

/// A static pod that serves HTTP on 8080 and carries readiness, liveness and startup probes
/// (exec, httpGet and tcpSocket, rotated by `index`), an emptyDir and a hostPath volume.
/// `generation` changes its content, so a new generation is a new pod (static pod UIDs are
/// hashed from the manifest).
pub fn chaos_pod(name: &str, index: usize, generation: u32, host_dir: &Path) -> String {
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {"chaos/generation": generation.to_string()}},
        "spec": {
            "terminationGracePeriodSeconds": 2,
            "containers": [{
                "name": "app",
                "image": "busybox:1.36",
                "command": ["sh", "-c",
                    "mkdir -p /www && echo ok > /www/index.html && date > /data/started && \
                     echo $HOSTNAME >> /host/seen && exec httpd -f -p 8080 -h /www"],
                "readinessProbe": probe(index, 3, 3),
                "livenessProbe": probe(index + 1, 5, 5),
                "startupProbe": probe(index + 2, 1, 120),
                "volumeMounts": [
                    {"name": "data", "mountPath": "/data"},
                    {"name": "host", "mountPath": "/host"}
                ]
            }],
            "volumes": [
                {"name": "data", "emptyDir": {}},
                {"name": "host", "hostPath": {
                    "path": host_dir.join(name).display().to_string(),
                    "type": "DirectoryOrCreate"
                }}
            ]
        }
    });
    serde_json::to_string_pretty(&pod).expect("pod json")
}

/// One container as a status view shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerView {
    pub id: String,
    pub ready: bool,
    pub started: bool,
    pub restarts: i64,
}

/// One pod as a status view shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct PodView {
    pub uid: String,
    pub name: String,
    pub generation: String,
    pub phase: String,
    pub containers: BTreeMap<String, ContainerView>,
}

impl PodView {
    pub fn from_json(pod: &Value) -> Option<PodView> {
        let meta = &pod["metadata"];
        let status = &pod["status"];
        let containers = status["containerStatuses"]
            .as_array()
            .map(|cs| {
                cs.iter()
                    .map(|c| {
                        (
                            c["name"].as_str().unwrap_or_default().to_string(),
                            ContainerView {
                                id: c["containerID"].as_str().unwrap_or_default().to_string(),
                                ready: c["ready"].as_bool().unwrap_or(false),
                                started: c["started"].as_bool().unwrap_or(false),
                                restarts: c["restartCount"].as_i64().unwrap_or(0),
                            },
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        Some(PodView {
            uid: meta["uid"].as_str()?.to_string(),
            name: meta["name"].as_str()?.to_string(),
            generation: meta["annotations"]["chaos/generation"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            phase: status["phase"].as_str().unwrap_or_default().to_string(),
            containers,
        })
    }

    /// Running, with every container running, started and ready.
    pub fn is_healthy(&self) -> bool {
        self.phase == "Running"
            && !self.containers.is_empty()
            && self
                .containers
                .values()
                .all(|c| c.ready && c.started && !c.id.is_empty())
    }
}

/// Something a user would have seen change although nothing asked for it.
#[derive(Debug, Clone)]
pub struct Violation {
    pub at: Duration,
    pub view: &'static str,
    pub pod: String,
    pub what: String,
}

/// How long before a `/pods` poll began a kill noted for it may count as the poll's
/// cause: the kill is noted, then the signal is sent, then the process dies.
const KILL_NOTE_SLACK: Duration = Duration::from_millis(100);

/// The test's own records: what it wants, and what each view showed over time.
#[derive(Default)]
pub struct Records {
    /// Static pod name -> the generation the test currently wants.
    pub desired: BTreeMap<String, u32>,
    /// view -> uid -> the last state shown.
    last: BTreeMap<&'static str, BTreeMap<String, PodView>>,
    /// uid -> container name -> the first healthy container ID seen.
    pub baseline: BTreeMap<String, BTreeMap<String, String>>,
    /// Every pod UID ever seen, with its name (for the leftovers check).
    pub seen: BTreeMap<String, String>,
    pub violations: Vec<Violation>,
    /// How often each view was unavailable (stream broken, /pods not answering).
    pub unavailable: BTreeMap<&'static str, u64>,
    /// Changes observed in total, per view.
    pub observations: BTreeMap<&'static str, u64>,
    /// `/pods` polls made, answered or not.
    pub polls: u64,
    /// When and why a `/pods` poll got no list (other than [`Records::lost_in_flight`]).
    pub unanswered: Vec<String>,
    /// `/pods` polls whose connection broke without an answer while an http-server
    /// instance was SIGKILLed: the request that instance held died with it (a SIGKILL
    /// allows no drain, and no other process has the connection).
    pub lost_in_flight: Vec<String>,
    /// When an http-server instance was SIGKILLed.
    pub api_kills: Vec<Duration>,
    /// `/pods` answers that listed fewer pods than the last complete answer while the
    /// test wanted no fewer (a half-empty list), with what they lacked.
    pub half_empty: Vec<String>,
    started: Option<Instant>,
}

impl Records {
    fn elapsed(&self) -> Duration {
        self.started.map(|s| s.elapsed()).unwrap_or_default()
    }

    /// Notes that an http-server instance is about to be SIGKILLed.
    pub fn note_api_kill(&mut self) {
        let now = self.elapsed();
        self.api_kills.push(now);
    }

    /// Starts the API's availability count afresh.
    pub fn reset_availability(&mut self) {
        self.polls = 0;
        self.unavailable.remove("/pods");
        self.unanswered.clear();
        self.lost_in_flight.clear();
        self.api_kills.clear();
    }

    /// A `/pods` poll made from `from` to `to` got no answer because its connection broke:
    /// whether an http-server instance was killed meanwhile (the kill is noted just before
    /// the signal, so one noted up to [`KILL_NOTE_SLACK`] before the poll also counts).
    fn killed_during(&self, from: Duration, to: Duration) -> bool {
        self.api_kills
            .iter()
            .any(|&k| k + KILL_NOTE_SLACK >= from && k <= to)
    }

    /// A pod is wanted if the test wants its name at its generation.
    pub fn wanted(&self, view: &PodView) -> bool {
        self.desired
            .get(&view.name)
            .is_some_and(|g| g.to_string() == view.generation)
    }

    /// Takes a full list from a view (a stream snapshot or a `/pods` answer).
    pub fn observe_all(&mut self, view: &'static str, pods: Vec<PodView>) {
        let now: BTreeSet<String> = pods.iter().map(|p| p.uid.clone()).collect();
        let gone: Vec<PodView> = self
            .last
            .get(view)
            .map(|m| {
                m.values()
                    .filter(|p| !now.contains(&p.uid))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        for p in gone {
            self.observe_removed(view, &p.uid);
        }
        for p in pods {
            self.observe(view, p);
        }
    }

    /// A pod dropped out of a view.
    pub fn observe_removed(&mut self, view: &'static str, uid: &str) {
        let Some(old) = self.last.get_mut(view).and_then(|m| m.remove(uid)) else {
            return;
        };
        if self.wanted(&old) && old.is_healthy() {
            self.violate(
                view,
                &old.name,
                "a running pod vanished from the view".into(),
            );
        }
    }

    /// One pod as a view shows it now.
    pub fn observe(&mut self, view: &'static str, pod: PodView) {
        *self.observations.entry(view).or_default() += 1;
        self.seen.insert(pod.uid.clone(), pod.name.clone());
        let wanted = self.wanted(&pod);
        let previous = self
            .last
            .entry(view)
            .or_default()
            .insert(pod.uid.clone(), pod.clone());
        if !wanted {
            return; // being removed or replaced: anything may change
        }
        if let Some(old) = previous {
            for problem in regressions(&old, &pod) {
                self.violate(view, &pod.name, problem);
            }
        }
        if pod.is_healthy() {
            let base = self.baseline.entry(pod.uid.clone()).or_default();
            let mut replaced = Vec::new();
            for (name, c) in &pod.containers {
                let first = base.entry(name.clone()).or_insert_with(|| c.id.clone());
                if *first != c.id {
                    replaced.push(format!(
                        "container {name} was replaced: {first} -> {}",
                        c.id
                    ));
                    // Reported once: the replacement is the new baseline.
                    *first = c.id.clone();
                }
            }
            for what in replaced {
                self.violate(view, &pod.name, what);
            }
        }
    }

    fn violate(&mut self, view: &'static str, pod: &str, what: String) {
        let v = Violation {
            at: self.elapsed(),
            view,
            pod: pod.to_string(),
            what,
        };
        eprintln!(
            "VIOLATION at {:.1}s in {}: {}: {}",
            v.at.as_secs_f64(),
            v.view,
            v.pod,
            v.what
        );
        self.violations.push(v);
    }

    /// The current view of `view`.
    pub fn current(&self, view: &'static str) -> Vec<PodView> {
        self.last
            .get(view)
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }
}

/// What changed for the worse between two observations of the same wanted pod.
pub fn regressions(old: &PodView, new: &PodView) -> Vec<String> {
    let mut out = Vec::new();
    if old.phase == "Running" && new.phase != "Running" {
        out.push(format!("phase {} -> {}", old.phase, new.phase));
    }
    for (name, was) in &old.containers {
        let Some(now) = new.containers.get(name) else {
            if !was.id.is_empty() {
                out.push(format!("container {name} dropped out of the status"));
            }
            continue;
        };
        if was.id != now.id {
            continue; // a replaced container is judged against the baseline
        }
        if was.ready && !now.ready {
            out.push(format!("container {name} ready true -> false"));
        }
        if was.started && !now.started {
            out.push(format!("container {name} started true -> false"));
        }
        if now.restarts > was.restarts {
            out.push(format!(
                "container {name} restartCount {} -> {}",
                was.restarts, now.restarts
            ));
        }
    }
    out
}

pub type SharedRecords = Arc<Mutex<Records>>;

pub fn new_records() -> SharedRecords {
    let records = Records {
        started: Some(Instant::now()),
        ..Records::default()
    };
    Arc::new(Mutex::new(records))
}

/// Follows pod-sync's status stream for as long as the task lives, reconnecting after every
/// break (pod-sync is killed often): `on_update` gets each message (not asking for chunks:
/// a whole snapshot comes as one), and `None` at each break (a refused connection or an
/// ended stream).
pub async fn follow_pod_sync_status(
    node_socket: nodeagent_config::Address,
    mut on_update: impl FnMut(Option<&PodStatusUpdate>),
) {
    loop {
        let mut client = PodSyncClient::new(nodeagent_transport::connect(&node_socket))
            .max_decoding_message_size(usize::MAX);
        if let Ok(stream) = client
            .watch_pod_status(WatchPodStatusRequest::default())
            .await
        {
            let mut stream = stream.into_inner();
            while let Ok(Some(update)) = stream.message().await {
                on_update(Some(&update));
            }
        }
        on_update(None);
        // A pace for the reconnects, not a wait for a condition: the next attempt is the
        // check that pod-sync serves again.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The pods of one status message, as the views see them.
pub fn pod_views(update: &PodStatusUpdate) -> Vec<PodView> {
    update
        .pods_json
        .iter()
        .filter_map(|b| serde_json::from_slice::<Value>(b).ok())
        .filter_map(|v| PodView::from_json(&v))
        .collect()
}

/// Records every snapshot and delta of pod-sync's status stream, and each break.
pub async fn follow_status_stream(node_socket: nodeagent_config::Address, records: SharedRecords) {
    follow_pod_sync_status(node_socket, move |update| {
        let mut r = records.lock().unwrap();
        let Some(update) = update else {
            *r.unavailable.entry("stream").or_default() += 1;
            return;
        };
        let pods = pod_views(update);
        if update.snapshot {
            r.observe_all("stream", pods);
            return;
        }
        for p in pods {
            r.observe("stream", p);
        }
        for uid in &update.removed_uids {
            r.observe_removed("stream", uid);
        }
    })
    .await
}

/// The two view followers of a node; they stop when this is dropped.
pub struct Views(Vec<tokio::task::JoinHandle<()>>);

impl Drop for Views {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// Follows pod-sync's status stream and polls `/pods` every `poll`, into `records`.
pub fn follow_views(node: &Node, records: &SharedRecords, poll: Duration) -> Views {
    Views(vec![
        tokio::spawn(follow_status_stream(
            node.socket(Service::PodSync),
            records.clone(),
        )),
        tokio::spawn(follow_pods_endpoint(
            node.read_only_port,
            records.clone(),
            poll,
        )),
    ])
}

/// Polls `/pods` every `period` for as long as the task lives and records what it shows.
pub async fn follow_pods_endpoint(port: u16, records: SharedRecords, period: Duration) {
    loop {
        let from = {
            let mut r = records.lock().unwrap();
            r.polls += 1;
            r.elapsed()
        };
        match crate::http::get(port, "/pods").await {
            Ok((200, body)) => {
                if let Ok(list) = serde_json::from_str::<Value>(&body) {
                    let pods: Vec<PodView> = list["items"]
                        .as_array()
                        .map(|items| items.iter().filter_map(PodView::from_json).collect())
                        .unwrap_or_default();
                    let mut r = records.lock().unwrap();
                    // Every pod the test wants that ran long enough to be listed must be
                    // listed: a wanted pod missing is the half-empty list a restart
                    // must never show.
                    let listed: std::collections::BTreeSet<&str> =
                        pods.iter().map(|p| p.name.as_str()).collect();
                    let missing: Vec<String> = r
                        .last
                        .get("/pods")
                        .into_iter()
                        .flat_map(|m| m.values())
                        .filter(|p| r.wanted(p) && !listed.contains(p.name.as_str()))
                        .map(|p| p.name.clone())
                        .collect();
                    if !missing.is_empty() {
                        let at = r.elapsed().as_secs_f64();
                        r.half_empty.push(format!("{at:.1}s: {missing:?}"));
                    }
                    r.observe_all("/pods", pods);
                }
            }
            other => {
                let mut r = records.lock().unwrap();
                let to = r.elapsed();
                let at = format!("{:.2}s-{:.2}s", from.as_secs_f64(), to.as_secs_f64());
                match other {
                    // Connected, then cut off without an answer, while an instance died.
                    Err(crate::HttpError::Broken(e)) if r.killed_during(from, to) => {
                        r.lost_in_flight.push(format!("{at} {e}"));
                    }
                    other => {
                        *r.unavailable.entry("/pods").or_default() += 1;
                        let why = match other {
                            Ok((code, body)) => format!("{code}: {}", body.trim()),
                            Err(e) => e.to_string(),
                        };
                        r.unanswered.push(format!("{at} {why}"));
                    }
                }
            }
        }
        tokio::time::sleep(period).await;
    }
}

/// Whether every service serves, every view shows exactly the wanted pods, each healthy,
/// and the runtime agrees.
pub async fn converged(node: &Node, records: &SharedRecords) -> Result<(), String> {
    for s in Service::ALL {
        let channel = nodeagent_transport::connect(&node.socket(s));
        nodeagent_transport::check_health(channel, "", Duration::from_secs(2))
            .await
            .map_err(|e| format!("{} not serving: {e}", s.name()))?;
    }
    let (desired, stream) = {
        let r = records.lock().unwrap();
        (r.desired.clone(), r.current("stream"))
    };
    check_view("stream", &desired, &stream)?;
    let pods: Vec<PodView> = node
        .pods()
        .await?
        .iter()
        .filter_map(PodView::from_json)
        .collect();
    check_view("/pods", &desired, &pods)?;
    let wanted_uids: BTreeSet<String> = pods.iter().map(|p| p.uid.clone()).collect();
    let sandboxes = node.sandboxes().await;
    if let Some(extra) = sandboxes.iter().find(|s| {
        s.metadata
            .as_ref()
            .is_some_and(|m| !wanted_uids.contains(&m.uid))
    }) {
        return Err(format!(
            "the runtime still has sandbox {} of a removed pod",
            extra
                .metadata
                .as_ref()
                .map(|m| m.name.as_str())
                .unwrap_or("?")
        ));
    }
    Ok(())
}

fn check_view(view: &str, desired: &BTreeMap<String, u32>, pods: &[PodView]) -> Result<(), String> {
    for (name, generation) in desired {
        let Some(p) = pods
            .iter()
            .find(|p| p.name == *name && p.generation == generation.to_string())
        else {
            return Err(format!(
                "{view}: {name} (generation {generation}) not listed"
            ));
        };
        if !p.is_healthy() {
            return Err(format!("{view}: {name} not healthy yet: {p:?}"));
        }
    }
    if let Some(extra) = pods.iter().find(|p| {
        desired
            .get(&p.name)
            .is_none_or(|g| g.to_string() != p.generation)
    }) {
        return Err(format!(
            "{view}: removed pod {} (generation {}) still listed",
            extra.name, extra.generation
        ));
    }
    Ok(())
}

/// What a removed pod may leave behind, if anything: its pod directory, its log directory,
/// a mount, a cgroup or a runtime object.
pub async fn leftovers(node: &Node, uid: &str) -> Vec<String> {
    let mut found = Vec::new();
    let pod_dir = node.path(&format!("root/pods/{uid}"));
    if pod_dir.exists() {
        found.push(format!("pod dir {}", pod_dir.display()));
    }
    if let Ok(entries) = std::fs::read_dir(node.path("pod-logs")) {
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().ends_with(uid) {
                found.push(format!("log dir {}", e.path().display()));
            }
        }
    }
    if let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo")
        && let Some(line) = info.lines().find(|l| l.contains(uid))
    {
        found.push(format!("mount {line}"));
    }
    for dir in cgroup_dirs_named(&format!("pod{uid}")) {
        found.push(format!("cgroup {}", dir.display()));
    }
    if node
        .sandboxes()
        .await
        .iter()
        .any(|s| s.metadata.as_ref().is_some_and(|m| m.uid == uid))
    {
        found.push("a sandbox".into());
    }
    found
}

/// Cgroup directories (v1 or v2) under the kubepods hierarchy with this name.
fn cgroup_dirs_named(name: &str) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![(std::path::PathBuf::from("/sys/fs/cgroup"), 0)];
    while let Some((dir, depth)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let file = e.file_name().to_string_lossy().to_string();
            if file == name {
                out.push(path.clone());
            }
            // Only the controllers' roots and the kubepods tree: a whole-tree walk is slow.
            let descend = depth == 0 || file.starts_with("kubepods") || depth >= 2;
            if depth < 5 && descend && !file.starts_with("pod") {
                stack.push((path, depth + 1));
            }
        }
    }
    out
}

/// A container's PID as the runtime reports it (verbose ContainerStatus), if running.
pub async fn container_pid(node: &Node, id: &str) -> Option<i64> {
    use nodeagent_proto::cri::ContainerStatusRequest;
    let mut rt = node.cri.runtime.clone();
    let resp = rt
        .container_status(ContainerStatusRequest {
            container_id: id.to_string(),
            verbose: true,
        })
        .await
        .ok()?
        .into_inner();
    let info: Value = serde_json::from_str(resp.info.get("info")?).ok()?;
    info["pid"].as_i64()
}

/// p50 and p99 of a set of durations, in seconds.
pub fn percentiles(samples: &[Duration]) -> (f64, f64, f64) {
    if samples.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    let mut s: Vec<f64> = samples.iter().map(|d| d.as_secs_f64()).collect();
    s.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| s[((s.len() as f64 - 1.0) * q).round() as usize];
    (at(0.5), at(0.99), s[s.len() - 1])
}

/// The services a chaos run may kill: all of them.
pub const KILLABLE: [Service; 7] = Service::ALL;

#[cfg(test)]
mod tests {
    use super::*;

    fn view(phase: &str, ready: bool, id: &str, restarts: i64) -> PodView {
        PodView {
            uid: "u".into(),
            name: "p".into(),
            generation: "1".into(),
            phase: phase.into(),
            containers: [(
                "app".to_string(),
                ContainerView {
                    id: id.into(),
                    ready,
                    started: true,
                    restarts,
                },
            )]
            .into(),
        }
    }

    #[test]
    fn flips_of_a_wanted_pod_are_violations_and_of_a_leaving_one_are_not() {
        let mut r = Records::default();
        r.desired.insert("p".into(), 1);
        r.observe("stream", view("Running", true, "c1", 0));
        r.observe("stream", view("Running", false, "c1", 0));
        assert_eq!(r.violations.len(), 1, "{:?}", r.violations);
        r.observe("stream", view("Pending", true, "c1", 1));
        assert_eq!(r.violations.len(), 3, "{:?}", r.violations);
        r.observe_all("stream", vec![]);
        assert_eq!(
            r.violations.len(),
            3,
            "an unhealthy pod that vanished is not counted twice"
        );
        r.observe("stream", view("Running", true, "c1", 1));
        r.observe_all("stream", vec![]);
        assert_eq!(r.violations.len(), 4, "{:?}", r.violations);
        r.desired.clear();
        r.observe("stream", view("Running", true, "c1", 0));
        r.observe("stream", view("Running", false, "c2", 0));
        assert_eq!(r.violations.len(), 4, "a removed pod may change");
    }

    #[test]
    fn a_replaced_container_breaks_the_baseline() {
        let mut r = Records::default();
        r.desired.insert("p".into(), 1);
        r.observe("/pods", view("Running", true, "c1", 0));
        r.observe("/pods", view("Running", true, "c2", 0));
        assert_eq!(r.violations.len(), 1, "{:?}", r.violations);
    }

    #[test]
    fn the_generator_replays_a_seed() {
        let a: Vec<u64> = (0..5)
            .map({
                let mut r = Rng::new(7);
                move |_| r.below(1000)
            })
            .collect();
        let b: Vec<u64> = (0..5)
            .map({
                let mut r = Rng::new(7);
                move |_| r.below(1000)
            })
            .collect();
        assert_eq!(a, b);
        let (p50, p99, max) = percentiles(&[Duration::from_secs(1), Duration::from_secs(3)]);
        assert!(p50 >= 1.0 && p99 <= 3.0 && max == 3.0);
    }

    #[test]
    fn a_poll_is_lost_in_flight_only_when_a_kill_fell_within_it() {
        let ms = Duration::from_millis;
        let r = Records {
            api_kills: vec![ms(5000)],
            ..Records::default()
        };
        assert!(r.killed_during(ms(4000), ms(6000)));
        assert!(
            r.killed_during(ms(5050), ms(5500)),
            "noted just before the poll"
        );
        assert!(
            !r.killed_during(ms(5200), ms(5500)),
            "began well after the kill"
        );
        assert!(
            !r.killed_during(ms(3000), ms(4900)),
            "ended before the kill"
        );
    }
}
