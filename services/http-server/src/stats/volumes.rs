//! Pod volume stats (`pods[].volume`), as upstream's `fs_resource_analyzer`: the disk
//! usage of each volume is measured in the background at most once per
//! `volumeStatsAggPeriod` and the Summary reports the last measurement, so a request never
//! walks a tree itself. A volume appears once it has been measured (upstream reports
//! nothing for a pod before its first calculation either).
//!
//! The volume kinds upstream has a metrics provider for are reported: emptyDir, configMap,
//! secret, projected and downwardAPI; hostPath volumes are not, as upstream.
//!
//! The walk is `nodeagent_du::measure` (like `du -x`, never following a symlink, bounded).

use super::host::{self, Statvfs};
pub use nodeagent_du::{MAX_DEPTH, MAX_ENTRIES, Usage, measure};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

/// The plugin directories under `<root-dir>/pods/<uid>/volumes/` of the volume kinds
/// with stats (the volume service's names, upstream's).
pub const PLUGINS: [&str; 5] = [
    "kubernetes.io~empty-dir",
    "kubernetes.io~configmap",
    "kubernetes.io~secret",
    "kubernetes.io~projected",
    "kubernetes.io~downward-api",
];
/// A volume's last measurement.
#[derive(Debug, Clone, Copy)]
pub struct Measured {
    pub usage: Usage,
    /// The volume's filesystem, when statvfs answered.
    pub fs: Option<(u64, u64, u64, u64)>,
    /// When it was taken, in nanoseconds since the epoch (the stats' `time`).
    pub at_ns: i64,
    taken: Instant,
}

impl Measured {
    /// (capacity, available, inodes, inodes free) of the volume's filesystem.
    pub fn statvfs(&self) -> Option<Statvfs> {
        self.fs
            .map(|(capacity, available, inodes, inodes_free)| Statvfs {
                capacity,
                available,
                used: capacity.saturating_sub(available),
                inodes,
                inodes_free,
            })
    }
}

/// The last measurement of every volume the Summary asked about, by path.
static CACHE: LazyLock<Mutex<HashMap<PathBuf, Measured>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));
/// Set while a background walk runs; one at a time.
static WALKING: AtomicBool = AtomicBool::new(false);

/// The volumes of pod `uid` on disk that have stats: (name, path), sorted by name. One
/// directory read per plugin; an absent directory means none.
pub fn pod_volumes(root_dir: &Path, uid: &str) -> Vec<(String, PathBuf)> {
    // A UID is one path component (the runtime's sandbox metadata, but checked anyway).
    if uid.is_empty() || uid.contains('/') || uid == "." || uid == ".." {
        return Vec::new();
    }
    let volumes = root_dir.join("pods").join(uid).join("volumes");
    let mut out: Vec<(String, PathBuf)> = PLUGINS
        .iter()
        .filter_map(|plugin| std::fs::read_dir(volumes.join(plugin)).ok())
        .flat_map(|entries| entries.flatten())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| Some((e.file_name().into_string().ok()?, e.path())))
        .collect();
    out.sort();
    out
}

/// The last measurement of the volume at `path`, if there is one.
pub fn cached(path: &Path) -> Option<Measured> {
    lock().get(path).copied()
}

fn lock() -> std::sync::MutexGuard<'static, HashMap<PathBuf, Measured>> {
    CACHE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Forgets volumes not in `wanted` (their pods are gone) and, unless a walk is already
/// running, measures in the background, one after the other, those of `wanted` with no
/// measurement or one at least `period` old. Returns at once; must be called within a
/// Tokio runtime.
pub fn refresh(wanted: Vec<PathBuf>, period: Duration) {
    let stale: Vec<PathBuf> = {
        let mut cache = lock();
        let keep: HashSet<&PathBuf> = wanted.iter().collect();
        cache.retain(|p, _| keep.contains(p));
        wanted
            .iter()
            .filter(|p| cache.get(*p).is_none_or(|m| m.taken.elapsed() >= period))
            .cloned()
            .collect()
    };
    if stale.is_empty() || WALKING.swap(true, Ordering::AcqRel) {
        return;
    }
    tokio::task::spawn_blocking(move || {
        // Cleared however the walks end.
        struct Done;
        impl Drop for Done {
            fn drop(&mut self) {
                WALKING.store(false, Ordering::Release);
            }
        }
        let _done = Done;
        for path in stale {
            let started = Instant::now();
            let usage = match measure(&path) {
                Ok(u) => u,
                Err(e) => {
                    tracing::debug!(path = %path.display(), error = %e, "cannot measure the volume");
                    continue;
                }
            };
            if !usage.complete {
                tracing::warn!(
                    path = %path.display(),
                    entries = usage.inodes,
                    "volume too big to measure in full (over {MAX_ENTRIES} entries or {MAX_DEPTH} levels): its stats count part of it"
                );
            }
            tracing::debug!(path = %path.display(), bytes = usage.bytes, inodes = usage.inodes, took = ?started.elapsed(), "measured a volume");
            let fs =
                host::statvfs(&path).map(|s| (s.capacity, s.available, s.inodes, s.inodes_free));
            let measured = Measured {
                usage,
                fs,
                at_ns: nodeagent_cri::now_nanos(),
                taken: Instant::now(),
            };
            // A volume whose pod went meanwhile is dropped by the next refresh.
            lock().insert(path, measured);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_a_pods_volumes_with_stats_only() {
        let tmp = tempfile::tempdir().unwrap();
        let vols = tmp.path().join("pods/u1/volumes");
        std::fs::create_dir_all(vols.join(PLUGINS[0]).join("data")).unwrap();
        std::fs::create_dir_all(vols.join(PLUGINS[0]).join("cache")).unwrap();
        std::fs::create_dir_all(vols.join("kubernetes.io~secret/token")).unwrap();
        std::fs::create_dir_all(vols.join("kubernetes.io~host-path/h")).unwrap();
        let names: Vec<String> = pod_volumes(tmp.path(), "u1")
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(names, vec!["cache", "data", "token"]);
        assert!(pod_volumes(tmp.path(), "u2").is_empty());
        assert!(pod_volumes(tmp.path(), "..").is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn refresh_measures_in_the_background_and_forgets_gone_volumes() {
        let tmp = tempfile::tempdir().unwrap();
        let vol = tmp.path().join("refresh-vol");
        std::fs::create_dir(&vol).unwrap();
        std::fs::write(vol.join("f"), vec![3u8; 64 << 10]).unwrap();
        assert!(cached(&vol).is_none());
        let first = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                refresh(vec![vol.clone()], Duration::from_secs(3600));
                if let Some(m) = cached(&vol) {
                    return m;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("measured within 10 s");
        assert!(first.usage.bytes >= 64 << 10);
        assert!(first.statvfs().is_some_and(|s| s.capacity > 0));
        // Within the period, nothing is walked again: new data is not seen yet.
        std::fs::write(vol.join("g"), vec![3u8; 1 << 20]).unwrap();
        refresh(vec![vol.clone()], Duration::from_secs(3600));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(cached(&vol).unwrap().usage, first.usage);
        // A volume no longer asked about is forgotten.
        refresh(Vec::new(), Duration::from_secs(3600));
        assert!(cached(&vol).is_none());
    }
}
