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
}
