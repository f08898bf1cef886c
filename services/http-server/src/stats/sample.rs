//! Raw counters turned into the Summary's CPU, memory, swap and filesystem stats:
//! `usageNanoCores` as a rate against the previous sample of the same thing (as upstream's
//! CRI stats provider keeps them), `availableBytes` from limits.

use super::cgroup::{Memory, Swap};
use super::host;
use super::system;
use super::types::*;
use nodeagent_cri::api;
use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

/// A baseline is replaced once the new sample is this much newer, so that requests in
/// quick succession still measure the rate over a useful window.
const MIN_RATE_WINDOW_NS: i64 = 1_000_000_000;

#[derive(Debug, Clone, Copy)]
pub(super) struct CpuSample {
    pub at_ns: i64,
    pub usage_ns: u64,
}

/// Previous CPU samples by key (container ID, `pod/<uid>`, `node`, `sys/<name>`).
pub(super) static CPU_SAMPLES: LazyLock<Mutex<HashMap<String, CpuSample>>> =
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

pub(super) fn cpu_stats(
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
        cfs: None,
    }
}

pub(super) fn memory_stats(at_ns: i64, m: &Memory, capacity: Option<u64>) -> MemoryStats {
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
        oom_events: m.oom_kills,
        cache_bytes: m.cache,
    }
}

pub(super) fn swap_stats(at_ns: i64, s: &Swap) -> SwapStats {
    SwapStats {
        time: time_from_nanos(at_ns),
        swap_available_bytes: s.limit.map(|l| l.saturating_sub(s.usage)),
        swap_usage_bytes: Some(s.usage),
    }
}

/// Swap as CRI reports it.
pub(super) fn cri_swap(s: &api::SwapUsage) -> SwapStats {
    SwapStats {
        time: time_from_nanos(s.timestamp),
        swap_available_bytes: value(&s.swap_available_bytes),
        swap_usage_bytes: value(&s.swap_usage_bytes),
    }
}

/// A pod's swap summed over its containers (upstream's `addSwapStats` without a pod
/// cgroup); None when no container reports swap.
pub(super) fn summed_swap(containers: &[ContainerStats]) -> Option<SwapStats> {
    containers
        .iter()
        .filter_map(|c| c.swap.as_ref())
        .fold(None, |sum: Option<SwapStats>, s| {
            let add = |a: Option<u64>, b: Option<u64>| Some(a.unwrap_or(0) + b.unwrap_or(0));
            Some(match sum {
                None => s.clone(),
                Some(sum) => SwapStats {
                    time: s.time.clone(),
                    swap_available_bytes: add(sum.swap_available_bytes, s.swap_available_bytes),
                    swap_usage_bytes: add(sum.swap_usage_bytes, s.swap_usage_bytes),
                },
            })
        })
}

/// A system container's entry, its usageNanoCores against its previous sample.
pub(super) fn system_container(
    samples: &mut HashMap<String, CpuSample>,
    at_ns: i64,
    usage: &system::Usage,
) -> ContainerStats {
    let key = format!("sys/{}", usage.name);
    ContainerStats {
        name: usage.name.to_string(),
        start_time: time_from_nanos(usage.start_ns),
        cpu: usage
            .cpu_ns
            .map(|u| cpu_stats(samples, &key, at_ns, u, None)),
        memory: usage.memory.as_ref().map(|m| memory_stats(at_ns, m, None)),
        rootfs: None,
        logs: None,
        swap: usage
            .memory
            .as_ref()
            .and_then(|m| m.swap.as_ref())
            .map(|s| swap_stats(at_ns, s)),
    }
}

pub(super) fn fs_stats(
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

pub(super) fn value(v: &Option<api::UInt64Value>) -> Option<u64> {
    v.as_ref().map(|v| v.value)
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

    #[test]
    fn swap_available_is_the_limit_less_usage_and_pods_sum_their_containers() {
        let limited = swap_stats(
            0,
            &Swap {
                usage: 100,
                limit: Some(1000),
            },
        );
        assert_eq!(
            (limited.swap_usage_bytes, limited.swap_available_bytes),
            (Some(100), Some(900))
        );
        let unlimited = swap_stats(
            0,
            &Swap {
                usage: 7,
                limit: None,
            },
        );
        assert_eq!(unlimited.swap_available_bytes, None);
        let container = |swap: Option<SwapStats>| ContainerStats {
            name: "c".into(),
            start_time: time_from_nanos(0),
            cpu: None,
            memory: None,
            rootfs: None,
            logs: None,
            swap,
        };
        let pod = summed_swap(&[
            container(Some(limited)),
            container(None),
            container(Some(unlimited)),
        ])
        .unwrap();
        assert_eq!(
            (pod.swap_usage_bytes, pod.swap_available_bytes),
            (Some(107), Some(900))
        );
        assert!(summed_swap(&[container(None)]).is_none());
    }
}
