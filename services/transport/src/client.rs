//! Client channels to a service address, with a span and trace context on every call.

use crate::{ClientTrace, WithLimits};
use hyper_util::rt::TokioIo;
use nodeagent_config::Address;
use std::time::Duration;
use tonic::transport::{Endpoint, Uri};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// What every generated client is built on.
pub type Channel = ClientTrace<tonic::transport::Channel>;

/// A lazily connecting channel: it connects on first use and reconnects after the peer
/// restarts, so services may start in any order. A vsock connection proves the process's
/// vsock secret, and checks the peer's proof, before any call (see
/// [`crate::install_vsock_auth`] and [`crate::vsock_auth`]).
pub fn connect(address: &Address) -> Channel {
    let secret = match address {
        Address::Vsock { .. } => crate::vsock_auth::installed().map(|a| &a.secret[..]),
        Address::Unix(_) => None,
    };
    connect_with_secret(address, secret)
}

/// [`connect`] with an explicit vsock secret (`None`: no handshake, which a node agent's
/// vsock server refuses).
pub fn connect_with_secret(address: &Address, secret: Option<&[u8]>) -> Channel {
    // The URI is required by tonic but unused: the connector decides where to go.
    let endpoint = Endpoint::from_static("http://nodeagent.local")
        .connect_timeout(Duration::from_secs(5))
        .keep_alive_while_idle(true)
        .http2_keep_alive_interval(Duration::from_secs(30));
    let channel = match address.clone() {
        Address::Unix(path) => {
            endpoint.connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move {
                    let stream = tokio::net::UnixStream::connect(path).await?;
                    Ok::<_, std::io::Error>(TokioIo::new(stream))
                }
            }))
        }
        Address::Vsock { cid, port } => {
            let secret: Option<std::sync::Arc<[u8]>> = secret.map(Into::into);
            endpoint.connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
                let secret = secret.clone();
                async move {
                    let mut stream =
                        tokio_vsock::VsockStream::connect(tokio_vsock::VsockAddr::new(cid, port))
                            .await?;
                    if let Some(secret) = secret {
                        crate::vsock_auth::client_handshake(&mut stream, &secret).await?;
                    }
                    Ok::<_, std::io::Error>(TokioIo::new(stream))
                }
            }))
        }
    };
    ClientTrace::new(channel)
}

/// Asks a peer's `grpc.health.v1` service whether `service` ("" for the whole server)
/// is serving. Errors say why not.
pub async fn check_health(
    channel: Channel,
    service: &str,
    timeout: Duration,
) -> Result<(), String> {
    let mut client = HealthClient::new(channel).with_limits();
    let request = tonic_health::pb::HealthCheckRequest {
        service: service.to_string(),
    };
    match tokio::time::timeout(timeout, client.check(request)).await {
        Err(_) => Err(format!("no answer within {timeout:?}")),
        Ok(Err(status)) => Err(format!("{}: {}", status.code(), status.message())),
        Ok(Ok(resp)) => match resp.into_inner().status() {
            ServingStatus::Serving => Ok(()),
            other => Err(format!("status {other:?}")),
        },
    }
}
