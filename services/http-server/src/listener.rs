//! The HTTP listeners: port 10250 (TLS over TCP) and the plain ones (healthz, read-only).
//! All bind with `SO_REUSEPORT`, so that several http-server instances share a port (the
//! kernel spreads connections between them, and one instance's restart refuses no
//! connection while another listens). Each TLS request carries the client's certificate
//! chain ([`PeerCertificates`]) for the authenticator, and connections may be upgraded
//! (exec, attach, port-forward).
//!
//! Limits, so that one client cannot starve the others or `/healthz`, and nothing is
//! capped before a client has shown who it is (upstream's kubelet caps nothing at all):
//! - the TLS handshake within [`HANDSHAKE_TIMEOUT`], with no cap on handshakes under way
//!   (a flood of slow handshakes holds nothing a real client needs);
//! - a cap on established connections per listener ([`MAX_CONNECTIONS`]), taken after
//!   the handshake: past it a new connection is closed at once, never queued;
//! - an idle connection is closed after the idle timeout (upstream's `IdleTimeout`, 90 s;
//!   `--http-idle-timeout`): HTTP/2 keep-alive pings do not keep an idle one open;
//! - HTTP/1 request heads within [`HEADER_READ_TIMEOUT`] (hyper's timer starts when the
//!   connection is served and again whenever it goes idle, so a client that sends nothing
//!   or half a head is cut off) and at most [`MAX_HEADER_BYTES`] (431 past it);
//! - HTTP/2 (chosen by ALPN, never sniffed: hyper-util's version sniffing has no timeout)
//!   must send its preface within [`HEADER_READ_TIMEOUT`], opens at most
//!   [`MAX_CONCURRENT_STREAMS`] streams, and is pinged so dead peers are dropped;
//! - request bodies at most [`MAX_BODY_BYTES`] (413; no kubelet endpoint takes a body).
//!
//! On shutdown a listener stops accepting, asks every open connection to finish
//! gracefully, and waits [`DRAIN_TIMEOUT`] for them.

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use nodeagent_transport::Shutdown;
use rustls::pki_types::CertificateDer;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// A TLS handshake must finish within this.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Request headers (HTTP/1) or the preface (HTTP/2) must arrive within this.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Open connections at once, per listener.
pub const MAX_CONNECTIONS: usize = 4096;
/// The largest request head (line and headers) accepted.
pub const MAX_HEADER_BYTES: usize = 64 << 10;
/// The largest request body accepted.
pub const MAX_BODY_BYTES: u64 = 1 << 20;
/// Streams one HTTP/2 connection may have open at once.
pub const MAX_CONCURRENT_STREAMS: u32 = 250;
/// Requests handled at once per listener, `/healthz` aside: past it a request waits for
/// its turn (at most [`INFLIGHT_WAIT`], then 429), so a flood cannot queue so many calls
/// on the services' channels that `/healthz`'s own checks time out behind them. Only the
/// handler's work counts: a response body that streams (logs, exec) holds no slot. On port
/// 10250 only authorized requests take a slot ([`inflight_cap`] sits after authorization):
/// a flood of bogus credentials never delays an authorized client.
pub const MAX_INFLIGHT_REQUESTS: usize = 16;
/// How long a request waits for a slot before 429.
pub const INFLIGHT_WAIT: Duration = Duration::from_secs(30);
/// On shutdown, how long a connection may still send a request before it is asked to
/// finish: hyper's graceful shutdown closes a connection that has not sent its first
/// request yet, so one accepted just before the shutdown would be closed unanswered.
pub const SHUTDOWN_REQUEST_GRACE: Duration = Duration::from_secs(1);
/// How long open connections get to finish after shutdown.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
const H2_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const H2_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// The client's certificate chain (end entity first), empty when it sent none.
#[derive(Clone, Debug, Default)]
pub struct PeerCertificates(pub Arc<Vec<CertificateDer<'static>>>);

/// Binds `addr` with SO_REUSEADDR and SO_REUSEPORT.
pub fn bind_reuseport(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let domain = socket2::Domain::for_address(addr);
    let socket = socket2::Socket::new(domain, socket2::Type::STREAM, Some(socket2::Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    TcpListener::from_std(socket.into())
}

/// Serves `app` over TLS on `addr` until `shutdown`.
pub async fn serve_tls(
    addr: String,
    tls: Arc<rustls::ServerConfig>,
    app: Router,
    shutdown: Shutdown,
    idle_timeout: Duration,
) -> anyhow::Result<()> {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    serve(
        addr,
        "the kubelet API over TLS",
        shutdown.clone(),
        move |tcp, peer, slots| {
            let acceptor = acceptor.clone();
            let app = app.clone();
            let shutdown = shutdown.clone();
            async move {
                let handshake = acceptor.accept(tcp);
                let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        tracing::debug!(%peer, error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(%peer, "TLS handshake timed out");
                        return;
                    }
                };
                let Some(_slot) = established(&slots, peer) else {
                    return;
                };
                let session = stream.get_ref().1;
                let h2 = session.alpn_protocol() == Some(b"h2");
                let certs = PeerCertificates(Arc::new(
                    session
                        .peer_certificates()
                        .map(|c| c.iter().map(|c| c.clone().into_owned()).collect())
                        .unwrap_or_default(),
                ));
                let app = app.layer(axum::Extension(certs));
                serve_connection(stream, peer, h2, app, shutdown, idle_timeout).await;
            }
        },
    )
    .await
}

/// A slot among the established connections, or None (the connection is closed: the cap
/// is full).
fn established(
    slots: &Arc<Semaphore>,
    peer: SocketAddr,
) -> Option<tokio::sync::OwnedSemaphorePermit> {
    match slots.clone().try_acquire_owned() {
        Ok(slot) => Some(slot),
        Err(_) => {
            tracing::warn!(%peer, "closing a new connection: {MAX_CONNECTIONS} are open already");
            None
        }
    }
}

/// Serves `app` over plain HTTP/1 on `addr` until `shutdown` (healthz, read-only port).
pub async fn serve_plain(
    addr: String,
    app: Router,
    shutdown: Shutdown,
    idle_timeout: Duration,
) -> anyhow::Result<()> {
    serve_plain_to(addr, "HTTP", app, shutdown, idle_timeout, None).await
}

/// Serves `app` over plain HTTP/1 on a loopback `addr`, to root's processes only: the
/// uid that owns each connection's client socket (established, with an inode: a closed
/// socket's entry says uid 0) is read from the kernel's socket tables (`/proc/net/tcp`,
/// `tcp6`, an IPv4 client also in its IPv4-mapped form), and a connection of any other uid,
/// or none found, is closed unanswered (the node page's operator port,
/// `--ui-loopback-port`).
pub async fn serve_loopback_root(
    addr: String,
    app: Router,
    shutdown: Shutdown,
    idle_timeout: Duration,
) -> anyhow::Result<()> {
    let admit = |peer: SocketAddr, local: SocketAddr| {
        let tables = [
            std::fs::read_to_string("/proc/net/tcp").unwrap_or_default(),
            std::fs::read_to_string("/proc/net/tcp6").unwrap_or_default(),
        ];
        let uid = tables.iter().find_map(|t| socket_uid(t, peer, local));
        if uid != Some(0) {
            tracing::warn!(%peer, ?uid, "closing a connection to the loopback port: only root's are served");
        }
        uid == Some(0)
    };
    serve_plain_to(
        addr,
        "HTTP to root on loopback",
        app,
        shutdown,
        idle_timeout,
        Some(admit),
    )
    .await
}

/// Plain HTTP/1 to the connections `admit` (when given: run on a blocking thread, with the
/// client's and this end's addresses, once the connection holds a slot, one connection at a
/// time) lets in; the others are closed unanswered.
async fn serve_plain_to(
    addr: String,
    what: &str,
    app: Router,
    shutdown: Shutdown,
    idle_timeout: Duration,
    admit: Option<fn(SocketAddr, SocketAddr) -> bool>,
) -> anyhow::Result<()> {
    let app = with_inflight_cap(app);
    serve(addr, what, shutdown.clone(), move |tcp, peer, slots| {
        let (app, shutdown) = (app.clone(), shutdown.clone());
        async move {
            let Some(_slot) = established(&slots, peer) else {
                return;
            };
            if let Some(admit) = admit {
                let Ok(local) = tcp.local_addr() else { return };
                // One lookup at a time: each reads whole socket tables, so a flood of
                // connections costs at most one thread of it, not one per connection.
                static LOOKUP: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);
                let Ok(_turn) = LOOKUP.acquire().await else {
                    return;
                };
                let admitted = tokio::task::spawn_blocking(move || admit(peer, local))
                    .await
                    .unwrap_or(false);
                if !admitted {
                    return;
                }
            }
            serve_connection(tcp, peer, false, app, shutdown, idle_timeout).await;
        }
    })
    .await
}

/// An address as the kernel's socket tables write it: the IP's bytes in the host's order
/// as 32-bit words in hex, a colon, the port in hex (`0100007F:1F90` for 127.0.0.1:8080 on
/// a little-endian host).
fn proc_net_address(a: SocketAddr) -> String {
    let words: Vec<u32> = match a.ip() {
        std::net::IpAddr::V4(v4) => vec![u32::from_ne_bytes(v4.octets())],
        std::net::IpAddr::V6(v6) => v6
            .octets()
            .chunks(4)
            .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    };
    let ip: String = words.iter().map(|w| format!("{w:08X}")).collect();
    format!("{ip}:{:04X}", a.port())
}

/// The uid owning the established socket whose local address is `client` and remote
/// `server`, from a `/proc/net/tcp` or `tcp6` table (`sl local rem st queues timer
/// retransmits uid timeout inode ...`): state `01` (ESTABLISHED) with an inode (a closed
/// socket's leftover, TIME_WAIT or orphaned, is listed with uid 0 and inode 0). An IPv4
/// pair is also looked for in its IPv4-mapped IPv6 form (a dual-stack client's socket).
fn socket_uid(table: &str, client: SocketAddr, server: SocketAddr) -> Option<u32> {
    let mapped = |a: SocketAddr| match a {
        SocketAddr::V4(v4) => SocketAddr::new(v4.ip().to_ipv6_mapped().into(), v4.port()),
        v6 => v6,
    };
    let pairs = [
        (proc_net_address(client), proc_net_address(server)),
        (
            proc_net_address(mapped(client)),
            proc_net_address(mapped(server)),
        ),
    ];
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (Some(local), Some(remote)) = (f.get(1), f.get(2)) else {
            return None;
        };
        let ours = pairs.iter().any(|(l, r)| local == l && remote == r);
        let live = f.get(3) == Some(&"01") && f.get(9).is_some_and(|inode| *inode != "0");
        (ours && live).then(|| f.get(7)?.parse().ok()).flatten()
    })
}

/// The accept loop: binds (a failure ends the process, since running without the port
/// would look healthy and serve nothing), runs `connection` for each accepted one with the
/// listener's connection slots (which it takes once the client is established), and drains
/// on shutdown.
async fn serve<F, Fut>(
    addr: String,
    what: &str,
    shutdown: Shutdown,
    connection: F,
) -> anyhow::Result<()>
where
    F: Fn(TcpStream, SocketAddr, Arc<Semaphore>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let listener = match resolve(&addr).and_then(bind_reuseport) {
        Ok(l) => l,
        Err(e) => {
            let why = format!("cannot listen on {addr}: {e}");
            shutdown.fail(why.clone());
            anyhow::bail!(why);
        }
    };
    tracing::info!(%addr, "serving {what}");
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut connections = tokio::task::JoinSet::new();
    let start = |connections: &mut tokio::task::JoinSet<()>, tcp: TcpStream, peer| {
        let _ = tcp.set_nodelay(true);
        connections.spawn(connection(tcp, peer, slots.clone()));
    };
    loop {
        while connections.try_join_next().is_some() {}
        let (tcp, peer) = tokio::select! {
            _ = shutdown.wait() => break,
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        start(&mut connections, tcp, peer);
    }
    // Connections already in the accept queue would be reset when the listener closes:
    // take them first. (A SYN that lands after this and before the close is handed to
    // another SO_REUSEPORT listener by net.ipv4.tcp_migrate_req=1, see
    // `ensure_request_migration`; with 0 it is reset.)
    while let Some(Ok((tcp, peer))) = futures::FutureExt::now_or_never(listener.accept()) {
        start(&mut connections, tcp, peer);
    }
    drop(listener);
    if !connections.is_empty() {
        tracing::info!(%addr, open = connections.len(), "draining connections");
        let drained = tokio::time::timeout(DRAIN_TIMEOUT, async {
            while connections.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::info!(%addr, open = connections.len(), "closing connections still open after {DRAIN_TIMEOUT:?}");
            connections.shutdown().await;
        }
    }
    Ok(())
}

/// Serves one connection with HTTP/2 (`h2`) or HTTP/1 and upgrades, finishing gracefully
/// on shutdown or once it has been idle (no request under way) for `idle_timeout`.
async fn serve_connection<I>(
    io: I,
    peer: SocketAddr,
    h2: bool,
    app: Router,
    shutdown: Shutdown,
    idle_timeout: Duration,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Activity::default();
    let app = app
        .layer(axum::middleware::from_fn(limit_body))
        .layer(axum::middleware::from_fn_with_state(
            activity.clone(),
            track_activity,
        ))
        .layer(axum::Extension(peer));
    let service = hyper_util::service::TowerToHyperService::new(app);
    let idle = activity.idle_for(idle_timeout);
    let result = if h2 {
        let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        builder
            .timer(TokioTimer::new())
            .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
            .max_header_list_size(MAX_HEADER_BYTES as u32)
            .keep_alive_interval(H2_KEEPALIVE_INTERVAL)
            .keep_alive_timeout(H2_KEEPALIVE_TIMEOUT);
        let io = FirstBytesDeadline::new(io, H2_PREFACE_LEN, HEADER_READ_TIMEOUT);
        let conn = builder.serve_connection(TokioIo::new(io), service);
        tokio::pin!(conn);
        tokio::select! {
            r = conn.as_mut() => r,
            _ = shutdown.wait() => finish(conn).await,
            _ = idle => {
                tracing::debug!(%peer, "closing an idle HTTP/2 connection");
                conn.as_mut().graceful_shutdown();
                conn.await
            }
        }
    } else {
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_READ_TIMEOUT)
            // Not max_buf_size: hyper reads into the buffer's whole spare capacity, so a
            // head past it can still be parsed (found by the test below).
            .max_header_size(MAX_HEADER_BYTES);
        let conn = builder
            .serve_connection(TokioIo::new(io), service)
            .with_upgrades();
        tokio::pin!(conn);
        tokio::select! {
            r = conn.as_mut() => r,
            _ = shutdown.wait() => finish(conn).await,
            _ = idle => {
                conn.as_mut().graceful_shutdown();
                conn.await
            }
        }
    };
    if let Err(e) = result {
        tracing::debug!(%peer, error = %e, "connection ended with an error");
    }
}

/// Lets a connection send its request for [`SHUTDOWN_REQUEST_GRACE`], then asks it to
/// finish what it serves and close.
async fn finish<C, E>(mut conn: Pin<&mut C>) -> Result<(), E>
where
    C: Future<Output = Result<(), E>> + GracefulShutdown,
{
    tokio::select! {
        r = conn.as_mut() => r,
        _ = tokio::time::sleep(SHUTDOWN_REQUEST_GRACE) => {
            conn.as_mut().graceful();
            conn.await
        }
    }
}

/// hyper's HTTP/1 and HTTP/2 connections, which both shut down gracefully.
trait GracefulShutdown {
    fn graceful(self: Pin<&mut Self>);
}

impl<I, S, E> GracefulShutdown for hyper::server::conn::http2::Connection<I, S, E>
where
    S: hyper::service::HttpService<hyper::body::Incoming>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
    S::ResBody: hyper::body::Body + 'static,
    <S::ResBody as hyper::body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    E: hyper::rt::bounds::Http2ServerConnExec<S::Future, S::ResBody>,
{
    fn graceful(self: Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

impl<I, S> GracefulShutdown for hyper::server::conn::http1::UpgradeableConnection<I, S>
where
    S: hyper::service::HttpService<hyper::body::Incoming>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    S::ResBody: hyper::body::Body + 'static,
    <S::ResBody as hyper::body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn graceful(self: Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

/// The requests under way on one connection and when the last one began or ended.
#[derive(Clone)]
struct Activity(Arc<std::sync::Mutex<(usize, tokio::time::Instant)>>);

impl Default for Activity {
    fn default() -> Self {
        Activity(Arc::new(std::sync::Mutex::new((
            0,
            tokio::time::Instant::now(),
        ))))
    }
}

impl Activity {
    fn update(&self, delta: isize) {
        let mut a = self.0.lock().unwrap_or_else(|e| e.into_inner());
        a.0 = a.0.saturating_add_signed(delta);
        a.1 = tokio::time::Instant::now();
    }

    /// Completes once no request has been under way for `timeout` (never if zero).
    async fn idle_for(&self, timeout: Duration) {
        if timeout.is_zero() {
            return std::future::pending().await;
        }
        loop {
            let (active, since) = *self.0.lock().unwrap_or_else(|e| e.into_inner());
            if active == 0 && since.elapsed() >= timeout {
                return;
            }
            tokio::time::sleep_until(since.max(tokio::time::Instant::now() - timeout) + timeout)
                .await;
            if active > 0 {
                // Busy: look again a timeout later (its end moves the mark anyway).
                tokio::time::sleep(timeout.min(Duration::from_secs(1))).await;
            }
        }
    }
}

/// Counts a request as under way until its response head is ready (an upgraded stream is
/// its own connection from then on; a streaming body keeps its HTTP/2 stream, which a
/// graceful shutdown lets finish).
async fn track_activity(
    axum::extract::State(activity): axum::extract::State<Activity>,
    request: Request,
    next: Next,
) -> Response {
    activity.update(1);
    let response = next.run(request).await;
    activity.update(-1);
    response
}

/// `router` under the in-flight cap ([`MAX_INFLIGHT_REQUESTS`], one semaphore per call):
/// on port 10250 it goes inside authorization, so only authorized requests take a slot.
pub fn with_inflight_cap<S: Clone + Send + Sync + 'static>(router: Router<S>) -> Router<S> {
    let slots = Arc::new(Semaphore::new(MAX_INFLIGHT_REQUESTS));
    router.layer(axum::middleware::from_fn_with_state(slots, cap_inflight))
}

async fn cap_inflight(
    axum::extract::State(slots): axum::extract::State<Arc<Semaphore>>,
    request: Request,
    next: Next,
) -> Response {
    let path = request.uri().path();
    if path == "/healthz" || path.starts_with("/healthz/") {
        return next.run(request).await;
    }
    match tokio::time::timeout(INFLIGHT_WAIT, slots.acquire_owned()).await {
        Ok(Ok(_slot)) => next.run(request).await,
        _ => (
            StatusCode::TOO_MANY_REQUESTS,
            [(axum::http::header::RETRY_AFTER, "1")],
            "Too many requests, please try again later.\n",
        )
            .into_response(),
    }
}

/// 413 for a body declared too large; any other body is cut at [`MAX_BODY_BYTES`] (a
/// handler reading past it gets an error, which axum's extractors answer with 413).
async fn limit_body(request: Request, next: Next) -> Response {
    let declared = request
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY_BYTES) {
        return (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body too large: at most {MAX_BODY_BYTES} bytes\n"),
        )
            .into_response();
    }
    let request =
        request.map(|b| Body::new(http_body_util::Limited::new(b, MAX_BODY_BYTES as usize)));
    next.run(request).await
}

const H2_PREFACE_LEN: usize = 24;

/// Fails reads with `TimedOut` unless the first `want` bytes arrive within a deadline.
struct FirstBytesDeadline<I> {
    io: I,
    want: usize,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<I> FirstBytesDeadline<I> {
    fn new(io: I, want: usize, within: Duration) -> Self {
        Self {
            io,
            want,
            deadline: Some(Box::pin(tokio::time::sleep(within))),
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for FirstBytesDeadline<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(r) => {
                let got = buf.filled().len() - before;
                if this.deadline.is_some() {
                    this.want = this.want.saturating_sub(got);
                    if this.want == 0 {
                        this.deadline = None;
                    }
                }
                Poll::Ready(r)
            }
            Poll::Pending => {
                let expired = this
                    .deadline
                    .as_mut()
                    .is_some_and(|d| d.as_mut().poll(cx).is_ready());
                if expired {
                    return Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "the client sent too little in time",
                    )));
                }
                Poll::Pending
            }
        }
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for FirstBytesDeadline<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

fn resolve(addr: &str) -> std::io::Result<SocketAddr> {
    use std::net::ToSocketAddrs;
    addr.to_socket_addrs()?
        .next()
        .ok_or_else(|| std::io::Error::other(format!("{addr} resolves to no address")))
}

/// Where the kernel says whether a closing SO_REUSEPORT listener's queued and half-open
/// connections move to another listener of the group (Linux ≥ 5.14) or are reset.
const TCP_MIGRATE_REQ: &str = "/proc/sys/net/ipv4/tcp_migrate_req";

/// Makes sure a restart of one of several http-server instances resets no connection:
/// sets `net.ipv4.tcp_migrate_req` to 1, as upstream's kubelet sets the kernel tunables it
/// relies on, unless `protectKernelDefaults` asks to leave them alone. Where it cannot be
/// set (`ProtectKernelTunables=` in the unit, an older kernel) it says so; `deploy/install.sh`
/// sets it through sysctl.d for the systemd units.
pub fn ensure_request_migration(protect_kernel_defaults: bool) {
    let current = std::fs::read_to_string(TCP_MIGRATE_REQ);
    match current.as_deref().map(str::trim) {
        Ok("1") => {}
        Err(e) => tracing::warn!(
            error = %e,
            "cannot read {TCP_MIGRATE_REQ} (Linux < 5.14?): connections queued on an http-server instance that stops are reset instead of moving to another instance"
        ),
        Ok(other) if protect_kernel_defaults => tracing::warn!(
            value = other,
            "net.ipv4.tcp_migrate_req is not 1 and protectKernelDefaults is set: connections queued on an http-server instance that stops are reset instead of moving to another instance; set it to 1"
        ),
        Ok(other) => match std::fs::write(TCP_MIGRATE_REQ, "1") {
            Ok(()) => tracing::info!(
                was = other,
                "set net.ipv4.tcp_migrate_req=1: connections queued on a stopping instance move to another one"
            ),
            Err(e) => tracing::warn!(
                error = %e,
                was = other,
                "cannot set net.ipv4.tcp_migrate_req=1: connections queued on an http-server instance that stops are reset instead of moving to another instance; set it in sysctl.d"
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Lines of a real `/proc/net/tcp` (little-endian host): a listener on 127.0.0.1:8080
    /// (root's), a client of it from 127.0.0.1:50000 owned by uid 1000, and root's end.
    #[test]
    fn the_client_sockets_uid_comes_from_the_kernels_table() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
           0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1001 1 0 100 0 0 10 0\n\
           1: 0100007F:C350 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  1000        0 1002 1 0 20 4 30 10 -1\n\
           2: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 1003 1 0 20 4 30 10 -1\n\
           3: 0100007F:C351 0100007F:1F90 06 00000000:00000000 03:00000ABC 00000000     0        0 0 3 0 0 0 0 0 0\n";
        // A root client of the IPv6 socket, from ::ffff:127.0.0.1 (tcp6's IPv4-mapped form).
        let table6 = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
           0: 0000000000000000FFFF00000100007F:C352 0000000000000000FFFF00000100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 2001 1 0 20 4 30 10 -1\n";
        let server: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let client: SocketAddr = "127.0.0.1:50000".parse().unwrap();
        if cfg!(target_endian = "little") {
            assert_eq!(proc_net_address(server), "0100007F:1F90");
            assert_eq!(socket_uid(table, client, server), Some(1000));
            assert_eq!(
                socket_uid(table, server, client),
                Some(0),
                "the server's end"
            );
            let other: SocketAddr = "127.0.0.1:50009".parse().unwrap();
            assert_eq!(socket_uid(table, other, server), None);
            // A client that closed before it was looked up: TIME_WAIT, uid 0, no inode.
            let closed: SocketAddr = "127.0.0.1:50001".parse().unwrap();
            assert_eq!(
                socket_uid(table, closed, server),
                None,
                "not taken for root's"
            );
            let dual: SocketAddr = "127.0.0.1:50002".parse().unwrap();
            assert_eq!(socket_uid(table6, dual, server), Some(0));
        }
        let v6: SocketAddr = "[::1]:8080".parse().unwrap();
        assert_eq!(proc_net_address(v6).len(), 32 + 5);
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_bytes_must_come_in_time() {
        let (client, server) = tokio::io::duplex(64);
        let mut guarded = FirstBytesDeadline::new(server, 4, Duration::from_secs(10));
        let mut client = client;
        client.write_all(b"ab").await.unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(guarded.read(&mut buf).await.unwrap(), 2);
        let e = guarded.read(&mut buf).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);

        let (mut client, server) = tokio::io::duplex(64);
        let mut guarded = FirstBytesDeadline::new(server, 4, Duration::from_secs(10));
        client.write_all(b"abcd").await.unwrap();
        assert_eq!(guarded.read(&mut buf).await.unwrap(), 4);
        // Past the first bytes, a quiet client is no longer cut off.
        let quiet = tokio::time::timeout(Duration::from_secs(60), guarded.read(&mut buf)).await;
        assert!(quiet.is_err(), "still waiting after the deadline");
    }

    async fn exchange(request: Vec<u8>) -> (String, tokio::task::JoinHandle<()>) {
        let (mut client, server) = tokio::io::duplex(1 << 20);
        let app = Router::new().route(
            "/",
            axum::routing::any(|body: axum::body::Bytes| async move { format!("{}", body.len()) }),
        );
        let peer: SocketAddr = ([127, 0, 0, 1], 1).into();
        let served = tokio::spawn(serve_connection(
            server,
            peer,
            false,
            app,
            Shutdown::never(),
            Duration::ZERO,
        ));
        client.write_all(&request).await.unwrap();
        let mut reply = Vec::new();
        let _ = client.read_to_end(&mut reply).await;
        (String::from_utf8_lossy(&reply).into_owned(), served)
    }

    #[tokio::test]
    async fn an_oversized_head_gets_431() {
        let big = "a".repeat(100 << 10);
        let head =
            format!("GET / HTTP/1.1\r\nHost: x\r\nX-Big: {big}\r\nConnection: close\r\n\r\n");
        let (reply, _) = exchange(head.into_bytes()).await;
        assert!(reply.starts_with("HTTP/1.1 431"), "{reply}");
    }

    #[tokio::test]
    async fn bodies_past_the_limit_get_413() {
        let declared = format!(
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            MAX_BODY_BYTES + 1
        );
        let (reply, _) = exchange(declared.into_bytes()).await;
        assert!(reply.starts_with("HTTP/1.1 413"), "{reply}");
        // Chunked, so undeclared: cut while the handler reads it.
        let chunk = vec![b'a'; 64 << 10];
        let mut chunked =
            b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                .to_vec();
        for _ in 0..(MAX_BODY_BYTES as usize / chunk.len() + 1) {
            chunked.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
            chunked.extend_from_slice(&chunk);
            chunked.extend_from_slice(b"\r\n");
        }
        chunked.extend_from_slice(b"0\r\n\r\n");
        let (reply, _) = exchange(chunked).await;
        assert!(reply.starts_with("HTTP/1.1 413"), "{reply}");
        let small =
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc";
        let (reply, _) = exchange(small.to_vec()).await;
        assert!(
            reply.starts_with("HTTP/1.1 200") && reply.ends_with("3"),
            "{reply}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn half_a_head_is_cut_off_after_the_header_timeout() {
        let started = tokio::time::Instant::now();
        let (reply, served) = exchange(b"GET / HTTP/1.1\r\nHost: x\r\n".to_vec()).await;
        served.await.unwrap();
        assert!(!reply.contains("200"), "{reply}");
        let waited = started.elapsed();
        assert!(
            waited >= HEADER_READ_TIMEOUT && waited < HEADER_READ_TIMEOUT * 2,
            "{waited:?}"
        );
    }
}
