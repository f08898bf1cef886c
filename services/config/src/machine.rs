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

/// The memory page size in bytes (`os.Getpagesize`), 4096 where it cannot be read.
pub fn page_size() -> i64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .unwrap_or(4096) as i64
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

/// The node's primary address as upstream's `ChooseHostInterface` picks it: a global
/// address of the interface that holds the default route (IPv4's, else IPv6's), so never
/// a container bridge or an overlay's; without a default route, the first global IPv4
/// address on an interface that is neither loopback nor a bridge or overlay.
pub fn host_ip() -> String {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return String::new();
    };
    let addrs: Vec<(String, std::net::IpAddr)> = addrs
        .filter_map(|a| {
            let sa = a.address?;
            let ip = match (sa.as_sockaddr_in(), sa.as_sockaddr_in6()) {
                (Some(v4), _) => std::net::IpAddr::V4(v4.ip()),
                (_, Some(v6)) => std::net::IpAddr::V6(v6.ip()),
                _ => return None,
            };
            Some((a.interface_name, ip))
        })
        .collect();
    let route4 = std::fs::read_to_string("/proc/net/route").unwrap_or_default();
    let route6 = std::fs::read_to_string("/proc/net/ipv6_route").unwrap_or_default();
    choose_host_ip(&addrs, &route4, &route6)
        .map(|ip| ip.to_string())
        .unwrap_or_default()
}

/// The node's addresses: the configured ones (`--node-ip`), else the detected one
/// ([`host_ip`]); empty when there is none. The first is the node's primary address
/// (its InternalIP, the pods' hostIP).
pub fn node_ips(configured: &[std::net::IpAddr]) -> Vec<String> {
    if configured.is_empty() {
        let ip = host_ip();
        if ip.is_empty() { Vec::new() } else { vec![ip] }
    } else {
        configured.iter().map(|ip| ip.to_string()).collect()
    }
}

/// Interfaces that are never the node's: loopback, container bridges and veths, overlays.
fn virtual_interface(name: &str) -> bool {
    name == "lo"
        || [
            "docker",
            "veth",
            "nodeagent",
            "cni",
            "br-",
            "flannel",
            "cilium",
            "vxlan",
            "tunl",
            "kube-ipvs",
            "weave",
            "cali",
            "genev",
            "kube-bridge",
            "lxc",
        ]
        .iter()
        .any(|p| name.starts_with(p))
}

fn global(ip: &std::net::IpAddr) -> bool {
    match ip {
        std::net::IpAddr::V4(v4) => {
            !v4.is_loopback() && !v4.is_link_local() && !v4.is_unspecified()
        }
        std::net::IpAddr::V6(v6) => {
            !v6.is_loopback() && !v6.is_unspecified() && (v6.segments()[0] & 0xffc0) != 0xfe80
        }
    }
}

/// The choice [`host_ip`] makes from the host's addresses and its routing tables
/// (`/proc/net/route` and `/proc/net/ipv6_route` texts).
pub fn choose_host_ip(
    addrs: &[(String, std::net::IpAddr)],
    route4: &str,
    route6: &str,
) -> Option<std::net::IpAddr> {
    // /proc/net/route: "Iface Destination Gateway Flags ..." with the default route's
    // destination 00000000 and mask 00000000; /proc/net/ipv6_route: the destination and
    // its prefix length (0) first, the interface last.
    let default4 = route4.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() > 7 && f[1] == "00000000" && f[7] == "00000000").then(|| f[0].to_string())
    });
    let default6 = route6.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() >= 10 && f[0].bytes().all(|b| b == b'0') && f[1] == "00" && f[9] != "lo")
            .then(|| f[9].to_string())
    });
    let on = |iface: &str, v4: bool| {
        addrs
            .iter()
            .find(|(name, ip)| name == iface && ip.is_ipv4() == v4 && global(ip))
            .map(|(_, ip)| *ip)
    };
    default4
        .and_then(|i| on(&i, true))
        .or_else(|| default6.and_then(|i| on(&i, false)))
        .or_else(|| {
            addrs
                .iter()
                .find(|(name, ip)| ip.is_ipv4() && global(ip) && !virtual_interface(name))
                .map(|(_, ip)| *ip)
        })
}

/// Whether swap is on: `/proc/swaps` lists a device or file below its header.
pub fn swap_on(swaps: &str) -> bool {
    swaps.lines().skip(1).any(|l| !l.trim().is_empty())
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

    /// The node address upstream's `ChooseHostInterface` gives (k8s.io/apimachinery
    /// `util/net/interface_test.go`'s idea: the default route's interface): an overlay or
    /// a bridge that comes first in the interface list is passed over.
    #[test]
    fn the_host_ip_is_the_default_routes_interfaces() {
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        let addrs = vec![
            ("lo".to_string(), ip("127.0.0.1")),
            ("flannel.1".to_string(), ip("10.244.0.0")),
            ("cni0".to_string(), ip("10.244.0.1")),
            ("eth0".to_string(), ip("fe80::1")),
            ("eth0".to_string(), ip("192.168.1.20")),
            ("eth0".to_string(), ip("2001:db8::20")),
            ("eth1".to_string(), ip("172.16.0.5")),
        ];
        let route4 = "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\n\
                      eth1\t0000A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\n\
                      eth0\t00000000\t0101A8C0\t0003\t0\t0\t100\t00000000\n";
        assert_eq!(choose_host_ip(&addrs, route4, ""), Some(ip("192.168.1.20")));
        // No IPv4 default route: IPv6's.
        let route6 = "00000000000000000000000000000000 00 00000000000000000000000000000000 00 fe800000000000000000000000000001 00000400 00000001 00000000 00000003 eth0\n";
        assert_eq!(
            choose_host_ip(&addrs, "Iface\tDestination\n", route6),
            Some(ip("2001:db8::20"))
        );
        // Neither: the first global IPv4 address that is not a bridge's or an overlay's.
        assert_eq!(choose_host_ip(&addrs, "", ""), Some(ip("192.168.1.20")));
        assert_eq!(choose_host_ip(&addrs[..3], "", ""), None);
    }

    #[test]
    fn swap_is_on_when_proc_swaps_lists_one() {
        let header = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n";
        assert!(!swap_on(header));
        assert!(swap_on(&format!(
            "{header}/swapfile  file  1048572  0  -2\n"
        )));
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
