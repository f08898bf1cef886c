//! `/metrics/resource` (upstream's resource metrics, what metrics-server reads) and
//! `/metrics/cadvisor` (cAdvisor's container families and labels), from the same
//! collection as the Summary API.

use super::devices::{block_device_name, device_of};
use super::exposition::{Family, Kind, render_family};
use super::text;
use crate::AppState;
use crate::stats::cgroup::BlockIo;
use crate::stats::collect::{Collected, collect};
use crate::stats::types::{ContainerStats, CpuStats, FsStats, MemoryStats, SwapStats};
use axum::extract::State;
use axum::response::Response;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::path::Path;
use std::sync::Arc;

fn ms(t: &Time) -> i64 {
    t.0.as_millisecond()
}

fn seconds(t: &Time) -> f64 {
    t.0.as_millisecond() as f64 / 1000.0
}

fn cpu_seconds(cpu: &Option<CpuStats>) -> Option<(f64, i64)> {
    let cpu = cpu.as_ref()?;
    Some((cpu.usage_core_nano_seconds? as f64 / 1e9, ms(&cpu.time)))
}

fn working_set(memory: &Option<MemoryStats>) -> Option<(f64, i64)> {
    let m = memory.as_ref()?;
    Some((m.working_set_bytes? as f64, ms(&m.time)))
}

pub fn render_resource(collected: Option<&Collected>) -> String {
    let mut node_cpu = Family::new(
        "node_cpu_usage_seconds_total",
        "[STABLE] Cumulative cpu time consumed by the node in core-seconds",
        Kind::Counter,
    );
    let mut node_memory = Family::new(
        "node_memory_working_set_bytes",
        "[STABLE] Current working set of the node in bytes",
        Kind::Gauge,
    );
    let mut container_cpu = Family::new(
        "container_cpu_usage_seconds_total",
        "[STABLE] Cumulative cpu time consumed by the container in core-seconds",
        Kind::Counter,
    );
    let mut container_memory = Family::new(
        "container_memory_working_set_bytes",
        "[STABLE] Current working set of the container in bytes",
        Kind::Gauge,
    );
    let mut container_start = Family::new(
        "container_start_time_seconds",
        "[STABLE] Start time of the container since unix epoch in seconds",
        Kind::Gauge,
    );
    let mut pod_cpu = Family::new(
        "pod_cpu_usage_seconds_total",
        "[STABLE] Cumulative cpu time consumed by the pod in core-seconds",
        Kind::Counter,
    );
    let mut pod_memory = Family::new(
        "pod_memory_working_set_bytes",
        "[STABLE] Current working set of the pod in bytes",
        Kind::Gauge,
    );
    let mut scrape_error = Family::new(
        "resource_scrape_error",
        "[STABLE] 1 if there was an error while getting container metrics, 0 otherwise",
        Kind::Gauge,
    );
    scrape_error.push(&[], if collected.is_some() { 0.0 } else { 1.0 }, None);
    if let Some(c) = collected {
        let node = &c.summary.node;
        if let Some((v, t)) = cpu_seconds(&node.cpu) {
            node_cpu.push(&[], v, Some(t));
        }
        if let Some((v, t)) = working_set(&node.memory) {
            node_memory.push(&[], v, Some(t));
        }
        for pod in &c.summary.pods {
            let (ns, name) = (pod.pod_ref.namespace.as_str(), pod.pod_ref.name.as_str());
            let pod_labels = [("namespace", ns), ("pod", name)];
            if let Some((v, t)) = cpu_seconds(&pod.cpu) {
                pod_cpu.push(&pod_labels, v, Some(t));
            }
            if let Some((v, t)) = working_set(&pod.memory) {
                pod_memory.push(&pod_labels, v, Some(t));
            }
            for ctr in &pod.containers {
                let labels = [
                    ("container", ctr.name.as_str()),
                    ("namespace", ns),
                    ("pod", name),
                ];
                if let Some((v, t)) = cpu_seconds(&ctr.cpu) {
                    container_cpu.push(&labels, v, Some(t));
                }
                if let Some((v, t)) = working_set(&ctr.memory) {
                    container_memory.push(&labels, v, Some(t));
                }
                container_start.push(&labels, seconds(&ctr.start_time), None);
            }
        }
    }
    let mut out = String::new();
    for family in [
        &container_cpu,
        &container_memory,
        &container_start,
        &node_cpu,
        &node_memory,
        &pod_cpu,
        &pod_memory,
        &scrape_error,
    ] {
        render_family(family, &mut out);
    }
    out
}

pub async fn resource(State(state): State<Arc<AppState>>) -> Response {
    let collected = match collect(&state, true).await {
        Ok(c) => Some(c),
        Err(e) => {
            tracing::warn!(error = %e.message(), "resource metrics: collecting stats failed");
            None
        }
    };
    text(render_resource(collected.as_ref()))
}

/// cAdvisor's families for the root cgroup, each pod cgroup and each container.
struct Cadvisor {
    cpu: Family,
    cfs_periods: Family,
    cfs_throttled_periods: Family,
    cfs_throttled_seconds: Family,
    cache: Family,
    swap: Family,
    rx_packets: Family,
    rx_dropped: Family,
    tx_packets: Family,
    tx_dropped: Family,
    working_set: Family,
    oom_events: Family,
    rss: Family,
    usage: Family,
    start: Family,
    rx_bytes: Family,
    tx_bytes: Family,
    rx_errors: Family,
    tx_errors: Family,
    failures: Family,
    machine_memory: Family,
    machine_cpus: Family,
    fs_inodes_free: Family,
    fs_inodes_total: Family,
    fs_limit: Family,
    fs_usage: Family,
    fs_reads: Family,
    fs_writes: Family,
    fs_read_bytes: Family,
    fs_write_bytes: Family,
    /// Block devices' names by `MAJ:MIN`, read once per rendering (every container's I/O
    /// is on the same few devices).
    device_names: std::collections::HashMap<(u32, u32), Option<String>>,
}

impl Cadvisor {
    fn new() -> Self {
        Self {
            cpu: Family::new(
                "container_cpu_usage_seconds_total",
                "Cumulative cpu time consumed in seconds.",
                Kind::Counter,
            ),
            // Names and help as google/cadvisor metrics/prometheus.go.
            cfs_periods: Family::new(
                "container_cpu_cfs_periods_total",
                "Number of elapsed enforcement period intervals.",
                Kind::Counter,
            ),
            cfs_throttled_periods: Family::new(
                "container_cpu_cfs_throttled_periods_total",
                "Number of throttled period intervals.",
                Kind::Counter,
            ),
            cfs_throttled_seconds: Family::new(
                "container_cpu_cfs_throttled_seconds_total",
                "Total time duration the container has been throttled.",
                Kind::Counter,
            ),
            cache: Family::new(
                "container_memory_cache",
                "Number of bytes of page cache memory.",
                Kind::Gauge,
            ),
            swap: Family::new(
                "container_memory_swap",
                "Container swap usage in bytes.",
                Kind::Gauge,
            ),
            rx_packets: Family::new(
                "container_network_receive_packets_total",
                "Cumulative count of packets received",
                Kind::Counter,
            ),
            rx_dropped: Family::new(
                "container_network_receive_packets_dropped_total",
                "Cumulative count of packets dropped while receiving",
                Kind::Counter,
            ),
            tx_packets: Family::new(
                "container_network_transmit_packets_total",
                "Cumulative count of packets transmitted",
                Kind::Counter,
            ),
            tx_dropped: Family::new(
                "container_network_transmit_packets_dropped_total",
                "Cumulative count of packets dropped while transmitting",
                Kind::Counter,
            ),
            working_set: Family::new(
                "container_memory_working_set_bytes",
                "Current working set in bytes.",
                Kind::Gauge,
            ),
            rss: Family::new("container_memory_rss", "Size of RSS in bytes.", Kind::Gauge),
            usage: Family::new(
                "container_memory_usage_bytes",
                "Current memory usage in bytes, including all memory regardless of when it was accessed",
                Kind::Gauge,
            ),
            start: Family::new(
                "container_start_time_seconds",
                "Start time of the container since unix epoch in seconds.",
                Kind::Gauge,
            ),
            rx_bytes: Family::new(
                "container_network_receive_bytes_total",
                "Cumulative count of bytes received",
                Kind::Counter,
            ),
            tx_bytes: Family::new(
                "container_network_transmit_bytes_total",
                "Cumulative count of bytes transmitted",
                Kind::Counter,
            ),
            rx_errors: Family::new(
                "container_network_receive_errors_total",
                "Cumulative count of errors encountered while receiving",
                Kind::Counter,
            ),
            tx_errors: Family::new(
                "container_network_transmit_errors_total",
                "Cumulative count of errors encountered while transmitting",
                Kind::Counter,
            ),
            oom_events: Family::new(
                "container_oom_events_total",
                "Count of out of memory events observed for the container",
                Kind::Counter,
            ),
            failures: Family::new(
                "container_memory_failures_total",
                "Cumulative count of memory allocation failures.",
                Kind::Counter,
            ),
            machine_cpus: Family::new(
                "machine_cpu_cores",
                "Number of logical CPU cores.",
                Kind::Gauge,
            ),
            machine_memory: Family::new(
                "machine_memory_bytes",
                "Amount of memory installed on the machine.",
                Kind::Gauge,
            ),
            fs_inodes_free: Family::new(
                "container_fs_inodes_free",
                "Number of available Inodes",
                Kind::Gauge,
            ),
            fs_inodes_total: Family::new(
                "container_fs_inodes_total",
                "Number of Inodes",
                Kind::Gauge,
            ),
            fs_limit: Family::new(
                "container_fs_limit_bytes",
                "Number of bytes that can be consumed by the container on this filesystem.",
                Kind::Gauge,
            ),
            fs_usage: Family::new(
                "container_fs_usage_bytes",
                "Number of bytes that are consumed by the container on this filesystem.",
                Kind::Gauge,
            ),
            fs_reads: Family::new(
                "container_fs_reads_total",
                "Cumulative count of reads completed",
                Kind::Counter,
            ),
            fs_writes: Family::new(
                "container_fs_writes_total",
                "Cumulative count of writes completed",
                Kind::Counter,
            ),
            fs_read_bytes: Family::new(
                "container_fs_reads_bytes_total",
                "Cumulative count of bytes read",
                Kind::Counter,
            ),
            fs_write_bytes: Family::new(
                "container_fs_writes_bytes_total",
                "Cumulative count of bytes written",
                Kind::Counter,
            ),
            device_names: Default::default(),
        }
    }

    /// One filesystem of a cgroup (cAdvisor's fs families), under `device`.
    fn fs(&mut self, labels: &[(&str, &str); 6], device: &str, fs: &FsStats) {
        let mut with_device: Vec<(&str, &str)> = labels.to_vec();
        with_device.insert(1, ("device", device));
        let t = Some(ms(&fs.time));
        for (family, value) in [
            (&mut self.fs_inodes_free, fs.inodes_free),
            (&mut self.fs_inodes_total, fs.inodes),
            (&mut self.fs_limit, fs.capacity_bytes),
            (&mut self.fs_usage, fs.used_bytes),
        ] {
            if let Some(v) = value {
                family.push(&with_device, v as f64, t);
            }
        }
    }

    /// A cgroup's block I/O per device (cAdvisor's `DiskIo`, "Read" and "Write"), the
    /// device named as cAdvisor names it (once per device and rendering); a device with
    /// no name is left out.
    fn block_io(&mut self, labels: &[(&str, &str); 6], io: &[BlockIo]) {
        for d in io {
            let name = self
                .device_names
                .entry((d.major, d.minor))
                .or_insert_with(|| block_device_name(&format!("{}:{}", d.major, d.minor)))
                .clone();
            let Some(device) = name else {
                continue;
            };
            let mut with_device: Vec<(&str, &str)> = labels.to_vec();
            with_device.insert(1, ("device", device.as_str()));
            for (family, value) in [
                (&mut self.fs_reads, d.reads),
                (&mut self.fs_writes, d.writes),
                (&mut self.fs_read_bytes, d.read_bytes),
                (&mut self.fs_write_bytes, d.write_bytes),
            ] {
                family.push(&with_device, value as f64, None);
            }
        }
    }

    /// One cgroup's CPU, memory and swap; `labels` are cAdvisor's, in its (sorted) order
    /// without `cpu`. The page faults read are the cgroup's and its descendants' (scope
    /// `hierarchy`); a container's cgroup has none, so they are its own too (`container`).
    /// The CFS families only for a cgroup with a CPU quota, as cAdvisor.
    fn usage(
        &mut self,
        labels: &[(&str, &str); 6],
        cpu: &Option<CpuStats>,
        memory: &Option<MemoryStats>,
        swap: &Option<SwapStats>,
        leaf: bool,
    ) {
        if let Some((v, t)) = cpu_seconds(cpu) {
            let mut with_cpu: Vec<(&str, &str)> = labels.to_vec();
            with_cpu.insert(1, ("cpu", "total"));
            self.cpu.push(&with_cpu, v, Some(t));
        }
        if let Some(c) = cpu
            && let Some(cfs) = &c.cfs
        {
            let t = Some(ms(&c.time));
            self.cfs_periods.push(labels, cfs.periods as f64, t);
            self.cfs_throttled_periods
                .push(labels, cfs.throttled_periods as f64, t);
            self.cfs_throttled_seconds
                .push(labels, cfs.throttled_ns as f64 / 1e9, t);
        }
        if let Some(s) = swap
            && let Some(v) = s.swap_usage_bytes
        {
            self.swap.push(labels, v as f64, Some(ms(&s.time)));
        }
        if let Some(m) = memory {
            let t = Some(ms(&m.time));
            if let Some(v) = m.working_set_bytes {
                self.working_set.push(labels, v as f64, t);
            }
            if let Some(v) = m.rss_bytes {
                self.rss.push(labels, v as f64, t);
            }
            if let Some(v) = m.cache_bytes {
                self.cache.push(labels, v as f64, t);
            }
            if let Some(v) = m.usage_bytes {
                self.usage.push(labels, v as f64, t);
            }
            if let Some(v) = m.oom_events {
                self.oom_events.push(labels, v as f64, t);
            }
            let scopes: &[&str] = if leaf {
                &["container", "hierarchy"]
            } else {
                &["hierarchy"]
            };
            for (kind, value) in [
                ("pgfault", m.page_faults),
                ("pgmajfault", m.major_page_faults),
            ] {
                let Some(v) = value else { continue };
                for scope in scopes {
                    let mut l: Vec<(&str, &str)> = labels.to_vec();
                    l.insert(1, ("failure_type", kind));
                    l.push(("scope", scope));
                    self.failures.push(&l, v as f64, t);
                }
            }
        }
    }

    fn container(&mut self, labels: &[(&str, &str); 6], c: &ContainerStats) {
        self.usage(labels, &c.cpu, &c.memory, &c.swap, true);
        self.start.push(labels, seconds(&c.start_time), None);
    }

    fn render(&self) -> String {
        let mut out = String::new();
        for family in [
            &self.cfs_periods,
            &self.cfs_throttled_periods,
            &self.cfs_throttled_seconds,
            &self.cpu,
            &self.cache,
            &self.rss,
            &self.swap,
            &self.working_set,
            &self.usage,
            &self.failures,
            &self.oom_events,
            &self.rx_bytes,
            &self.rx_errors,
            &self.rx_packets,
            &self.rx_dropped,
            &self.tx_bytes,
            &self.tx_errors,
            &self.tx_packets,
            &self.tx_dropped,
            &self.start,
            &self.fs_inodes_free,
            &self.fs_inodes_total,
            &self.fs_limit,
            &self.fs_usage,
            &self.fs_reads,
            &self.fs_read_bytes,
            &self.fs_writes,
            &self.fs_write_bytes,
            &self.machine_cpus,
            &self.machine_memory,
        ] {
            if !family.samples.is_empty() {
                render_family(family, &mut out);
            }
        }
        out
    }
}

pub fn render_cadvisor(c: &Collected) -> String {
    let mut m = Cadvisor::new();
    let node = &c.summary.node;
    let root = [
        ("container", ""),
        ("id", "/"),
        ("image", ""),
        ("name", ""),
        ("namespace", ""),
        ("pod", ""),
    ];
    m.usage(&root, &node.cpu, &node.memory, &None, false);
    // The root cgroup's filesystems: the node's root and, when it is another device,
    // the runtime's image filesystem.
    let root_device = device_of(Path::new("/"));
    if let (Some(fs), Some(device)) = (&node.fs, &root_device) {
        m.fs(&root, device, fs);
    }
    let image_device = c.image_fs_mountpoint.as_deref().and_then(device_of);
    if let (Some(fs), Some(device)) = (
        node.runtime.as_ref().and_then(|r| r.image_fs.as_ref()),
        &image_device,
    ) && image_device != root_device
    {
        m.fs(&root, device, fs);
    }
    if let Some(mem) = &node.memory
        && let (Some(available), Some(ws)) = (mem.available_bytes, mem.working_set_bytes)
    {
        m.machine_memory.push(&[], (available + ws) as f64, None);
    }
    m.machine_cpus
        .push(&[], nodeagent_config::machine::cpus() as f64, None);
    for pod in &c.summary.pods {
        let (ns, name, uid) = (
            pod.pod_ref.namespace.as_str(),
            pod.pod_ref.name.as_str(),
            pod.pod_ref.uid.as_str(),
        );
        let cgroup = c
            .pod_cgroups
            .get(uid)
            .map(String::as_str)
            .unwrap_or_default();
        let pod_labels = [
            ("container", ""),
            ("id", cgroup),
            ("image", ""),
            ("name", ""),
            ("namespace", ns),
            ("pod", name),
        ];
        m.usage(&pod_labels, &pod.cpu, &pod.memory, &pod.swap, false);
        for i in c.pod_interfaces.get(uid).into_iter().flatten() {
            let mut labels: Vec<(&str, &str)> = pod_labels.to_vec();
            labels.insert(3, ("interface", i.name.as_str()));
            for (family, v) in [
                (&mut m.rx_bytes, i.rx_bytes),
                (&mut m.tx_bytes, i.tx_bytes),
                (&mut m.rx_errors, i.rx_errors),
                (&mut m.tx_errors, i.tx_errors),
                (&mut m.rx_packets, i.rx_packets),
                (&mut m.rx_dropped, i.rx_dropped),
                (&mut m.tx_packets, i.tx_packets),
                (&mut m.tx_dropped, i.tx_dropped),
            ] {
                if let Some(v) = v {
                    family.push(&labels, v as f64, None);
                }
            }
        }
        for ctr in &pod.containers {
            let Some(meta) = c
                .containers
                .iter()
                .find(|x| x.pod.uid == uid && x.name == ctr.name)
            else {
                continue;
            };
            let labels = [
                ("container", ctr.name.as_str()),
                ("id", meta.cgroup.as_str()),
                ("image", meta.image.as_str()),
                ("name", meta.id.as_str()),
                ("namespace", ns),
                ("pod", name),
            ];
            m.container(&labels, ctr);
            m.block_io(&labels, &meta.block_io);
            // The container's writable layer, on the image filesystem.
            if let (Some(fs), Some(device)) = (&ctr.rootfs, &image_device) {
                m.fs(&labels, device, fs);
            }
        }
    }
    m.render()
}

pub async fn cadvisor(State(state): State<Arc<AppState>>) -> Response {
    match collect(&state, false).await {
        Ok(c) => text(render_cadvisor(&c)),
        Err(e) => {
            tracing::warn!(error = %e.message(), "cadvisor metrics: collecting stats failed");
            (
                axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                format!(
                    "Internal Error: failed to get the runtime's pods: {}",
                    e.message()
                ),
            )
                .into_response()
        }
    }
}

use axum::response::IntoResponse;
