//! `/exec`, `/attach`, `/portForward` and `/run`, as upstream's `server.go`: the pod and
//! container are resolved here, CRI `Exec`/`Attach`/`PortForward` returns a URL of the
//! runtime's streaming server, and the client's upgrade request is proxied to it
//! (`proxy.rs`, upstream's `proxyStream`). `/run` runs a command with `ExecSync` and
//! returns its output. At most [`MAX_CONCURRENT_STREAMS`] streams run at once; a stream
//! with no traffic for `streamingConnectionIdleTimeout` is closed.

mod params;
mod proxy;
mod target;
mod v5;

use crate::AppState;
use axum::Router;
use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodFilter, on, post};
use http::{StatusCode, header};
use nodeagent_proto::cri::{AttachRequest, ExecRequest, ExecSyncRequest, PortForwardRequest};
use params::{Query, Upgrade};
use serde::Deserialize;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::Instrument;

/// Streams (exec, attach, port-forward) open at once; beyond it a client gets 429.
pub const MAX_CONCURRENT_STREAMS: usize = 256;

/// The streaming routes, with their shared stream limit.
pub fn routes() -> Router<Arc<AppState>> {
    let get_or_post = MethodFilter::GET.or(MethodFilter::POST);
    Router::new()
        .route(
            "/exec/{podNamespace}/{podID}/{containerName}",
            on(get_or_post, exec),
        )
        .route(
            "/exec/{podNamespace}/{podID}/{uid}/{containerName}",
            on(get_or_post, exec),
        )
        .route(
            "/attach/{podNamespace}/{podID}/{containerName}",
            on(get_or_post, attach),
        )
        .route(
            "/attach/{podNamespace}/{podID}/{uid}/{containerName}",
            on(get_or_post, attach),
        )
        .route(
            "/portForward/{podNamespace}/{podID}",
            on(get_or_post, port_forward),
        )
        .route(
            "/portForward/{podNamespace}/{podID}/{uid}",
            on(get_or_post, port_forward),
        )
        .route("/run/{podNamespace}/{podID}/{containerName}", post(run))
        .route(
            "/run/{podNamespace}/{podID}/{uid}/{containerName}",
            post(run),
        )
}

/// The node's long-lived streams: exec, attach, port-forward and `/containerLogs?follow`
/// (which holds a blocking-pool thread while it follows), at most
/// [`MAX_CONCURRENT_STREAMS`] at once.
#[derive(Clone)]
pub struct StreamLimit(Arc<Semaphore>);

impl Default for StreamLimit {
    fn default() -> Self {
        StreamLimit(Arc::new(Semaphore::new(MAX_CONCURRENT_STREAMS)))
    }
}

impl StreamLimit {
    /// A slot for one stream, or None when all are taken (answer 429).
    pub fn try_acquire(&self) -> Option<OwnedSemaphorePermit> {
        self.0.clone().try_acquire_owned().ok()
    }
}

/// Why a streaming request failed, mapped to upstream's status codes.
#[derive(Debug)]
pub enum StreamError {
    /// A malformed query or a request that is not an upgrade: 400.
    BadRequest(String),
    /// No such pod or container: 404 with upstream's wording.
    NotFound(String),
    /// Too many streams at once: 429.
    TooMany,
    /// A peer service is not reachable: 503.
    Unavailable(String),
    /// The runtime refused (upstream's `streaming.WriteError`).
    Runtime(tonic::Status),
}

impl IntoResponse for StreamError {
    fn into_response(self) -> Response {
        let text = [(header::CONTENT_TYPE, "text/plain; charset=utf-8")];
        match self {
            StreamError::BadRequest(m) => (StatusCode::BAD_REQUEST, text, m).into_response(),
            StreamError::NotFound(m) => (StatusCode::NOT_FOUND, text, m).into_response(),
            StreamError::TooMany => (
                StatusCode::TOO_MANY_REQUESTS,
                [(header::RETRY_AFTER, "1")],
                format!("too many streams: at most {MAX_CONCURRENT_STREAMS} exec, attach, port-forward and log-follow streams run at once; retry later"),
            )
                .into_response(),
            StreamError::Unavailable(m) => {
                (StatusCode::SERVICE_UNAVAILABLE, text, m).into_response()
            }
            StreamError::Runtime(status) => {
                let body = format!("rpc error: code = {:?} desc = {}", status.code(), status.message());
                match status.code() {
                    tonic::Code::NotFound => (StatusCode::NOT_FOUND, text, body).into_response(),
                    // Upstream: the runtime's request cache is full; its TTL is a minute.
                    tonic::Code::ResourceExhausted => (
                        StatusCode::TOO_MANY_REQUESTS,
                        [(header::RETRY_AFTER, "60")],
                        body,
                    )
                        .into_response(),
                    _ => (StatusCode::INTERNAL_SERVER_ERROR, text, body).into_response(),
                }
            }
        }
    }
}

/// `/{exec,attach,run}/{podNamespace}/{podID}[/{uid}]/{containerName}`.
#[derive(Debug, Deserialize)]
struct ContainerPath {
    #[serde(rename = "podNamespace")]
    namespace: String,
    #[serde(rename = "podID")]
    pod: String,
    uid: Option<String>,
    #[serde(rename = "containerName")]
    container: String,
}

/// `/portForward/{podNamespace}/{podID}[/{uid}]`.
#[derive(Debug, Deserialize)]
struct PodPath {
    #[serde(rename = "podNamespace")]
    namespace: String,
    #[serde(rename = "podID")]
    pod: String,
    uid: Option<String>,
}

fn span(kind: &'static str, namespace: &str, pod: &str, container: &str) -> tracing::Span {
    tracing::info_span!("stream", kind, pod.namespace = %namespace, pod.name = %pod, container.name = %container)
}

/// Runs a handler's body in its span; an error becomes its upstream status.
async fn respond(
    span: tracing::Span,
    body: impl std::future::Future<Output = Result<Response, StreamError>>,
) -> Response {
    body.instrument(span)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

fn idle_timeout(state: &AppState) -> Duration {
    state.config.kubelet.streaming_connection_idle_timeout
}

fn acquire(limit: &StreamLimit) -> Result<OwnedSemaphorePermit, StreamError> {
    limit.try_acquire().ok_or(StreamError::TooMany)
}

async fn exec(
    State(state): State<Arc<AppState>>,
    Path(path): Path<ContainerPath>,
    request: Request,
) -> Response {
    let span = span("exec", &path.namespace, &path.pod, &path.container);
    respond(span, exec_inner(state, path, request)).await
}

async fn exec_inner(
    state: Arc<AppState>,
    path: ContainerPath,
    request: Request,
) -> Result<Response, StreamError> {
    let query = Query::parse(request.uri().query());
    let options = params::stream_options(&query).map_err(StreamError::BadRequest)?;
    let command = params::command(&query).map_err(StreamError::BadRequest)?;
    let pod = target::find_pod(&state, &path.namespace, &path.pod).await?;
    let container = target::running_container(&state, &pod, path.uid.as_deref(), &path.container)
        .await?
        .ok_or_else(|| {
            StreamError::NotFound(format!("container not found ({:?})", path.container))
        })?;
    let upgrade = params::check_upgrade(request.headers(), params::REMOTE_COMMAND_PROTOCOLS)
        .map_err(StreamError::BadRequest)?;
    let permit = acquire(&state.streams)?;
    let mut runtime = state.cri.runtime.clone();
    let url = runtime
        .exec(state.cri.request(ExecRequest {
            container_id: container,
            cmd: command,
            tty: options.tty,
            stdin: options.stdin,
            stdout: options.stdout,
            stderr: options.stderr,
        }))
        .await
        .map_err(StreamError::Runtime)?
        .into_inner()
        .url;
    Ok(stream(&state, &url, request, upgrade, options, permit).await)
}

async fn attach(
    State(state): State<Arc<AppState>>,
    Path(path): Path<ContainerPath>,
    request: Request,
) -> Response {
    let span = span("attach", &path.namespace, &path.pod, &path.container);
    respond(span, attach_inner(state, path, request)).await
}

async fn attach_inner(
    state: Arc<AppState>,
    path: ContainerPath,
    request: Request,
) -> Result<Response, StreamError> {
    let query = Query::parse(request.uri().query());
    let mut options = params::stream_options(&query).map_err(StreamError::BadRequest)?;
    let pod = target::find_pod(&state, &path.namespace, &path.pod).await?;
    let not_found = || {
        StreamError::NotFound(format!(
            "container {} not found in pod {}",
            path.container,
            pod.full_name()
        ))
    };
    // Whether the process has a terminal was fixed when it started: the spec decides, as
    // upstream, not the query.
    let tty = pod.tty(&path.container).ok_or_else(not_found)?;
    let container = target::running_container(&state, &pod, path.uid.as_deref(), &path.container)
        .await?
        .ok_or_else(not_found)?;
    let upgrade = params::check_upgrade(request.headers(), params::REMOTE_COMMAND_PROTOCOLS)
        .map_err(StreamError::BadRequest)?;
    options.tty = tty;
    if tty {
        options.stderr = false;
    }
    let permit = acquire(&state.streams)?;
    let mut runtime = state.cri.runtime.clone();
    let url = runtime
        .attach(state.cri.request(AttachRequest {
            container_id: container,
            stdin: options.stdin,
            tty: options.tty,
            stdout: options.stdout,
            stderr: options.stderr,
        }))
        .await
        .map_err(StreamError::Runtime)?
        .into_inner()
        .url;
    Ok(stream(&state, &url, request, upgrade, options, permit).await)
}

/// Connects an exec or attach client to the runtime's session at `url`: a v5 WebSocket
/// is translated here (`v5.rs`), anything else is proxied as it is.
async fn stream(
    state: &AppState,
    url: &str,
    request: Request,
    upgrade: Upgrade,
    options: params::StreamOptions,
    permit: OwnedSemaphorePermit,
) -> Response {
    let idle = idle_timeout(state);
    if upgrade == Upgrade::WebSocket(Some(params::V5.to_string())) {
        return v5::bridge(url, request, options, permit, idle).await;
    }
    proxy::proxy_stream(url, request, permit, idle).await
}

async fn port_forward(
    State(state): State<Arc<AppState>>,
    Path(path): Path<PodPath>,
    request: Request,
) -> Response {
    let span = span("portForward", &path.namespace, &path.pod, "");
    respond(span, port_forward_inner(state, path, request)).await
}

async fn port_forward_inner(
    state: Arc<AppState>,
    path: PodPath,
    request: Request,
) -> Result<Response, StreamError> {
    let query = Query::parse(request.uri().query());
    let upgrade = params::check_upgrade(request.headers(), params::PORT_FORWARD_PROTOCOLS);
    let websocket = matches!(upgrade, Ok(Upgrade::WebSocket(_)));
    let ports = params::ports(&query, websocket).map_err(StreamError::BadRequest)?;
    let pod = target::find_pod(&state, &path.namespace, &path.pod).await?;
    if path.uid.as_ref().is_some_and(|uid| *uid != pod.uid) {
        return Err(StreamError::NotFound("pod not found".into()));
    }
    let sandbox = target::ready_sandbox(&state, &pod)
        .await?
        .ok_or_else(|| StreamError::NotFound(format!("pod not found ({:?})", pod.full_name())))?;
    upgrade.map_err(StreamError::BadRequest)?;
    let permit = acquire(&state.streams)?;
    let mut runtime = state.cri.runtime.clone();
    let url = runtime
        .port_forward(state.cri.request(PortForwardRequest {
            pod_sandbox_id: sandbox,
            port: ports,
        }))
        .await
        .map_err(StreamError::Runtime)?
        .into_inner()
        .url;
    Ok(proxy::proxy_stream(&url, request, permit, idle_timeout(&state)).await)
}

async fn run(
    State(state): State<Arc<AppState>>,
    Path(path): Path<ContainerPath>,
    request: Request,
) -> Response {
    let span = span("run", &path.namespace, &path.pod, &path.container);
    respond(span, run_inner(state, path, request)).await
}

/// `/run`: upstream's `RunInContainer`, an `ExecSync` whose stdout and then stderr are the
/// answer (served as `application/json`, as upstream does). The legacy `cmd` parameter is
/// split at spaces. A non-zero exit is a 500 naming the code.
async fn run_inner(
    state: Arc<AppState>,
    path: ContainerPath,
    request: Request,
) -> Result<Response, StreamError> {
    let query = Query::parse(request.uri().query());
    let pod = target::find_pod(&state, &path.namespace, &path.pod).await?;
    let cmd: Vec<String> = query
        .first("cmd")
        .filter(|c| !c.is_empty())
        .ok_or_else(|| StreamError::BadRequest("query parameter \"cmd\" is required: the command to run, its arguments separated by spaces".into()))?
        .split(' ')
        .map(str::to_string)
        .collect();
    let container = target::running_container(&state, &pod, path.uid.as_deref(), &path.container)
        .await?
        .ok_or_else(|| {
            StreamError::NotFound(format!("container not found ({:?})", path.container))
        })?;
    // Upstream waits without a limit; runtimeRequestTimeout bounds it here so that a
    // command that never ends does not hold the connection and the exec forever.
    let timeout = state.config.kubelet.runtime_request_timeout;
    let mut request = tonic::Request::new(ExecSyncRequest {
        container_id: container,
        cmd: cmd.clone(),
        timeout: timeout.as_secs().max(1) as i64,
    });
    request.set_timeout(timeout + Duration::from_secs(5));
    let mut runtime = state.cri.runtime.clone();
    let reply = match runtime.exec_sync(request).await {
        Ok(r) => r.into_inner(),
        Err(e) if e.code() == tonic::Code::DeadlineExceeded => {
            return Ok((
                StatusCode::INTERNAL_SERVER_ERROR,
                format!(
                    "command '{}' timed out after {timeout:?} (runtimeRequestTimeout)",
                    cmd.join(" ")
                ),
            )
                .into_response());
        }
        Err(e) => return Err(StreamError::Runtime(e)),
    };
    if reply.exit_code != 0 {
        let message = format!(
            "command '{}' exited with {}: {}",
            cmd.join(" "),
            reply.exit_code,
            String::from_utf8_lossy(&reply.stderr)
        );
        return Ok((StatusCode::INTERNAL_SERVER_ERROR, message).into_response());
    }
    let mut output = reply.stdout;
    output.extend_from_slice(&reply.stderr);
    Ok(([(header::CONTENT_TYPE, "application/json")], output).into_response())
}
