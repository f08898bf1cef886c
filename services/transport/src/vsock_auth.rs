//! Authentication on vsock, which has no file permissions or peer credentials: the server
//! accepts connections only from allowed peer CIDs and calls only with the shared secret
//! in their metadata; clients of vsock endpoints send it.

use nodeagent_config::VsockAuth;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use subtle::ConstantTimeEq;
use tower::{Layer, Service};

/// The metadata key that carries the secret.
pub const SECRET_HEADER: &str = "x-nodeagent-vsock-secret";

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

fn secret_matches(sent: Option<&http::HeaderValue>, secret: &[u8]) -> bool {
    // ct_eq on slices of different lengths is false at once: only the length leaks.
    sent.is_some_and(|v| bool::from(v.as_bytes().ct_eq(secret)))
}

/// Server side: refuses calls without the secret with Unauthenticated. `None` (unix
/// sockets, where peer credentials and file modes decide) lets every call through.
#[derive(Clone, Debug, Default)]
pub struct SecretCheckLayer {
    secret: Option<Arc<[u8]>>,
}

impl SecretCheckLayer {
    pub fn new(secret: Option<Arc<[u8]>>) -> Self {
        Self { secret }
    }
}

impl<S> Layer<S> for SecretCheckLayer {
    type Service = SecretCheck<S>;
    fn layer(&self, inner: S) -> Self::Service {
        SecretCheck {
            inner,
            secret: self.secret.clone(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct SecretCheck<S> {
    inner: S,
    secret: Option<Arc<[u8]>>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, R> Service<http::Request<B>> for SecretCheck<S>
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
        if let Some(secret) = &self.secret
            && !secret_matches(req.headers().get(SECRET_HEADER), secret)
        {
            tracing::warn!(
                path = req.uri().path(),
                "refused a vsock call without the right secret"
            );
            let status = tonic::Status::unauthenticated("missing or wrong vsock secret");
            return Box::pin(std::future::ready(Ok(status.into_http())));
        }
        Box::pin(self.inner.call(req))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{check_health, connect_with_secret};
    use nodeagent_config::Address;
    use std::time::Duration;

    #[test]
    fn only_allowed_cids_are_accepted() {
        let peer = |cid| Ok(tokio_vsock::VsockAddr::new(cid, 1234));
        assert!(cid_allowed(peer(3), &[3, 4]));
        assert!(!cid_allowed(peer(5), &[3, 4]));
        assert!(!cid_allowed(peer(3), &[]));
        assert!(!cid_allowed(Err(std::io::Error::other("gone")), &[3]));
    }

    /// The server layer and the client header through real gRPC (over a unix socket: this
    /// kernel may have no vsock loopback; tests/tests/vsock.rs covers vsock where it has).
    #[tokio::test]
    async fn calls_without_the_right_secret_are_unauthenticated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("svc.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let (_reporter, health) = tonic_health::server::health_reporter();
        let router = tonic::transport::Server::builder()
            .layer(SecretCheckLayer::new(Some(b"s3cret".as_slice().into())))
            .add_service(health);
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
        let server = tokio::spawn(router.serve_with_incoming(incoming));
        let address = Address::Unix(path);
        let ask = |secret: Option<&'static [u8]>| {
            let channel = connect_with_secret(&address, secret);
            check_health(channel, "", Duration::from_secs(5))
        };
        assert_eq!(ask(Some(b"s3cret")).await, Ok(()));
        for wrong in [Some(b"s3creT".as_slice()), Some(b"s3cret2"), None] {
            let err = ask(wrong).await.unwrap_err();
            let code = tonic::Code::Unauthenticated.to_string();
            assert!(err.starts_with(&code), "{wrong:?}: {err}");
        }
        server.abort();
    }

    #[test]
    fn only_the_exact_secret_matches() {
        let secret = b"s3cret";
        let value = |s: &str| http::HeaderValue::from_str(s).unwrap();
        assert!(secret_matches(Some(&value("s3cret")), secret));
        assert!(!secret_matches(Some(&value("s3cre")), secret));
        assert!(!secret_matches(Some(&value("s3cret!")), secret));
        assert!(!secret_matches(Some(&value("S3cret")), secret));
        assert!(!secret_matches(None, secret));
    }
}
