//! The upgrade proxy between a client and the runtime's streaming server, as upstream's
//! `proxyStream` (an `UpgradeAwareHandler` with `UpgradeRequired`): the client's upgrade
//! request is replayed to the URL that CRI `Exec`/`Attach`/`PortForward` returned, the
//! runtime's answer goes back to the client, and after a 101 both connections are spliced
//! byte for byte. So whatever the runtime speaks (SPDY/3.1, the WebSocket channel
//! protocols) reaches the client unchanged.

use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, HeaderValue, StatusCode, header};
use http_body_util::{BodyExt, Empty, Limited};
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use std::future::pending;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;
use tracing::Instrument;

/// Connecting to the runtime's streaming server and its answer must take no longer.
const BACKEND_TIMEOUT: Duration = Duration::from_secs(30);
/// The most of a refusal's body (not a 101) passed back to the client.
const MAX_ERROR_BODY: usize = 64 << 10;

/// Request headers not replayed to the runtime: the client's credentials stay here, and
/// the body is never forwarded (upgrade requests have none).
const DROPPED: &[header::HeaderName] = &[
    header::HOST,
    header::AUTHORIZATION,
    header::PROXY_AUTHORIZATION,
    header::COOKIE,
    header::CONTENT_LENGTH,
    header::TRANSFER_ENCODING,
];

/// Replays `request` (already checked to be an upgrade) to `location` and answers with
/// the runtime's response. On a 101 the splice runs in its own task, holding `permit`.
pub async fn proxy_stream(
    location: &str,
    mut request: Request,
    permit: OwnedSemaphorePermit,
    idle_timeout: Duration,
) -> Response {
    let client_upgrade = hyper::upgrade::on(&mut request);
    let mut backend_response =
        match upgrade_backend(location, request.headers(), request.method().clone()).await {
            Ok(r) => r,
            Err(refused) => return refused,
        };
    let backend_upgrade = hyper::upgrade::on(&mut backend_response);
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    for (name, value) in backend_response.headers() {
        if name != header::CONTENT_LENGTH && name != header::TRANSFER_ENCODING {
            response.headers_mut().append(name, value.clone());
        }
    }
    spawn_relay(
        client_upgrade,
        backend_upgrade,
        permit,
        move |client, backend| splice(client, backend, idle_timeout),
    );
    response
}

/// Once both the client's and the runtime's upgrades complete, runs `relay` on the two
/// connections in a task of its own that holds `permit` (the stream's slot) to the end.
pub(super) fn spawn_relay<F, Fut>(
    client: hyper::upgrade::OnUpgrade,
    backend: hyper::upgrade::OnUpgrade,
    permit: OwnedSemaphorePermit,
    relay: F,
) where
    F: FnOnce(TokioIo<Upgraded>, TokioIo<Upgraded>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    tokio::spawn(
        async move {
            let _permit = permit;
            let (client, backend) = tokio::join!(client, backend);
            match (client, backend) {
                (Ok(client), Ok(backend)) => {
                    relay(TokioIo::new(client), TokioIo::new(backend)).await
                }
                (Err(e), _) => tracing::debug!(error = %e, "the client's upgrade failed"),
                (_, Err(e)) => tracing::warn!(error = %e, "the runtime's upgrade failed"),
            }
        }
        .in_current_span(),
    );
}

/// Sends an upgrade request with `headers` to the runtime's `location` and returns its
/// 101 answer, or the response the client gets instead: the runtime's refusal as it gave
/// it, or a 500 naming why the runtime could not be reached.
pub(super) async fn upgrade_backend(
    location: &str,
    headers: &HeaderMap,
    method: http::Method,
) -> Result<hyper::Response<hyper::body::Incoming>, Response> {
    let response = match tokio::time::timeout(
        BACKEND_TIMEOUT,
        send_upgrade(location, headers, method),
    )
    .await
    {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return Err(proxy_error(e)),
        Err(_) => {
            return Err(proxy_error(format!(
                "the container runtime's streaming server at {location} did not answer within {BACKEND_TIMEOUT:?}"
            )));
        }
    };
    if response.status() != StatusCode::SWITCHING_PROTOCOLS {
        return Err(refusal(response).await);
    }
    Ok(response)
}

/// Sends the upgrade request to the runtime and returns its response head.
async fn send_upgrade(
    location: &str,
    headers: &HeaderMap,
    method: http::Method,
) -> Result<hyper::Response<hyper::body::Incoming>, String> {
    let uri: http::Uri = location.parse().map_err(|e| {
        format!("the container runtime returned an invalid streaming URL {location:?}: {e}")
    })?;
    if uri.scheme_str() != Some("http") {
        return Err(format!(
            "the container runtime's streaming URL {location} is not plain http on the local host; \
             configure the runtime without TLS streaming (containerd: enable_tls_streaming = false)"
        ));
    }
    let authority = uri
        .authority()
        .ok_or_else(|| format!("the streaming URL {location} has no host"))?
        .clone();
    let port = authority.port_u16().unwrap_or(80);
    let tcp = tokio::net::TcpStream::connect((authority.host(), port))
        .await
        .map_err(|e| {
            format!("connecting to the container runtime's streaming server at {authority}: {e}")
        })?;
    let _ = tcp.set_nodelay(true);
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(|e| format!("HTTP handshake with {authority}: {e}"))?;
    tokio::spawn(
        async move {
            if let Err(e) = connection.with_upgrades().await {
                tracing::debug!(error = %e, "connection to the streaming server ended");
            }
        }
        .in_current_span(),
    );
    let path = uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/")
        .to_string();
    let mut request = hyper::Request::builder().method(method).uri(path);
    for (name, value) in headers {
        if !DROPPED.contains(name) {
            request = request.header(name, value);
        }
    }
    let request = request
        .header(header::HOST, authority.as_str())
        .body(Empty::<bytes::Bytes>::new())
        .map_err(|e| format!("building the request to the streaming server: {e}"))?;
    sender
        .send_request(request)
        .await
        .map_err(|e| format!("the container runtime's streaming server at {authority} failed: {e}"))
}

/// The runtime refused the upgrade (a bad handshake, an expired token): its status and
/// body go back to the client, so a client can tell an upgrade failure and fall back.
async fn refusal(response: hyper::Response<hyper::body::Incoming>) -> Response {
    let (parts, body) = response.into_parts();
    let body = match Limited::new(body, MAX_ERROR_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => bytes::Bytes::from(format!(
            "the container runtime refused the stream ({}); its answer could not be read: {e}",
            parts.status
        )),
    };
    tracing::debug!(status = %parts.status, body = %String::from_utf8_lossy(&body), "the runtime refused the upgrade");
    let mut out = Response::new(Body::from(body));
    *out.status_mut() = parts.status;
    if let Some(ct) = parts.headers.get(header::CONTENT_TYPE) {
        out.headers_mut().insert(header::CONTENT_TYPE, ct.clone());
    }
    out
}

/// Upstream's proxy responder answers a failed proxy with 500 and the error text.
fn proxy_error(why: String) -> Response {
    tracing::warn!(error = %why, "streaming proxy failed");
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        )],
        why,
    )
        .into_response()
}

/// When either direction last moved a byte, in milliseconds since `start`.
pub(super) struct Activity {
    start: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    pub(super) fn new() -> Activity {
        Activity {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }

    pub(super) fn touch(&self) {
        let ms = self.start.elapsed().as_millis() as u64;
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// Completes once nothing moved for `idle` (never when `idle` is zero).
    pub(super) async fn idle(&self, idle: Duration) {
        if idle.is_zero() {
            return pending().await;
        }
        loop {
            let last = self.start + Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
            if last.elapsed() >= idle {
                return;
            }
            tokio::time::sleep_until(last + idle).await;
        }
    }
}

/// Copies both ways until the runtime's side ends (a finished exec, a closed
/// port-forward), or the stream is idle for `idle`. A client that closes its sending
/// side still gets what the runtime has left to send.
pub async fn splice<C, B>(client: C, backend: B, idle: Duration)
where
    C: AsyncRead + AsyncWrite + Send + 'static,
    B: AsyncRead + AsyncWrite + Send + 'static,
{
    let activity = Arc::new(Activity::new());
    let (mut client_read, mut client_write) = tokio::io::split(client);
    let (mut backend_read, mut backend_write) = tokio::io::split(backend);
    {
        let mut up = std::pin::pin!(pump(&mut client_read, &mut backend_write, &activity));
        let mut down = std::pin::pin!(pump(&mut backend_read, &mut client_write, &activity));
        let work = async {
            tokio::select! {
                _ = &mut down => {}
                _ = &mut up => down.await,
            }
        };
        tokio::select! {
            _ = work => tracing::debug!("stream finished"),
            _ = activity.idle(idle) => tracing::info!(?idle, "stream closed after streamingConnectionIdleTimeout without traffic"),
        }
    }
    // Close both sides cleanly (TLS close_notify to the client), whichever way it ended.
    let _ = tokio::time::timeout(Duration::from_secs(1), client_write.shutdown()).await;
    let _ = tokio::time::timeout(Duration::from_secs(1), backend_write.shutdown()).await;
}

/// Copies `from` to `to` until end of file or an error, then shuts `to` down.
async fn pump<R, W>(from: &mut R, to: &mut W, activity: &Activity)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 32 << 10];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        activity.touch();
        if to.write_all(&buf[..n]).await.is_err() || to.flush().await.is_err() {
            break;
        }
        activity.touch();
    }
    let _ = to.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn splice_copies_both_ways_and_ends_with_the_backend() {
        let (client, mut client_peer) = tokio::io::duplex(1024);
        let (backend, mut backend_peer) = tokio::io::duplex(1024);
        let task = tokio::spawn(splice(client, backend, Duration::from_secs(60)));
        client_peer.write_all(b"to backend").await.unwrap();
        let mut buf = [0u8; 10];
        backend_peer.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"to backend");
        // The client closes its side; the backend still answers.
        client_peer.shutdown().await.unwrap();
        backend_peer.write_all(b"reply").await.unwrap();
        drop(backend_peer);
        let mut rest = Vec::new();
        client_peer.read_to_end(&mut rest).await.unwrap();
        assert_eq!(rest, b"reply");
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_stream_is_closed() {
        let (client, mut client_peer) = tokio::io::duplex(1024);
        let (backend, _backend_peer) = tokio::io::duplex(1024);
        let idle = Duration::from_secs(4 * 3600);
        let started = Instant::now();
        let task = tokio::spawn(splice(client, backend, idle));
        tokio::time::sleep(Duration::from_secs(3600)).await;
        client_peer.write_all(b"x").await.unwrap();
        task.await.unwrap();
        // Traffic after an hour restarted the clock.
        assert!(started.elapsed() >= idle + Duration::from_secs(3600));
        let mut rest = Vec::new();
        client_peer.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
    }
}
