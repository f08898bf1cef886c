//! The `kubelet.v1.Metrics` service every server offers: the process's registry
//! (`nodeagent_telemetry::metrics`) as OpenMetrics text, which http-server merges into
//! `/metrics`.

use nodeagent_proto::api::metrics_server::Metrics;
use nodeagent_proto::api::{ScrapeRequest, ScrapeResponse};

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
}
