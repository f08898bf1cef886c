//! http-server: the kubelet's HTTP endpoints. `/healthz` on healthzBindAddress:healthzPort
//! aggregates every service's gRPC health and pleg's relist health; the read-only port
//! (readOnlyPort, off by default as upstream) serves the read-only handlers without
//! authentication; port 10250 serves everything over TLS behind authentication and
//! authorization (`auth.rs`).

pub mod cli;

mod last_pods;

pub mod auth;
mod health;
pub mod listener;
pub mod logs;
pub mod metrics;
pub mod stats;
pub mod streaming;
pub mod tls;
pub mod ui;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use nodeagent_config::{Config, Service, certificate};
use nodeagent_proto::api::WatchPodStatusRequest;
use nodeagent_proto::api::pod_sync_client::PodSyncClient;
use nodeagent_transport::{Assembler, Channel, Server, Shutdown, WithLimits};
use std::collections::BTreeMap;
use std::sync::Arc;

pub use health::{HealthReport, check_all};
pub use last_pods::{FIRST_LIST_WAIT, LAST_PODS_MAX_AGE, LastPods};

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
    /// The last complete pod list pod-sync gave, served (marked) while pod-sync restarts.
    pub last_pods: Arc<LastPods>,
    /// The node page's history, restart counts and probe results (`ui.rs`).
    pub ui: ui::UiState,
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

/// Everything port 10250 serves, before authentication. As upstream's `NewServer`:
/// `enableDebuggingHandlers` installs the handlers that run commands, stream logs and show
/// the configuration (`/configz` included), and `/logs/` only with
/// `enableSystemLogHandler` too; a disabled endpoint answers 405 with upstream's words.
fn secure_routes(config: &Config) -> Router<Arc<AppState>> {
    let router = read_only_routes().merge(ui::routes());
    if !config.kubelet.enable_debugging_handlers {
        // upstream `InstallDebuggingDisabledHandlers`.
        return disabled(
            router,
            &[
                "/run",
                "/exec",
                "/attach",
                "/portForward",
                "/containerLogs",
                "/runningpods",
                "/debug/pprof",
                "/logs",
            ],
            "Debug endpoints are disabled.",
        );
    }
    let router = router
        .route("/configz", get(configz))
        .merge(logs::routes())
        .merge(streaming::routes())
        .merge(stats::running_pods_routes());
    if config.kubelet.enable_system_log_handler {
        router.merge(logs::system_log_routes())
    } else {
        disabled(router, &["/logs"], "logs endpoint is disabled.")
    }
}

/// Every path under each prefix answers 405 with `message` (upstream's
/// `getHandlerForDisabledEndpoint`).
fn disabled(
    mut router: Router<Arc<AppState>>,
    prefixes: &[&str],
    message: &'static str,
) -> Router<Arc<AppState>> {
    for prefix in prefixes {
        let answer =
            move || async move { (StatusCode::METHOD_NOT_ALLOWED, format!("{message}\n")) };
        router = router
            .route(&format!("{prefix}/"), any(answer))
            .route(&format!("{prefix}/{{*rest}}"), any(answer));
    }
    router
}

/// Runs the http-server until `shutdown`.
pub async fn run(config: Config, shutdown: Shutdown) -> anyhow::Result<()> {
    // Upstream's kubelet registers these at start: `/metrics` serves them from here.
    nodeagent_telemetry::metrics::kubelet::set_node_name(&config.node_name);
    nodeagent_telemetry::metrics::kubelet::set_build_info();
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
        last_pods: Arc::new(LastPods::new(Some(last_pods::file(&config.root_dir)))),
        ui: ui::UiState::default(),
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
    {
        let (persist, stop) = (state.last_pods.clone().persist(), shutdown.clone());
        tasks.spawn(async move {
            tokio::select! {
                _ = persist => {}
                _ = stop.wait() => {}
            }
            Ok(())
        });
    }
    {
        let (client, state, stop) = (state.pod_sync.clone(), state.clone(), shutdown.clone());
        tasks.spawn(async move {
            tokio::select! {
                _ = follow_pod_statuses(client, state) => {}
                _ = stop.wait() => {}
            }
            Ok(())
        });
    }
    if secure || config.ui_loopback_port > 0 {
        // The node page's history and probe results, kept from the start.
        if !config.ui_history_period.is_zero() {
            let (sampled, stop) = (state.clone(), shutdown.clone());
            tasks.spawn(async move {
                tokio::select! {
                    _ = ui::sample(sampled) => {}
                    _ = stop.wait() => {}
                }
                Ok(())
            });
        }
        let (followed, stop) = (state.clone(), shutdown.clone());
        tasks.spawn(async move {
            ui::follow_probes(followed, stop).await;
            Ok(())
        });
    }
    if config.ui_loopback_port > 0 {
        // The node page for root on the node: its routes, the pod list and the log tail
        // it reads, nothing else (no exec, no configz).
        let mut app = ui::routes().route("/pods", get(pods));
        if config.kubelet.enable_debugging_handlers {
            app = app.merge(logs::routes());
        }
        let port = config.ui_loopback_port;
        // Only requests that name this port on loopback: a web page of another site that
        // re-points its name to 127.0.0.1 (DNS rebinding) sends its own name as Host.
        let app = app.layer(axum::middleware::from_fn(
            move |request: axum::extract::Request, next: axum::middleware::Next| async move {
                let host = request
                    .headers()
                    .get(axum::http::header::HOST)
                    .and_then(|h| h.to_str().ok())
                    .unwrap_or_default();
                let ours = ["127.0.0.1", "localhost", "[::1]"]
                    .iter()
                    .any(|name| host == format!("{name}:{port}"));
                if ours {
                    next.run(request).await
                } else {
                    (
                        StatusCode::MISDIRECTED_REQUEST,
                        "the loopback port answers requests for 127.0.0.1 and localhost only\n",
                    )
                        .into_response()
                }
            },
        ));
        tasks.spawn(listener::serve_loopback_root(
            format!("127.0.0.1:{port}"),
            app.with_state(state.clone()),
            shutdown.clone(),
            config.http_idle_timeout,
        ));
    }
    if config.kubelet.healthz_port > 0 {
        let addr = format!(
            "{}:{}",
            config.kubelet.healthz_bind_address, config.kubelet.healthz_port
        );
        let app = Router::new()
            .route("/healthz", get(healthz))
            .with_state(state.clone());
        tasks.spawn(serve_http(
            addr,
            app,
            shutdown.clone(),
            config.http_idle_timeout,
        ));
    }
    if config.kubelet.read_only_port > 0 {
        let addr = format!(
            "{}:{}",
            config.kubelet.address, config.kubelet.read_only_port
        );
        let app = read_only_routes().with_state(state.clone());
        tasks.spawn(serve_http(
            addr,
            app,
            shutdown.clone(),
            config.http_idle_timeout,
        ));
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
        // Authorization first, then the in-flight cap: only authorized requests take a slot.
        let app = listener::with_inflight_cap(secure_routes(&config))
            .layer(axum::middleware::from_fn_with_state(
                Arc::new(kubelet_auth),
                auth::filter,
            ))
            .with_state(state.clone());
        tasks.spawn(listener::serve_tls(
            addr,
            tls.server,
            app,
            shutdown.clone(),
            config.http_idle_timeout,
        ));
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

async fn serve_http(
    addr: String,
    app: Router,
    shutdown: Shutdown,
    idle_timeout: std::time::Duration,
) -> anyhow::Result<()> {
    listener::serve_plain(addr, app, shutdown, idle_timeout).await
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

/// The pod list pod-sync's status stream gives, as (uid, pod JSON) in pod-sync's order:
/// a snapshot replaces it, a delta replaces or appends the pods it carries and drops the
/// removed uids.
#[derive(Default)]
struct FollowedPods(Vec<(String, Vec<u8>)>);

impl FollowedPods {
    fn apply(&mut self, update: &nodeagent_proto::api::PodStatusUpdate) {
        let uid_of = |json: &[u8]| {
            serde_json::from_slice::<serde_json::Value>(json)
                .ok()
                .and_then(|p| p["metadata"]["uid"].as_str().map(str::to_string))
                .unwrap_or_default()
        };
        if update.snapshot {
            self.0 = update
                .pods_json
                .iter()
                .map(|j| (uid_of(j), j.clone()))
                .collect();
            return;
        }
        for json in &update.pods_json {
            let uid = uid_of(json);
            match self.0.iter_mut().find(|(u, _)| *u == uid) {
                Some(entry) => entry.1 = json.clone(),
                None => self.0.push((uid, json.clone())),
            }
        }
        self.0.retain(|(u, _)| !update.removed_uids.contains(u));
    }

    fn list(&self) -> Vec<Vec<u8>> {
        self.0.iter().map(|(_, j)| j.clone()).collect()
    }
}

/// Follows pod-sync's status stream for as long as this server runs, keeping
/// `last_pods` current after every snapshot and delta; reconnects (every 200 ms) while
/// pod-sync is away, keeping the last list.
async fn follow_pod_statuses(client: PodSyncClient<Channel>, state: Arc<AppState>) {
    loop {
        let mut client = client.clone();
        let request = WatchPodStatusRequest {
            accept_chunked_snapshot: true,
        };
        if let Ok(stream) = client.watch_pod_status(request).await {
            let mut stream = stream.into_inner();
            let mut assembler = Assembler::default();
            let mut pods = FollowedPods::default();
            let mut have_snapshot = false;
            while let Ok(Some(message)) = stream.message().await {
                match assembler.push(message) {
                    Ok(Some(update)) => {
                        have_snapshot |= update.snapshot;
                        if have_snapshot {
                            pods.apply(&update);
                            state.last_pods.keep(pods.list());
                        }
                    }
                    Ok(None) => {}
                    Err(_) => break,
                }
            }
            if have_snapshot {
                state.last_pods.touch();
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// `/pods`: pod-sync's complete list. While pod-sync restarts (its status stream refused
/// or its gate shut), the last complete list it gave (this instance's, else the one the
/// instances keep on disk, see [`last_pods`]), up to [`LAST_PODS_MAX_AGE`] old,
/// marked with a `Warning` header (as the API server marks a response, and kubectl shows
/// it); with none, the first one pod-sync gives within [`FIRST_LIST_WAIT`]; never a
/// half-empty list.
async fn pods(State(state): State<Arc<AppState>>) -> Response {
    let mut warning = None;
    let answer = match pod_statuses(state.pod_sync.clone()).await {
        Ok(pods_json) => Ok(pods_json),
        Err(e) => match state.last_pods.recent() {
            Some((pods_json, age)) => {
                tracing::debug!(error = %e.message(), ?age, "/pods: the last complete list while pod-sync is away");
                warning = Some(format!(
                    "299 - \"pod-sync is not available ({}): the last complete pod list, {}s old\"",
                    e.code(),
                    age.as_secs()
                ));
                Ok(pods_json)
            }
            // This instance never had a list (or only one too old): wait for its follower's
            // first, which is pod-sync's current word, rather than fail a caller that
            // another instance would have answered.
            None => state.last_pods.next_within(FIRST_LIST_WAIT).await.ok_or(e),
        },
    };
    match answer {
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
            let mut response = (
                [(axum::http::header::CONTENT_TYPE, "application/json")],
                list.to_string(),
            )
                .into_response();
            if let Some(w) = warning.and_then(|w| axum::http::HeaderValue::from_str(&w).ok()) {
                response
                    .headers_mut()
                    .insert(axum::http::header::WARNING, w);
            }
            response
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
    let body = serde_json::json!({ "kubeletconfig": state.config.kubelet.effective_document() });
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}
