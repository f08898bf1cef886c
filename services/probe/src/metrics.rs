//! Upstream's prober metrics for one probe worker: `prober_probe_total` by result and
//! `prober_probe_duration_seconds`, with the worker's pod and container labels.

use nodeagent_proto::api::probe_result::Kind;
use nodeagent_telemetry::metrics::{Labels, kubelet};

pub struct ProbeMetrics {
    /// probe_type, container, pod, namespace.
    labels: Labels,
    pod_uid: String,
}

impl ProbeMetrics {
    pub fn new(kind: i32, container: &str, pod: &str, namespace: &str, pod_uid: &str) -> Self {
        Self {
            labels: vec![
                ("probe_type", probe_kind_name(kind).to_string()),
                ("container", container.to_string()),
                ("pod", pod.to_string()),
                ("namespace", namespace.to_string()),
            ],
            pod_uid: pod_uid.to_string(),
        }
    }

    /// One probe run that `succeeded` or not, taking `seconds`.
    pub fn observe(&self, succeeded: bool, seconds: f64) {
        let mut labels = self.labels.clone();
        labels.insert(
            1,
            (
                "result",
                if succeeded { "successful" } else { "failed" }.to_string(),
            ),
        );
        labels.push(("pod_uid", self.pod_uid.clone()));
        kubelet::PROBE_TOTAL.get_or_create(&labels).inc();
        kubelet::PROBE_DURATION
            .get_or_create(&self.labels)
            .observe(seconds);
    }
}

/// Upstream's probe type name, as its events and metrics spell it.
pub fn probe_kind_name(kind: i32) -> &'static str {
    match Kind::try_from(kind) {
        Ok(Kind::Liveness) => "Liveness",
        Ok(Kind::Readiness) => "Readiness",
        Ok(Kind::Startup) => "Startup",
        _ => "Unknown",
    }
}
