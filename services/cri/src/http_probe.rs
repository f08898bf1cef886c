//! The HTTP GET of probes and lifecycle hooks, as upstream's prober does it
//! (`pkg/probe/http/{http,request}.go`): a real HTTP/1.1 client (hyper) so that nothing a
//! pod spec says can reach the wire unvalidated, HTTPS without certificate checks, the
//! upstream headers, a bounded body read and upstream's redirect rule.

use bytes::Bytes;
use http::header::{ACCEPT, HOST, HeaderMap, HeaderName, HeaderValue, LOCATION, USER_AGENT};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Request, Response, Uri};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::HTTPGetAction;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};

/// Upstream's `maxRespBodyLength`: a probe reads at most 10 KiB of the body.
pub const MAX_BODY: usize = 10 * 1024;
/// Upstream (and Go's client) stop after 10 redirects.
const MAX_REDIRECTS: usize = 10;
/// Upstream's prober identifies itself as `kube-probe/<major>.<minor>`.
pub const USER_AGENT_VALUE: &str = "kube-probe/1.37";

/// A probe that did not fail: plainly, or with a warning (upstream `probe.Warning`, which
/// counts as success).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probed {
    Success,
    Warning(String),
}

/// One HTTP GET as the action describes it, against `default_host` when it names no host.
/// Status 200..400 is success; a redirect to another host is not followed and is a warning.
pub async fn http_probe(
    action: &HTTPGetAction,
    default_host: &str,
    port: u16,
    timeout: Duration,
) -> Result<Probed, String> {
    let request = ProbeRequest::new(action, default_host, port)?;
    let url = request.uri.to_string();
    tokio::time::timeout(timeout, request.run())
        .await
        .map_err(|_| format!("GET {url}: timed out after {}s", timeout.as_secs()))?
}

/// A validated probe request: the URL and headers, each checked by `http`'s parsers
/// (which refuse CR, LF and other bytes that would split the request).
#[derive(Debug)]
struct ProbeRequest {
    uri: Uri,
    headers: HeaderMap,
    /// A Host header given in `httpHeaders`, sent instead of the URL's authority.
    custom_host: Option<HeaderValue>,
}

impl ProbeRequest {
    fn new(action: &HTTPGetAction, default_host: &str, port: u16) -> Result<Self, String> {
        let host = action
            .host
            .as_deref()
            .filter(|h| !h.is_empty())
            .unwrap_or(default_host);
        let scheme = match action.scheme.as_deref().unwrap_or("HTTP") {
            s if s.eq_ignore_ascii_case("http") => Scheme::HTTP,
            s if s.eq_ignore_ascii_case("https") => Scheme::HTTPS,
            other => return Err(format!("unsupported probe scheme {other:?}")),
        };
        let uri = build_uri(scheme, host, port, action.path.as_deref().unwrap_or("/"))?;
        let mut headers = HeaderMap::new();
        let mut custom_host = None;
        for h in action.http_headers.iter().flatten() {
            let name = HeaderName::from_bytes(h.name.as_bytes())
                .map_err(|_| format!("invalid probe header name {:?}", h.name))?;
            let value = HeaderValue::from_str(&h.value)
                .map_err(|_| format!("invalid value for probe header {:?}", h.name))?;
            if name == HOST {
                custom_host = Some(value);
            } else {
                headers.append(name, value);
            }
        }
        // Upstream sets these only when httpHeaders does not.
        if !headers.contains_key(USER_AGENT) {
            headers.insert(USER_AGENT, HeaderValue::from_static(USER_AGENT_VALUE));
        }
        if !headers.contains_key(ACCEPT) {
            headers.insert(ACCEPT, HeaderValue::from_static("*/*"));
        }
        Ok(Self {
            uri,
            headers,
            custom_host,
        })
    }

    /// Sends the GET, following redirects to the same host (by hostname, as upstream's
    /// `RedirectChecker`) up to 10 times.
    async fn run(self) -> Result<Probed, String> {
        let first_host = self.uri.host().unwrap_or_default().to_string();
        let mut uri = self.uri.clone();
        let mut custom_host = self.custom_host.clone();
        let mut redirects = 0;
        loop {
            let (response, _connection) = self.send(&uri, custom_host.as_ref()).await?;
            let status = response.status();
            let location = response
                .headers()
                .get(LOCATION)
                .and_then(|l| l.to_str().ok())
                .map(str::to_string);
            let follow = status.is_redirection() && status != http::StatusCode::NOT_MODIFIED;
            if let (true, Some(location)) = (follow, location) {
                let (next, relative) = resolve(&uri, &location)?;
                if next.host().unwrap_or_default() == first_host {
                    if redirects >= MAX_REDIRECTS {
                        return Err(format!("GET {uri}: stopped after 10 redirects"));
                    }
                    redirects += 1;
                    // Go keeps a custom Host header only through a relative redirect.
                    if !relative {
                        custom_host = None;
                    }
                    uri = next;
                    continue;
                }
            }
            return outcome(status, response).await;
        }
    }

    async fn send(
        &self,
        uri: &Uri,
        host: Option<&HeaderValue>,
    ) -> Result<(Response<Incoming>, Connection), String> {
        let authority = uri.authority().map(Authority::as_str).unwrap_or_default();
        let host = match host {
            Some(h) => h.clone(),
            None => HeaderValue::from_str(authority).map_err(|e| format!("GET {uri}: {e}"))?,
        };
        let mut request = Request::get(uri.path_and_query().map_or("/", PathAndQuery::as_str))
            .body(Empty::<Bytes>::new())
            .map_err(|e| format!("GET {uri}: {e}"))?;
        *request.headers_mut() = self.headers.clone();
        request.headers_mut().insert(HOST, host);
        let https = uri.scheme() == Some(&Scheme::HTTPS);
        let default_port = if https { 443 } else { 80 };
        let target = (
            uri.host().unwrap_or_default().trim_matches(['[', ']']),
            uri.port_u16().unwrap_or(default_port),
        );
        let tcp = tokio::net::TcpStream::connect(target)
            .await
            .map_err(|e| format!("GET {uri}: {e}"))?;
        let result = if https {
            let name = rustls::pki_types::ServerName::try_from(target.0.to_string())
                .map_err(|e| format!("GET {uri}: {e}"))?;
            let tls = tls_connector()
                .connect(name, tcp)
                .await
                .map_err(|e| format!("GET {uri}: {e}"))?;
            exchange(tls, request).await
        } else {
            exchange(tcp, request).await
        };
        result.map_err(|e| format!("GET {uri}: {e}"))
    }
}

/// Upstream's verdict on the last response: 2xx success, 3xx (a redirect not followed)
/// a warning, anything else a failure. At most 10 KiB of the body is read.
async fn outcome(status: http::StatusCode, response: Response<Incoming>) -> Result<Probed, String> {
    let body = read_at_most(response.into_body(), MAX_BODY).await;
    let code = status.as_u16();
    if !(200..400).contains(&code) {
        return Err(format!("HTTP probe failed with statuscode: {code}"));
    }
    if status.is_redirection() {
        return Ok(Probed::Warning(format!(
            "Probe terminated redirects, Response body: {}",
            String::from_utf8_lossy(&body)
        )));
    }
    Ok(Probed::Success)
}

/// Reads up to `limit` bytes of the body and drops the rest (the connection closes).
async fn read_at_most(mut body: Incoming, limit: usize) -> Vec<u8> {
    let mut out = Vec::new();
    while out.len() < limit {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    let take = data.len().min(limit - out.len());
                    out.extend_from_slice(&data[..take]);
                }
            }
            _ => break,
        }
    }
    out
}

/// `scheme://host:port` + path, checked by `http::Uri` (no CR/LF, no spaces) and with the
/// parsed host equal to the one given (so `user@host` or `host/path` tricks are refused).
fn build_uri(scheme: Scheme, host: &str, port: u16, path: &str) -> Result<Uri, String> {
    let authority = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let parsed: Authority = authority
        .parse()
        .map_err(|_| format!("invalid probe host {host:?}"))?;
    if parsed.host().trim_matches(['[', ']']) != host.trim_matches(['[', ']']) {
        return Err(format!("invalid probe host {host:?}"));
    }
    let path = if path.starts_with('/') {
        path.to_string()
    } else {
        format!("/{path}")
    };
    let path: PathAndQuery = path
        .parse()
        .map_err(|_| format!("invalid probe path {path:?}"))?;
    Uri::builder()
        .scheme(scheme)
        .authority(parsed)
        .path_and_query(path)
        .build()
        .map_err(|e| format!("invalid probe URL: {e}"))
}

/// The target of a redirect, resolved against the current URL; true when it was relative.
fn resolve(current: &Uri, location: &str) -> Result<(Uri, bool), String> {
    let parsed: Uri = location
        .parse()
        .map_err(|_| format!("invalid redirect location {location:?}"))?;
    if parsed.scheme().is_some() && parsed.authority().is_some() {
        return Ok((parsed, false));
    }
    let path = parsed
        .path_and_query()
        .map_or("/", PathAndQuery::as_str)
        .to_string();
    let path = if path.starts_with('/') {
        path
    } else {
        // Relative to the current path's directory.
        let base = current.path();
        format!("{}{path}", &base[..=base.rfind('/').unwrap_or(0)])
    };
    let mut parts = current.clone().into_parts();
    parts.path_and_query = Some(
        path.parse()
            .map_err(|_| format!("invalid redirect location {location:?}"))?,
    );
    Ok((
        Uri::from_parts(parts).map_err(|e| format!("invalid redirect: {e}"))?,
        true,
    ))
}

/// The task driving one connection; dropping it closes the connection, so a probe that
/// times out or has read enough leaves nothing behind.
struct Connection(tokio::task::JoinHandle<()>);

impl Drop for Connection {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One request on a fresh HTTP/1.1 connection (upstream disables keep-alives).
async fn exchange<T>(
    io: T,
    request: Request<Empty<Bytes>>,
) -> Result<(Response<Incoming>, Connection), String>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| e.to_string())?;
    let connection = Connection(tokio::spawn(async move {
        let _ = connection.await;
    }));
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    Ok((response, connection))
}

/// TLS without certificate verification, as upstream (`InsecureSkipVerify: true`): a
/// probe checks that the container answers, and pods' serving certificates are usually
/// self-signed or issued for names the node does not dial. Handshake signatures are still
/// checked, so the peer holds the key of the certificate it shows.
fn tls_connector() -> tokio_rustls::TlsConnector {
    static CONNECTOR: OnceLock<tokio_rustls::TlsConnector> = OnceLock::new();
    CONNECTOR
        .get_or_init(|| {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let config = rustls::ClientConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .expect("ring supports the default protocol versions")
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
                .with_no_client_auth();
            tokio_rustls::TlsConnector::from(Arc::new(config))
        })
        .clone()
}

#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
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
        cert: &rustls::pki_types::CertificateDer<'_>,
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

#[cfg(test)]
mod tests;
