//! `/metrics` and its siblings: every service's metrics, concatenated.

use crate::AppState;
use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use nodeagent_proto::api::ScrapeRequest;
use nodeagent_proto::api::metrics_client::MetricsClient;
use nodeagent_transport::WithLimits;
use std::sync::Arc;

pub fn routes() -> Router<Arc<AppState>> {
    Router::new().route("/metrics", get(metrics))
}

/// Every service's metrics that serves the Metrics API, concatenated.
async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let mut text = String::new();
    for channel in state.peers.values() {
        let mut client = MetricsClient::new(channel.clone()).with_limits();
        if let Ok(Ok(r)) = tokio::time::timeout(
            std::time::Duration::from_secs(2),
            client.scrape(ScrapeRequest {}),
        )
        .await
        {
            text.push_str(&r.into_inner().text);
        }
    }
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        text,
    )
        .into_response()
}
