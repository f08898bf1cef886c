//! subPath resolution against real directories (tempdirs); the bind-mount tests need root.

use super::*;
use std::os::unix::fs::{PermissionsExt, symlink};

fn volume() -> (tempfile::TempDir, PathBuf) {
    let root = tempfile::tempdir().unwrap();
    let vol = root.path().join("vol");
    std::fs::create_dir(&vol).unwrap();
    std::fs::set_permissions(&vol, std::fs::Permissions::from_mode(0o777)).unwrap();
    (root, vol)
}

fn open(vol: &Path, sub: &str) -> Result<OwnedFd, SubPathError> {
    SubPath {
        volume_name: "data",
        volume_dir: vol,
        sub_path: sub,
    }
    .open_beneath()
}

fn real_path(fd: &OwnedFd) -> PathBuf {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap()
}

#[test]
fn a_symlink_to_the_host_root_is_refused() {
    let (_root, vol) = volume();
    symlink("/", vol.join("evil")).unwrap();
    let err = open(&vol, "evil").unwrap_err();
    assert!(matches!(err, SubPathError::Escapes { .. }), "{err}");
    assert_eq!(
        err.to_string(),
        "subPath \"evil\" resolves outside of volume \"data\""
    );
    // Nor through it, nor by creating below it.
    assert!(matches!(
        open(&vol, "evil/etc").unwrap_err(),
        SubPathError::Escapes { .. }
    ));
    assert!(matches!(
        open(&vol, "evil/new-dir").unwrap_err(),
        SubPathError::Escapes { .. }
    ));
}

#[test]
fn climbing_and_absolute_subpaths_are_refused() {
    let (_root, vol) = volume();
    for bad in ["a/../../x", "..", "/etc"] {
        assert!(
            matches!(open(&vol, bad).unwrap_err(), SubPathError::Invalid { .. }),
            "{bad}"
        );
    }
    assert!(!vol.parent().unwrap().join("x").exists());
}

#[test]
fn an_escaping_symlink_chain_is_refused() {
    let (root, vol) = volume();
    std::fs::create_dir(root.path().join("outside")).unwrap();
    symlink("l2", vol.join("l1")).unwrap();
    symlink("sub/l3", vol.join("l2")).unwrap();
    std::fs::create_dir(vol.join("sub")).unwrap();
    symlink("../../outside", vol.join("sub/l3")).unwrap();
    let err = open(&vol, "l1").unwrap_err();
    assert!(matches!(err, SubPathError::Escapes { .. }), "{err}");
}

#[test]
fn an_in_volume_symlink_is_followed_and_missing_dirs_are_made() {
    let (_root, vol) = volume();
    std::fs::create_dir(vol.join("real")).unwrap();
    symlink("real", vol.join("link")).unwrap();
    let fd = open(&vol, "link").unwrap();
    assert_eq!(real_path(&fd), vol.join("real"));
    let fd = open(&vol, "link/a/b").unwrap();
    assert_eq!(real_path(&fd), vol.join("real/a/b"));
    // Created with the volume's mode, whatever the umask.
    let mode = std::fs::metadata(vol.join("real/a"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o777);
    std::fs::write(vol.join("file"), "x").unwrap();
    assert_eq!(real_path(&open(&vol, "./file").unwrap()), vol.join("file"));
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

#[test]
fn the_opened_subpath_is_bind_mounted_idempotently_and_unmounted() {
    if !is_root() {
        eprintln!("skipped: bind mounts need root");
        return;
    }
    let (root, vol) = volume();
    std::fs::create_dir(vol.join("real")).unwrap();
    std::fs::write(vol.join("real/f"), "hello").unwrap();
    let targets = root.path().join("volume-subpaths");
    let target = HostPath::new(&targets, &["data", "c", "0"]).unwrap();
    let fd = open(&vol, "real").unwrap();
    bind_at(&fd, &target).unwrap();
    assert_eq!(
        std::fs::read_to_string(target.join("f").unwrap().as_path()).unwrap(),
        "hello"
    );
    // Again: the mount is reused, not stacked.
    bind_at(&open(&vol, "real").unwrap(), &target).unwrap();
    assert_eq!(
        mounts_under(&targets).unwrap(),
        vec![target.as_path().to_path_buf()]
    );
    // A file subPath is mounted on a file.
    let file_target = HostPath::new(&targets, &["data", "c", "1"]).unwrap();
    bind_at(&open(&vol, "real/f").unwrap(), &file_target).unwrap();
    assert_eq!(
        std::fs::read_to_string(file_target.as_path()).unwrap(),
        "hello"
    );
    unmount_under(&targets).unwrap();
    assert!(mounts_under(&targets).unwrap().is_empty());
}

#[test]
fn mountinfo_escapes_are_undone() {
    assert_eq!(unescape_mountinfo("/a\\040b\\134c"), "/a b\\c");
    assert_eq!(unescape_mountinfo("/plain\\9"), "/plain\\9");
}
