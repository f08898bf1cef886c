//! What a service keeps on disk under its root directory (`<root-dir>/<service>/…`) so that a
//! restart carries on where it left off: written so that a reader, or a restart after a
//! crash, finds the old file or the new one, never a part of either.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// The mode of the root directory, `pods/` and each pod's directory (upstream's
/// `setupDataDirs` and `makePodDataDirs`: 0750). What lies below (emptyDirs a container of
/// any uid writes, secret and token volumes a container of any uid reads) is kept from the
/// node's other users by these directories alone.
pub const PRIVATE_DIR_MODE: u32 = 0o750;

/// Makes `dir` (and any missing parent) with [`PRIVATE_DIR_MODE`], and sets that mode on
/// `dir` if it existed with another (an older agent made it 0755).
pub fn private_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(PRIVATE_DIR_MODE)
        .create(dir)?;
    let meta = std::fs::symlink_metadata(dir)?;
    if !meta.is_dir() {
        return Err(std::io::Error::other(format!(
            "{} is not a directory",
            dir.display()
        )));
    }
    if meta.permissions().mode() & 0o7777 != PRIVATE_DIR_MODE {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(PRIVATE_DIR_MODE))?;
    }
    Ok(())
}

/// The node's root directory and its `pods/`, private to root (see [`PRIVATE_DIR_MODE`]).
pub fn prepare_root_dir(root: &Path) -> std::io::Result<()> {
    private_dir(root)?;
    private_dir(&root.join("pods"))
}

/// Writes `bytes` to `path` through a temporary file of this process's own
/// (`<path>.<pid>.tmp`, so that processes writing the same file do not race on it), synced,
/// renamed over it; makes the directory first (0700). The file is 0600 whatever the umask:
/// state files hold pod specs and node details that only the agent reads.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    replace(path, bytes, true)
}

/// [`write_atomically`] without the sync: for a file rewritten often whose loss in a
/// machine crash costs nothing (a torn or empty file must be refused by its reader).
pub fn write_unsynced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    replace(path, bytes, false)
}

fn replace(path: &Path, bytes: &[u8], sync: bool) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let mut tmp_name = path.as_os_str().to_owned();
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp = std::path::PathBuf::from(tmp_name);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    file.write_all(bytes)?;
    if sync {
        file.sync_all()?;
    }
    drop(file);
    std::fs::rename(&tmp, path)
}

/// [`write_atomically`] of `value` as JSON.
pub fn write_json(path: &Path, value: &impl serde::Serialize) -> std::io::Result<()> {
    write_atomically(path, &serde_json::to_vec(value)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_file_whole_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/state.json");
        write_json(&path, &serde_json::json!({"a": 1})).unwrap();
        write_json(&path, &serde_json::json!({"a": 2})).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), r#"{"a":2}"#);
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("state.json")]);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn private_dirs_are_made_and_mended_to_0750() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir(&root).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
        prepare_root_dir(&root).unwrap();
        private_dir(&root.join("pods/u1")).unwrap();
        for d in ["root", "root/pods", "root/pods/u1"] {
            let mode = std::fs::metadata(dir.path().join(d))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o7777, 0o750, "{d}");
        }
        std::fs::write(dir.path().join("file"), "").unwrap();
        assert!(private_dir(&dir.path().join("file")).is_err());
    }
}
