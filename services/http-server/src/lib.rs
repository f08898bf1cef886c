//! http-server: the kubelet's HTTP endpoints. `/healthz` on healthzBindAddress:healthzPort
//! aggregates every service's gRPC health and pleg's relist health; the read-only port
//! (readOnlyPort, off by default as upstream) serves the read-only handlers without
//! authentication; port 10250 serves everything over TLS behind authentication and
//! authorization (`auth.rs`).

pub mod cli;

pub mod auth;
mod health;
pub mod listener;
pub mod logs;
pub mod metrics;
pub mod stats;
pub mod streaming;
pub mod tls;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use nodeagent_config::{Config, Service, certificate};
use nodeagent_proto::api::WatchPodStatusRequest;
use nodeagent_proto::api::pod_sync_client::PodSyncClient;
use nodeagent_transport::{Assembler, Channel, Server, Shutdown, WithLimits};
use std::collections::BTreeMap;
use std::sync::Arc;

pub use health::{HealthReport, check_all};

pub struct AppState {
    pub config: Config,
    pub peers: BTreeMap<Service, Channel>,
    pub pod_sync: PodSyncClient<Channel>,
    /// The container runtime, for `/runningpods/`, stats, logs and streaming.
    pub cri: nodeagent_cri::Cri,
    /// The API server (TokenReview, SubjectAccessReview); None in standalone mode.
    pub api: Option<kube::Client>,
    /// Checks client certificates against `clientCAFile`.
    pub client_ca: Option<Arc<dyn rustls::server::danger::ClientCertVerifier>>,
    /// `/healthz`'s checks, on a thread of their own.
    pub health: health::HealthChecks,
    /// Exec, attach, port-forward and log-follow streams open at once.
    pub streams: streaming::StreamLimit,
}

/// The handlers the read-only port serves (upstream's default handlers, no debugging
/// handlers): also served, behind authentication, on port 10250.
fn read_only_routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/pods", get(pods))
        .route("/pods/", get(pods))
        .merge(metrics::routes())
        .merge(stats::routes())
}

/// Everything port 10250 serves, before authentication.
fn secure_routes(config: &Config) -> Router<Arc<AppState>> {
    let mut router = read_only_routes().route("/configz", get(configz));
    if config.kubelet.enable_debugging_handlers {
        router = router
            .merge(logs::routes())
            .merge(streaming::routes())
            .merge(stats::running_pods_routes());
    }
    router
}

/// Runs the http-server until `shutdown`.
pub async fn run(config: Config, shutdown: Shutdown) -> anyhow::Result<()> {
    let peers: BTreeMap<Service, Channel> = Service::ALL
        .into_iter()
        .filter(|s| *s != Service::HttpServer)
        .map(|s| (s, nodeagent_transport::connect(config.endpoint(s))))
        .collect();
    let api = config.api_client().await?;
    let cri = nodeagent_cri::Cri::connect(
        &config.runtime_endpoint,
        config.kubelet.runtime_request_timeout,
    );
    listener::ensure_request_migration(config.kubelet.protect_kernel_defaults);
    let secure = config.kubelet.enable_server && config.kubelet.port > 0;
    let tls = if secure {
        Some(tls::server_config(&config)?)
    } else {
        None
    };
    let state = Arc::new(AppState {
        client_ca: tls.as_ref().and_then(|t| t.client_ca.clone()),
        streams: streaming::StreamLimit::default(),
        pod_sync: PodSyncClient::new(peers[&Service::PodSync].clone()).with_limits(),
        peers,
        cri,
        api,
        config: config.clone(),
        health: health::HealthChecks::spawn(
            Service::ALL
                .into_iter()
                .filter(|s| *s != Service::HttpServer)
                .map(|s| (s, config.endpoint(s).clone()))
                .collect(),
        )?,
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
        let app = read_only_routes().with_state(state.clone());
        tasks.spawn(serve_http(addr, app, shutdown.clone()));
    }
    if let (Some(tls), Some(client)) = (&tls, &state.api)
        && tls::bootstraps_serving(&config)
    {
        let serving = tls.serving.clone();
        let client = client.clone();
        let (config_cert_dir, node_name) = (config.cert_dir.clone(), config.node_name.clone());
        let sans = tls::serving_names(&config);
        let stop = shutdown.clone();
        tasks.spawn(async move {
            let rotator = certificate::Rotator {
                kind: certificate::Kind::Serving,
                cert_dir: config_cert_dir,
                node: node_name,
                sans,
                client,
                metrics: certificate::Metrics::get(certificate::Kind::Serving),
                on_new: Box::new(move |pair| {
                    if let Err(e) = serving.set(pair) {
                        tracing::error!(error = %format!("{e:#}"), "the issued serving certificate");
                    }
                }),
            };
            // Ends with the server (the shutdown waits for every task here).
            tokio::select! {
                _ = rotator.run() => {}
                _ = stop.wait() => {}
            }
            Ok(())
        });
    }
    if let Some(tls) = tls {
        let addr = format!("{}:{}", config.kubelet.address, config.kubelet.port);
        let kubelet_auth =
            auth::KubeletAuth::new(&config, state.client_ca.clone(), state.api.clone());
        let app = secure_routes(&config)
            .layer(axum::middleware::from_fn_with_state(
                Arc::new(kubelet_auth),
                auth::filter,
            ))
            .with_state(state.clone());
        tasks.spawn(listener::serve_tls(addr, tls.server, app, shutdown.clone()));
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
    listener::serve_plain(addr, app, shutdown).await
}

#[derive(serde::Deserialize)]
struct HealthzQuery {
    verbose: Option<String>,
}

async fn healthz(
    State(state): State<Arc<AppState>>,
    axum::extract::Query(q): axum::extract::Query<HealthzQuery>,
) -> Response {
    let report = state.health.check().await;
    let body = report.render(q.verbose.is_some());
    let code = if report.healthy() {
        StatusCode::OK
    } else {
        StatusCode::INTERNAL_SERVER_ERROR
    };
    (code, body).into_response()
}

/// Every pod with its status: the snapshot of pod-sync's status stream, which arrives in
/// chunks when it is large (a unary `ListPods` answer is one message and has a size limit).
pub async fn pod_statuses(
    mut client: PodSyncClient<Channel>,
) -> Result<Vec<Vec<u8>>, tonic::Status> {
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

/// `/configz`: the configuration in effect, as upstream (`{"kubeletconfig": {...}}`).
async fn configz(State(state): State<Arc<AppState>>) -> Response {
    let body = serde_json::json!({ "kubeletconfig": state.config.kubelet });
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}
