//! Upstream's kubelet metric families (pkg/kubelet/metrics, pkg/kubelet/prober), each
//! registered in the process's registry the first time a service touches it.

use super::{
    CounterFamily, DEFAULT_BUCKETS, GaugeFamily, HistogramFamily, histogram_family, register,
};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use std::sync::LazyLock;
use std::sync::atomic::AtomicU64;

fn default_histogram() -> Histogram {
    Histogram::new(DEFAULT_BUCKETS)
}

/// `kubelet_runtime_operations_total{operation_type}`.
pub static RUNTIME_OPERATIONS: LazyLock<CounterFamily> = LazyLock::new(|| {
    register(
        "kubelet_runtime_operations",
        "[ALPHA] Cumulative number of runtime operations by operation type.",
        CounterFamily::default(),
    )
});

/// `kubelet_runtime_operations_errors_total{operation_type}`.
pub static RUNTIME_OPERATION_ERRORS: LazyLock<CounterFamily> = LazyLock::new(|| {
    register(
        "kubelet_runtime_operations_errors",
        "[ALPHA] Cumulative number of runtime operation errors by operation type.",
        CounterFamily::default(),
    )
});

/// `kubelet_runtime_operations_duration_seconds{operation_type}`.
pub static RUNTIME_OPERATION_DURATION: LazyLock<HistogramFamily> = LazyLock::new(|| {
    register(
        "kubelet_runtime_operations_duration_seconds",
        "[ALPHA] Duration in seconds of runtime operations. Broken down by operation type.",
        histogram_family(|| Histogram::new(exponential_buckets(0.005, 2.5, 14))),
    )
});

/// `kubelet_pod_worker_duration_seconds{operation_type}` (create, update or sync).
pub static POD_WORKER_DURATION: LazyLock<HistogramFamily> = LazyLock::new(|| {
    register(
        "kubelet_pod_worker_duration_seconds",
        "[ALPHA] Duration in seconds to sync a single pod. Broken down by operation type: create, update, or sync",
        histogram_family(default_histogram),
    )
});

/// `kubelet_pod_start_duration_seconds`: from first seeing a pod to its running.
pub static POD_START_DURATION: LazyLock<HistogramFamily> = LazyLock::new(|| {
    register(
        "kubelet_pod_start_duration_seconds",
        "[ALPHA] Duration in seconds from kubelet seeing a pod for the first time to the pod starting to run",
        histogram_family(|| {
            Histogram::new([
                0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 20.0, 30.0, 45.0, 60.0, 120.0, 180.0,
                240.0, 300.0, 360.0, 480.0, 600.0, 900.0, 1200.0, 1800.0, 2700.0, 3600.0,
            ])
        }),
    )
});

/// `kubelet_running_pods`: pods with a ready sandbox.
pub static RUNNING_PODS: LazyLock<Gauge> = LazyLock::new(|| {
    register(
        "kubelet_running_pods",
        "[ALPHA] Number of pods that have a running pod sandbox",
        Gauge::default(),
    )
});

/// `nodeagent_runtime_call_limit` (node-agent specific): how many of the runtime's
/// expensive calls pod-sync lets through at once now (`--max-parallel-runtime-calls`, or
/// the adaptive bound where it moved to).
pub static RUNTIME_CALL_LIMIT: LazyLock<Gauge> = LazyLock::new(|| {
    register(
        "nodeagent_runtime_call_limit",
        "Expensive runtime calls (sandbox and container creation, start and removal) let through at once",
        Gauge::default(),
    )
});

/// `kubelet_running_containers{container_state}`.
pub static RUNNING_CONTAINERS: LazyLock<GaugeFamily> = LazyLock::new(|| {
    register(
        "kubelet_running_containers",
        "[ALPHA] Number of containers currently running",
        GaugeFamily::default(),
    )
});

/// `kubelet_pleg_relist_duration_seconds`.
pub static PLEG_RELIST_DURATION: LazyLock<Histogram> = LazyLock::new(|| {
    register(
        "kubelet_pleg_relist_duration_seconds",
        "[ALPHA] Duration in seconds for relisting pods in PLEG.",
        default_histogram(),
    )
});

/// `kubelet_pleg_relist_interval_seconds`.
pub static PLEG_RELIST_INTERVAL: LazyLock<Histogram> = LazyLock::new(|| {
    register(
        "kubelet_pleg_relist_interval_seconds",
        "[ALPHA] Interval in seconds between relisting in PLEG.",
        default_histogram(),
    )
});

/// `kubelet_pleg_last_seen_seconds`: unix time of the last relist.
pub static PLEG_LAST_SEEN: LazyLock<Gauge<f64, AtomicU64>> = LazyLock::new(|| {
    register(
        "kubelet_pleg_last_seen_seconds",
        "[ALPHA] Timestamp in seconds when PLEG was last seen active.",
        Gauge::default(),
    )
});

/// `prober_probe_total{probe_type, result, container, pod, namespace, pod_uid}`.
pub static PROBE_TOTAL: LazyLock<CounterFamily> = LazyLock::new(|| {
    register(
        "prober_probe",
        "[ALPHA] Cumulative number of a liveness, readiness or startup probe for a container by result.",
        CounterFamily::default(),
    )
});

/// `prober_probe_duration_seconds{probe_type, container, pod, namespace}`.
pub static PROBE_DURATION: LazyLock<HistogramFamily> = LazyLock::new(|| {
    register(
        "prober_probe_duration_seconds",
        "[ALPHA] Duration in seconds for a probe response.",
        histogram_family(default_histogram),
    )
});

/// `kubelet_node_name{node}`: always 1; every kubelet alert of kubernetes-mixin joins on it
/// (pkg/kubelet/metrics/metrics.go `NodeName`, label `NodeLabelKey = "node"`).
pub static NODE_NAME: LazyLock<GaugeFamily> = LazyLock::new(|| {
    register(
        "kubelet_node_name",
        "[ALPHA] The node's name. The count is always 1.",
        GaugeFamily::default(),
    )
});

/// Reports `kubelet_node_name{node="<name>"} 1`.
pub fn set_node_name(name: &str) {
    NODE_NAME
        .get_or_create(&vec![("node", name.to_string())])
        .set(1);
}

/// `kubelet_evictions{eviction_signal}`, served without `_total` as upstream
/// (pkg/kubelet/metrics/metrics.go `Evictions`; see [`super::UNSUFFIXED_COUNTERS`]).
pub static EVICTIONS: LazyLock<CounterFamily> = LazyLock::new(|| {
    register(
        "kubelet_evictions",
        "[ALPHA] Cumulative number of pod evictions by eviction signal",
        CounterFamily::default(),
    )
});

/// Counts one eviction under upstream's signal name (`memory.available`,
/// `nodefs.available`, ..., or the local storage ones: `ephemeralpodfs.limit`,
/// `ephemeralcontainerfs.limit`, `emptydirfs.limit`).
pub fn record_eviction(signal: &str) {
    EVICTIONS
        .get_or_create(&vec![("eviction_signal", signal.to_string())])
        .inc();
}

/// `kubelet_preemptions{preemption_signal}`, served without `_total` as upstream
/// (pkg/kubelet/metrics/metrics.go `Preemptions`): one per pod preempted for a critical pod,
/// under the first resource it was short of.
pub static PREEMPTIONS: LazyLock<CounterFamily> = LazyLock::new(|| {
    register(
        "kubelet_preemptions",
        "[ALPHA] Cumulative number of pod preemptions by preemption resource",
        CounterFamily::default(),
    )
});

pub fn record_preemption(resource: &str) {
    PREEMPTIONS
        .get_or_create(&vec![("preemption_signal", resource.to_string())])
        .inc();
}

/// In-place resize (pkg/kubelet/metrics/metrics.go, kubernetes#132903, its names, help
/// texts, labels and buckets as the 1.34 metrics list has them).
///
/// `kubelet_container_requested_resizes_total{operation,requirement,resource}`: one per
/// resource, requirement and container whose amount a pod update changes.
pub static CONTAINER_REQUESTED_RESIZES: LazyLock<CounterFamily> = LazyLock::new(|| {
    register(
        "kubelet_container_requested_resizes",
        "[ALPHA] Number of requested resizes, counted at the container level. Different resources on the same container are counted separately. The 'requirement' label refers to 'memory' or 'limits'; the 'operation' label can be one of 'add', 'remove', 'increase' or 'decrease'.",
        CounterFamily::default(),
    )
});

pub fn record_requested_resize(operation: &str, requirement: &str, resource: &str) {
    CONTAINER_REQUESTED_RESIZES
        .get_or_create(&vec![
            ("operation", operation.to_string()),
            ("requirement", requirement.to_string()),
            ("resource", resource.to_string()),
        ])
        .inc();
}

fn resize_duration_buckets() -> Histogram {
    Histogram::new([
        10.0, 50.0, 100.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0, 20000.0, 30000.0, 60000.0,
        120000.0, 300000.0, 600000.0,
    ])
}

/// `kubelet_pod_resize_duration_milliseconds{success}`: one resize carried out in the
/// running containers.
pub static POD_RESIZE_DURATION: LazyLock<HistogramFamily> = LazyLock::new(|| {
    register(
        "kubelet_pod_resize_duration_milliseconds",
        "[ALPHA] Duration in milliseconds to actuate a pod resize",
        histogram_family(resize_duration_buckets),
    )
});

pub fn record_resize_duration(milliseconds: f64, success: bool) {
    POD_RESIZE_DURATION
        .get_or_create(&vec![("success", success.to_string())])
        .observe(milliseconds);
}

/// `kubelet_pod_pending_resizes{reason}`: pods with a `PodResizePending` condition, by
/// its reason in lower case (`deferred`, `infeasible`).
pub static POD_PENDING_RESIZES: LazyLock<GaugeFamily> = LazyLock::new(|| {
    register(
        "kubelet_pod_pending_resizes",
        "[ALPHA] Number of pending resizes for pods.",
        GaugeFamily::default(),
    )
});

/// `kubelet_pod_in_progress_resizes`: pods with a `PodResizeInProgress` condition.
pub static POD_IN_PROGRESS_RESIZES: LazyLock<Gauge> = LazyLock::new(|| {
    register(
        "kubelet_pod_in_progress_resizes",
        "[ALPHA] Number of in-progress resizes for pods.",
        Gauge::default(),
    )
});

/// Sets both gauges from the pods' resize conditions: `pending` each pending condition's
/// reason; a reason no pod has any more is no longer served (upstream resets the vector).
pub fn set_resize_counts<'a>(pending: impl Iterator<Item = &'a str>, in_progress: i64) {
    let mut by_reason = std::collections::BTreeMap::<String, i64>::new();
    for reason in pending {
        *by_reason.entry(reason.to_lowercase()).or_default() += 1;
    }
    POD_PENDING_RESIZES.clear();
    for (reason, n) in by_reason {
        POD_PENDING_RESIZES
            .get_or_create(&vec![("reason", reason)])
            .set(n);
    }
    POD_IN_PROGRESS_RESIZES.set(in_progress);
}

/// `kubelet_pod_infeasible_resizes_total{reason_detail}`: `static_pod`,
/// `guaranteed_pod_cpu_manager_static_policy`, `insufficient_node_allocatable`.
pub static POD_INFEASIBLE_RESIZES: LazyLock<CounterFamily> = LazyLock::new(|| {
    register(
        "kubelet_pod_infeasible_resizes",
        "[ALPHA] Number of infeasible resizes for pods.",
        CounterFamily::default(),
    )
});

pub fn record_infeasible_resize(reason_detail: &str) {
    POD_INFEASIBLE_RESIZES
        .get_or_create(&vec![("reason_detail", reason_detail.to_string())])
        .inc();
}

/// `kubelet_pod_deferred_accepted_resizes_total{retry_trigger}`: a deferred resize
/// admitted, by what retried it (`pod_resized`, `pods_removed`, `periodic_retry`).
pub static POD_DEFERRED_ACCEPTED_RESIZES: LazyLock<CounterFamily> = LazyLock::new(|| {
    register(
        "kubelet_pod_deferred_accepted_resizes",
        "[ALPHA] Cumulative number of resizes that were accepted after being deferred.",
        CounterFamily::default(),
    )
});

pub fn record_deferred_accepted_resize(retry_trigger: &str) {
    POD_DEFERRED_ACCEPTED_RESIZES
        .get_or_create(&vec![("retry_trigger", retry_trigger.to_string())])
        .inc();
}

/// `kubelet_device_plugin_registration_total{resource_name}`: every registration request
/// of a device plugin, refused ones too (pkg/kubelet/metrics/metrics.go
/// `DevicePluginRegistrationCount`, counted at the top of upstream's `Register`).
pub static DEVICE_PLUGIN_REGISTRATIONS: LazyLock<CounterFamily> = LazyLock::new(|| {
    register(
        "kubelet_device_plugin_registration",
        "[ALPHA] Cumulative number of device plugin registrations. Broken down by resource name.",
        CounterFamily::default(),
    )
});

/// `kubelet_device_plugin_alloc_duration_seconds{resource_name}`: a plugin's `Allocate`
/// call (`DevicePluginAllocationDuration`, DefBuckets).
pub static DEVICE_PLUGIN_ALLOC_DURATION: LazyLock<HistogramFamily> = LazyLock::new(|| {
    register(
        "kubelet_device_plugin_alloc_duration_seconds",
        "[ALPHA] Duration in seconds to serve a device plugin Allocation request. Broken down by resource name.",
        histogram_family(default_histogram),
    )
});

/// `kubelet_cgroup_manager_duration_seconds{operation_type}`: `create`, `update` or
/// `destroy` of a pod's or a QoS tier's cgroup (pkg/kubelet/metrics/metrics.go
/// `CgroupManagerDuration`, DefBuckets; pkg/kubelet/cm/cgroup_manager_linux.go).
pub static CGROUP_MANAGER_DURATION: LazyLock<HistogramFamily> = LazyLock::new(|| {
    register(
        "kubelet_cgroup_manager_duration_seconds",
        "[ALPHA] Duration in seconds for cgroup manager operations. Broken down by method.",
        histogram_family(default_histogram),
    )
});

/// Records one cgroup manager operation (`create`, `update`, `destroy`).
pub fn record_cgroup_operation(operation: &'static str, seconds: f64) {
    CGROUP_MANAGER_DURATION
        .get_or_create(&vec![("operation_type", operation.to_string())])
        .observe(seconds);
}

/// `storage_operation_duration_seconds{volume_plugin,operation_name,status,migrated}`
/// (pkg/volume/util/metrics.go `storageOperationMetric`, its buckets).
pub static STORAGE_OPERATION_DURATION: LazyLock<HistogramFamily> = LazyLock::new(|| {
    register(
        "storage_operation_duration_seconds",
        "[ALPHA] Storage operation duration",
        histogram_family(|| {
            Histogram::new([
                0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 25.0, 50.0, 120.0, 300.0, 600.0,
            ])
        }),
    )
});

/// `storage_operation_errors_total{volume_plugin,operation_name}` (pkg/volume/util/metrics.go
/// `storageOperationErrorMetric`, deprecated upstream but read by kubernetes-mixin's
/// kubelet dashboard).
pub static STORAGE_OPERATION_ERRORS: LazyLock<CounterFamily> = LazyLock::new(|| {
    register(
        "storage_operation_errors",
        "[ALPHA] Storage operation errors (Deprecated since 1.21.0)",
        CounterFamily::default(),
    )
});

/// Records one volume operation as upstream's `OperationCompleteHook` does: its duration
/// with `status` `success` or `fail-unknown` (`migrated` is always `false`: no in-tree
/// plugin is migrated to CSI here), and an error count on failure. `plugin` is upstream's
/// plugin name (`kubernetes.io/empty-dir`); `operation` e.g. `volume_mount`.
pub fn record_storage_operation(plugin: &str, operation: &'static str, seconds: f64, ok: bool) {
    let status = if ok { "success" } else { "fail-unknown" };
    STORAGE_OPERATION_DURATION
        .get_or_create(&vec![
            ("volume_plugin", plugin.to_string()),
            ("operation_name", operation.to_string()),
            ("status", status.to_string()),
            ("migrated", "false".to_string()),
        ])
        .observe(seconds);
    if !ok {
        STORAGE_OPERATION_ERRORS
            .get_or_create(&vec![
                ("volume_plugin", plugin.to_string()),
                ("operation_name", operation.to_string()),
            ])
            .inc();
    }
}

/// `volume_manager_total_volumes{plugin_name,state}`: the volumes of the pods on the node
/// (`desired_state_of_world`) and those set up (`actual_state_of_world`), by plugin
/// (pkg/kubelet/volumemanager/metrics/metrics.go).
pub static VOLUME_MANAGER_TOTAL_VOLUMES: LazyLock<GaugeFamily> = LazyLock::new(|| {
    register(
        "volume_manager_total_volumes",
        "[ALPHA] Number of volumes in Volume Manager",
        GaugeFamily::default(),
    )
});

/// Sets `volume_manager_total_volumes` to `counts` (plugin -> (desired, actual)); a plugin
/// counted before and absent now drops to 0, as upstream's collector would no longer list it.
pub fn set_volume_counts(counts: &std::collections::BTreeMap<String, (i64, i64)>) {
    let family = &*VOLUME_MANAGER_TOTAL_VOLUMES;
    let state = |plugin: &str, state: &str| {
        vec![
            ("plugin_name", plugin.to_string()),
            ("state", state.to_string()),
        ]
    };
    static KNOWN: std::sync::Mutex<std::collections::BTreeSet<String>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let mut known = KNOWN.lock().unwrap_or_else(|e| e.into_inner());
    for plugin in known.iter().filter(|p| !counts.contains_key(*p)) {
        family
            .get_or_create(&state(plugin, "desired_state_of_world"))
            .set(0);
        family
            .get_or_create(&state(plugin, "actual_state_of_world"))
            .set(0);
    }
    for (plugin, (desired, actual)) in counts {
        known.insert(plugin.clone());
        family
            .get_or_create(&state(plugin, "desired_state_of_world"))
            .set(*desired);
        family
            .get_or_create(&state(plugin, "actual_state_of_world"))
            .set(*actual);
    }
}

/// The `kubelet_volume_stats_*` families (pkg/kubelet/metrics/collectors/volume_stats.go),
/// labelled `namespace` and `persistentvolumeclaim`, with upstream's help texts: what
/// kubernetes-mixin's `KubePersistentVolumeFillingUp` and
/// `KubePersistentVolumeInodesFillingUp` alerts read.
static VOLUME_STATS: LazyLock<[GaugeFamily; 6]> = LazyLock::new(|| {
    [
        (
            "kubelet_volume_stats_capacity_bytes",
            "[ALPHA] Capacity in bytes of the volume",
        ),
        (
            "kubelet_volume_stats_available_bytes",
            "[ALPHA] Number of available bytes in the volume",
        ),
        (
            "kubelet_volume_stats_used_bytes",
            "[ALPHA] Number of used bytes in the volume",
        ),
        (
            "kubelet_volume_stats_inodes",
            "[ALPHA] Maximum number of inodes in the volume",
        ),
        (
            "kubelet_volume_stats_inodes_free",
            "[ALPHA] Number of free inodes in the volume",
        ),
        (
            "kubelet_volume_stats_inodes_used",
            "[ALPHA] Number of used inodes in the volume",
        ),
    ]
    .map(|(name, help)| register(name, help, GaugeFamily::default()))
});

/// One claim's volume as last measured: (namespace, claim) and (capacity, available,
/// used bytes, inodes, inodes free, inodes used), in the families' order.
pub type ClaimStats = ((String, String), [i64; 6]);

/// Sets the `kubelet_volume_stats_*` gauges to `claims` (each claim once: upstream's
/// collector reports a claim that several pods use once, from its first pod); a claim
/// reported before and absent now is removed, as upstream's collector no longer lists it.
pub fn set_volume_stats(claims: &[ClaimStats]) {
    static KNOWN: std::sync::Mutex<std::collections::BTreeSet<(String, String)>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let labels = |(namespace, claim): &(String, String)| {
        vec![
            ("namespace", namespace.clone()),
            ("persistentvolumeclaim", claim.clone()),
        ]
    };
    let mut known = KNOWN.lock().unwrap_or_else(|e| e.into_inner());
    let mut now = std::collections::BTreeSet::new();
    for (claim, values) in claims {
        if !now.insert(claim.clone()) {
            continue;
        }
        for (family, value) in VOLUME_STATS.iter().zip(values) {
            family.get_or_create(&labels(claim)).set(*value);
        }
    }
    for gone in known.difference(&now) {
        for family in VOLUME_STATS.iter() {
            family.remove(&labels(gone));
        }
    }
    *known = now;
}

/// `rest_client_requests_total{code,method,host}`: every request to the API server
/// (k8s.io/component-base/metrics/prometheus/restclient `requestResult`; `code` is
/// `<error>` when no response came, as client-go counts it).
pub static REST_CLIENT_REQUESTS: LazyLock<CounterFamily> = LazyLock::new(|| {
    register(
        "rest_client_requests",
        "[ALPHA] Number of HTTP requests, partitioned by status code, method, and host.",
        CounterFamily::default(),
    )
});

/// `rest_client_request_duration_seconds{verb,host}`: until the response's head
/// (restclient `requestLatency`, its buckets).
pub static REST_CLIENT_REQUEST_DURATION: LazyLock<HistogramFamily> = LazyLock::new(|| {
    register(
        "rest_client_request_duration_seconds",
        "[ALPHA] Request latency in seconds. Broken down by verb, and host.",
        histogram_family(|| {
            Histogram::new([
                0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0,
            ])
        }),
    )
});

/// Records one API server request: `code` None when it got no response.
pub fn record_rest_request(method: &str, host: &str, code: Option<u16>, seconds: f64) {
    let code = code.map_or_else(|| "<error>".to_string(), |c| c.to_string());
    REST_CLIENT_REQUESTS
        .get_or_create(&vec![
            ("code", code),
            ("method", method.to_string()),
            ("host", host.to_string()),
        ])
        .inc();
    REST_CLIENT_REQUEST_DURATION
        .get_or_create(&vec![
            ("verb", method.to_string()),
            ("host", host.to_string()),
        ])
        .observe(seconds);
}

/// The version this node agent reports as its kubelet version (NodeInfo.kubeletVersion).
pub const GIT_VERSION: &str = concat!("v1.37.0-nodeagent.", env!("CARGO_PKG_VERSION"));

/// `kubernetes_build_info{major,minor,git_version,git_commit,git_tree_state,build_date,
/// go_version,compiler,platform}`: always 1 (component-base
/// metrics/prometheus/version/metrics.go). kubernetes-mixin's KubeVersionMismatch reads
/// `git_version`.
pub static BUILD_INFO: LazyLock<GaugeFamily> = LazyLock::new(|| {
    register(
        "kubernetes_build_info",
        "[ALPHA] A metric with a constant '1' value labeled by major, minor, git version, git commit, git tree state, build date, Go version, and compiler from which Kubernetes was built, and platform on which it is running.",
        GaugeFamily::default(),
    )
});

/// Go's GOARCH for this build's architecture.
fn goarch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

/// Reports `kubernetes_build_info{...} 1` for this build. What a Go build knows and a
/// Rust one does not (git commit, tree state, build date, Go version) is left empty.
pub fn set_build_info() {
    let (major, minor) = GIT_VERSION
        .trim_start_matches('v')
        .split_once('.')
        .map(|(major, rest)| (major, rest.split('.').next().unwrap_or_default()))
        .unwrap_or_default();
    BUILD_INFO
        .get_or_create(&vec![
            ("major", major.to_string()),
            ("minor", minor.to_string()),
            ("git_version", GIT_VERSION.to_string()),
            ("git_commit", String::new()),
            ("git_tree_state", String::new()),
            ("build_date", String::new()),
            ("go_version", String::new()),
            ("compiler", "rustc".to_string()),
            ("platform", format!("{}/{}", std::env::consts::OS, goarch())),
        ])
        .set(1);
}

/// Upstream's `operation_type` for a CRI method (pkg/kubelet/kuberuntime
/// instrumented_services.go), from a gRPC path such as
/// `/runtime.v1.RuntimeService/ListPodSandbox`; None for other services.
pub fn runtime_operation(path: &str) -> Option<&'static str> {
    let method = path
        .strip_prefix("/runtime.v1.RuntimeService/")
        .or_else(|| path.strip_prefix("/runtime.v1.ImageService/"))?;
    Some(match method {
        "Version" => "version",
        "Status" => "status",
        "RunPodSandbox" => "run_podsandbox",
        "StopPodSandbox" => "stop_podsandbox",
        "RemovePodSandbox" => "remove_podsandbox",
        "PodSandboxStatus" => "podsandbox_status",
        "ListPodSandbox" => "list_podsandbox",
        "CreateContainer" => "create_container",
        "StartContainer" => "start_container",
        "StopContainer" => "stop_container",
        "RemoveContainer" => "remove_container",
        "ListContainers" => "list_containers",
        "ContainerStatus" => "container_status",
        "UpdateContainerResources" => "update_container_resources",
        "ReopenContainerLog" => "reopen_container_log",
        "ExecSync" => "exec_sync",
        "Exec" => "exec",
        "Attach" => "attach",
        "PortForward" => "port_forward",
        "ContainerStats" => "container_stats",
        "ListContainerStats" => "list_container_stats",
        "PodSandboxStats" => "pod_sandbox_stats",
        "ListPodSandboxStats" => "list_pod_sandbox_stats",
        "UpdateRuntimeConfig" => "update_runtime_config",
        "CheckpointContainer" => "checkpoint_container",
        "GetContainerEvents" => "get_container_events",
        "ListMetricDescriptors" => "list_metric_descriptors",
        "ListPodSandboxMetrics" => "list_podsandbox_metrics",
        "RuntimeConfig" => "runtime_config",
        "ListImages" => "list_images",
        "ImageStatus" => "image_status",
        "PullImage" => "pull_image",
        "RemoveImage" => "remove_image",
        "ImageFsInfo" => "image_fs_info",
        _ => "unknown",
    })
}

/// Counts one runtime operation and its duration; `failed` also counts an error.
pub fn record_runtime_operation(operation: &'static str, seconds: f64, failed: bool) {
    let labels = vec![("operation_type", operation.to_string())];
    RUNTIME_OPERATIONS.get_or_create(&labels).inc();
    RUNTIME_OPERATION_DURATION
        .get_or_create(&labels)
        .observe(seconds);
    if failed {
        RUNTIME_OPERATION_ERRORS.get_or_create(&labels).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_operations_use_upstream_names() {
        assert_eq!(
            runtime_operation("/runtime.v1.RuntimeService/ListPodSandbox"),
            Some("list_podsandbox")
        );
        assert_eq!(
            runtime_operation("/runtime.v1.ImageService/PullImage"),
            Some("pull_image")
        );
        assert_eq!(runtime_operation("/kubelet.v1.Pleg/Watch"), None);
    }

    #[test]
    fn node_name_build_info_and_evictions_as_upstream_names_them() {
        set_node_name("node-a");
        set_build_info();
        record_eviction("memory.available");
        let text = crate::metrics::encode();
        assert!(
            text.contains("kubelet_node_name{node=\"node-a\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("major=\"1\",minor=\"37\",git_version=\"v1.37.0-nodeagent."),
            "{text}"
        );
        assert!(
            text.contains("kubelet_evictions_total{eviction_signal=\"memory.available\"} 1"),
            "OpenMetrics adds _total; http-server's exposition takes it off: {text}"
        );
        assert!(crate::metrics::keeps_counter_name("kubelet_evictions"));
        assert!(!crate::metrics::keeps_counter_name(
            "kubelet_runtime_operations"
        ));
    }
}
