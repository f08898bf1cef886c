//! A minimal HTTP/1.0 client for the node's HTTP endpoints on loopback.

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Why a GET got no answer.
#[derive(Debug)]
pub enum HttpError {
    /// No connection was made (nothing listening, or it refused).
    Connect(String),
    /// Connected, but the connection broke or closed before a whole answer came.
    Broken(String),
}

impl std::fmt::Display for HttpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HttpError::Connect(e) | HttpError::Broken(e) => f.write_str(e),
        }
    }
}

/// GET http://127.0.0.1:<port><path>: (status, body).
pub async fn http_get(port: u16, path: &str) -> Result<(u16, String), String> {
    get(port, path).await.map_err(|e| e.to_string())
}

/// [`http_get`], telling a connection never made from one cut off.
pub async fn get(port: u16, path: &str) -> Result<(u16, String), HttpError> {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| HttpError::Connect(format!("connect 127.0.0.1:{port}: {e}")))?;
    let broken = |e: String| HttpError::Broken(e);
    let req = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    s.write_all(req.as_bytes())
        .await
        .map_err(|e| broken(e.to_string()))?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)
        .await
        .map_err(|e| broken(e.to_string()))?;
    let text = String::from_utf8_lossy(&buf).to_string();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| broken(format!("closed after {} bytes, no whole answer", buf.len())))?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| broken("no status code".into()))?;
    Ok((code, body.to_string()))
}
