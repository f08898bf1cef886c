//! A client of Kubernetes' WebSocket channel protocols (`v4.channel.k8s.io` and
//! friends) over the kubelet API's TLS port, as kubectl's WebSocket executor and
//! port-forward tunnel use them: every binary message starts with its channel number
//! (exec and attach: 0 stdin, 1 stdout, 2 stderr, 3 the error channel with a `Status`,
//! 4 terminal resize; port-forward: per port a data and an error channel).

use crate::kubelet_client::KubeletClient;
use futures::{SinkExt, StreamExt};
use std::collections::BTreeMap;
use std::time::Duration;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

type Tls = tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

/// How a WebSocket upgrade was refused: the HTTP status and body.
#[derive(Debug)]
pub struct Refused {
    pub status: u16,
    pub body: String,
}

/// One WebSocket channel-protocol session.
pub struct ChannelClient {
    ws: WebSocketStream<Tls>,
    /// The subprotocol the server chose.
    pub protocol: Option<String>,
}

/// Everything a session received, per channel, until the server closed it.
#[derive(Debug, Default)]
pub struct Received(pub BTreeMap<u8, Vec<u8>>);

impl Received {
    pub fn text(&self, channel: u8) -> String {
        self.0
            .get(&channel)
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .unwrap_or_default()
    }
}

impl ChannelClient {
    /// Opens `path` on the node's kubelet API offering `protocols`. `Err(Ok(refused))` is a
    /// refused upgrade (an HTTP answer that is not 101); `Err(Err(why))` anything else.
    pub async fn connect(
        api: &KubeletClient,
        path: &str,
        protocols: &[&str],
    ) -> Result<ChannelClient, Result<Refused, String>> {
        let stream = api.connect().await.map_err(Err)?;
        let mut request = format!("wss://localhost:{}{path}", api.port)
            .into_client_request()
            .map_err(|e| Err(e.to_string()))?;
        if !protocols.is_empty() {
            request.headers_mut().insert(
                "Sec-WebSocket-Protocol",
                protocols
                    .join(", ")
                    .parse()
                    .map_err(|_| Err("bad protocol".to_string()))?,
            );
        }
        if let Some(a) = api.authorization() {
            request.headers_mut().insert(
                "Authorization",
                a.parse().map_err(|_| Err("bad token".to_string()))?,
            );
        }
        match tokio_tungstenite::client_async(request, stream).await {
            Ok((ws, response)) => Ok(ChannelClient {
                ws,
                protocol: response
                    .headers()
                    .get("sec-websocket-protocol")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string),
            }),
            Err(WsError::Http(response)) => Err(Ok(Refused {
                status: response.status().as_u16(),
                body: response
                    .body()
                    .as_deref()
                    .map(|b| String::from_utf8_lossy(b).into_owned())
                    .unwrap_or_default(),
            })),
            Err(e) => Err(Err(format!("WebSocket handshake on {path}: {e}"))),
        }
    }

    /// Sends `data` on `channel`.
    pub async fn send(&mut self, channel: u8, data: &[u8]) -> Result<(), String> {
        let mut frame = Vec::with_capacity(data.len() + 1);
        frame.push(channel);
        frame.extend_from_slice(data);
        self.ws
            .send(Message::Binary(frame.into()))
            .await
            .map_err(|e| format!("sending on channel {channel}: {e}"))
    }

    /// A terminal size on the resize channel (4), as kubectl sends it.
    pub async fn resize(&mut self, width: u16, height: u16) -> Result<(), String> {
        let size = serde_json::json!({ "Width": width, "Height": height }).to_string();
        self.send(4, size.as_bytes()).await
    }

    /// The next data message as (channel, payload); `None` once the server closed.
    pub async fn recv(&mut self) -> Result<Option<(u8, Vec<u8>)>, String> {
        loop {
            match self.ws.next().await {
                None | Some(Ok(Message::Close(_))) => return Ok(None),
                Some(Err(WsError::ConnectionClosed | WsError::AlreadyClosed)) => return Ok(None),
                // The runtime closes TCP without a close frame once a session ends.
                Some(Err(WsError::Protocol(_))) => return Ok(None),
                Some(Err(e)) => return Err(format!("receiving: {e}")),
                Some(Ok(Message::Binary(b))) => {
                    if let Some((&channel, payload)) = b.split_first() {
                        return Ok(Some((channel, payload.to_vec())));
                    }
                }
                Some(Ok(Message::Text(t))) => {
                    // A base64 protocol: an ASCII channel digit, then base64 (not decoded here).
                    let b = t.as_bytes();
                    if let Some((&channel, payload)) = b.split_first() {
                        return Ok(Some((channel.wrapping_sub(b'0'), payload.to_vec())));
                    }
                }
                Some(Ok(_)) => {}
            }
        }
    }

    /// Reads until `until` holds for what arrived so far (or the server closes), within
    /// `deadline`.
    pub async fn read_until(
        &mut self,
        received: &mut Received,
        deadline: Duration,
        until: impl Fn(&Received) -> bool,
    ) -> Result<(), String> {
        let end = tokio::time::Instant::now() + deadline;
        while !until(received) {
            match tokio::time::timeout_at(end, self.recv()).await {
                Err(_) => {
                    return Err(format!(
                        "timed out after {deadline:?}; received so far: {received:?}"
                    ));
                }
                Ok(Err(e)) => return Err(e),
                Ok(Ok(None)) => {
                    return Err(format!(
                        "the server closed the stream; received: {received:?}"
                    ));
                }
                Ok(Ok(Some((channel, data)))) => received
                    .0
                    .entry(channel)
                    .or_default()
                    .extend_from_slice(&data),
            }
        }
        Ok(())
    }

    /// Reads everything until the server closes, within `deadline`.
    pub async fn read_to_close(&mut self, deadline: Duration) -> Result<Received, String> {
        let mut received = Received::default();
        let end = tokio::time::Instant::now() + deadline;
        loop {
            match tokio::time::timeout_at(end, self.recv()).await {
                Err(_) => {
                    return Err(format!(
                        "the stream did not end within {deadline:?}; received: {received:?}"
                    ));
                }
                Ok(Err(e)) => return Err(e),
                Ok(Ok(None)) => return Ok(received),
                Ok(Ok(Some((channel, data)))) => received
                    .0
                    .entry(channel)
                    .or_default()
                    .extend_from_slice(&data),
            }
        }
    }

    pub async fn close(mut self) {
        let _ = self.ws.close(None).await;
    }
}

/// The exit code a v4 error-channel `Status` reports: 0 for `Success`, the `ExitCode`
/// cause of `NonZeroExitCode`; `Err` for any other status (an error running the command).
pub fn exit_code(status_json: &[u8]) -> Result<i32, String> {
    let status: serde_json::Value = serde_json::from_slice(status_json).map_err(|e| {
        format!(
            "error channel is not a Status ({e}): {}",
            String::from_utf8_lossy(status_json)
        )
    })?;
    if status["status"] == "Success" {
        return Ok(0);
    }
    if status["reason"] == "NonZeroExitCode" {
        let causes = status["details"]["causes"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if let Some(code) = causes
            .iter()
            .find(|c| c["reason"] == "ExitCode")
            .and_then(|c| c["message"].as_str())
            .and_then(|m| m.parse().ok())
        {
            return Ok(code);
        }
    }
    Err(format!("not an exit status: {status}"))
}
