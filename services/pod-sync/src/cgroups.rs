//! Pod cgroups with `cgroupsPerQOS`: `kubepods[/burstable|/besteffort]/pod<uid>` under
//! `cgroupRoot`, passed to CRI as the cgroup parent. The cgroupfs driver makes them as
//! directories, the systemd driver as slices ([`systemd`]), with the pod's limits, before
//! the runtime puts anything in them. The runtime never removes them, so we do once the pod
//! is gone, on cgroup v1 and v2 alike.

pub mod systemd;

use crate::quantity;
use k8s_openapi::api::core::v1::Pod;
use nodeagent_config::cgroup_name::{self, CgroupDriver, CgroupName};
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

/// Upstream `qos.GetPodQOS`: Guaranteed when every container limits CPU and memory with
/// requests equal to limits; BestEffort when nothing is requested or limited.
pub fn qos_class(pod: &Pod) -> QosClass {
    let Some(spec) = &pod.spec else {
        return QosClass::BestEffort;
    };
    let containers = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten());
    let mut any = false;
    let mut guaranteed = true;
    for c in containers {
        let res = c.resources.clone().unwrap_or_default();
        let limits = res.limits.unwrap_or_default();
        let requests = res.requests.unwrap_or_default();
        for name in ["cpu", "memory"] {
            let limit = limits.get(name).map(|q| q.0.clone());
            let request = requests.get(name).map(|q| q.0.clone()).or(limit.clone());
            if limit.is_some() || request.is_some() {
                any = true;
            }
            let equal = match (&limit, &request) {
                (Some(l), Some(r)) if name == "cpu" => {
                    quantity::cpu_millis(l) == quantity::cpu_millis(r)
                }
                (Some(l), Some(r)) => quantity::bytes(l) == quantity::bytes(r),
                _ => false,
            };
            guaranteed &= equal;
        }
    }
    match (any, guaranteed) {
        (false, _) => QosClass::BestEffort,
        (true, true) => QosClass::Guaranteed,
        (true, false) => QosClass::Burstable,
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

    /// Creates the pod cgroup with its limits (idempotent).
    pub async fn ensure(
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

    /// Removes the pod cgroup (missing is fine).
    pub async fn remove(&self, name: &CgroupName) -> Result<(), String> {
        match &self.systemd {
            Some(slices) => slices.remove(name).await,
            None => remove_pod_cgroup(&self.fs, &name.to_cgroupfs()),
        }
    }
}

/// Pod-level limits (upstream `ResourceConfigForPod`): CPU shares from the pod's requests,
/// a CFS quota and a memory limit from its limits, each only when every container sets
/// that limit (Guaranteed pods always do; BestEffort pods get the minimum shares only).
/// Init containers and sidecars count as upstream's `PodRequests`/`PodLimits` count them,
/// and the pod's `overhead` is added.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodResources {
    pub cpu_shares: u64,
    pub cpu_quota_us: Option<i64>,
    pub memory_limit_bytes: Option<i64>,
}

/// Upstream `MinShares` and `MaxShares`.
const MIN_SHARES: u64 = 2;
const MAX_SHARES: i64 = 262_144;
/// Upstream's CFS period (100 ms) and `MinQuotaPeriod` (1 ms), in microseconds.
const CFS_PERIOD_US: i64 = 100_000;
const MIN_QUOTA_US: i64 = 1000;

pub fn pod_resources(pod: &Pod) -> PodResources {
    use crate::aggregate::{aggregate, overhead};
    use quantity::ContainerResources as R;
    let qos = qos_class(pod);
    if qos == QosClass::BestEffort {
        return PodResources {
            cpu_shares: MIN_SHARES,
            ..Default::default()
        };
    }
    let cpu_request =
        aggregate(pod, |c| R::of(c).cpu_request).total + overhead(pod, "cpu", quantity::cpu_millis);
    // Overhead is added to a limit only where there is one (upstream: "non-zero limits").
    let with_overhead = |total: i64, name: &str, parse: fn(&str) -> Option<i64>| {
        if total == 0 {
            0
        } else {
            total.saturating_add(overhead(pod, name, parse))
        }
    };
    let cpu = aggregate(pod, |c| R::of(c).cpu_limit);
    let memory = aggregate(pod, |c| R::of(c).memory_limit);
    let cpu_limit = with_overhead(cpu.total, "cpu", quantity::cpu_millis);
    let memory_limit = with_overhead(memory.total, "memory", quantity::bytes);
    let guaranteed = qos == QosClass::Guaranteed;
    // A zero limit is no limit, as the runtime's cgroup managers read upstream's zero.
    PodResources {
        cpu_shares: (cpu_request.saturating_mul(1024) / 1000).clamp(MIN_SHARES as i64, MAX_SHARES)
            as u64,
        cpu_quota_us: (cpu_limit > 0 && (guaranteed || cpu.every_container))
            .then(|| (cpu_limit.saturating_mul(CFS_PERIOD_US) / 1000).max(MIN_QUOTA_US)),
        memory_limit_bytes: (memory_limit > 0 && (guaranteed || memory.every_container))
            .then_some(memory_limit),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(resources: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": "u1"},
            "spec": {"containers": [{"name": "c", "image": "i", "resources": resources}]}
        }))
        .unwrap()
    }

    #[test]
    fn qos_classes_follow_upstream() {
        assert_eq!(qos_class(&pod(serde_json::json!({}))), QosClass::BestEffort);
        assert_eq!(
            qos_class(&pod(
                serde_json::json!({"limits": {"cpu": "1", "memory": "1Gi"}})
            )),
            QosClass::Guaranteed
        );
        assert_eq!(
            qos_class(&pod(
                serde_json::json!({"limits": {"cpu": "1", "memory": "1Gi"}, "requests": {"cpu": "1000m", "memory": "1Gi"}})
            )),
            QosClass::Guaranteed
        );
        assert_eq!(
            qos_class(&pod(serde_json::json!({"requests": {"cpu": "100m"}}))),
            QosClass::Burstable
        );
    }

    /// The shape of containerd 1.6's `config` in a verbose CRI status
    /// (pkg/cri/config/config.go's JSON names), as deploy/runtime/setup.sh configures it.
    #[test]
    fn the_runtimes_driver_from_containerds_status() {
        let config = |options: serde_json::Value| {
            serde_json::json!({
                "containerd": {
                    "snapshotter": "overlayfs",
                    "defaultRuntimeName": "runc",
                    "runtimes": {
                        "runc": {"runtimeType": "io.containerd.runc.v2", "options": options},
                        "kata": {"runtimeType": "io.containerd.kata.v2", "options": {}}
                    }
                },
                "sandboxImage": "registry.k8s.io/pause:3.9"
            })
            .to_string()
        };
        let runc = |d| Some(("runc".to_string(), d));
        assert_eq!(
            runtime_cgroup_driver(&config(serde_json::json!({"SystemdCgroup": true}))),
            runc(CgroupDriver::Systemd)
        );
        assert_eq!(
            runtime_cgroup_driver(&config(serde_json::json!({"SystemdCgroup": false}))),
            runc(CgroupDriver::Cgroupfs)
        );
        // runc's default when the option is not set.
        assert_eq!(
            runtime_cgroup_driver(&config(serde_json::json!({"BinaryName": "runc"}))),
            runc(CgroupDriver::Cgroupfs)
        );
        let kata = config(serde_json::json!({})).replace(
            "\"defaultRuntimeName\":\"runc\"",
            "\"defaultRuntimeName\":\"kata\"",
        );
        assert_eq!(runtime_cgroup_driver(&kata), None);
        assert_eq!(runtime_cgroup_driver("{}"), None);
        assert_eq!(runtime_cgroup_driver("not json"), None);
    }

    #[test]
    fn cgroup_parent_by_qos() {
        let p = pod(serde_json::json!({}));
        let fs = CgroupDriver::Cgroupfs;
        assert_eq!(
            pod_cgroup_parent(&p, true, "/", fs).as_deref(),
            Some("/kubepods/besteffort/podu1")
        );
        // What containerd gets under the systemd driver (it takes the last slice).
        assert_eq!(
            pod_cgroup_parent(&p, true, "/", CgroupDriver::Systemd).as_deref(),
            Some("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podu1.slice")
        );
        assert_eq!(pod_cgroup_parent(&p, false, "/", fs), None);
        // A UID that climbs names no cgroup at all (never "/kubepods/besteffort/pod../..").
        for bad in ["/../../system.slice", "..", ""] {
            let mut p = p.clone();
            p.metadata.uid = Some(bad.into());
            assert_eq!(pod_cgroup_parent(&p, true, "/", fs), None, "{bad:?}");
            assert_eq!(
                pod_cgroup_parent(&p, true, "/", CgroupDriver::Systemd),
                None
            );
        }
    }

    #[test]
    fn pod_limits_are_sums_only_when_every_container_sets_them() {
        let two = |a: serde_json::Value, b: serde_json::Value| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p", "uid": "u1"},
                "spec": {"containers": [
                    {"name": "a", "image": "i", "resources": a},
                    {"name": "b", "image": "i", "resources": b}]}
            }))
            .unwrap()
        };
        let full = serde_json::json!({"limits": {"cpu": "250m", "memory": "64Mi"}});
        let r = pod_resources(&two(full.clone(), full.clone()));
        assert_eq!(
            r,
            PodResources {
                cpu_shares: 512,
                cpu_quota_us: Some(50_000),
                memory_limit_bytes: Some(128 << 20)
            }
        );
        let r = pod_resources(&two(full, serde_json::json!({"requests": {"cpu": "100m"}})));
        assert_eq!(
            r,
            PodResources {
                cpu_shares: 358,
                cpu_quota_us: None,
                memory_limit_bytes: None
            }
        );
    }

    #[test]
    fn pod_limits_count_init_containers_sidecars_and_overhead() {
        let spec = |spec: serde_json::Value| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p", "uid": "u1"}, "spec": spec
            }))
            .unwrap()
        };
        let c = |name: &str, res: serde_json::Value| serde_json::json!({"name": name, "image": "i", "resources": res});
        let mem = |m: &str| serde_json::json!({"limits": {"memory": m}});
        let both = |cpu: &str, m: &str| serde_json::json!({"limits": {"cpu": cpu, "memory": m}});
        let mut sidecar = c("side", both("100m", "8Mi"));
        sidecar["restartPolicy"] = "Always".into();
        const MI: i64 = 1 << 20;
        let rows = [
            (
                "a big init container raises the pod memory limit",
                spec(serde_json::json!({
                    "initContainers": [c("init", mem("64Mi"))],
                    "containers": [c("app", mem("16Mi"))]})),
                PodResources {
                    cpu_shares: 2,
                    cpu_quota_us: None,
                    memory_limit_bytes: Some(64 * MI),
                },
            ),
            (
                "an unlimited init container leaves the pod unlimited",
                spec(serde_json::json!({
                    "initContainers": [c("init", serde_json::json!({"requests": {"memory": "1Mi"}}))],
                    "containers": [c("app", mem("16Mi"))]})),
                PodResources {
                    cpu_shares: 2,
                    cpu_quota_us: None,
                    memory_limit_bytes: None,
                },
            ),
            (
                "a sidecar adds to the regular containers, and to a later init container",
                spec(serde_json::json!({
                    "initContainers": [sidecar, c("init", both("1", "64Mi"))],
                    "containers": [c("app", both("250m", "16Mi"))]})),
                PodResources {
                    cpu_shares: 1126, // (1000m + 100m) * 1024 / 1000
                    cpu_quota_us: Some(110_000),
                    memory_limit_bytes: Some(72 * MI),
                },
            ),
            (
                "overhead is added to requests and to the limits there are",
                spec(serde_json::json!({
                    "overhead": {"cpu": "50m", "memory": "4Mi"},
                    "containers": [c("app", both("250m", "16Mi"))]})),
                PodResources {
                    cpu_shares: 307, // 300m
                    cpu_quota_us: Some(30_000),
                    memory_limit_bytes: Some(20 * MI),
                },
            ),
            (
                "BestEffort gets the minimum shares and nothing else",
                spec(serde_json::json!({
                    "overhead": {"cpu": "50m"},
                    "containers": [c("app", serde_json::json!({}))]})),
                PodResources {
                    cpu_shares: 2,
                    cpu_quota_us: None,
                    memory_limit_bytes: None,
                },
            ),
        ];
        for (what, pod, want) in rows {
            assert_eq!(pod_resources(&pod), want, "{what}");
        }
    }

    #[test]
    fn pod_cgroup_is_created_with_its_limits_on_v1() {
        let fs = tempfile::tempdir().unwrap();
        for ctl in ["cpu", "memory", "pids"] {
            std::fs::create_dir_all(fs.path().join(ctl)).unwrap();
        }
        let res = PodResources {
            cpu_shares: 512,
            cpu_quota_us: Some(50_000),
            memory_limit_bytes: Some(1 << 20),
        };
        ensure_pod_cgroup(fs.path(), "/kubepods/podu1", &res, 100).unwrap();
        let read = |p: &str| std::fs::read_to_string(fs.path().join(p)).unwrap();
        assert_eq!(read("cpu/kubepods/podu1/cpu.shares"), "512");
        assert_eq!(read("cpu/kubepods/podu1/cpu.cfs_quota_us"), "50000");
        assert_eq!(
            read("memory/kubepods/podu1/memory.limit_in_bytes"),
            "1048576"
        );
        assert_eq!(read("pids/kubepods/podu1/pids.max"), "100");
    }

    #[test]
    fn removal_walks_every_hierarchy() {
        let fs = tempfile::tempdir().unwrap();
        for ctl in ["memory", "pids"] {
            std::fs::create_dir_all(fs.path().join(ctl).join("kubepods/besteffort/podu1/ctr"))
                .unwrap();
        }
        remove_pod_cgroup(fs.path(), "/kubepods/besteffort/podu1").unwrap();
        assert!(!fs.path().join("memory/kubepods/besteffort/podu1").exists());
        assert!(fs.path().join("memory/kubepods/besteffort").exists());
        remove_pod_cgroup(fs.path(), "/kubepods/besteffort/podu1").unwrap();
    }
}
