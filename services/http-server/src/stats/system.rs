//! The Summary's `kubelet` and `runtime` system containers (upstream's
//! `SystemContainerKubelet` and `SystemContainerRuntime`), read from cgroups when the
//! processes have one of their own, otherwise from the processes' own counters in /proc.
//!
//! - `runtime`: `runtimeCgroups`, or else the cgroup of the process serving
//!   `containerRuntimeEndpoint` (found by SO_PEERCRED on a connection to it).
//! - `kubelet`: `kubeletCgroups`, or else this node agent's seven processes (found by
//!   SO_PEERCRED on each service's Unix socket, and our own pid).
//!
//! The processes are resolved once and cached: a request reads only their /proc/<pid>/stat,
//! and resolves again (a socket connect each) only when one of them is gone or restarted,
//! or a cgroup it used was removed.

use super::cgroup::{Cgroups, Memory, Swap};
use super::process::{self, ProcStat};
use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

/// Upstream's `SystemContainerKubelet`.
pub const KUBELET: &str = "kubelet";
/// Upstream's `SystemContainerRuntime`.
pub const RUNTIME: &str = "runtime";
/// Upstream's `SystemContainerPods`.
pub const PODS: &str = "pods";

/// A resolution made while some service did not answer is tried again after this long.
const PARTIAL_RETRY: Duration = Duration::from_secs(10);
/// A shared cgroup holding more processes than this is not the node agent's own.
const MAX_MEMBERS: usize = 4096;
/// How far up the parent chain a process is followed to find one of ours.
const MAX_ANCESTRY: usize = 64;

/// Where the `kubelet` and `runtime` entries come from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SystemSettings {
    /// `kubeletCgroups`.
    pub kubelet_cgroups: Option<String>,
    /// `runtimeCgroups`.
    pub runtime_cgroups: Option<String>,
    /// The runtime's socket (`containerRuntimeEndpoint`, when a Unix address).
    pub runtime_socket: Option<PathBuf>,
    /// The Unix sockets of the other six services.
    pub service_sockets: Vec<PathBuf>,
}

/// Where a system container's CPU or its memory is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A cgroup, relative to the hierarchy's root.
    Cgroup(String),
    /// The sum of the processes' own counters: CPU time from /proc/<pid>/stat (utime +
    /// stime), memory from /proc/<pid>/status (VmRSS as usage and working set, VmSwap).
    /// Page cache is not charged to a process, so this is less than a cgroup would show.
    Processes,
}

/// A process, told apart from a later one with the same pid by its start time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Process {
    pid: u32,
    start_ticks: u64,
}

/// One system container as resolved, kept between requests.
#[derive(Debug, Clone)]
struct Resolved {
    processes: Vec<Process>,
    cpu: Source,
    memory: Source,
    /// Nanoseconds since the epoch.
    start_ns: i64,
    /// Set when a service did not answer: resolve again once this is [`PARTIAL_RETRY`] old.
    partial_since: Option<Instant>,
}

/// One system container's numbers, before rates are computed.
#[derive(Debug, Clone)]
pub struct Usage {
    pub name: &'static str,
    pub start_ns: i64,
    pub cpu_ns: Option<u64>,
    pub memory: Option<Memory>,
}

#[derive(Default)]
struct Cache {
    settings: SystemSettings,
    kubelet: Option<Resolved>,
    runtime: Option<Resolved>,
}

static CACHE: LazyLock<Mutex<Cache>> = LazyLock::new(|| Mutex::new(Cache::default()));

/// Clock facts to turn /proc's ticks into nanoseconds.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    pub boot_ns: i64,
    pub ticks_per_second: u64,
}

impl Clock {
    fn ticks_to_ns(self, ticks: u64) -> u64 {
        let ns = u128::from(ticks) * 1_000_000_000 / u128::from(self.ticks_per_second.max(1));
        u64::try_from(ns).unwrap_or(u64::MAX)
    }

    fn start_ns(self, start_ticks: u64) -> i64 {
        self.boot_ns
            .saturating_add(i64::try_from(self.ticks_to_ns(start_ticks)).unwrap_or(i64::MAX))
    }
}

/// The `kubelet` and `runtime` entries (those that can be read) in that order.
pub fn measure(settings: &SystemSettings, cgroups: &Cgroups, clock: Clock) -> Vec<Usage> {
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    if cache.settings != *settings {
        *cache = Cache {
            settings: settings.clone(),
            ..Cache::default()
        };
    }
    let mut usages = Vec::new();
    let kubelet = match configured(settings.kubelet_cgroups.as_deref(), cgroups) {
        Some(rel) => Some(Resolved {
            processes: Vec::new(),
            cpu: Source::Cgroup(rel.clone()),
            memory: Source::Cgroup(rel),
            // Upstream reports the kubelet's own creation time.
            start_ns: process::read_stat(std::process::id())
                .map_or(clock.boot_ns, |s| clock.start_ns(s.start_ticks)),
            partial_since: None,
        }),
        None => current(&mut cache.kubelet, cgroups, || {
            resolve_kubelet(settings, cgroups, clock)
        }),
    };
    if let Some(r) = kubelet {
        usages.push(read_usage(KUBELET, &r, cgroups, clock));
    }
    let runtime = match configured(settings.runtime_cgroups.as_deref(), cgroups) {
        Some(rel) => Some(Resolved {
            processes: Vec::new(),
            start_ns: cgroups.created_ns(&rel).unwrap_or(clock.boot_ns),
            cpu: Source::Cgroup(rel.clone()),
            memory: Source::Cgroup(rel),
            partial_since: None,
        }),
        None => current(&mut cache.runtime, cgroups, || {
            resolve_runtime(settings, cgroups, clock)
        }),
    };
    if let Some(r) = runtime {
        usages.push(read_usage(RUNTIME, &r, cgroups, clock));
    }
    usages
}

/// A configured cgroup (`kubeletCgroups`, `runtimeCgroups`) that exists.
fn configured(name: Option<&str>, cgroups: &Cgroups) -> Option<String> {
    name.filter(|n| !n.is_empty())
        .filter(|n| cgroups.exists(n))
        .map(str::to_string)
}

/// The cached resolution while it still holds, else a new one (cached in its turn).
fn current(
    slot: &mut Option<Resolved>,
    cgroups: &Cgroups,
    resolve: impl FnOnce() -> Option<Resolved>,
) -> Option<Resolved> {
    if let Some(r) = slot.as_ref().filter(|r| still_holds(r, cgroups)) {
        return Some(r.clone());
    }
    *slot = resolve();
    slot.clone()
}

/// Every process still runs (same pid, same start), every cgroup used still exists, and a
/// partial resolution is not yet due for another try.
fn still_holds(r: &Resolved, cgroups: &Cgroups) -> bool {
    let alive = r
        .processes
        .iter()
        .all(|p| process::read_stat(p.pid).is_some_and(|s| s.start_ticks == p.start_ticks));
    let cgroups_exist = [("cpuacct", &r.cpu), ("memory", &r.memory)].iter().all(
        |(controller, source)| match source {
            Source::Cgroup(rel) => cgroups.exists_in(controller, rel),
            Source::Processes => true,
        },
    );
    let due = r
        .partial_since
        .is_some_and(|t| t.elapsed() >= PARTIAL_RETRY);
    alive && cgroups_exist && !due && !r.processes.is_empty()
}

/// The runtime: the process serving its socket, read from its own cgroup.
fn resolve_runtime(settings: &SystemSettings, cgroups: &Cgroups, clock: Clock) -> Option<Resolved> {
    let pid = process::socket_server_pid(settings.runtime_socket.as_deref()?)?;
    let stat = process::read_stat(pid)?;
    let paths = process::read_cgroups(pid, cgroups.is_v2())?;
    Some(Resolved {
        processes: vec![Process {
            pid,
            start_ticks: stat.start_ticks,
        }],
        cpu: own_cgroup(paths.cpu.as_deref()),
        memory: own_cgroup(paths.memory.as_deref()),
        start_ns: clock.start_ns(stat.start_ticks),
        partial_since: None,
    })
}

/// A process's cgroup, unless it is the root: that one is the whole node, not the
/// process (as on v1 hosts without CPU accounting for the unit), so the process's own
/// counters are read instead.
fn own_cgroup(path: Option<&str>) -> Source {
    match path {
        Some(p) if !p.trim_end_matches('/').is_empty() => Source::Cgroup(p.to_string()),
        _ => Source::Processes,
    }
}

/// This node agent: our own process and whoever serves each service's socket.
fn resolve_kubelet(settings: &SystemSettings, cgroups: &Cgroups, clock: Clock) -> Option<Resolved> {
    let own = std::process::id();
    let mut pids = vec![own];
    let mut partial = false;
    for socket in &settings.service_sockets {
        match process::socket_server_pid(socket) {
            Some(pid) if !pids.contains(&pid) => pids.push(pid),
            Some(_) => {}
            None => partial = true,
        }
    }
    let mut processes = Vec::new();
    let (mut cpu_paths, mut memory_paths) = (Vec::new(), Vec::new());
    for pid in pids {
        let (Some(stat), Some(paths)) = (
            process::read_stat(pid),
            process::read_cgroups(pid, cgroups.is_v2()),
        ) else {
            partial = true;
            continue;
        };
        processes.push(Process {
            pid,
            start_ticks: stat.start_ticks,
        });
        cpu_paths.push(paths.cpu);
        memory_paths.push(paths.memory);
    }
    let ours: HashSet<u32> = processes.iter().map(|p| p.pid).collect();
    let is_ours = |pid: u32| descends_from(pid, &ours, |p| process::read_stat(p).map(|s| s.ppid));
    let cpu = shared_cgroup(
        &cpu_paths,
        |rel| cgroups.procs_under("cpuacct", rel, MAX_MEMBERS),
        is_ours,
    );
    let memory = shared_cgroup(
        &memory_paths,
        |rel| cgroups.procs_under("memory", rel, MAX_MEMBERS),
        is_ours,
    );
    let start_ns = processes
        .iter()
        .map(|p| clock.start_ns(p.start_ticks))
        .min()?;
    Some(Resolved {
        processes,
        cpu,
        memory,
        start_ns,
        partial_since: partial.then(Instant::now),
    })
}

/// The cgroup to read for a group of processes: the smallest one holding all of them
/// (their cgroups' common ancestor), when it is not the root and holds no process but
/// theirs and their descendants'; otherwise the processes' own counters.
fn shared_cgroup(
    paths: &[Option<String>],
    members: impl FnOnce(&str) -> Option<Vec<u32>>,
    is_ours: impl Fn(u32) -> bool,
) -> Source {
    let Some(paths) = paths.iter().cloned().collect::<Option<Vec<String>>>() else {
        return Source::Processes;
    };
    let Some(ancestor) = common_ancestor(&paths) else {
        return Source::Processes;
    };
    match members(&ancestor) {
        Some(pids) if pids.iter().all(|p| is_ours(*p)) => Source::Cgroup(ancestor),
        _ => Source::Processes,
    }
}

/// The deepest cgroup that contains every path; None when that is the root.
fn common_ancestor(paths: &[String]) -> Option<String> {
    let mut parts: Vec<&str> = paths
        .first()?
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    for path in &paths[1..] {
        let other: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let same = parts.iter().zip(&other).take_while(|(a, b)| a == b).count();
        parts.truncate(same);
    }
    (!parts.is_empty()).then(|| format!("/{}", parts.join("/")))
}

/// Whether `pid` is one of `ours` or was started by one of them (a helper a service runs).
fn descends_from(pid: u32, ours: &HashSet<u32>, parent: impl Fn(u32) -> Option<u32>) -> bool {
    let mut current = pid;
    for _ in 0..MAX_ANCESTRY {
        if ours.contains(&current) {
            return true;
        }
        match parent(current) {
            Some(p) if p != 0 && p != current => current = p,
            _ => return false,
        }
    }
    false
}

/// Reads one system container's numbers from where its resolution says.
fn read_usage(name: &'static str, r: &Resolved, cgroups: &Cgroups, clock: Clock) -> Usage {
    let needs_procs = r.cpu == Source::Processes || r.memory == Source::Processes;
    let stats: Vec<ProcStat> = if needs_procs {
        r.processes
            .iter()
            .filter_map(|p| process::read_stat(p.pid))
            .collect()
    } else {
        Vec::new()
    };
    let cpu_ns = match &r.cpu {
        Source::Cgroup(rel) => cgroups.cpu_usage_ns(rel),
        Source::Processes => Some(clock.ticks_to_ns(stats.iter().map(|s| s.cpu_ticks).sum())),
    };
    let memory = match &r.memory {
        Source::Cgroup(rel) => cgroups.memory(rel),
        Source::Processes => {
            let statuses: Vec<String> = r
                .processes
                .iter()
                .filter_map(|p| process::read_status(p.pid))
                .collect();
            Some(processes_memory(&stats, &statuses))
        }
    };
    Usage {
        name,
        start_ns: r.start_ns,
        cpu_ns,
        memory,
    }
}

/// Memory summed over processes: resident set as usage and working set, their faults and
/// swapped-out pages; no limit.
fn processes_memory(stats: &[ProcStat], statuses: &[String]) -> Memory {
    let sum = |key: &str| -> u64 {
        statuses
            .iter()
            .filter_map(|s| process::status_bytes(s, key))
            .sum()
    };
    let rss = sum("VmRSS");
    Memory {
        usage: rss,
        working_set: rss,
        rss: Some(rss),
        cache: None,
        page_faults: Some(stats.iter().map(|s| s.minor_faults).sum()),
        major_page_faults: Some(stats.iter().map(|s| s.major_faults).sum()),
        oom_kills: None,
        limit: None,
        swap: Some(Swap {
            usage: sum("VmSwap"),
            limit: None,
        }),
    }
}

#[cfg(test)]
mod tests;
