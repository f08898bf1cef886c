//! An HTTPS client for the node's kubelet API on port 10250, as the API server or
//! metrics-server would call it: TLS, optionally a client certificate or a bearer token.
//! The node's serving certificate is self-signed, so it is trusted as read from the node's
//! cert dir.

use crate::pki::Identity;
use http_body_util::{BodyExt, Empty};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::path::PathBuf;
use std::sync::Arc;

/// How a request authenticates.
#[derive(Clone, Debug, Default)]
pub enum Credentials {
    #[default]
    None,
    Cert(Identity),
    Token(String),
}

/// The kubelet API of one node.
#[derive(Clone, Debug)]
pub struct KubeletClient {
    pub port: u16,
    /// The node's serving certificate (`<cert-dir>/kubelet.crt`).
    pub server_cert: PathBuf,
    pub credentials: Credentials,
}

/// A whole response.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

impl KubeletClient {
    pub fn with(&self, credentials: Credentials) -> KubeletClient {
        KubeletClient {
            credentials,
            ..self.clone()
        }
    }

    /// The TLS client configuration: trusts the node's certificate, presents ours.
    pub fn tls_config(&self) -> Result<Arc<rustls::ClientConfig>, String> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(&self.server_cert)
            .map_err(|e| format!("{}: {e}", self.server_cert.display()))?
        {
            roots
                .add(cert.map_err(|e| e.to_string())?)
                .map_err(|e| e.to_string())?;
        }
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots);
        let config = match &self.credentials {
            Credentials::Cert(id) => {
                let certs = CertificateDer::pem_slice_iter(id.cert_pem.as_bytes())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| e.to_string())?;
                let key = PrivateKeyDer::from_pem_slice(id.key_pem.as_bytes())
                    .map_err(|e| e.to_string())?;
                builder
                    .with_client_auth_cert(certs, key)
                    .map_err(|e| e.to_string())?
            }
            _ => builder.with_no_client_auth(),
        };
        Ok(Arc::new(config))
    }

    /// A TLS connection to the node, for protocols that need the raw stream (WebSocket).
    pub async fn connect(
        &self,
    ) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, String> {
        self.connect_as("localhost").await
    }

    /// A TLS connection to the node that verifies its certificate under `name` (a
    /// certificate issued for the node's name rather than `localhost`).
    pub async fn connect_as(
        &self,
        name: &str,
    ) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, String> {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", self.port))
            .await
            .map_err(|e| format!("connect 127.0.0.1:{}: {e}", self.port))?;
        let name = ServerName::try_from(name.to_string()).map_err(|e| e.to_string())?;
        let connector = tokio_rustls::TlsConnector::from(self.tls_config()?);
        connector
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS: {e}"))
    }

    /// The `Authorization` header value, if the credentials are a token.
    pub fn authorization(&self) -> Option<String> {
        match &self.credentials {
            Credentials::Token(t) => Some(format!("Bearer {t}")),
            _ => None,
        }
    }

    /// Sends one request and reads the whole response.
    pub async fn request(&self, method: &str, path: &str) -> Result<Reply, String> {
        self.request_with(method, path, &[]).await
    }

    /// Sends one request with more `headers` and reads the whole response.
    pub async fn request_with(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Result<Reply, String> {
        let response = self.send_with(method, path, headers).await?;
        let (parts, body) = response.into_parts();
        let body = body
            .collect()
            .await
            .map_err(|e| format!("reading the body: {e}"))?
            .to_bytes()
            .to_vec();
        Ok(Reply {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body,
        })
    }

    pub async fn get(&self, path: &str) -> Result<Reply, String> {
        self.request("GET", path).await
    }

    /// Sends one request and returns the response with its body still streaming
    /// (`follow=true`).
    pub async fn send(
        &self,
        method: &str,
        path: &str,
    ) -> Result<hyper::Response<hyper::body::Incoming>, String> {
        self.send_with(method, path, &[]).await
    }

    async fn send_with(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Result<hyper::Response<hyper::body::Incoming>, String> {
        let stream = self.connect().await?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(|e| format!("HTTP handshake: {e}"))?;
        tokio::spawn(conn);
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", format!("localhost:{}", self.port));
        if let Some(a) = self.authorization() {
            request = request.header("authorization", a);
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request
            .body(Empty::<bytes::Bytes>::new())
            .map_err(|e| e.to_string())?;
        sender
            .send_request(request)
            .await
            .map_err(|e| format!("{method} {path}: {}", error_chain(&e)))
    }
}

/// An error and its sources, so that what hyper calls a "connection error" says why (the
/// server's TLS alert, say).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
