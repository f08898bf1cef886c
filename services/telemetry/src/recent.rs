//! The spans this process finished lately, kept in memory (at most [`KEPT`], the oldest
//! going first) whether or not an OTLP endpoint is set, so that the node's web page can
//! show a pod's recent traces across the services (each service's `Metrics.RecentSpans`)
//! with the trace IDs an OTLP backend would show for them.

use opentelemetry::Context;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanProcessor};
use std::collections::VecDeque;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, SystemTime};

/// Spans kept per process.
pub const KEPT: usize = 2048;
/// Attributes kept per span (the first ones: the pod's identity comes first).
const ATTRIBUTES_KEPT: usize = 12;
/// An attribute's value is cut to this many bytes.
const VALUE_BYTES: usize = 256;

#[derive(Debug, Clone, PartialEq)]
pub struct RecentSpan {
    /// Lower-case hex, as OTLP backends show them.
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    pub name: String,
    pub start_unix_nanos: i64,
    pub end_unix_nanos: i64,
    pub attributes: Vec<(String, String)>,
    /// The span's error status description, when it ended in error.
    pub error: Option<String>,
}

static RECENT: LazyLock<Mutex<VecDeque<RecentSpan>>> =
    LazyLock::new(|| Mutex::new(VecDeque::with_capacity(KEPT)));

fn unix_nanos(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

fn cut(mut s: String) -> String {
    if s.len() > VALUE_BYTES {
        let mut end = VALUE_BYTES;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

fn keep(span: RecentSpan) {
    let mut all = RECENT.lock().unwrap_or_else(|e| e.into_inner());
    if all.len() == KEPT {
        all.pop_front();
    }
    all.push_back(span);
}

/// Whether this process keeps its spans: unless `NODEAGENT_RECENT_SPANS=0` (then the
/// node page shows no traces; with no OTLP endpoint either, spans are not even recorded).
pub fn enabled() -> bool {
    std::env::var_os("NODEAGENT_RECENT_SPANS").is_none_or(|v| v != "0")
}

/// The attribute that names a span's pod.
pub const POD_UID: &str = "k8s.pod.uid";

/// The calls whose spans are not kept: health checks and metrics scrapes (and this ring's
/// own reads) come every few seconds and would push the pods' traces out.
const NOT_KEPT: [&str; 2] = ["grpc.health.v1.Health/", "kubelet.v1.Metrics/"];

/// The spans kept that carry `pod_uid` as their `k8s.pod.uid` (when not empty) or belong
/// to one of `trace_ids`, oldest first.
pub fn matching(pod_uid: &str, trace_ids: &[String]) -> Vec<RecentSpan> {
    let all = RECENT.lock().unwrap_or_else(|e| e.into_inner());
    all.iter()
        .filter(|s| {
            (!pod_uid.is_empty()
                && s.attributes
                    .iter()
                    .any(|(k, v)| k == POD_UID && v == pod_uid))
                || trace_ids.contains(&s.trace_id)
        })
        .cloned()
        .collect()
}

/// The processor the tracer provider runs every finished span through.
#[derive(Debug, Default)]
pub struct RecentSpans;

impl SpanProcessor for RecentSpans {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if NOT_KEPT.iter().any(|p| span.name.starts_with(p)) {
            return;
        }
        let parent = span.parent_span_id;
        keep(RecentSpan {
            trace_id: span.span_context.trace_id().to_string(),
            span_id: span.span_context.span_id().to_string(),
            parent_span_id: if parent == opentelemetry::trace::SpanId::INVALID {
                String::new()
            } else {
                parent.to_string()
            },
            name: span.name.into_owned(),
            start_unix_nanos: unix_nanos(span.start_time),
            end_unix_nanos: unix_nanos(span.end_time),
            attributes: span
                .attributes
                .into_iter()
                .take(ATTRIBUTES_KEPT)
                .map(|kv| (kv.key.to_string(), cut(kv.value.to_string())))
                .collect(),
            error: match span.status {
                opentelemetry::trace::Status::Error { description } => {
                    Some(cut(description.into_owned()))
                }
                _ => None,
            },
        });
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{Span as _, TraceContextExt as _, Tracer, TracerProvider as _};

    #[test]
    fn finished_spans_are_kept_bounded_and_found_by_pod_or_trace() {
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
            .with_span_processor(RecentSpans)
            .build();
        let tracer = provider.tracer("test");
        let uid = "6c1b-recent-spans-test";
        let mut root = tracer.start("sync_pod");
        root.set_attribute(opentelemetry::KeyValue::new("k8s.pod.uid", uid));
        root.set_attribute(opentelemetry::KeyValue::new("long", "x".repeat(1000)));
        root.set_attribute(opentelemetry::KeyValue::new(
            "k8s.namespace.name",
            "default",
        ));
        let trace_id = root.span_context().trace_id().to_string();
        let cx = Context::current_with_span(root);
        let mut child = tracer.start_with_context("ensure_volumes", &cx);
        child.set_status(opentelemetry::trace::Status::error("mount failed"));
        child.end();
        drop(cx);
        let by_pod = matching(uid, &[]);
        assert_eq!(by_pod.len(), 1, "{by_pod:?}");
        assert_eq!(by_pod[0].name, "sync_pod");
        assert_eq!(by_pod[0].trace_id, trace_id);
        assert_eq!(by_pod[0].trace_id.len(), 32, "OTLP's hex form");
        assert!(by_pod[0].parent_span_id.is_empty());
        let long = &by_pod[0]
            .attributes
            .iter()
            .find(|(k, _)| k == "long")
            .unwrap()
            .1;
        assert_eq!(long.len(), VALUE_BYTES);
        let by_trace = matching("", std::slice::from_ref(&trace_id));
        let names: Vec<&str> = by_trace.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            ["ensure_volumes", "sync_pod"],
            "in the order they ended"
        );
        assert_eq!(by_trace[0].parent_span_id, by_pod[0].span_id);
        assert_eq!(by_trace[0].error.as_deref(), Some("mount failed"));
        // Only the pod's own attribute names it; a scrape's span is not kept at all.
        assert!(matching("default", &[]).is_empty());
        tracer.start("kubelet.v1.Metrics/Scrape").end();
        assert!(
            !RECENT
                .lock()
                .unwrap()
                .iter()
                .any(|s| s.name.starts_with("kubelet.v1.Metrics/"))
        );
        for i in 0..KEPT {
            keep(RecentSpan {
                trace_id: format!("{i}"),
                span_id: String::new(),
                parent_span_id: String::new(),
                name: String::new(),
                start_unix_nanos: 0,
                end_unix_nanos: 0,
                attributes: vec![],
                error: None,
            });
        }
        assert!(matching(uid, &[]).is_empty(), "the oldest went first");
        assert_eq!(RECENT.lock().unwrap().len(), KEPT);
    }
}
