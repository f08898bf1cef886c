//! A pod's recent traces across the services: every service keeps the spans it finished
//! lately (`Metrics.RecentSpans`, `nodeagent_telemetry::recent`); the traces are those of
//! the spans that carry the pod's UID, and each is shown whole, with the spans of every
//! service in it (a pod's start: config-source, pod-sync, volume, ...), under the trace ID an
//! OTLP backend would show.

use crate::AppState;
use nodeagent_config::Service;
use nodeagent_proto::api::metrics_client::MetricsClient;
use nodeagent_proto::api::{RecentSpan, RecentSpansRequest};
use nodeagent_transport::WithLimits;
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// Traces shown per pod: the latest ones.
pub const SHOWN: usize = 8;
const ASK: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ShownSpan {
    pub service: &'static str,
    pub name: String,
    pub span_id: String,
    pub parent_span_id: String,
    /// From the trace's first span's start.
    pub offset_ms: f64,
    pub duration_ms: f64,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub error: String,
    pub attributes: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Trace {
    pub trace_id: String,
    pub start_unix_ms: i64,
    pub duration_ms: f64,
    /// The first span's name (a root span's, when this process saw the root).
    pub name: String,
    pub spans: Vec<ShownSpan>,
}

/// The spans by trace, the latest [`SHOWN`] traces first, each trace's spans by start.
pub fn group(spans: Vec<(&'static str, RecentSpan)>) -> Vec<Trace> {
    let mut by_trace: BTreeMap<String, Vec<(&'static str, RecentSpan)>> = BTreeMap::new();
    for (service, span) in spans {
        by_trace
            .entry(span.trace_id.clone())
            .or_default()
            .push((service, span));
    }
    let mut traces: Vec<Trace> = by_trace
        .into_iter()
        .map(|(trace_id, mut spans)| {
            spans.sort_by_key(|(_, s)| (s.start_unix_nanos, -s.end_unix_nanos));
            spans.dedup_by(|a, b| a.1.span_id == b.1.span_id);
            let start = spans
                .iter()
                .map(|(_, s)| s.start_unix_nanos)
                .min()
                .unwrap_or(0);
            let end = spans
                .iter()
                .map(|(_, s)| s.end_unix_nanos)
                .max()
                .unwrap_or(0);
            let root = spans
                .iter()
                .find(|(_, s)| s.parent_span_id.is_empty())
                .or(spans.first())
                .map(|(_, s)| s.name.clone())
                .unwrap_or_default();
            let ms = |nanos: i64| nanos as f64 / 1e6;
            Trace {
                trace_id,
                start_unix_ms: start / 1_000_000,
                duration_ms: ms(end - start),
                name: root,
                spans: spans
                    .into_iter()
                    .map(|(service, s)| ShownSpan {
                        service,
                        offset_ms: ms(s.start_unix_nanos - start),
                        duration_ms: ms(s.end_unix_nanos - s.start_unix_nanos),
                        name: s.name,
                        span_id: s.span_id,
                        parent_span_id: s.parent_span_id,
                        error: s.error,
                        attributes: s.attributes.into_iter().collect(),
                    })
                    .collect(),
            }
        })
        .collect();
    traces.sort_by_key(|t| std::cmp::Reverse(t.start_unix_ms));
    traces.truncate(SHOWN);
    traces
}

/// Asks every service (and this one) for the spans `request` selects.
async fn ask_all(state: &AppState, request: RecentSpansRequest) -> Vec<(&'static str, RecentSpan)> {
    let asks = state.peers.iter().map(|(service, channel)| {
        let (service, channel, request) = (*service, channel.clone(), request.clone());
        async move {
            let mut c = MetricsClient::new(channel).with_limits();
            match tokio::time::timeout(ASK, c.recent_spans(request)).await {
                Ok(Ok(r)) => r
                    .into_inner()
                    .spans
                    .into_iter()
                    .map(|s| (service.name(), s))
                    .collect(),
                // A service of an older build has no RecentSpans: its spans are left out.
                _ => Vec::new(),
            }
        }
    });
    let mut all: Vec<(&'static str, RecentSpan)> = futures::future::join_all(asks)
        .await
        .into_iter()
        .flatten()
        .collect();
    all.extend(
        nodeagent_telemetry::recent::matching(&request.pod_uid, &request.trace_ids)
            .into_iter()
            .map(|s| {
                (
                    Service::HttpServer.name(),
                    nodeagent_transport::span_message(s),
                )
            }),
    );
    all
}

/// The pod's latest traces, whole.
pub async fn of_pod(state: &AppState, uid: &str) -> Vec<Trace> {
    let tagged = ask_all(
        state,
        RecentSpansRequest {
            pod_uid: uid.to_string(),
            trace_ids: vec![],
        },
    )
    .await;
    let latest: Vec<String> = group(tagged).into_iter().map(|t| t.trace_id).collect();
    if latest.is_empty() {
        return Vec::new();
    }
    group(
        ask_all(
            state,
            RecentSpansRequest {
                pod_uid: String::new(),
                trace_ids: latest,
            },
        )
        .await,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(trace: &str, id: &str, parent: &str, name: &str, start: i64, end: i64) -> RecentSpan {
        RecentSpan {
            trace_id: trace.into(),
            span_id: id.into(),
            parent_span_id: parent.into(),
            name: name.into(),
            start_unix_nanos: start,
            end_unix_nanos: end,
            attributes: Default::default(),
            error: String::new(),
        }
    }

    #[test]
    fn spans_of_several_services_make_one_trace_latest_first() {
        let ms = 1_000_000;
        let traces = group(vec![
            (
                "pod-sync",
                span("t1", "b", "a", "sync_pod", 2 * ms, 50 * ms),
            ),
            (
                "config-source",
                span("t1", "a", "", "pod_config", 1_000 * ms, 1_001 * ms),
            ),
            (
                "volume",
                span("t1", "c", "b", "ensure_pod_volumes", 5 * ms, 9 * ms),
            ),
            (
                "config-source",
                span("t1", "a", "", "pod_config", 1_000 * ms, 1_001 * ms),
            ),
            (
                "pod-sync",
                span("t2", "d", "", "sync_pod", 3_000 * ms, 3_010 * ms),
            ),
        ]);
        assert_eq!(traces.len(), 2);
        assert_eq!(traces[0].trace_id, "t2", "the latest first");
        let t1 = &traces[1];
        let names: Vec<(&str, &str)> = t1
            .spans
            .iter()
            .map(|s| (s.service, s.name.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                ("pod-sync", "sync_pod"),
                ("volume", "ensure_pod_volumes"),
                ("config-source", "pod_config")
            ],
            "by start; a span two services reported (or asked twice) once"
        );
        assert_eq!(t1.name, "pod_config", "the root's name");
        assert_eq!(t1.spans[1].offset_ms, 3.0);
        assert_eq!(t1.spans[1].duration_ms, 4.0);
        assert_eq!(t1.duration_ms, 999.0);
        let many: Vec<_> = (0..20)
            .map(|i| {
                (
                    "pleg",
                    span(&format!("t{i:02}"), "x", "", "relist", i * ms, i * ms + 1),
                )
            })
            .collect();
        assert_eq!(group(many).len(), SHOWN);
    }
}
