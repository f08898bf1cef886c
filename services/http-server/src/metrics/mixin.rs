//! The oracle for kubernetes-mixin (kubernetes-monitoring/kubernetes-mixin): every kubelet
//! and cAdvisor series its alerts, recording rules and dashboards read that a unit test can
//! produce, with the labels they select or group by, checked against what `/metrics` and
//! `/metrics/cadvisor` serve: the exact name (no `_total` where upstream has none), the
//! type, and a series carrying the labels.
//!
//! `/metrics` is rendered as the route renders it (this process's registry, parsed and
//! merged, classic text); the families other services register (pleg, pod-sync, probe,
//! node-status, volume) live in `nodeagent_telemetry` and `nodeagent_config`, so they are touched
//! here as those services touch them. `/metrics/cadvisor` is rendered from a Summary
//! assembled from a planted cgroup tree, v2 and v1.
//!
//! Read by the mixin but not served yet, so not in the table: `kubelet_volume_stats_*` (PVCs are not
//! supported), `go_goroutines` (no Go runtime) and `kubelet_node_config_error` (upstream's
//! kubelet dropped it with dynamic kubelet configuration in 1.24,
//! kubernetes/kubernetes#106932).

use super::exposition::{self, Exposition, Family, Kind};
use super::resource::render_cadvisor;
use crate::stats::cgroup::Cgroups;
use crate::stats::collect::planted;
use crate::stats::host::parse_net_dev;
use std::path::Path;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Endpoint {
    Metrics,
    Cadvisor,
}

/// One series the mixin reads.
struct Read {
    name: &'static str,
    kind: Kind,
    /// Labels the mixin selects on or groups by (besides target labels such as
    /// `instance`, `job`, `cluster`, `metrics_path`, which the scrape adds).
    labels: &'static [&'static str],
    endpoint: Endpoint,
    /// Where the mixin reads it.
    mixin: &'static str,
}

use Endpoint::{Cadvisor, Metrics};

const CADVISOR_CONTAINER: &[&str] = &["container", "image", "namespace", "pod"];

/// The disk I/O series: the mixin's Storage IO panels select `container!=""` and a device
/// (`diskDeviceSelector`, checked on a real device by tests/tests/suite/stats.rs).
const CADVISOR_DISK: &[&str] = &["container", "device", "namespace", "pod"];

const MIXIN: &[Read] = &[
    Read {
        name: "kubelet_node_name",
        kind: Kind::Gauge,
        labels: &["node"],
        endpoint: Metrics,
        mixin: "alerts/kubelet.libsonnet KubeletTooManyPods, KubeNodeEviction, KubeletPodStartUpLatencyHigh; \
                rules/kubelet.libsonnet node_quantile:kubelet_pleg_relist_duration_seconds:histogram_quantile; \
                dashboards/kubelet.libsonnet \"Running Kubelets\"",
    },
    Read {
        name: "kubelet_running_pods",
        kind: Kind::Gauge,
        labels: &[],
        endpoint: Metrics,
        mixin: "alerts/kubelet.libsonnet KubeletTooManyPods; dashboards/kubelet.libsonnet \"Running Pods\"; \
                dashboards/resources/queries/nodes-overview.libsonnet podCount",
    },
    Read {
        name: "kubelet_running_containers",
        kind: Kind::Gauge,
        labels: &["container_state"],
        endpoint: Metrics,
        mixin: "dashboards/kubelet.libsonnet \"Running Containers\"",
    },
    Read {
        name: "kubelet_pleg_relist_duration_seconds",
        kind: Kind::Histogram,
        labels: &["le"],
        endpoint: Metrics,
        mixin: "rules/kubelet.libsonnet (alerts/kubelet.libsonnet KubeletPlegDurationHigh); \
                dashboards/kubelet.libsonnet \"PLEG relist rate/duration\"",
    },
    Read {
        name: "kubelet_pleg_relist_interval_seconds",
        kind: Kind::Histogram,
        labels: &["le"],
        endpoint: Metrics,
        mixin: "dashboards/kubelet.libsonnet \"PLEG relist interval\"",
    },
    Read {
        name: "kubelet_pod_worker_duration_seconds",
        kind: Kind::Histogram,
        labels: &["operation_type", "le"],
        endpoint: Metrics,
        mixin: "alerts/kubelet.libsonnet KubeletPodStartUpLatencyHigh; dashboards/kubelet.libsonnet \"Pod Start Duration\"",
    },
    Read {
        name: "kubelet_pod_start_duration_seconds",
        kind: Kind::Histogram,
        labels: &["le"],
        endpoint: Metrics,
        mixin: "dashboards/kubelet.libsonnet \"Pod Start Rate/Duration\"",
    },
    Read {
        name: "kubelet_runtime_operations_total",
        kind: Kind::Counter,
        labels: &["operation_type"],
        endpoint: Metrics,
        mixin: "dashboards/kubelet.libsonnet \"Operation Rate\"",
    },
    Read {
        name: "kubelet_runtime_operations_errors_total",
        kind: Kind::Counter,
        labels: &["operation_type"],
        endpoint: Metrics,
        mixin: "dashboards/kubelet.libsonnet \"Operation Error Rate\"",
    },
    Read {
        name: "kubelet_runtime_operations_duration_seconds",
        kind: Kind::Histogram,
        labels: &["operation_type", "le"],
        endpoint: Metrics,
        mixin: "dashboards/kubelet.libsonnet \"Operation Duration 99th quantile\"",
    },
    Read {
        name: "kubelet_cgroup_manager_duration_seconds",
        kind: Kind::Histogram,
        labels: &["operation_type", "le"],
        endpoint: Metrics,
        mixin: "dashboards/kubelet.libsonnet \"Cgroup manager operation rate\", \"Cgroup manager 99th quantile\"",
    },
    Read {
        name: "storage_operation_duration_seconds",
        kind: Kind::Histogram,
        labels: &["operation_name", "volume_plugin", "le"],
        endpoint: Metrics,
        mixin: "dashboards/kubelet.libsonnet \"Storage Operation Rate\", \"Storage Operation Duration 99th quantile\"",
    },
    Read {
        name: "storage_operation_errors_total",
        kind: Kind::Counter,
        labels: &["operation_name", "volume_plugin"],
        endpoint: Metrics,
        mixin: "dashboards/kubelet.libsonnet \"Storage Operation Error Rate\"",
    },
    Read {
        name: "rest_client_requests_total",
        kind: Kind::Counter,
        labels: &["code"],
        endpoint: Metrics,
        mixin: "dashboards/kubelet.libsonnet \"RPC Rate\"",
    },
    Read {
        // The dashboard also groups by `url`, a label client-go replaced by `host`.
        name: "rest_client_request_duration_seconds",
        kind: Kind::Histogram,
        labels: &["verb", "le"],
        endpoint: Metrics,
        mixin: "dashboards/kubelet.libsonnet \"Request duration 99th quantile\"",
    },
    Read {
        name: "volume_manager_total_volumes",
        kind: Kind::Gauge,
        labels: &["state"],
        endpoint: Metrics,
        mixin: "dashboards/kubelet.libsonnet \"Actual Volume Count\", \"Desired Volume Count\"",
    },
    Read {
        name: "kubelet_evictions",
        kind: Kind::Counter,
        labels: &["eviction_signal"],
        endpoint: Metrics,
        mixin: "alerts/kubelet.libsonnet KubeNodeEviction",
    },
    Read {
        name: "kubelet_certificate_manager_client_ttl_seconds",
        kind: Kind::Gauge,
        labels: &[],
        endpoint: Metrics,
        mixin: "alerts/kubelet.libsonnet KubeletClientCertificateExpiration",
    },
    Read {
        name: "kubelet_certificate_manager_server_ttl_seconds",
        kind: Kind::Gauge,
        labels: &[],
        endpoint: Metrics,
        mixin: "alerts/kubelet.libsonnet KubeletServerCertificateExpiration",
    },
    Read {
        name: "kubelet_certificate_manager_client_expiration_renew_errors",
        kind: Kind::Counter,
        labels: &[],
        endpoint: Metrics,
        mixin: "alerts/kubelet.libsonnet KubeletClientCertificateRenewalErrors",
    },
    Read {
        name: "kubelet_server_expiration_renew_errors",
        kind: Kind::Counter,
        labels: &[],
        endpoint: Metrics,
        mixin: "alerts/kubelet.libsonnet KubeletServerCertificateRenewalErrors",
    },
    Read {
        name: "process_resident_memory_bytes",
        kind: Kind::Gauge,
        labels: &[],
        endpoint: Metrics,
        mixin: "dashboards/kubelet.libsonnet \"Memory\"",
    },
    Read {
        name: "process_cpu_seconds_total",
        kind: Kind::Counter,
        labels: &[],
        endpoint: Metrics,
        mixin: "dashboards/kubelet.libsonnet \"CPU usage\"",
    },
    Read {
        name: "kubernetes_build_info",
        kind: Kind::Gauge,
        labels: &["git_version"],
        endpoint: Metrics,
        mixin: "alerts/system_alerts.libsonnet KubeVersionMismatch",
    },
    Read {
        name: "container_cpu_usage_seconds_total",
        kind: Kind::Counter,
        labels: CADVISOR_CONTAINER,
        endpoint: Cadvisor,
        mixin: "rules/apps.libsonnet node_namespace_pod_container:container_cpu_usage_seconds_total:sum_rate5m/sum_irate",
    },
    Read {
        name: "container_memory_working_set_bytes",
        kind: Kind::Gauge,
        labels: CADVISOR_CONTAINER,
        endpoint: Cadvisor,
        mixin: "rules/apps.libsonnet node_namespace_pod_container:container_memory_working_set_bytes",
    },
    Read {
        name: "container_memory_rss",
        kind: Kind::Gauge,
        labels: CADVISOR_CONTAINER,
        endpoint: Cadvisor,
        mixin: "rules/apps.libsonnet node_namespace_pod_container:container_memory_rss",
    },
    Read {
        name: "container_memory_cache",
        kind: Kind::Gauge,
        labels: CADVISOR_CONTAINER,
        endpoint: Cadvisor,
        mixin: "rules/apps.libsonnet node_namespace_pod_container:container_memory_cache; \
                dashboards/resources/queries/{namespace,node,pod}.libsonnet",
    },
    Read {
        name: "container_memory_swap",
        kind: Kind::Gauge,
        labels: CADVISOR_CONTAINER,
        endpoint: Cadvisor,
        mixin: "rules/apps.libsonnet node_namespace_pod_container:container_memory_swap; \
                dashboards/resources/queries/{namespace,node,pod}.libsonnet",
    },
    Read {
        name: "container_cpu_cfs_periods_total",
        kind: Kind::Counter,
        labels: &["container", "namespace", "pod"],
        endpoint: Cadvisor,
        mixin: "alerts/resource_alerts.libsonnet CPUThrottlingHigh; dashboards/resources/queries/{pod,cluster}.libsonnet cpuThrottling",
    },
    Read {
        name: "container_cpu_cfs_throttled_periods_total",
        kind: Kind::Counter,
        labels: &["container", "namespace", "pod"],
        endpoint: Cadvisor,
        mixin: "alerts/resource_alerts.libsonnet CPUThrottlingHigh; dashboards/resources/queries/{pod,cluster}.libsonnet cpuThrottling",
    },
    Read {
        name: "container_cpu_cfs_throttled_seconds_total",
        kind: Kind::Counter,
        labels: &["namespace"],
        endpoint: Cadvisor,
        mixin: "dashboards/resources/queries/cluster.libsonnet cpuThrottledSeconds",
    },
    Read {
        name: "container_network_receive_bytes_total",
        kind: Kind::Counter,
        labels: &["namespace", "pod"],
        endpoint: Cadvisor,
        mixin: "dashboards/resources/queries/{cluster,namespace,pod,workload}.libsonnet; dashboards/network-usage/queries/*.libsonnet",
    },
    Read {
        name: "container_network_transmit_bytes_total",
        kind: Kind::Counter,
        labels: &["namespace", "pod"],
        endpoint: Cadvisor,
        mixin: "dashboards/resources/queries/{cluster,namespace,pod,workload}.libsonnet; dashboards/network-usage/queries/*.libsonnet",
    },
    Read {
        name: "container_network_receive_packets_total",
        kind: Kind::Counter,
        labels: &["namespace", "pod"],
        endpoint: Cadvisor,
        mixin: "dashboards/resources/queries/{cluster,namespace,pod,workload}.libsonnet; dashboards/network-usage/queries/*.libsonnet",
    },
    Read {
        name: "container_network_transmit_packets_total",
        kind: Kind::Counter,
        labels: &["namespace", "pod"],
        endpoint: Cadvisor,
        mixin: "dashboards/resources/queries/{cluster,namespace,pod,workload}.libsonnet; dashboards/network-usage/queries/*.libsonnet",
    },
    Read {
        name: "container_network_receive_packets_dropped_total",
        kind: Kind::Counter,
        labels: &["namespace", "pod"],
        endpoint: Cadvisor,
        mixin: "dashboards/resources/queries/{cluster,namespace,pod,workload}.libsonnet; dashboards/network-usage/queries/*.libsonnet",
    },
    Read {
        name: "container_network_transmit_packets_dropped_total",
        kind: Kind::Counter,
        labels: &["namespace", "pod"],
        endpoint: Cadvisor,
        mixin: "dashboards/resources/queries/{cluster,namespace,pod,workload}.libsonnet; dashboards/network-usage/queries/*.libsonnet",
    },
    Read {
        name: "container_fs_reads_total",
        kind: Kind::Counter,
        labels: CADVISOR_DISK,
        endpoint: Cadvisor,
        mixin: "dashboards/resources/{cluster,namespace,pod,workload}.libsonnet storageIOColumns and \
                \"IOPS Reads\" (container!=\"\", device=~diskDeviceSelector)",
    },
    Read {
        name: "container_fs_writes_total",
        kind: Kind::Counter,
        labels: CADVISOR_DISK,
        endpoint: Cadvisor,
        mixin: "dashboards/resources/{cluster,namespace,pod,workload}.libsonnet storageIOColumns and \
                \"IOPS Writes\" (container!=\"\", device=~diskDeviceSelector)",
    },
    Read {
        name: "container_fs_reads_bytes_total",
        kind: Kind::Counter,
        labels: CADVISOR_DISK,
        endpoint: Cadvisor,
        mixin: "dashboards/resources/{cluster,namespace,pod,workload}.libsonnet storageIOColumns and \
                \"Throughput Read\" (container!=\"\", device=~diskDeviceSelector)",
    },
    Read {
        name: "container_fs_writes_bytes_total",
        kind: Kind::Counter,
        labels: CADVISOR_DISK,
        endpoint: Cadvisor,
        mixin: "dashboards/resources/{cluster,namespace,pod,workload}.libsonnet storageIOColumns and \
                \"Throughput Write\" (container!=\"\", device=~diskDeviceSelector)",
    },
];

fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Counter => "counter",
        Kind::Gauge => "gauge",
        Kind::Histogram => "histogram",
        Kind::Summary => "summary",
        Kind::Untyped => "untyped",
    }
}

/// Checks every read of `endpoint` against `text`; returns what is wrong.
fn check(endpoint: Endpoint, text: &str) -> Vec<String> {
    let families: Vec<Family> = match exposition::parse(text) {
        Ok(f) => f,
        Err(e) => return vec![format!("unparseable: {e}")],
    };
    let mut wrong = Vec::new();
    for read in MIXIN.iter().filter(|r| r.endpoint == endpoint) {
        let why = |what: String| format!("{} ({}): {what}", read.name, read.mixin);
        // The exact name and type, as served.
        let type_line = format!("# TYPE {} {}\n", read.name, kind_name(read.kind));
        if !text.contains(&type_line) {
            wrong.push(why(format!("no {type_line:?}")));
            continue;
        }
        let sample_name = match read.kind {
            Kind::Histogram => format!("{}_bucket", read.name),
            _ => read.name.to_string(),
        };
        let Some(family) = families.iter().find(|f| f.name == read.name) else {
            wrong.push(why("no family".into()));
            continue;
        };
        // A series with every label the mixin reads; on cAdvisor's container series the
        // mixin also filters `container!=""` and `image!=""`, so those must be set.
        let labelled = family.samples.iter().any(|s| {
            s.name == sample_name
                && read.labels.iter().all(|l| {
                    s.labels
                        .iter()
                        .any(|(k, v)| k == l && (endpoint == Metrics || !v.is_empty()))
                })
        });
        if !labelled {
            wrong.push(why(format!(
                "no {sample_name} series with labels {:?}",
                read.labels
            )));
        }
        if read.kind == Kind::Counter
            && !read.name.ends_with("_total")
            && text.contains(&format!("{}_total", read.name))
        {
            wrong.push(why("also served with _total".into()));
        }
    }
    wrong
}

/// `/metrics` as the route renders it, after touching every family the way the services
/// that own them do.
fn render_metrics() -> String {
    use nodeagent_config::certificate::{Kind as CertKind, Metrics as CertMetrics};
    use nodeagent_telemetry::metrics::{self, kubelet};
    metrics::init_process_metrics("http-server");
    kubelet::set_node_name("node-a");
    kubelet::set_build_info();
    kubelet::RUNNING_PODS.set(1);
    kubelet::RUNNING_CONTAINERS
        .get_or_create(&vec![("container_state", "running".into())])
        .set(1);
    kubelet::PLEG_RELIST_DURATION.observe(0.01);
    kubelet::PLEG_RELIST_INTERVAL.observe(1.0);
    kubelet::POD_WORKER_DURATION
        .get_or_create(&vec![("operation_type", "sync".into())])
        .observe(0.2);
    kubelet::POD_START_DURATION
        .get_or_create(&Vec::new())
        .observe(2.0);
    kubelet::record_runtime_operation("list_podsandbox", 0.01, true);
    kubelet::record_eviction("memory.available");
    kubelet::record_cgroup_operation("create", 0.01);
    kubelet::record_rest_request("GET", "127.0.0.1:6443", Some(200), 0.01);
    kubelet::record_storage_operation("kubernetes.io/configmap", "volume_mount", 0.01, false);
    kubelet::set_volume_counts(&[("kubernetes.io/configmap".to_string(), (1, 0))].into());
    let not_after = std::time::SystemTime::now() + std::time::Duration::from_secs(3600);
    for kind in [CertKind::Client, CertKind::Serving] {
        let m = CertMetrics::get(kind);
        m.ttl.set(not_after);
        // A counter at 0 is served (upstream registers it at 0 too).
        let _ = m.renew_errors.get();
    }
    let mut all = Exposition::default();
    let refused = all.merge(exposition::parse(&metrics::encode()).expect("parses"));
    assert!(refused.is_empty(), "{refused:?}");
    all.render()
}

const NET_DEV: &str = "Inter-|   Receive                                                |  Transmit\n face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    lo:  100 1 0 0 0 0 0 0 100 1 0 0 0 0 0 0\n  eth0: 2000 20 3 5 0 0 0 0 1000 10 4 6 0 0 0 0\n";

fn write(root: &Path, rel: &str, text: &str) {
    let path = root.join(rel);
    std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
    std::fs::write(path, text).expect("write");
}

const POD: &str = "kubepods/burstable/podu1";

/// The planted I/O's device: a block device of this machine (`MAJ:MIN` and its name), as
/// /sys/dev/block lists them, for the device label is named from there.
fn disk() -> (String, String) {
    let mut found: Vec<(String, String)> = std::fs::read_dir("/sys/dev/block")
        .expect("/sys/dev/block")
        .flatten()
        .filter_map(|e| {
            let numbers = e.file_name().to_string_lossy().into_owned();
            let name = crate::metrics::devices::block_device_name(&numbers)?;
            Some((numbers, name))
        })
        .collect();
    found.sort();
    found
        .into_iter()
        .next()
        .expect("a block device in /sys/dev/block")
}

/// A v2 tree: the pod and its container `c1`, both under a CPU quota, with swap.
fn plant_v2(root: &Path) {
    write(root, "cgroup.controllers", "cpu memory pids\n");
    for cg in [POD.to_string(), format!("{POD}/c1")] {
        write(
            root,
            &format!("{cg}/cpu.stat"),
            "usage_usec 2000000\nuser_usec 1500000\nsystem_usec 500000\nnr_periods 100\nnr_throttled 25\nthrottled_usec 3500000\n",
        );
        write(root, &format!("{cg}/cpu.max"), "50000 100000\n");
        write(root, &format!("{cg}/memory.current"), "10485760\n");
        write(root, &format!("{cg}/memory.max"), "max\n");
        write(
            root,
            &format!("{cg}/memory.stat"),
            "anon 6291456\nfile 4194304\ninactive_file 1048576\npgfault 10\npgmajfault 1\n",
        );
        write(root, &format!("{cg}/memory.swap.current"), "4096\n");
        write(root, &format!("{cg}/memory.swap.max"), "max\n");
        write(root, &format!("{cg}/memory.events"), "oom 0\noom_kill 0\n");
        write(
            root,
            &format!("{cg}/io.stat"),
            &format!(
                "{} rbytes=4096000 wbytes=8192 rios=1000 wios=2 dbytes=0 dios=0\n",
                disk().0
            ),
        );
    }
}

/// The same on v1 (cpu, cpuacct, memory and blkio hierarchies; memsw for swap).
fn plant_v1(root: &Path) {
    let d = disk().0;
    for cg in [POD.to_string(), format!("{POD}/c1")] {
        write(root, &format!("cpuacct/{cg}/cpuacct.usage"), "2000000000\n");
        write(root, &format!("cpu/{cg}/cpu.cfs_quota_us"), "50000\n");
        write(
            root,
            &format!("cpu/{cg}/cpu.stat"),
            "nr_periods 100\nnr_throttled 25\nthrottled_time 3500000000\n",
        );
        write(
            root,
            &format!("memory/{cg}/memory.usage_in_bytes"),
            "10485760\n",
        );
        write(
            root,
            &format!("memory/{cg}/memory.limit_in_bytes"),
            "9223372036854771712\n",
        );
        write(
            root,
            &format!("memory/{cg}/memory.stat"),
            "cache 4194304\nrss 6291456\ntotal_cache 4194304\ntotal_rss 6291456\ntotal_inactive_file 1048576\ntotal_pgfault 10\ntotal_pgmajfault 1\n",
        );
        write(
            root,
            &format!("memory/{cg}/memory.memsw.usage_in_bytes"),
            "10489856\n",
        );
        write(
            root,
            &format!("memory/{cg}/memory.memsw.limit_in_bytes"),
            "9223372036854771712\n",
        );
        write(
            root,
            &format!("blkio/{cg}/blkio.throttle.io_service_bytes"),
            &format!("{d} Read 4096000\n{d} Write 8192\n{d} Total 4104192\nTotal 4104192\n"),
        );
        write(
            root,
            &format!("blkio/{cg}/blkio.throttle.io_serviced"),
            &format!("{d} Read 1000\n{d} Write 2\n{d} Total 1002\nTotal 1002\n"),
        );
    }
}

fn render_cadvisor_from(plant: fn(&Path)) -> String {
    let tree = tempfile::tempdir().expect("tempdir");
    plant(tree.path());
    let dir = tempfile::tempdir().expect("tempdir");
    let cgroups = Cgroups::at(tree.path().to_path_buf());
    let mut collected = planted(&cgroups, dir.path());
    // The sandbox's network namespace, as read from /proc/<pid>/net/dev.
    collected
        .pod_interfaces
        .insert("u1".into(), parse_net_dev(NET_DEV));
    render_cadvisor(&collected)
}

#[test]
fn metrics_serves_what_the_mixin_reads() {
    let text = render_metrics();
    let wrong = check(Metrics, &text);
    assert!(wrong.is_empty(), "{wrong:#?}\n{text}");
    assert!(
        text.contains("kubelet_node_name{node=\"node-a\"} 1\n"),
        "{text}"
    );
    assert!(
        text.contains("kubelet_server_expiration_renew_errors 0\n"),
        "{text}"
    );
    assert!(
        text.contains("kubelet_certificate_manager_client_expiration_renew_errors 0\n"),
        "{text}"
    );
    assert!(
        text.contains("kubelet_evictions{eviction_signal=\"memory.available\"} "),
        "{text}"
    );
}

#[test]
fn cadvisor_serves_what_the_mixin_reads_on_v2_and_v1() {
    for (version, plant) in [("v2", plant_v2 as fn(&Path)), ("v1", plant_v1)] {
        let text = render_cadvisor_from(plant);
        let wrong = check(Cadvisor, &text);
        assert!(wrong.is_empty(), "{version}: {wrong:#?}\n{text}");
        // The values read, on the container's series (labels in cAdvisor's order).
        let ctr = "container=\"app\",id=\"/kubepods/burstable/podu1/c1\",image=\"registry.example/app:1\",name=\"c1\",namespace=\"default\",pod=\"web-0\"";
        for (name, value) in [
            ("container_cpu_cfs_periods_total", "100"),
            ("container_cpu_cfs_throttled_periods_total", "25"),
            ("container_cpu_cfs_throttled_seconds_total", "3.5"),
            ("container_memory_cache", "4194304"),
            ("container_memory_swap", "4096"),
        ] {
            assert!(
                text.contains(&format!("{name}{{{ctr}}} {value} ")),
                "{version}: {name} {value}\n{text}"
            );
        }
        // Disk I/O, on the container's series with the device named as cAdvisor names it.
        let io = format!(
            "container=\"app\",device=\"{}\",id=\"/kubepods/burstable/podu1/c1\",image=\"registry.example/app:1\",name=\"c1\",namespace=\"default\",pod=\"web-0\"",
            disk().1
        );
        for (name, value) in [
            ("container_fs_reads_bytes_total", "4096000"),
            ("container_fs_writes_bytes_total", "8192"),
            ("container_fs_reads_total", "1000"),
            ("container_fs_writes_total", "2"),
        ] {
            assert!(
                text.contains(&format!("{name}{{{io}}} {value}\n")),
                "{version}: {name} {value}\n{text}"
            );
        }
        let pod = "container=\"\",id=\"/kubepods/burstable/podu1\",image=\"\",interface=\"eth0\",name=\"\",namespace=\"default\",pod=\"web-0\"";
        for (name, value) in [
            ("container_network_receive_packets_total", "20"),
            ("container_network_receive_packets_dropped_total", "5"),
            ("container_network_transmit_packets_total", "10"),
            ("container_network_transmit_packets_dropped_total", "6"),
        ] {
            assert!(
                text.contains(&format!("{name}{{{pod}}} {value}\n")),
                "{version}: {name} {value}\n{text}"
            );
        }
    }
}

/// No quota, no CFS series (cAdvisor's `condition: Cpu.Quota != 0`).
#[test]
fn cadvisor_leaves_cfs_out_without_a_quota() {
    let text = render_cadvisor_from(|root| {
        plant_v2(root);
        for cg in [POD.to_string(), format!("{POD}/c1")] {
            write(root, &format!("{cg}/cpu.max"), "max 100000\n");
        }
    });
    assert!(
        text.contains("container_cpu_usage_seconds_total{"),
        "{text}"
    );
    assert!(!text.contains("container_cpu_cfs_"), "{text}");
}
