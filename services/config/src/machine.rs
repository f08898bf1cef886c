//! The machine's capacity as upstream reads it (cAdvisor's `MachineInfo`): CPUs the process
//! may use, and `MemTotal` of /proc/meminfo; and the node's own numbers that eviction and
//! `/stats/summary` share: memory as cAdvisor's root container, filesystems, pids.

use crate::cgroupfs::{Cgroups, Memory, Swap, memory_from};
use std::path::Path;

/// Logical CPUs available to this process.
pub fn cpus() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// Physical memory in bytes (`MemTotal`), 0 if /proc/meminfo cannot be read.
pub fn memory_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| meminfo(&m, "MemTotal"))
        .unwrap_or(0)
}

/// A `/proc/meminfo` field in bytes.
pub fn meminfo(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(key)?.strip_prefix(':')?;
        let kib: u64 = rest.split_whitespace().next()?.parse().ok()?;
        Some(kib * 1024)
    })
}

/// Node memory: the root memory cgroup on v1 (as cAdvisor's root container), `info`
/// (/proc/meminfo) on v2 (where the root has no memory.current). `total` is MemTotal.
pub fn node_memory(cgroups: &Cgroups, info: &str) -> Option<(Memory, u64)> {
    let total = meminfo(info, "MemTotal")?;
    if let Some(m) = cgroups.memory("/").filter(|m| m.usage > 0) {
        return Some((m, total));
    }
    let usage = total.saturating_sub(meminfo(info, "MemFree")?);
    let vmstat = std::fs::read_to_string("/proc/vmstat").unwrap_or_default();
    let stat = format!(
        "inactive_file {}\nanon {}\n{vmstat}",
        meminfo(info, "Inactive(file)").unwrap_or(0),
        meminfo(info, "AnonPages").unwrap_or(0)
    );
    Some((memory_from(usage, None, &stat, true), total))
}

/// The node's swap from `info` (/proc/meminfo): used is SwapTotal less SwapFree, under a
/// limit of SwapTotal. None without swap.
pub fn node_swap(info: &str) -> Option<Swap> {
    let total = meminfo(info, "SwapTotal").filter(|t| *t > 0)?;
    let free = meminfo(info, "SwapFree")?;
    Some(Swap {
        usage: total.saturating_sub(free),
        limit: Some(total),
    })
}

/// Capacity, free space and inodes of the filesystem holding `path`.
pub struct Statvfs {
    pub capacity: u64,
    pub available: u64,
    pub used: u64,
    pub inodes: u64,
    pub inodes_free: u64,
}

pub fn statvfs(path: &Path) -> Option<Statvfs> {
    let s = nix::sys::statvfs::statvfs(path).ok()?;
    let frsize = s.fragment_size() as u64;
    let capacity = s.blocks() as u64 * frsize;
    let free = s.blocks_free() as u64 * frsize;
    Some(Statvfs {
        capacity,
        available: s.blocks_available() as u64 * frsize,
        used: capacity.saturating_sub(free),
        inodes: s.files() as u64,
        inodes_free: s.files_free() as u64,
    })
}

/// (most tasks the kernel allows, processes and threads now): the node's rlimit stats. The
/// most is the smaller of `kernel.pid_max` and `kernel.threads-max`, as upstream.
pub fn rlimit() -> (Option<i64>, Option<i64>) {
    let read = |p: &str| -> Option<i64> { std::fs::read_to_string(p).ok()?.trim().parse().ok() };
    let max = match (
        read("/proc/sys/kernel/pid_max"),
        read("/proc/sys/kernel/threads-max"),
    ) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    // /proc/loadavg's fourth field is running/total scheduling entities.
    let cur = std::fs::read_to_string("/proc/loadavg").ok().and_then(|s| {
        let field = s.split_whitespace().nth(3)?;
        field.split_once('/')?.1.parse().ok()
    });
    (max, cur)
}

/// The node's primary address: the first global IPv4 address on an interface that is not
/// loopback or a container bridge.
pub fn host_ip() -> String {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return String::new();
    };
    for a in addrs {
        let name = a.interface_name.as_str();
        if name == "lo"
            || name.starts_with("docker")
            || name.starts_with("veth")
            || name.starts_with("nodeagent")
            || name.starts_with("cni")
            || name.starts_with("br-")
        {
            continue;
        }
        if let Some(ip) = a.address.as_ref().and_then(|s| s.as_sockaddr_in()) {
            return ip.ip().to_string();
        }
    }
    String::new()
}

/// This boot's id (`/proc/sys/kernel/random/boot_id`), "" if it cannot be read.
pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The marker node-status reads: present (with this boot's id) while the node shuts down.
pub fn marker(root_dir: &Path) -> std::path::PathBuf {
    root_dir.join("pod-sync").join("shutting-down")
}

/// Whether the marker says this boot is shutting down.
pub fn shutting_down(root_dir: &Path) -> bool {
    std::fs::read_to_string(marker(root_dir)).is_ok_and(|m| m.trim() == boot_id())
}

pub fn set_marker(root_dir: &Path, on: bool) {
    let path = marker(root_dir);
    let result = if on {
        path.parent()
            .map(std::fs::create_dir_all)
            .unwrap_or(Ok(()))
            .and_then(|_| std::fs::write(&path, boot_id()))
    } else {
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    };
    if let Err(e) = result {
        tracing::warn!(path = %path.display(), error = %e, "cannot update the shutdown marker");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_swap_is_reported_only_with_swap() {
        let info = "MemTotal:  2048 kB\nMemFree:  1024 kB\nSwapCached:  0 kB\n\
                    SwapTotal:  4096 kB\nSwapFree:  3072 kB\n";
        assert_eq!(
            node_swap(info),
            Some(Swap {
                usage: 1024 * 1024,
                limit: Some(4096 * 1024),
            })
        );
        let none = "MemTotal:  2048 kB\nSwapTotal:  0 kB\nSwapFree:  0 kB\n";
        assert_eq!(node_swap(none), None);
        assert_eq!(node_swap("MemTotal:  2048 kB\n"), None);
    }

    #[test]
    fn mem_total_is_read_in_bytes() {
        assert_eq!(
            meminfo("MemFree: 1 kB\nMemTotal:  2048 kB\n", "MemTotal"),
            Some(2 << 20)
        );
        assert_eq!(meminfo("MemFree: 1 kB\n", "MemTotal"), None);
        assert!(super::memory_bytes() > 0);
        assert!(super::cpus() >= 1);
    }

    #[test]
    fn the_marker_holds_for_this_boot_only() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!shutting_down(dir.path()));
        set_marker(dir.path(), true);
        assert!(shutting_down(dir.path()));
        std::fs::write(marker(dir.path()), "another-boot").unwrap();
        assert!(
            !shutting_down(dir.path()),
            "a marker from an earlier boot is stale"
        );
        set_marker(dir.path(), false);
        set_marker(dir.path(), false);
        assert!(!marker(dir.path()).exists());
    }
}
