//! http-server: the kubelet's HTTP endpoints. `/healthz` on healthzBindAddress:healthzPort
//! aggregates every service's gRPC health and pleg's relist health; the read-only port
//! (readOnlyPort, off by default as upstream) serves `/pods` and `/healthz`.

mod health;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use nodeagent_config::{Config, Service};
use nodeagent_proto::api::metrics_client::MetricsClient;
use nodeagent_proto::api::pod_sync_client::PodSyncClient;
use nodeagent_proto::api::{ScrapeRequest, WatchPodStatusRequest};
use nodeagent_transport::{Assembler, Channel, Server, Shutdown, WithLimits};
use std::collections::BTreeMap;
use std::sync::Arc;

pub use health::{HealthReport, check_all};

pub struct AppState {
    pub peers: BTreeMap<Service, Channel>,
    pub pod_sync: PodSyncClient<Channel>,
}

/// Runs the http-server until `shutdown`.
pub async fn run(config: Config, shutdown: Shutdown) -> anyhow::Result<()> {
    let peers: BTreeMap<Service, Channel> = Service::ALL
        .into_iter()
        .filter(|s| *s != Service::HttpServer)
        .map(|s| (s, nodeagent_transport::connect(config.endpoint(s))))
        .collect();
    let state = Arc::new(AppState {
        pod_sync: PodSyncClient::new(peers[&Service::PodSync].clone()).with_limits(),
        peers,
    });
    let mut tasks = tokio::task::JoinSet::new();
    if config.kubelet.healthz_port > 0 {
        let addr = format!(
            "{}:{}",
            config.kubelet.healthz_bind_address, config.kubelet.healthz_port
        );
        let app = Router::new()
            .route("/healthz", get(healthz))
            .with_state(state.clone());
        tasks.spawn(serve_http(addr, app, shutdown.clone()));
    }
    if config.kubelet.read_only_port > 0 {
        let addr = format!(
            "{}:{}",
            config.kubelet.address, config.kubelet.read_only_port
        );
        let app = Router::new()
            .route("/healthz", get(healthz))
            .route("/pods", get(pods))
            .route("/pods/", get(pods))
            .route("/metrics", get(metrics))
            .with_state(state.clone());
        tasks.spawn(serve_http(addr, app, shutdown.clone()));
    }
    // Bind failures surface here before we report ready.
    tokio::task::yield_now().await;
    let grpc = Server::new(
        config.endpoint(Service::HttpServer).clone(),
        tonic::service::Routes::default(),
        &[],
    );
    let served = grpc.serve(shutdown.clone()).await;
    shutdown.wait().await;
    while let Some(r) = tasks.join_next().await {
        if let Ok(Err(e)) = r {
            tracing::error!(error = %e, "HTTP listener failed");
        }
    }
    served?;
    Ok(())
}

async fn serve_http(addr: String, app: Router, shutdown: Shutdown) -> anyhow::Result<()> {
    let listener = match tokio::net::TcpListener::bind(&addr).await {
        Ok(listener) => listener,
        Err(e) => {
            // Running without the port would look healthy and serve nothing: exit now.
            let why = format!("cannot listen on {addr}: {e}");
            shutdown.fail(why.clone());
            anyhow::bail!(why);
        }
    };
    tracing::info!(%addr, "serving HTTP");
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.wait().await })
        .await?;
    Ok(())
}

#[derive(serde::Deserialize)]
struct HealthzQuery {
    verbose: Option<String>,
}

async fn healthz(
    State(state): State<Arc<AppState>>,
    axum::extract::Query(q): axum::extract::Query<HealthzQuery>,
) -> Response {
    let report = check_all(&state.peers).await;
    let body = report.render(q.verbose.is_some());
    let code = if report.healthy() {
        StatusCode::OK
    } else {
        StatusCode::INTERNAL_SERVER_ERROR
    };
    (code, body).into_response()
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

/// Every pod with its status: the snapshot of pod-sync's status stream, which arrives in
/// chunks when it is large (a unary `ListPods` answer is one message and has a size limit).
async fn pod_statuses(mut client: PodSyncClient<Channel>) -> Result<Vec<Vec<u8>>, tonic::Status> {
    let request = WatchPodStatusRequest {
        accept_chunked_snapshot: true,
    };
    let mut stream = client.watch_pod_status(request).await?.into_inner();
    let mut assembler = Assembler::default();
    while let Some(message) = stream.message().await? {
        let complete = assembler.push(message).map_err(tonic::Status::internal)?;
        if let Some(update) = complete.filter(|u| u.snapshot) {
            return Ok(update.pods_json);
        }
    }
    Err(tonic::Status::unavailable(
        "pod-sync's status stream ended before its snapshot",
    ))
}

async fn pods(State(state): State<Arc<AppState>>) -> Response {
    match pod_statuses(state.pod_sync.clone()).await {
        Ok(pods_json) => {
            let items: Vec<serde_json::Value> = pods_json
                .iter()
                .filter_map(|b| serde_json::from_slice(b).ok())
                .map(|mut p: serde_json::Value| {
                    p["apiVersion"] = "v1".into();
                    p["kind"] = "Pod".into();
                    p
                })
                .collect();
            let list = serde_json::json!({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items});
            (
                [(axum::http::header::CONTENT_TYPE, "application/json")],
                list.to_string(),
            )
                .into_response()
        }
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("pod-sync is not available: {}\n", e.message()),
        )
            .into_response(),
    }
}
