//! Pod volume stats (`pods[].volume`), as upstream's `fs_resource_analyzer`: the disk
//! usage of each volume is measured in the background at most once per
//! `volumeStatsAggPeriod` and the Summary reports the last measurement, so a request never
//! walks a tree itself. A volume appears once it has been measured (upstream reports
//! nothing for a pod before its first calculation either).
//!
//! Only emptyDir volumes are reported: of the kinds upstream has a metrics provider for
//! (emptyDir, configMap, secret, projected, downwardAPI), they are the only one this node
//! agent provides; hostPath volumes are not reported, as upstream.
//!
//! The walk counts like `du -x` (allocated blocks, each inode once) and `find -xdev`
//! (inodes): it never follows a symlink (every directory is opened relative to its parent
//! with `O_NOFOLLOW`, so a container cannot swap one in mid-walk), stays on the volume's
//! filesystem, and stops after [`MAX_ENTRIES`] entries or [`MAX_DEPTH`] levels, reporting
//! what it counted so far.

use super::host::{self, Statvfs};
use nix::dir::Dir;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{FileStat, Mode, SFlag};
use std::collections::{HashMap, HashSet};
use std::ffi::CString;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

/// The emptyDir plugin's directory under `<root-dir>/pods/<uid>/volumes/` (the volume
/// service's `layout::EMPTY_DIR`, upstream's name).
pub const EMPTY_DIR_PLUGIN: &str = "kubernetes.io~empty-dir";
/// Entries counted per volume at most; a bigger tree is reported as counted so far.
pub const MAX_ENTRIES: u64 = 1_000_000;
/// Directory levels descended at most (each level holds one open descriptor).
pub const MAX_DEPTH: usize = 128;

/// What one walk of a volume found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Allocated bytes (`st_blocks * 512`) of every inode, counted once.
    pub bytes: u64,
    /// Inodes, the volume's directory included.
    pub inodes: u64,
    /// False when the walk stopped at a bound.
    pub complete: bool,
}

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

/// The emptyDir volumes of pod `uid` on disk: (name, path), sorted by name. One directory
/// read; an absent directory means none.
pub fn empty_dirs(root_dir: &Path, uid: &str) -> Vec<(String, PathBuf)> {
    // A UID is one path component (the runtime's sandbox metadata, but checked anyway).
    if uid.is_empty() || uid.contains('/') || uid == "." || uid == ".." {
        return Vec::new();
    }
    let dir = root_dir
        .join("pods")
        .join(uid)
        .join("volumes")
        .join(EMPTY_DIR_PLUGIN);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut out: Vec<(String, PathBuf)> = entries
        .flatten()
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
                at_ns: super::collect::now_ns(),
                taken: Instant::now(),
            };
            // A volume whose pod went meanwhile is dropped by the next refresh.
            lock().insert(path, measured);
        }
    });
}

const DIR_FLAGS: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

/// Walks the tree at `dir` within the bounds above.
pub fn measure(dir: &Path) -> nix::Result<Usage> {
    let root = Dir::open(dir, DIR_FLAGS, Mode::empty())?;
    let st = nix::sys::stat::fstat(root.as_fd())?;
    let mut walk = Walk {
        dev: st.st_dev,
        usage: Usage {
            bytes: allocated(&st),
            inodes: 1,
            complete: true,
        },
        links: HashSet::new(),
    };
    let mut root = root;
    let subdirs = walk.scan(&mut root);
    let mut stack: Vec<(Dir, std::vec::IntoIter<CString>)> = vec![(root, subdirs.into_iter())];
    loop {
        let depth = stack.len();
        let Some((parent, pending)) = stack.last_mut() else {
            break;
        };
        let Some(name) = pending.next() else {
            stack.pop();
            continue;
        };
        if depth >= MAX_DEPTH {
            walk.usage.complete = false;
            continue;
        }
        // Gone, or replaced by a symlink (ELOOP) or a file (ENOTDIR) since the scan: skipped.
        let Ok(mut child) = Dir::openat(parent.as_fd(), name.as_c_str(), DIR_FLAGS, Mode::empty())
        else {
            continue;
        };
        // Replaced by a mount point since the scan: not ours to count.
        if !matches!(nix::sys::stat::fstat(child.as_fd()), Ok(s) if s.st_dev == walk.dev) {
            continue;
        }
        let subdirs = walk.scan(&mut child);
        stack.push((child, subdirs.into_iter()));
    }
    Ok(walk.usage)
}

struct Walk {
    dev: u64,
    usage: Usage,
    /// Inodes with several links already counted.
    links: HashSet<u64>,
}

impl Walk {
    /// Counts the entries of `dir`; returns its subdirectories on the same filesystem.
    fn scan(&mut self, dir: &mut Dir) -> Vec<CString> {
        let mut names = Vec::new();
        for entry in dir.iter().flatten() {
            let name = entry.file_name();
            if name == c"." || name == c".." {
                continue;
            }
            if self.usage.inodes + names.len() as u64 >= MAX_ENTRIES {
                self.usage.complete = false;
                break;
            }
            names.push(name.to_owned());
        }
        let mut subdirs = Vec::new();
        for name in names {
            let Ok(st) =
                nix::sys::stat::fstatat(dir.as_fd(), name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
            else {
                continue;
            };
            if st.st_dev != self.dev {
                continue;
            }
            let is_dir = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR;
            if !is_dir && st.st_nlink > 1 && !self.links.insert(st.st_ino) {
                continue;
            }
            self.usage.inodes += 1;
            self.usage.bytes += allocated(&st);
            if is_dir {
                subdirs.push(name);
            }
        }
        subdirs
    }
}

fn allocated(st: &FileStat) -> u64 {
    u64::try_from(st.st_blocks).unwrap_or(0).saturating_mul(512)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn blocks(p: &Path) -> u64 {
        std::fs::symlink_metadata(p).unwrap().blocks() * 512
    }

    #[test]
    fn counts_blocks_and_inodes_like_du_without_following_symlinks() {
        let tmp = tempfile::tempdir().unwrap();
        let vol = tmp.path().join("vol");
        std::fs::create_dir_all(vol.join("a/b")).unwrap();
        std::fs::write(vol.join("a/b/data"), vec![7u8; 1 << 20]).unwrap();
        std::fs::write(vol.join("small"), b"x").unwrap();
        // Hard links count once; a symlink to a big tree counts as itself only.
        std::fs::hard_link(vol.join("small"), vol.join("a/link")).unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("big"), vec![1u8; 4 << 20]).unwrap();
        std::os::unix::fs::symlink(&outside, vol.join("escape")).unwrap();

        let u = measure(&vol).unwrap();
        let want_bytes = [
            vol.clone(),
            vol.join("a"),
            vol.join("a/b"),
            vol.join("a/b/data"),
            vol.join("small"),
            vol.join("escape"),
        ]
        .iter()
        .map(|p| blocks(p))
        .sum::<u64>();
        assert_eq!(
            u,
            Usage {
                bytes: want_bytes,
                inodes: 6,
                complete: true
            }
        );
        assert!(u.bytes >= 1 << 20 && u.bytes < 2 << 20, "{u:?}");
    }

    #[test]
    fn a_symlinked_or_missing_volume_is_not_measured() {
        let tmp = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(tmp.path(), tmp.path().join("link")).unwrap();
        assert!(measure(&tmp.path().join("link")).is_err());
        assert!(measure(&tmp.path().join("missing")).is_err());
    }

    #[test]
    fn deep_trees_stop_at_the_depth_bound() {
        let tmp = tempfile::tempdir().unwrap();
        let mut p = tmp.path().join("vol");
        std::fs::create_dir(&p).unwrap();
        let root = p.clone();
        for _ in 0..MAX_DEPTH + 5 {
            p = p.join("d");
            std::fs::create_dir(&p).unwrap();
        }
        let u = measure(&root).unwrap();
        assert!(!u.complete);
        assert_eq!(u.inodes, MAX_DEPTH as u64 + 1);
    }

    #[test]
    fn lists_a_pods_empty_dirs_only() {
        let tmp = tempfile::tempdir().unwrap();
        let vols = tmp.path().join("pods/u1/volumes");
        std::fs::create_dir_all(vols.join(EMPTY_DIR_PLUGIN).join("data")).unwrap();
        std::fs::create_dir_all(vols.join(EMPTY_DIR_PLUGIN).join("cache")).unwrap();
        std::fs::create_dir_all(vols.join("kubernetes.io~host-path/h")).unwrap();
        let names: Vec<String> = empty_dirs(tmp.path(), "u1")
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(names, vec!["cache", "data"]);
        assert!(empty_dirs(tmp.path(), "u2").is_empty());
        assert!(empty_dirs(tmp.path(), "..").is_empty());
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
