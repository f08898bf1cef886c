//! The `kubelet.v1.Metrics` service every server offers: the process's registry
//! (`nodeagent_telemetry::metrics`) as OpenMetrics text, which http-server merges into
//! `/metrics`, the Warning events it recorded lately, which `nodeagent status` shows, and
//! the spans it finished lately, which the node's web page shows.

use nodeagent_proto::api::metrics_server::Metrics;
use nodeagent_proto::api::{
    RecentSpan, RecentSpansRequest, RecentSpansResponse, RecentWarning, RecentWarningsRequest,
    RecentWarningsResponse, ScrapeRequest, ScrapeResponse,
};

#[derive(Debug, Clone, Copy, Default)]
pub struct MetricsService;

#[tonic::async_trait]
impl Metrics for MetricsService {
    async fn scrape(
        &self,
        _request: tonic::Request<ScrapeRequest>,
    ) -> Result<tonic::Response<ScrapeResponse>, tonic::Status> {
        // The process collector reads /proc/self.
        let text = tokio::task::spawn_blocking(nodeagent_telemetry::metrics::encode)
            .await
            .map_err(|e| tonic::Status::internal(format!("encoding metrics failed: {e}")))?;
        Ok(tonic::Response::new(ScrapeResponse { text }))
    }

    async fn recent_warnings(
        &self,
        _request: tonic::Request<RecentWarningsRequest>,
    ) -> Result<tonic::Response<RecentWarningsResponse>, tonic::Status> {
        let warnings = nodeagent_config::events::recent::list()
            .into_iter()
            .map(|w| RecentWarning {
                last_unix_nanos: w.last_unix_nanos,
                object: w.object,
                field_path: w.field_path,
                reason: w.reason,
                message: w.message,
                count: w.count,
            })
            .collect();
        Ok(tonic::Response::new(RecentWarningsResponse { warnings }))
    }

    async fn recent_spans(
        &self,
        request: tonic::Request<RecentSpansRequest>,
    ) -> Result<tonic::Response<RecentSpansResponse>, tonic::Status> {
        let request = request.into_inner();
        let spans = nodeagent_telemetry::recent::matching(&request.pod_uid, &request.trace_ids)
            .into_iter()
            .map(span_message)
            .collect();
        Ok(tonic::Response::new(RecentSpansResponse { spans }))
    }
}

/// A span this process kept, as `Metrics.RecentSpans` sends it.
pub fn span_message(s: nodeagent_telemetry::recent::RecentSpan) -> RecentSpan {
    RecentSpan {
        trace_id: s.trace_id,
        span_id: s.span_id,
        parent_span_id: s.parent_span_id,
        name: s.name,
        start_unix_nanos: s.start_unix_nanos,
        end_unix_nanos: s.end_unix_nanos,
        attributes: s.attributes.into_iter().collect(),
        error: s.error.unwrap_or_default(),
    }
}
