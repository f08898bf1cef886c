//! A minimal SPDY/3.1 client for the remote-command protocol (`v4.channel.k8s.io` over
//! SPDY, what kubectl and the API server speak to a kubelet): an HTTP upgrade, then one
//! SPDY stream per standard stream (`streamtype` header: error, stdin, stdout, stderr,
//! resize), data frames, and FIN to close stdin.
//!
//! The framing is the shared `nodeagent-spdy` crate's, the same the kubelet API uses
//! towards the runtime.

use crate::kubelet_client::KubeletClient;
use http_body_util::{BodyExt, Empty};
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use nodeagent_spdy::{Frame, FrameReader, FrameWriter};
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::io::{ReadHalf, WriteHalf};

pub use nodeagent_spdy::DICTIONARY_ID;

/// What an SPDY session received until the server closed the connection.
#[derive(Debug, Default)]
pub struct SpdyReceived {
    /// Data per stream type (`stdout`, `stderr`, `error`).
    pub data: BTreeMap<String, Vec<u8>>,
    /// Streams the server closed (FIN), by type.
    pub finished: std::collections::BTreeSet<String>,
    /// The zlib header the server's first header block started with.
    pub server_zlib_header: Option<[u8; 6]>,
}

impl SpdyReceived {
    pub fn text(&self, stream: &str) -> String {
        self.data
            .get(stream)
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .unwrap_or_default()
    }
}

pub struct SpdyClient {
    reader: FrameReader<ReadHalf<TokioIo<Upgraded>>>,
    writer: FrameWriter<WriteHalf<TokioIo<Upgraded>>>,
    /// Stream id → stream type.
    streams: BTreeMap<u32, String>,
    /// The protocol the server chose (`X-Stream-Protocol-Version`).
    pub protocol: Option<String>,
}

impl SpdyClient {
    /// Upgrades `path` to SPDY/3.1 offering `protocols`; a refusal is `Err` with the
    /// status and body.
    pub async fn connect(
        api: &KubeletClient,
        path: &str,
        protocols: &[&str],
    ) -> Result<SpdyClient, String> {
        let stream = api.connect().await?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("HTTP handshake: {e}"))?;
        tokio::spawn(conn.with_upgrades());
        let mut request = hyper::Request::builder()
            .method("POST")
            .uri(path)
            .header("host", format!("localhost:{}", api.port))
            .header("connection", "Upgrade")
            .header("upgrade", "SPDY/3.1");
        for p in protocols {
            request = request.header("x-stream-protocol-version", *p);
        }
        let request = request
            .body(Empty::<bytes::Bytes>::new())
            .map_err(|e| e.to_string())?;
        let mut response = sender
            .send_request(request)
            .await
            .map_err(|e| format!("POST {path}: {e}"))?;
        if response.status() != hyper::StatusCode::SWITCHING_PROTOCOLS {
            let status = response.status();
            let body = response
                .into_body()
                .collect()
                .await
                .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
                .unwrap_or_default();
            return Err(format!("upgrade refused: {status}: {body}"));
        }
        let protocol = response
            .headers()
            .get("x-stream-protocol-version")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let upgraded = hyper::upgrade::on(&mut response)
            .await
            .map_err(|e| format!("upgrade: {e}"))?;
        let (read, write) = tokio::io::split(TokioIo::new(upgraded));
        Ok(SpdyClient {
            reader: FrameReader::new(read),
            writer: FrameWriter::new(write),
            streams: BTreeMap::new(),
            protocol,
        })
    }

    /// Opens a stream of `stream_type`; returns its id.
    pub async fn open_stream(&mut self, stream_type: &str) -> Result<u32, String> {
        self.open_stream_with(stream_type, &[]).await
    }

    /// Opens a stream of `stream_type` with more headers (lower-case names), e.g. a
    /// port-forward's `port` and `requestid`.
    pub async fn open_stream_with(
        &mut self,
        stream_type: &str,
        headers: &[(&str, &str)],
    ) -> Result<u32, String> {
        let pairs: Vec<(&str, &str)> = [("streamtype", stream_type)]
            .into_iter()
            .chain(headers.iter().copied())
            .collect();
        let id = self
            .writer
            .syn_stream(&pairs)
            .await
            .map_err(|e| format!("opening a {stream_type} stream: {e}"))?;
        self.streams.insert(id, stream_type.to_string());
        Ok(id)
    }

    /// Sends `data` on stream `id`, with FIN when `fin`.
    pub async fn data(&mut self, id: u32, data: &[u8], fin: bool) -> Result<(), String> {
        self.writer
            .data(id, data, fin)
            .await
            .map_err(|e| format!("writing: {e}"))
    }

    /// Reads frames until the server closes the connection or says GOAWAY, within
    /// `deadline`; answers pings.
    pub async fn read_to_close(&mut self, deadline: Duration) -> Result<SpdyReceived, String> {
        self.read_until(deadline, |_| false).await
    }

    /// Reads frames until `until` holds for what arrived, or the server closes the
    /// connection or says GOAWAY, within `deadline`; answers pings.
    pub async fn read_until(
        &mut self,
        deadline: Duration,
        until: impl Fn(&SpdyReceived) -> bool,
    ) -> Result<SpdyReceived, String> {
        let mut got = SpdyReceived::default();
        let end = tokio::time::Instant::now() + deadline;
        while !until(&got) {
            let frame = match tokio::time::timeout_at(end, self.reader.next()).await {
                Err(_) => return Err(format!("no end within {deadline:?}; received {got:?}")),
                Ok(Ok(None)) => return Ok(got),
                Ok(Err(e)) => return Err(format!("reading: {e}; received {got:?}")),
                Ok(Ok(Some(frame))) => frame,
            };
            match frame {
                Frame::Data { stream, fin, data } => {
                    let kind = self
                        .streams
                        .get(&stream)
                        .cloned()
                        .unwrap_or(format!("#{stream}"));
                    got.data
                        .entry(kind.clone())
                        .or_default()
                        .extend_from_slice(&data);
                    if fin {
                        got.finished.insert(kind);
                    }
                }
                // The first header block opens the server's zlib stream.
                Frame::SynReply { header_block, .. } | Frame::Headers { header_block, .. }
                    if got.server_zlib_header.is_none() && header_block.len() >= 6 =>
                {
                    let mut z = [0u8; 6];
                    z.copy_from_slice(&header_block[..6]);
                    got.server_zlib_header = Some(z);
                }
                Frame::Ping { id } => self
                    .writer
                    .ping(id)
                    .await
                    .map_err(|e| format!("answering a ping: {e}"))?,
                Frame::GoAway { .. } => return Ok(got),
                _ => {}
            }
        }
        Ok(got)
    }
}
