//! pleg's metrics, with upstream's names: `kubelet_pleg_relist_duration_seconds`
//! (histogram), `kubelet_pleg_relist_interval_seconds` (histogram) and
//! `kubelet_pleg_last_seen_seconds` (gauge, unix time of the last relist).

use crate::RelistCache;
use nodeagent_proto::api::metrics_server::Metrics;
use nodeagent_proto::api::{ScrapeRequest, ScrapeResponse};
use std::fmt::Write;
use std::sync::{Arc, Mutex};

/// Prometheus' default buckets, which upstream uses for these histograms.
const BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

#[derive(Debug, Clone, Default)]
pub struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    pub fn observe(&mut self, v: f64) {
        for (i, b) in BUCKETS.iter().enumerate() {
            if v <= *b {
                self.counts[i] += 1;
            }
        }
        self.count += 1;
        self.sum += v;
    }

    fn render(&self, name: &str, help: &str, out: &mut String) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (i, b) in BUCKETS.iter().enumerate() {
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {}", self.counts[i]);
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}\n{name}_count {}", self.sum, self.count);
    }
}

pub struct PlegMetrics(pub Arc<Mutex<RelistCache>>);

pub fn render(cache: &RelistCache) -> String {
    let mut out = String::new();
    cache.relist_duration.render(
        "kubelet_pleg_relist_duration_seconds",
        "[ALPHA] Duration in seconds for relisting pods in PLEG.",
        &mut out,
    );
    cache.relist_interval.render(
        "kubelet_pleg_relist_interval_seconds",
        "[ALPHA] Interval in seconds between relisting in PLEG.",
        &mut out,
    );
    let last = cache
        .last_relist
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    let _ = writeln!(
        out,
        "# HELP kubelet_pleg_last_seen_seconds [ALPHA] Timestamp in seconds when PLEG was last seen active.\n# TYPE kubelet_pleg_last_seen_seconds gauge\nkubelet_pleg_last_seen_seconds {last}"
    );
    out
}

#[tonic::async_trait]
impl Metrics for PlegMetrics {
    async fn scrape(
        &self,
        _r: tonic::Request<ScrapeRequest>,
    ) -> Result<tonic::Response<ScrapeResponse>, tonic::Status> {
        let cache = self.0.lock().unwrap_or_else(|e| e.into_inner());
        Ok(tonic::Response::new(ScrapeResponse {
            text: render(&cache),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_upstream_names_and_cumulative_buckets() {
        let mut cache = RelistCache::default();
        cache.relist_duration.observe(0.003);
        cache.relist_duration.observe(0.2);
        let text = render(&cache);
        assert!(
            text.contains("kubelet_pleg_relist_duration_seconds_bucket{le=\"0.005\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("kubelet_pleg_relist_duration_seconds_bucket{le=\"0.25\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("kubelet_pleg_relist_duration_seconds_count 2"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE kubelet_pleg_last_seen_seconds gauge"),
            "{text}"
        );
    }
}
