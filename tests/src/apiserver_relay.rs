//! How the test API server talks to a kubelet: an HTTP/1.1 connection over TLS with the
//! kubelet client certificate, the request relayed (streaming bodies; after a 101 the raw
//! bytes both ways), and port-forward's WebSocket-carried SPDY unwrapped into a SPDY
//! upgrade, as kube-apiserver's tunneling handler does.
//!
//! The kubelet's address is the Node's `status.addresses` in kube-apiserver's default
//! preference order (Hostname, InternalDNS, InternalIP, ExternalDNS, ExternalIP) unless
//! [`KubeletSettings::hosts`] names one (a test node's name does not resolve), and its
//! port is `status.daemonEndpoints.kubeletEndpoint.Port`.

use crate::apiserver::{ApiState, status};
use crate::apiserver_proxy::{Failure, KubeletSettings, Location};
use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::{SinkExt, StreamExt};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// kube-apiserver's `--kubelet-port` default, for a Node that publishes no port.
const DEFAULT_KUBELET_PORT: u16 = 10250;
const PREFERRED_ADDRESS_TYPES: [&str; 5] = [
    "Hostname",
    "InternalDNS",
    "InternalIP",
    "ExternalDNS",
    "ExternalIP",
];
const PORT_FORWARD_TUNNEL: &str = "SPDY/3.1+portforward.k8s.io";
/// The answer when the kubelet cannot be reached or answered nonsense.
fn unreachable(node: &str, e: impl std::fmt::Display) -> Response {
    status(
        StatusCode::SERVICE_UNAVAILABLE,
        "ServiceUnavailable",
        format!("error trying to reach the kubelet of node {node}: {e}"),
    )
}
/// The host and port of a node's kubelet.
fn kubelet_address(
    state: &ApiState,
    settings: &KubeletSettings,
    node: &str,
    port: Option<u16>,
) -> Result<(String, u16), Failure> {
    let object = state
        .objects("nodes")
        .into_iter()
        .find(|n| n["metadata"]["name"] == node)
        .ok_or_else(|| {
            Failure(
                StatusCode::NOT_FOUND,
                "NotFound",
                format!("nodes \"{node}\" not found"),
            )
        })?;
    let published = object["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
        .as_u64()
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p != 0);
    let port = port.or(published).unwrap_or(DEFAULT_KUBELET_PORT);
    if let Some(host) = settings.hosts.get(node) {
        return Ok((host.clone(), port));
    }
    let addresses = object["status"]["addresses"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    PREFERRED_ADDRESS_TYPES
        .iter()
        .find_map(|ty| {
            addresses
                .iter()
                .find(|a| a["type"] == *ty)
                .and_then(|a| a["address"].as_str())
        })
        .map(|host| (host.to_string(), port))
        .ok_or_else(|| {
            Failure(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                format!("no preferred addresses found; known addresses: {addresses:?}"),
            )
        })
}

type Sender = hyper::client::conn::http1::SendRequest<Body>;

/// An HTTP/1.1 connection over TLS to the node's kubelet, and the `Host` to send.
async fn connect(state: &ApiState, location: &Location) -> Result<(Sender, String), Response> {
    let settings = state.kubelet.settings();
    let (host, port) = kubelet_address(state, &settings, &location.node, location.port)
        .map_err(IntoResponse::into_response)?;
    dial(&settings, &host, port)
        .await
        .map(|sender| (sender, format!("{host}:{port}")))
        .map_err(|e| unreachable(&location.node, e))
}

async fn dial(settings: &KubeletSettings, host: &str, port: u16) -> Result<Sender, String> {
    let config = tls_config(settings)?;
    let tcp = tokio::time::timeout(
        CONNECT_TIMEOUT,
        tokio::net::TcpStream::connect((host, port)),
    )
    .await
    .map_err(|_| format!("dial tcp {host}:{port}: i/o timeout"))?
    .map_err(|e| format!("dial tcp {host}:{port}: {e}"))?;
    let name = ServerName::try_from(host.to_string()).map_err(|e| format!("{host}: {e}"))?;
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS handshake with {host}:{port}: {e}"))?;
    let (sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
        .await
        .map_err(|e| format!("HTTP handshake with {host}:{port}: {e}"))?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    Ok(sender)
}

fn tls_config(settings: &KubeletSettings) -> Result<Arc<rustls::ClientConfig>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match &settings.server_ca {
        Some(pem) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                let cert = cert.map_err(|e| format!("the kubelet CA: {e}"))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("the kubelet CA: {e}"))?;
            }
            builder.with_root_certificates(roots)
        }
        None => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Unverified(provider))),
    };
    let config = match &settings.client {
        Some(id) => {
            let certs = CertificateDer::pem_slice_iter(id.cert_pem.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("the kubelet client certificate: {e}"))?;
            let key = PrivateKeyDer::from_pem_slice(id.key_pem.as_bytes())
                .map_err(|e| format!("the kubelet client key: {e}"))?;
            builder
                .with_client_auth_cert(certs, key)
                .map_err(|e| format!("the kubelet client certificate: {e}"))?
        }
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

/// Accepts any kubelet serving certificate (signatures are still checked), as
/// kube-apiserver does without `--kubelet-certificate-authority`.
#[derive(Debug)]
struct Unverified(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Headers that belong to one hop; an upgrade keeps `Connection` and `Upgrade`.
fn copy_headers(from: &HeaderMap, to: &mut HeaderMap, upgrade: bool) {
    for (name, value) in from {
        let hop = matches!(
            name.as_str(),
            "keep-alive"
                | "proxy-connection"
                | "proxy-authenticate"
                | "proxy-authorization"
                | "te"
                | "trailer"
                | "transfer-encoding"
                | "host"
                // the client's credentials are for the API server, never the kubelet
                | "authorization"
        ) || name.as_str().starts_with("impersonate-");
        let upgrade_header = matches!(name.as_str(), "connection" | "upgrade");
        if hop || (upgrade_header && !upgrade) {
            continue;
        }
        to.append(name.clone(), value.clone());
    }
}

fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| {
                v.split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
            })
}

/// Sends the request to the kubelet; relays its answer, and after a 101 the raw bytes.
pub(crate) async fn forward(
    state: &ApiState,
    location: &Location,
    mut req: Request,
) -> Result<Response, Response> {
    let (mut sender, authority) = connect(state, location).await?;
    let fail = |e: &dyn std::fmt::Display| unreachable(&location.node, e);
    let upgrade = is_upgrade(req.headers());
    let client_side = hyper::upgrade::on(&mut req);
    let (parts, body) = req.into_parts();
    let mut out = hyper::Request::builder()
        .method(parts.method.clone())
        .uri(&location.path_and_query)
        .body(body)
        .map_err(|e| fail(&e))?;
    copy_headers(&parts.headers, out.headers_mut(), upgrade);
    out.headers_mut().insert(
        header::HOST,
        HeaderValue::from_str(&authority).map_err(|e| fail(&e))?,
    );
    let mut response = sender.send_request(out).await.map_err(|e| {
        fail(&format_args!(
            "{} {}: {e}",
            parts.method, location.path_and_query
        ))
    })?;
    let mut reply = Response::builder().status(response.status());
    if let Some(headers) = reply.headers_mut() {
        copy_headers(
            response.headers(),
            headers,
            response.status() == StatusCode::SWITCHING_PROTOCOLS,
        );
    }
    if response.status() != StatusCode::SWITCHING_PROTOCOLS {
        return reply
            .body(Body::new(response.into_body()))
            .map_err(|e| fail(&e));
    }
    let kubelet_side = hyper::upgrade::on(&mut response);
    tokio::spawn(async move {
        let (Ok(client), Ok(kubelet)) = tokio::join!(client_side, kubelet_side) else {
            return;
        };
        let mut client = hyper_util::rt::TokioIo::new(client);
        let mut kubelet = hyper_util::rt::TokioIo::new(kubelet);
        let _ = tokio::io::copy_bidirectional(&mut client, &mut kubelet).await;
    });
    reply.body(Body::empty()).map_err(|e| fail(&e))
}

pub(crate) fn is_spdy_tunnel(headers: &HeaderMap) -> bool {
    let websocket = headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    websocket
        && headers
            .get_all(header::SEC_WEBSOCKET_PROTOCOL)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| v.split(',').any(|p| p.trim() == PORT_FORWARD_TUNNEL))
}

/// Port-forward over a WebSocket that carries SPDY: a SPDY upgrade to the kubelet, then
/// each binary message's payload to the kubelet and the kubelet's bytes back as binary
/// messages.
pub(crate) async fn tunnel_port_forward(
    state: &ApiState,
    location: &Location,
    mut req: Request,
) -> Result<Response, Response> {
    let Some(key) = req.headers().get(header::SEC_WEBSOCKET_KEY).cloned() else {
        return Err(status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "a WebSocket upgrade needs Sec-WebSocket-Key".into(),
        ));
    };
    let (mut sender, authority) = connect(state, location).await?;
    let fail = |e: &dyn std::fmt::Display| unreachable(&location.node, e);
    let client_side = hyper::upgrade::on(&mut req);
    let out = hyper::Request::builder()
        .method(Method::POST)
        .uri(&location.path_and_query)
        .header(header::HOST, authority)
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, "SPDY/3.1")
        .header("X-Stream-Protocol-Version", "portforward.k8s.io")
        .body(Body::empty())
        .map_err(|e| fail(&e))?;
    let mut response = sender
        .send_request(out)
        .await
        .map_err(|e| fail(&format_args!("POST {}: {e}", location.path_and_query)))?;
    if response.status() != StatusCode::SWITCHING_PROTOCOLS {
        // Not 101: the client sees the kubelet's refusal and falls back to SPDY.
        let mut reply = Response::builder().status(response.status());
        if let Some(headers) = reply.headers_mut() {
            copy_headers(response.headers(), headers, false);
        }
        return reply
            .body(Body::new(response.into_body()))
            .map_err(|e| fail(&e));
    }
    let kubelet_side = hyper::upgrade::on(&mut response);
    tokio::spawn(async move {
        let (Ok(client), Ok(kubelet)) = tokio::join!(client_side, kubelet_side) else {
            return;
        };
        let ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
            hyper_util::rt::TokioIo::new(client),
            tokio_tungstenite::tungstenite::protocol::Role::Server,
            None,
        )
        .await;
        pump(ws, hyper_util::rt::TokioIo::new(kubelet)).await;
    });
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, "websocket")
        .header(header::SEC_WEBSOCKET_ACCEPT, accept)
        .header(header::SEC_WEBSOCKET_PROTOCOL, PORT_FORWARD_TUNNEL)
        .body(Body::empty())
        .map_err(|e| fail(&e))
}

/// Moves bytes between a WebSocket (binary messages) and a byte stream until either ends.
async fn pump<W, K>(ws: tokio_tungstenite::WebSocketStream<W>, kubelet: K)
where
    W: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    K: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio_tungstenite::tungstenite::Message;
    let (mut ws_tx, mut ws_rx) = ws.split();
    let (mut from_kubelet, mut to_kubelet) = tokio::io::split(kubelet);
    let upstream = async {
        while let Some(Ok(message)) = ws_rx.next().await {
            match message {
                Message::Binary(data) if to_kubelet.write_all(&data).await.is_err() => break,
                Message::Close(_) => break,
                _ => {}
            }
        }
        let _ = to_kubelet.shutdown().await;
    };
    let downstream = async {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            match from_kubelet.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let data = bytes::Bytes::copy_from_slice(&buf[..n]);
                    if ws_tx.send(Message::Binary(data)).await.is_err() {
                        return;
                    }
                }
            }
        }
        let _ = ws_tx.send(Message::Close(None)).await;
    };
    // Either side ending ends the session: SPDY's own GOAWAY has been relayed by then.
    tokio::select! {
        _ = upstream => {}
        _ = downstream => {}
    }
}
