//! Gathers the Summary: the runtime's pods and containers and their writable layers from
//! CRI (`ListPodSandbox`, `ListContainers`, `ListContainerStats`, `ImageFsInfo`), CPU,
//! memory and process counts from the pod and container cgroups (v1 or v2; CRI's numbers
//! when a cgroup cannot be read), pod network counters from the sandbox's network
//! namespace, emptyDir volumes as last measured in the background (`volumes`), persistent
//! and CSI volumes as the volume service last measured them (`VolumeStats`), the node's
//! numbers from /proc and statvfs, and its system containers (`pods` from the pods'
//! cgroup, `kubelet` and `runtime` as `system` finds them).
//!
//! `usageNanoCores` is a rate: as upstream's CRI stats provider, the previous sample of
//! each container, pod and the node is kept in memory and the rate computed against it
//! (`sample`).

use super::cgroup::{BlockIo, Cgroups};
use super::host::{self, DEFAULT_INTERFACE};
use super::sample::{
    CPU_SAMPLES, cpu_stats, cri_swap, fs_stats, memory_stats, summed_swap, swap_stats,
    system_container, value,
};
use super::system::{self, SystemSettings};
use super::types::*;
use super::volumes;
use crate::AppState;
use nodeagent_cri::api;
use nodeagent_proto::cri::{ContainerState, PodSandboxState};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::LazyLock;

/// A container as `/metrics/cadvisor` labels it.
#[derive(Debug, Clone)]
pub struct ContainerMeta {
    pub pod: PodReference,
    pub name: String,
    pub id: String,
    pub image: String,
    /// The cgroup path (cAdvisor's `id` label), or "" when unknown.
    pub cgroup: String,
    /// The cgroup's block I/O per device (`/metrics/cadvisor` only: the Summary has none).
    pub block_io: Vec<BlockIo>,
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
    /// The volume service's last measurements of persistent and CSI volumes, by pod UID.
    persistent: HashMap<String, Vec<nodeagent_proto::api::MeasuredVolume>>,
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
        persistent: HashMap::new(),
    })
}

/// Collects the Summary (all of it, or only CPU and memory).
pub async fn collect(
    state: &AppState,
    only_cpu_and_memory: bool,
) -> Result<Collected, tonic::Status> {
    let mut view = runtime_view(state, !only_cpu_and_memory).await?;
    let volume_stats = !state.config.kubelet.volume_stats_agg_period.is_zero();
    if !only_cpu_and_memory && volume_stats {
        view.persistent = persistent_volumes(state).await;
    }
    let settings = Settings {
        node_name: state.config.node_name.clone(),
        cgroup_root: state.config.kubelet.cgroup_root.clone(),
        cgroups_per_qos: state.config.kubelet.cgroups_per_qos,
        root_dir: state.config.root_dir.clone(),
        pod_logs_dir: state.config.kubelet.pod_logs_dir.clone(),
        only_cpu_and_memory,
        volume_stats,
        system: system_settings(&state.config),
    };
    let (collected, volume_paths) =
        tokio::task::spawn_blocking(move || assemble(&settings, view, &Cgroups::detect()))
            .await
            .map_err(|e| tonic::Status::internal(format!("collecting stats failed: {e}")))?;
    let period = state.config.kubelet.volume_stats_agg_period;
    if !only_cpu_and_memory && !period.is_zero() {
        // In the background, for the next requests.
        volumes::refresh(volume_paths, period);
    }
    Ok(collected)
}

/// How long the Summary waits for the volume service's measurements.
const VOLUME_STATS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// The volume service's last measurements, by pod UID; none while it is away (its
/// volumes are then left out, as upstream leaves out a volume it cannot measure).
async fn persistent_volumes(
    state: &AppState,
) -> HashMap<String, Vec<nodeagent_proto::api::MeasuredVolume>> {
    use nodeagent_proto::api::{VolumeStatsRequest, volume_client::VolumeClient};
    let Some(channel) = state.peers.get(&nodeagent_config::Service::Volume) else {
        return HashMap::new();
    };
    let mut client = VolumeClient::new(channel.clone());
    let answer = tokio::time::timeout(
        VOLUME_STATS_TIMEOUT,
        client.volume_stats(VolumeStatsRequest {}),
    )
    .await;
    let volumes = match answer {
        Ok(Ok(r)) => r.into_inner().volumes,
        Ok(Err(e)) => {
            tracing::debug!(error = %e.message(), "persistent volume stats unavailable");
            Vec::new()
        }
        Err(_) => {
            tracing::debug!("persistent volume stats timed out");
            Vec::new()
        }
    };
    let mut by_pod: HashMap<String, Vec<_>> = HashMap::new();
    for v in volumes {
        by_pod.entry(v.pod_uid.clone()).or_default().push(v);
    }
    by_pod
}

/// A persistent or CSI volume's stats as the Summary shows them, with its claim.
fn persistent_volume_stats(m: &nodeagent_proto::api::MeasuredVolume) -> VolumeStats {
    VolumeStats {
        fs: FsStats {
            time: time_from_nanos(m.time_ns),
            available_bytes: Some(m.available_bytes),
            capacity_bytes: Some(m.capacity_bytes),
            used_bytes: Some(m.used_bytes),
            inodes_free: Some(m.inodes_free),
            inodes: Some(m.inodes),
            inodes_used: Some(m.inodes_used),
        },
        name: m.name.clone(),
        pvc_ref: (!m.pvc_name.is_empty()).then(|| PvcReference {
            name: m.pvc_name.clone(),
            namespace: m.pvc_namespace.clone(),
        }),
    }
}

/// Where the `kubelet` and `runtime` system containers are read from.
fn system_settings(config: &nodeagent_config::Config) -> SystemSettings {
    use nodeagent_config::{Address, Service};
    let unix = |a: &Address| match a {
        Address::Unix(path) => Some(path.clone()),
        Address::Vsock { .. } => None,
    };
    SystemSettings {
        kubelet_cgroups: config.kubelet.kubelet_cgroups.clone(),
        runtime_cgroups: config.kubelet.runtime_cgroups.clone(),
        runtime_socket: unix(&config.runtime_endpoint),
        service_sockets: Service::ALL
            .into_iter()
            .filter(|s| *s != Service::HttpServer)
            .filter_map(|s| unix(config.endpoint(s)))
            .collect(),
    }
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
    system: SystemSettings,
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
/// `cgroups`: the cgroup tree (the host's, or a planted one in tests).
fn assemble(
    settings: &Settings,
    view: RuntimeView,
    cgroups: &Cgroups,
) -> (Collected, Vec<PathBuf>) {
    let at_ns = nodeagent_cri::now_nanos();
    let full = !settings.only_cpu_and_memory;
    let proc_stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .map_or(100, |t| t as u64);
    let boot_ns = host::boot_time_ns(&proc_stat).unwrap_or(0);
    // Before the samples' lock: a first resolution connects to sockets.
    let system_usage = system::measure(
        &settings.system,
        cgroups,
        system::Clock {
            boot_ns,
            ticks_per_second: ticks,
        },
    );
    let mut samples = CPU_SAMPLES.lock().unwrap_or_else(|e| e.into_inner());
    let mut seen: HashSet<String> = HashSet::new();

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
        let pod_named = settings
            .cgroups_per_qos
            .then(|| cgroups.pod_cgroup(&settings.cgroup_root, &md.uid))
            .flatten();
        let pod_cgroup = pod_named.as_ref().map(|(rel, _)| rel.clone());
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
            let cgroup = pod_named
                .as_ref()
                .and_then(|p| cgroups.container_cgroup(p, &c.id));
            seen.insert(c.id.clone());
            let cri_cpu = cri_stats.and_then(|s| s.cpu.as_ref());
            let usage = cgroup
                .as_deref()
                .and_then(|rel| cgroups.cpu_usage_ns(rel))
                .or(cri_cpu.and_then(|c| value(&c.usage_core_nano_seconds)));
            let cpu = usage.map(|u| CpuStats {
                cfs: cgroup.as_deref().and_then(|rel| cgroups.cpu_cfs(rel)),
                ..cpu_stats(
                    &mut samples,
                    &c.id,
                    at_ns,
                    u,
                    cri_cpu.and_then(|c| value(&c.usage_nano_cores)),
                )
            });
            let cgroup_memory = cgroup.as_deref().and_then(|rel| cgroups.memory(rel));
            let swap = match &cgroup_memory {
                Some(m) => m.swap.as_ref().map(|s| swap_stats(at_ns, s)),
                None => cri_stats.and_then(|s| s.swap.as_ref()).map(cri_swap),
            };
            let memory = match cgroup_memory {
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
                        oom_events: None,
                        cache_bytes: None,
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
                block_io: cgroup
                    .as_deref()
                    .and_then(|rel| cgroups.block_io(rel))
                    .unwrap_or_default(),
            });
            containers.push(ContainerStats {
                name,
                start_time: time_from_nanos(c.created_at),
                cpu,
                memory,
                rootfs,
                logs,
                swap,
            });
        }
        containers.sort_by(|a, b| a.name.cmp(&b.name));
        // emptyDir volumes, as last measured in the background; they count towards the
        // pod's ephemeral storage (upstream's calcEphemeralStorage).
        let mut volume = Vec::new();
        if full && settings.volume_stats {
            for (name, path) in volumes::pod_volumes(&settings.root_dir, &md.uid) {
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
                        pvc_ref: None,
                    });
                }
                volume_paths.push(path);
            }
            // Then the persistent ones (upstream's ephemeral stats first, then the
            // persistent), which do not count towards ephemeral storage.
            let persistent = view.persistent.get(&md.uid).into_iter().flatten();
            volume.extend(persistent.map(persistent_volume_stats));
        }
        let pod_key = format!("pod/{}", md.uid);
        seen.insert(pod_key.clone());
        let pod_usage = pod_cgroup
            .as_deref()
            .and_then(|rel| cgroups.cpu_usage_ns(rel))
            .or((!containers.is_empty()).then_some(sum_cpu));
        let cpu = pod_usage.map(|u| CpuStats {
            cfs: pod_cgroup.as_deref().and_then(|rel| cgroups.cpu_cfs(rel)),
            ..cpu_stats(&mut samples, &pod_key, at_ns, u, None)
        });
        let pod_memory = pod_cgroup.as_deref().and_then(|rel| cgroups.memory(rel));
        let swap = match &pod_memory {
            Some(m) => m.swap.as_ref().map(|s| swap_stats(at_ns, s)),
            None => summed_swap(&containers),
        };
        let memory = match pod_memory {
            Some(m) => Some(memory_stats(at_ns, &m, None)),
            None => (!containers.is_empty()).then(|| MemoryStats {
                time: time_from_nanos(at_ns),
                available_bytes: None,
                usage_bytes: None,
                working_set_bytes: Some(sum_ws),
                rss_bytes: None,
                page_faults: None,
                major_page_faults: None,
                oom_events: None,
                cache_bytes: None,
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
            swap,
        });
    }

    // The node.
    let node_cpu = host::node_cpu_usage_ns(&proc_stat, ticks)
        .map(|u| cpu_stats(&mut samples, "node", at_ns, u, None));
    let node_memory =
        host::node_memory(cgroups, &meminfo).map(|(m, total)| memory_stats(at_ns, &m, Some(total)));
    let node_swap = host::node_swap(&meminfo).map(|s| swap_stats(at_ns, &s));
    let mut system_containers: Vec<ContainerStats> = system_usage
        .iter()
        .map(|u| system_container(&mut samples, at_ns, u))
        .collect();
    if settings.cgroups_per_qos {
        let rel = cgroups.pods_cgroup(&settings.cgroup_root);
        if cgroups.exists(&rel) {
            let cpu = cgroups
                .cpu_usage_ns(&rel)
                .map(|u| cpu_stats(&mut samples, "sys/pods", at_ns, u, None));
            let memory = cgroups.memory(&rel);
            system_containers.push(ContainerStats {
                name: system::PODS.into(),
                start_time: time_from_nanos(boot_ns),
                cpu,
                swap: memory
                    .as_ref()
                    .and_then(|m| m.swap.as_ref())
                    .map(|s| swap_stats(at_ns, s)),
                memory: memory.map(|m| memory_stats(at_ns, &m, None)),
                rootfs: None,
                logs: None,
            });
        }
    }
    seen.insert("node".to_string());
    seen.extend([system::KUBELET, system::RUNTIME, system::PODS].map(|name| format!("sys/{name}")));
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
        start_time: time_from_nanos(boot_ns),
        cpu: node_cpu,
        memory: node_memory,
        network: network_stats,
        fs,
        runtime,
        rlimit,
        swap: node_swap,
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

/// A Summary assembled from a planted cgroup tree: one running pod (`default/web-0`, UID
/// `u1`, sandbox `sb1`) with one container (`app`, ID `c1`), whose cgroups are
/// `/kubepods/burstable/podu1` and `/kubepods/burstable/podu1/c1` (cgroupRoot `/`).
#[cfg(test)]
pub(crate) fn planted(cgroups: &Cgroups, dir: &Path) -> Collected {
    let sandbox = api::PodSandbox {
        id: "sb1".into(),
        metadata: Some(api::PodSandboxMetadata {
            name: "web-0".into(),
            uid: "u1".into(),
            namespace: "default".into(),
            attempt: 0,
        }),
        state: PodSandboxState::SandboxReady as i32,
        created_at: 1_700_000_000_000_000_000,
        ..Default::default()
    };
    let container = api::Container {
        id: "c1".into(),
        pod_sandbox_id: "sb1".into(),
        metadata: Some(api::ContainerMetadata {
            name: "app".into(),
            attempt: 0,
        }),
        image: Some(api::ImageSpec {
            image: "registry.example/app:1".into(),
            ..Default::default()
        }),
        state: ContainerState::ContainerRunning as i32,
        created_at: 1_700_000_001_000_000_000,
        ..Default::default()
    };
    let view = RuntimeView {
        sandboxes: vec![sandbox],
        containers: vec![container],
        stats: StatsById::default(),
        image_fs: None,
        persistent: HashMap::new(),
    };
    let settings = Settings {
        node_name: "node-a".into(),
        cgroup_root: "/".into(),
        cgroups_per_qos: true,
        root_dir: dir.to_path_buf(),
        pod_logs_dir: dir.join("pods"),
        only_cpu_and_memory: false,
        volume_stats: false,
        system: SystemSettings {
            kubelet_cgroups: None,
            runtime_cgroups: None,
            runtime_socket: None,
            service_sockets: Vec::new(),
        },
    };
    assemble(&settings, view, cgroups).0
}

#[cfg(test)]
mod persistent_tests {
    use super::*;
    use nodeagent_proto::api::MeasuredVolume;

    /// A claimed volume's entry has the keys of upstream's v1alpha1 `VolumeStats`
    /// (`FsStats` inlined, `name`, `pvcRef` with `name` and `namespace`), as metrics-server
    /// reads them; an inline CSI volume's has no `pvcRef`.
    #[test]
    fn a_measured_volume_reads_as_upstreams_volume_stats() {
        let mut m = MeasuredVolume {
            pod_uid: "u1".into(),
            name: "data".into(),
            pvc_namespace: "ns".into(),
            pvc_name: "claim".into(),
            time_ns: 1_700_000_000_000_000_000,
            capacity_bytes: 12,
            available_bytes: 10,
            used_bytes: 2,
            inodes: 7,
            inodes_free: 5,
            inodes_used: 2,
        };
        let fs = serde_json::json!({"time": "2023-11-14T22:13:20Z", "availableBytes": 10,
            "capacityBytes": 12, "usedBytes": 2, "inodesFree": 5, "inodes": 7, "inodesUsed": 2});
        let mut want = fs.clone();
        want["name"] = "data".into();
        want["pvcRef"] = serde_json::json!({"name": "claim", "namespace": "ns"});
        assert_eq!(
            serde_json::to_value(persistent_volume_stats(&m)).unwrap(),
            want
        );
        m.pvc_name.clear();
        m.pvc_namespace.clear();
        let mut want = fs;
        want["name"] = "data".into();
        assert_eq!(
            serde_json::to_value(persistent_volume_stats(&m)).unwrap(),
            want
        );
    }
}
