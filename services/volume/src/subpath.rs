//! subPath mounts without the symlink escape of CVE-2017-1002101 (upstream
//! pkg/volume/util/subpath/subpath_linux.go): a subPath is resolved inside its volume with
//! `openat2(RESOLVE_BENEATH)`, so a symlink a container planted can never lead out of the
//! volume; missing directories are made one at a time relative to an fd (`doSafeMakeDir`);
//! and the opened fd, not the path, is bind-mounted at a stable path that CRI gets.

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag, open, openat2};
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sys::stat::{Mode, fchmod, fstat, mkdirat, stat};
use nodeagent_hostpath::{HostPath, PathError};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

/// Why a subPath could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum SubPathError {
    /// The subPath is not a relative path that stays below its volume.
    #[error("subPath {sub_path:?}: {source}")]
    Invalid { sub_path: String, source: PathError },
    /// Resolving the subPath leaves the volume (a symlink pointing out of it).
    #[error("subPath {sub_path:?} resolves outside of volume {volume:?}")]
    Escapes { volume: String, sub_path: String },
    /// A system call failed.
    #[error("subPath {sub_path:?}: {op} {path:?}: {errno}")]
    Sys {
        sub_path: String,
        op: &'static str,
        path: String,
        errno: Errno,
    },
    /// Making or removing a subPath bind mount failed.
    #[error("{op} {path:?}: {errno}")]
    Mount {
        op: &'static str,
        path: String,
        errno: Errno,
    },
}

/// One subPath to resolve: `sub_path` inside the volume directory `volume_dir`.
pub struct SubPath<'a> {
    pub volume_name: &'a str,
    pub volume_dir: &'a Path,
    pub sub_path: &'a str,
}

impl SubPath<'_> {
    fn sys(&self, op: &'static str, path: &str) -> impl FnOnce(Errno) -> SubPathError {
        let (sub_path, path) = (self.sub_path.to_string(), path.to_string());
        let volume = self.volume_name.to_string();
        move |errno| match errno {
            // RESOLVE_BENEATH refuses an escape with EXDEV; a magic link gives ELOOP.
            Errno::EXDEV | Errno::ELOOP => SubPathError::Escapes { volume, sub_path },
            errno => SubPathError::Sys {
                sub_path,
                op,
                path,
                errno,
            },
        }
    }

    /// Opens the subPath inside the volume, creating missing directories with the volume's
    /// mode; symlinks that stay inside the volume are followed, others refused.
    pub fn open_beneath(&self) -> Result<OwnedFd, SubPathError> {
        let parts = nodeagent_hostpath::relative_components(self.sub_path).map_err(|source| {
            SubPathError::Invalid {
                sub_path: self.sub_path.to_string(),
                source,
            }
        })?;
        let dir = self.volume_dir.to_string_lossy();
        let root = open(
            self.volume_dir,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(self.sys("open", &dir))?;
        let mode = Mode::from_bits_truncate(fstat(&root).map_err(self.sys("stat", &dir))?.st_mode);
        let mut current = root
            .try_clone()
            .map_err(|e| self.sys("dup", &dir)(io_errno(e)))?;
        for i in 0..parts.len() {
            let prefix = parts[..=i].join("/");
            current = match beneath(&root, &prefix, OFlag::O_PATH) {
                Err(Errno::ENOENT) => self.make_dir(&root, &current, &prefix, parts[i], mode)?,
                other => other.map_err(self.sys("open", &prefix))?,
            };
        }
        Ok(current)
    }

    /// mkdirat relative to the already resolved parent, then re-open beneath the volume root
    /// (the new entry may have been swapped for a symlink meanwhile) and set the mode.
    fn make_dir(
        &self,
        root: &OwnedFd,
        parent: &OwnedFd,
        prefix: &str,
        name: &str,
        mode: Mode,
    ) -> Result<OwnedFd, SubPathError> {
        match mkdirat(parent, name, mode) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(self.sys("mkdir", prefix)(e)),
        }
        let fd = beneath(root, prefix, OFlag::O_RDONLY | OFlag::O_DIRECTORY)
            .map_err(self.sys("open", prefix))?;
        fchmod(&fd, mode).map_err(self.sys("chmod", prefix))?;
        Ok(fd)
    }
}

fn beneath(root: &OwnedFd, path: &str, flags: OFlag) -> nix::Result<OwnedFd> {
    let how = OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    openat2(root, path, how)
}

fn io_errno(e: std::io::Error) -> Errno {
    Errno::from_raw(e.raw_os_error().unwrap_or(Errno::EIO as i32))
}

/// Bind-mounts the opened subPath at `target` (a directory or an empty file, as the source
/// is). Idempotent: a mount of the same file already at `target` is kept, another replaced.
pub fn bind_at(fd: &OwnedFd, target: &HostPath) -> Result<(), SubPathError> {
    let t = target.to_string_lossy();
    let err = |op: &'static str| {
        let t = t.clone();
        move |errno| SubPathError::Mount { op, path: t, errno }
    };
    let source = fstat(fd).map_err(err("stat"))?;
    if is_mount_point(target) {
        let existing = stat(target.as_path()).map_err(err("stat"))?;
        if (existing.st_dev, existing.st_ino) == (source.st_dev, source.st_ino) {
            return Ok(());
        }
        umount2(target.as_path(), MntFlags::MNT_DETACH).map_err(err("unmount"))?;
    }
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).map_err(|e| err("create")(io_errno(e)))?;
    }
    let is_dir = source.st_mode & 0o170000 == 0o040000;
    let created = if is_dir {
        std::fs::create_dir(target.as_path())
    } else {
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(target.as_path())
            .map(drop)
    };
    match created {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
            return Err(err("create")(io_errno(e)));
        }
        _ => {}
    }
    let proc_fd = format!("/proc/self/fd/{}", fd.as_raw_fd());
    mount(
        Some(proc_fd.as_str()),
        target.as_path(),
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(err("bind-mount"))
}

/// Unmounts every mount at or under `dir`, deepest first.
pub fn unmount_under(dir: &Path) -> Result<(), SubPathError> {
    let mut mounts = mounts_under(dir).map_err(|e| SubPathError::Mount {
        op: "read mounts under",
        path: dir.to_string_lossy().into_owned(),
        errno: io_errno(e),
    })?;
    mounts.sort_by_key(|m| std::cmp::Reverse(m.as_os_str().len()));
    for m in mounts {
        match umount2(&m, MntFlags::MNT_DETACH) {
            Ok(()) | Err(Errno::EINVAL) | Err(Errno::ENOENT) => {}
            Err(errno) => {
                return Err(SubPathError::Mount {
                    op: "unmount",
                    path: m.to_string_lossy().into_owned(),
                    errno,
                });
            }
        }
    }
    Ok(())
}

pub fn is_mount_point(path: &Path) -> bool {
    mounts_under(path).is_ok_and(|m| m.iter().any(|m| m == path))
}

/// Mount points at or under `dir`, from /proc/self/mountinfo.
pub fn mounts_under(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| PathBuf::from(unescape_mountinfo(m)))
        .filter(|m| m.starts_with(dir))
        .collect())
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(s: &str) -> String {
    let mut out = Vec::with_capacity(s.len());
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests;
