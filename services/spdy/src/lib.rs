//! SPDY/3.1 framing (draft-mbelshe-httpbis-spdy-00 as amended by SPDY/3.1), the client
//! side only, as far as Kubernetes' streaming protocols use it: after an HTTP upgrade to
//! `SPDY/3.1` the client opens one stream per standard stream (`streamtype` header:
//! error, stdin, stdout, stderr, resize; for port-forward data and error per port), sends
//! data frames, and closes its side of a stream with FIN. kubectl, the API server and the
//! kubelet speak it this way through `moby/spdystream`, which does no flow control.
//!
//! Header blocks are zlib streams with SPDY/3's preset dictionary. This writer emits them
//! as stored (uncompressed) deflate blocks ended by a sync flush, so it needs only the
//! dictionary's Adler-32 in the zlib header, not the 1423-byte dictionary. The headers
//! of the peer's replies carry nothing a client of these protocols needs, so the reader
//! hands back their raw blocks undecoded.

use std::io;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The Adler-32 of SPDY/3's header dictionary, which a zlib header with FDICT names.
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

const VERSION: u16 = 3;
const SYN_STREAM: u16 = 1;
const SYN_REPLY: u16 = 2;
const RST_STREAM: u16 = 3;
const PING: u16 = 6;
const GOAWAY: u16 = 7;
const HEADERS: u16 = 8;
const FLAG_FIN: u8 = 0x01;
/// A frame's length field has 24 bits.
const MAX_PAYLOAD: usize = 0x00ff_ffff;
/// One stored deflate block holds at most this many bytes.
const MAX_STORED_BLOCK: usize = u16::MAX as usize;

/// A frame as the reader hands it out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Data on `stream`; `fin` ends the peer's side of it.
    Data {
        stream: u32,
        fin: bool,
        data: Vec<u8>,
    },
    /// The peer accepted a stream; `header_block` is its raw (compressed) header block.
    SynReply {
        stream: u32,
        fin: bool,
        header_block: Vec<u8>,
    },
    /// More headers on `stream`, raw.
    Headers {
        stream: u32,
        fin: bool,
        header_block: Vec<u8>,
    },
    /// The peer reset `stream` with `status`.
    RstStream { stream: u32, status: u32 },
    /// A ping to answer with the same id (or the answer to ours).
    Ping { id: u32 },
    /// The peer ends the session.
    GoAway { last_stream: u32, status: u32 },
    /// A control frame of another type (SETTINGS, WINDOW_UPDATE, a SYN_STREAM the
    /// client does not accept, …), skipped.
    Other { kind: u16 },
}

/// Reads frames from the peer.
pub struct FrameReader<R> {
    io: R,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub fn new(io: R) -> Self {
        FrameReader { io }
    }

    /// The next frame; `None` when the peer closed the connection between frames.
    /// Not cancel-safe: run it in a task of its own when selecting over other events.
    pub async fn next(&mut self) -> io::Result<Option<Frame>> {
        let mut head = [0u8; 8];
        match self.io.read_exact(&mut head).await {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e),
        }
        let flags = head[4];
        let len = u32::from_be_bytes([0, head[5], head[6], head[7]]) as usize;
        let mut payload = vec![0u8; len];
        self.io.read_exact(&mut payload).await?;
        let fin = flags & FLAG_FIN != 0;
        if head[0] & 0x80 == 0 {
            let stream = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) & 0x7fff_ffff;
            return Ok(Some(Frame::Data {
                stream,
                fin,
                data: payload,
            }));
        }
        let version = u16::from_be_bytes([head[0] & 0x7f, head[1]]);
        if version != VERSION {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("SPDY version {version} where 3 was expected"),
            ));
        }
        let kind = u16::from_be_bytes([head[2], head[3]]);
        let word = |at: usize| -> io::Result<u32> {
            payload
                .get(at..at + 4)
                .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
                .ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("SPDY control frame {kind} of {len} bytes is too short"),
                    )
                })
        };
        Ok(Some(match kind {
            SYN_REPLY | HEADERS => {
                let stream = word(0)? & 0x7fff_ffff;
                let header_block = payload[4..].to_vec();
                if kind == SYN_REPLY {
                    Frame::SynReply {
                        stream,
                        fin,
                        header_block,
                    }
                } else {
                    Frame::Headers {
                        stream,
                        fin,
                        header_block,
                    }
                }
            }
            RST_STREAM => Frame::RstStream {
                stream: word(0)? & 0x7fff_ffff,
                status: word(4)?,
            },
            PING => Frame::Ping { id: word(0)? },
            GOAWAY => Frame::GoAway {
                last_stream: word(0)? & 0x7fff_ffff,
                status: word(4).unwrap_or(0),
            },
            kind => Frame::Other { kind },
        }))
    }

    pub fn into_inner(self) -> R {
        self.io
    }
}

/// Writes frames to the peer as the client of the session (odd stream ids).
pub struct FrameWriter<W> {
    io: W,
    next_id: u32,
    header_started: bool,
}

impl<W: AsyncWrite + Unpin> FrameWriter<W> {
    pub fn new(io: W) -> Self {
        FrameWriter {
            io,
            next_id: 1,
            header_started: false,
        }
    }

    /// Opens a stream with `headers` (names lower-case, as SPDY/3 requires) and returns
    /// its id.
    pub async fn syn_stream(&mut self, headers: &[(&str, &str)]) -> io::Result<u32> {
        let id = self.next_id;
        self.next_id += 2;
        let mut payload = Vec::new();
        payload.extend_from_slice(&id.to_be_bytes());
        payload.extend_from_slice(&0u32.to_be_bytes()); // associated stream
        payload.extend_from_slice(&[0, 0]); // priority, slot
        let block = self.header_block(headers)?;
        payload.extend_from_slice(&block);
        self.control(SYN_STREAM, 0, &payload).await?;
        Ok(id)
    }

    /// The name/value block of `headers`, as the continuation of this session's zlib
    /// stream: stored blocks, then an empty one (a sync flush, after which the peer's
    /// inflater hands out everything without reading past the frame).
    fn header_block(&mut self, headers: &[(&str, &str)]) -> io::Result<Vec<u8>> {
        let mut block = Vec::new();
        block.extend_from_slice(&(headers.len() as u32).to_be_bytes());
        for (name, value) in headers {
            for s in [name, value] {
                block.extend_from_slice(&(s.len() as u32).to_be_bytes());
                block.extend_from_slice(s.as_bytes());
            }
        }
        let mut out = Vec::with_capacity(block.len() + 16);
        if !self.header_started {
            out.extend_from_slice(&ZLIB_HEADER);
            self.header_started = true;
        }
        for chunk in block.chunks(MAX_STORED_BLOCK) {
            let len = chunk.len() as u16;
            out.push(0); // BFINAL 0, BTYPE 00 (stored)
            out.extend_from_slice(&len.to_le_bytes());
            out.extend_from_slice(&(!len).to_le_bytes());
            out.extend_from_slice(chunk);
        }
        out.extend_from_slice(&[0x00, 0x00, 0x00, 0xff, 0xff]);
        if out.len() > MAX_PAYLOAD {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "SPDY header block too large",
            ));
        }
        Ok(out)
    }

    /// Sends `data` on stream `id`, with FIN on the last frame when `fin`.
    pub async fn data(&mut self, id: u32, data: &[u8], fin: bool) -> io::Result<()> {
        let mut chunks = data.chunks(MAX_PAYLOAD).peekable();
        if chunks.peek().is_none() {
            return self.data_frame(id, &[], fin).await;
        }
        while let Some(chunk) = chunks.next() {
            let last = chunks.peek().is_none();
            self.data_frame(id, chunk, fin && last).await?;
        }
        Ok(())
    }

    async fn data_frame(&mut self, id: u32, data: &[u8], fin: bool) -> io::Result<()> {
        let mut frame = Vec::with_capacity(8 + data.len());
        frame.extend_from_slice(&(id & 0x7fff_ffff).to_be_bytes());
        frame.push(if fin { FLAG_FIN } else { 0 });
        frame.extend_from_slice(&(data.len() as u32).to_be_bytes()[1..]);
        frame.extend_from_slice(data);
        self.write(&frame).await
    }

    /// Answers the peer's ping `id`.
    pub async fn ping(&mut self, id: u32) -> io::Result<()> {
        self.control(PING, 0, &id.to_be_bytes()).await
    }

    /// Ends the session (status 0, OK).
    pub async fn goaway(&mut self) -> io::Result<()> {
        let last = self.next_id.saturating_sub(2);
        let mut payload = last.to_be_bytes().to_vec();
        payload.extend_from_slice(&0u32.to_be_bytes());
        self.control(GOAWAY, 0, &payload).await
    }

    async fn control(&mut self, kind: u16, flags: u8, payload: &[u8]) -> io::Result<()> {
        let mut frame = Vec::with_capacity(8 + payload.len());
        frame.extend_from_slice(&(0x8000 | VERSION).to_be_bytes());
        frame.extend_from_slice(&kind.to_be_bytes());
        frame.push(flags);
        frame.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
        frame.extend_from_slice(payload);
        self.write(&frame).await
    }

    async fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.io.write_all(bytes).await?;
        self.io.flush().await
    }

    /// Closes the connection's sending side.
    pub async fn shutdown(&mut self) -> io::Result<()> {
        self.io.shutdown().await
    }

    pub fn into_inner(self) -> W {
        self.io
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Inflates a header block written by [`FrameWriter`] (stored blocks only) back to
    /// its name/value pairs.
    fn stored_blocks(mut b: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        while !b.is_empty() {
            assert_eq!(b[0], 0, "a stored, non-final block");
            let len = u16::from_le_bytes([b[1], b[2]]) as usize;
            let nlen = u16::from_le_bytes([b[3], b[4]]);
            assert_eq!(!(len as u16), nlen);
            out.extend_from_slice(&b[5..5 + len]);
            b = &b[5 + len..];
        }
        out
    }

    fn pairs(block: &[u8]) -> Vec<(String, String)> {
        let n = u32::from_be_bytes(block[..4].try_into().unwrap()) as usize;
        let mut at = 4;
        let mut take = || {
            let len = u32::from_be_bytes(block[at..at + 4].try_into().unwrap()) as usize;
            let s = String::from_utf8(block[at + 4..at + 4 + len].to_vec()).unwrap();
            at += 4 + len;
            s
        };
        (0..n).map(|_| (take(), take())).collect()
    }

    #[tokio::test]
    async fn syn_streams_carry_one_zlib_stream_and_odd_ids() {
        let mut w = FrameWriter::new(Vec::new());
        assert_eq!(w.syn_stream(&[("streamtype", "error")]).await.unwrap(), 1);
        let first = w.io.len();
        assert_eq!(
            w.syn_stream(&[("streamtype", "stdin"), ("x", "y")])
                .await
                .unwrap(),
            3
        );
        let bytes = w.into_inner();
        let (one, two) = bytes.split_at(first);
        // Control bit, version 3, SYN_STREAM, no flags, length.
        assert_eq!(&one[..5], &[0x80, 0x03, 0x00, 0x01, 0x00]);
        assert_eq!(
            u32::from_be_bytes([0, one[5], one[6], one[7]]) as usize,
            one.len() - 8
        );
        // Only the first block opens the zlib stream, naming the dictionary.
        assert_eq!(&one[18..24], &ZLIB_HEADER);
        let block = stored_blocks(&one[24..]);
        assert_eq!(pairs(&block), [("streamtype".into(), "error".into())]);
        assert_eq!(u32::from_be_bytes(two[8..12].try_into().unwrap()), 3);
        let block = stored_blocks(&two[18..]);
        assert_eq!(
            pairs(&block),
            [
                ("streamtype".to_string(), "stdin".to_string()),
                ("x".into(), "y".into())
            ]
        );
    }

    #[tokio::test]
    async fn frames_round_trip_through_the_reader() {
        let mut w = FrameWriter::new(Vec::new());
        w.data(5, b"hello", false).await.unwrap();
        w.data(5, b"", true).await.unwrap();
        w.ping(7).await.unwrap();
        w.goaway().await.unwrap();
        // A SYN_REPLY, RST_STREAM and WINDOW_UPDATE as a server writes them.
        let mut bytes = w.into_inner();
        bytes.extend_from_slice(&[0x80, 3, 0, 2, 0, 0, 0, 6, 0, 0, 0, 1, 0xaa, 0xbb]);
        bytes.extend_from_slice(&[0x80, 3, 0, 3, 0, 0, 0, 8, 0, 0, 0, 3, 0, 0, 0, 5]);
        bytes.extend_from_slice(&[0x80, 3, 0, 9, 0, 0, 0, 8, 0, 0, 0, 1, 0, 0, 1, 0]);
        let mut r = FrameReader::new(&bytes[..]);
        let mut got = Vec::new();
        while let Some(f) = r.next().await.unwrap() {
            got.push(f);
        }
        assert_eq!(
            got,
            [
                Frame::Data {
                    stream: 5,
                    fin: false,
                    data: b"hello".to_vec()
                },
                Frame::Data {
                    stream: 5,
                    fin: true,
                    data: vec![]
                },
                Frame::Ping { id: 7 },
                Frame::GoAway {
                    last_stream: 0,
                    status: 0
                },
                Frame::SynReply {
                    stream: 1,
                    fin: false,
                    header_block: vec![0xaa, 0xbb]
                },
                Frame::RstStream {
                    stream: 3,
                    status: 5
                },
                Frame::Other { kind: 9 },
            ]
        );
    }

    #[tokio::test]
    async fn a_truncated_or_foreign_frame_is_an_error() {
        // A frame head promising more than follows.
        let bytes = [0u8, 0, 0, 1, 0, 0, 0, 9, b'x'];
        assert!(FrameReader::new(&bytes[..]).next().await.is_err());
        // SPDY/2.
        let bytes = [0x80, 2, 0, 6, 0, 0, 0, 4, 0, 0, 0, 1];
        assert!(FrameReader::new(&bytes[..]).next().await.is_err());
        // A PING too short to hold its id.
        let bytes = [0x80, 3, 0, 6, 0, 0, 0, 2, 0, 1];
        assert!(FrameReader::new(&bytes[..]).next().await.is_err());
    }
}
