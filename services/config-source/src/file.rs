//! The static pod file source: a directory of manifests (or one file), re-read on inotify
//! events and every `fileCheckFrequency`. Files whose names start with "." are ignored.

use crate::manifest::{self, Origin};
use crate::store::PodStore;
use k8s_openapi::api::core::v1::Pod;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use nodeagent_transport::Shutdown;
use std::collections::BTreeMap;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::unix::AsyncFd;

/// Re-reads after a change wait this long so that an editor's burst of writes is one read.
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
}

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
        }
    }

    pub async fn run(mut self, shutdown: Shutdown) {
        let mut watcher = None;
        loop {
            if watcher.is_none() {
                watcher = watch(&self.path)
                    .inspect_err(|e| tracing::debug!(path = %self.path.display(), error = %e, "inotify unavailable; relying on the periodic re-scan"))
                    .ok();
            }
            self.scan();
            let changed = async {
                match &watcher {
                    Some(w) => wait_for_change(w).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = shutdown.wait() => return,
                _ = tokio::time::sleep(self.period) => {}
                ok = changed => {
                    if !ok {
                        watcher = None; // the directory went away; watch again next round
                    }
                    tokio::time::sleep(SETTLE).await;
                    if let Some(w) = &watcher {
                        let _ = w.get_ref().0.read_events();
                    }
                }
            }
        }
    }

    /// Reads every manifest and hands the complete set to the store.
    pub fn scan(&mut self) {
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
        for file in files {
            let shown = file.display().to_string();
            let result = std::fs::read(&file)
                .map_err(|e| format!("cannot read: {e}"))
                .and_then(|data| manifest::decode_pod(&data))
                .and_then(|pod| manifest::static_pod(pod, Origin::File(&shown), &self.node_name));
            match result {
                Ok(pod) => {
                    self.reported.remove(&file);
                    good.insert(file, pod.clone());
                    pods.push(pod);
                }
                Err(reason) => {
                    if self.reported.get(&file) != Some(&reason) {
                        let kept = self.last_good.contains_key(&file);
                        tracing::error!(source = "file", path = %shown, %reason, kept_previous_version = kept, "invalid static pod manifest");
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
        crate::store::publish(&self.store, "file", pods);
    }
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

/// Waits for an inotify event; false when the watched path itself went away.
async fn wait_for_change(fd: &AsyncFd<InotifyFd>) -> bool {
    loop {
        let Ok(mut guard) = fd.readable().await else {
            return false;
        };
        match guard.try_io(|inner| {
            inner
                .get_ref()
                .0
                .read_events()
                .map_err(std::io::Error::from)
        }) {
            Ok(Ok(events)) => {
                let gone = events.iter().any(|e| {
                    e.mask.intersects(
                        AddWatchFlags::IN_DELETE_SELF
                            | AddWatchFlags::IN_MOVE_SELF
                            | AddWatchFlags::IN_IGNORED,
                    )
                });
                return !gone;
            }
            Ok(Err(_)) => return false,
            Err(_would_block) => continue,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scan_reads_good_files_keeps_last_good_and_skips_dotfiles() {
        let dir = tempfile::tempdir().unwrap();
        let good = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: c\n    image: busybox:1.36\n";
        std::fs::write(dir.path().join("web.yaml"), good).unwrap();
        std::fs::write(
            dir.path().join(".hidden.yaml"),
            good.replace("web", "hidden"),
        )
        .unwrap();
        std::fs::write(dir.path().join("broken.yaml"), "a: [b").unwrap();
        let store = Arc::new(Mutex::new(PodStore::new(["file"])));
        let mut source = FileSource::new(
            dir.path().into(),
            "n1".into(),
            Duration::from_secs(20),
            store.clone(),
        );
        source.scan();
        let names = |store: &Arc<Mutex<PodStore>>| {
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
                .collect::<Vec<_>>()
        };
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
