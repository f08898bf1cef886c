//! Node-pressure eviction, as upstream's eviction manager (`pkg/kubelet/eviction`): every
//! 10 s the node's signals are read (the same reading node-status reports conditions from,
//! in `nodeagent_config::eviction`) and checked against `evictionHard` and `evictionSoft`.
//! When a hard threshold is met, or a soft one has been met for its grace period:
//!
//! - a disk signal first gets node-level reclaim (a container GC pass); if that frees
//!   enough (the threshold plus its minimum reclaim), nobody is evicted;
//! - otherwise the pods are ranked as upstream ranks them and the first that is not critical
//!   (static, mirror, or priority ≥ 2000000000) is evicted: one pod per pass. Memory: pods
//!   using more than they requested first, then lower priority, then usage over request.
//!   Disk: the same on ephemeral storage (writable layers, logs, emptyDirs on disk). PIDs:
//!   lower priority, then more processes.
//! - The evicted pod ends Failed, reason `Evicted`, with upstream's message, a
//!   `DisruptionTarget` condition and a Warning `Evicted` event; its containers get 1 s on a
//!   hard threshold and `min(evictionMaxPodGracePeriod, its own)` on a soft one; its
//!   volumes are released (an emptyDir's data is what the node is short of).

use crate::PodSync;
use crate::status::Waiting;
use crate::status::reasons::EVICTED;
use k8s_openapi::api::core::v1::Pod;
use nodeagent_config::cgroupfs::Cgroups;
use nodeagent_config::eviction::{
    self, Observations, Observed, Signal, Threshold, Thresholds, format_quantity,
};
use nodeagent_proto::cri;
use nodeagent_proto::k8s;
use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// upstream's `signalEphemeralPodFsLimit`: the `eviction_signal` of `kubelet_evictions` for a
/// pod over its containers' summed `ephemeral-storage` limits (eviction_manager.go).
pub const SIGNAL_EPHEMERAL_POD_FS_LIMIT: &str = "ephemeralpodfs.limit";
/// upstream's `signalEphemeralContainerFsLimit`: a container over its own limit.
pub const SIGNAL_EPHEMERAL_CONTAINER_FS_LIMIT: &str = "ephemeralcontainerfs.limit";
/// upstream's `signalEmptyDirFsLimit`: an emptyDir over its `sizeLimit`.
pub const SIGNAL_EMPTY_DIR_FS_LIMIT: &str = "emptydirfs.limit";

/// upstream's `immediateEvictionGracePeriodSeconds` (hard thresholds).
const HARD_GRACE: i64 = 1;

/// One pod as the ranking sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub uid: String,
    pub priority: i32,
    /// What the pod uses of the starved resource (bytes, or processes).
    pub usage: u64,
    /// What its containers requested of it.
    pub request: u64,
    /// (container, usage, request) of each regular container measured.
    pub containers: Vec<(String, u64, u64)>,
    pub critical: bool,
}

/// Orders `pods` for eviction on `signal`, first to go first (upstream's `rankMemoryPressure`,
/// `rankDiskPressureFunc`, `rankPIDPressure`).
pub fn rank(signal: Signal, pods: &mut [Candidate]) {
    if signal == Signal::PidAvailable {
        pods.sort_by(|a, b| a.priority.cmp(&b.priority).then(b.usage.cmp(&a.usage)));
        return;
    }
    pods.sort_by(|a, b| {
        let exceeds = |c: &Candidate| c.usage > c.request;
        exceeds(b)
            .cmp(&exceeds(a))
            .then(a.priority.cmp(&b.priority))
            .then((b.usage as i128 - b.request as i128).cmp(&(a.usage as i128 - a.request as i128)))
    });
}

/// upstream's `evictionMessage`: "The node was low on resource: memory. Threshold quantity:
/// 100Mi, available: 50Mi. Container a was using 500Mi, request is 0, has larger consumption
/// of memory. "
pub fn message(threshold: &Threshold, observed: &Observed, pod: &Candidate) -> String {
    let resource = threshold.signal.resource();
    let q = |n: u64| {
        if matches!(resource, "memory" | "ephemeral-storage") {
            format_quantity(n)
        } else {
            n.to_string()
        }
    };
    let mut m = format!(
        "The node was low on resource: {resource}. Threshold quantity: {}, available: {}. ",
        q(threshold.value.of(observed.capacity)),
        q(observed.available)
    );
    if matches!(resource, "memory" | "ephemeral-storage") {
        for (name, usage, request) in &pod.containers {
            if usage > request {
                m.push_str(&format!(
                    "Container {name} was using {}, request is {}, has larger consumption of {resource}. ",
                    q(*usage),
                    q(*request)
                ));
            }
        }
    }
    m
}

/// The Evicted event's annotations (upstream's `offending_containers`,
/// `offending_containers_usage`, `starved_resource`): the containers that used more than
/// they requested.
pub fn annotations(
    threshold: &Threshold,
    pod: &Candidate,
) -> std::collections::BTreeMap<String, String> {
    let resource = threshold.signal.resource();
    let offending: Vec<&(String, u64, u64)> = if matches!(resource, "memory" | "ephemeral-storage")
    {
        pod.containers
            .iter()
            .filter(|(_, usage, request)| usage > request)
            .collect()
    } else {
        Vec::new()
    };
    std::collections::BTreeMap::from([
        (
            "offending_containers".to_string(),
            offending
                .iter()
                .map(|c| c.0.as_str())
                .collect::<Vec<_>>()
                .join(","),
        ),
        (
            "offending_containers_usage".to_string(),
            offending
                .iter()
                .map(|c| format_quantity(c.1))
                .collect::<Vec<_>>()
                .join(","),
        ),
        ("starved_resource".to_string(), resource.to_string()),
    ])
}

fn storage_limit(c: &k8s_openapi::api::core::v1::Container) -> Option<(String, u64)> {
    let q = c
        .resources
        .as_ref()?
        .limits
        .as_ref()?
        .get("ephemeral-storage")?;
    let bytes = nodeagent_config::quantity::bytes(&q.0)?;
    (bytes > 0).then(|| (q.0.clone(), bytes as u64))
}

/// Whether any container of the pod limits its ephemeral storage.
pub fn has_storage_limit(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .is_some_and(|s| s.containers.iter().any(|c| storage_limit(c).is_some()))
}

/// The eviction message when the pod uses more local storage than its containers' limits
/// allow in all (the pod's total: containers and emptyDirs), or a container more than its
/// own limit (its logs and writable layer): upstream's messages.
pub fn local_storage_violation(pod: &Pod, usage: &Candidate) -> Option<(&'static str, String)> {
    let spec = pod.spec.as_ref()?;
    let limits: Vec<(&str, String, u64)> = spec
        .containers
        .iter()
        .filter_map(|c| storage_limit(c).map(|(text, bytes)| (c.name.as_str(), text, bytes)))
        .collect();
    let pod_limit: u64 = limits.iter().map(|l| l.2).sum();
    if !limits.is_empty() && usage.usage > pod_limit {
        return Some((
            SIGNAL_EPHEMERAL_POD_FS_LIMIT,
            format!(
                "Pod ephemeral local storage usage exceeds the total limit of containers {}. ",
                format_quantity(pod_limit)
            ),
        ));
    }
    for (name, used, _) in &usage.containers {
        if let Some((_, text, bytes)) = limits.iter().find(|l| l.0 == name)
            && used > bytes
        {
            return Some((
                SIGNAL_EPHEMERAL_CONTAINER_FS_LIMIT,
                format!("Container {name} exceeded its local ephemeral storage limit {text:?}. "),
            ));
        }
    }
    None
}

/// upstream's `byEvictionPriority`: memory first.
fn first_to_reclaim<'a>(met: &[&'a Threshold]) -> Option<&'a Threshold> {
    met.iter()
        .find(|t| t.signal == Signal::MemoryAvailable)
        .or_else(|| met.first())
        .copied()
}

fn is_disk(signal: Signal) -> bool {
    !matches!(signal, Signal::MemoryAvailable | Signal::PidAvailable)
}

/// The eviction manager's own state: which thresholds are met, since when.
pub struct Manager {
    pub thresholds: Thresholds,
    pub max_pod_grace: i64,
    root_dir: PathBuf,
    pod_logs_dir: PathBuf,
    cgroups: Cgroups,
    met: BTreeSet<Signal>,
    first_met: HashMap<Signal, Instant>,
    /// The image filesystem is the node filesystem (same device), as last observed.
    images_on_nodefs: bool,
}

impl Manager {
    pub fn new(config: &nodeagent_config::Config) -> anyhow::Result<Self> {
        Ok(Self {
            thresholds: Thresholds::from_config(&config.kubelet).map_err(anyhow::Error::msg)?,
            max_pod_grace: i64::from(config.kubelet.eviction_max_pod_grace_period),
            root_dir: config.root_dir.clone(),
            pod_logs_dir: config.kubelet.pod_logs_dir.clone(),
            cgroups: Cgroups::detect(),
            met: BTreeSet::new(),
            first_met: HashMap::new(),
            images_on_nodefs: true,
        })
    }

    /// The thresholds met now (those met before held until their minimum reclaim is
    /// free), and of those the ones whose grace period is over.
    fn update(&mut self, obs: &Observations, now: Instant) -> Vec<Threshold> {
        let all = &self.thresholds.0;
        let mut met: Vec<&Threshold> = eviction::met(all, obs, false);
        let held = all.iter().filter(|t| self.met.contains(&t.signal));
        for t in eviction::met(held, obs, true) {
            if !met.contains(&t) {
                met.push(t);
            }
        }
        self.met = met.iter().map(|t| t.signal).collect();
        self.first_met.retain(|s, _| self.met.contains(s));
        for s in &self.met {
            self.first_met.entry(*s).or_insert(now);
        }
        met.into_iter()
            .filter(|t| {
                t.is_hard()
                    || self
                        .first_met
                        .get(&t.signal)
                        .is_some_and(|at| now.duration_since(*at) >= t.grace_period)
            })
            .cloned()
            .collect()
    }
}

impl PodSync {
    async fn observe_signals(&self, m: &mut Manager) -> Observations {
        let image_fs = self.cri.image_fs_mount().await;
        let (cgroups, root) = (m.cgroups.clone(), m.root_dir.clone());
        let (obs, same) = tokio::task::spawn_blocking(move || {
            use std::os::unix::fs::MetadataExt;
            let dev = |p: &std::path::Path| std::fs::metadata(p).map(|md| md.dev()).ok();
            let same = image_fs.as_deref().is_none_or(|i| dev(i) == dev(&root));
            (
                eviction::observe(&cgroups, &root, image_fs.as_deref()),
                same,
            )
        })
        .await
        .unwrap_or_default();
        m.images_on_nodefs = same;
        obs
    }

    /// One pass of the eviction manager; evicts at most one pod.
    pub async fn eviction_pass(self: &Arc<Self>, m: &mut Manager) {
        let obs = self.observe_signals(m).await;
        let due = m.update(&obs, Instant::now());
        self.lock().pressure = m.met.iter().map(|s| s.condition()).collect();
        // Local storage limits first, as upstream: a pod over its own limit goes at once.
        // They hold with no threshold configured too (upstream's
        // localStorageCapacityIsolation, on by default).
        if self.local_storage_pass(m).await {
            return;
        }
        let refs: Vec<&Threshold> = due.iter().collect();
        let Some(threshold) = first_to_reclaim(&refs).cloned() else {
            return;
        };
        let Some(mut observed) = obs.get(&threshold.signal).copied() else {
            return;
        };
        tracing::warn!(
            signal = threshold.signal.name(),
            available = observed.available,
            threshold = %threshold.value,
            "eviction threshold met; attempting to reclaim"
        );
        if is_disk(threshold.signal) {
            // Node-level reclaim first: dead containers and sandboxes, then (for the image
            // filesystem, or a node filesystem that holds the images too) unused images.
            self.collect_garbage(self.gc).await;
            let images_here = !matches!(
                threshold.signal,
                Signal::NodeFsAvailable | Signal::NodeFsInodesFree
            ) || m.images_on_nodefs;
            if images_here {
                let mut gc = self.image_gc.lock().await;
                self.image_gc_pass(&mut gc, true).await;
            }
            let again = self.observe_signals(m).await;
            if eviction::met([&threshold], &again, true).is_empty() {
                tracing::info!(
                    signal = threshold.signal.name(),
                    "node-level reclaim freed enough; no pod evicted"
                );
                return;
            }
            if let Some(o) = again.get(&threshold.signal) {
                observed = *o;
            }
        }
        let mut pods = self.candidates(threshold.signal, m, |_| true).await;
        rank(threshold.signal, &mut pods);
        for c in pods {
            if c.critical {
                tracing::debug!(pod.uid = %c.uid, "a critical pod is not evicted");
                continue;
            }
            let pod = self.lock().desired.get(&c.uid).cloned();
            let Some(pod) = pod else { continue };
            let grace = if threshold.is_hard() {
                HARD_GRACE
            } else {
                let own = crate::worker::kill_order::grace_seconds(&pod);
                m.max_pod_grace.min(own)
            };
            let text = message(&threshold, &observed, &c);
            self.evict(&pod, &text, annotations(&threshold, &c), grace)
                .await;
            // upstream counts the eviction under the threshold's signal (eviction_manager.go).
            nodeagent_telemetry::metrics::kubelet::record_eviction(threshold.signal.name());
            return;
        }
        tracing::warn!(signal = threshold.signal.name(), "no pod could be evicted");
    }

    /// Evicts every pod over its containers' `ephemeral-storage` limits (upstream's
    /// `podEphemeralStorageLimitEviction` and `containerEphemeralStorageLimitEviction`;
    /// emptyDir `sizeLimit` is checked at each sync, `evict.rs`). True if one was evicted.
    async fn local_storage_pass(self: &Arc<Self>, m: &Manager) -> bool {
        let pods = self
            .candidates(Signal::NodeFsAvailable, m, has_storage_limit)
            .await;
        let mut evicted = false;
        for c in pods {
            let pod = self.lock().desired.get(&c.uid).cloned();
            let Some(pod) = pod else { continue };
            if let Some((signal, message)) = local_storage_violation(&pod, &c) {
                let annotations = std::collections::BTreeMap::new();
                self.evict(&pod, &message, annotations, 0).await;
                nodeagent_telemetry::metrics::kubelet::record_eviction(signal);
                evicted = true;
            }
        }
        evicted
    }

    /// Evicts `pod`: Failed, reason Evicted, the message, a Warning event, and its
    /// containers stopped with `grace`.
    async fn evict(
        self: &Arc<Self>,
        pod: &Pod,
        message: &str,
        annotations: std::collections::BTreeMap<String, String>,
        grace: i64,
    ) {
        let uid = k8s::pod_uid(pod).to_string();
        tracing::warn!(pod = %k8s::pod_full_name(pod), %message, grace, "evicting the pod");
        self.lock().pod_failed.insert(
            uid.clone(),
            Waiting {
                reason: EVICTED.into(),
                message: message.to_string(),
            },
        );
        self.events.pod_annotated(
            pod,
            nodeagent_config::events::EventType::Warning,
            EVICTED,
            message,
            annotations,
        );
        // upstream's killPodFunc: the pod's worker stops it, and the eviction waits.
        self.kill_pod_now(pod, Some(grace)).await;
        // What the pod wrote to its emptyDirs (on disk or in memory) is what the node is
        // short of: it goes with the pod, as upstream tears down a terminated pod's volumes.
        if let Err(e) = self.release_volumes(&uid).await {
            tracing::warn!(error = %e, "releasing the evicted pod's volumes failed; its sync retries");
            self.trigger(&uid);
        }
    }

    /// The pods that run now, with what they use of `signal`'s resource.
    async fn candidates(
        &self,
        signal: Signal,
        m: &Manager,
        only: fn(&Pod) -> bool,
    ) -> Vec<Candidate> {
        let pods: Vec<(Pod, String)> = {
            let st = self.lock();
            st.desired
                .iter()
                .filter(|(uid, _)| !st.pod_failed.contains_key(*uid))
                .filter(|(_, pod)| only(pod))
                .filter_map(|(uid, pod)| {
                    let rt = st.runtime.get(uid)?;
                    let sandbox = rt
                        .sandboxes
                        .iter()
                        .filter(|s| s.state == cri::PodSandboxState::SandboxReady as i32)
                        .max_by_key(|s| s.created_at_unix_nanos)?;
                    Some((pod.clone(), sandbox.id.clone()))
                })
                .collect()
        };
        let mut stats: HashMap<String, Vec<cri::ContainerStats>> = HashMap::new();
        // ListContainerStats asks every container's shim: only when some pod needs it.
        if signal != Signal::PidAvailable && !pods.is_empty() {
            let mut runtime = self.cri.runtime.clone();
            if let Ok(r) = runtime
                .list_container_stats(self.cri.request(cri::ListContainerStatsRequest::default()))
                .await
            {
                for s in r.into_inner().stats {
                    let sandbox = s
                        .attributes
                        .as_ref()
                        .and_then(|a| a.labels.get("io.kubernetes.pod.uid"))
                        .cloned()
                        .unwrap_or_default();
                    stats.entry(sandbox).or_default().push(s);
                }
            }
        }
        let mut out = Vec::new();
        for (pod, _sandbox) in pods {
            let uid = k8s::pod_uid(&pod).to_string();
            let spec = pod.spec.clone().unwrap_or_default();
            let request_of = |name: &str, resource: &str| -> u64 {
                spec.containers
                    .iter()
                    .find(|c| c.name == name)
                    .and_then(|c| {
                        c.resources
                            .as_ref()?
                            .requests
                            .as_ref()?
                            .get(resource)
                            .cloned()
                    })
                    .and_then(|q| nodeagent_config::quantity::bytes(&q.0))
                    .unwrap_or(0)
                    .max(0) as u64
            };
            let mut containers = Vec::new();
            let (usage, request) = match signal {
                Signal::PidAvailable => {
                    let pids = crate::container_manager::cgroups::pod_cgroup_parent(
                        &pod,
                        self.node.cgroups_per_qos,
                        &self.node.cgroup_root,
                        self.node.cgroup_driver,
                    )
                    .and_then(|rel| m.cgroups.pids(&rel))
                    .unwrap_or(0);
                    (pids, 0)
                }
                Signal::MemoryAvailable => {
                    containers = per_container(stats.get(&uid), "memory", &request_of, |s| {
                        s.memory
                            .as_ref()?
                            .working_set_bytes
                            .as_ref()
                            .map(|v| v.value)
                    });
                    let total: u64 = containers.iter().map(|c| c.1).sum();
                    // A pod with pod-level resources is ranked by its pod-level request
                    // alone (upstream's `GetResourceRequestQuantity` skips the containers').
                    let req: u64 = match nodeagent_config::pod_level::set(&pod) {
                        Some(p) => p
                            .request(nodeagent_config::pod_level::Resource::Memory)
                            .unwrap_or(0)
                            .max(0) as u64,
                        None => spec
                            .containers
                            .iter()
                            .map(|c| request_of(&c.name, "memory"))
                            .sum(),
                    };
                    (total, req)
                }
                _ => {
                    // A container uses its logs and (where the images share the node's
                    // filesystem) its writable layer; the pod adds its emptyDirs on disk.
                    let logs = crate::runtime_spec::pod_log_dir(&m.pod_logs_dir, &pod).ok();
                    let empty_dirs = m
                        .root_dir
                        .join("pods")
                        .join(&uid)
                        .join("volumes/kubernetes.io~empty-dir");
                    let rootfs_counts = m.images_on_nodefs;
                    containers =
                        per_container(stats.get(&uid), "ephemeral-storage", &request_of, |s| {
                            let layer = s.writable_layer.as_ref()?.used_bytes.as_ref()?.value;
                            Some(if rootfs_counts { layer } else { 0 })
                        });
                    let names: Vec<String> = containers.iter().map(|c| c.0.clone()).collect();
                    let (log_bytes, dirs_b) = tokio::task::spawn_blocking(move || {
                        let du =
                            |p: &std::path::Path| nodeagent_du::measure(p).map_or(0, |u| u.bytes);
                        let per: Vec<u64> = names
                            .iter()
                            .map(|n| logs.as_ref().map_or(0, |l| du(&l.join(n))))
                            .collect();
                        (per, du(&empty_dirs))
                    })
                    .await
                    .unwrap_or_default();
                    for (c, l) in containers.iter_mut().zip(log_bytes) {
                        c.1 += l;
                    }
                    let total = containers.iter().map(|c| c.1).sum::<u64>() + dirs_b;
                    let req: u64 = spec
                        .containers
                        .iter()
                        .map(|c| request_of(&c.name, "ephemeral-storage"))
                        .sum();
                    (total, req)
                }
            };
            out.push(Candidate {
                uid,
                priority: spec.priority.unwrap_or(0),
                usage,
                request,
                containers,
                critical: crate::container_manager::oom::is_critical(&pod),
            });
        }
        out
    }
}

/// (container, usage, request of `resource`) of each container in `stats`, the usage read
/// by `usage` (0 when the runtime did not say).
fn per_container(
    stats: Option<&Vec<cri::ContainerStats>>,
    resource: &str,
    request_of: &dyn Fn(&str, &str) -> u64,
    usage: impl Fn(&cri::ContainerStats) -> Option<u64>,
) -> Vec<(String, u64, u64)> {
    stats
        .into_iter()
        .flatten()
        .filter_map(|s| {
            let name = s.attributes.as_ref()?.metadata.as_ref()?.name.clone();
            let request = request_of(&name, resource);
            Some((name, usage(s).unwrap_or(0), request))
        })
        .collect()
}

/// Runs a pass every `period` (`--eviction-monitoring-period`, upstream's 10s by default)
/// until shutdown.
pub async fn run(sync: Arc<PodSync>, mut manager: Manager, period: Duration) {
    let mut tick = tokio::time::interval(period);
    loop {
        tokio::select! {
            _ = sync.shutdown.wait() => return,
            _ = tick.tick() => sync.eviction_pass(&mut manager).await,
        }
    }
}

#[cfg(test)]
mod tests;
