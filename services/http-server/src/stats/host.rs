//! The node's own numbers: CPU and memory from /proc (and the root cgroup on v1, as
//! cAdvisor), network counters from a `net/dev` file, filesystems from statvfs, and the
//! size of a directory of log files.

use super::types::InterfaceStats;
pub use nodeagent_config::machine::{Statvfs, meminfo, node_memory, node_swap, rlimit, statvfs};
use std::path::Path;

/// The interface upstream reports at the top of NetworkStats.
pub const DEFAULT_INTERFACE: &str = "eth0";

/// Cumulative CPU time of the whole machine in nanoseconds (/proc/stat's first line:
/// user, nice, system, irq, softirq and steal; not idle or iowait).
pub fn node_cpu_usage_ns(proc_stat: &str, ticks_per_second: u64) -> Option<u64> {
    let line = proc_stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    let busy = [0, 1, 2, 5, 6, 7]
        .iter()
        .filter_map(|i| v.get(*i))
        .sum::<u64>();
    Some(busy.saturating_mul(1_000_000_000) / ticks_per_second.max(1))
}

/// Parses a `net/dev` file; `lo` is left out.
pub fn parse_net_dev(text: &str) -> Vec<InterfaceStats> {
    text.lines()
        .skip(2)
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            let name = name.trim();
            let v: Vec<u64> = rest
                .split_whitespace()
                .filter_map(|f| f.parse().ok())
                .collect();
            (name != "lo" && v.len() >= 16).then(|| InterfaceStats {
                name: name.to_string(),
                rx_bytes: Some(v[0]),
                rx_packets: Some(v[1]),
                rx_errors: Some(v[2]),
                rx_dropped: Some(v[3]),
                tx_bytes: Some(v[8]),
                tx_packets: Some(v[9]),
                tx_errors: Some(v[10]),
                tx_dropped: Some(v[11]),
            })
        })
        .collect()
}

/// Interfaces seen from a process's network namespace (`/proc/<pid>/net/dev`).
pub fn interfaces_of(pid: Option<u32>) -> Vec<InterfaceStats> {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/net/dev"),
        None => "/proc/net/dev".to_string(),
    };
    std::fs::read_to_string(path)
        .map(|t| parse_net_dev(&t))
        .unwrap_or_default()
}

/// Bytes and files under `dir`, at most `depth` levels down (log directories are
/// shallow; the bound keeps a planted deep tree cheap).
pub fn dir_usage(dir: &Path, depth: usize) -> Option<(u64, u64)> {
    let mut bytes = 0;
    let mut files = 0;
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let Ok(meta) = entry.metadata() else { continue };
        files += 1;
        if meta.is_dir() && depth > 0 {
            if let Some((b, f)) = dir_usage(&entry.path(), depth - 1) {
                bytes += b;
                files += f;
            }
        } else if meta.is_file() {
            use std::os::unix::fs::MetadataExt;
            bytes += meta.blocks() * 512;
        }
    }
    Some((bytes, files))
}

/// Boot time in nanoseconds since the epoch (`btime` of /proc/stat).
pub fn boot_time_ns(proc_stat: &str) -> Option<i64> {
    let secs: i64 = proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    Some(secs * 1_000_000_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_cpu_counts_busy_ticks_only() {
        let stat = "cpu  100 10 50 1000 20 5 5 10 0 0\ncpu0 1 2 3 4\nbtime 1700000000\n";
        // user+nice+system+irq+softirq+steal = 180 ticks at 100/s = 1.8 s.
        assert_eq!(node_cpu_usage_ns(stat, 100), Some(1_800_000_000));
        assert_eq!(boot_time_ns(stat), Some(1_700_000_000_000_000_000));
    }

    #[test]
    fn parses_net_dev_without_loopback() {
        let text = "Inter-|   Receive                                                |  Transmit\n face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    lo:  100 1 0 0 0 0 0 0 100 1 0 0 0 0 0 0\n  eth0: 2000 20 3 5 0 0 0 0 1000 10 4 6 0 0 0 0\n";
        let v = parse_net_dev(text);
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].name, "eth0");
        assert_eq!((v[0].rx_bytes, v[0].rx_errors), (Some(2000), Some(3)));
        assert_eq!((v[0].tx_bytes, v[0].tx_errors), (Some(1000), Some(4)));
        assert_eq!((v[0].rx_packets, v[0].rx_dropped), (Some(20), Some(5)));
        assert_eq!((v[0].tx_packets, v[0].tx_dropped), (Some(10), Some(6)));
    }
}
