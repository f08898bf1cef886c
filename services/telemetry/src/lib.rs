//! Telemetry for every service: a tracing subscriber (upstream's klog text or
//! component-base JSON lines, `klog.rs`), OpenTelemetry spans
//! exported over OTLP/gRPC when an endpoint is configured, and W3C trace-context
//! propagation both in gRPC metadata (unary calls) and in the per-message `TraceContext`
//! fields of our streams.

mod go_quote;
pub mod klog;
pub mod metrics;
mod propagation;
pub mod recent;

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
use tracing::Level;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer as _;
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
    /// klog's `--vmodule`: (file pattern, verbosity) for the source files it names.
    pub vmodule: Vec<(String, u8)>,
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
    let mut builder = SdkTracerProvider::builder();
    if recent::enabled() {
        builder = builder.with_span_processor(recent::RecentSpans);
    }
    let mut builder = builder.with_resource(
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

    let otel = tracing_opentelemetry::layer().with_tracer(tracer);
    // Upstream's line formats: klog's text header or component-base's JSON keys.
    let format = if config.format == "json" {
        klog::Format::Json
    } else {
        klog::Format::Text
    };
    let layers = otel.and_then(klog::KlogLayer::new(format, &config.service_name));
    // RUST_LOG, when set (and not empty), decides alone; else our own crates at `--v`'s
    // level, the dependencies at warn, and the files `--vmodule` names at theirs. The
    // decision is made once per call site (its target, file and level are static).
    let from_env = match std::env::var("RUST_LOG") {
        Ok(v) if !v.trim().is_empty() => EnvFilter::try_from_default_env().ok(),
        _ => None,
    };
    let result = match from_env {
        Some(env) => tracing_subscriber::registry()
            .with(layers.with_filter(env))
            .try_init(),
        None => {
            let base = level_of(config.verbosity);
            let vmodule: Vec<(String, Level)> = config
                .vmodule
                .iter()
                .map(|(p, v)| (p.clone(), level_of(*v)))
                .collect();
            let filter = tracing_subscriber::filter::filter_fn(move |m| {
                allows(m.target(), m.file(), *m.level(), base, &vmodule)
            });
            tracing_subscriber::registry()
                .with(layers.with_filter(filter))
                .try_init()
        }
    };
    // A second init (tests running several services in one process) keeps the first.
    let _ = result;
    Ok(TelemetryGuard { provider })
}

/// Our crates, whose lines `--v` governs (the dependencies log at warn).
const OUR_CRATES: [&str; 15] = [
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
];

/// The tracing level `--v`'s number enables: 0–3 info, 4–5 debug, 6 and over trace.
fn level_of(v: u8) -> Level {
    match v {
        0..=3 => Level::INFO,
        4..=5 => Level::DEBUG,
        _ => Level::TRACE,
    }
}

/// Whether a call site logs: at `base` in our crates, warn in the others, unless a
/// `vmodule` pattern names its source file, whose level then wins (the first that
/// matches, as klog's).
fn allows(
    target: &str,
    file: Option<&str>,
    level: Level,
    base: Level,
    vmodule: &[(String, Level)],
) -> bool {
    let named = file.and_then(|f| {
        vmodule
            .iter()
            .find(|(pattern, _)| vmodule_matches(pattern, f))
    });
    let max = match named {
        Some((_, l)) => *l,
        None if OUR_CRATES.contains(&target.split("::").next().unwrap_or(target)) => base,
        None => Level::WARN,
    };
    level <= max
}

/// klog's vmodule match: the pattern against the file's name without its extension, or,
/// for a pattern holding a `/`, against as many trailing path parts as it has (klog's
/// `filepath.Match` of the path's suffix); `*` and `?` as globs.
fn vmodule_matches(pattern: &str, file: &str) -> bool {
    let file = file.strip_suffix(".rs").unwrap_or(file);
    let parts = pattern.split('/').count();
    let tail: Vec<&str> = file.rsplit('/').take(parts).collect();
    if tail.len() < parts {
        return false;
    }
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    glob(pattern, &tail.join("/"))
}

/// `*` (any run of characters but `/`) and `?` (one such character); the rest literal.
fn glob(pattern: &str, text: &str) -> bool {
    fn go(p: &[char], t: &[char]) -> bool {
        match p.split_first() {
            None => t.is_empty(),
            Some(('*', rest)) => (0..=t.len())
                .take_while(|&i| i == 0 || t[i - 1] != '/')
                .any(|i| go(rest, &t[i..])),
            Some(('?', rest)) => t.first().is_some_and(|c| *c != '/') && go(rest, &t[1..]),
            Some((c, rest)) => t.first() == Some(c) && go(rest, &t[1..]),
        }
    }
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    go(&p, &t)
}

#[cfg(test)]
mod tests {
    use super::{Level, allows, vmodule_matches};

    /// klog's `--vmodule` (k8s.io/klog/v2 klog.go: "pattern=N ... a literal file name
    /// (minus the ".go" suffix) or "glob" pattern ... -vmodule=gopher*=3 sets the V level
    /// to 3 in all Go files whose names begin with "gopher"", and a pattern holding a
    /// slash matches the path's trailing parts), with our ".rs" for Go's ".go".
    #[test]
    fn vmodule_patterns_match_as_klogs() {
        let f = "services/pod-sync/src/sync/runtime_calls.rs";
        for (pattern, hit) in [
            ("runtime_calls", true),
            ("runtime_*", true),
            ("runtime_call?", true),
            ("*", true),
            ("runtime", false),
            ("runtime_calls.rs", false),
            ("sync/runtime_calls", true),
            ("sync/*", true),
            ("src/*", false),
            ("pod-sync/src/sync/runtime_calls", true),
            ("/x/pod-sync/src/sync/runtime_calls", false),
            ("gopher*", false),
        ] {
            assert_eq!(vmodule_matches(pattern, f), hit, "{pattern}");
        }
        assert!(vmodule_matches("gopher*", "/go/src/gopherlib.rs"));
    }

    /// `-v` for our crates, warn for the others, and a file named by `--vmodule` at its
    /// own level whichever crate it is in (lower or higher than `-v`: the first matching
    /// pattern wins, as klog's).
    #[test]
    fn vmodule_sets_a_files_level_over_v() {
        let vm = vec![
            ("runtime_calls".to_string(), Level::TRACE),
            ("quiet".to_string(), Level::INFO),
        ];
        let ours = "pod_sync::sync::runtime_calls";
        let file = Some("services/pod-sync/src/sync/runtime_calls.rs");
        let other = Some("services/pod-sync/src/sync/mod.rs");
        assert!(allows(ours, file, Level::TRACE, Level::INFO, &vm));
        assert!(!allows(
            "pod_sync::sync",
            other,
            Level::DEBUG,
            Level::INFO,
            &vm
        ));
        assert!(allows(
            "pod_sync::sync",
            other,
            Level::INFO,
            Level::INFO,
            &vm
        ));
        assert!(!allows(
            "pod_sync::quiet",
            Some("src/quiet.rs"),
            Level::DEBUG,
            Level::DEBUG,
            &vm
        ));
        // Dependencies at warn, unless named.
        assert!(!allows(
            "h2::proto",
            Some("h2/src/proto/streams.rs"),
            Level::INFO,
            Level::TRACE,
            &[]
        ));
        assert!(allows(
            "h2::proto",
            Some("h2/src/proto/streams.rs"),
            Level::WARN,
            Level::INFO,
            &[]
        ));
        let h2 = vec![("streams".to_string(), Level::DEBUG)];
        assert!(allows(
            "h2::proto",
            Some("h2/src/proto/streams.rs"),
            Level::DEBUG,
            Level::INFO,
            &h2
        ));
        // Without a file, only -v applies.
        assert!(!allows(ours, None, Level::TRACE, Level::INFO, &vm));
    }
    /// `--v` reaches every crate of ours (the issue: nodeagent_config's info lines,
    /// certificate progress and events among them, never appeared at any `--v`): each
    /// crate under services/ is in the filter.
    #[test]
    fn every_crate_of_ours_gets_the_level() {
        let ours = super::OUR_CRATES;
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
                ours.contains(&name.as_str()),
                "{name} ({}) is not in {ours:?}",
                manifest.display()
            );
        }
    }
}
