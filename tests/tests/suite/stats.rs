//! The Summary API, `/runningpods/` and the metrics endpoints on the kubelet port, against
//! real containers: values that move when a container burns CPU and fills memory, upstream's
//! JSON shapes, and every metrics body parsed by a strict text-format parser.
//! Needs root and the containerd that `deploy/runtime/setup.sh` starts.

use crate::prom;

use nodeagent_tests::{Node, NodeOptions, eventually, require_runtime};
use serde_json::Value;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(90);

/// One container spins (with a CPU limit), one writes 40 MiB into /dev/shm (a tmpfs
/// charged to its memory cgroup) and sleeps.
const BURNER: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: burner
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: cpu
    image: busybox:1.36
    command: ["sh", "-c", "while :; do :; done"]
    resources:
      limits:
        cpu: 500m
  - name: mem
    image: busybox:1.36
    command: ["sh", "-c", "dd if=/dev/zero of=/dev/shm/fill bs=1M count=40 && echo filled && sleep 3600"]
"#;

async fn get_json(node: &Node, path: &str) -> Result<Value, String> {
    let r = node.api.get(path).await?;
    if r.status != 200 {
        return Err(format!("{path}: {} {}", r.status, r.text()));
    }
    serde_json::from_slice(&r.body).map_err(|e| format!("{path}: {e}: {}", r.text()))
}

async fn get_text(node: &Node, path: &str) -> String {
    let r = node.api.get(path).await.expect(path);
    assert_eq!(r.status, 200, "{path}: {}", r.text());
    let content_type = r
        .headers
        .get("content-type")
        .map(|v| v.to_str().unwrap_or_default().to_string());
    assert_eq!(
        content_type.as_deref(),
        Some("text/plain; version=0.0.4; charset=utf-8"),
        "{path}"
    );
    r.text()
}

fn pod<'a>(summary: &'a Value, name: &str) -> Option<&'a Value> {
    summary["pods"]
        .as_array()?
        .iter()
        .find(|p| p["podRef"]["name"] == name)
}

fn container<'a>(pod: &'a Value, name: &str) -> Option<&'a Value> {
    pod["containers"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == name)
}

fn u64_at(v: &Value, pointer: &str) -> Option<u64> {
    v.pointer(pointer)?.as_u64()
}

/// `node.systemContainers` names the node agent, the runtime and the pods, as upstream's
/// SystemContainer* constants; the first two measured (from a cgroup of their own, or the
/// processes' sum), all with a start time.
fn assert_system_containers(node: &Value) {
    let system = node["systemContainers"]
        .as_array()
        .unwrap_or_else(|| panic!("no systemContainers: {node}"));
    let find = |name: &str| {
        system
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no {name} in systemContainers: {system:?}"))
    };
    for name in ["kubelet", "runtime", "pods"] {
        let c = find(name);
        assert!(
            c["startTime"].as_str().is_some_and(|t| t.ends_with('Z')),
            "{c}"
        );
        assert!(c.get("rootfs").is_none() && c.get("logs").is_none(), "{c}");
    }
    for name in ["kubelet", "runtime"] {
        let c = find(name);
        assert!(
            u64_at(c, "/cpu/usageCoreNanoSeconds").is_some_and(|v| v > 0),
            "{name}: {c}"
        );
        assert!(
            u64_at(c, "/memory/workingSetBytes").is_some_and(|v| v > 0),
            "{name}: {c}"
        );
    }
}

/// SwapTotal in /proc/meminfo, in bytes.
fn swap_total() -> u64 {
    let info = std::fs::read_to_string("/proc/meminfo").expect("/proc/meminfo");
    info.lines()
        .find_map(|l| l.strip_prefix("SwapTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .expect("SwapTotal")
        * 1024
}

/// `node.swap` exactly when the host has swap; a pod's and its containers' swap exactly
/// when the pods' cgroup accounts it (v2 memory.swap.current, v1 memsw).
fn assert_swap(node: &Value, pod: &Value) {
    let total = swap_total();
    match node.get("swap") {
        Some(swap) => {
            assert!(total > 0, "node.swap without swap: {swap}");
            let used = u64_at(swap, "/swapUsageBytes").expect("swapUsageBytes");
            let available = u64_at(swap, "/swapAvailableBytes").expect("swapAvailableBytes");
            assert_eq!(used + available, total, "{swap}");
            assert!(swap["time"].is_string(), "{swap}");
        }
        None => assert_eq!(total, 0, "no node.swap with SwapTotal {total}: {node}"),
    }
    let accounted = [
        "/sys/fs/cgroup/kubepods/memory.swap.current",
        "/sys/fs/cgroup/memory/kubepods/memory.memsw.usage_in_bytes",
    ]
    .iter()
    .any(|f| std::path::Path::new(f).exists());
    let pods = node["systemContainers"]
        .as_array()
        .and_then(|s| s.iter().find(|c| c["name"] == "pods"))
        .expect("the pods system container");
    let mut with_swap = vec![("pods", pods), ("the pod", pod)];
    for c in pod["containers"].as_array().expect("containers") {
        with_swap.push(("a container", c));
    }
    for (what, v) in with_swap {
        assert_eq!(
            u64_at(v, "/swap/swapUsageBytes").is_some(),
            accounted,
            "{what}'s swap (accounted by the cgroup: {accounted}): {v}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn summary_moves_when_a_container_burns_cpu_and_fills_memory() {
    if !require_runtime("stats summary") {
        return;
    }
    let node = Node::start("stats_summary", NodeOptions::default()).await;
    node.write_manifest("burner.yaml", BURNER);
    let pod_name = node.pod_name("burner");

    // usageNanoCores needs two samples: asking again until it shows the spinning
    // container near its 0.5 CPU limit.
    let summary = eventually(
        "the cpu container busy in the summary",
        DEADLINE,
        || async {
            let s = get_json(&node, "/stats/summary").await?;
            let p = pod(&s, &pod_name).ok_or("no burner pod yet")?;
            let cpu = container(p, "cpu").ok_or("no cpu container yet")?;
            let cores = u64_at(cpu, "/cpu/usageNanoCores").ok_or("no usageNanoCores yet")?;
            (cores > 200_000_000)
                .then_some(s.clone())
                .ok_or_else(|| format!("usageNanoCores {cores}"))
        },
    )
    .await;
    let p = pod(&summary, &pod_name).unwrap();
    let cpu = container(p, "cpu").unwrap();
    // A 500m limit: never much more than half a core.
    let cores = u64_at(cpu, "/cpu/usageNanoCores").unwrap();
    assert!(cores < 800_000_000, "{cpu}");
    let used = u64_at(cpu, "/cpu/usageCoreNanoSeconds").unwrap();

    // Memory: the 40 MiB in /dev/shm shows in the container's and the pod's working set.
    let summary = eventually("the mem container's working set", DEADLINE, || async {
        let s = get_json(&node, "/stats/summary").await?;
        let p = pod(&s, &pod_name).ok_or("no pod")?;
        let ws = container(p, "mem")
            .and_then(|c| u64_at(c, "/memory/workingSetBytes"))
            .ok_or("no working set")?;
        // The CFS quota may pause the spinner between two close reads: wait for growth.
        let cpu = container(p, "cpu")
            .and_then(|c| u64_at(c, "/cpu/usageCoreNanoSeconds"))
            .ok_or("no cpu")?;
        (ws >= 40 << 20 && cpu > used)
            .then_some(s.clone())
            .ok_or_else(|| format!("workingSetBytes {ws}, CPU time {used} then {cpu}"))
    })
    .await;
    let p = pod(&summary, &pod_name).unwrap();
    let cpu_later = u64_at(container(p, "cpu").unwrap(), "/cpu/usageCoreNanoSeconds").unwrap();
    assert!(cpu_later > used, "CPU time went from {used} to {cpu_later}");
    assert!(
        u64_at(p, "/memory/workingSetBytes").unwrap() >= 40 << 20,
        "{p}"
    );
    assert!(
        u64_at(p, "/cpu/usageCoreNanoSeconds").unwrap() >= cpu_later,
        "{p}"
    );

    // Shapes as upstream.
    let n = &summary["node"];
    assert_eq!(n["nodeName"], node.name.as_str(), "{n}");
    assert!(
        n["startTime"].as_str().is_some_and(|t| t.ends_with('Z')),
        "{n}"
    );
    for pointer in [
        "/cpu/usageCoreNanoSeconds",
        "/memory/workingSetBytes",
        "/memory/usageBytes",
        "/memory/availableBytes",
        "/fs/capacityBytes",
        "/fs/availableBytes",
        "/fs/inodes",
        "/runtime/imageFs/usedBytes",
        "/runtime/imageFs/capacityBytes",
        "/rlimit/maxpid",
        "/rlimit/curproc",
    ] {
        assert!(u64_at(n, pointer).is_some(), "node{pointer} missing: {n}");
    }
    assert!(u64_at(n, "/cpu/usageNanoCores").is_some(), "{n}");
    assert!(n["network"]["interfaces"].is_array(), "{n}");
    assert_eq!(p["podRef"]["namespace"], "default");
    assert!(p["podRef"]["uid"].as_str().is_some_and(|u| !u.is_empty()));
    assert!(p["startTime"].is_string(), "{p}");
    assert_eq!(p["network"]["name"], "eth0", "{p}");
    assert!(u64_at(p, "/network/rxBytes").is_some(), "{p}");
    assert!(
        u64_at(p, "/process_stats/process_count").unwrap() >= 2,
        "{p}"
    );
    assert!(u64_at(p, "/ephemeral-storage/usedBytes").is_some(), "{p}");
    let mem = container(p, "mem").unwrap();
    for pointer in [
        "/memory/rssBytes",
        "/memory/pageFaults",
        "/memory/usageBytes",
        "/rootfs/usedBytes",
        "/rootfs/capacityBytes",
        "/logs/usedBytes",
    ] {
        assert!(
            u64_at(mem, pointer).is_some(),
            "container{pointer} missing: {mem}"
        );
    }
    assert!(mem["startTime"].is_string(), "{mem}");
    assert_system_containers(n);
    assert_swap(n, p);

    // only_cpu_and_memory: CPU and memory only, as metrics-server asks.
    let small = get_json(&node, "/stats/summary?only_cpu_and_memory=true")
        .await
        .unwrap();
    assert!(
        small["node"]["cpu"].is_object() && small["node"]["memory"].is_object(),
        "{small}"
    );
    for absent in ["fs", "network", "runtime", "rlimit"] {
        assert!(
            small["node"].get(absent).is_none(),
            "node.{absent}: {small}"
        );
    }
    let sp = pod(&small, &pod_name).expect("pod in the small summary");
    assert!(sp["cpu"].is_object() && sp["memory"].is_object(), "{sp}");
    assert!(
        sp.get("network").is_none() && sp.get("ephemeral-storage").is_none(),
        "{sp}"
    );
    assert!(
        container(sp, "cpu").is_some_and(|c| c.get("rootfs").is_none()),
        "{sp}"
    );
    // System containers and swap are CPU-and-memory stats: upstream keeps them here too.
    assert_system_containers(&small["node"]);
    assert_swap(&small["node"], sp);

    // /metrics/resource and /metrics/cadvisor: the same numbers under upstream's names.
    let resource =
        prom::parse(&get_text(&node, "/metrics/resource").await).expect("resource metrics parse");
    let series = |f: &str| {
        resource
            .get(f)
            .map(|f| f.samples.clone())
            .unwrap_or_default()
    };
    assert!(series("node_cpu_usage_seconds_total")[0].value > 0.0);
    assert_eq!(series("resource_scrape_error")[0].value, 0.0);
    let burning = series("container_cpu_usage_seconds_total")
        .into_iter()
        .find(|s| s.labels.get("pod") == Some(&pod_name) && s.labels["container"] == "cpu")
        .expect("the cpu container's series");
    assert_eq!(burning.labels["namespace"], "default");
    assert!(burning.value > 0.0);
    assert!(
        series("pod_memory_working_set_bytes")
            .iter()
            .any(|s| s.labels.get("pod") == Some(&pod_name) && s.value >= (40 << 20) as f64)
    );
    assert!(
        series("container_start_time_seconds")
            .iter()
            .any(|s| s.labels.get("pod") == Some(&pod_name))
    );

    let cadvisor =
        prom::parse(&get_text(&node, "/metrics/cadvisor").await).expect("cadvisor metrics parse");
    let rss = &cadvisor["container_memory_rss"].samples;
    let mem_series = rss
        .iter()
        .find(|s| s.labels.get("pod") == Some(&pod_name) && s.labels["container"] == "mem")
        .expect("the mem container's rss");
    for label in ["id", "image", "name", "namespace"] {
        assert!(
            mem_series.labels.get(label).is_some_and(|v| !v.is_empty()),
            "{label}: {mem_series:?}"
        );
    }
    assert!(
        cadvisor["container_cpu_usage_seconds_total"]
            .samples
            .iter()
            .any(|s| s.labels.get("id").map(String::as_str) == Some("/")
                && s.labels["cpu"] == "total")
    );
    // Filesystems, each under its device: the node's root under id "/", and the mem
    // container's writable layer on the image filesystem.
    let fs_usage = &cadvisor["container_fs_usage_bytes"].samples;
    let root_fs = fs_usage
        .iter()
        .find(|s| s.labels.get("id").map(String::as_str) == Some("/"))
        .expect("the root filesystem's usage");
    assert!(
        root_fs.labels.get("device").is_some_and(|d| !d.is_empty()) && root_fs.value > 0.0,
        "{root_fs:?}"
    );
    let layer = fs_usage
        .iter()
        .find(|s| s.labels.get("pod") == Some(&pod_name) && s.labels["container"] == "mem")
        .expect("the mem container's writable layer");
    assert!(
        layer.labels.get("device").is_some_and(|d| !d.is_empty()),
        "{layer:?}"
    );
    for family in [
        "container_fs_limit_bytes",
        "container_fs_inodes_total",
        "container_fs_inodes_free",
    ] {
        assert!(
            cadvisor[family]
                .samples
                .iter()
                .any(|s| s.labels.get("pod") == Some(&pod_name) && s.value > 0.0),
            "{family}"
        );
    }
    // The mem container faulted its pages in: its page faults, in both scopes (a
    // container's cgroup has no children), and the machine's cores.
    let faults = &cadvisor["container_memory_failures_total"].samples;
    for scope in ["container", "hierarchy"] {
        let fault = faults
            .iter()
            .find(|s| {
                s.labels.get("pod") == Some(&pod_name)
                    && s.labels["container"] == "mem"
                    && s.labels["failure_type"] == "pgfault"
                    && s.labels["scope"] == scope
            })
            .unwrap_or_else(|| panic!("the mem container's page faults, scope {scope}"));
        assert!(fault.value > 0.0, "{fault:?}");
    }
    // What kubernetes-mixin reads besides (cAdvisor's names, google/cadvisor
    // metrics/prometheus.go): CFS throttling for the container under a CPU limit only
    // (CPUThrottlingHigh), the page cache that /dev/shm is charged as (rules/apps.libsonnet).
    let of = |family: &str, container: &str| {
        cadvisor
            .get(family)
            .and_then(|f| {
                f.samples.iter().find(|s| {
                    s.labels.get("pod") == Some(&pod_name) && s.labels["container"] == container
                })
            })
            .map(|s| s.value)
    };
    let periods = of("container_cpu_cfs_periods_total", "cpu").expect("cfs periods of cpu");
    let throttled =
        of("container_cpu_cfs_throttled_periods_total", "cpu").expect("throttled periods of cpu");
    assert!(periods > 0.0 && throttled > 0.0, "{periods} {throttled}");
    assert!(
        of("container_cpu_cfs_throttled_seconds_total", "cpu").is_some_and(|v| v > 0.0),
        "throttled seconds of cpu"
    );
    assert_eq!(
        of("container_cpu_cfs_periods_total", "mem"),
        None,
        "no quota, no CFS series"
    );
    assert!(
        of("container_memory_cache", "mem").is_some_and(|v| v >= (40 << 20) as f64),
        "{:?}",
        of("container_memory_cache", "mem")
    );
    // Packet counters beside the byte counters of each pod interface.
    let with_bytes: Vec<_> = cadvisor
        .get("container_network_receive_bytes_total")
        .map(|f| f.samples.iter().map(|s| s.labels.clone()).collect())
        .unwrap_or_default();
    for family in [
        "container_network_receive_packets_total",
        "container_network_receive_packets_dropped_total",
        "container_network_transmit_packets_total",
        "container_network_transmit_packets_dropped_total",
    ] {
        for labels in &with_bytes {
            assert!(
                cadvisor[family].samples.iter().any(|s| &s.labels == labels),
                "{family} {labels:?}"
            );
        }
    }
    let cores = &cadvisor["machine_cpu_cores"].samples;
    assert_eq!(
        cores.first().map(|s| s.value),
        Some(std::thread::available_parallelism().unwrap().get() as f64)
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_bodies_parse_and_running_pods_lists_the_pod() {
    if !require_runtime("metrics") {
        return;
    }
    let node = Node::start("stats_metrics", NodeOptions::default()).await;
    node.write_manifest(
        "probed.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: probed\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: web\n    image: busybox:1.36\n    command: [\"sleep\", \"3600\"]\n    readinessProbe:\n      exec:\n        command: [\"true\"]\n      periodSeconds: 1\n",
    );
    let pod_name = node.pod_name("probed");

    let running = eventually("the pod in /runningpods/", DEADLINE, || async {
        let list = get_json(&node, "/runningpods/").await?;
        let items = list["items"].as_array().cloned().unwrap_or_default();
        items
            .into_iter()
            .find(|p| p["metadata"]["name"] == pod_name.as_str())
            .filter(|p| {
                p["spec"]["containers"]
                    .as_array()
                    .is_some_and(|c| !c.is_empty())
            })
            .ok_or_else(|| format!("not listed yet: {list}"))
    })
    .await;
    assert_eq!(running["metadata"]["namespace"], "default");
    assert!(
        running["metadata"]["uid"]
            .as_str()
            .is_some_and(|u| !u.is_empty())
    );
    assert_eq!(running["spec"]["containers"][0]["name"], "web");
    assert!(running["spec"]["containers"][0]["image"].is_string());
    let list = get_json(&node, "/runningpods/").await.unwrap();
    assert_eq!(
        (list["kind"].as_str(), list["apiVersion"].as_str()),
        (Some("PodList"), Some("v1"))
    );

    // /metrics: once the probe has run and the pod is up, every family once.
    let families = eventually("probe and pod metrics in /metrics", DEADLINE, || async {
        let body = get_text(&node, "/metrics").await;
        let families = prom::parse(&body)?;
        let probes = families
            .get("prober_probe_total")
            .map(|f| f.samples.clone())
            .unwrap_or_default();
        let seen = probes.iter().any(|s| {
            s.labels.get("pod") == Some(&pod_name)
                && s.labels["probe_type"] == "Readiness"
                && s.labels["result"] == "successful"
                && s.labels["container"] == "web"
                && s.labels["namespace"] == "default"
                && s.value >= 1.0
        });
        // pleg's gauges follow its relists, which may lag the probe by a second.
        let running = families
            .get("kubelet_running_pods")
            .is_some_and(|f| f.samples[0].value >= 1.0)
            && families.get("kubelet_running_containers").is_some_and(|f| {
                f.samples
                    .iter()
                    .any(|s| s.labels["container_state"] == "running" && s.value >= 1.0)
            });
        let started = families
            .get("kubelet_pod_start_duration_seconds")
            .is_some_and(|f| {
                f.samples
                    .iter()
                    .any(|s| s.name.ends_with("_count") && s.value >= 1.0)
            });
        (seen && running && started)
            .then_some(families)
            .ok_or_else(|| {
                format!("probe seen {seen}, running pods {running}, pod start {started}")
            })
    })
    .await;
    assert_eq!(families["kubelet_running_pods"].kind, "gauge");
    assert!(
        families["kubelet_running_containers"]
            .samples
            .iter()
            .any(|s| s.labels["container_state"] == "running" && s.value >= 1.0)
    );
    let operations = &families["kubelet_runtime_operations_total"].samples;
    for op in [
        "list_podsandbox",
        "list_containers",
        "run_podsandbox",
        "create_container",
        "exec_sync",
    ] {
        assert!(
            operations
                .iter()
                .any(|s| s.labels["operation_type"] == op && s.value >= 1.0),
            "no {op} in {operations:?}"
        );
    }
    assert_eq!(
        families["kubelet_runtime_operations_duration_seconds"].kind,
        "histogram"
    );
    assert_eq!(
        families["kubelet_pod_worker_duration_seconds"].kind,
        "histogram"
    );
    assert_eq!(
        families["kubelet_pleg_relist_duration_seconds"].kind,
        "histogram"
    );
    assert!(families.contains_key("kubelet_pleg_last_seen_seconds"));
    // kubernetes-mixin joins every kubelet alert on kubelet_node_name{node}, and
    // KubeVersionMismatch reads kubernetes_build_info{git_version}.
    let node_name = &families["kubelet_node_name"];
    assert_eq!(node_name.kind, "gauge");
    assert_eq!(node_name.samples.len(), 1, "{node_name:?}");
    assert_eq!(node_name.samples[0].labels["node"], node.name);
    assert_eq!(node_name.samples[0].value, 1.0);
    let build = &families["kubernetes_build_info"].samples;
    assert!(
        build.len() == 1
            && build[0].value == 1.0
            && build[0].labels["git_version"].starts_with("v1.")
            && build[0].labels["major"] == "1",
        "{build:?}"
    );
    // Process metrics of every service, told apart by their service label.
    let services: Vec<String> = families["process_resident_memory_bytes"]
        .samples
        .iter()
        .map(|s| s.labels["service"].clone())
        .collect();
    for service in [
        "config-source",
        "pleg",
        "pod-sync",
        "probe",
        "volume",
        "node-status",
        "http-server",
    ] {
        assert!(
            services.iter().any(|s| s == service),
            "{service} missing from {services:?}"
        );
    }
    assert!(families["process_cpu_seconds_total"].samples.len() >= 7);
    assert!(
        families["process_start_time_seconds"]
            .samples
            .iter()
            .all(|s| s.value > 1.6e9)
    );

    // /metrics/probes: the prober's families only.
    let probes =
        prom::parse(&get_text(&node, "/metrics/probes").await).expect("probe metrics parse");
    assert!(probes.contains_key("prober_probe_total"), "{probes:?}");
    assert!(
        probes.keys().all(|k| k.starts_with("prober_probe_")),
        "{:?}",
        probes.keys()
    );
    node.stop().await;
}

/// A container writes 8 MiB into an emptyDir; a hostPath volume beside it is not reported.
const WRITER: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: writer
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: w
    image: busybox:1.36
    command: ["sh", "-c", "mkdir -p /scratch/a/b && dd if=/dev/zero of=/scratch/a/b/fill bs=1M count=8 && echo done > /scratch/done && sleep 3600"]
    volumeMounts:
    - name: scratch
      mountPath: /scratch
    - name: host
      mountPath: /host
  volumes:
  - name: scratch
    emptyDir: {}
  - name: host
    hostPath:
      path: HOSTDIR
      type: DirectoryOrCreate
"#;

#[tokio::test(flavor = "multi_thread")]
async fn summary_reports_empty_dir_usage_after_a_container_writes() {
    if !require_runtime("stats volumes") {
        return;
    }
    let options = NodeOptions {
        extra_config: "volumeStatsAggPeriod: 2s\n".into(),
        ..Default::default()
    };
    let node = Node::start("stats_volumes", options).await;
    let host_dir = node.path("host-volume");
    node.write_manifest(
        "writer.yaml",
        &WRITER.replace("HOSTDIR", &host_dir.display().to_string()),
    );
    let pod_name = node.pod_name("writer");

    // Measured in the background every 2 s: the 8 MiB show within a few periods.
    let p = eventually("the emptyDir's usage in the summary", DEADLINE, || async {
        let s = get_json(&node, "/stats/summary").await?;
        let p = pod(&s, &pod_name).ok_or("no writer pod yet")?;
        let used = p["volume"]
            .as_array()
            .and_then(|v| v.iter().find(|v| v["name"] == "scratch"))
            .and_then(|v| u64_at(v, "/usedBytes"))
            .ok_or_else(|| format!("no scratch volume yet: {}", p["volume"]))?;
        (used >= 8 << 20)
            .then(|| p.clone())
            .ok_or_else(|| format!("scratch usedBytes {used}"))
    })
    .await;
    let volumes = p["volume"].as_array().unwrap();
    assert_eq!(
        volumes.len(),
        1,
        "only the emptyDir is reported: {volumes:?}"
    );
    let v = &volumes[0];
    // du-like: the file's blocks and the directories', not the whole filesystem.
    let used = u64_at(v, "/usedBytes").unwrap();
    assert!(used < 9 << 20, "{v}");
    // The volume dir, a, b, fill and done at least.
    assert!(u64_at(v, "/inodesUsed").is_some_and(|n| n >= 5), "{v}");
    for field in ["availableBytes", "capacityBytes", "inodesFree", "inodes"] {
        assert!(v[field].as_u64().is_some_and(|n| n > 0), "{field}: {v}");
    }
    assert!(
        u64_at(v, "/capacityBytes").unwrap() >= u64_at(v, "/availableBytes").unwrap(),
        "{v}"
    );
    assert!(v["time"].as_str().is_some_and(|t| t.ends_with('Z')), "{v}");
    // The pod's ephemeral storage includes the emptyDir (upstream's calcEphemeralStorage).
    let ephemeral = u64_at(&p, "/ephemeral-storage/usedBytes").unwrap();
    assert!(
        ephemeral >= used,
        "ephemeral {ephemeral} < volume {used}: {p}"
    );

    // only_cpu_and_memory leaves volumes out, as upstream.
    let s = get_json(&node, "/stats/summary?only_cpu_and_memory=true")
        .await
        .unwrap();
    let p = pod(&s, &pod_name).expect("the writer pod");
    assert!(p.get("volume").is_none(), "{p}");
    node.stop().await;
}

/// `/metrics`, or why not yet (the node's API may still be starting).
async fn metrics_text(node: &Node) -> Result<String, String> {
    let r = node.api.get("/metrics").await?;
    (r.status == 200)
        .then(|| r.text())
        .ok_or_else(|| format!("/metrics: {}", r.status))
}

/// The value of the sample of `family` named `name` whose labels include `want`, if any.
fn sample(
    families: &std::collections::BTreeMap<String, prom::Family>,
    family: &str,
    name: &str,
    want: &[(&str, &str)],
) -> Option<f64> {
    families.get(family)?.samples.iter().find_map(|s| {
        (s.name == name
            && want
                .iter()
                .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v)))
        .then_some(s.value)
    })
}

/// kubernetes-mixin's kubelet dashboard (dashboards/kubelet.libsonnet) reads the volume
/// manager's counts (`volume_manager_total_volumes{state}`, "Actual/Desired Volume
/// Count"), the storage operations (`storage_operation_duration_seconds` by
/// operation_name and volume_plugin, "Storage Operation Rate") and the cgroup manager's
/// (`kubelet_cgroup_manager_duration_seconds` by operation_type): from a real pod with an
/// emptyDir and a hostPath, under upstream's names and label values
/// (pkg/volume/util/metrics.go, pkg/kubelet/volumemanager/metrics, pkg/kubelet/metrics).
#[tokio::test(flavor = "multi_thread")]
async fn volume_and_cgroup_operations_fill_the_mixins_kubelet_dashboard() {
    if !require_runtime("volume and cgroup manager metrics") {
        return;
    }
    let node = Node::start("stats_volume_metrics", NodeOptions::default()).await;
    let host_dir = node.path("host-volume");
    node.write_manifest(
        "writer.yaml",
        &WRITER.replace("HOSTDIR", &host_dir.display().to_string()),
    );
    let mounted = |plugin: &'static str| {
        [
            ("volume_plugin", plugin),
            ("operation_name", "volume_mount"),
            ("status", "success"),
            ("migrated", "false"),
        ]
    };
    let volumes =
        |plugin: &'static str, state: &'static str| [("plugin_name", plugin), ("state", state)];
    let cgroup = |op: &'static str| [("operation_type", op)];
    eventually("the volume and cgroup series", DEADLINE, || async {
        let families = prom::parse(&metrics_text(&node).await?)?;
        let count = |family: &str, want: &[(&str, &str)]| {
            sample(&families, family, &format!("{family}_count"), want).unwrap_or(0.0)
        };
        let gauge = |want: &[(&str, &str)]| {
            sample(
                &families,
                "volume_manager_total_volumes",
                "volume_manager_total_volumes",
                want,
            )
        };
        let seen = [
            count(
                "storage_operation_duration_seconds",
                &mounted("kubernetes.io/empty-dir"),
            ) >= 1.0,
            count(
                "storage_operation_duration_seconds",
                &mounted("kubernetes.io/host-path"),
            ) >= 1.0,
            gauge(&volumes(
                "kubernetes.io/empty-dir",
                "desired_state_of_world",
            )) == Some(1.0),
            gauge(&volumes("kubernetes.io/empty-dir", "actual_state_of_world")) == Some(1.0),
            gauge(&volumes("kubernetes.io/host-path", "actual_state_of_world")) == Some(1.0),
            count("kubelet_cgroup_manager_duration_seconds", &cgroup("create")) >= 1.0,
            count("kubelet_cgroup_manager_duration_seconds", &cgroup("update")) >= 1.0,
        ];
        seen.iter()
            .all(|s| *s)
            .then_some(())
            .ok_or_else(|| format!("seen {seen:?}"))
    })
    .await;
    // The pod goes: its volumes leave both states, its cgroup is destroyed.
    node.remove_manifest("writer.yaml");
    eventually(
        "the volumes released, the pod cgroup destroyed",
        DEADLINE,
        || async {
            let families = prom::parse(&metrics_text(&node).await?)?;
            let actual = sample(
                &families,
                "volume_manager_total_volumes",
                "volume_manager_total_volumes",
                &volumes("kubernetes.io/empty-dir", "actual_state_of_world"),
            );
            let destroyed = sample(
                &families,
                "kubelet_cgroup_manager_duration_seconds",
                "kubelet_cgroup_manager_duration_seconds_count",
                &cgroup("destroy"),
            );
            (actual == Some(0.0) && destroyed.is_some_and(|n| n >= 1.0))
                .then_some(())
                .ok_or_else(|| format!("empty-dir actual {actual:?}, destroy count {destroyed:?}"))
        },
    )
    .await;
    node.stop().await;
}

/// client-go's request metrics, which kubernetes-mixin's kubelet dashboard reads ("RPC
/// Rate" by `rest_client_requests_total{code}`, "Request duration" from
/// `rest_client_request_duration_seconds`): every service's requests to the API server,
/// under upstream's labels (k8s.io/component-base/metrics/prometheus/restclient:
/// `code`, `method`, `host`; `verb`, `host`), and `code="<error>"` for a request that got
/// no response, as client-go counts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_server_requests_are_counted_as_client_go_counts_them() {
    if !require_runtime("rest client metrics") {
        return;
    }
    let (server, node) =
        Node::start_with_api_server("stats_rest_client", NodeOptions::default()).await;
    let host = server.url().trim_start_matches("http://").to_string();
    let total = |families: &std::collections::BTreeMap<String, prom::Family>, code: &str| {
        families
            .get("rest_client_requests_total")
            .map(|f| {
                f.samples
                    .iter()
                    .filter(|s| {
                        s.labels.get("host") == Some(&host)
                            && s.labels.get("code").is_some_and(|c| c.starts_with(code))
                    })
                    .map(|s| s.value)
                    .sum::<f64>()
            })
            .unwrap_or(0.0)
    };
    eventually("answered requests counted", DEADLINE, || async {
        let families = prom::parse(&metrics_text(&node).await?)?;
        let timed = sample(
            &families,
            "rest_client_request_duration_seconds",
            "rest_client_request_duration_seconds_count",
            &[("verb", "GET"), ("host", host.as_str())],
        );
        (total(&families, "2") >= 1.0 && timed.is_some_and(|n| n >= 1.0))
            .then_some(())
            .ok_or_else(|| format!("2xx {}, GET timed {timed:?}", total(&families, "2")))
    })
    .await;
    // The API server goes away: requests end without a response.
    server.stop().await;
    eventually("requests with no response counted", DEADLINE, || async {
        let families = prom::parse(&metrics_text(&node).await?)?;
        let errors = total(&families, "<error>");
        (errors >= 1.0)
            .then_some(())
            .ok_or_else(|| format!("<error> count {errors}"))
    })
    .await;
    node.stop().await;
}

/// A container reads 8 MiB and writes 2 MiB with O_DIRECT (no page cache between it and
/// the disk, so the I/O is its own on cgroup v1 too, where buffered writeback is charged
/// to the root cgroup) on a hostPath volume.
const DISK_IO: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: disk-io
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: io
    image: busybox:1.36
    command: ["sh", "-c", "dd if=/io/data of=/dev/null bs=64k iflag=direct && dd if=/dev/zero of=/io/out bs=64k count=32 oflag=direct && touch /io/done; exec sleep 3600"]
    volumeMounts:
    - name: io
      mountPath: /io
  volumes:
  - name: io
    hostPath:
      path: HOSTDIR
      type: Directory
"#;

/// On cgroup v1, kernels since 6.10 count a cgroup's I/O (`blkio.throttle.io_service_bytes`
/// and `io_serviced`, which runc and cAdvisor read) only once blk-throttle is in use on the
/// disk's queue (block/blk-throttle.c `blk_throtl_activated`): until some cgroup has a
/// rule, every counter stays at `Total 0` (the root's too) and cAdvisor serves no series
/// either. An operator who wants them sets a rule; so does this test: one that never
/// throttles (1 PiB/s, at the root, for the disk holding `path`), removed at once, which
/// leaves the accounting on. Nothing to do on cgroup v2, whose io.stat always counts.
fn enable_v1_io_accounting(path: &std::path::Path) {
    let root = std::path::Path::new("/sys/fs/cgroup/blkio");
    if std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists() || !root.exists() {
        return;
    }
    let st = nix::sys::stat::stat(path).expect("stat the test's directory");
    let mut dev = format!(
        "{}:{}",
        nix::sys::stat::major(st.st_dev),
        nix::sys::stat::minor(st.st_dev)
    );
    // A rule names a whole disk, not a partition.
    let sys = std::path::PathBuf::from(format!("/sys/dev/block/{dev}"));
    if sys.join("partition").exists() {
        dev = std::fs::read_to_string(sys.join("../dev"))
            .expect("the partition's disk")
            .trim()
            .to_string();
    }
    let rule = root.join("blkio.throttle.read_bps_device");
    std::fs::write(&rule, format!("{dev} 1125899906842624\n"))
        .unwrap_or_else(|e| panic!("a rule for {dev} in {}: {e}", rule.display()));
    std::fs::write(&rule, format!("{dev} 0\n"))
        .unwrap_or_else(|e| panic!("removing the rule for {dev}: {e}"));
}

/// kubernetes-mixin's `diskDeviceSelector` (config.libsonnet):
/// `device=~"(/dev/)?(mmcblk.p.+|nvme.+|rbd.+|sd.+|vd.+|xvd.+|dm-.+|md.+|dasd.+)"`.
fn mixin_disk_device(device: &str) -> bool {
    let name = device.strip_prefix("/dev/").unwrap_or(device);
    if let Some(rest) = name.strip_prefix("mmcblk") {
        return rest.len() >= 3 && rest.as_bytes()[1] == b'p';
    }
    ["nvme", "rbd", "sd", "vd", "xvd", "dm-", "md", "dasd"]
        .iter()
        .any(|p| name.strip_prefix(p).is_some_and(|rest| !rest.is_empty()))
}

/// kubernetes-mixin's Storage IO panels and tables (dashboards/resources/{cluster,
/// namespace,pod,workload}.libsonnet) read `container_fs_{reads,writes}_total` and
/// `container_fs_{reads,writes}_bytes_total` from cAdvisor's endpoint, selecting
/// `container!=""` and a disk by `diskDeviceSelector`, and sum by pod and container. A real
/// container's O_DIRECT reads and writes on the node's disk must show there, counted as
/// cAdvisor counts them (the cgroup's io.stat or blkio counters per device), named as
/// cAdvisor names the device (`/dev/<name>`).
#[tokio::test(flavor = "multi_thread")]
async fn a_containers_disk_io_fills_the_mixins_storage_io_panels() {
    if !require_runtime("container disk I/O metrics") {
        return;
    }
    let node = Node::start("stats_disk_io", NodeOptions::default()).await;
    let dir = node.path("io");
    std::fs::create_dir_all(&dir).expect("mkdir");
    // 8 MiB that are not all zeros, synced to the disk before the pod reads them.
    let data: Vec<u8> = (0..8u32 << 20).map(|i| (i % 251) as u8).collect();
    {
        use std::io::Write;
        let mut f = std::fs::File::create(dir.join("data")).expect("create");
        f.write_all(&data).expect("write");
        f.sync_all().expect("sync");
    }
    enable_v1_io_accounting(&dir);
    node.write_manifest(
        "disk-io.yaml",
        &DISK_IO.replace("HOSTDIR", &dir.display().to_string()),
    );
    let pod_name = node.pod_name("disk-io");
    eventually(
        "the container's O_DIRECT reads and writes",
        DEADLINE,
        || async {
            dir.join("done")
                .exists()
                .then_some(())
                .ok_or_else(|| "the container has not done its I/O yet".to_string())
        },
    )
    .await;
    let seen = eventually("the disk I/O series of the container", DEADLINE, || async {
        let families = prom::parse(&get_text(&node, "/metrics/cadvisor").await)?;
        let mut seen = Vec::new();
        for family in [
            "container_fs_reads_bytes_total",
            "container_fs_writes_bytes_total",
            "container_fs_reads_total",
            "container_fs_writes_total",
        ] {
            let f = families
                .get(family)
                .ok_or_else(|| format!("no {family} family"))?;
            if f.kind != "counter" {
                return Err(format!("{family} is a {}", f.kind));
            }
            // The mixin sums over the devices it selects.
            let (mut sum, mut devices) = (0.0, Vec::new());
            for s in &f.samples {
                let l = |k: &str| s.labels.get(k).map(String::as_str).unwrap_or_default();
                if l("pod") == pod_name && l("namespace") == "default" && l("container") == "io" {
                    devices.push(l("device").to_string());
                    if mixin_disk_device(l("device")) {
                        sum += s.value;
                    }
                }
            }
            seen.push((family, sum, devices));
        }
        let enough =
            |family: &str, min: f64| seen.iter().any(|(f, sum, _)| *f == family && *sum >= min);
        (enough("container_fs_reads_bytes_total", (8u32 << 20) as f64)
            && enough("container_fs_writes_bytes_total", (2u32 << 20) as f64)
            && enough("container_fs_reads_total", 1.0)
            && enough("container_fs_writes_total", 1.0))
        .then(|| seen.clone())
        .ok_or_else(|| format!("summed over the mixin's devices: {seen:?}"))
    })
    .await;
    eprintln!("disk I/O of the container, summed over the mixin's devices: {seen:?}");
    node.stop().await;
}

#[test]
fn the_mixins_disk_device_selector() {
    for yes in [
        "/dev/vda",
        "vdb",
        "/dev/sda",
        "/dev/nvme0n1",
        "/dev/dm-0",
        "/dev/mmcblk0p1",
        "xvda",
    ] {
        assert!(mixin_disk_device(yes), "{yes}");
    }
    for no in [
        "/dev/loop0",
        "/dev/zram0",
        "/dev/vd",
        "",
        "/dev/sr0",
        "overlay",
    ] {
        assert!(!mixin_disk_device(no), "{no}");
    }
}
