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
/// restarts, so services may start in any order. Calls to a vsock peer carry the
/// process's vsock secret (see [`crate::install_vsock_auth`]).
pub fn connect(address: &Address) -> Channel {
    let secret = match address {
        Address::Vsock { .. } => crate::vsock_auth::installed().map(|a| &a.secret[..]),
        Address::Unix(_) => None,
    };
    connect_with_secret(address, secret)
}

/// [`connect`] with an explicit vsock secret (`None`: send none).
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
            endpoint.connect_with_connector_lazy(tower::service_fn(move |_: Uri| async move {
                let stream =
                    tokio_vsock::VsockStream::connect(tokio_vsock::VsockAddr::new(cid, port))
                        .await?;
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }))
        }
    };
    let channel = ClientTrace::new(channel);
    // A secret that is not a valid header value is refused when the config is loaded.
    match secret.and_then(|s| http::HeaderValue::from_bytes(s).ok()) {
        Some(value) => channel.with_secret(value),
        None => channel,
    }
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
