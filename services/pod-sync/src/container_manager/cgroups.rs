//! Pod cgroups with `cgroupsPerQOS`: `kubepods[/burstable|/besteffort]/pod<uid>` under
//! `cgroupRoot`, passed to CRI as the cgroup parent. The cgroupfs driver makes them as
//! directories, the systemd driver as slices ([`systemd`]), with the pod's limits, before
//! the runtime puts anything in them. The runtime never removes them, so we do once the pod
//! is gone, on cgroup v1 and v2 alike.

pub mod systemd;

use crate::container_manager::quantity;
use k8s_openapi::api::core::v1::Pod;
use nodeagent_config::cgroup_name::{self, CgroupDriver, CgroupName};
use nodeagent_config::pod_level::{PodLevel, Resource};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QosClass {
    Guaranteed,
    Burstable,
    BestEffort,
}

impl QosClass {
    pub fn as_str(self) -> &'static str {
        match self {
            QosClass::Guaranteed => "Guaranteed",
            QosClass::Burstable => "Burstable",
            QosClass::BestEffort => "BestEffort",
        }
    }
}

/// Upstream's `ComputePodQOS` (container level): the positive cpu and memory requests and
/// limits of every container, init containers included, are summed per resource (zero
/// amounts and other resources, hugepages included, do not count); BestEffort when there is
/// none, Guaranteed when every container limits both cpu and memory and the sums of
/// requests and of limits are the same, else Burstable. A request left out is its limit
/// (the API server's defaulting, which static pods get too).
///
/// A pod with pod-level `spec.resources` (PodLevelResources, on since 1.34) is classed by
/// them alone, its containers' resources not read: Guaranteed only with pod-level cpu and
/// memory limits equal to the (defaulted) pod-level requests.
pub fn qos_class(pod: &Pod) -> QosClass {
    let Some(spec) = &pod.spec else {
        return QosClass::BestEffort;
    };
    if let Some(pod_level) = PodLevel::of(pod) {
        let positive = |v: Option<i64>| v.filter(|v| *v > 0);
        let mut requests = std::collections::BTreeMap::<&str, i64>::new();
        let mut limits = std::collections::BTreeMap::<&str, i64>::new();
        for r in Resource::ALL {
            if let Some(v) = positive(pod_level.request(r)) {
                requests.insert(r.name(), v);
            }
            if let Some(v) = positive(pod_level.limit(r)) {
                limits.insert(r.name(), v);
            }
        }
        let both_limited = limits.len() == Resource::ALL.len();
        return class(&requests, &limits, both_limited);
    }
    let amount = |name: &str, q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity| {
        let v = if name == "cpu" {
            quantity::cpu_millis(&q.0)
        } else {
            quantity::bytes(&q.0)
        };
        v.filter(|v| *v > 0)
    };
    let mut requests = std::collections::BTreeMap::<&str, i64>::new();
    let mut limits = std::collections::BTreeMap::<&str, i64>::new();
    let mut every_container_limited = true;
    for c in spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
    {
        let res = c.resources.clone().unwrap_or_default();
        let (c_limits, c_requests) = (
            res.limits.unwrap_or_default(),
            res.requests.unwrap_or_default(),
        );
        for name in ["cpu", "memory"] {
            let limit = c_limits.get(name).and_then(|q| amount(name, q));
            let request = match c_requests.get(name) {
                Some(q) => amount(name, q),
                None => limit,
            };
            if let Some(r) = request {
                *requests.entry(name).or_default() += r;
            }
            match limit {
                Some(l) => *limits.entry(name).or_default() += l,
                None => every_container_limited = false,
            }
        }
    }
    class(&requests, &limits, every_container_limited)
}

/// The class from the positive cpu and memory requests and limits (summed where they come
/// from containers), and whether everything that may be limited is.
fn class(
    requests: &std::collections::BTreeMap<&str, i64>,
    limits: &std::collections::BTreeMap<&str, i64>,
    all_limited: bool,
) -> QosClass {
    if requests.is_empty() && limits.is_empty() {
        QosClass::BestEffort
    } else if all_limited && requests == limits {
        QosClass::Guaranteed
    } else {
        QosClass::Burstable
    }
}

/// The pod's cgroup name (upstream's `GetPodContainerName`), or None without
/// cgroupsPerQOS.
pub fn pod_cgroup_name(pod: &Pod, cgroups_per_qos: bool, cgroup_root: &str) -> Option<CgroupName> {
    if !cgroups_per_qos {
        return None;
    }
    // Not a safe single component: no cgroup of ours can be named after it (sync refuses
    // such a pod before any sandbox; removal then touches nothing).
    let uid = nodeagent_hostpath::uid(pod.metadata.uid.as_deref().unwrap_or_default()).ok()?;
    let qos = match qos_class(pod) {
        QosClass::Guaranteed => "",
        QosClass::Burstable => "burstable",
        QosClass::BestEffort => "besteffort",
    };
    Some(cgroup_name::pod_cgroup_name(cgroup_root, qos, uid))
}

/// The pod's cgroup parent as the driver names it (what CRI gets), or None without
/// cgroupsPerQOS.
pub fn pod_cgroup_parent(
    pod: &Pod,
    cgroups_per_qos: bool,
    cgroup_root: &str,
    driver: CgroupDriver,
) -> Option<String> {
    pod_cgroup_name(pod, cgroups_per_qos, cgroup_root).map(|n| n.path(driver))
}

/// The cgroup driver of the runtime's default handler and the handler's name, from
/// containerd's verbose CRI status (the `config` it reports:
/// `containerd.runtimes.<defaultRuntimeName>.options.SystemdCgroup`, false when unset for
/// runc); None where the runtime does not say (another runtime, another runtime type).
pub fn runtime_cgroup_driver(config_json: &str) -> Option<(String, CgroupDriver)> {
    let config: serde_json::Value = serde_json::from_str(config_json).ok()?;
    let containerd = &config["containerd"];
    let handler = containerd["defaultRuntimeName"].as_str()?;
    let runtime = &containerd["runtimes"][handler];
    let systemd = match runtime["options"]["SystemdCgroup"].as_bool() {
        Some(systemd) => systemd,
        None if runtime["runtimeType"].as_str() == Some("io.containerd.runc.v2") => false,
        None => return None,
    };
    let driver = if systemd {
        CgroupDriver::Systemd
    } else {
        CgroupDriver::Cgroupfs
    };
    Some((handler.to_string(), driver))
}

/// Makes and removes pod cgroups with the configured driver.
#[derive(Clone)]
pub struct PodCgroups {
    /// Where the cgroup hierarchies are mounted (`/sys/fs/cgroup`).
    pub fs: PathBuf,
    /// None: the cgroupfs driver.
    systemd: Option<systemd::Slices>,
}

impl PodCgroups {
    /// The configured driver's manager; the systemd driver needs systemd to answer.
    pub async fn new(fs: PathBuf, driver: CgroupDriver) -> Result<Self, String> {
        let systemd = match driver {
            CgroupDriver::Cgroupfs => None,
            CgroupDriver::Systemd => Some(systemd::Slices::connect().await?),
        };
        Ok(Self { fs, systemd })
    }

    /// Creates the pod cgroup with its limits (idempotent): a `create` of upstream's
    /// `kubelet_cgroup_manager_duration_seconds`.
    pub async fn ensure(
        &self,
        name: &CgroupName,
        res: &PodResources,
        pids_limit: i64,
    ) -> Result<(), String> {
        timed("create", self.apply(name, res, pids_limit)).await
    }

    /// Makes `name` (where missing) and sets its limits.
    async fn apply(
        &self,
        name: &CgroupName,
        res: &PodResources,
        pids_limit: i64,
    ) -> Result<(), String> {
        match &self.systemd {
            Some(slices) => {
                let v2 = self.fs.join("cgroup.controllers").exists();
                let props = systemd::properties(res, pids_limit, v2);
                slices.ensure(&self.fs, name, props).await
            }
            None => ensure_pod_cgroup(&self.fs, &name.to_cgroupfs(), res, pids_limit),
        }
    }

    /// Sets `kubepods` and the QoS tiers' cgroups ([`qos_cgroups`]), creating them where
    /// missing (idempotent).
    /// Each is an `update` (upstream's QoS container manager updates the tiers through
    /// its cgroup manager's Update).
    pub async fn ensure_qos(&self, tiers: &[QosTier]) -> Result<(), String> {
        for (name, res, pids_limit) in tiers {
            timed("update", self.apply(name, res, *pids_limit)).await?;
        }
        Ok(())
    }

    /// Removes the pod cgroup (missing is fine): a `destroy`.
    pub async fn remove(&self, name: &CgroupName) -> Result<(), String> {
        timed("destroy", async {
            match &self.systemd {
                Some(slices) => slices.remove(name).await,
                None => remove_pod_cgroup(&self.fs, &name.to_cgroupfs()),
            }
        })
        .await
    }
}

/// Runs a cgroup manager operation and records its duration under `operation` (upstream
/// records failed ones too).
async fn timed<T>(operation: &'static str, work: impl std::future::Future<Output = T>) -> T {
    let started = std::time::Instant::now();
    let out = work.await;
    nodeagent_telemetry::metrics::kubelet::record_cgroup_operation(
        operation,
        started.elapsed().as_secs_f64(),
    );
    out
}

/// Pod-level limits (upstream `ResourceConfigForPod`): CPU shares from the pod's requests,
/// a CFS quota and a memory limit from its limits, each only when every container sets
/// that limit or the pod sets it at pod level (Guaranteed pods always do; BestEffort pods
/// get the minimum shares only). Init containers and sidecars count as upstream's
/// `PodRequests`/`PodLimits` count them, a pod-level amount replaces the containers' sum
/// ([`nodeagent_config::pod_level`]), and the pod's `overhead` is added.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodResources {
    pub cpu_shares: u64,
    pub cpu_quota_us: Option<i64>,
    pub memory_limit_bytes: Option<i64>,
    /// cgroup v2's `memory.min` with memory QoS ([`super::memory_qos`]); None: left as it
    /// is (v1 has none).
    pub memory_min: Option<i64>,
}

/// Upstream `MinShares` and `MaxShares`.
const MIN_SHARES: u64 = 2;
const MAX_SHARES: i64 = 262_144;
/// Upstream's CFS period (100 ms) and `MinQuotaPeriod` (1 ms), in microseconds.
const CFS_PERIOD_US: i64 = 100_000;
const MIN_QUOTA_US: i64 = 1000;

pub fn pod_resources(pod: &Pod) -> PodResources {
    use nodeagent_config::aggregate::overhead;
    let qos = qos_class(pod);
    if qos == QosClass::BestEffort {
        return PodResources {
            cpu_shares: MIN_SHARES,
            ..Default::default()
        };
    }
    let cpu_request = nodeagent_config::pod_level::pod_request(pod, Resource::Cpu)
        + overhead(pod, "cpu", quantity::cpu_millis);
    // Overhead is added to a limit only where there is one (upstream: "non-zero limits").
    let with_overhead = |total: i64, name: &str, parse: fn(&str) -> Option<i64>| {
        if total == 0 {
            0
        } else {
            total.saturating_add(overhead(pod, name, parse))
        }
    };
    let cpu = nodeagent_config::pod_level::pod_limit(pod, Resource::Cpu);
    let memory = nodeagent_config::pod_level::pod_limit(pod, Resource::Memory);
    let cpu_limit = with_overhead(cpu.total, "cpu", quantity::cpu_millis);
    let memory_limit = with_overhead(memory.total, "memory", quantity::bytes);
    let guaranteed = qos == QosClass::Guaranteed;
    // A zero limit is no limit, as the runtime's cgroup managers read upstream's zero.
    PodResources {
        cpu_shares: milli_cpu_to_shares(cpu_request),
        cpu_quota_us: (cpu_limit > 0 && (guaranteed || cpu.every_container))
            .then(|| (cpu_limit.saturating_mul(CFS_PERIOD_US) / 1000).max(MIN_QUOTA_US)),
        memory_limit_bytes: (memory_limit > 0 && (guaranteed || memory.every_container))
            .then_some(memory_limit),
        memory_min: None,
    }
}

/// Upstream's `MilliCPUToShares`: 1024 shares a CPU, at least `MinShares` (also for no
/// request at all), at most `MaxShares`.
pub fn milli_cpu_to_shares(milli_cpu: i64) -> u64 {
    (milli_cpu.saturating_mul(1024) / 1000).clamp(MIN_SHARES as i64, MAX_SHARES) as u64
}

/// What the `kubepods` cgroup is limited to: upstream's node allocatable (capacity less
/// kubeReserved and systemReserved, without the eviction thresholds) where
/// `enforceNodeAllocatable` has `pods`, else the capacity
/// (node_container_manager_linux.go `createNodeAllocatableCgroups`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodsLimits {
    pub cpu_millis: i64,
    pub memory: i64,
    /// Tasks (`pids.max`, systemd's `TasksMax`); 0 where the kernel's most is unknown.
    /// Upstream's `pid` capacity is the smaller of `kernel.pid_max` and
    /// `kernel.threads-max` (pkg/kubelet/stats/pidlimit), less `kubeReserved` and
    /// `systemReserved` `pid` where enforced.
    pub pids: i64,
}

impl PodsLimits {
    pub fn of_this_node(kubelet: &nodeagent_config::KubeletConfiguration) -> Self {
        let capacity = crate::node::admission::capacity_but_storage();
        let limits = if kubelet.enforce_node_allocatable.iter().any(|e| e == "pods") {
            nodeagent_config::eviction::allocatable(
                &capacity,
                kubelet,
                &nodeagent_config::eviction::Thresholds::default(),
            )
        } else {
            capacity
        };
        let get = |k: &str| limits.get(k).copied().unwrap_or(0) as i64;
        Self {
            cpu_millis: get("cpu"),
            memory: get("memory"),
            pids: get("pid"),
        }
    }
}

/// A QoS cgroup, its limits and its tasks limit (0: none).
pub type QosTier = (CgroupName, PodResources, i64);

/// `kubepods` and its QoS tiers as upstream's container manager sets them: `kubepods`
/// gets the shares of [`PodsLimits`]'s CPU, its memory as the limit and its tasks as the
/// pids limit (`getCgroupConfig`); `besteffort` always `MinShares`, `burstable` the shares of the
/// CPU its pods request together (qos_container_manager_linux.go `setCPUCgroupConfig`,
/// over the active pods); with memory QoS, `burstable` and `kubepods` the `memory.min` of
/// their pods' memory requests (`setMemoryQoS`). `QOSReserved` (alpha) is not done.
pub fn qos_cgroups<'a>(
    cgroup_root: &str,
    limits: PodsLimits,
    active: impl IntoIterator<Item = &'a Pod>,
    memory_qos: bool,
) -> Vec<QosTier> {
    let active: Vec<&Pod> = active.into_iter().collect();
    let burstable_cpu: i64 = active
        .iter()
        .filter(|p| qos_class(p) == QosClass::Burstable)
        .map(|p| crate::node::admission::requests(p).cpu_millis)
        .sum();
    let (burstable_min, pods_min) = match memory_qos {
        true => {
            let (b, p) = qos_memory_min(active.iter().copied());
            (Some(b), Some(p))
        }
        false => (None, None),
    };
    let pods = cgroup_name::pods_cgroup_name(cgroup_root);
    vec![
        (
            pods.clone(),
            PodResources {
                cpu_shares: milli_cpu_to_shares(limits.cpu_millis),
                cpu_quota_us: None,
                memory_limit_bytes: (limits.memory > 0).then_some(limits.memory),
                memory_min: pods_min,
            },
            limits.pids.max(0),
        ),
        (
            pods.child(&["burstable"]),
            PodResources {
                cpu_shares: milli_cpu_to_shares(burstable_cpu),
                memory_min: burstable_min,
                ..Default::default()
            },
            0,
        ),
        (
            pods.child(&["besteffort"]),
            PodResources {
                cpu_shares: MIN_SHARES,
                ..Default::default()
            },
            0,
        ),
    ]
}

/// cgroup v2's CPU weight for v1 shares (runc's `ConvertCPUSharesToCgroupV2Value`).
pub fn cpu_weight(shares: u64) -> u64 {
    if shares == 0 {
        return 0;
    }
    1 + (shares.saturating_sub(2) * 9999) / 262_142
}

/// Creates the pod cgroup with its limits before the runtime puts anything in it (cgroup
/// v1: the cpu, memory and pids hierarchies; v2: the unified tree). Idempotent.
pub fn ensure_pod_cgroup(
    cgroup_fs: &Path,
    parent: &str,
    res: &PodResources,
    pids_limit: i64,
) -> Result<(), String> {
    let rel = parent.trim_start_matches('/');
    let write = |path: PathBuf, value: String| -> Result<(), String> {
        std::fs::write(&path, &value)
            .map_err(|e| format!("write {value:?} to {}: {e}", path.display()))
    };
    if cgroup_fs.join("cgroup.controllers").exists() {
        // v2: every ancestor must delegate the controllers to its children.
        let mut dir = cgroup_fs.to_path_buf();
        for part in rel.split('/') {
            let _ = std::fs::write(dir.join("cgroup.subtree_control"), "+cpu +memory +pids");
            dir = dir.join(part);
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        write(
            dir.join("cpu.weight"),
            cpu_weight(res.cpu_shares).to_string(),
        )?;
        let quota = res
            .cpu_quota_us
            .map_or("max".to_string(), |q| q.to_string());
        write(dir.join("cpu.max"), format!("{quota} 100000"))?;
        write(
            dir.join("memory.max"),
            res.memory_limit_bytes
                .map_or("max".into(), |m| m.to_string()),
        )?;
        if pids_limit > 0 {
            write(dir.join("pids.max"), pids_limit.to_string())?;
        }
        if let Some(min) = res.memory_min {
            write(dir.join("memory.min"), min.max(0).to_string())?;
        }
        return Ok(());
    }
    let cpu = cgroup_fs.join("cpu").join(rel);
    std::fs::create_dir_all(&cpu).map_err(|e| format!("{}: {e}", cpu.display()))?;
    write(cpu.join("cpu.shares"), res.cpu_shares.to_string())?;
    write(cpu.join("cpu.cfs_period_us"), "100000".into())?;
    write(
        cpu.join("cpu.cfs_quota_us"),
        res.cpu_quota_us.unwrap_or(-1).to_string(),
    )?;
    let memory = cgroup_fs.join("memory").join(rel);
    std::fs::create_dir_all(&memory).map_err(|e| format!("{}: {e}", memory.display()))?;
    if let Some(m) = res.memory_limit_bytes {
        write(memory.join("memory.limit_in_bytes"), m.to_string())?;
    }
    if pids_limit > 0 {
        let pids = cgroup_fs.join("pids").join(rel);
        std::fs::create_dir_all(&pids).map_err(|e| format!("{}: {e}", pids.display()))?;
        write(pids.join("pids.max"), pids_limit.to_string())?;
    }
    Ok(())
}

/// What the cgroup at `rel` (a driver's path, e.g. [`CgroupName::path`]) uses of memory
/// now: v1 `memory.usage_in_bytes`, v2 `memory.current` (upstream's
/// `GetPodCgroupMemoryUsage`); None where it cannot be read.
pub fn memory_usage(cgroup_fs: &Path, rel: &str) -> Option<u64> {
    let rel = rel.trim_start_matches('/');
    let file = if cgroup_fs.join("cgroup.controllers").exists() {
        cgroup_fs.join(rel).join("memory.current")
    } else {
        cgroup_fs
            .join("memory")
            .join(rel)
            .join("memory.usage_in_bytes")
    };
    std::fs::read_to_string(file).ok()?.trim().parse().ok()
}

/// Removes a pod cgroup in every hierarchy it exists in (v1: each controller; v2: the
/// unified tree). Children (the containers' cgroups) go first. Missing is fine.
pub fn remove_pod_cgroup(cgroup_fs: &Path, parent: &str) -> Result<(), String> {
    let rel = parent.trim_start_matches('/');
    let mut errors = Vec::new();
    for dir in hierarchies(cgroup_fs) {
        let path = dir.join(rel);
        if path.is_dir()
            && let Err(e) = remove_tree(&path)
        {
            errors.push(format!("{}: {e}", path.display()));
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

/// The cgroup hierarchies mounted under `cgroup_fs` (`/sys/fs/cgroup`).
fn hierarchies(cgroup_fs: &Path) -> Vec<PathBuf> {
    if cgroup_fs.join("cgroup.controllers").exists() {
        return vec![cgroup_fs.to_path_buf()]; // cgroup v2
    }
    let Ok(entries) = std::fs::read_dir(cgroup_fs) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false)) // skip "cpu -> cpu,cpuacct" links
        .map(|e| e.path())
        .collect()
}

/// cgroup directories are removed with rmdir, deepest first (their files are virtual).
fn remove_tree(path: &Path) -> std::io::Result<()> {
    if let Ok(entries) = std::fs::read_dir(path) {
        for e in entries.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                remove_tree(&e.path())?;
            }
        }
    }
    match std::fs::remove_dir(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// The QoS tiers' `memory.min` over the active pods: `burstable` the requests of its pods,
/// `kubepods` (where Guaranteed pods sit) those of the Guaranteed and Burstable pods.
pub fn qos_memory_min<'a>(active: impl IntoIterator<Item = &'a Pod>) -> (i64, i64) {
    let (mut burstable, mut guaranteed) = (0, 0);
    for p in active {
        let memory = crate::node::admission::requests(p).memory;
        match qos_class(p) {
            QosClass::Burstable => burstable += memory,
            QosClass::Guaranteed => guaranteed += memory,
            QosClass::BestEffort => {}
        }
    }
    (burstable, guaranteed + burstable)
}

#[cfg(test)]
mod tests;
