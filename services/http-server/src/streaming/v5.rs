//! `v5.channel.k8s.io` for exec and attach, spoken by the kubelet API itself.
//!
//! v5 is v4's WebSocket channel protocol (every binary message starts with its channel:
//! 0 stdin, 1 stdout, 2 stderr, 3 the error channel with a `Status`, 4 terminal resize)
//! plus a CLOSE signal: the message `[255, n]` ends channel `n`, so a client can close
//! stdin and a `cat` sees end of file. kubectl ≥ 1.30 offers it first. containerd's
//! streaming server does not speak it, and its v4 WebSocket has no way to close stdin,
//! so a v5 session is translated here, as kube-apiserver's stream translator does: the
//! client's WebSocket ends here, and the runtime is spoken to over SPDY/3.1 with
//! `v4.channel.k8s.io`, one SPDY stream per channel, where a FIN closes stdin.

use super::proxy::{Activity, spawn_relay, upgrade_backend};
use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use futures::{SinkExt, StreamExt};
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use nodeagent_spdy::{Frame, FrameReader, FrameWriter};
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};

use super::params::{StreamOptions as Streams, V5};

const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const ERROR: u8 = 3;
const RESIZE: u8 = 4;
/// v5's CLOSE signal: `[255, channel]`.
const CLOSE: u8 = 255;
/// The largest WebSocket message or frame a client may send (kubectl sends stdin in
/// 32 KiB pieces).
const MAX_MESSAGE: usize = 1 << 20;

/// Answers a v5 WebSocket upgrade for the session at the runtime's `location`, with
/// `streams` exactly as asked of CRI (the runtime waits for one SPDY stream per stream
/// asked for, and a resize stream with a TTY): the
/// runtime's SPDY upgrade first (its refusal goes back to the client as it is), then
/// 101 to the client; the relay runs in its own task, holding `permit`.
pub async fn bridge(
    location: &str,
    mut request: Request,
    streams: Streams,
    permit: OwnedSemaphorePermit,
    idle_timeout: Duration,
) -> Response {
    let accept = match accept_key(request.method(), request.headers()) {
        Ok(a) => a,
        Err(why) => {
            return (
                StatusCode::BAD_REQUEST,
                [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                why,
            )
                .into_response();
        }
    };
    let client_upgrade = hyper::upgrade::on(&mut request);
    let mut spdy = HeaderMap::new();
    spdy.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    spdy.insert(header::UPGRADE, HeaderValue::from_static("SPDY/3.1"));
    spdy.insert(
        "x-stream-protocol-version",
        HeaderValue::from_static("v4.channel.k8s.io"),
    );
    let mut backend = match upgrade_backend(location, &spdy, Method::POST).await {
        Ok(r) => r,
        Err(refused) => return refused,
    };
    let backend_upgrade = hyper::upgrade::on(&mut backend);
    spawn_relay(
        client_upgrade,
        backend_upgrade,
        permit,
        move |client, backend| async move {
            let config = WebSocketConfig::default()
                .max_message_size(Some(MAX_MESSAGE))
                .max_frame_size(Some(MAX_MESSAGE));
            let ws = WebSocketStream::from_raw_socket(client, Role::Server, Some(config)).await;
            match relay(ws, backend, streams, idle_timeout).await {
                Ok(how) => tracing::debug!(how, "v5 stream finished"),
                Err(e) => tracing::info!(error = %e, "v5 stream failed"),
            }
        },
    );
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = response.headers_mut();
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(header::SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_static(V5));
    if let Ok(v) = HeaderValue::from_str(&accept) {
        h.insert(header::SEC_WEBSOCKET_ACCEPT, v);
    }
    response
}

/// The `Sec-WebSocket-Accept` for a valid RFC 6455 opening handshake.
fn accept_key(method: &Method, headers: &HeaderMap) -> Result<String, String> {
    if method != Method::GET {
        return Err(format!(
            "a WebSocket handshake is a GET request, not {method}"
        ));
    }
    let version = headers
        .get(header::SEC_WEBSOCKET_VERSION)
        .and_then(|v| v.to_str().ok());
    if version != Some("13") {
        return Err(format!(
            "unsupported Sec-WebSocket-Version {version:?}: only 13 (RFC 6455) is spoken"
        ));
    }
    let key = headers
        .get(header::SEC_WEBSOCKET_KEY)
        .map(HeaderValue::as_bytes)
        .filter(|k| !k.is_empty())
        .ok_or("the WebSocket handshake has no Sec-WebSocket-Key")?;
    Ok(derive_accept_key(key))
}

/// Opens the runtime's SPDY streams, then relays until either side ends or nothing
/// moves for `idle`. Says how it ended.
async fn relay<C, B>(
    ws: WebSocketStream<C>,
    backend: B,
    streams: Streams,
    idle: Duration,
) -> Result<&'static str, String>
where
    C: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    B: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (read, write) = tokio::io::split(backend);
    let mut writer = FrameWriter::new(write);
    let (mut sink, mut source) = ws.split();
    let opened = open_streams(&mut writer, streams).await;
    // The reader is not cancel-safe, so it runs in a task of its own; the channel's bound
    // holds the runtime back while the client is slow.
    let (tx, mut rx) = mpsc::channel(8);
    let reader = tokio::spawn(async move {
        let mut reader = FrameReader::new(read);
        loop {
            let next = reader.next().await.transpose();
            let end = !matches!(next, Some(Ok(_)));
            if let Some(item) = next
                && tx.send(item).await.is_err()
            {
                break;
            }
            if end {
                break;
            }
        }
    });
    let _reader = AbortOnDrop(reader);
    let activity = Activity::new();
    let outcome = async {
        let opened = opened.map_err(|e| format!("opening the runtime's streams: {e}"))?;
        let mut stdin_open = opened.stdin.is_some();
        loop {
            tokio::select! {
                frame = rx.recv() => {
                    activity.touch();
                    match frame {
                        None => return Ok("the runtime ended the session"),
                        Some(Err(e)) => return Err(format!("reading from the runtime: {e}")),
                        Some(Ok(Frame::Data { stream, data, .. })) => {
                            if let Some(&channel) = opened.channels.get(&stream)
                                && !data.is_empty()
                            {
                                let mut message = Vec::with_capacity(data.len() + 1);
                                message.push(channel);
                                message.extend_from_slice(&data);
                                sink.send(Message::Binary(message.into()))
                                    .await
                                    .map_err(|e| format!("writing to the client: {e}"))?;
                            }
                        }
                        Some(Ok(Frame::Ping { id })) => writer
                            .ping(id)
                            .await
                            .map_err(|e| format!("answering the runtime's ping: {e}"))?,
                        Some(Ok(Frame::GoAway { .. })) => return Ok("the runtime ended the session"),
                        Some(Ok(Frame::RstStream { stream, .. })) if Some(stream) == opened.stdin => {
                            stdin_open = false;
                        }
                        Some(Ok(_)) => {}
                    }
                }
                message = source.next() => {
                    activity.touch();
                    let data = match message {
                        None | Some(Ok(Message::Close(_))) => return Ok("the client closed the session"),
                        Some(Err(e)) => return Err(format!("reading from the client: {e}")),
                        // v5 is binary; upstream reads a text message's bytes the same way.
                        Some(Ok(Message::Binary(b))) => b.to_vec(),
                        Some(Ok(Message::Text(t))) => t.as_bytes().to_vec(),
                        Some(Ok(_)) => continue,
                    };
                    let Some((&channel, payload)) = data.split_first() else {
                        continue;
                    };
                    let write = match (channel, opened.stdin, opened.resize) {
                        (STDIN, Some(id), _) if stdin_open => writer.data(id, payload, false).await,
                        (RESIZE, _, Some(id)) => writer.data(id, payload, false).await,
                        (CLOSE, Some(id), _) if payload == [STDIN] && stdin_open => {
                            stdin_open = false;
                            writer.data(id, &[], true).await
                        }
                        // Upstream ignores data for channels that are not open for reading.
                        _ => Ok(()),
                    };
                    write.map_err(|e| format!("writing to the runtime: {e}"))?;
                }
                _ = activity.idle(idle) => {
                    tracing::info!(?idle, "stream closed after streamingConnectionIdleTimeout without traffic");
                    return Ok("idle");
                }
            }
        }
    }
    .await;
    // Close both sides, whichever way it ended: a close frame to the client, GOAWAY to
    // the runtime.
    let close = CloseFrame {
        code: if outcome.is_ok() {
            CloseCode::Normal
        } else {
            CloseCode::Error
        },
        reason: "".into(),
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = sink.send(Message::Close(Some(close))).await;
        let _ = sink.close().await;
    })
    .await;
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = writer.goaway().await;
        let _ = writer.shutdown().await;
    })
    .await;
    outcome
}

/// The runtime's streams of one session, by SPDY stream id.
struct Opened {
    /// SPDY stream → the client's channel, for what the runtime sends.
    channels: BTreeMap<u32, u8>,
    stdin: Option<u32>,
    resize: Option<u32>,
}

/// Opens the streams the runtime waits for, in the order upstream's client opens them:
/// error, stdin, stdout, stderr, resize.
async fn open_streams<W: AsyncWrite + Unpin>(
    writer: &mut FrameWriter<W>,
    streams: Streams,
) -> std::io::Result<Opened> {
    let mut opened = Opened {
        channels: BTreeMap::new(),
        stdin: None,
        resize: None,
    };
    let error = writer.syn_stream(&[("streamtype", "error")]).await?;
    opened.channels.insert(error, ERROR);
    if streams.stdin {
        opened.stdin = Some(writer.syn_stream(&[("streamtype", "stdin")]).await?);
    }
    for (wanted, name, channel) in [
        (streams.stdout, "stdout", STDOUT),
        (streams.stderr, "stderr", STDERR),
    ] {
        if wanted {
            let id = writer.syn_stream(&[("streamtype", name)]).await?;
            opened.channels.insert(id, channel);
        }
    }
    if streams.tty {
        opened.resize = Some(writer.syn_stream(&[("streamtype", "resize")]).await?);
    }
    Ok(opened)
}

/// Aborts the task when the session ends.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodeagent_spdy::{FrameReader, FrameWriter};
    use tokio::io::AsyncWriteExt;

    #[test]
    fn the_handshake_is_checked() {
        let mut h = HeaderMap::new();
        assert!(
            accept_key(&Method::GET, &h)
                .unwrap_err()
                .contains("Version")
        );
        h.insert(
            header::SEC_WEBSOCKET_VERSION,
            HeaderValue::from_static("13"),
        );
        assert!(accept_key(&Method::GET, &h).unwrap_err().contains("Key"));
        // RFC 6455's example.
        h.insert(
            header::SEC_WEBSOCKET_KEY,
            HeaderValue::from_static("dGhlIHNhbXBsZSBub25jZQ=="),
        );
        assert_eq!(
            accept_key(&Method::GET, &h).unwrap(),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
        assert!(accept_key(&Method::POST, &h).unwrap_err().contains("GET"));
    }

    /// The relay against an in-memory client and a scripted runtime: the runtime sees
    /// the streams it waits for, stdin data and its FIN from the CLOSE signal, a resize;
    /// the client sees stdout, stderr and the status on their channels, then a close.
    #[tokio::test]
    async fn relays_channels_and_the_close_signal() {
        let (client_io, client_peer) = tokio::io::duplex(1 << 16);
        let (backend_io, backend_peer) = tokio::io::duplex(1 << 16);
        let streams = Streams {
            stdin: true,
            stdout: true,
            stderr: true,
            tty: true,
        };
        let server = tokio::spawn(async move {
            let ws = WebSocketStream::from_raw_socket(client_io, Role::Server, None).await;
            relay(ws, backend_io, streams, Duration::from_secs(60)).await
        });
        let mut client = WebSocketStream::from_raw_socket(client_peer, Role::Client, None).await;
        let (runtime_read, runtime_write) = tokio::io::split(backend_peer);
        let mut runtime = FrameReader::new(runtime_read);
        // The scripted runtime answers with its own framing: data frames only.
        let mut runtime_out = runtime_write;
        for _ in 0..5 {
            let frame = runtime.next().await.unwrap().unwrap();
            assert_eq!(frame, Frame::Other { kind: 1 }, "five SYN_STREAMs");
        }
        client
            .send(Message::Binary(vec![STDIN, b'h', b'i'].into()))
            .await
            .unwrap();
        client
            .send(Message::Binary(
                [&[RESIZE][..], br#"{"Width":80,"Height":24}"#]
                    .concat()
                    .into(),
            ))
            .await
            .unwrap();
        client
            .send(Message::Binary(vec![CLOSE, STDIN].into()))
            .await
            .unwrap();
        // stdin is stream 3, resize stream 9 (error 1, stdout 5, stderr 7).
        assert_eq!(
            runtime.next().await.unwrap().unwrap(),
            Frame::Data {
                stream: 3,
                fin: false,
                data: b"hi".to_vec()
            }
        );
        assert_eq!(
            runtime.next().await.unwrap().unwrap(),
            Frame::Data {
                stream: 9,
                fin: false,
                data: br#"{"Width":80,"Height":24}"#.to_vec()
            }
        );
        assert_eq!(
            runtime.next().await.unwrap().unwrap(),
            Frame::Data {
                stream: 3,
                fin: true,
                data: vec![]
            }
        );
        let mut frames = FrameWriter::new(Vec::new());
        frames.data(5, b"out", false).await.unwrap();
        frames.data(7, b"err", false).await.unwrap();
        frames
            .data(1, br#"{"status":"Success"}"#, true)
            .await
            .unwrap();
        runtime_out.write_all(&frames.into_inner()).await.unwrap();
        runtime_out.shutdown().await.unwrap();
        let mut got = Vec::new();
        while let Some(Ok(message)) = client.next().await {
            match message {
                Message::Binary(b) => got.push(b.to_vec()),
                Message::Close(frame) => {
                    assert_eq!(frame.unwrap().code, CloseCode::Normal);
                    break;
                }
                _ => {}
            }
        }
        assert_eq!(
            got,
            [
                [&[STDOUT][..], b"out"].concat(),
                [&[STDERR][..], b"err"].concat(),
                [&[ERROR][..], br#"{"status":"Success"}"#].concat(),
            ]
        );
        assert_eq!(server.await.unwrap(), Ok("the runtime ended the session"));
    }
}
