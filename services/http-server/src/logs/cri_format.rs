//! The CRI log format (`<RFC3339Nano> <stdout|stderr> <P|F>[:<more tags>] <content>`, one
//! record per line, a long or unterminated line split into `P` records ended by an `F`
//! one) and what a `/containerLogs` reader makes of it: upstream's `parseCRILog`,
//! `logWriter` and `tail.FindTailLineStartIndex`, except that a line split into partial
//! records counts as one line for `tailLines` and gets one timestamp (upstream prefixes
//! every partial record).

use super::options::{LogOptions, LogStream};
use k8s_openapi::jiff::Timestamp;
use std::io;

/// Which output stream a record came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// Whether a `stream` query asks for a record of stream `s` (beside the record's format,
/// so that the query's options need nothing of it).
impl LogStream {
    pub fn includes(self, s: Stream) -> bool {
        match self {
            LogStream::All => true,
            LogStream::Stdout => s == Stream::Stdout,
            LogStream::Stderr => s == Stream::Stderr,
        }
    }
}

/// One parsed record.
#[derive(Debug, PartialEq, Eq)]
pub struct Record<'a> {
    pub timestamp: Timestamp,
    pub stream: Stream,
    /// An `F` record ends its line; a `P` record continues on the next record.
    pub full: bool,
    /// The content, without the record's newline.
    pub content: &'a [u8],
}

/// Parses one record (`line` without or with its trailing newline).
pub fn parse(line: &[u8]) -> Result<Record<'_>, String> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let (timestamp, rest) = split_space(line).ok_or("timestamp is not found")?;
    let timestamp = std::str::from_utf8(timestamp)
        .ok()
        .and_then(|t| t.parse::<Timestamp>().ok())
        .ok_or_else(|| {
            format!(
                "unexpected timestamp {:?}",
                String::from_utf8_lossy(timestamp)
            )
        })?;
    let (stream, rest) = split_space(rest).ok_or("stream type is not found")?;
    let stream = match stream {
        b"stdout" => Stream::Stdout,
        b"stderr" => Stream::Stderr,
        other => {
            return Err(format!(
                "unexpected stream type {:?}",
                String::from_utf8_lossy(other)
            ));
        }
    };
    let (tags, content) = split_space(rest).ok_or("log tag is not found")?;
    // Tags are `:`-separated and only the first is defined; keep later ones compatible.
    let full = tags.split(|b| *b == b':').next() != Some(b"P");
    Ok(Record {
        timestamp,
        stream,
        full,
        content,
    })
}

fn split_space(s: &[u8]) -> Option<(&[u8], &[u8])> {
    let i = s.iter().position(|b| *b == b' ')?;
    Some((&s[..i], &s[i + 1..]))
}

/// Whether a record (from its first bytes) ends a line: true for `F` and for records that
/// cannot be parsed (which count as lines of their own for `tailLines`, as upstream).
fn ends_line(head: &[u8]) -> bool {
    let mut fields = head.splitn(4, |b| *b == b' ');
    let tag = fields.nth(2).unwrap_or_default();
    tag.split(|b| *b == b':').next() != Some(b"P")
}

/// `2006-01-02T15:04:05.000000000Z07:00` (upstream's RFC3339NanoFixed), in UTC.
pub fn format_timestamp(t: Timestamp) -> String {
    format!(
        "{}.{:09}Z",
        t.strftime("%Y-%m-%dT%H:%M:%S"),
        t.subsec_nanosecond()
    )
}

/// What the writer tells the reader after a record.
#[derive(Debug, PartialEq, Eq)]
pub enum Flow {
    More,
    /// `limitBytes` is reached: nothing more is to be written.
    LimitReached,
}

/// Turns records into the response body according to the options: the `since` filter,
/// the stream filter, timestamps, and the byte limit.
pub struct LogWriter {
    since: Option<Timestamp>,
    timestamps: bool,
    stream: LogStream,
    remaining: Option<u64>,
    /// Per stream: whether the next record starts a line, and whether the line being
    /// continued is being skipped.
    line_start: [bool; 2],
    skipping: [bool; 2],
}

impl LogWriter {
    pub fn new(opts: &LogOptions, now: Timestamp) -> Self {
        Self {
            since: opts.since(now),
            timestamps: opts.timestamps,
            stream: opts.stream,
            remaining: opts.limit_bytes,
            line_start: [true; 2],
            skipping: [false; 2],
        }
    }

    /// Appends what `record` contributes to the body to `out`.
    pub fn write(&mut self, record: &Record<'_>, out: &mut Vec<u8>) -> Flow {
        let s = record.stream as usize;
        if self.line_start[s] {
            self.skipping[s] = self.since.is_some_and(|since| record.timestamp < since)
                || !self.stream.includes(record.stream);
        }
        let starts_line = self.line_start[s];
        self.line_start[s] = record.full;
        if self.skipping[s] {
            return Flow::More;
        }
        let before = out.len();
        if self.timestamps && starts_line {
            out.extend_from_slice(format_timestamp(record.timestamp).as_bytes());
            out.push(b' ');
        }
        out.extend_from_slice(record.content);
        if record.full {
            out.push(b'\n');
        }
        let Some(remaining) = self.remaining.as_mut() else {
            return Flow::More;
        };
        let written = (out.len() - before) as u64;
        if written >= *remaining {
            out.truncate(before + *remaining as usize);
            *remaining = 0;
            return Flow::LimitReached;
        }
        *remaining -= written;
        Flow::More
    }
}

/// Random access to a log file (a `File`, or bytes in tests).
pub trait ReadAt {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
}

impl ReadAt for std::fs::File {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        std::os::unix::fs::FileExt::read_at(self, buf, offset)
    }
}

impl ReadAt for [u8] {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let start = (offset as usize).min(self.len());
        let n = buf.len().min(self.len() - start);
        buf[..n].copy_from_slice(&self[start..start + n]);
        Ok(n)
    }
}

const BLOCK: usize = 64 * 1024;
/// Enough of a record to read its timestamp, stream and tag.
const HEAD: usize = 128;

/// The offset where the last `lines` lines of the first `len` bytes of `file` start,
/// found by reading backwards from the end one block at a time (upstream's
/// `FindTailLineStartIndex`). A trailing record without its newline is being written and
/// does not count.
pub fn tail_start<F: ReadAt + ?Sized>(file: &F, len: u64, lines: u64) -> io::Result<u64> {
    // Everything up to `complete` is whole records.
    let complete = last_newline_before(file, len)?.map_or(0, |p| p + 1);
    let mut counted = 0u64;
    // The start of the most recent (in backward order) record seen.
    let mut answer = complete;
    let mut block = vec![0u8; BLOCK];
    let mut end = complete;
    // Record boundaries are newlines; the record starting at `p + 1` ends at the next one.
    let visit = |start: u64, counted: &mut u64, answer: &mut u64| -> io::Result<bool> {
        if start >= complete {
            return Ok(false);
        }
        let mut head = [0u8; HEAD];
        let n = file.read_at(&mut head, start)?;
        if ends_line(&head[..n]) {
            if *counted == lines {
                return Ok(true);
            }
            *counted += 1;
        }
        *answer = start;
        Ok(false)
    };
    while end > 0 {
        let begin = end.saturating_sub(BLOCK as u64);
        let buf = &mut block[..(end - begin) as usize];
        read_exact_at(file, buf, begin)?;
        for i in (0..buf.len()).rev() {
            if buf[i] == b'\n' && visit(begin + i as u64 + 1, &mut counted, &mut answer)? {
                return Ok(answer);
            }
        }
        end = begin;
    }
    visit(0, &mut counted, &mut answer)?;
    Ok(answer)
}

fn last_newline_before<F: ReadAt + ?Sized>(file: &F, len: u64) -> io::Result<Option<u64>> {
    let mut block = vec![0u8; BLOCK];
    let mut end = len;
    while end > 0 {
        let begin = end.saturating_sub(BLOCK as u64);
        let buf = &mut block[..(end - begin) as usize];
        read_exact_at(file, buf, begin)?;
        if let Some(i) = buf.iter().rposition(|b| *b == b'\n') {
            return Ok(Some(begin + i as u64));
        }
        end = begin;
    }
    Ok(None)
}

fn read_exact_at<F: ReadAt + ?Sized>(file: &F, mut buf: &mut [u8], mut at: u64) -> io::Result<()> {
    while !buf.is_empty() {
        match file.read_at(buf, at)? {
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            n => {
                buf = &mut buf[n..];
                at += n as u64;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
