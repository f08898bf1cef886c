//! Atomic projection of a set of files into a volume directory (upstream
//! pkg/volume/util/atomic_writer.go): what configMap, secret, downwardAPI and projected
//! volumes are made of, so that a container reading them never sees half an update.
//!
//! The layout, for a payload `{"podName", "user/labels"}`:
//!
//! ```text
//! <target>/..2026_01_31_12_00_00.123456789_0/podName      the real files, in a hidden
//! <target>/..2026_01_31_12_00_00.123456789_0/user/labels  timestamped directory
//! <target>/..data    -> ..2026_01_31_12_00_00.123456789_0
//! <target>/podName   -> ..data/podName                    one link per top-level name
//! <target>/user      -> ..data/user
//! ```
//!
//! An update writes a complete new timestamped directory, points `..data_tmp` at it and
//! renames `..data_tmp` over `..data`; rename(2) is atomic, so every path resolved through
//! `..data` sees either the old or the new directory, never a mix. Old names are unlinked
//! and the old directory removed only after the swap.
//!
//! # Why a hostile name cannot escape the target directory
//!
//! The target directory is ours (created by the volume service, mounted read-only into
//! containers), but payload paths are user data: configMap keys, `items[].path`. So:
//!
//! - every path is checked first ([`validate_path`], upstream's `validatePath`): relative,
//!   no `..` element, first element not starting with `..` (that prefix is reserved for the
//!   writer's own entries), length limits; one bad path refuses the whole payload before
//!   anything is touched;
//! - everything is done relative to directory fds with the `*at` calls, one path component
//!   at a time, with `O_NOFOLLOW`; files are created with `O_CREAT | O_EXCL` in a directory
//!   this call has just made with `mkdirat`, so no pre-existing entry (let alone a symlink)
//!   is ever written through;
//! - the previous version is read with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`, and
//!   `..data` must name a hidden entry of the target directory itself;
//! - a top-level name already present as something other than our own link is refused, and a
//!   link with a foreign target is replaced, never followed.
//!
//! Like upstream, the writer is not safe for concurrent use on one directory: the caller
//! serialises writes per volume.

use nix::errno::Errno;
use nix::fcntl::{
    AtFlags, OFlag, OpenHow, ResolveFlag, open, openat, openat2, readlinkat, renameat,
};
use nix::sys::stat::{FileStat, Mode, SFlag, fchmod, fstat, fstatat, mkdirat};
use nix::unistd::{Gid, Uid, UnlinkatFlags, fchown, symlinkat, unlinkat};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The link to the current timestamped directory; watch it to learn of updates.
pub const DATA_DIR: &str = "..data";
/// The link that is renamed over [`DATA_DIR`].
const NEW_DATA_DIR: &str = "..data_tmp";
const MAX_FILE_NAME_LENGTH: usize = 255;
const MAX_PATH_LENGTH: usize = 4096;

/// One file of a payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileProjection {
    pub data: Vec<u8>,
    /// Permission bits (at most `0o7777`), applied whatever the umask.
    pub mode: u32,
    /// The file's owner (upstream's `FsUser`); `None` leaves it to the writer's user.
    pub uid: Option<u32>,
    /// The file's group (the pod's `fsGroup`); `None` leaves it to the writer's group.
    pub gid: Option<u32>,
}

impl FileProjection {
    /// A file owned by the writer.
    pub fn new(data: impl Into<Vec<u8>>, mode: u32) -> Self {
        Self {
            data: data.into(),
            mode,
            uid: None,
            gid: None,
        }
    }
}

/// The files of one volume, keyed by their path relative to the volume.
pub type Payload = BTreeMap<String, FileProjection>;

/// Why a payload was not written.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// A payload path is not a safe relative path; nothing was written.
    #[error("invalid path: {0}")]
    InvalidPath(String),
    /// A file mode has bits beyond the permission, setuid, setgid and sticky bits.
    #[error("invalid mode {mode:#o} for {path:?}: must be at most 0o7777")]
    InvalidMode { path: String, mode: u32 },
    /// The target directory holds an entry the writer did not make.
    #[error("{path:?}: {reason}")]
    Unexpected { path: PathBuf, reason: &'static str },
    /// A filesystem operation failed.
    #[error("{op} {path:?}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Makes `target_dir` hold exactly `payload`, atomically. Returns whether anything changed:
/// an identical payload (same paths, contents, modes and owners) writes nothing.
/// `target_dir` must exist and belong to this writer alone.
pub fn write(target_dir: &Path, payload: &Payload) -> Result<bool, WriteError> {
    let files = validate_payload(payload)?;
    let target = TargetDir::open(target_dir)?;
    let old = target.current_data_dir()?;
    let unchanged = match &old {
        Some(old) => target.holds(old, &files)?,
        None => false,
    };
    if unchanged {
        // Upstream #121472: the data is current, but a link may be missing after a crash.
        target.link_visible_names(&files)?;
        target.remove_stale_entries(&files, old.as_deref())?;
        return Ok(false);
    }
    let new = target.new_data_dir()?;
    let published = target
        .fill(&new, &files)
        .and_then(|()| target.link_visible_names(&files))
        .and_then(|()| target.swap_data_dir(&new));
    if let Err(e) = published {
        // Best effort: the next write removes leftovers anyway.
        let _ = std::fs::remove_dir_all(target.path.join(&new));
        return Err(e);
    }
    target.remove_stale_entries(&files, Some(&new))?;
    Ok(true)
}

/// Upstream's `validatePath`, with upstream's wording; the path must be relative, must
/// not contain a `..` element, must not start with `..` (reserved for the writer's own
/// entries), and must respect the name and path length limits. Returns the cleaned path
/// (empty and `.` elements dropped), which is checked again: `./..data` is refused too.
pub fn validate_path(path: &str) -> Result<String, WriteError> {
    let bad = |why: String| Err(WriteError::InvalidPath(why));
    if path.is_empty() {
        return bad(format!("must not be empty: {path:?}"));
    }
    if path.starts_with('/') {
        return bad(format!("must be relative path: {path}"));
    }
    if path.len() > MAX_PATH_LENGTH {
        return bad(format!(
            "must be less than or equal to {MAX_PATH_LENGTH} characters"
        ));
    }
    if path.contains('\0') {
        return bad(format!("must not contain a NUL byte: {path:?}"));
    }
    let items: Vec<&str> = path.split('/').collect();
    for item in &items {
        if *item == ".." {
            return bad(format!("must not contain '..': {path}"));
        }
        if item.len() > MAX_FILE_NAME_LENGTH {
            return bad(format!(
                "filenames must be less than or equal to {MAX_FILE_NAME_LENGTH} characters"
            ));
        }
    }
    let clean: Vec<&str> = items
        .into_iter()
        .filter(|i| !i.is_empty() && *i != ".")
        .collect();
    match clean.first() {
        None => bad(format!("must name a file: {path}")),
        Some(first) if first.starts_with("..") => bad(format!("must not start with '..': {path}")),
        Some(_) => Ok(clean.join("/")),
    }
}

/// Validates every path and mode; maps cleaned path -> file. Two keys naming the same file
/// (`a//b`, `a/b`) or a file inside another file (`a`, `a/b`) refuse the payload.
fn validate_payload(payload: &Payload) -> Result<BTreeMap<String, &FileProjection>, WriteError> {
    let mut files = BTreeMap::new();
    let mut raw_of = BTreeMap::new();
    for (raw, file) in payload {
        let clean = validate_path(raw)?;
        if file.mode & !0o7777 != 0 {
            return Err(WriteError::InvalidMode {
                path: raw.clone(),
                mode: file.mode,
            });
        }
        if let Some(other) = raw_of.insert(clean.clone(), raw) {
            return Err(WriteError::InvalidPath(format!(
                "{other} and {raw} name the same file"
            )));
        }
        files.insert(clean, file);
    }
    for path in files.keys() {
        for dir in parents(path) {
            if files.contains_key(dir) {
                return Err(WriteError::InvalidPath(format!(
                    "{path} is inside {dir}, which is a file"
                )));
            }
        }
    }
    Ok(files)
}

/// `a/b/c` -> `a`, `a/b`.
fn parents(path: &str) -> impl Iterator<Item = &str> {
    path.match_indices('/').map(|(i, _)| &path[..i])
}

/// `a/b/c` -> `a`.
fn top_level(path: &str) -> &str {
    path.split('/').next().unwrap_or(path)
}

/// A name of the writer's own: `..data`, `..data_tmp`, the timestamped directories.
fn is_reserved(name: &str) -> bool {
    name.starts_with("..") && name != ".."
}

/// The target directory, open.
struct TargetDir {
    fd: OwnedFd,
    path: PathBuf,
}

impl TargetDir {
    fn open(path: &Path) -> Result<Self, WriteError> {
        let fd = open(
            path,
            OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(sys("open", path))?;
        Ok(Self {
            fd,
            path: path.to_path_buf(),
        })
    }

    fn at(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// The timestamped directory `..data` names, if there is one. It must be a hidden
    /// entry of this directory; anything else was not made by this writer.
    fn current_data_dir(&self) -> Result<Option<String>, WriteError> {
        match readlinkat(&self.fd, DATA_DIR) {
            Ok(target) => {
                let target = target.to_string_lossy().into_owned();
                if is_reserved(&target)
                    && !target.contains('/')
                    && target != DATA_DIR
                    && target != NEW_DATA_DIR
                {
                    Ok(Some(target))
                } else {
                    Err(WriteError::Unexpected {
                        path: self.at(DATA_DIR),
                        reason: "does not point to a timestamped directory of this volume",
                    })
                }
            }
            Err(Errno::ENOENT) => Ok(None),
            Err(Errno::EINVAL) => Err(WriteError::Unexpected {
                path: self.at(DATA_DIR),
                reason: "is not a symlink",
            }),
            Err(errno) => Err(sys("readlink", &self.at(DATA_DIR))(errno)),
        }
    }

    /// Whether the timestamped directory `old` holds exactly `files`: the same paths (and
    /// no others), contents, modes and, where the payload names one, owners.
    fn holds(
        &self,
        old: &str,
        files: &BTreeMap<String, &FileProjection>,
    ) -> Result<bool, WriteError> {
        let dir = match openat(
            &self.fd,
            old,
            OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            // Gone, or not a directory: rewrite.
            Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP) => return Ok(false),
            Err(errno) => return Err(sys("open", &self.at(old))(errno)),
        };
        let mut found = Tree::default();
        found.walk(&dir, "", &self.at(old))?;
        let expected_dirs: BTreeSet<&str> = files.keys().flat_map(|p| parents(p)).collect();
        if found.other
            || !found
                .files
                .iter()
                .map(String::as_str)
                .eq(files.keys().map(String::as_str))
            || !found
                .dirs
                .iter()
                .map(String::as_str)
                .eq(expected_dirs.iter().copied())
        {
            return Ok(false);
        }
        for (path, want) in files {
            if !same_file(&dir, path, want).map_err(sys("read", &self.at(old).join(path)))? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Makes a new, empty timestamped directory, mode 0755 whatever the umask.
    fn new_data_dir(&self) -> Result<String, WriteError> {
        static SEQUENCE: AtomicU64 = AtomicU64::new(0);
        loop {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            let name = format!(
                "..{}.{:09}_{}",
                utc_timestamp(now.as_secs()),
                now.subsec_nanos(),
                SEQUENCE.fetch_add(1, Ordering::Relaxed)
            );
            match mkdirat(&self.fd, name.as_str(), Mode::from_bits_truncate(0o755)) {
                Ok(()) => {
                    let fd = open_dir_at(&self.fd, &name).map_err(sys("open", &self.at(&name)))?;
                    fchmod(&fd, Mode::from_bits_truncate(0o755))
                        .map_err(sys("chmod", &self.at(&name)))?;
                    return Ok(name);
                }
                Err(Errno::EEXIST) => continue,
                Err(errno) => return Err(sys("mkdir", &self.at(&name))(errno)),
            }
        }
    }

    /// Writes every file into the fresh timestamped directory `new`.
    fn fill(&self, new: &str, files: &BTreeMap<String, &FileProjection>) -> Result<(), WriteError> {
        let root = open_dir_at(&self.fd, new).map_err(sys("open", &self.at(new)))?;
        for (path, file) in files {
            let full = self.at(new).join(path);
            let mut parts: Vec<&str> = path.split('/').collect();
            let name = parts.pop().unwrap_or(path);
            let mut parent = None::<OwnedFd>;
            for part in parts {
                let at = parent.as_ref().unwrap_or(&root);
                match mkdirat(at, part, Mode::from_bits_truncate(0o755)) {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(errno) => return Err(sys("mkdir", &full)(errno)),
                }
                let fd = open_dir_at(at, part).map_err(sys("open", &full))?;
                fchmod(&fd, Mode::from_bits_truncate(0o755)).map_err(sys("chmod", &full))?;
                parent = Some(fd);
            }
            let at = parent.as_ref().unwrap_or(&root);
            write_new_file(at, name, file).map_err(sys("write", &full))?;
        }
        Ok(())
    }

    /// `<name> -> ..data/<name>` for every top-level name of the payload.
    fn link_visible_names(
        &self,
        files: &BTreeMap<String, &FileProjection>,
    ) -> Result<(), WriteError> {
        let names: BTreeSet<&str> = files.keys().map(|p| top_level(p)).collect();
        for name in names {
            let want = format!("{DATA_DIR}/{name}");
            let path = self.at(name);
            match fstatat(&self.fd, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
                Err(Errno::ENOENT) => {}
                Ok(st) if is_symlink(&st) => {
                    let current = readlinkat(&self.fd, name).map_err(sys("readlink", &path))?;
                    if current.to_str() == Some(want.as_str()) {
                        continue;
                    }
                    // A link we did not make: replaced, never followed.
                    unlinkat(&self.fd, name, UnlinkatFlags::NoRemoveDir)
                        .map_err(sys("unlink", &path))?;
                }
                Ok(_) => {
                    return Err(WriteError::Unexpected {
                        path,
                        reason: "is not a link made by the atomic writer; refusing to replace it",
                    });
                }
                Err(errno) => return Err(sys("stat", &path)(errno)),
            }
            symlinkat(want.as_str(), &self.fd, name).map_err(sys("symlink", &path))?;
        }
        Ok(())
    }

    /// Points `..data` at `new` in one rename.
    fn swap_data_dir(&self, new: &str) -> Result<(), WriteError> {
        let tmp = self.at(NEW_DATA_DIR);
        // Left by an interrupted write (upstream would fail on it forever).
        match unlinkat(&self.fd, NEW_DATA_DIR, UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => {}
            Err(errno) => return Err(sys("unlink", &tmp)(errno)),
        }
        symlinkat(new, &self.fd, NEW_DATA_DIR).map_err(sys("symlink", &tmp))?;
        renameat(&self.fd, NEW_DATA_DIR, &self.fd, DATA_DIR).map_err(|errno| {
            let _ = unlinkat(&self.fd, NEW_DATA_DIR, UnlinkatFlags::NoRemoveDir);
            sys("rename", &tmp)(errno)
        })
    }

    /// After the swap: unlinks our links for names no longer in the payload, and every
    /// hidden entry but `..data` and `current` (the old directory, and any left by an
    /// interrupted write). Entries the writer did not make are left alone.
    fn remove_stale_entries(
        &self,
        files: &BTreeMap<String, &FileProjection>,
        current: Option<&str>,
    ) -> Result<(), WriteError> {
        let names: BTreeSet<&str> = files.keys().map(|p| top_level(p)).collect();
        let entries = std::fs::read_dir(&self.path).map_err(sys("read", &self.path))?;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = self.at(&name);
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if is_reserved(&name) {
                if name == DATA_DIR || Some(name.as_str()) == current {
                    continue;
                }
                if kind.is_dir() {
                    // std's remove_dir_all does not follow symlinks (openat + O_NOFOLLOW).
                    std::fs::remove_dir_all(&path).map_err(sys("remove", &path))?;
                } else {
                    std::fs::remove_file(&path).map_err(sys("remove", &path))?;
                }
            } else if kind.is_symlink() && !names.contains(name.as_str()) {
                let ours = readlinkat(&self.fd, name.as_str())
                    .is_ok_and(|t| t.to_str() == Some(&format!("{DATA_DIR}/{name}")));
                if ours {
                    unlinkat(&self.fd, name.as_str(), UnlinkatFlags::NoRemoveDir)
                        .map_err(sys("unlink", &path))?;
                }
            }
        }
        Ok(())
    }
}

/// What a timestamped directory holds, as paths relative to it.
#[derive(Default)]
struct Tree {
    files: BTreeSet<String>,
    dirs: BTreeSet<String>,
    /// A symlink, device, socket...: never written by us, so the directory is not current.
    other: bool,
}

impl Tree {
    fn walk(&mut self, dir: &OwnedFd, prefix: &str, path: &Path) -> Result<(), WriteError> {
        let listing = nix::dir::Dir::openat(
            dir,
            ".",
            OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(sys("open", path))?;
        for entry in listing {
            let entry = entry.map_err(sys("read", path))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name == "." || name == ".." {
                continue;
            }
            let rel = if prefix.is_empty() {
                name.clone()
            } else {
                format!("{prefix}/{name}")
            };
            let st = fstatat(dir, name.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
                .map_err(sys("stat", &path.join(&name)))?;
            match SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) {
                SFlag::S_IFREG => {
                    self.files.insert(rel);
                }
                SFlag::S_IFDIR => {
                    let sub = open_dir_at(dir, &name).map_err(sys("open", &path.join(&name)))?;
                    self.walk(&sub, &rel, &path.join(&name))?;
                    self.dirs.insert(rel);
                }
                _ => self.other = true,
            }
        }
        Ok(())
    }
}

/// Whether `dir/path` is a regular file with `want`'s content, mode and owners. Resolved
/// beneath `dir` without following any symlink.
fn same_file(dir: &OwnedFd, path: &str, want: &FileProjection) -> std::io::Result<bool> {
    let how = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
        .resolve(
            ResolveFlag::RESOLVE_BENEATH
                | ResolveFlag::RESOLVE_NO_SYMLINKS
                | ResolveFlag::RESOLVE_NO_MAGICLINKS,
        );
    let fd = match openat2(dir, path, how) {
        Ok(fd) => fd,
        Err(Errno::ENOENT | Errno::ELOOP | Errno::EXDEV) => return Ok(false),
        Err(errno) => return Err(errno.into()),
    };
    let st = fstat(&fd)?;
    if !is_regular(&st)
        || st.st_mode & 0o7777 != want.mode
        || want.uid.is_some_and(|u| u != st.st_uid)
        || want.gid.is_some_and(|g| g != st.st_gid)
        || u64::try_from(st.st_size).ok() != Some(want.data.len() as u64)
    {
        return Ok(false);
    }
    let mut content = Vec::with_capacity(want.data.len());
    std::fs::File::from(fd).read_to_end(&mut content)?;
    Ok(content == want.data)
}

/// Creates `name` in `dir` (never an existing entry, never through a link), then sets its
/// owner and mode; the owner first, as chown clears setuid/setgid bits.
fn write_new_file(dir: &OwnedFd, name: &str, file: &FileProjection) -> std::io::Result<()> {
    let fd = openat(
        dir,
        name,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o600),
    )?;
    if file.uid.is_some() || file.gid.is_some() {
        fchown(
            &fd,
            file.uid.map(Uid::from_raw),
            file.gid.map(Gid::from_raw),
        )?;
    }
    fchmod(&fd, Mode::from_bits_truncate(file.mode))?;
    std::fs::File::from(fd).write_all(&file.data)
}

fn open_dir_at(dir: &OwnedFd, name: &str) -> Result<OwnedFd, Errno> {
    openat(
        dir,
        name,
        OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
}

fn is_symlink(st: &FileStat) -> bool {
    st.st_mode & SFlag::S_IFMT.bits() == SFlag::S_IFLNK.bits()
}

fn is_regular(st: &FileStat) -> bool {
    st.st_mode & SFlag::S_IFMT.bits() == SFlag::S_IFREG.bits()
}

fn sys<E: Into<std::io::Error>>(op: &'static str, path: &Path) -> impl FnOnce(E) -> WriteError {
    let path = path.to_path_buf();
    move |e| WriteError::Io {
        op,
        path,
        source: e.into(),
    }
}

/// `2006_01_02_15_04_05` in UTC, as upstream names its directories.
fn utc_timestamp(unix_secs: u64) -> String {
    let days = unix_secs / 86_400;
    let secs = unix_secs % 86_400;
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}_{m:02}_{d:02}_{:02}_{:02}_{:02}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests;
