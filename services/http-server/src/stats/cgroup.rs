//! CPU, memory and pid counts of a cgroup, on cgroup v1 (cpuacct, memory and pids
//! hierarchies) and v2 (the unified tree), computed as cAdvisor does: the working set is
//! the usage less inactive file pages.

use std::path::{Path, PathBuf};

/// v1 "no limit" is a page-rounded i64::MAX; anything this large is no limit.
const NO_LIMIT: u64 = 1 << 62;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Memory {
    pub usage: u64,
    pub working_set: u64,
    pub rss: Option<u64>,
    pub page_faults: Option<u64>,
    pub major_page_faults: Option<u64>,
    /// None without a limit.
    pub limit: Option<u64>,
}

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
    let (inactive, rss, faults, major) = if v2 {
        ("inactive_file", "anon", "pgfault", "pgmajfault")
    } else {
        (
            "total_inactive_file",
            "total_rss",
            "total_pgfault",
            "total_pgmajfault",
        )
    };
    let inactive = stat_value(stat, inactive).unwrap_or(0);
    Memory {
        usage,
        working_set: usage.saturating_sub(inactive),
        rss: stat_value(stat, rss),
        page_faults: stat_value(stat, faults),
        major_page_faults: stat_value(stat, major),
        limit: limit.filter(|l| *l < NO_LIMIT),
    }
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
        self.dir("memory", rel).is_dir()
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
        Some(memory_from(usage, limit, &stat, self.v2))
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

    /// The cgroup (relative) of a pod with cgroupsPerQOS, whatever its QoS class.
    pub fn pod_cgroup(&self, cgroup_root: &str, uid: &str) -> Option<String> {
        let root = cgroup_root.trim_end_matches('/');
        ["", "/burstable", "/besteffort"]
            .iter()
            .map(|qos| format!("{root}/kubepods{qos}/pod{uid}"))
            .find(|rel| self.exists(rel))
    }

    /// The cgroup of all pods (`kubepods`).
    pub fn pods_cgroup(cgroup_root: &str) -> String {
        format!("{}/kubepods", cgroup_root.trim_end_matches('/'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
                page_faults: Some(7),
                major_page_faults: Some(1),
                limit: None,
            }
        );
        let v2 = "anon 300\nfile 700\ninactive_file 600\npgfault 5\npgmajfault 0\n";
        let m = memory_from(1000, Some(4096), v2, true);
        assert_eq!(m.working_set, 400);
        assert_eq!(m.rss, Some(300));
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
        write(v2.path(), &format!("{pod}/pids.current"), "2\n");
        write(v2.path(), &format!("{pod}/cgroup.procs"), "4242\n4243\n");
        let cg = Cgroups::at(v2.path().to_path_buf());
        assert!(cg.v2);
        assert_eq!(
            cg.pod_cgroup("/", "abc").as_deref(),
            Some("/kubepods/burstable/podabc")
        );
        assert_eq!(cg.cpu_usage_ns(pod), Some(1_500_000));
        let m = cg.memory(pod).unwrap();
        assert_eq!(
            (m.usage, m.working_set, m.rss, m.limit),
            (8192, 7168, Some(4096), None)
        );
        assert_eq!(cg.pids(pod), Some(2));
        assert_eq!(cg.first_pid(pod), Some(4242));

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
        write(v1.path(), &format!("pids/{pod}/pids.current"), "2\n");
        let cg = Cgroups::at(v1.path().to_path_buf());
        assert!(!cg.v2);
        assert_eq!(
            cg.pod_cgroup("/", "abc").as_deref(),
            Some("/kubepods/burstable/podabc")
        );
        assert_eq!(cg.cpu_usage_ns(pod), Some(1_500_000));
        let m = cg.memory(pod).unwrap();
        assert_eq!(
            (m.usage, m.working_set, m.rss, m.limit),
            (8192, 7168, Some(4096), Some(65536))
        );
        assert_eq!(cg.pids(pod), Some(2));
        assert_eq!(cg.first_pid(pod), Some(4242));
        assert_eq!(cg.pod_cgroup("/", "missing"), None);
    }
}
