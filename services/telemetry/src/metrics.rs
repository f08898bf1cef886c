//! Prometheus metrics for every service: one process-wide registry (as upstream's
//! `legacyregistry`), upstream's kubelet metric families registered on first use (so a
//! service exposes only what it measures), and a collector of the process's own
//! `process_*` metrics labelled with the service's name, so that the seven services'
//! series stay distinct once http-server merges them into one `/metrics` body.
//!
//! [`encode`] writes OpenMetrics text (without `# EOF`); http-server parses every
//! service's text and renders one Prometheus text body.

pub mod kubelet;
mod process;

use prometheus_client::encoding::text::encode_registry;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Metric, Registry};
use std::sync::{LazyLock, Mutex, OnceLock};

pub use prometheus_client;

/// Label pairs of a family's series, in declaration order.
pub type Labels = Vec<(&'static str, String)>;
pub type CounterFamily = Family<Labels, Counter>;
pub type GaugeFamily = Family<Labels, Gauge>;
pub type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;

/// Prometheus' default buckets (`prometheus.DefBuckets`).
pub const DEFAULT_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(|| Mutex::new(Registry::default()));
static SERVICE: OnceLock<String> = OnceLock::new();

/// Counters that upstream names without the `_total` suffix. prometheus-client writes every
/// counter sample as `<name>_total` (OpenMetrics); http-server's exposition serves these
/// under their exact name instead (family and samples), as upstream's client_golang
/// does for these legacy counters. Register such a counter under its upstream name, add
/// it here, and it is served as upstream serves it.
///
/// - `kubelet_evictions` (k8s.io/kubernetes pkg/kubelet/metrics/metrics.go `Evictions`,
///   `EvictionsKey = "evictions"`)
/// - `kubelet_certificate_manager_client_expiration_renew_errors`
///   (pkg/kubelet/certificate/kubelet.go, client certificate manager)
/// - `kubelet_server_expiration_renew_errors` (pkg/kubelet/certificate/kubelet.go,
///   serving certificate manager)
pub const UNSUFFIXED_COUNTERS: &[&str] = &[
    "kubelet_evictions",
    "kubelet_preemptions",
    "kubelet_certificate_manager_client_expiration_renew_errors",
    "kubelet_server_expiration_renew_errors",
];

/// Whether the counter family `name` keeps its name, without `_total` ([`UNSUFFIXED_COUNTERS`]).
pub fn keeps_counter_name(name: &str) -> bool {
    UNSUFFIXED_COUNTERS.contains(&name)
}

/// Registers `metric` under `name` and returns it (metrics are shared handles). `help` is
/// upstream's text; the registry adds the final period itself.
pub fn register<M: Metric + Clone>(name: &str, help: &str, metric: M) -> M {
    let help = help.strip_suffix('.').unwrap_or(help);
    REGISTRY
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .register(name, help, metric.clone());
    metric
}

/// Names this process (`service` label of the `process_*` metrics) and starts
/// collecting them. Later calls are ignored.
pub fn init_process_metrics(service: &str) {
    if SERVICE.set(service.to_string()).is_ok() {
        REGISTRY
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .register_collector(Box::new(process::ProcessCollector::new(service)));
    }
}

/// `nodeagent_build_info{service,version} 1`: which build each running service is (they
/// are upgraded and restarted one at a time, so two may differ); `nodeagent status`
/// reads it.
pub fn set_service_build_info(service: &str, version: &str) {
    static FAMILY: LazyLock<GaugeFamily> = LazyLock::new(|| {
        register(
            "nodeagent_build_info",
            "A metric with a constant '1' value labeled by the service and the version (release and commit) it runs",
            GaugeFamily::default(),
        )
    });
    FAMILY
        .get_or_create(&vec![
            ("service", service.to_string()),
            ("version", version.to_string()),
        ])
        .set(1);
}

/// The name given to [`init_process_metrics`], if any.
pub fn service_name() -> Option<&'static str> {
    SERVICE.get().map(String::as_str)
}

/// Every registered metric as OpenMetrics text, without the `# EOF` line. Reads
/// `/proc/self`: call it off the async workers.
pub fn encode() -> String {
    let mut out = String::new();
    let registry = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    // Writing to a String cannot fail; a collector that fails leaves its family out.
    if let Err(e) = encode_registry(&mut out, &registry) {
        tracing::warn!(error = %e, "encoding metrics failed");
    }
    out
}

/// A histogram family whose series all use `buckets`.
pub fn histogram_family(buckets: fn() -> Histogram) -> HistogramFamily {
    Family::new_with_constructor(buckets)
}

/// Seconds since `start`, for histograms.
pub fn seconds_since(start: std::time::Instant) -> f64 {
    start.elapsed().as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_registered_families_and_process_metrics() {
        init_process_metrics("unit-test");
        let family: CounterFamily = register(
            "test_operations",
            "Cumulative number of test operations.",
            CounterFamily::default(),
        );
        family.get_or_create(&vec![("op", "a".into())]).inc();
        let text = encode();
        assert!(text.contains("# HELP test_operations Cumulative number of test operations.\n"));
        assert!(text.contains("test_operations_total{op=\"a\"} 1"), "{text}");
        assert!(
            text.contains("process_resident_memory_bytes{service=\"unit-test\"}"),
            "{text}"
        );
        assert!(
            text.contains("process_cpu_seconds_total{service=\"unit-test\"}"),
            "{text}"
        );
        assert!(!text.contains("# EOF"), "{text}");
    }
}
