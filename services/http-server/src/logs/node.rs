//! `GET /logs/{path}`: the node's `/var/log`, read-only, as upstream's `http.FileServer`
//! under `/logs/` (a directory gets Go's HTML listing, a file its bytes), except that every
//! path is resolved with `openat2(RESOLVE_BENEATH)`, so a symlink cannot lead outside
//! `/var/log` (Go's `http.Dir` follows it), and only directories and regular files are
//! served (a FIFO would hang the reader).

use axum::body::Body;
use axum::extract::Path;
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag, open, openat2};
use nix::sys::stat::{FileStat, Mode, SFlag, fstat};
use std::fs::File;
use std::io::{self, Read, Seek};
use std::os::fd::OwnedFd;
use tokio::sync::mpsc;

/// What `/logs/` serves (upstream's `http.Dir("/var/log/")`).
pub const NODE_LOG_DIR: &str = "/var/log";
const BLOCK: usize = 64 * 1024;

pub async fn root(uri: Uri, headers: HeaderMap) -> Response {
    serve(String::new(), uri.path().to_string(), headers).await
}

pub async fn path(Path(rel): Path<String>, uri: Uri, headers: HeaderMap) -> Response {
    serve(rel, uri.path().to_string(), headers).await
}

async fn serve(rel: String, url_path: String, headers: HeaderMap) -> Response {
    // Go's FileServer refuses any `..` element, before and after decoding.
    if has_dot_dot(&rel) || has_dot_dot(&url_path) {
        return text(StatusCode::BAD_REQUEST, "invalid URL path");
    }
    let slash = url_path.ends_with('/');
    let base = rel
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .to_string();
    let opened = tokio::task::spawn_blocking(move || open_beneath(NODE_LOG_DIR, &rel)).await;
    let (fd, st) = match opened {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => return errno_response(e),
        Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    };
    let kind = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
    if kind == SFlag::S_IFDIR {
        if !slash {
            return redirect(&format!("{base}/"));
        }
        return match tokio::task::spawn_blocking(move || list(fd)).await {
            Ok(Ok(html)) => {
                ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], html).into_response()
            }
            Ok(Err(e)) => errno_response(e),
            Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
        };
    }
    if kind != SFlag::S_IFREG {
        return text(StatusCode::FORBIDDEN, "403 Forbidden");
    }
    if slash {
        return redirect(&format!("../{base}"));
    }
    let size = st.st_size as u64;
    let range = match headers.get(header::RANGE).map(|v| v.to_str()) {
        None => None,
        Some(Ok(v)) => match byte_range(v, size) {
            Ok(r) => r,
            Err(RangeError::NoOverlap) => {
                return (
                    StatusCode::RANGE_NOT_SATISFIABLE,
                    [
                        (header::CONTENT_RANGE, format!("bytes */{size}")),
                        (header::CONTENT_TYPE, "text/plain; charset=utf-8".into()),
                    ],
                    "invalid range: failed to overlap\n",
                )
                    .into_response();
            }
            Err(RangeError::Invalid) => {
                return text(StatusCode::RANGE_NOT_SATISFIABLE, "invalid range");
            }
        },
        Some(Err(_)) => return text(StatusCode::RANGE_NOT_SATISFIABLE, "invalid range"),
    };
    serve_file(File::from(fd), size, range).await
}

#[derive(Debug, PartialEq, Eq)]
enum RangeError {
    /// Not `bytes=` ranges as RFC 7233 writes them.
    Invalid,
    /// No range overlaps the file: 416 with `Content-Range: bytes */size`.
    NoOverlap,
}

/// A `Range` header read as Go's `parseRange` reads it, for a file of `size` bytes: the
/// one range to serve as (start, length), or None to serve the whole file. Several
/// ranges (which Go answers as multipart/byteranges) are served as the whole file, which
/// RFC 7233 allows.
fn byte_range(header: &str, size: u64) -> Result<Option<(u64, u64)>, RangeError> {
    let spec = header
        .trim()
        .strip_prefix("bytes=")
        .ok_or(RangeError::Invalid)?;
    let number = |s: &str| -> Result<u64, RangeError> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(RangeError::Invalid);
        }
        s.parse().map_err(|_| RangeError::Invalid)
    };
    let mut ranges = Vec::new();
    let mut no_overlap = false;
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (start, end) = part.split_once('-').ok_or(RangeError::Invalid)?;
        let (start, end) = (start.trim(), end.trim());
        if start.is_empty() {
            // A suffix: the last `end` bytes.
            let n = number(end)?.min(size);
            if n == 0 {
                no_overlap = true;
                continue;
            }
            ranges.push((size - n, n));
            continue;
        }
        let first = number(start)?;
        if first >= size {
            no_overlap = true;
            continue;
        }
        let last = if end.is_empty() {
            size - 1
        } else {
            let last = number(end)?;
            if first > last {
                return Err(RangeError::Invalid);
            }
            last.min(size - 1)
        };
        ranges.push((first, last - first + 1));
    }
    match ranges.len() {
        0 if no_overlap => Err(RangeError::NoOverlap),
        0 => Err(RangeError::Invalid),
        1 => Ok(Some(ranges[0])),
        _ => Ok(None),
    }
}

fn has_dot_dot(p: &str) -> bool {
    p.split('/').any(|s| s == "..")
}

/// Opens `rel` below `root` without following anything out of it.
fn open_beneath(root: &str, rel: &str) -> Result<(OwnedFd, FileStat), Errno> {
    let root = open(
        root,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let rel = rel.trim_start_matches('/');
    let rel = if rel.is_empty() { "." } else { rel };
    let how = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NOCTTY | OFlag::O_NONBLOCK)
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    let fd = openat2(&root, rel, how)?;
    let st = fstat(&fd)?;
    Ok((fd, st))
}

/// Go's `dirList`: entries sorted by name, directories with a trailing slash.
fn list(fd: OwnedFd) -> Result<String, Errno> {
    let mut dir = nix::dir::Dir::from_fd(fd)?;
    let mut entries: Vec<String> = Vec::new();
    for entry in dir.iter() {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == "." || name == ".." {
            continue;
        }
        let is_dir = matches!(entry.file_type(), Some(nix::dir::Type::Directory));
        entries.push(if is_dir { format!("{name}/") } else { name });
    }
    entries.sort();
    let mut html = String::from(
        "<!doctype html>\n<meta name=\"viewport\" content=\"width=device-width\">\n<pre>\n",
    );
    for name in entries {
        html.push_str(&format!(
            "<a href=\"{}\">{}</a>\n",
            html_escape(&href(&name)),
            html_escape(&name)
        ));
    }
    html.push_str("</pre>\n");
    Ok(html)
}

/// Go's `url.URL{Path: name}.String()`.
fn href(name: &str) -> String {
    let mut out = String::new();
    // A colon in the first segment would read as a scheme.
    if name.split('/').next().is_some_and(|s| s.contains(':')) {
        out.push_str("./");
    }
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~$&+,/:;=@".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&#34;")
        .replace('\'', "&#39;")
}

/// Streams the file's first `size` bytes (its size when opened, as Go's `serveContent`),
/// or with `range` (start, length) those bytes as a 206.
async fn serve_file(file: File, size: u64, range: Option<(u64, u64)>) -> Response {
    let (head, file) = match tokio::task::spawn_blocking(move || {
        let mut head = vec![0u8; 512];
        let n = std::os::unix::fs::FileExt::read_at(&file, &mut head, 0)?;
        head.truncate(n);
        Ok::<_, io::Error>((head, file))
    })
    .await
    {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => return text(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
        Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    };
    let (tx, rx) = mpsc::channel(4);
    let (start, length) = range.unwrap_or((0, size));
    tokio::task::spawn_blocking(move || stream(file, start, length, tx));
    let mut response = (
        [
            (header::CONTENT_TYPE, content_type(&head).to_string()),
            (header::CONTENT_LENGTH, length.to_string()),
            (header::ACCEPT_RANGES, "bytes".to_string()),
        ],
        Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx)),
    )
        .into_response();
    if range.is_some() {
        *response.status_mut() = StatusCode::PARTIAL_CONTENT;
        if let Ok(v) = format!("bytes {start}-{}/{size}", start + length - 1).parse() {
            response.headers_mut().insert(header::CONTENT_RANGE, v);
        }
    }
    response
}

/// Sends `length` bytes from `start` of `file`.
fn stream(mut file: File, start: u64, length: u64, tx: mpsc::Sender<io::Result<Bytes>>) {
    if start > 0
        && let Err(e) = file.seek(io::SeekFrom::Start(start))
    {
        let _ = tx.blocking_send(Err(e));
        return;
    }
    let mut left = length;
    while left > 0 {
        let mut buf = vec![0u8; BLOCK.min(left as usize)];
        let n = match file.read(&mut buf) {
            Ok(0) => {
                let _ = tx.blocking_send(Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the file shrank while being served",
                )));
                return;
            }
            Ok(n) => n,
            Err(e) => {
                let _ = tx.blocking_send(Err(e));
                return;
            }
        };
        buf.truncate(n);
        left -= n as u64;
        if tx.blocking_send(Ok(buf.into())).is_err() {
            return;
        }
    }
}

/// Text (UTF-8 without binary control bytes) or not, from the first 512 bytes.
fn content_type(head: &[u8]) -> &'static str {
    let binary = head
        .iter()
        .any(|b| *b < 0x20 && !matches!(b, b'\t' | b'\n' | b'\r' | 0x0c | 0x1b));
    // A multi-byte character may be cut at the end of the sample.
    let utf8 = match std::str::from_utf8(head) {
        Ok(_) => true,
        Err(e) => e.error_len().is_none(),
    };
    if !binary && utf8 {
        "text/plain; charset=utf-8"
    } else {
        "application/octet-stream"
    }
}

fn errno_response(e: Errno) -> Response {
    match e {
        Errno::ENOENT | Errno::ENOTDIR | Errno::EINVAL => {
            text(StatusCode::NOT_FOUND, "404 page not found")
        }
        // EXDEV: the path leads out of /var/log; ELOOP: a magic link.
        Errno::EXDEV | Errno::ELOOP | Errno::EACCES | Errno::EPERM => {
            text(StatusCode::FORBIDDEN, "403 Forbidden")
        }
        e => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("500 Internal Server Error: {e}"),
        ),
    }
}

fn redirect(location: &str) -> Response {
    (
        StatusCode::MOVED_PERMANENTLY,
        [(header::LOCATION, location.to_string())],
    )
        .into_response()
}

fn text(code: StatusCode, body: &str) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("{body}\n"),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hrefs_and_names_are_escaped_as_go_does() {
        assert_eq!(href("a b.log"), "a%20b.log");
        assert_eq!(href("pods/"), "pods/");
        assert_eq!(href("x:y"), "./x:y");
        assert_eq!(html_escape("<a&'\">"), "&lt;a&amp;&#39;&#34;&gt;");
    }

    #[test]
    fn dot_dot_elements_are_found() {
        assert!(has_dot_dot("../etc"));
        assert!(has_dot_dot("/logs/a/../../etc"));
        assert!(!has_dot_dot("a..b/c.."));
    }

    #[test]
    fn open_beneath_refuses_escapes() {
        let root = std::env::temp_dir().join(format!("nodeagent-node-logs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/a.log"), "hello\n").unwrap();
        std::os::unix::fs::symlink("/etc", root.join("escape")).unwrap();
        std::os::unix::fs::symlink("sub/a.log", root.join("inside")).unwrap();
        let r = root.to_str().unwrap();
        assert!(open_beneath(r, "sub/a.log").is_ok());
        assert!(open_beneath(r, "inside").is_ok());
        assert_eq!(open_beneath(r, "escape/passwd").unwrap_err(), Errno::EXDEV);
        assert_eq!(open_beneath(r, "absent").unwrap_err(), Errno::ENOENT);
        let (fd, _) = open_beneath(r, "").unwrap();
        let listing = list(fd).unwrap();
        assert!(listing.contains("<a href=\"sub/\">sub/</a>\n"), "{listing}");
        assert!(
            listing.contains("<a href=\"escape\">escape</a>\n"),
            "{listing}"
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn ranges_are_read_as_go_reads_them() {
        use RangeError::*;
        assert_eq!(byte_range("bytes=0-9", 100), Ok(Some((0, 10))));
        assert_eq!(byte_range("bytes=90-", 100), Ok(Some((90, 10))));
        assert_eq!(byte_range("bytes=90-1000", 100), Ok(Some((90, 10))));
        assert_eq!(byte_range("bytes=-10", 100), Ok(Some((90, 10))));
        assert_eq!(byte_range("bytes=-1000", 100), Ok(Some((0, 100))));
        assert_eq!(byte_range("bytes= 5 - 6 ", 100), Ok(Some((5, 2))));
        // Several ranges: the whole file.
        assert_eq!(byte_range("bytes=0-1, 5-6", 100), Ok(None));
        // One of several beyond the end is dropped.
        assert_eq!(byte_range("bytes=0-1, 500-", 100), Ok(Some((0, 2))));
        assert_eq!(byte_range("bytes=100-", 100), Err(NoOverlap));
        assert_eq!(byte_range("bytes=-0", 100), Err(NoOverlap));
        assert_eq!(byte_range("bytes=0-", 0), Err(NoOverlap));
        for bad in [
            "items=0-1",
            "bytes=",
            "bytes=5",
            "bytes=9-5",
            "bytes=a-b",
            "bytes=--5",
            "bytes=+1-2",
        ] {
            assert_eq!(byte_range(bad, 100), Err(Invalid), "{bad}");
        }
    }

    #[test]
    fn content_type_sniffs_text() {
        assert_eq!(content_type(b"hello\n"), "text/plain; charset=utf-8");
        assert_eq!(
            content_type(b"\x1f\x8b\x08\x00"),
            "application/octet-stream"
        );
    }
}
