//! CPU, memory, swap, block I/O and pid counts of a cgroup, on cgroup v1 (cpuacct, memory,
//! blkio and pids hierarchies) and v2 (the unified tree), computed as cAdvisor does: the working set is
//! the usage less inactive file pages.

use crate::cgroup_name::{
    CgroupDriver, QOS_PARTS, container_cgroup, pod_cgroup_name, pods_cgroup_name,
};
use std::path::{Path, PathBuf};

/// v1 "no limit" is a page-rounded i64::MAX; anything this large is no limit.
const NO_LIMIT: u64 = 1 << 62;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Memory {
    pub usage: u64,
    pub working_set: u64,
    pub rss: Option<u64>,
    /// Page cache (cAdvisor's `container_memory_cache`: v1's `total_cache`, v2's `file`).
    pub cache: Option<u64>,
    pub page_faults: Option<u64>,
    pub major_page_faults: Option<u64>,
    /// Processes the OOM killer killed in the cgroup (`oom_kill` of v2's `memory.events`
    /// or v1's `memory.oom_control`); None where the kernel does not count them.
    pub oom_kills: Option<u64>,
    /// None without a limit.
    pub limit: Option<u64>,
    /// None where the cgroup does not account swap.
    pub swap: Option<Swap>,
}

/// Swap charged to a cgroup.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Swap {
    pub usage: u64,
    /// How much swap the cgroup may use; None without a limit.
    pub limit: Option<u64>,
}

/// Swap from v2's `memory.swap.current` and `memory.swap.max`.
fn swap_v2(current: Option<u64>, max: Option<&str>) -> Option<Swap> {
    Some(Swap {
        usage: current?,
        limit: max
            .and_then(|m| m.trim().parse().ok())
            .filter(|l| *l < NO_LIMIT),
    })
}

/// Swap on v1, where the memsw files count memory and swap together: the swap is memsw's
/// usage less the memory usage, and its limit memsw's limit less the memory limit (None
/// unless both are limited). None without memsw (swap accounting off).
fn swap_v1(memsw_usage: Option<u64>, memsw_limit: Option<u64>, memory: &Memory) -> Option<Swap> {
    let memsw_limit = memsw_limit.filter(|l| *l < NO_LIMIT);
    Some(Swap {
        usage: memsw_usage?.saturating_sub(memory.usage),
        limit: memsw_limit
            .zip(memory.limit)
            .map(|(both, memory)| both.saturating_sub(memory)),
    })
}

/// CFS bandwidth control of a cgroup with a CPU quota (cpu.stat), as cAdvisor reports it in
/// `container_cpu_cfs_*` (google/cadvisor metrics/prometheus.go: only when the spec's
/// `Cpu.Quota != 0`, i.e. v1 `cpu.cfs_quota_us` is not -1, v2 `cpu.max` is not `max`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Cfs {
    /// `nr_periods`: enforcement periods that have elapsed.
    pub periods: u64,
    /// `nr_throttled`: periods in which the cgroup was throttled.
    pub throttled_periods: u64,
    /// Time throttled, in nanoseconds (v1 `throttled_time`, v2 `throttled_usec` × 1000).
    pub throttled_ns: u64,
}

/// [`Cfs`] from a cpu.stat text, with the keys of v1 or v2.
pub fn cfs_from(stat: &str, v2: bool) -> Option<Cfs> {
    let throttled_ns = if v2 {
        stat_value(stat, "throttled_usec")?.saturating_mul(1000)
    } else {
        stat_value(stat, "throttled_time")?
    };
    Some(Cfs {
        periods: stat_value(stat, "nr_periods")?,
        throttled_periods: stat_value(stat, "nr_throttled")?,
        throttled_ns,
    })
}

/// A cgroup's block I/O on one device, as cAdvisor's `DiskIo` carries it
/// (`IoServiceBytes` and `IoServiced`, "Read" and "Write") into
/// `container_fs_{reads,writes}{_bytes,}_total`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BlockIo {
    pub major: u32,
    pub minor: u32,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub reads: u64,
    pub writes: u64,
}

/// `MAJ:MIN`.
fn device_numbers(s: &str) -> Option<(u32, u32)> {
    let (major, minor) = s.split_once(':')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// v2's `io.stat`: `MAJ:MIN rbytes=N wbytes=N rios=N wios=N dbytes=N dios=N` per device
/// (the discard counters are left out, as cAdvisor's `Read`/`Write` leave them).
pub fn io_stat_v2(text: &str) -> Vec<BlockIo> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (major, minor) = device_numbers(fields.next()?)?;
            let mut io = BlockIo {
                major,
                minor,
                ..Default::default()
            };
            for field in fields {
                let Some((key, value)) = field.split_once('=') else {
                    continue;
                };
                let Ok(value) = value.parse() else { continue };
                match key {
                    "rbytes" => io.read_bytes = value,
                    "wbytes" => io.write_bytes = value,
                    "rios" => io.reads = value,
                    "wios" => io.writes = value,
                    _ => {}
                }
            }
            Some(io)
        })
        .collect()
}

/// v1's blkio pair (`*io_service_bytes*` and `*io_serviced*`): `MAJ:MIN Read N`,
/// `MAJ:MIN Write N` (and Sync, Async, Discard, Total, which are not wanted) per device,
/// then a `Total N` line. Devices in the order first seen.
pub fn blkio_v1(service_bytes: &str, serviced: &str) -> Vec<BlockIo> {
    let mut out: Vec<BlockIo> = Vec::new();
    for (text, bytes) in [(service_bytes, true), (serviced, false)] {
        for line in text.lines() {
            let mut fields = line.split_whitespace();
            let (Some(dev), Some(op), Some(value)) = (fields.next(), fields.next(), fields.next())
            else {
                continue;
            };
            let (Some((major, minor)), Ok(value)) = (device_numbers(dev), value.parse::<u64>())
            else {
                continue;
            };
            let i = match out
                .iter()
                .position(|d| (d.major, d.minor) == (major, minor))
            {
                Some(i) => i,
                None => {
                    out.push(BlockIo {
                        major,
                        minor,
                        ..Default::default()
                    });
                    out.len() - 1
                }
            };
            let io = &mut out[i];
            match (op, bytes) {
                ("Read", true) => io.read_bytes = value,
                ("Write", true) => io.write_bytes = value,
                ("Read", false) => io.reads = value,
                ("Write", false) => io.writes = value,
                _ => {}
            }
        }
    }
    out
}

/// v1's blkio file pairs in runc's order of preference (libcontainer/cgroups/fs/blkio.go:
/// BFQ, CFQ, the throttle layer's recursive, then its own): the first whose byte counts
/// name a device.
const BLKIO_V1_FILES: [(&str, &str); 4] = [
    (
        "blkio.bfq.io_service_bytes_recursive",
        "blkio.bfq.io_serviced_recursive",
    ),
    (
        "blkio.io_service_bytes_recursive",
        "blkio.io_serviced_recursive",
    ),
    (
        "blkio.throttle.io_service_bytes_recursive",
        "blkio.throttle.io_serviced_recursive",
    ),
    (
        "blkio.throttle.io_service_bytes",
        "blkio.throttle.io_serviced",
    ),
];

#[derive(Debug, Clone)]
pub struct Cgroups {
    root: PathBuf,
    v2: bool,
}

fn read_u64(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// `key value` lines (memory.stat, cpu.stat).
fn stat_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// Memory from a cgroup's usage, limit and memory.stat, with the stat keys of v1
/// (hierarchical `total_*`) or v2.
pub fn memory_from(usage: u64, limit: Option<u64>, stat: &str, v2: bool) -> Memory {
    let (inactive, rss, cache, faults, major) = if v2 {
        ("inactive_file", "anon", "file", "pgfault", "pgmajfault")
    } else {
        (
            "total_inactive_file",
            "total_rss",
            "total_cache",
            "total_pgfault",
            "total_pgmajfault",
        )
    };
    let inactive = stat_value(stat, inactive).unwrap_or(0);
    Memory {
        usage,
        working_set: usage.saturating_sub(inactive),
        rss: stat_value(stat, rss),
        cache: stat_value(stat, cache),
        page_faults: stat_value(stat, faults),
        major_page_faults: stat_value(stat, major),
        oom_kills: None,
        limit: limit.filter(|l| *l < NO_LIMIT),
        swap: None,
    }
}

/// The `oom_kill` count of v2's `memory.events` or v1's `memory.oom_control` text.
pub fn oom_kills(events: &str) -> Option<u64> {
    stat_value(events, "oom_kill")
}

impl Cgroups {
    pub fn detect() -> Self {
        Self::at(PathBuf::from("/sys/fs/cgroup"))
    }

    /// The cgroup tree mounted at `root`: v2 when it has `cgroup.controllers`.
    pub fn at(root: PathBuf) -> Self {
        let v2 = root.join("cgroup.controllers").exists();
        Self { root, v2 }
    }

    /// The unified (v2) hierarchy, rather than v1's one per controller.
    pub fn is_v2(&self) -> bool {
        self.v2
    }

    fn dir(&self, controller: &str, rel: &str) -> PathBuf {
        let rel = rel.trim_start_matches('/');
        if self.v2 {
            self.root.join(rel)
        } else {
            self.root.join(controller).join(rel)
        }
    }

    /// Whether the cgroup exists (memory hierarchy on v1).
    pub fn exists(&self, rel: &str) -> bool {
        self.exists_in("memory", rel)
    }

    /// Whether the cgroup exists in `controller`'s hierarchy on v1 (`cpuacct`, `memory`).
    pub fn exists_in(&self, controller: &str, rel: &str) -> bool {
        self.dir(controller, rel).is_dir()
    }

    /// Cumulative CPU time in nanoseconds.
    pub fn cpu_usage_ns(&self, rel: &str) -> Option<u64> {
        if self.v2 {
            let stat = std::fs::read_to_string(self.dir("", rel).join("cpu.stat")).ok()?;
            stat_value(&stat, "usage_usec").map(|us| us * 1000)
        } else {
            read_u64(&self.dir("cpuacct", rel).join("cpuacct.usage"))
        }
    }

    /// CFS throttling of a cgroup that has a CPU quota; None without one (as cAdvisor,
    /// which leaves the `container_cpu_cfs_*` series out then) or when unreadable.
    pub fn cpu_cfs(&self, rel: &str) -> Option<Cfs> {
        let dir = self.dir("cpu", rel);
        let quota = if self.v2 {
            let max = std::fs::read_to_string(dir.join("cpu.max")).ok()?;
            max.split_whitespace().next()? != "max"
        } else {
            let quota = std::fs::read_to_string(dir.join("cpu.cfs_quota_us")).ok()?;
            quota.trim().parse::<i64>().ok()? > 0
        };
        if !quota {
            return None;
        }
        cfs_from(
            &std::fs::read_to_string(dir.join("cpu.stat")).ok()?,
            self.v2,
        )
    }

    pub fn memory(&self, rel: &str) -> Option<Memory> {
        let dir = self.dir("memory", rel);
        let stat = std::fs::read_to_string(dir.join("memory.stat")).ok()?;
        let (usage, limit) = if self.v2 {
            let limit = std::fs::read_to_string(dir.join("memory.max"))
                .ok()
                .and_then(|s| s.trim().parse().ok());
            (read_u64(&dir.join("memory.current"))?, limit)
        } else {
            (
                read_u64(&dir.join("memory.usage_in_bytes"))?,
                read_u64(&dir.join("memory.limit_in_bytes")),
            )
        };
        let mut memory = memory_from(usage, limit, &stat, self.v2);
        let events = if self.v2 {
            "memory.events"
        } else {
            "memory.oom_control"
        };
        memory.oom_kills = std::fs::read_to_string(dir.join(events))
            .ok()
            .and_then(|t| oom_kills(&t));
        memory.swap = if self.v2 {
            let current = read_u64(&dir.join("memory.swap.current"));
            let max =
                current.and_then(|_| std::fs::read_to_string(dir.join("memory.swap.max")).ok());
            swap_v2(current, max.as_deref())
        } else {
            let usage = read_u64(&dir.join("memory.memsw.usage_in_bytes"));
            let limit = usage.and_then(|_| read_u64(&dir.join("memory.memsw.limit_in_bytes")));
            swap_v1(usage, limit, &memory)
        };
        Some(memory)
    }

    /// Every process in the cgroup and its descendants, for `controller`'s hierarchy on v1
    /// (`cpuacct` or `memory`); None when unreadable or past `max` processes.
    pub fn procs_under(&self, controller: &str, rel: &str, max: usize) -> Option<Vec<u32>> {
        let mut pids = Vec::new();
        let mut dirs = vec![self.dir(controller, rel)];
        while let Some(dir) = dirs.pop() {
            let procs = std::fs::read_to_string(dir.join("cgroup.procs")).ok()?;
            pids.extend(procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
            if pids.len() > max {
                return None;
            }
            for entry in std::fs::read_dir(&dir).ok()?.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    dirs.push(entry.path());
                }
            }
        }
        Some(pids)
    }

    /// When the cgroup was made, as cAdvisor tells it: the earliest modification time of
    /// its cpu and memory directories, in nanoseconds since the epoch.
    pub fn created_ns(&self, rel: &str) -> Option<i64> {
        ["cpuacct", "memory"]
            .iter()
            .filter_map(|c| std::fs::metadata(self.dir(c, rel)).ok()?.modified().ok())
            .min()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_nanos() as i64)
    }

    /// Processes (tasks) in the cgroup and its children.
    pub fn pids(&self, rel: &str) -> Option<u64> {
        read_u64(&self.dir("pids", rel).join("pids.current"))
    }

    /// The first process of the cgroup (cgroup.procs), to read its network namespace.
    pub fn first_pid(&self, rel: &str) -> Option<u32> {
        let procs = std::fs::read_to_string(self.dir("memory", rel).join("cgroup.procs")).ok()?;
        procs.lines().next()?.trim().parse().ok()
    }

    /// The cgroup (relative) of a pod with cgroupsPerQOS, whatever its QoS class, and the
    /// driver that named it (either driver's name is looked for: a reader need not know
    /// which one pod-sync runs with).
    pub fn pod_cgroup(&self, cgroup_root: &str, uid: &str) -> Option<(String, CgroupDriver)> {
        [CgroupDriver::Cgroupfs, CgroupDriver::Systemd]
            .into_iter()
            .flat_map(|driver| {
                QOS_PARTS
                    .iter()
                    .map(move |qos| (pod_cgroup_name(cgroup_root, qos, uid).path(driver), driver))
            })
            .find(|(rel, _)| self.exists(rel))
    }

    /// A container's cgroup under its pod's, if it exists.
    pub fn container_cgroup(&self, pod: &(String, CgroupDriver), id: &str) -> Option<String> {
        Some(container_cgroup(&pod.0, pod.1, id)).filter(|rel| self.exists(rel))
    }

    /// The cgroup's block I/O per device (v2 `io.stat`, v1 the blkio files of
    /// [`BLKIO_V1_FILES`]); None when unreadable, empty when it has done none.
    pub fn block_io(&self, rel: &str) -> Option<Vec<BlockIo>> {
        if self.v2 {
            return Some(io_stat_v2(
                &std::fs::read_to_string(self.dir("", rel).join("io.stat")).ok()?,
            ));
        }
        let dir = self.dir("blkio", rel);
        let mut readable = false;
        for (bytes, serviced) in BLKIO_V1_FILES {
            let Ok(bytes) = std::fs::read_to_string(dir.join(bytes)) else {
                continue;
            };
            readable = true;
            let serviced = std::fs::read_to_string(dir.join(serviced)).unwrap_or_default();
            let io = blkio_v1(&bytes, &serviced);
            if !io.is_empty() {
                return Some(io);
            }
        }
        readable.then(Vec::new)
    }

    /// The cgroup of all pods (`kubepods`, or `kubepods.slice` under the systemd driver).
    pub fn pods_cgroup(&self, cgroup_root: &str) -> String {
        let name = pods_cgroup_name(cgroup_root);
        let systemd = name.path(CgroupDriver::Systemd);
        if self.exists(&systemd) {
            systemd
        } else {
            name.path(CgroupDriver::Cgroupfs)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's formats (Documentation/admin-guide/cgroup-v2.rst "io.stat" example;
    /// v1 blkio-controller.rst `blkio.throttle.io_service_bytes`), as runc parses them.
    #[test]
    fn block_io_from_v2_io_stat_and_v1_blkio_files() {
        let v2 = "8:16 rbytes=1459200 wbytes=314773504 rios=192 wios=353 dbytes=0 dios=0\n\
                  8:0 rbytes=90430464 wbytes=299008000 rios=8950 wios=1252 dbytes=50331648 dios=3021\n";
        assert_eq!(
            io_stat_v2(v2),
            vec![
                BlockIo {
                    major: 8,
                    minor: 16,
                    read_bytes: 1459200,
                    write_bytes: 314773504,
                    reads: 192,
                    writes: 353
                },
                BlockIo {
                    major: 8,
                    minor: 0,
                    read_bytes: 90430464,
                    write_bytes: 299008000,
                    reads: 8950,
                    writes: 1252
                },
            ]
        );
        let bytes = "253:0 Read 4096000\n253:0 Write 8192\n253:0 Sync 8192\n253:0 Async 4096000\n\
                     253:0 Discard 0\n253:0 Total 4104192\nTotal 4104192\n";
        let serviced = "253:0 Read 1000\n253:0 Write 2\n253:0 Sync 2\n253:0 Async 1000\n\
                        253:0 Discard 0\n253:0 Total 1002\nTotal 1002\n";
        assert_eq!(
            blkio_v1(bytes, serviced),
            vec![BlockIo {
                major: 253,
                minor: 0,
                read_bytes: 4096000,
                write_bytes: 8192,
                reads: 1000,
                writes: 2
            }]
        );
        // A cgroup that has done no I/O.
        assert_eq!(blkio_v1("Total 0\n", "Total 0\n"), vec![]);
        assert_eq!(io_stat_v2(""), vec![]);
    }

    #[test]
    fn working_set_is_usage_less_inactive_file_on_v1_and_v2() {
        let v1 = "cache 10\ntotal_inactive_file 4096\ntotal_rss 8192\ntotal_pgfault 7\ntotal_pgmajfault 1\n";
        let m = memory_from(10_000, Some(9_223_372_036_854_771_712), v1, false);
        assert_eq!(
            m,
            Memory {
                usage: 10_000,
                working_set: 10_000 - 4096,
                rss: Some(8192),
                cache: None,
                page_faults: Some(7),
                major_page_faults: Some(1),
                oom_kills: None,
                limit: None,
                swap: None,
            }
        );
        assert_eq!(
            oom_kills("low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n"),
            Some(2)
        );
        assert_eq!(
            oom_kills("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n"),
            Some(1)
        );
        assert_eq!(oom_kills("oom_kill_disable 0\nunder_oom 0\n"), None);
        let v2 = "anon 300\nfile 700\ninactive_file 600\npgfault 5\npgmajfault 0\n";
        let m = memory_from(1000, Some(4096), v2, true);
        assert_eq!(m.working_set, 400);
        assert_eq!(m.rss, Some(300));
        assert_eq!(m.cache, Some(700));
        assert_eq!(m.limit, Some(4096));
        // More inactive pages than usage (racy reads) floors at zero.
        assert_eq!(memory_from(10, None, v2, true).working_set, 0);
    }

    fn write(root: &Path, rel: &str, text: &str) {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    /// The same pod read from a v2 tree and from a v1 tree laid out as the kernel does
    /// (these VMs run v1, so the v2 files are only exercised here).
    #[test]
    fn reads_a_pod_from_v2_and_v1_trees() {
        let pod = "kubepods/burstable/podabc";
        let v2 = tempfile::tempdir().unwrap();
        write(v2.path(), "cgroup.controllers", "cpu memory pids\n");
        write(
            v2.path(),
            &format!("{pod}/cpu.stat"),
            "usage_usec 1500\nuser_usec 1000\n",
        );
        write(v2.path(), &format!("{pod}/memory.current"), "8192\n");
        write(v2.path(), &format!("{pod}/memory.max"), "max\n");
        write(
            v2.path(),
            &format!("{pod}/memory.stat"),
            "anon 4096\ninactive_file 1024\npgfault 3\npgmajfault 1\n",
        );
        write(v2.path(), &format!("{pod}/memory.swap.current"), "512\n");
        write(v2.path(), &format!("{pod}/memory.swap.max"), "max\n");
        write(v2.path(), &format!("{pod}/pids.current"), "2\n");
        write(v2.path(), &format!("{pod}/cgroup.procs"), "4242\n4243\n");
        write(v2.path(), &format!("{pod}/ctr/cgroup.procs"), "4244\n");
        write(v2.path(), "kubepods/cgroup.procs", "");
        write(v2.path(), "kubepods/burstable/cgroup.procs", "");
        let cg = Cgroups::at(v2.path().to_path_buf());
        assert!(cg.v2);
        assert_eq!(
            cg.pod_cgroup("/", "abc"),
            Some(("/kubepods/burstable/podabc".into(), CgroupDriver::Cgroupfs))
        );
        assert_eq!(cg.cpu_usage_ns(pod), Some(1_500_000));
        let m = cg.memory(pod).unwrap();
        assert_eq!(
            (m.usage, m.working_set, m.rss, m.limit),
            (8192, 7168, Some(4096), None)
        );
        assert_eq!(
            m.swap,
            Some(Swap {
                usage: 512,
                limit: None
            })
        );
        assert_eq!(cg.pids(pod), Some(2));
        assert_eq!(cg.first_pid(pod), Some(4242));
        let mut under = cg.procs_under("memory", "/kubepods", 10).unwrap();
        under.sort();
        assert_eq!(under, [4242, 4243, 4244]);
        assert_eq!(cg.procs_under("memory", "/kubepods", 2), None);
        assert_eq!(cg.procs_under("memory", "/nowhere", 10), None);

        let v1 = tempfile::tempdir().unwrap();
        write(
            v1.path(),
            &format!("cpuacct/{pod}/cpuacct.usage"),
            "1500000\n",
        );
        write(
            v1.path(),
            &format!("memory/{pod}/memory.usage_in_bytes"),
            "8192\n",
        );
        write(
            v1.path(),
            &format!("memory/{pod}/memory.limit_in_bytes"),
            "65536\n",
        );
        write(
            v1.path(),
            &format!("memory/{pod}/memory.stat"),
            "total_rss 4096\ntotal_inactive_file 1024\ntotal_pgfault 3\ntotal_pgmajfault 1\n",
        );
        write(v1.path(), &format!("memory/{pod}/cgroup.procs"), "4242\n");
        // memsw counts memory and swap: 2 KiB of swap, 16 KiB of it allowed.
        write(
            v1.path(),
            &format!("memory/{pod}/memory.memsw.usage_in_bytes"),
            "10240\n",
        );
        write(
            v1.path(),
            &format!("memory/{pod}/memory.memsw.limit_in_bytes"),
            "81920\n",
        );
        write(v1.path(), &format!("pids/{pod}/pids.current"), "2\n");
        let cg = Cgroups::at(v1.path().to_path_buf());
        assert!(!cg.v2);
        assert_eq!(
            cg.pod_cgroup("/", "abc"),
            Some(("/kubepods/burstable/podabc".into(), CgroupDriver::Cgroupfs))
        );
        assert_eq!(cg.cpu_usage_ns(pod), Some(1_500_000));
        let m = cg.memory(pod).unwrap();
        assert_eq!(
            (m.usage, m.working_set, m.rss, m.limit),
            (8192, 7168, Some(4096), Some(65536))
        );
        assert_eq!(
            m.swap,
            Some(Swap {
                usage: 2048,
                limit: Some(16384)
            })
        );
        assert_eq!(cg.pids(pod), Some(2));
        assert_eq!(cg.first_pid(pod), Some(4242));
        assert_eq!(cg.pod_cgroup("/", "missing"), None);
    }

    /// Under the systemd driver a pod is a slice and its containers containerd's scopes
    /// (`kubepods-besteffort-pod<uid with _>.slice/cri-containerd-<id>.scope`).
    #[test]
    fn a_pod_named_by_the_systemd_driver_is_found() {
        let v2 = tempfile::tempdir().unwrap();
        write(v2.path(), "cgroup.controllers", "cpu memory pids\n");
        let pod = "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-poda_b.slice";
        write(
            v2.path(),
            &format!("{pod}/cri-containerd-c1.scope/cgroup.procs"),
            "7\n",
        );
        write(v2.path(), "kubepods.slice/cgroup.procs", "");
        let cg = Cgroups::at(v2.path().to_path_buf());
        let found = cg.pod_cgroup("/", "a-b").unwrap();
        assert_eq!(found, (format!("/{pod}"), CgroupDriver::Systemd));
        assert_eq!(
            cg.container_cgroup(&found, "c1"),
            Some(format!("/{pod}/cri-containerd-c1.scope"))
        );
        assert_eq!(cg.container_cgroup(&found, "c2"), None);
        assert_eq!(cg.pods_cgroup("/"), "/kubepods.slice");
        assert_eq!(
            cg.first_pid(&format!("/{pod}/cri-containerd-c1.scope")),
            Some(7)
        );
    }

    /// CFS counters only for a cgroup with a quota, on v2 (`cpu.max`, `throttled_usec`) and
    /// v1 (`cpu.cfs_quota_us`, `throttled_time` in ns).
    #[test]
    fn cfs_throttling_only_under_a_quota_on_v2_and_v1() {
        let (limited, free) = ("kubepods/burstable/poda", "kubepods/besteffort/podb");
        let v2 = tempfile::tempdir().unwrap();
        write(v2.path(), "cgroup.controllers", "cpu memory\n");
        let stat = "usage_usec 9000\nnr_periods 40\nnr_throttled 7\nthrottled_usec 1500000\n";
        write(v2.path(), &format!("{limited}/cpu.max"), "50000 100000\n");
        write(v2.path(), &format!("{limited}/cpu.stat"), stat);
        write(v2.path(), &format!("{free}/cpu.max"), "max 100000\n");
        write(v2.path(), &format!("{free}/cpu.stat"), stat);
        let cg = Cgroups::at(v2.path().to_path_buf());
        assert_eq!(
            cg.cpu_cfs(limited),
            Some(Cfs {
                periods: 40,
                throttled_periods: 7,
                throttled_ns: 1_500_000_000
            })
        );
        assert_eq!(cg.cpu_cfs(free), None);
        assert_eq!(cg.cpu_cfs("nowhere"), None);

        let v1 = tempfile::tempdir().unwrap();
        let stat = "nr_periods 40\nnr_throttled 7\nthrottled_time 1500000000\n";
        write(
            v1.path(),
            &format!("cpu/{limited}/cpu.cfs_quota_us"),
            "50000\n",
        );
        write(v1.path(), &format!("cpu/{limited}/cpu.stat"), stat);
        write(v1.path(), &format!("cpu/{free}/cpu.cfs_quota_us"), "-1\n");
        write(v1.path(), &format!("cpu/{free}/cpu.stat"), stat);
        let cg = Cgroups::at(v1.path().to_path_buf());
        assert_eq!(
            cg.cpu_cfs(limited),
            Some(Cfs {
                periods: 40,
                throttled_periods: 7,
                throttled_ns: 1_500_000_000
            })
        );
        assert_eq!(cg.cpu_cfs(free), None);
    }

    #[test]
    fn swap_limits_as_each_version_states_them() {
        // v2: a limit in memory.swap.max; none without the file (no swap accounting).
        assert_eq!(
            swap_v2(Some(100), Some("4096\n")),
            Some(Swap {
                usage: 100,
                limit: Some(4096)
            })
        );
        assert_eq!(swap_v2(None, None), None);
        // v1: no memsw (swapaccount=0) means no swap stats; memsw without a memory limit
        // means no swap limit; racing reads never go below zero.
        let memory = |usage, limit| Memory {
            usage,
            limit,
            ..Memory::default()
        };
        assert_eq!(swap_v1(None, Some(1), &memory(10, Some(5))), None);
        assert_eq!(
            swap_v1(
                Some(30),
                Some(9_223_372_036_854_771_712),
                &memory(10, Some(20))
            ),
            Some(Swap {
                usage: 20,
                limit: None
            })
        );
        assert_eq!(
            swap_v1(Some(5), Some(100), &memory(10, None)),
            Some(Swap {
                usage: 0,
                limit: None
            })
        );
    }
}
