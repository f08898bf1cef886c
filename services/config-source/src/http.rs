//! The HTTP source: `staticPodURL` (with `staticPodURLHeader`), fetched every
//! `httpCheckFrequency`; the body is one Pod or a PodList, in YAML or JSON. A failed fetch
//! or a bad body is logged (once per distinct error) and keeps the last good set, as
//! upstream does.

use crate::manifest::{self, Origin};
use crate::store::PodStore;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use nodeagent_transport::{Heartbeat, Shutdown};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

type HttpsClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Empty<Bytes>>;

pub struct HttpSource {
    url: String,
    headers: BTreeMap<String, Vec<String>>,
    node_name: String,
    period: Duration,
    store: Arc<Mutex<PodStore>>,
    client: HttpsClient,
}

/// How long one fetch may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(30);

/// A URL as it may be logged: its query string (which may carry a token) left out.
pub fn loggable_url(url: &str) -> String {
    match url.split_once('?') {
        Some((base, _)) => format!("{base}?<query omitted>"),
        None => url.to_string(),
    }
}

impl HttpSource {
    /// A source that trusts the system's roots for https:// (upstream: Go's default
    /// client; `SSL_CERT_FILE` and `SSL_CERT_DIR` name other bundles, as for curl).
    pub fn new(
        url: String,
        headers: BTreeMap<String, Vec<String>>,
        node_name: String,
        period: Duration,
        store: Arc<Mutex<PodStore>>,
    ) -> Result<HttpSource, String> {
        Self::with_roots(url, headers, node_name, period, store, None)
    }

    /// [`HttpSource::new`] trusting `roots` instead of the system's.
    pub fn with_roots(
        url: String,
        headers: BTreeMap<String, Vec<String>>,
        node_name: String,
        period: Duration,
        store: Arc<Mutex<PodStore>>,
        roots: Option<rustls::RootCertStore>,
    ) -> Result<HttpSource, String> {
        let scheme = url.split_once("://").map(|(s, _)| s);
        if !matches!(scheme, Some("http" | "https")) {
            return Err(format!(
                "staticPodURL {}: want an http:// or https:// URL",
                loggable_url(&url)
            ));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = hyper_rustls::HttpsConnectorBuilder::new();
        let builder = match roots {
            Some(roots) => builder.with_tls_config(
                rustls::ClientConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .map_err(|e| e.to_string())?
                    .with_root_certificates(roots)
                    .with_no_client_auth(),
            ),
            None => builder
                .with_provider_and_native_roots(provider)
                .map_err(|e| format!("the system's trusted certificates: {e}"))?,
        };
        let connector = builder.https_or_http().enable_http1().build();
        let client = Client::builder(hyper_util::rt::TokioExecutor::new()).build(connector);
        Ok(HttpSource {
            url,
            headers,
            node_name,
            period,
            store,
            client,
        })
    }

    /// How long the loop may go without a beat: a period, a fetch, and slack.
    pub fn max_silence(&self) -> Duration {
        self.period + FETCH_TIMEOUT + Duration::from_secs(30)
    }

    /// Fetches every period until `shutdown`, beating `heartbeat` after every fetch.
    pub async fn run(self, shutdown: Shutdown, heartbeat: Heartbeat) {
        let mut last_error = String::new();
        let url = loggable_url(&self.url);
        loop {
            heartbeat.beat();
            match self.fetch().await.and_then(|body| self.pods(&body)) {
                Ok(pods) => {
                    if !last_error.is_empty() {
                        tracing::info!(source = "http", %url, "static pod URL readable again");
                    }
                    last_error.clear();
                    crate::store::publish(&self.store, "http", pods);
                }
                Err(reason) => {
                    if reason != last_error {
                        tracing::error!(source = "http", %url, %reason, "cannot read pods from the static pod URL; keeping the last good set");
                        last_error = reason;
                    }
                }
            }
            tokio::select! {
                _ = shutdown.wait() => return,
                _ = tokio::time::sleep(self.period) => {}
            }
        }
    }

    fn pods(&self, body: &[u8]) -> Result<Vec<k8s_openapi::api::core::v1::Pod>, String> {
        let pods = manifest::decode_pods(body)?;
        pods.into_iter()
            .map(|p| manifest::static_pod(p, Origin::Url(&self.url), &self.node_name))
            .collect()
    }

    /// GET (http:// or https://, the certificate verified); 200 only, the body at most
    /// [`manifest::MAX_MANIFEST_BYTES`]. Errors never show the URL's query string.
    async fn fetch(&self) -> Result<Vec<u8>, String> {
        let url = loggable_url(&self.url);
        let mut request =
            http::Request::get(self.url.as_str()).header(http::header::USER_AGENT, "nodeagent");
        for (name, values) in &self.headers {
            for v in values {
                request = request.header(name.as_str(), v.as_str());
            }
        }
        let request = request
            .body(Empty::<Bytes>::new())
            .map_err(|e| format!("GET {url}: {e}"))?;
        let exchange = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|e| format!("GET {url}: {}", error_chain(&e)))?;
            let code = response.status().as_u16();
            if code != 200 {
                return Err(format!("GET {url} answered HTTP {code}"));
            }
            let body = Limited::new(response.into_body(), manifest::MAX_MANIFEST_BYTES)
                .collect()
                .await
                .map_err(|e| {
                    if e.is::<http_body_util::LengthLimitError>() {
                        format!(
                            "GET {url}: the body is over the limit of {} bytes",
                            manifest::MAX_MANIFEST_BYTES
                        )
                    } else {
                        format!("GET {url}: {e}")
                    }
                })?;
            Ok(body.to_bytes().to_vec())
        };
        tokio::time::timeout(FETCH_TIMEOUT, exchange)
            .await
            .map_err(|_| format!("GET {url}: timed out"))?
    }
}

/// An error and its causes, `: `-joined (the TLS verdict is in a cause).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const HEAD: &[u8] = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n";

    /// Serves one plain HTTP response: a 200 head and `body_len` bytes of body.
    async fn serve_once(body_len: usize) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut request = [0u8; 1024];
            let _ = conn.read(&mut request).await;
            let _ = conn.write_all(HEAD).await;
            let _ = conn.write_all(&vec![b'#'; body_len]).await;
        });
        format!("http://{addr}/pods")
    }

    /// Serves one HTTPS response with a certificate for `localhost`; returns the URL and
    /// the certificate (to trust it, or not).
    async fn serve_tls_once(body: &'static [u8]) -> (String, rcgen::CertifiedKey<rcgen::KeyPair>) {
        let certified = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let key = rustls::pki_types::PrivateKeyDer::try_from(certified.signing_key.serialize_der())
            .unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![certified.cert.der().clone()], key)
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let Ok(mut conn) = acceptor.accept(tcp).await else {
                return;
            };
            let mut request = [0u8; 1024];
            let _ = conn.read(&mut request).await;
            let _ = conn.write_all(HEAD).await;
            let _ = conn.write_all(body).await;
            let _ = conn.shutdown().await;
        });
        (
            format!("https://localhost:{port}/pods?token=s3cret"),
            certified,
        )
    }

    fn source(url: String, roots: Option<rustls::RootCertStore>) -> HttpSource {
        HttpSource::with_roots(
            url,
            BTreeMap::new(),
            "n1".into(),
            Duration::from_secs(20),
            Arc::new(Mutex::new(PodStore::new(["http"]))),
            Some(roots.unwrap_or_else(rustls::RootCertStore::empty)),
        )
        .unwrap()
    }

    #[tokio::test]
    async fn a_body_at_the_limit_is_read_and_one_byte_more_is_refused() {
        let at = source(serve_once(manifest::MAX_MANIFEST_BYTES).await, None);
        assert_eq!(
            at.fetch().await.unwrap().len(),
            manifest::MAX_MANIFEST_BYTES
        );
        let over = source(serve_once(manifest::MAX_MANIFEST_BYTES + 1).await, None);
        let err = over.fetch().await.unwrap_err();
        assert!(err.contains("the body is over the limit"), "{err}");
    }

    /// https:// with a certificate the node trusts is read; one it does not trust (a
    /// man in the middle's) is refused, and no error shows the URL's query string.
    #[tokio::test]
    async fn https_is_verified_and_the_query_string_is_never_shown() {
        let (url, cert) = serve_tls_once(b"{}").await;
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert.cert.der().clone()).unwrap();
        assert_eq!(source(url, Some(roots)).fetch().await.unwrap(), b"{}");

        let (url, _) = serve_tls_once(b"{}").await;
        let err = source(url, None).fetch().await.unwrap_err();
        assert!(err.contains("invalid peer certificate"), "{err}");
        assert!(!err.contains("s3cret"), "{err}");
        assert!(err.contains("?<query omitted>"), "{err}");
    }

    #[test]
    fn only_http_and_https_urls_are_taken() {
        let store = Arc::new(Mutex::new(PodStore::new(["http"])));
        let make = |url: &str| {
            HttpSource::new(
                url.into(),
                BTreeMap::new(),
                "n".into(),
                Duration::from_secs(1),
                store.clone(),
            )
            .err()
        };
        assert!(
            make("ftp://x/pods?k=v")
                .unwrap()
                .contains("ftp://x/pods?<query omitted>")
        );
        assert_eq!(make("http://x/pods"), None);
    }
}
