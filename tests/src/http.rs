//! A minimal HTTP/1.0 client for the node's HTTP endpoints on loopback.

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// GET http://127.0.0.1:<port><path>: (status, body).
pub async fn http_get(port: u16, path: &str) -> Result<(u16, String), String> {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| format!("connect 127.0.0.1:{port}: {e}"))?;
    let req = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    s.write_all(req.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&buf).to_string();
    let (head, body) = text.split_once("\r\n\r\n").ok_or("malformed response")?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or("no status code")?;
    Ok((code, body.to_string()))
}
