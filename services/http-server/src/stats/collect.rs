//! Gathers the Summary: the runtime's pods and containers and their writable layers from
//! CRI (`ListPodSandbox`, `ListContainers`, `ListContainerStats`, `ImageFsInfo`), CPU,
//! memory and process counts from the pod and container cgroups (v1 or v2; CRI's numbers
//! when a cgroup cannot be read), pod network counters from the sandbox's network
//! namespace, emptyDir volumes as last measured in the background (`volumes`), and the
//! node's numbers from /proc and statvfs.
//!
//! `usageNanoCores` is a rate: as upstream's CRI stats provider, the previous sample of
//! each container, pod and the node is kept in memory and the rate computed against it.

use super::cgroup::{Cgroups, Memory};
use super::host::{self, DEFAULT_INTERFACE};
use super::types::*;
use super::volumes;
use crate::AppState;
use nodeagent_cri::api;
use nodeagent_proto::cri::{ContainerState, PodSandboxState};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{LazyLock, Mutex};

/// A baseline is replaced once the new sample is this much newer, so that requests in
/// quick succession still measure the rate over a useful window.
const MIN_RATE_WINDOW_NS: i64 = 1_000_000_000;

#[derive(Debug, Clone, Copy)]
struct CpuSample {
    at_ns: i64,
    usage_ns: u64,
}

/// Previous CPU samples by key (container ID, `pod/<uid>`, `node`, `sys/<name>`).
static CPU_SAMPLES: LazyLock<Mutex<HashMap<String, CpuSample>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// `usageNanoCores` from the previous sample of `key`, recording this one.
fn nano_cores(samples: &mut HashMap<String, CpuSample>, key: &str, now: CpuSample) -> Option<u64> {
    let prev = samples.get(key).copied();
    let rate = prev
        .filter(|p| now.at_ns > p.at_ns && now.usage_ns >= p.usage_ns)
        .map(|p| {
            let used = u128::from(now.usage_ns - p.usage_ns) * 1_000_000_000;
            (used / (now.at_ns - p.at_ns) as u128) as u64
        });
    if prev.is_none_or(|p| now.at_ns - p.at_ns >= MIN_RATE_WINDOW_NS || now.usage_ns < p.usage_ns) {
        samples.insert(key.to_string(), now);
    }
    rate
}

pub(super) fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// A container as `/metrics/cadvisor` labels it.
#[derive(Debug, Clone)]
pub struct ContainerMeta {
    pub pod: PodReference,
    pub name: String,
    pub id: String,
    pub image: String,
    /// The cgroup path (cAdvisor's `id` label), or "" when unknown.
    pub cgroup: String,
}

/// The Summary and what `/metrics/cadvisor` needs besides.
#[derive(Debug, Clone)]
pub struct Collected {
    pub summary: Summary,
    pub containers: Vec<ContainerMeta>,
    /// Pod cgroups by pod UID.
    pub pod_cgroups: HashMap<String, String>,
    /// Interfaces of each pod's network namespace, by pod UID.
    pub pod_interfaces: HashMap<String, Vec<InterfaceStats>>,
    /// Where the runtime's image filesystem (and the containers' writable layers) is.
    pub image_fs_mountpoint: Option<PathBuf>,
}

/// What the CRI calls returned.
struct RuntimeView {
    sandboxes: Vec<api::PodSandbox>,
    containers: Vec<api::Container>,
    stats: StatsById,
    image_fs: Option<api::ImageFsInfoResponse>,
}

/// How long `ListContainerStats` answers are reused. containerd asks every container's shim
/// for its metrics to build one answer (p50 380 ms at 100 containers here; see
/// tests/bench/stats-summary.sh), and we take only the writable layer's usage from it (CPU
/// and memory come from cgroups), which containerd itself refreshes every 10 s: so asking
/// more often only costs time. It took the summary at 100 pods from p50 730 ms to 110 ms.
const CONTAINER_STATS_TTL: std::time::Duration = std::time::Duration::from_secs(10);

type StatsById = std::sync::Arc<HashMap<String, api::ContainerStats>>;

/// The last `ListContainerStats` answer and when it was taken.
static CONTAINER_STATS: LazyLock<tokio::sync::Mutex<Option<(std::time::Instant, StatsById)>>> =
    LazyLock::new(|| tokio::sync::Mutex::new(None));

/// Every container's stats, at most [`CONTAINER_STATS_TTL`] old, and fresh for running
/// containers the cached answer does not know yet (asked one by one, by ID, which costs
/// containerd one shim call each). Concurrent requests share one call (the lock is held
/// across it). Stats are best effort: pods are still listed without them.
async fn container_stats(state: &AppState, running: &[String]) -> StatsById {
    let mut cached = CONTAINER_STATS.lock().await;
    let fresh = cached
        .as_ref()
        .filter(|(at, _)| at.elapsed() < CONTAINER_STATS_TTL)
        .map(|(_, stats)| stats.clone());
    if let Some(stats) = fresh {
        let missing: Vec<&String> = running
            .iter()
            .filter(|id| !stats.contains_key(*id))
            .collect();
        if missing.is_empty() {
            return stats;
        }
        if missing.len() > MAX_SINGLE_ASKS {
            return refresh_container_stats(state, &mut cached).await;
        }
        let mut merged = (*stats).clone();
        let asks = missing
            .iter()
            .map(|id| list_container_stats(state, Some((*id).clone())));
        for answer in futures::future::join_all(asks).await.into_iter().flatten() {
            merged.extend(answer);
        }
        let merged = std::sync::Arc::new(merged);
        // The cache keeps its age: the full answer is still renewed on time.
        if let Some((_, s)) = cached.as_mut() {
            *s = merged.clone();
        }
        return merged;
    }
    refresh_container_stats(state, &mut cached).await
}

/// Beyond this many new containers one full answer is cheaper than asking each.
const MAX_SINGLE_ASKS: usize = 8;

async fn refresh_container_stats(
    state: &AppState,
    cached: &mut Option<(std::time::Instant, StatsById)>,
) -> StatsById {
    match list_container_stats(state, None).await {
        Some(answer) => {
            let stats: StatsById = std::sync::Arc::new(answer);
            *cached = Some((std::time::Instant::now(), stats.clone()));
            stats
        }
        // Keep the previous answer rather than dropping every writable layer.
        None => cached.as_ref().map(|(_, s)| s.clone()).unwrap_or_default(),
    }
}

/// `ListContainerStats` for every container, or the one with `id`.
async fn list_container_stats(
    state: &AppState,
    id: Option<String>,
) -> Option<HashMap<String, api::ContainerStats>> {
    let mut runtime = state.cri.runtime.clone();
    let filter = id.map(|id| api::ContainerStatsFilter {
        id,
        ..Default::default()
    });
    let request = state.cri.request(api::ListContainerStatsRequest { filter });
    match runtime.list_container_stats(request).await {
        Ok(r) => Some(
            r.into_inner()
                .stats
                .into_iter()
                .filter_map(|s| Some((s.attributes.as_ref()?.id.clone(), s)))
                .collect(),
        ),
        Err(e) => {
            tracing::debug!(error = %e, "ListContainerStats failed");
            None
        }
    }
}

async fn runtime_view(state: &AppState, with_fs: bool) -> Result<RuntimeView, tonic::Status> {
    let cri = &state.cri;
    let mut image = cri.image.clone();
    let fs_request = cri.request(api::ImageFsInfoRequest {});
    let (sandboxes, containers, image_fs) =
        tokio::join!(cri.list_sandboxes(None), cri.list_containers(None), async {
            if with_fs {
                Some(image.image_fs_info(fs_request).await)
            } else {
                None
            }
        });
    let containers = containers?;
    let running: Vec<String> = containers
        .iter()
        .filter(|c| c.state == ContainerState::ContainerRunning as i32)
        .map(|c| c.id.clone())
        .collect();
    let stats = container_stats(state, &running).await;
    Ok(RuntimeView {
        sandboxes: sandboxes?,
        containers,
        stats,
        image_fs: image_fs.and_then(|r| r.ok()).map(|r| r.into_inner()),
    })
}

/// Collects the Summary (all of it, or only CPU and memory).
pub async fn collect(
    state: &AppState,
    only_cpu_and_memory: bool,
) -> Result<Collected, tonic::Status> {
    let view = runtime_view(state, !only_cpu_and_memory).await?;
    let settings = Settings {
        node_name: state.config.node_name.clone(),
        cgroup_root: state.config.kubelet.cgroup_root.clone(),
        cgroups_per_qos: state.config.kubelet.cgroups_per_qos,
        root_dir: state.config.root_dir.clone(),
        pod_logs_dir: state.config.kubelet.pod_logs_dir.clone(),
        only_cpu_and_memory,
        volume_stats: !state.config.kubelet.volume_stats_agg_period.is_zero(),
    };
    let (collected, volume_paths) = tokio::task::spawn_blocking(move || assemble(&settings, view))
        .await
        .map_err(|e| tonic::Status::internal(format!("collecting stats failed: {e}")))?;
    let period = state.config.kubelet.volume_stats_agg_period;
    if !only_cpu_and_memory && !period.is_zero() {
        // In the background, for the next requests.
        volumes::refresh(volume_paths, period);
    }
    Ok(collected)
}

struct Settings {
    node_name: String,
    cgroup_root: String,
    cgroups_per_qos: bool,
    root_dir: PathBuf,
    pod_logs_dir: PathBuf,
    only_cpu_and_memory: bool,
    /// `volumeStatsAggPeriod` is not 0.
    volume_stats: bool,
}

fn cpu_stats(
    samples: &mut HashMap<String, CpuSample>,
    key: &str,
    at_ns: i64,
    usage_ns: u64,
    reported_nano_cores: Option<u64>,
) -> CpuStats {
    let computed = nano_cores(samples, key, CpuSample { at_ns, usage_ns });
    CpuStats {
        time: time_from_nanos(at_ns),
        usage_nano_cores: reported_nano_cores.or(computed),
        usage_core_nano_seconds: Some(usage_ns),
    }
}

fn memory_stats(at_ns: i64, m: &Memory, capacity: Option<u64>) -> MemoryStats {
    MemoryStats {
        time: time_from_nanos(at_ns),
        available_bytes: m
            .limit
            .or(capacity)
            .map(|l| l.saturating_sub(m.working_set)),
        usage_bytes: Some(m.usage),
        working_set_bytes: Some(m.working_set),
        rss_bytes: m.rss,
        page_faults: m.page_faults,
        major_page_faults: m.major_page_faults,
    }
}

fn fs_stats(
    at_ns: i64,
    fs: Option<&host::Statvfs>,
    used: Option<u64>,
    inodes_used: Option<u64>,
) -> FsStats {
    FsStats {
        time: time_from_nanos(at_ns),
        available_bytes: fs.map(|f| f.available),
        capacity_bytes: fs.map(|f| f.capacity),
        used_bytes: used.or(fs.map(|f| f.used)),
        inodes_free: fs.map(|f| f.inodes_free),
        inodes: fs.map(|f| f.inodes),
        inodes_used: inodes_used.or(fs.map(|f| f.inodes.saturating_sub(f.inodes_free))),
    }
}

fn value(v: &Option<api::UInt64Value>) -> Option<u64> {
    v.as_ref().map(|v| v.value)
}

fn network(at_ns: i64, interfaces: Vec<InterfaceStats>) -> Option<NetworkStats> {
    let default = interfaces
        .iter()
        .find(|i| i.name == DEFAULT_INTERFACE)
        .or(interfaces.first())
        .cloned()?;
    Some(NetworkStats {
        time: time_from_nanos(at_ns),
        default,
        interfaces,
    })
}

/// Ready sandboxes, the newest per pod UID.
fn ready_sandboxes(sandboxes: Vec<api::PodSandbox>) -> Vec<api::PodSandbox> {
    let mut newest: BTreeMap<String, api::PodSandbox> = BTreeMap::new();
    for sb in sandboxes {
        if sb.state != PodSandboxState::SandboxReady as i32 {
            continue;
        }
        let Some(uid) = sb.metadata.as_ref().map(|m| m.uid.clone()) else {
            continue;
        };
        if newest
            .get(&uid)
            .is_none_or(|o| o.created_at < sb.created_at)
        {
            newest.insert(uid, sb);
        }
    }
    newest.into_values().collect()
}

/// Running containers by sandbox ID, the newest per container name (upstream leaves
/// terminated containers out of usage).
fn running_containers(containers: Vec<api::Container>) -> HashMap<String, Vec<api::Container>> {
    let mut newest: BTreeMap<(String, String), api::Container> = BTreeMap::new();
    for c in containers {
        if c.state != ContainerState::ContainerRunning as i32 {
            continue;
        }
        let name = c
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .unwrap_or_default();
        let key = (c.pod_sandbox_id.clone(), name);
        if newest.get(&key).is_none_or(|o| o.created_at < c.created_at) {
            newest.insert(key, c);
        }
    }
    let mut by_sandbox: HashMap<String, Vec<api::Container>> = HashMap::new();
    for ((sandbox, _), c) in newest {
        by_sandbox.entry(sandbox).or_default().push(c);
    }
    by_sandbox
}

/// The Summary, and the emptyDir volumes of its pods (to measure for the next requests).
fn assemble(settings: &Settings, view: RuntimeView) -> (Collected, Vec<PathBuf>) {
    let cgroups = Cgroups::detect();
    let at_ns = now_ns();
    let full = !settings.only_cpu_and_memory;
    let mut samples = CPU_SAMPLES.lock().unwrap_or_else(|e| e.into_inner());
    let mut seen: HashSet<String> = HashSet::new();
    let proc_stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .map_or(100, |t| t as u64);

    let image_fs_usage = view
        .image_fs
        .as_ref()
        .and_then(|r| r.image_filesystems.first().cloned());
    let image_fs_mount = image_fs_usage
        .as_ref()
        .and_then(|u| u.fs_id.as_ref())
        .map(|id| PathBuf::from(&id.mountpoint));
    let image_fs_vfs = if full {
        image_fs_mount.as_deref().and_then(host::statvfs)
    } else {
        None
    };
    let logs_vfs = if full {
        host::statvfs(&settings.pod_logs_dir)
    } else {
        None
    };
    let root_vfs = if full {
        host::statvfs(&settings.root_dir)
    } else {
        None
    };

    let mut by_sandbox = running_containers(view.containers);
    let mut pods = Vec::new();
    let mut metas = Vec::new();
    let mut pod_cgroups = HashMap::new();
    let mut pod_interfaces = HashMap::new();
    let mut volume_paths = Vec::new();
    for sandbox in ready_sandboxes(view.sandboxes) {
        let Some(md) = sandbox.metadata.clone() else {
            continue;
        };
        let pod_ref = PodReference {
            name: md.name.clone(),
            namespace: md.namespace.clone(),
            uid: md.uid.clone(),
        };
        let pod_cgroup = settings
            .cgroups_per_qos
            .then(|| cgroups.pod_cgroup(&settings.cgroup_root, &md.uid))
            .flatten();
        let pod_logs = settings
            .pod_logs_dir
            .join(format!("{}_{}_{}", md.namespace, md.name, md.uid));
        let mut containers = Vec::new();
        let (mut ephemeral_used, mut ephemeral_inodes) = (0u64, 0u64);
        let (mut sum_cpu, mut sum_ws) = (0u64, 0u64);
        for c in by_sandbox.remove(&sandbox.id).unwrap_or_default() {
            let name = c
                .metadata
                .as_ref()
                .map(|m| m.name.clone())
                .unwrap_or_default();
            let cri_stats = view.stats.get(&c.id);
            let cgroup = pod_cgroup
                .as_ref()
                .map(|p| format!("{p}/{}", c.id))
                .filter(|rel| cgroups.exists(rel));
            seen.insert(c.id.clone());
            let cri_cpu = cri_stats.and_then(|s| s.cpu.as_ref());
            let usage = cgroup
                .as_deref()
                .and_then(|rel| cgroups.cpu_usage_ns(rel))
                .or(cri_cpu.and_then(|c| value(&c.usage_core_nano_seconds)));
            let cpu = usage.map(|u| {
                cpu_stats(
                    &mut samples,
                    &c.id,
                    at_ns,
                    u,
                    cri_cpu.and_then(|c| value(&c.usage_nano_cores)),
                )
            });
            let memory = match cgroup.as_deref().and_then(|rel| cgroups.memory(rel)) {
                Some(m) => Some(memory_stats(at_ns, &m, None)),
                None => cri_stats
                    .and_then(|s| s.memory.as_ref())
                    .map(|m| MemoryStats {
                        time: time_from_nanos(at_ns),
                        available_bytes: value(&m.available_bytes),
                        usage_bytes: value(&m.usage_bytes),
                        working_set_bytes: value(&m.working_set_bytes),
                        rss_bytes: value(&m.rss_bytes),
                        page_faults: value(&m.page_faults),
                        major_page_faults: value(&m.major_page_faults),
                    }),
            };
            sum_cpu += usage.unwrap_or(0);
            sum_ws += memory
                .as_ref()
                .and_then(|m| m.working_set_bytes)
                .unwrap_or(0);
            let (rootfs, logs) = if full {
                let layer = cri_stats.and_then(|s| s.writable_layer.as_ref());
                let used = layer.and_then(|l| value(&l.used_bytes));
                let inodes = layer.and_then(|l| value(&l.inodes_used));
                let rootfs = layer.map(|_| {
                    fs_stats(
                        at_ns,
                        image_fs_vfs.as_ref(),
                        Some(used.unwrap_or(0)),
                        Some(inodes.unwrap_or(0)),
                    )
                });
                let log_usage = host::dir_usage(&pod_logs.join(&name), 1);
                let logs =
                    log_usage.map(|(b, f)| fs_stats(at_ns, logs_vfs.as_ref(), Some(b), Some(f)));
                ephemeral_used += used.unwrap_or(0) + log_usage.map_or(0, |u| u.0);
                ephemeral_inodes += inodes.unwrap_or(0) + log_usage.map_or(0, |u| u.1);
                (rootfs, logs)
            } else {
                (None, None)
            };
            metas.push(ContainerMeta {
                pod: pod_ref.clone(),
                name: name.clone(),
                id: c.id.clone(),
                image: c
                    .image
                    .as_ref()
                    .map(|i| i.image.clone())
                    .unwrap_or_default(),
                cgroup: cgroup.clone().map(|p| p.to_string()).unwrap_or_default(),
            });
            containers.push(ContainerStats {
                name,
                start_time: time_from_nanos(c.created_at),
                cpu,
                memory,
                rootfs,
                logs,
            });
        }
        containers.sort_by(|a, b| a.name.cmp(&b.name));
        // emptyDir volumes, as last measured in the background; they count towards the
        // pod's ephemeral storage (upstream's calcEphemeralStorage).
        let mut volume = Vec::new();
        if full && settings.volume_stats {
            for (name, path) in volumes::empty_dirs(&settings.root_dir, &md.uid) {
                if let Some(m) = volumes::cached(&path) {
                    ephemeral_used += m.usage.bytes;
                    ephemeral_inodes += m.usage.inodes;
                    volume.push(VolumeStats {
                        fs: fs_stats(
                            m.at_ns,
                            m.statvfs().as_ref(),
                            Some(m.usage.bytes),
                            Some(m.usage.inodes),
                        ),
                        name,
                    });
                }
                volume_paths.push(path);
            }
        }
        let pod_key = format!("pod/{}", md.uid);
        seen.insert(pod_key.clone());
        let pod_usage = pod_cgroup
            .as_deref()
            .and_then(|rel| cgroups.cpu_usage_ns(rel))
            .or((!containers.is_empty()).then_some(sum_cpu));
        let cpu = pod_usage.map(|u| cpu_stats(&mut samples, &pod_key, at_ns, u, None));
        let memory = match pod_cgroup.as_deref().and_then(|rel| cgroups.memory(rel)) {
            Some(m) => Some(memory_stats(at_ns, &m, None)),
            None => (!containers.is_empty()).then(|| MemoryStats {
                time: time_from_nanos(at_ns),
                available_bytes: None,
                usage_bytes: None,
                working_set_bytes: Some(sum_ws),
                rss_bytes: None,
                page_faults: None,
                major_page_faults: None,
            }),
        };
        let (network_stats, process_stats, ephemeral) = if full {
            let pid = pod_cgroup
                .as_ref()
                .and_then(|p| cgroups.first_pid(&format!("{p}/{}", sandbox.id)));
            let interfaces = pid
                .map(|p| host::interfaces_of(Some(p)))
                .unwrap_or_default();
            pod_interfaces.insert(md.uid.clone(), interfaces.clone());
            let processes = pod_cgroup.as_deref().and_then(|rel| cgroups.pids(rel));
            (
                network(at_ns, interfaces),
                processes.map(|n| ProcessStats {
                    process_count: Some(n),
                }),
                Some(fs_stats(
                    at_ns,
                    root_vfs.as_ref(),
                    Some(ephemeral_used),
                    Some(ephemeral_inodes),
                )),
            )
        } else {
            (None, None, None)
        };
        if let Some(p) = &pod_cgroup {
            pod_cgroups.insert(md.uid.clone(), p.clone());
        }
        pods.push(PodStats {
            pod_ref,
            start_time: time_from_nanos(sandbox.created_at),
            containers,
            cpu,
            memory,
            network: network_stats,
            volume,
            ephemeral_storage: ephemeral,
            process_stats,
        });
    }

    // The node.
    let node_cpu = host::node_cpu_usage_ns(&proc_stat, ticks)
        .map(|u| cpu_stats(&mut samples, "node", at_ns, u, None));
    let node_memory =
        host::node_memory(&cgroups).map(|(m, total)| memory_stats(at_ns, &m, Some(total)));
    let mut system_containers = Vec::new();
    if settings.cgroups_per_qos {
        let rel = Cgroups::pods_cgroup(&settings.cgroup_root);
        if cgroups.exists(&rel) {
            let cpu = cgroups
                .cpu_usage_ns(&rel)
                .map(|u| cpu_stats(&mut samples, "sys/pods", at_ns, u, None));
            let memory = cgroups.memory(&rel).map(|m| memory_stats(at_ns, &m, None));
            system_containers.push(ContainerStats {
                name: "pods".into(),
                start_time: time_from_nanos(host::boot_time_ns(&proc_stat).unwrap_or(0)),
                cpu,
                memory,
                rootfs: None,
                logs: None,
            });
        }
    }
    seen.extend(["node".to_string(), "sys/pods".to_string()]);
    samples.retain(|k, _| seen.contains(k));
    drop(samples);

    let (runtime, fs, network_stats, rlimit) = if full {
        let image_fs = image_fs_usage.as_ref().map(|u| {
            fs_stats(
                at_ns,
                image_fs_vfs.as_ref(),
                value(&u.used_bytes),
                value(&u.inodes_used),
            )
        });
        let container_fs = view
            .image_fs
            .as_ref()
            .and_then(|r| r.container_filesystems.first())
            .map(|u| {
                let vfs = u
                    .fs_id
                    .as_ref()
                    .and_then(|id| host::statvfs(Path::new(&id.mountpoint)));
                fs_stats(
                    at_ns,
                    vfs.as_ref(),
                    value(&u.used_bytes),
                    value(&u.inodes_used),
                )
            })
            .or(image_fs.clone());
        let (maxpid, curproc) = host::rlimit();
        (
            Some(RuntimeStats {
                image_fs,
                container_fs,
            }),
            Some(fs_stats(at_ns, root_vfs.as_ref(), None, None)),
            network(at_ns, host::interfaces_of(None)),
            Some(RlimitStats {
                time: time_from_nanos(at_ns),
                maxpid,
                curproc,
            }),
        )
    } else {
        (None, None, None, None)
    };
    let node = NodeStats {
        node_name: settings.node_name.clone(),
        system_containers,
        start_time: time_from_nanos(host::boot_time_ns(&proc_stat).unwrap_or(0)),
        cpu: node_cpu,
        memory: node_memory,
        network: network_stats,
        fs,
        runtime,
        rlimit,
    };
    let collected = Collected {
        summary: Summary { node, pods },
        containers: metas,
        pod_cgroups,
        pod_interfaces,
        image_fs_mountpoint: image_fs_mount,
    };
    (collected, volume_paths)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nano_cores_is_the_rate_against_a_baseline_at_least_a_second_old() {
        let mut samples = HashMap::new();
        let s = |at_ns: i64, usage_ns: u64| CpuSample { at_ns, usage_ns };
        assert_eq!(nano_cores(&mut samples, "c", s(0, 0)), None);
        // Half a core over 2 s; the baseline moves to t=2 s.
        assert_eq!(
            nano_cores(&mut samples, "c", s(2_000_000_000, 1_000_000_000)),
            Some(500_000_000)
        );
        // 100 ms later: measured against t=2 s, which stays the baseline.
        assert_eq!(
            nano_cores(&mut samples, "c", s(2_100_000_000, 1_100_000_000)),
            Some(1_000_000_000)
        );
        assert_eq!(samples["c"].at_ns, 2_000_000_000);
        // A counter that went back (a new cgroup under the same key) starts over.
        assert_eq!(nano_cores(&mut samples, "c", s(2_200_000_000, 5)), None);
        assert_eq!(samples["c"].usage_ns, 5);
    }
}
