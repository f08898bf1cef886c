//! Telemetry for every service: a tracing subscriber (upstream's klog text or
//! component-base JSON lines, `klog.rs`), OpenTelemetry spans
//! exported over OTLP/gRPC when an endpoint is configured, and W3C trace-context
//! propagation both in gRPC metadata (unary calls) and in the per-message `TraceContext`
//! fields of our streams.

mod go_quote;
pub mod klog;
pub mod metrics;
mod propagation;

pub use go_quote::go_quote;
pub use propagation::{
    HeaderExtractor, HeaderInjector, context_from_headers, current_trace_context, inject_headers,
    set_parent_from,
};

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use std::time::Duration;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// What [`init`] needs to know.
#[derive(Debug, Clone)]
pub struct TelemetryConfig {
    pub service_name: String,
    /// "text" or "json".
    pub format: String,
    /// Upstream-style verbosity: 0 info, 4 debug, 6 trace.
    pub verbosity: u8,
    /// OTLP/gRPC endpoint; `None` keeps spans local (trace ids still propagate).
    pub otlp_endpoint: Option<String>,
}

/// Flushes and shuts down span export when the service stops.
pub struct TelemetryGuard {
    provider: SdkTracerProvider,
}

impl TelemetryGuard {
    /// Exports what is buffered; waits at most `timeout`.
    pub fn shutdown(self, timeout: Duration) {
        if let Err(e) = self.provider.shutdown_with_timeout(timeout) {
            eprintln!("telemetry shutdown: {e}");
        }
    }
}

/// Installs the global subscriber. Must run inside a multi-thread tokio runtime when an
/// OTLP endpoint is set (the exporter's batch worker is spawned on it).
pub fn init(config: &TelemetryConfig) -> anyhow::Result<TelemetryGuard> {
    let mut builder = SdkTracerProvider::builder().with_resource(
        Resource::builder()
            .with_service_name(config.service_name.clone())
            .build(),
    );
    if let Some(endpoint) = &config.otlp_endpoint {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint.clone())
            .build()?;
        builder = builder.with_batch_exporter(exporter);
    }
    let provider = builder.build();
    let tracer = provider.tracer(config.service_name.clone());

    let level = match config.verbosity {
        0..=3 => "info",
        4..=5 => "debug",
        _ => "trace",
    };
    // Our own crates at the chosen level; dependencies stay at warn unless RUST_LOG says.
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        EnvFilter::new(format!(
            "warn,{level_crates}",
            level_crates = crate_filters(level)
        ))
    });
    let otel = tracing_opentelemetry::layer().with_tracer(tracer);
    // Upstream's line formats: klog's text header or component-base's JSON keys.
    let format = if config.format == "json" {
        klog::Format::Json
    } else {
        klog::Format::Text
    };
    let result = tracing_subscriber::registry()
        .with(filter)
        .with(otel)
        .with(klog::KlogLayer::new(format, &config.service_name))
        .try_init();
    // A second init (tests running several services in one process) keeps the first.
    let _ = result;
    Ok(TelemetryGuard { provider })
}

fn crate_filters(level: &str) -> String {
    [
        "nodeagent",
        "nodeagent_config",
        "nodeagent_transport",
        "nodeagent_cri",
        "nodeagent_du",
        "nodeagent_hostpath",
        "nodeagent_spdy",
        "nodeagent_telemetry",
        "config_source",
        "pod_sync",
        "pleg",
        "probe",
        "volume",
        "node_status",
        "http_server",
    ]
    .iter()
    .map(|c| format!("{c}={level}"))
    .collect::<Vec<_>>()
    .join(",")
}

#[cfg(test)]
mod tests {
    /// `--v` reaches every crate of ours (the issue: nodeagent_config's info lines,
    /// certificate progress and events among them, never appeared at any `--v`): each
    /// crate under services/ is in the filter.
    #[test]
    fn every_crate_of_ours_gets_the_level() {
        let filters = super::crate_filters("debug");
        let services = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        for entry in std::fs::read_dir(&services).unwrap() {
            let manifest = entry.unwrap().path().join("Cargo.toml");
            let Ok(text) = std::fs::read_to_string(&manifest) else {
                continue;
            };
            let name = text
                .lines()
                .find_map(|l| l.strip_prefix("name = "))
                .unwrap()
                .trim_matches('"')
                .replace('-', "_");
            assert!(
                filters.split(',').any(|f| f == format!("{name}=debug")),
                "{name} ({}) is not in {filters}",
                manifest.display()
            );
        }
    }
}
