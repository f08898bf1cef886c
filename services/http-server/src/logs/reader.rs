//! Reading one container log file into a response body, on the blocking pool (upstream's
//! `ReadLogs`): positioned by `tailLines`, read in bounded blocks, and with `follow`
//! waiting for writes with inotify, reopening the path when the log manager rotated it
//! (the old file is read to its end first), and ending once the container has exited.

use super::cri_format::{self, Flow, LogWriter};
use super::options::LogOptions;
use bytes::Bytes;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Bytes read from the file at a time.
const BLOCK: usize = 64 * 1024;
/// Longest record kept while waiting for its newline; a longer one is dropped (containerd
/// splits lines at 16 KiB).
const MAX_RECORD: usize = 1 << 20;
/// How often a follower asks whether the container still runs (upstream's
/// `logForceCheckPeriod`).
const RUNNING_CHECK: Duration = Duration::from_secs(1);

/// Whether the container still runs; asked by followers at the end of the file.
pub trait Liveness: Send {
    fn running(&mut self) -> bool;
}

/// An opened log, positioned where the response starts.
pub struct LogReader {
    path: PathBuf,
    file: File,
    offset: u64,
    follow: bool,
    writer: LogWriter,
    /// The start of a record whose newline has not been read yet.
    pending: Vec<u8>,
    /// Dropping the rest of an over-long record.
    discarding: bool,
}

impl LogReader {
    /// Opens `path` and finds where `tailLines` starts (blocking).
    pub fn open(path: &Path, opts: &LogOptions) -> Result<Self, String> {
        let file = File::open(path)
            .map_err(|e| format!("failed to open log file {:?}: {e}", path.display()))?;
        let len = file
            .metadata()
            .map_err(|e| format!("failed to stat log file {:?}: {e}", path.display()))?
            .len();
        let offset = match opts.tail_lines {
            Some(n) => cri_format::tail_start(&file, len, n).map_err(|e| {
                format!(
                    "failed to tail {n} lines of log file {:?}: {e}",
                    path.display()
                )
            })?,
            None => 0,
        };
        Ok(Self {
            path: path.to_path_buf(),
            file,
            offset,
            follow: opts.follow,
            writer: LogWriter::new(opts, k8s_openapi::jiff::Timestamp::now()),
            pending: Vec::new(),
            discarding: false,
        })
    }

    /// Sends the body to `tx` until the end (of the file, or with `follow` of the
    /// container), the byte limit, or until the receiver is gone (blocking).
    pub fn run(mut self, tx: mpsc::Sender<io::Result<Bytes>>, liveness: &mut dyn Liveness) {
        let mut buf = vec![0u8; BLOCK];
        let mut watcher: Option<Watcher> = None;
        let mut exited = false;
        let mut last_check: Option<Instant> = None;
        loop {
            let n = match std::os::unix::fs::FileExt::read_at(&self.file, &mut buf, self.offset) {
                Ok(n) => n,
                Err(e) => {
                    let _ = tx.blocking_send(Err(e));
                    return;
                }
            };
            if n > 0 {
                self.offset += n as u64;
                let mut out = Vec::new();
                let flow = self.consume(&buf[..n], &mut out);
                if !out.is_empty() && tx.blocking_send(Ok(out.into())).is_err() {
                    return;
                }
                if flow == Flow::LimitReached {
                    return;
                }
                continue;
            }
            // At the end of the file.
            if !self.follow || exited || tx.is_closed() {
                return;
            }
            match self.rotated() {
                Ok(Some(file)) => {
                    tracing::debug!(path = %self.path.display(), "log rotated, reopening");
                    self.file = file;
                    self.offset = 0;
                    self.pending.clear();
                    self.discarding = false;
                    if let Some(w) = &watcher {
                        w.watch_file(&self.path);
                    }
                    continue;
                }
                Ok(None) => {}
                Err(e) => {
                    let _ = tx.blocking_send(Err(e));
                    return;
                }
            }
            if last_check.is_none_or(|t| t.elapsed() >= RUNNING_CHECK) {
                last_check = Some(Instant::now());
                if !liveness.running() {
                    // Read what was written before it exited, then end.
                    exited = true;
                    continue;
                }
            }
            match &watcher {
                Some(w) => w.wait(RUNNING_CHECK),
                None => match Watcher::new(&self.path) {
                    // Writes between the last read and the watch would be missed: read again.
                    Ok(w) => watcher = Some(w),
                    Err(e) => {
                        tracing::warn!(path = %self.path.display(), error = %e, "cannot watch the log; polling");
                        std::thread::sleep(Duration::from_millis(250));
                    }
                },
            }
        }
    }

    /// Splits `data` into records and writes them.
    fn consume(&mut self, mut data: &[u8], out: &mut Vec<u8>) -> Flow {
        while let Some(i) = data.iter().position(|b| *b == b'\n') {
            let (line, rest) = data.split_at(i + 1);
            data = rest;
            if self.discarding {
                self.discarding = false;
                continue;
            }
            let flow = if self.pending.is_empty() {
                self.write_record(line, out)
            } else {
                let mut record = std::mem::take(&mut self.pending);
                record.extend_from_slice(line);
                self.write_record(&record, out)
            };
            if flow == Flow::LimitReached {
                return flow;
            }
        }
        if !self.discarding && !data.is_empty() {
            if self.pending.len() + data.len() > MAX_RECORD {
                tracing::warn!(path = %self.path.display(), "dropping a log record over 1 MiB");
                self.pending.clear();
                self.discarding = true;
            } else {
                self.pending.extend_from_slice(data);
            }
        }
        Flow::More
    }

    fn write_record(&mut self, line: &[u8], out: &mut Vec<u8>) -> Flow {
        match cri_format::parse(line) {
            Ok(record) => self.writer.write(&record, out),
            Err(e) => {
                tracing::debug!(path = %self.path.display(), error = %e, "skipping a log line that is not in the CRI format");
                Flow::More
            }
        }
    }

    /// The new file at the path, if the one being read was renamed away, the runtime has
    /// opened a new one, and the old one is read to its end: the runtime may have written
    /// to it between the read that found its end and the reopen (CI caught a line lost in
    /// that window, twice), and writes nothing to it after the reopen.
    ///
    /// The order of the two checks is what makes that safe: the new file is looked for
    /// first, and only then is the old one's length read. A record written to the old file
    /// came before the reopen that made the new one, so a length read after the new file
    /// was seen counts it. (Read the other way round, a record written after the length
    /// was read and before the new file appeared was lost: stop 53's CI.)
    fn rotated(&self) -> io::Result<Option<File>> {
        let at_path = match std::fs::metadata(&self.path) {
            Ok(m) => m,
            // Renamed, not reopened yet.
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let current = self.file.metadata()?;
        if (at_path.dev(), at_path.ino()) == (current.dev(), current.ino()) {
            return Ok(None);
        }
        // A new file is there: the old one's length is final now.
        if current.len() > self.offset {
            return Ok(None);
        }
        match File::open(&self.path) {
            Ok(f) => Ok(Some(f)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// inotify on the log file (writes, rename, removal) and its directory (a new file).
struct Watcher {
    inotify: Inotify,
}

impl Watcher {
    fn new(path: &Path) -> nix::Result<Self> {
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
        if let Some(dir) = path.parent() {
            inotify.add_watch(dir, AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO)?;
        }
        let w = Self { inotify };
        w.watch_file(path);
        Ok(w)
    }

    fn watch_file(&self, path: &Path) {
        let flags = AddWatchFlags::IN_MODIFY
            | AddWatchFlags::IN_MOVE_SELF
            | AddWatchFlags::IN_DELETE_SELF
            | AddWatchFlags::IN_ATTRIB;
        if let Err(e) = self.inotify.add_watch(path, flags) {
            // Not there between a rename and the reopen: the directory watch sees the new one.
            tracing::debug!(path = %path.display(), error = %e, "cannot watch the log file");
        }
    }

    /// Waits up to `timeout` for any event, then drains the queue.
    fn wait(&self, timeout: Duration) {
        let ms = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
        let mut fds = [PollFd::new(self.inotify.as_fd(), PollFlags::POLLIN)];
        if let Err(e) = poll(&mut fds, PollTimeout::from(ms)) {
            tracing::debug!(error = %e, "poll on inotify failed");
            std::thread::sleep(timeout);
        }
        // Nonblocking: EAGAIN once the queue is empty.
        while matches!(self.inotify.read_events(), Ok(events) if !events.is_empty()) {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    struct Flag(std::sync::Arc<std::sync::atomic::AtomicBool>);
    impl Liveness for Flag {
        fn running(&mut self) -> bool {
            self.0.load(std::sync::atomic::Ordering::SeqCst)
        }
    }

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "nodeagent-logs-{name}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    async fn read_until(rx: &mut mpsc::Receiver<io::Result<Bytes>>, want: &str) -> String {
        let mut got = String::new();
        while !got.ends_with(want) {
            let chunk = tokio::time::timeout(Duration::from_secs(5), rx.recv())
                .await
                .expect("a chunk within 5 s")
                .expect("the stream goes on")
                .unwrap();
            got.push_str(std::str::from_utf8(&chunk).unwrap());
        }
        got
    }

    fn record(s: &str) -> String {
        format!("2024-05-01T10:00:00Z stdout F {s}\n")
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn follows_writes_and_a_rotation_then_ends_with_the_container() {
        let dir = temp_dir("follow");
        let path = dir.join("0.log");
        std::fs::write(&path, record("before")).unwrap();
        let opts = LogOptions {
            follow: true,
            ..Default::default()
        };
        let reader = LogReader::open(&path, &opts).unwrap();
        let running = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let mut liveness = Flag(running.clone());
        let (tx, mut rx) = mpsc::channel(4);
        let task = tokio::task::spawn_blocking(move || reader.run(tx, &mut liveness));
        let mut got = String::new();
        got.push_str(&read_until(&mut rx, "before\n").await);
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        // A record written in two writes is read once whole.
        f.write_all(b"2024-05-01T10:00:00Z stdout F aft").unwrap();
        f.flush().unwrap();
        std::thread::sleep(Duration::from_millis(50));
        f.write_all(b"er\n").unwrap();
        got.push_str(&read_until(&mut rx, "after\n").await);
        // Rotation: one more record lands in the renamed file, then a new file appears.
        f.write_all(record("last of the old file").as_bytes())
            .unwrap();
        std::fs::rename(&path, dir.join("0.log.20240501-100000")).unwrap();
        std::fs::write(&path, record("first of the new file")).unwrap();
        got.push_str(&read_until(&mut rx, "first of the new file\n").await);
        running.store(false, std::sync::atomic::Ordering::SeqCst);
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("the follower ends once the container exited")
            .unwrap();
        assert_eq!(
            got,
            "before\nafter\nlast of the old file\nfirst of the new file\n"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The window CI caught (container_logs::follow_continues_across_rotation...: one line
    /// of 172 missing): the reader finds the end of the file, the runtime writes one more
    /// record to it, the file is renamed away and the runtime opens a new one. The reader
    /// switches only once the old file is read to its end.
    #[test]
    fn a_rotation_waits_for_the_old_file_to_be_read_to_its_end() {
        let dir = temp_dir("rotation-window");
        let path = dir.join("0.log");
        std::fs::write(&path, record("read")).unwrap();
        let opts = LogOptions {
            follow: true,
            ..Default::default()
        };
        let mut reader = LogReader::open(&path, &opts).unwrap();
        reader.offset = reader.file.metadata().unwrap().len();
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        f.write_all(record("written before the reopen").as_bytes())
            .unwrap();
        std::fs::rename(&path, dir.join("0.log.20240501-100000")).unwrap();
        std::fs::write(&path, record("first of the new file")).unwrap();
        assert!(
            reader.rotated().unwrap().is_none(),
            "switched with a record of the old file unread"
        );
        reader.offset = reader.file.metadata().unwrap().len();
        assert!(reader.rotated().unwrap().is_some());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn without_follow_reads_to_the_end_and_stops() {
        let dir = temp_dir("plain");
        let path = dir.join("0.log");
        let body: String = (0..5).map(|i| record(&i.to_string())).collect();
        std::fs::write(&path, body).unwrap();
        let opts = LogOptions {
            tail_lines: Some(2),
            ..Default::default()
        };
        let reader = LogReader::open(&path, &opts).unwrap();
        let (tx, mut rx) = mpsc::channel(4);
        let mut liveness = Flag(Default::default());
        tokio::task::spawn_blocking(move || reader.run(tx, &mut liveness))
            .await
            .unwrap();
        let mut got = String::new();
        while let Some(chunk) = rx.recv().await {
            got.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
        }
        assert_eq!(got, "3\n4\n");
        assert!(LogReader::open(&dir.join("absent.log"), &opts).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
