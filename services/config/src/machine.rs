//! The machine's capacity as upstream reads it (cAdvisor's `MachineInfo`): CPUs the process
//! may use, and `MemTotal` of /proc/meminfo.

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
        .and_then(|m| mem_total(&m))
        .unwrap_or(0)
}

fn mem_total(meminfo: &str) -> Option<u64> {
    meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map(|kb| kb * 1024)
}

#[cfg(test)]
mod tests {
    #[test]
    fn mem_total_is_read_in_bytes() {
        assert_eq!(
            super::mem_total("MemFree: 1 kB\nMemTotal:  2048 kB\n"),
            Some(2 << 20)
        );
        assert_eq!(super::mem_total("MemFree: 1 kB\n"), None);
        assert!(super::memory_bytes() > 0);
        assert!(super::cpus() >= 1);
    }
}
