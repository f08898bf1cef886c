//! Port 10250's listener: TLS over TCP, bound with `SO_REUSEPORT` so that several
//! http-server instances share the port (the kernel spreads connections between them, and
//! one instance's restart refuses no connection while another listens). Each request
//! carries the client's certificate chain ([`PeerCertificates`]) for the authenticator,
//! and connections may be upgraded (exec, attach, port-forward).

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use nodeagent_transport::Shutdown;
use rustls::pki_types::CertificateDer;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// A TLS handshake must finish within this.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Request headers must arrive within this (a slow client is cut off).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Open connections at once; beyond it new connections wait in the kernel's backlog.
pub const MAX_CONNECTIONS: usize = 4096;
/// The largest request head (line and headers) accepted.
pub const MAX_HEADER_BYTES: usize = 64 << 10;

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
) -> anyhow::Result<()> {
    let listener = match resolve(&addr).and_then(bind_reuseport) {
        Ok(l) => l,
        Err(e) => {
            let why = format!("cannot listen on {addr}: {e}");
            shutdown.fail(why.clone());
            anyhow::bail!(why);
        }
    };
    tracing::info!(%addr, "serving the kubelet API over TLS");
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let permit = tokio::select! {
            _ = shutdown.wait() => return Ok(()),
            p = slots.clone().acquire_owned() => p?,
        };
        let (tcp, peer) = tokio::select! {
            _ = shutdown.wait() => return Ok(()),
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
        let acceptor = acceptor.clone();
        let app = app.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let _ = tcp.set_nodelay(true);
            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
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
            let certs = PeerCertificates(Arc::new(
                stream
                    .get_ref()
                    .1
                    .peer_certificates()
                    .map(|c| c.iter().map(|c| c.clone().into_owned()).collect())
                    .unwrap_or_default(),
            ));
            let service = app
                .layer(axum::Extension(certs))
                .layer(axum::Extension(peer));
            let service = hyper_util::service::TowerToHyperService::new(service);
            let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .max_buf_size(MAX_HEADER_BYTES);
            builder
                .http2()
                .timer(TokioTimer::new())
                .max_concurrent_streams(250)
                .max_header_list_size(MAX_HEADER_BYTES as u32);
            if let Err(e) = builder
                .serve_connection_with_upgrades(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
}

fn resolve(addr: &str) -> std::io::Result<SocketAddr> {
    use std::net::ToSocketAddrs;
    addr.to_socket_addrs()?
        .next()
        .ok_or_else(|| std::io::Error::other(format!("{addr} resolves to no address")))
}
