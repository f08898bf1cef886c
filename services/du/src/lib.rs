//! Disk usage of a volume as `du -x` (allocated blocks, each inode once) and `find -xdev`
//! (inodes) count it: the walk never follows a symlink (every directory is opened relative
//! to its parent with `O_NOFOLLOW`, so a container cannot swap one in mid-walk), stays on
//! the volume's filesystem, and stops after [`MAX_ENTRIES`] entries or [`MAX_DEPTH`]
//! levels, reporting what it counted so far. Used for the Summary API's volume stats and
//! for emptyDir `sizeLimit`.

use nix::dir::Dir;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{FileStat, Mode, SFlag};
use std::collections::HashSet;
use std::ffi::CString;
use std::os::fd::AsFd;
use std::path::Path;

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
}
