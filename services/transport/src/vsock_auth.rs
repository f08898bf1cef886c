//! Authentication on vsock, which has no file permissions or peer credentials. Before any
//! gRPC byte, both ends prove they hold the shared secret without ever sending it: a
//! mutual challenge-response (HMAC-SHA256 over both sides' fresh nonces), so a local user
//! who binds the port while a service restarts learns nothing it can replay and gets no
//! call answered. The server also accepts only allowed peer CIDs and, per CID, only the
//! gRPC services that CID is scoped to (`--vsock-allowed-cids CID=SERVICE+SERVICE`).
//!
//! The exchange (each message fixed-size, within [`HANDSHAKE_TIMEOUT`]):
//! 1. server → client: `NAVS1` and a 32-byte nonce `ns`;
//! 2. client → server: a 32-byte nonce `nc` and `HMAC(secret, "client" ‖ ns ‖ nc)`;
//! 3. server → client: `HMAC(secret, "server" ‖ nc ‖ ns)`, only if the client's proof held.

use nodeagent_config::VsockAuth;
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tower::{Layer, Service};

/// The whole exchange must be done within this.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
const MAGIC: &[u8; 5] = b"NAVS1";
const NONCE: usize = 32;
const PROOF: usize = 32;

/// The process's vsock settings, from its configuration (see [`install_vsock_auth`]).
static INSTALLED: OnceLock<VsockAuth> = OnceLock::new();

/// Makes `auth` the default of every server and client of this process: `run_main` calls
/// it with the configuration, so no service has to pass it around. The first call wins.
pub fn install_vsock_auth(auth: VsockAuth) {
    let _ = INSTALLED.set(auth);
}

pub(crate) fn installed() -> Option<&'static VsockAuth> {
    INSTALLED.get()
}

/// Whether a vsock connection comes from an allowed CID; refusals are logged.
pub(crate) fn peer_cid_allowed(stream: &tokio_vsock::VsockStream, allowed: &[u32]) -> bool {
    cid_allowed(stream.peer_addr(), allowed)
}

fn cid_allowed(peer: std::io::Result<tokio_vsock::VsockAddr>, allowed: &[u32]) -> bool {
    match peer {
        Ok(peer) if allowed.contains(&peer.cid()) => true,
        Ok(peer) => {
            tracing::warn!(cid = peer.cid(), port = peer.port(), allowed = ?allowed, "refused a vsock connection from a CID that is not allowed");
            false
        }
        Err(e) => {
            tracing::warn!(error = %e, "refused a vsock connection whose peer address cannot be read");
            false
        }
    }
}

fn proof(secret: &[u8], side: &[u8], first: &[u8], second: &[u8]) -> hmac::Tag {
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret);
    let mut ctx = hmac::Context::with_key(&key);
    ctx.update(side);
    ctx.update(first);
    ctx.update(second);
    ctx.sign()
}

fn verify(secret: &[u8], side: &[u8], first: &[u8], second: &[u8], tag: &[u8]) -> bool {
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret);
    let mut message = side.to_vec();
    message.extend_from_slice(first);
    message.extend_from_slice(second);
    // Constant time (ring's verify).
    hmac::verify(&key, &message, tag).is_ok()
}

fn nonce() -> std::io::Result<[u8; NONCE]> {
    let mut n = [0u8; NONCE];
    SystemRandom::new()
        .fill(&mut n)
        .map_err(|_| std::io::Error::other("no randomness for a vsock nonce"))?;
    Ok(n)
}

fn refused(why: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::PermissionDenied, why.to_string())
}

/// The server's half: the client proves the secret first; only then does the server prove
/// it (a client without the secret learns nothing).
pub async fn server_handshake<S>(stream: &mut S, secret: &[u8]) -> std::io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let exchange = async {
        let ns = nonce()?;
        let mut hello = MAGIC.to_vec();
        hello.extend_from_slice(&ns);
        stream.write_all(&hello).await?;
        stream.flush().await?;
        let mut answer = [0u8; NONCE + PROOF];
        stream.read_exact(&mut answer).await?;
        let (nc, tag) = answer.split_at(NONCE);
        if !verify(secret, b"client", &ns, nc, tag) {
            return Err(refused("the vsock client does not hold the secret"));
        }
        stream
            .write_all(proof(secret, b"server", nc, &ns).as_ref())
            .await?;
        stream.flush().await
    };
    tokio::time::timeout(HANDSHAKE_TIMEOUT, exchange)
        .await
        .map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::TimedOut, "vsock handshake timed out")
        })?
}

/// The client's half: it proves the secret bound to the server's fresh nonce (nothing to
/// replay elsewhere), and goes on only if the server proves it too.
pub async fn client_handshake<S>(stream: &mut S, secret: &[u8]) -> std::io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let exchange = async {
        let mut hello = [0u8; MAGIC.len() + NONCE];
        stream.read_exact(&mut hello).await?;
        let (magic, ns) = hello.split_at(MAGIC.len());
        if magic != MAGIC {
            return Err(refused(
                "the vsock server does not speak the node agent's handshake",
            ));
        }
        let nc = nonce()?;
        let mut answer = nc.to_vec();
        answer.extend_from_slice(proof(secret, b"client", ns, &nc).as_ref());
        stream.write_all(&answer).await?;
        stream.flush().await?;
        let mut tag = [0u8; PROOF];
        stream.read_exact(&mut tag).await?;
        if !verify(secret, b"server", &nc, ns, &tag) {
            return Err(refused("the vsock server does not hold the secret"));
        }
        Ok(())
    };
    tokio::time::timeout(HANDSHAKE_TIMEOUT, exchange)
        .await
        .map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::TimedOut, "vsock handshake timed out")
        })?
}

/// Server side: a call from a vsock peer whose CID is scoped to some gRPC services may call
/// only those (`PERMISSION_DENIED` otherwise). Calls over unix sockets carry no vsock
/// connect info and pass.
#[derive(Clone, Debug, Default)]
pub struct VsockScopeLayer {
    auth: Option<Arc<VsockAuth>>,
}

impl VsockScopeLayer {
    pub fn new(auth: Option<VsockAuth>) -> Self {
        Self {
            auth: auth.map(Arc::new),
        }
    }
}

impl<S> Layer<S> for VsockScopeLayer {
    type Service = VsockScope<S>;
    fn layer(&self, inner: S) -> Self::Service {
        VsockScope {
            inner,
            auth: self.auth.clone(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct VsockScope<S> {
    inner: S,
    auth: Option<Arc<VsockAuth>>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Whether the peer `cid` may call `path` (`/package.Service/Method`).
fn call_allowed(auth: &VsockAuth, cid: u32, path: &str) -> bool {
    let service = path
        .trim_start_matches('/')
        .split('/')
        .next()
        .unwrap_or_default();
    auth.allows(cid, service)
}

impl<S, B, R> Service<http::Request<B>> for VsockScope<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    R: Default + Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let peer = req
            .extensions()
            .get::<tokio_vsock::VsockConnectInfo>()
            .and_then(|info| info.peer_addr());
        if let (Some(auth), Some(peer)) = (&self.auth, peer)
            && !call_allowed(auth, peer.cid(), req.uri().path())
        {
            tracing::warn!(
                cid = peer.cid(),
                path = req.uri().path(),
                "refused a vsock call outside its CID's scope"
            );
            let status = tonic::Status::permission_denied(format!(
                "CID {} may not call {}",
                peer.cid(),
                req.uri().path()
            ));
            return Box::pin(std::future::ready(Ok(status.into_http())));
        }
        Box::pin(self.inner.call(req))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_allowed_cids_are_accepted() {
        let peer = |cid| Ok(tokio_vsock::VsockAddr::new(cid, 1234));
        assert!(cid_allowed(peer(3), &[3, 4]));
        assert!(!cid_allowed(peer(5), &[3, 4]));
        assert!(!cid_allowed(peer(3), &[]));
        assert!(!cid_allowed(Err(std::io::Error::other("gone")), &[3]));
    }

    async fn exchange(
        server_secret: &'static [u8],
        client_secret: &'static [u8],
    ) -> (std::io::Result<()>, std::io::Result<()>) {
        let (mut a, mut b) = tokio::io::duplex(256);
        let server = tokio::spawn(async move { server_handshake(&mut a, server_secret).await });
        let client = client_handshake(&mut b, client_secret).await;
        drop(b);
        (server.await.unwrap(), client)
    }

    /// Both ends hold the secret: both go on. A client without it is refused by the
    /// server, and never sees the server's proof; a server without it (a local user who
    /// bound the port) is refused by the client.
    #[tokio::test]
    async fn both_ends_prove_the_secret_without_sending_it() {
        let (server, client) = exchange(b"s3cret", b"s3cret").await;
        assert!(server.is_ok() && client.is_ok(), "{server:?} {client:?}");
        let (server, client) = exchange(b"s3cret", b"guess").await;
        assert_eq!(
            server.unwrap_err().kind(),
            std::io::ErrorKind::PermissionDenied
        );
        assert!(client.is_err(), "the client went on with a refused proof");
        let (server, client) = exchange(b"impostor", b"s3cret").await;
        assert!(server.is_err());
        assert!(
            client.is_err(),
            "the client trusted a server without the secret"
        );
    }

    /// What a rogue listener collects from a real client is an HMAC over nonces: the same
    /// client, asked twice with the same server nonce, never answers the same way (its own
    /// nonce is fresh), and the secret's bytes appear nowhere on the wire.
    #[tokio::test]
    async fn a_rogue_listener_collects_nothing_it_can_replay() {
        let mut answers = Vec::new();
        for _ in 0..2 {
            let (mut rogue, mut client) = tokio::io::duplex(256);
            let talk =
                tokio::spawn(async move { client_handshake(&mut client, b"s3cret-value").await });
            let mut hello = MAGIC.to_vec();
            hello.extend_from_slice(&[7u8; NONCE]);
            rogue.write_all(&hello).await.unwrap();
            let mut answer = [0u8; NONCE + PROOF];
            rogue.read_exact(&mut answer).await.unwrap();
            drop(rogue);
            assert!(talk.await.unwrap().is_err());
            assert!(!answer.windows(6).any(|w| w == b"s3cret"));
            answers.push(answer);
        }
        assert_ne!(answers[0], answers[1]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_peer_is_cut_off() {
        let (mut a, _b) = tokio::io::duplex(256);
        let err = server_handshake(&mut a, b"s3cret").await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
    }

    #[test]
    fn scoped_cids_call_only_their_services() {
        let auth = VsockAuth {
            allowed_cids: vec![3, 4],
            scopes: [(3, vec!["kubelet.v1.Prober".to_string()])].into(),
            secret: b"s".as_slice().into(),
        };
        assert!(call_allowed(&auth, 3, "/kubelet.v1.Prober/Watch"));
        // Health is always allowed: systemd-style checks of a peer.
        assert!(call_allowed(&auth, 3, "/grpc.health.v1.Health/Check"));
        assert!(!call_allowed(&auth, 3, "/kubelet.v1.PodSync/ListPods"));
        // CID 4 is not scoped: every service.
        assert!(call_allowed(&auth, 4, "/kubelet.v1.PodSync/ListPods"));
    }
}
