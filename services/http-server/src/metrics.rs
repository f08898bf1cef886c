//! `/metrics` and its siblings. `/metrics` merges every service's registry (each
//! service's `Metrics.Scrape` plus http-server's own) into one Prometheus text body:
//! one family per name, `process_*` series told apart by their `service` label, and
//! counters of the same series summed. `/metrics/probes` is the prober's families;
//! `/metrics/resource` and `/metrics/cadvisor` are computed from the same data as the
//! Summary API.

mod devices;
pub mod exposition;
#[cfg(test)]
mod mixin;
mod resource;

use crate::AppState;
use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use exposition::Exposition;
use nodeagent_config::Service;
use nodeagent_proto::api::ScrapeRequest;
use nodeagent_proto::api::metrics_client::MetricsClient;
use nodeagent_transport::WithLimits;
use std::sync::Arc;
use std::time::Duration;

/// A service that does not answer within this long is left out of one scrape.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(2);

/// Upstream's content type for the classic text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/metrics/probes", get(probes))
        .route("/metrics/resource", get(resource::resource))
        .route("/metrics/cadvisor", get(resource::cadvisor))
}

pub fn text(body: String) -> Response {
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], body).into_response()
}

async fn scrape(service: Service, channel: nodeagent_transport::Channel) -> Option<String> {
    let mut client = MetricsClient::new(channel).with_limits();
    match tokio::time::timeout(SCRAPE_TIMEOUT, client.scrape(ScrapeRequest {})).await {
        Ok(Ok(r)) => Some(r.into_inner().text),
        Ok(Err(e)) => {
            tracing::debug!(service = service.name(), error = %e.message(), "metrics scrape failed");
            None
        }
        Err(_) => {
            tracing::debug!(service = service.name(), "metrics scrape timed out");
            None
        }
    }
}

/// Every service's metrics, merged; `only` picks the services to ask (None: all).
pub(crate) async fn gather(state: &AppState, only: Option<Service>) -> Exposition {
    let scrapes = state
        .peers
        .iter()
        .filter(|(s, _)| only.is_none_or(|o| o == **s))
        .map(|(s, channel)| {
            let service = *s;
            let channel = channel.clone();
            async move { (service.name(), scrape(service, channel).await) }
        });
    let mut texts = futures::future::join_all(scrapes).await;
    if only.is_none() {
        let own = tokio::task::spawn_blocking(nodeagent_telemetry::metrics::encode)
            .await
            .ok();
        texts.push((Service::HttpServer.name(), own));
    }
    let mut all = Exposition::default();
    for (service, text) in texts {
        let Some(text) = text else { continue };
        match exposition::parse(&text) {
            Ok(families) => {
                for why in all.merge(families) {
                    tracing::warn!(%service, "metric family left out: {why}");
                }
            }
            Err(e) => tracing::warn!(%service, error = %e, "unparseable metrics"),
        }
    }
    all
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    text(gather(&state, None).await.render())
}

/// Upstream's `/metrics/probes` registry: the prober's families only.
async fn probes(State(state): State<Arc<AppState>>) -> Response {
    let mut all = gather(&state, Some(Service::Probe)).await;
    all.retain(|name| name.starts_with("prober_probe_"));
    text(all.render())
}
