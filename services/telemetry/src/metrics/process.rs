//! The `process_*` metrics of upstream's process collector (client_golang), read from
//! `/proc/self` at each scrape and labelled with the service's name.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

#[derive(Debug)]
pub(super) struct ProcessCollector {
    labels: [(&'static str, String); 1],
}

impl ProcessCollector {
    pub(super) fn new(service: &str) -> Self {
        Self {
            labels: [("service", service.to_string())],
        }
    }
}

/// One reading of `/proc/self`.
#[derive(Debug, Default, PartialEq)]
struct ProcessStat {
    cpu_seconds: f64,
    start_time_seconds: f64,
    virtual_memory_bytes: f64,
    resident_memory_bytes: f64,
}

/// Parses `/proc/self/stat` (fields after the parenthesised command name, which may
/// itself hold spaces and parentheses).
fn parse_stat(
    stat: &str,
    ticks_per_second: f64,
    page_size: f64,
    boot_time: f64,
) -> Option<ProcessStat> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Field n of proc(5) is fields[n - 3] here.
    let field = |n: usize| fields.get(n - 3)?.parse::<f64>().ok();
    Some(ProcessStat {
        cpu_seconds: (field(14)? + field(15)?) / ticks_per_second,
        start_time_seconds: boot_time + field(22)? / ticks_per_second,
        virtual_memory_bytes: field(23)?,
        resident_memory_bytes: field(24)? * page_size,
    })
}

/// `btime` of `/proc/stat`: the boot time in seconds since the epoch.
pub fn boot_time() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    stat.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

fn read_process_stat() -> Option<ProcessStat> {
    use nix::unistd::{SysconfVar, sysconf};
    let ticks = sysconf(SysconfVar::CLK_TCK).ok().flatten()? as f64;
    let page = sysconf(SysconfVar::PAGE_SIZE).ok().flatten()? as f64;
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    parse_stat(&stat, ticks, page, boot_time()?)
}

fn open_fds() -> Option<f64> {
    Some(std::fs::read_dir("/proc/self/fd").ok()?.count() as f64)
}

/// The soft limit of "Max open files" in `/proc/self/limits`.
fn max_fds() -> Option<f64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut gauge = |name: &str, help: &str, value: Option<f64>| {
            let Some(value) = value else { return Ok(()) };
            let metric = ConstGauge::new(value);
            let mut e = encoder.encode_descriptor(name, help, None, metric.metric_type())?;
            metric.encode(e.encode_family(&self.labels)?)
        };
        let stat = read_process_stat();
        gauge(
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            stat.as_ref().map(|s| s.resident_memory_bytes),
        )?;
        gauge(
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes.",
            stat.as_ref().map(|s| s.virtual_memory_bytes),
        )?;
        gauge(
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            stat.as_ref().map(|s| s.start_time_seconds),
        )?;
        gauge(
            "process_open_fds",
            "Number of open file descriptors.",
            open_fds(),
        )?;
        gauge(
            "process_max_fds",
            "Maximum number of open file descriptors.",
            max_fds(),
        )?;
        if let Some(stat) = &stat {
            let metric = ConstCounter::new(stat.cpu_seconds);
            let mut e = encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds.",
                None,
                metric.metric_type(),
            )?;
            metric.encode(e.encode_family(&self.labels)?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_spaces_in_the_command_name() {
        // pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
        // utime stime cutime cstime priority nice threads itrealvalue starttime vsize rss
        let stat = "42 (a b) c) S 1 42 42 0 -1 0 0 0 0 0 250 50 0 0 20 0 4 0 1000 8192 3 18446744073709551615";
        let s = parse_stat(stat, 100.0, 4096.0, 1_700_000_000.0).expect("parses");
        assert_eq!(
            s,
            ProcessStat {
                cpu_seconds: 3.0,
                start_time_seconds: 1_700_000_010.0,
                virtual_memory_bytes: 8192.0,
                resident_memory_bytes: 3.0 * 4096.0,
            }
        );
        assert_eq!(parse_stat("garbage", 100.0, 4096.0, 0.0), None);
    }
}
