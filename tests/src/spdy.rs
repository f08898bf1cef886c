//! A minimal SPDY/3.1 client for the remote-command protocol (`v4.channel.k8s.io` over
//! SPDY, what kubectl and the API server speak to a kubelet): an HTTP upgrade, then one
//! SPDY stream per standard stream (`streamtype` header: error, stdin, stdout, stderr,
//! resize), data frames, and FIN to close stdin.
//!
//! Header blocks are zlib streams with SPDY/3's preset dictionary. This client writes them
//! as stored (uncompressed) deflate blocks, so it needs only the dictionary's Adler-32 in
//! the zlib header, not the dictionary; the server's compressed replies carry no data this
//! client needs and are skipped by length.

use crate::kubelet_client::KubeletClient;
use http_body_util::{BodyExt, Empty};
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The Adler-32 of SPDY/3's 1423-byte header dictionary (draft-mbelshe-httpbis-spdy-00,
/// 2.6.10.1), which a zlib header with FDICT names.
pub const DICTIONARY_ID: [u8; 4] = [0xe3, 0xc6, 0xa7, 0xc2];
/// zlib header with FDICT (as Chrome writes it), then the dictionary id.
const ZLIB_HEADER: [u8; 6] = [
    0x78,
    0xbb,
    DICTIONARY_ID[0],
    DICTIONARY_ID[1],
    DICTIONARY_ID[2],
    DICTIONARY_ID[3],
];

const SYN_STREAM: u16 = 1;
const PING: u16 = 6;
const GOAWAY: u16 = 7;
const FLAG_FIN: u8 = 0x01;

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
    io: TokioIo<Upgraded>,
    next_id: u32,
    header_started: bool,
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
        Ok(SpdyClient {
            io: TokioIo::new(upgraded),
            next_id: 1,
            header_started: false,
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
        let id = self.next_id;
        self.next_id += 2;
        let mut block = Vec::new();
        block.extend_from_slice(&(headers.len() as u32 + 1).to_be_bytes());
        let pairs = [("streamtype", stream_type)]
            .into_iter()
            .chain(headers.iter().copied());
        for (name, value) in pairs {
            for s in [name, value] {
                block.extend_from_slice(&(s.len() as u32).to_be_bytes());
                block.extend_from_slice(s.as_bytes());
            }
        }
        let mut payload = Vec::new();
        payload.extend_from_slice(&id.to_be_bytes());
        payload.extend_from_slice(&0u32.to_be_bytes()); // associated stream
        payload.extend_from_slice(&[0, 0]); // priority, slot
        if !self.header_started {
            payload.extend_from_slice(&ZLIB_HEADER);
            self.header_started = true;
        }
        // One stored, non-final deflate block (BFINAL 0, BTYPE 00, LEN, NLEN, bytes),
        // then an empty one: a sync flush, after which an inflater hands out everything
        // without reading past the frame.
        let len = block.len() as u16;
        payload.push(0);
        payload.extend_from_slice(&len.to_le_bytes());
        payload.extend_from_slice(&(!len).to_le_bytes());
        payload.extend_from_slice(&block);
        payload.extend_from_slice(&[0x00, 0x00, 0x00, 0xff, 0xff]);
        self.control(SYN_STREAM, 0, &payload).await?;
        self.streams.insert(id, stream_type.to_string());
        Ok(id)
    }

    async fn control(&mut self, kind: u16, flags: u8, payload: &[u8]) -> Result<(), String> {
        let mut frame = vec![0x80, 0x03];
        frame.extend_from_slice(&kind.to_be_bytes());
        frame.push(flags);
        frame.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
        frame.extend_from_slice(payload);
        self.write(&frame).await
    }

    /// Sends `data` on stream `id`, with FIN when `fin`.
    pub async fn data(&mut self, id: u32, data: &[u8], fin: bool) -> Result<(), String> {
        let mut frame = id.to_be_bytes().to_vec();
        frame.push(if fin { FLAG_FIN } else { 0 });
        frame.extend_from_slice(&(data.len() as u32).to_be_bytes()[1..]);
        frame.extend_from_slice(data);
        self.write(&frame).await
    }

    async fn write(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.io
            .write_all(bytes)
            .await
            .map_err(|e| format!("writing: {e}"))?;
        self.io.flush().await.map_err(|e| format!("flushing: {e}"))
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
            let mut head = [0u8; 8];
            match tokio::time::timeout_at(end, self.io.read_exact(&mut head)).await {
                Err(_) => return Err(format!("no end within {deadline:?}; received {got:?}")),
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(got),
                Ok(Err(e)) => return Err(format!("reading: {e}; received {got:?}")),
                Ok(Ok(_)) => {}
            }
            let len = u32::from_be_bytes([0, head[5], head[6], head[7]]) as usize;
            let mut payload = vec![0u8; len];
            tokio::time::timeout_at(end, self.io.read_exact(&mut payload))
                .await
                .map_err(|_| "timed out inside a frame".to_string())?
                .map_err(|e| format!("reading a frame: {e}"))?;
            if head[0] & 0x80 == 0 {
                let id = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
                let kind = self.streams.get(&id).cloned().unwrap_or(format!("#{id}"));
                got.data
                    .entry(kind)
                    .or_default()
                    .extend_from_slice(&payload);
                continue;
            }
            match u16::from_be_bytes([head[2], head[3]]) {
                // SYN_REPLY and HEADERS: the first one opens the server's zlib stream.
                2 | 8 if got.server_zlib_header.is_none() && payload.len() >= 10 => {
                    let mut z = [0u8; 6];
                    z.copy_from_slice(&payload[4..10]);
                    got.server_zlib_header = Some(z);
                }
                PING => self.control(PING, 0, &payload).await?,
                GOAWAY => return Ok(got),
                _ => {}
            }
        }
        Ok(got)
    }
}
