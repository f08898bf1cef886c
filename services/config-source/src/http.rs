//! The HTTP source: `staticPodURL` (with `staticPodURLHeader`), fetched every
//! `httpCheckFrequency`; the body is one Pod or a PodList, in YAML or JSON. A failed fetch
//! or a bad body is logged (once per distinct error) and keeps the last good set, as
//! upstream does.

use crate::manifest::{self, Origin};
use crate::store::PodStore;
use nodeagent_transport::{Heartbeat, Shutdown};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub struct HttpSource {
    pub url: String,
    pub headers: BTreeMap<String, Vec<String>>,
    pub node_name: String,
    pub period: Duration,
    pub store: Arc<Mutex<PodStore>>,
}

/// Longest response head we read before the body.
const MAX_HEAD_BYTES: usize = 64 * 1024;

/// How long one fetch may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(30);

impl HttpSource {
    /// How long the loop may go without a beat: a period, a fetch, and slack.
    pub fn max_silence(&self) -> Duration {
        self.period + FETCH_TIMEOUT + Duration::from_secs(30)
    }

    /// Fetches every period until `shutdown`, beating `heartbeat` after every fetch.
    pub async fn run(self, shutdown: Shutdown, heartbeat: Heartbeat) {
        let mut last_error = String::new();
        loop {
            heartbeat.beat();
            match self.fetch().await.and_then(|body| self.pods(&body)) {
                Ok(pods) => {
                    if !last_error.is_empty() {
                        tracing::info!(source = "http", url = %self.url, "static pod URL readable again");
                    }
                    last_error.clear();
                    crate::store::publish(&self.store, "http", pods);
                }
                Err(reason) => {
                    if reason != last_error {
                        tracing::error!(source = "http", url = %self.url, %reason, "cannot read pods from the static pod URL; keeping the last good set");
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

    /// GET over plain HTTP/1.0 (so the body is never chunked); 200 only.
    async fn fetch(&self) -> Result<Vec<u8>, String> {
        let rest = self.url.strip_prefix("http://").ok_or_else(|| {
            format!(
                "unsupported URL {:?}: only http:// is supported yet",
                self.url
            )
        })?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let addr = if authority.contains(':') {
            authority.to_string()
        } else {
            format!("{authority}:80")
        };
        let mut request =
            format!("GET {path} HTTP/1.0\r\nHost: {authority}\r\nUser-Agent: nodeagent\r\n");
        for (name, values) in &self.headers {
            for v in values {
                request.push_str(&format!("{name}: {v}\r\n"));
            }
        }
        request.push_str("\r\n");
        let exchange = async {
            let mut stream = tokio::net::TcpStream::connect(&addr)
                .await
                .map_err(|e| format!("GET {}: {e}", self.url))?;
            stream
                .write_all(request.as_bytes())
                .await
                .map_err(|e| e.to_string())?;
            // One byte over the limits tells "too big" from "just fits".
            let mut buf = Vec::new();
            stream
                .take((MAX_HEAD_BYTES + manifest::MAX_MANIFEST_BYTES + 1) as u64)
                .read_to_end(&mut buf)
                .await
                .map_err(|e| e.to_string())?;
            Ok::<_, String>(buf)
        };
        let buf = tokio::time::timeout(FETCH_TIMEOUT, exchange)
            .await
            .map_err(|_| format!("GET {}: timed out", self.url))??;
        let split = buf
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .filter(|split| *split <= MAX_HEAD_BYTES)
            .ok_or("malformed HTTP response (no end of the head within 64 KiB)")?;
        let body_len = buf.len() - (split + 4);
        if body_len > manifest::MAX_MANIFEST_BYTES {
            return Err(format!(
                "GET {}: the body is over the limit of {} bytes",
                self.url,
                manifest::MAX_MANIFEST_BYTES
            ));
        }
        let head = String::from_utf8_lossy(&buf[..split]);
        let code: u16 = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or("malformed HTTP status line")?;
        if code != 200 {
            return Err(format!("GET {} answered HTTP {code}", self.url));
        }
        Ok(buf[split + 4..].to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Serves one response: a 200 head and `body_len` bytes of body.
    async fn serve_once(body_len: usize) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut request = [0u8; 1024];
            let _ = conn.read(&mut request).await;
            let _ = conn.write_all(b"HTTP/1.0 200 OK\r\n\r\n").await;
            let _ = conn.write_all(&vec![b'#'; body_len]).await;
        });
        format!("http://{addr}/pods")
    }

    fn source(url: String) -> HttpSource {
        HttpSource {
            url,
            headers: BTreeMap::new(),
            node_name: "n1".into(),
            period: Duration::from_secs(20),
            store: Arc::new(Mutex::new(PodStore::new(["http"]))),
        }
    }

    #[tokio::test]
    async fn a_body_at_the_limit_is_read_and_one_byte_more_is_refused() {
        let at = source(serve_once(manifest::MAX_MANIFEST_BYTES).await);
        assert_eq!(
            at.fetch().await.unwrap().len(),
            manifest::MAX_MANIFEST_BYTES
        );
        let over = source(serve_once(manifest::MAX_MANIFEST_BYTES + 1).await);
        let err = over.fetch().await.unwrap_err();
        assert!(err.contains("the body is over the limit"), "{err}");
    }
}
