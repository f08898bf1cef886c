//! Termination messages: the terminationMessagePath file of an exited container or, with
//! FallbackToLogsOnError and a failure, the tail of its log. Only the part that is kept is
//! ever read (a seek to the end minus the limit), and off the async workers: a container
//! may leave a file of any size behind.

use crate::PodSync;
use crate::runtime_spec;
use nodeagent_proto::api::RuntimeContainer;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// Upstream `MaxContainerTerminationMessageLength`: the tail of the file that is kept.
pub const MAX_MESSAGE_BYTES: usize = 4096;
/// Upstream `MaxContainerTerminationMessageLogLines` and `...LogLength` for the fallback.
pub const LOG_TAIL_LINES: usize = 80;
pub const LOG_TAIL_BYTES: usize = 2048;
/// How much of a CRI log file is read for the fallback: the kept bytes plus room for the
/// "<RFC 3339 time> <stream> <tag> " prefix (at most ~48 bytes) of every kept line.
const LOG_WINDOW_BYTES: u64 = (LOG_TAIL_BYTES + LOG_TAIL_LINES * 128) as u64;

/// One exited container whose message is still to be read.
struct Pending {
    id: String,
    file: PathBuf,
    /// The log to fall back to when the file is empty.
    fallback_log: Option<PathBuf>,
}

impl PodSync {
    /// Reads, once per container, the termination message of every exited container of
    /// the pod, within the per-container limit; the pod's status shares the per-pod one
    /// out evenly (`status::normalize`, as upstream's status manager).
    pub(crate) async fn read_termination_messages(&self, uid: &str) {
        let pending = self.pending_messages(uid);
        if pending.is_empty() {
            return;
        }
        let read = tokio::task::spawn_blocking(move || {
            pending
                .into_iter()
                .map(|p| {
                    let message = p.read(MAX_MESSAGE_BYTES);
                    (p.id, message)
                })
                .collect::<Vec<_>>()
        });
        match read.await {
            Ok(found) => self.lock().termination_messages.extend(found),
            Err(e) => tracing::warn!(error = %e, "reading termination messages failed"),
        }
    }

    /// The exited containers without a message yet.
    fn pending_messages(&self, uid: &str) -> Vec<Pending> {
        let st = self.lock();
        let (Some(pod), Some(runtime)) = (st.desired.get(uid), st.runtime.get(uid)) else {
            return Vec::new();
        };
        let spec = pod.spec.clone().unwrap_or_default();
        let exited = nodeagent_proto::cri::ContainerState::ContainerExited as i32;
        runtime
            .containers
            .iter()
            .filter(|c| c.state == exited && !st.termination_messages.contains_key(&c.id))
            .filter_map(|c| {
                let container = spec
                    .containers
                    .iter()
                    .chain(spec.init_containers.iter().flatten())
                    .find(|s| s.name == c.name)?;
                let fallback = container.termination_message_policy.as_deref()
                    == Some("FallbackToLogsOnError")
                    && c.exit_code != 0;
                Some(self.pending(uid, pod, c, fallback))
            })
            .collect()
    }

    fn pending(
        &self,
        uid: &str,
        pod: &k8s_openapi::api::core::v1::Pod,
        c: &RuntimeContainer,
        fallback: bool,
    ) -> Pending {
        // Both are checked paths; a pod that cannot name them safely was refused before it
        // ran, so an error here only means "no message" (an empty path reads nothing).
        let file =
            runtime_spec::termination_message_file(&self.node.root_dir, uid, &c.name, c.attempt)
                .unwrap_or_default();
        let fallback_log = fallback
            .then(|| runtime_spec::pod_log_dir(&self.node.pod_logs_dir, pod).ok())
            .flatten()
            .map(|dir| dir.join(&c.name).join(format!("{}.log", c.attempt)));
        Pending {
            id: c.id.clone(),
            file,
            fallback_log,
        }
    }
}

impl Pending {
    /// Blocking: the message, at most `max` bytes.
    fn read(&self, max: usize) -> String {
        let data = read_tail(&self.file, max as u64).unwrap_or_default();
        let message = String::from_utf8_lossy(&data).into_owned();
        match &self.fallback_log {
            Some(log) if message.is_empty() => {
                log_tail(log, LOG_TAIL_LINES, LOG_TAIL_BYTES.min(max))
            }
            _ => message,
        }
    }
}

/// Blocking: the last `max` bytes of a file, read with one seek; never more than `max`.
pub fn read_tail(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    let mut file = std::fs::File::open(path)?;
    let len = file.metadata()?.len();
    let start = len.saturating_sub(max);
    file.seek(SeekFrom::Start(start))?;
    let mut data = Vec::with_capacity((len - start) as usize);
    file.take(max).read_to_end(&mut data)?;
    Ok(data)
}

/// Blocking: the last lines of a CRI log file, without the "<time> <stream> <tag> "
/// prefixes, at most `lines` lines and `max_bytes` bytes.
fn log_tail(path: &Path, lines: usize, max_bytes: usize) -> String {
    let window = read_tail(path, LOG_WINDOW_BYTES).unwrap_or_default();
    let len = std::fs::metadata(path).map_or(0, |m| m.len());
    let mut text = String::from_utf8_lossy(&window).into_owned();
    if len > window.len() as u64 {
        // The window starts mid-line: drop that partial line.
        text = text
            .split_once('\n')
            .map_or_else(String::new, |(_, rest)| rest.to_string());
    }
    let all: Vec<&str> = text
        .lines()
        .map(|l| l.splitn(4, ' ').nth(3).unwrap_or(l))
        .collect();
    let tail = all[all.len().saturating_sub(lines)..].join("\n");
    let start = tail.len().saturating_sub(max_bytes);
    let start = (start..tail.len())
        .find(|i| tail.is_char_boundary(*i))
        .unwrap_or(tail.len());
    tail[start..].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_huge_sparse_file_is_read_from_its_tail_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("termination-log");
        let mut f = std::fs::File::create(&path).unwrap();
        f.set_len(100 << 20).unwrap();
        f.seek(SeekFrom::End(0)).unwrap();
        f.write_all(b"the end").unwrap();
        // What this thread read through read(2) (`rchar`), before and after: not a clock,
        // which a busy machine makes fail; reading it all would be 100 MiB.
        let read_so_far = || {
            let io = std::fs::read_to_string("/proc/thread-self/io").unwrap();
            io.lines()
                .find_map(|l| l.strip_prefix("rchar: "))
                .unwrap()
                .parse::<u64>()
                .unwrap()
        };
        let before = read_so_far();
        let data = read_tail(&path, MAX_MESSAGE_BYTES as u64).unwrap();
        let read = read_so_far() - before;
        // The tail, plus the /proc file's own text read by the first call.
        assert!(read < 64 << 10, "{read} bytes read for a 4 KiB tail");
        assert_eq!(data.len(), MAX_MESSAGE_BYTES);
        assert!(data.ends_with(b"the end"));
        assert_eq!(read_tail(&path, 3).unwrap(), b"end");
    }

    #[test]
    fn a_short_file_is_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m");
        std::fs::write(&path, "bye").unwrap();
        assert_eq!(read_tail(&path, 4096).unwrap(), b"bye");
        assert!(read_tail(&dir.path().join("missing"), 4096).is_err());
    }

    #[test]
    fn the_log_fallback_keeps_the_last_lines_of_a_long_log() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0.log");
        let mut f = std::fs::File::create(&path).unwrap();
        for n in 0..200_000 {
            writeln!(f, "2026-11-23T02:00:00.000000000Z stderr F line {n}").unwrap();
        }
        let tail = log_tail(&path, LOG_TAIL_LINES, LOG_TAIL_BYTES);
        let lines: Vec<&str> = tail.lines().collect();
        assert_eq!(lines.len(), LOG_TAIL_LINES);
        assert_eq!(lines.last(), Some(&"line 199999"));
        assert_eq!(lines[0], "line 199920");
        let short = log_tail(&path, LOG_TAIL_LINES, 20);
        assert_eq!(short, "e 199998\nline 199999");
    }

    #[test]
    fn a_pending_message_respects_the_budget_and_falls_back_to_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("msg");
        std::fs::write(&file, "x".repeat(10_000)).unwrap();
        let log = dir.path().join("0.log");
        std::fs::write(&log, "t stdout F oops\n").unwrap();
        let p = Pending {
            id: "c1".into(),
            file: file.clone(),
            fallback_log: Some(log.clone()),
        };
        assert_eq!(p.read(MAX_MESSAGE_BYTES).len(), MAX_MESSAGE_BYTES);
        assert_eq!(p.read(10).len(), 10);
        std::fs::write(&file, "").unwrap();
        assert_eq!(p.read(MAX_MESSAGE_BYTES), "oops");
    }
}
