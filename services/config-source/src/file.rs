//! The static pod file source: a directory of manifests (or one file), re-read on inotify
//! events and every `fileCheckFrequency`. Files whose names start with "." are ignored,
//! and so are files that are not regular files (a FIFO would block a reader forever). A
//! scan runs on the blocking pool and reads at most the manifest size limit per file.

use crate::manifest::{self, Origin};
use crate::store::PodStore;
use k8s_openapi::api::core::v1::Pod;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use nodeagent_transport::{Heartbeat, Shutdown};
use std::collections::{BTreeMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::unix::AsyncFd;

/// A change whose write is complete (the file closed after writing, renamed in, removed)
/// is read at once. A write still open is waited for this long at most (a writer that
/// keeps its file open never closes it), so that a burst of writes is one read.
const SETTLE: Duration = Duration::from_millis(100);

pub struct FileSource {
    path: PathBuf,
    node_name: String,
    period: Duration,
    store: Arc<Mutex<PodStore>>,
    /// path -> the last good pod read from it (kept while the file is unreadable).
    last_good: BTreeMap<PathBuf, Pod>,
    /// path -> the last error reported for it, so each error is logged once.
    reported: BTreeMap<PathBuf, String>,
    missing_reported: bool,
    /// path -> the stamp of the file its `last_good` pod was read from, while that file
    /// is unchanged: a scan re-reads only what changed, as upstream's file source reads
    /// only the file an event names (a new manifest beside 500 costs one parse, not 501).
    stamps: BTreeMap<PathBuf, Stamp>,
    /// Manifests read and parsed so far.
    reads: u64,
}

/// What tells a manifest file's versions apart, short of reading it: the inode, its
/// size, and its modification and change times (the change time cannot be set back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(meta: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }

    /// Whether the file last changed at least [`RACY`] before `scan` (seconds since the
    /// epoch): a file changed more recently is read again at the next scan, since its
    /// stamp may not tell two writes apart yet (git's "racy clean" rule). Kernels before
    /// 6.13 keep file times at the clock tick, so two writes of the same size within one
    /// tick leave the same stamp.
    fn settled(&self, scan: f64) -> bool {
        let changed = |(s, ns): (i64, i64)| s as f64 + ns as f64 * 1e-9;
        changed(self.mtime).max(changed(self.ctime)) + RACY.as_secs_f64() <= scan
    }
}

/// How long a file's times stay ambiguous: far above any kernel's tick.
const RACY: Duration = Duration::from_secs(1);

impl FileSource {
    pub fn new(
        path: PathBuf,
        node_name: String,
        period: Duration,
        store: Arc<Mutex<PodStore>>,
    ) -> Self {
        Self {
            path,
            node_name,
            period,
            store,
            last_good: BTreeMap::new(),
            reported: BTreeMap::new(),
            missing_reported: false,
            stamps: BTreeMap::new(),
            reads: 0,
        }
    }

    /// How long the loop may go without a beat: its longest wait plus a generous scan.
    pub fn max_silence(&self) -> Duration {
        self.period + SETTLE + Duration::from_secs(60)
    }

    /// Scans on every change and every period until `shutdown`, beating `heartbeat`
    /// after every scan.
    pub async fn run(mut self, shutdown: Shutdown, heartbeat: Heartbeat) {
        let mut watcher = None;
        // Manifests being written: created or modified and not yet closed.
        let mut writing = HashSet::new();
        loop {
            if watcher.is_none() {
                watcher = watch(&self.path)
                    .inspect_err(|e| tracing::debug!(path = %self.path.display(), error = %e, "inotify unavailable; relying on the periodic re-scan"))
                    .ok();
            }
            // Reading files blocks; keep it off the async workers.
            self = match tokio::task::spawn_blocking(move || {
                self.scan();
                self
            })
            .await
            {
                Ok(source) => source,
                Err(e) => {
                    // The heartbeat stops, so health reports the file source stale.
                    tracing::error!(error = %e, "the static pod file scan failed; the file source stopped");
                    return;
                }
            };
            heartbeat.beat();
            let changed = async {
                match &watcher {
                    Some(w) => wait_for_change(w, &mut writing).await,
                    None => std::future::pending().await,
                }
            };
            let change = tokio::select! {
                _ = shutdown.wait() => return,
                _ = tokio::time::sleep(self.period) => None,
                change = changed => Some(change),
            };
            let (Some(mut change), Some(w)) = (change, &watcher) else {
                continue;
            };
            // A write still under way is waited for, not read half done.
            let until = tokio::time::Instant::now() + SETTLE;
            while change == Change::Writing {
                match tokio::time::timeout_at(until, wait_for_change(w, &mut writing)).await {
                    Ok(next) => change = next,
                    Err(_) => break,
                }
            }
            writing.clear();
            if change == Change::Gone {
                watcher = None; // the directory went away; watch again next round
            }
        }
    }

    /// Reads every manifest that changed and hands the complete set to the store.
    pub fn scan(&mut self) {
        self.scan_at(std::time::SystemTime::now());
    }

    /// [`Self::scan`], as if it ran at `now` (for the stamps' racy rule).
    fn scan_at(&mut self, now: std::time::SystemTime) {
        let files = match list_manifests(&self.path) {
            Ok(files) => {
                self.missing_reported = false;
                files
            }
            Err(e) => {
                if !self.missing_reported {
                    tracing::warn!(path = %self.path.display(), error = %e, "static pod path unreadable; treating it as empty");
                    self.missing_reported = true;
                }
                Vec::new()
            }
        };
        let mut pods = Vec::new();
        let mut good = BTreeMap::new();
        let mut stamps = BTreeMap::new();
        let scan_started = now
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        for file in files {
            // Unchanged since it was read good: the pod read then.
            let stamp = std::fs::metadata(&file).ok().map(|m| Stamp::of(&m));
            if let (Some(now), Some(then), Some(pod)) =
                (stamp, self.stamps.get(&file), self.last_good.get(&file))
                && now == *then
            {
                stamps.insert(file.clone(), now);
                good.insert(file, pod.clone());
                pods.push(pod.clone());
                continue;
            }
            self.reads += 1;
            let shown = file.display().to_string();
            let result = read_manifest(&file)
                .and_then(|data| manifest::decode_pod(&data).map_err(Unread::Invalid))
                .and_then(|pod| {
                    manifest::static_pod(pod, Origin::File(&shown), &self.node_name)
                        .map_err(Unread::Invalid)
                });
            match result {
                Ok(pod) => {
                    self.reported.remove(&file);
                    // The stamp taken before the read: a write after it changes it.
                    if let Some(stamp) = stamp.filter(|s| s.settled(scan_started)) {
                        stamps.insert(file.clone(), stamp);
                    }
                    good.insert(file, pod.clone());
                    pods.push(pod);
                }
                Err(unread) => {
                    let reason = unread.to_string();
                    if self.reported.get(&file) != Some(&reason) {
                        let kept = self.last_good.contains_key(&file);
                        match unread {
                            Unread::NotRegular(_) => {
                                tracing::warn!(source = "file", path = %shown, %reason, kept_previous_version = kept, "skipped a file in the static pod path that is not a regular file")
                            }
                            Unread::Invalid(_) => {
                                tracing::error!(source = "file", path = %shown, %reason, kept_previous_version = kept, "invalid static pod manifest")
                            }
                        }
                        self.reported.insert(file.clone(), reason);
                    }
                    // Keep running what this file last described; a half-written file
                    // must not kill its pod.
                    if let Some(pod) = self.last_good.get(&file) {
                        good.insert(file.clone(), pod.clone());
                        pods.push(pod.clone());
                    }
                }
            }
        }
        self.reported.retain(|p, _| p.exists());
        self.last_good = good;
        self.stamps = stamps;
        crate::store::publish(&self.store, "file", pods);
    }
}

/// Why a file in the static pod path gave no pod.
#[derive(Debug)]
enum Unread {
    /// A FIFO, socket or device: never read (a FIFO would block the reader forever).
    NotRegular(&'static str),
    /// Unreadable, too big, or not a valid pod.
    Invalid(String),
}

impl std::fmt::Display for Unread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unread::NotRegular(kind) => write!(f, "not a regular file but a {kind}; skipped"),
            Unread::Invalid(reason) => f.write_str(reason),
        }
    }
}

fn kind_of(t: std::fs::FileType) -> &'static str {
    if t.is_fifo() {
        "FIFO"
    } else if t.is_socket() {
        "socket"
    } else if t.is_block_device() || t.is_char_device() {
        "device"
    } else if t.is_dir() {
        "directory"
    } else {
        "special file"
    }
}

/// Reads one manifest, race-free: it opens without blocking (O_NONBLOCK, so even a file
/// swapped for a FIFO after the listing cannot hang us), refuses what the open descriptor
/// says is not a regular file, checks the size before reading, and reads at most the
/// limit (a file growing meanwhile cannot make us read more).
fn read_manifest(path: &Path) -> Result<Vec<u8>, Unread> {
    let unreadable = |e: std::io::Error| Unread::Invalid(format!("cannot read: {e}"));
    // Not even opened when the listing already shows it is no regular file.
    let listed = std::fs::metadata(path).map_err(unreadable)?;
    if !listed.is_file() {
        return Err(Unread::NotRegular(kind_of(listed.file_type())));
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits()) // std adds O_CLOEXEC
        .open(path)
        .map_err(unreadable)?;
    let meta = file.metadata().map_err(unreadable)?; // fstat of what we opened
    if !meta.is_file() {
        return Err(Unread::NotRegular(kind_of(meta.file_type())));
    }
    let too_big = |len: u64| {
        Unread::Invalid(format!(
            "the manifest is {len} bytes; the limit is {}",
            manifest::MAX_MANIFEST_BYTES
        ))
    };
    if meta.len() > manifest::MAX_MANIFEST_BYTES as u64 {
        return Err(too_big(meta.len()));
    }
    let mut data = Vec::with_capacity(meta.len() as usize);
    file.take(manifest::MAX_MANIFEST_BYTES as u64 + 1)
        .read_to_end(&mut data)
        .map_err(unreadable)?;
    if data.len() > manifest::MAX_MANIFEST_BYTES {
        return Err(too_big(data.len() as u64));
    }
    Ok(data)
}

/// The manifest files under `path` (or `path` itself when it is a file), sorted.
fn list_manifests(path: &Path) -> std::io::Result<Vec<PathBuf>> {
    let meta = std::fs::metadata(path)?;
    if meta.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut files = Vec::new();
    for entry in std::fs::read_dir(path)? {
        let entry = entry?;
        let name = entry.file_name();
        if name.to_string_lossy().starts_with('.') {
            continue;
        }
        if entry.file_type()?.is_dir() {
            continue;
        }
        files.push(entry.path());
    }
    files.sort();
    Ok(files)
}

struct InotifyFd(Inotify);

impl AsRawFd for InotifyFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

fn watch(path: &Path) -> std::io::Result<AsyncFd<InotifyFd>> {
    let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
    let flags = AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_MODIFY
        | AddWatchFlags::IN_CLOSE_WRITE
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_ATTRIB
        | AddWatchFlags::IN_DELETE_SELF
        | AddWatchFlags::IN_MOVE_SELF;
    inotify.add_watch(path, flags)?;
    // SAFETY: the AsyncFd owns the Inotify, so the descriptor stays open for exactly as
    // long as it is registered with the reactor.
    #[allow(unsafe_code)]
    unsafe { AsyncFd::register(InotifyFd(inotify)) }.map_err(|e| e.into_parts().1)
}

/// What a batch of inotify events means for the next scan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Change {
    /// Every write seen is complete: scan now.
    Complete,
    /// A manifest is being written (created or modified, not yet closed).
    Writing,
    /// The watched path itself went away.
    Gone,
}

/// Folds one batch of events into `writing` (the manifests open for writing) and says
/// what it means. Dot-files are never read, so their events (an editor's swap file, the
/// temporary file of a write-then-rename) mean nothing.
fn classify<'a>(
    events: impl IntoIterator<Item = (AddWatchFlags, Option<&'a OsStr>)>,
    writing: &mut HashSet<OsString>,
) -> Change {
    let mut gone = false;
    for (mask, name) in events {
        if mask.intersects(
            AddWatchFlags::IN_DELETE_SELF | AddWatchFlags::IN_MOVE_SELF | AddWatchFlags::IN_IGNORED,
        ) {
            gone = true;
        }
        let Some(name) = name.filter(|n| !n.as_bytes().starts_with(b".")) else {
            continue;
        };
        if mask.intersects(
            AddWatchFlags::IN_CLOSE_WRITE
                | AddWatchFlags::IN_MOVED_TO
                | AddWatchFlags::IN_MOVED_FROM
                | AddWatchFlags::IN_DELETE,
        ) {
            writing.remove(name);
        } else if mask.intersects(AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MODIFY) {
            writing.insert(name.to_os_string());
        }
    }
    if gone {
        Change::Gone
    } else if writing.is_empty() {
        Change::Complete
    } else {
        Change::Writing
    }
}

/// Waits for a batch of inotify events and classifies it (see [`classify`]).
async fn wait_for_change(fd: &AsyncFd<InotifyFd>, writing: &mut HashSet<OsString>) -> Change {
    loop {
        let Ok(mut guard) = fd.readable().await else {
            return Change::Gone;
        };
        match guard.try_io(|inner| {
            inner
                .get_ref()
                .0
                .read_events()
                .map_err(std::io::Error::from)
        }) {
            Ok(Ok(events)) => {
                return classify(events.iter().map(|e| (e.mask, e.name.as_deref())), writing);
            }
            Ok(Err(_)) => return Change::Gone,
            Err(_would_block) => continue,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each row: a batch of events (mask, file name), what it means, and the manifests
    /// still open for writing after it. Batches of one test follow each other.
    #[test]
    fn a_completed_write_is_read_at_once_and_an_open_one_waited_for() {
        use AddWatchFlags as F;
        type Row<'a> = (&'a [(AddWatchFlags, &'a str)], Change, &'a [&'a str]);
        let cases: &[&[Row]] = &[
            // `cp`/an editor writing in place: created, written, closed.
            &[
                (
                    &[(F::IN_CREATE, "web.yaml"), (F::IN_MODIFY, "web.yaml")],
                    Change::Writing,
                    &["web.yaml"],
                ),
                (
                    &[(F::IN_MODIFY, "web.yaml")],
                    Change::Writing,
                    &["web.yaml"],
                ),
                (&[(F::IN_CLOSE_WRITE, "web.yaml")], Change::Complete, &[]),
            ],
            // The whole write in one batch.
            &[(
                &[
                    (F::IN_CREATE, "a.yaml"),
                    (F::IN_MODIFY, "a.yaml"),
                    (F::IN_CLOSE_WRITE, "a.yaml"),
                ],
                Change::Complete,
                &[],
            )],
            // Write a dot-file, rename it in: only the rename counts, and at once.
            &[
                (
                    &[(F::IN_CREATE, ".a.tmp"), (F::IN_MODIFY, ".a.tmp")],
                    Change::Complete,
                    &[],
                ),
                (
                    &[
                        (F::IN_CLOSE_WRITE, ".a.tmp"),
                        (F::IN_MOVED_FROM, ".a.tmp"),
                        (F::IN_MOVED_TO, "a.yaml"),
                    ],
                    Change::Complete,
                    &[],
                ),
            ],
            // A removal or a rename away is complete; one file still open holds the batch.
            &[
                (&[(F::IN_DELETE, "a.yaml")], Change::Complete, &[]),
                (
                    &[(F::IN_MODIFY, "b.yaml"), (F::IN_MOVED_FROM, "c.yaml")],
                    Change::Writing,
                    &["b.yaml"],
                ),
                (&[(F::IN_ATTRIB, "c.yaml")], Change::Writing, &["b.yaml"]),
                (&[(F::IN_DELETE, "b.yaml")], Change::Complete, &[]),
            ],
            // The directory itself went away.
            &[
                (&[(F::IN_MODIFY, "a.yaml")], Change::Writing, &["a.yaml"]),
                (&[(F::IN_DELETE_SELF, "")], Change::Gone, &["a.yaml"]),
            ],
        ];
        for (n, batches) in cases.iter().enumerate() {
            let mut writing = HashSet::new();
            for (events, want, open) in batches.iter() {
                let got = classify(
                    events
                        .iter()
                        .map(|(m, name)| (*m, (!name.is_empty()).then(|| OsStr::new(*name)))),
                    &mut writing,
                );
                let mut still: Vec<_> = writing
                    .iter()
                    .map(|n| n.to_string_lossy().to_string())
                    .collect();
                still.sort();
                assert_eq!(
                    (got, still),
                    (
                        *want,
                        open.iter().map(|s| s.to_string()).collect::<Vec<_>>()
                    ),
                    "case {n}, batch {events:?}"
                );
            }
        }
    }

    /// A valid manifest of pod `web`.
    const GOOD_MANIFEST: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: c\n    image: busybox:1.36\n";

    /// A file source of node `n1` on `dir`, with the store it feeds.
    fn file_source(dir: &Path) -> (FileSource, Arc<Mutex<PodStore>>) {
        let store = Arc::new(Mutex::new(PodStore::new(["file"])));
        let source = FileSource::new(
            dir.into(),
            "n1".into(),
            Duration::from_secs(20),
            store.clone(),
        );
        (source, store)
    }

    /// A FIFO, a 100 MiB sparse file and a file swapped for nothing: the scan finishes
    /// (before, reading the FIFO blocked it forever), skips each with a reason, and still
    /// reads the good manifest.
    #[test]
    fn a_fifo_and_an_oversized_file_are_skipped_without_blocking_the_scan() {
        let dir = tempfile::tempdir().unwrap();
        let good = GOOD_MANIFEST;
        std::fs::write(dir.path().join("web.yaml"), good).unwrap();
        let fifo = dir.path().join("fifo.yaml");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let sparse = dir.path().join("sparse.yaml");
        std::fs::File::create(&sparse)
            .unwrap()
            .set_len(100 << 20)
            .unwrap();
        let (mut source, store) = file_source(dir.path());
        let (done_tx, done) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            source.scan();
            let _ = done_tx.send(source);
        });
        let source = done
            .recv_timeout(Duration::from_secs(10))
            .expect("the scan must not block on a FIFO");
        assert_eq!(
            source.reported.get(&fifo).map(String::as_str),
            Some("not a regular file but a FIFO; skipped")
        );
        let big = source
            .reported
            .get(&sparse)
            .expect("the sparse file is reported");
        assert!(
            big.contains("104857600 bytes; the limit is 10485760"),
            "{big}"
        );
        let (snap, _) = store.lock().unwrap().subscribe();
        assert_eq!(snap.pods.len(), 1);
    }

    #[test]
    fn a_manifest_at_the_limit_is_read_and_one_byte_more_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.yaml");
        std::fs::write(&path, vec![b'#'; manifest::MAX_MANIFEST_BYTES]).unwrap();
        assert_eq!(
            read_manifest(&path).unwrap().len(),
            manifest::MAX_MANIFEST_BYTES
        );
        std::fs::write(&path, vec![b'#'; manifest::MAX_MANIFEST_BYTES + 1]).unwrap();
        let err = read_manifest(&path).unwrap_err().to_string();
        assert!(err.contains("the limit is"), "{err}");
    }

    fn names(store: &Arc<Mutex<PodStore>>) -> Vec<String> {
        let (snap, _) = store.lock().unwrap().subscribe();
        snap.pods
            .iter()
            .map(|p| {
                nodeagent_proto::k8s::decode_pod(&p.pod_json)
                    .unwrap()
                    .metadata
                    .name
                    .unwrap()
            })
            .collect()
    }

    /// A scan re-reads only the manifests that changed (upstream's file source reads the
    /// one file an inotify event names): beside many unchanged ones, a new or edited
    /// manifest is one read, and every edit is still seen, one of the same size too.
    #[test]
    fn a_scan_reads_only_the_manifests_that_changed() {
        // Scans as if the files had been written long before (see the racy rule).
        let later = || std::time::SystemTime::now() + 2 * RACY;
        let dir = tempfile::tempdir().unwrap();
        for i in 0..20 {
            std::fs::write(
                dir.path().join(format!("p{i:02}.yaml")),
                GOOD_MANIFEST.replace("web", &format!("p{i:02}")),
            )
            .unwrap();
        }
        let (mut source, store) = file_source(dir.path());
        source.scan_at(later());
        assert_eq!((source.reads, names(&store).len()), (20, 20));
        source.scan_at(later());
        assert_eq!(source.reads, 20, "nothing changed, nothing read");

        std::fs::write(
            dir.path().join("new.yaml"),
            GOOD_MANIFEST.replace("web", "new"),
        )
        .unwrap();
        source.scan_at(later());
        assert_eq!((source.reads, names(&store).len()), (21, 21));

        // Edits of the same size: rewritten in place (its times change), and written
        // beside and renamed over, as editors and kubeadm do (a new inode).
        let p00 = dir.path().join("p00.yaml");
        std::fs::write(&p00, GOOD_MANIFEST.replace("web", "q00")).unwrap();
        let p01 = dir.path().join("p01.yaml");
        let tmp = dir.path().join(".p01.yaml.tmp");
        std::fs::write(&tmp, GOOD_MANIFEST.replace("web", "q01")).unwrap();
        std::fs::rename(&tmp, &p01).unwrap();
        source.scan_at(later());
        assert_eq!(source.reads, 23);
        let shown = names(&store);
        for (now, was) in [("q00-n1", "p00-n1"), ("q01-n1", "p01-n1")] {
            assert!(shown.contains(&now.to_string()), "{shown:?}");
            assert!(!shown.contains(&was.to_string()), "{shown:?}");
        }

        std::fs::remove_file(dir.path().join("p02.yaml")).unwrap();
        source.scan_at(later());
        assert_eq!((source.reads, names(&store).len()), (23, 20));
    }

    /// The racy rule: a file changed within [`RACY`] before a scan is not trusted by its
    /// stamp, and is read again at the next scan; once its times are older, it is not.
    #[test]
    fn a_file_changed_just_before_a_scan_is_read_again_at_the_next() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("m.yaml"), GOOD_MANIFEST).unwrap();
        let (mut source, store) = file_source(dir.path());
        source.scan();
        assert!(source.stamps.is_empty(), "{:?}", source.stamps);
        source.scan();
        assert_eq!(source.reads, 2);
        source.scan_at(std::time::SystemTime::now() + 2 * RACY);
        source.scan_at(std::time::SystemTime::now() + 2 * RACY);
        assert_eq!(source.reads, 3);
        assert_eq!(names(&store), vec!["web-n1".to_string()]);
    }

    #[test]
    fn scan_reads_good_files_keeps_last_good_and_skips_dotfiles() {
        let dir = tempfile::tempdir().unwrap();
        let good = GOOD_MANIFEST;
        std::fs::write(dir.path().join("web.yaml"), good).unwrap();
        std::fs::write(
            dir.path().join(".hidden.yaml"),
            good.replace("web", "hidden"),
        )
        .unwrap();
        std::fs::write(dir.path().join("broken.yaml"), "a: [b").unwrap();
        let (mut source, store) = file_source(dir.path());
        source.scan();
        assert_eq!(names(&store), vec!["web-n1".to_string()]);
        assert!(store.lock().unwrap().all_sources_ready());

        // The good file turns bad: the pod it described stays.
        std::fs::write(dir.path().join("web.yaml"), "kind: [").unwrap();
        source.scan();
        assert_eq!(names(&store), vec!["web-n1".to_string()]);

        // Removed: gone.
        std::fs::remove_file(dir.path().join("web.yaml")).unwrap();
        source.scan();
        assert!(names(&store).is_empty());
    }
}
