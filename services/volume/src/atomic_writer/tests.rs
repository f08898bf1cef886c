//! The atomic writer against real directories (tempdirs), including a reader racing the
//! writer.

use super::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

fn payload(files: &[(&str, &str, u32)]) -> Payload {
    files
        .iter()
        .map(|(p, d, m)| (p.to_string(), FileProjection::new(d.as_bytes(), *m)))
        .collect()
}

fn data_dir(target: &Path) -> String {
    std::fs::read_link(target.join(DATA_DIR))
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

/// Every entry of the target directory, sorted, with hidden timestamped dirs as `..ts`.
fn listing(target: &Path) -> Vec<String> {
    let current = data_dir(target);
    let mut names: Vec<String> = std::fs::read_dir(target)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .map(|n| if n == current { "..ts".into() } else { n })
        .collect();
    names.sort();
    names
}

fn read(target: &Path, path: &str) -> String {
    std::fs::read_to_string(target.join(path)).unwrap()
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

#[test]
fn paths_are_validated_as_upstream() {
    let long_name = "a".repeat(256);
    let long_path = "a/".repeat(2049);
    let cases: &[(&str, Result<&str, &str>)] = &[
        ("i/am/well/behaved.txt", Ok("i/am/well/behaved.txt")),
        (
            "keepyourheaddownandfollowtherules.txt",
            Ok("keepyourheaddownandfollowtherules.txt"),
        ),
        (".dotfile", Ok(".dotfile")),
        ("foo//bar.txt", Ok("foo/bar.txt")),
        ("./a/./b/", Ok("a/b")),
        ("", Err("invalid path: must not be empty: \"\"")),
        (
            "/dev/null",
            Err("invalid path: must be relative path: /dev/null"),
        ),
        ("/etc/x", Err("invalid path: must be relative path: /etc/x")),
        (
            "..sneaky.txt",
            Err("invalid path: must not start with '..': ..sneaky.txt"),
        ),
        (
            "..data",
            Err("invalid path: must not start with '..': ..data"),
        ),
        (
            "..foo/bar",
            Err("invalid path: must not start with '..': ..foo/bar"),
        ),
        (
            "./..data",
            Err("invalid path: must not start with '..': ./..data"),
        ),
        ("..", Err("invalid path: must not contain '..': ..")),
        ("../x", Err("invalid path: must not contain '..': ../x")),
        (
            "hello/there/../../../../../../etc/passwd",
            Err("invalid path: must not contain '..': hello/there/../../../../../../etc/passwd"),
        ),
        (
            "hello/../etc/somethingbad",
            Err("invalid path: must not contain '..': hello/../etc/somethingbad"),
        ),
        (".", Err("invalid path: must name a file: .")),
        (
            &long_name,
            Err("invalid path: filenames must be less than or equal to 255 characters"),
        ),
        (
            &long_path,
            Err("invalid path: must be less than or equal to 4096 characters"),
        ),
        (
            "a\0b",
            Err("invalid path: must not contain a NUL byte: \"a\\0b\""),
        ),
    ];
    for (path, want) in cases {
        let got = validate_path(path).map_err(|e| e.to_string());
        assert_eq!(
            got.as_deref(),
            want.map_err(str::to_string).as_deref(),
            "{path:?}"
        );
    }
}

#[test]
fn a_first_write_makes_the_layout() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path();
    let p = payload(&[
        ("podName", "p1", 0o644),
        ("user/labels", "a=\"b\"", 0o600),
        ("a/b/c", "deep", 0o400),
        (".dotfile", "dot", 0o777),
    ]);
    assert!(write(t, &p).unwrap());
    assert_eq!(
        listing(t),
        ["..data", "..ts", ".dotfile", "a", "podName", "user"]
    );
    let ts = data_dir(t);
    assert!(
        ts.starts_with("..") && ts.len() > "..2006_01_02_15_04_05.".len(),
        "{ts}"
    );
    for name in [".dotfile", "podName", "user", "a"] {
        assert_eq!(
            std::fs::read_link(t.join(name)).unwrap(),
            Path::new(DATA_DIR).join(name)
        );
    }
    assert_eq!(read(t, "podName"), "p1");
    assert_eq!(read(t, "user/labels"), "a=\"b\"");
    assert_eq!(read(t, "a/b/c"), "deep");
    assert_eq!(mode(&t.join("podName")), 0o644);
    assert_eq!(mode(&t.join("user/labels")), 0o600);
    assert_eq!(mode(&t.join("a/b/c")), 0o400);
    assert_eq!(mode(&t.join(".dotfile")), 0o777);
    assert_eq!(mode(&t.join(&ts)), 0o755, "readable by any container user");
    assert_eq!(mode(&t.join("a/b")), 0o755);
}

#[test]
fn modes_ignore_the_umask() {
    let dir = tempfile::tempdir().unwrap();
    let old = nix::sys::stat::umask(Mode::from_bits_truncate(0o077));
    let written = write(
        dir.path(),
        &payload(&[("f", "x", 0o666), ("d/g", "y", 0o4755)]),
    );
    nix::sys::stat::umask(old);
    written.unwrap();
    assert_eq!(mode(&dir.path().join("f")), 0o666);
    assert_eq!(mode(&dir.path().join("d/g")), 0o4755);
    assert_eq!(mode(&dir.path().join("d")), 0o755);
}

#[test]
fn an_update_swaps_the_data_dir_and_removes_the_old_one() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path();
    assert!(write(t, &payload(&[("foo", "foo", 0o644), ("bar", "bar", 0o644)])).unwrap());
    let first = data_dir(t);
    assert!(
        write(
            t,
            &payload(&[("foo", "foo2", 0o644), ("bar", "bar", 0o640)])
        )
        .unwrap()
    );
    let second = data_dir(t);
    assert_ne!(first, second);
    assert!(!t.join(&first).exists(), "old timestamped dir removed");
    assert_eq!(read(t, "foo"), "foo2");
    assert_eq!(
        mode(&t.join("bar")),
        0o640,
        "a mode change alone is an update"
    );
    assert_eq!(listing(t), ["..data", "..ts", "bar", "foo"]);
}

#[test]
fn an_unchanged_payload_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path();
    let p = payload(&[("foo/bar.txt", "foo", 0o644), ("bar/zab.txt", "bar", 0o644)]);
    assert!(write(t, &p).unwrap());
    let ts = data_dir(t);
    let inode = std::fs::metadata(t.join("foo/bar.txt")).unwrap().ino();
    assert!(!write(t, &p).unwrap());
    assert_eq!(data_dir(t), ts);
    assert_eq!(
        std::fs::metadata(t.join("foo/bar.txt")).unwrap().ino(),
        inode
    );
    // Upstream #121472: a lost link is put back even when the data is current.
    std::fs::remove_file(t.join("bar")).unwrap();
    assert!(!write(t, &p).unwrap());
    assert_eq!(read(t, "bar/zab.txt"), "bar");
    // Different content, an extra file, a changed mode: each is a change.
    for next in [
        payload(&[
            ("foo/bar.txt", "foo!", 0o644),
            ("bar/zab.txt", "bar", 0o644),
        ]),
        payload(&[
            ("foo/bar.txt", "foo!", 0o644),
            ("bar/zab.txt", "bar", 0o644),
            ("x", "", 0o644),
        ]),
        payload(&[
            ("foo/bar.txt", "foo!", 0o644),
            ("bar/zab.txt", "bar", 0o644),
            ("x", "", 0o600),
        ]),
    ] {
        assert!(write(t, &next).unwrap());
        assert!(!write(t, &next).unwrap());
    }
}

#[test]
fn removed_keys_disappear_with_their_links_and_dirs() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path();
    write(
        t,
        &payload(&[
            ("foo.txt", "foo", 0o644),
            ("zap/1/2/3/4/bar.txt", "bar", 0o644),
            ("zap/1/2/magic.txt", "indigo", 0o644),
            ("zip/bar.txt", "zip", 0o644),
        ]),
    )
    .unwrap();
    assert!(
        write(
            t,
            &payload(&[
                ("foo.txt", "foo", 0o644),
                ("zap/1/2/magic.txt", "indigo", 0o644)
            ]),
        )
        .unwrap()
    );
    assert_eq!(listing(t), ["..data", "..ts", "foo.txt", "zap"]);
    assert!(!t.join("zap/1/2/3").exists());
    assert_eq!(read(t, "zap/1/2/magic.txt"), "indigo");
    // Removing every key leaves only the writer's own entries.
    assert!(write(t, &Payload::new()).unwrap());
    assert_eq!(listing(t), ["..data", "..ts"]);
    assert!(!write(t, &Payload::new()).unwrap());
}

#[test]
fn hostile_payloads_are_refused_whole_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path();
    for bad in [
        "../x",
        "/etc/x",
        "..data",
        "..foo",
        "a/../../x",
        "..data_tmp",
    ] {
        let p = payload(&[("good", "g", 0o644), (bad, "evil", 0o644)]);
        let err = write(t, &p).unwrap_err();
        assert!(matches!(err, WriteError::InvalidPath(_)), "{bad}: {err}");
        assert_eq!(
            std::fs::read_dir(t).unwrap().count(),
            0,
            "{bad}: nothing written"
        );
    }
    assert!(!dir.path().parent().unwrap().join("x").exists());
    let err = write(t, &payload(&[("a", "1", 0o644), ("a/b", "2", 0o644)])).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid path: a/b is inside a, which is a file"
    );
    let err = write(t, &payload(&[("a//b", "1", 0o644), ("a/b", "2", 0o644)])).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid path: a//b and a/b name the same file"
    );
    let err = write(t, &payload(&[("a", "1", 0o10644)])).unwrap_err();
    assert!(matches!(err, WriteError::InvalidMode { .. }), "{err}");
    assert_eq!(std::fs::read_dir(t).unwrap().count(), 0);
}

#[test]
fn planted_links_are_replaced_or_refused_never_followed() {
    let root = tempfile::tempdir().unwrap();
    let outside = root.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let t = root.path().join("vol");
    std::fs::create_dir(&t).unwrap();
    // A top-level name already a link out of the volume.
    symlink(&outside, t.join("conf")).unwrap();
    write(&t, &payload(&[("conf/app.yaml", "x", 0o644)])).unwrap();
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
    assert_eq!(
        std::fs::read_link(t.join("conf")).unwrap(),
        Path::new("..data/conf")
    );
    assert_eq!(read(&t, "conf/app.yaml"), "x");

    // A leftover hidden link to the outside is unlinked, not followed.
    std::fs::write(outside.join("keep"), "k").unwrap();
    symlink(&outside, t.join("..2001_01_01_00_00_00.1")).unwrap();
    write(&t, &payload(&[("conf/app.yaml", "y", 0o644)])).unwrap();
    assert!(!t.join("..2001_01_01_00_00_00.1").exists());
    assert_eq!(read(&outside, "keep"), "k");

    // `..data` pointing anywhere but a hidden entry of the volume is refused.
    std::fs::remove_file(t.join(DATA_DIR)).unwrap();
    symlink(&outside, t.join(DATA_DIR)).unwrap();
    let err = write(&t, &payload(&[("conf/app.yaml", "z", 0o644)])).unwrap_err();
    assert!(
        err.to_string()
            .contains("does not point to a timestamped directory"),
        "{err}"
    );
    assert_eq!(read(&outside, "keep"), "k");

    // A real file where a link belongs is not ours to replace.
    let t2 = root.path().join("vol2");
    std::fs::create_dir(&t2).unwrap();
    std::fs::write(t2.join("conf"), "mine").unwrap();
    let err = write(&t2, &payload(&[("conf", "x", 0o644)])).unwrap_err();
    assert!(err.to_string().contains("refusing to replace"), "{err}");
    assert_eq!(read(&t2, "conf"), "mine");
}

#[test]
fn a_link_inside_the_old_version_makes_it_rewritten_not_read_through() {
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("secret"), "host secret").unwrap();
    let t = root.path().join("vol");
    std::fs::create_dir(&t).unwrap();
    let p = payload(&[("f", "host secret", 0o644)]);
    write(&t, &p).unwrap();
    let ts = t.join(data_dir(&t));
    std::fs::remove_file(ts.join("f")).unwrap();
    symlink(root.path().join("secret"), ts.join("f")).unwrap();
    assert!(
        write(&t, &p).unwrap(),
        "a symlink is never taken for the file"
    );
    assert!(
        std::fs::symlink_metadata(t.join("..data/f"))
            .unwrap()
            .is_file()
    );
    assert_eq!(read(root.path(), "secret"), "host secret");
}

#[test]
fn leftovers_of_an_interrupted_write_are_cleaned_up() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path();
    write(t, &payload(&[("a", "1", 0o644)])).unwrap();
    // As if a writer died between making its directory and the swap.
    std::fs::create_dir(t.join("..2001_01_01_00_00_00.1")).unwrap();
    std::fs::write(t.join("..2001_01_01_00_00_00.1/a"), "half").unwrap();
    symlink("..2001_01_01_00_00_00.1", t.join(NEW_DATA_DIR)).unwrap();
    symlink("..data/gone", t.join("gone")).unwrap();
    assert!(write(t, &payload(&[("a", "2", 0o644)])).unwrap());
    assert_eq!(listing(t), ["..data", "..ts", "a"]);
    assert_eq!(read(t, "a"), "2");
    // Unchanged data still cleans up, and a foreign link is left alone.
    std::fs::create_dir(t.join("..2001_01_01_00_00_00.2")).unwrap();
    symlink("elsewhere", t.join("foreign")).unwrap();
    assert!(!write(t, &payload(&[("a", "2", 0o644)])).unwrap());
    assert_eq!(listing(t), ["..data", "..ts", "a", "foreign"]);
}

#[test]
fn owners_are_applied_and_compared() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path();
    // As root any owner works; otherwise only our own ids do.
    let (uid, gid) = if nix::unistd::geteuid().is_root() {
        (1234, 5678)
    } else {
        (
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        )
    };
    let mut p = payload(&[("token", "t", 0o600), ("plain", "p", 0o644)]);
    let token = p.get_mut("token").unwrap();
    token.uid = Some(uid);
    token.gid = Some(gid);
    write(t, &p).unwrap();
    let meta = std::fs::metadata(t.join("token")).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (uid, gid));
    assert_eq!(meta.mode() & 0o7777, 0o600);
    assert!(!write(t, &p).unwrap());
    if nix::unistd::geteuid().is_root() {
        p.get_mut("token").unwrap().gid = Some(5679);
        assert!(write(t, &p).unwrap(), "a new group is a change");
        assert_eq!(std::fs::metadata(t.join("token")).unwrap().gid(), 5679);
    }
}

#[test]
fn a_missing_target_dir_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let err = write(&dir.path().join("nope"), &payload(&[("a", "1", 0o644)])).unwrap_err();
    assert!(matches!(err, WriteError::Io { op: "open", .. }), "{err}");
}

#[test]
fn timestamps_are_utc_calendar_dates() {
    assert_eq!(utc_timestamp(0), "1970_01_01_00_00_00");
    assert_eq!(utc_timestamp(951_782_400), "2000_02_29_00_00_00");
    assert_eq!(utc_timestamp(1_769_860_800 + 3661), "2026_01_31_13_01_01");
    assert_eq!(utc_timestamp(4_107_542_399), "2100_02_28_23_59_59");
}

/// A reader that keeps reading two files while the writer alternates two versions in
/// which both files always agree must never see them disagree, nor a partial file.
#[test]
fn a_racing_reader_never_sees_half_an_update() {
    const SIZE: usize = 64 * 1024;
    let dir = tempfile::tempdir().unwrap();
    let t = Arc::new(dir.path().to_path_buf());
    let version = |v: &str| {
        let body = v.repeat(SIZE / v.len());
        payload(&[("a", &body, 0o644), ("sub/b", &body, 0o644)])
    };
    let (one, two) = (version("v1"), version("v2"));
    let full = |s: &str| s.len() == SIZE && (s == one["a"].data_str() || s == two["a"].data_str());
    write(&t, &one).unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    // Comparisons made by the reader so far: the writer keeps going until there are some.
    let compared = Arc::new(AtomicU64::new(0));
    let reader = {
        let (t, stop, compared) = (Arc::clone(&t), Arc::clone(&stop), Arc::clone(&compared));
        let (one, two) = (one.clone(), two.clone());
        std::thread::spawn(move || {
            let full =
                |s: &str| s.len() == SIZE && (s == one["a"].data_str() || s == two["a"].data_str());
            let (mut consistent_reads, mut pinned_reads, mut vanished) = (0u64, 0u64, 0u64);
            while !stop.load(Ordering::Relaxed) {
                // Through the user-visible links: if `..data` did not move while both files
                // were read (names are never reused), both came from one version.
                let before = std::fs::read_link(t.join(DATA_DIR)).unwrap();
                let a = std::fs::read_to_string(t.join("a"));
                let b = std::fs::read_to_string(t.join("sub/b"));
                let after = std::fs::read_link(t.join(DATA_DIR)).unwrap();
                match (a, b) {
                    (Ok(a), Ok(b)) => {
                        assert!(full(&a) && full(&b), "a partial file was read");
                        if before == after {
                            assert_eq!(a[..2], b[..2], "the files disagree");
                            consistent_reads += 1;
                            compared.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    // The old directory was removed between resolving `..data` and opening
                    // the file: the path walk is not atomic, the content is never partial.
                    _ => vanished += 1,
                }
                // Through one resolution of `..data`, as a careful consumer reads.
                if let Ok(pinned) = std::fs::File::open(t.join(DATA_DIR)) {
                    use std::os::fd::AsFd;
                    let read_at = |p: &str| -> Option<String> {
                        let fd = openat(pinned.as_fd(), p, OFlag::O_RDONLY, Mode::empty()).ok()?;
                        std::io::read_to_string(std::fs::File::from(fd)).ok()
                    };
                    if let (Some(a), Some(b)) = (read_at("a"), read_at("sub/b")) {
                        assert!(full(&a) && full(&b), "a partial file was read");
                        assert_eq!(a[..2], b[..2], "the files disagree");
                        pinned_reads += 1;
                    }
                }
            }
            (consistent_reads, pinned_reads, vanished)
        })
    };

    let deadline = Instant::now() + Duration::from_secs(60);
    let mut swaps = 0;
    while (swaps < 400 || compared.load(Ordering::Relaxed) < 100)
        && Instant::now() < deadline
        && !reader.is_finished()
    {
        let next = if swaps % 2 == 0 { &two } else { &one };
        assert!(write(&t, next).unwrap());
        swaps += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let (consistent, pinned, vanished) = reader.join().expect("reader saw a partial state");
    eprintln!(
        "{swaps} swaps, {consistent} stable-window reads, {pinned} pinned reads, {vanished} vanished"
    );
    assert_eq!(swaps, 400, "writer too slow");
    assert!(
        consistent > 0 && pinned > 0,
        "the reader never got a comparison in"
    );
    assert!(full(&read(&t, "a")));
}

trait DataStr {
    fn data_str(&self) -> &str;
}

impl DataStr for FileProjection {
    fn data_str(&self) -> &str {
        std::str::from_utf8(&self.data).unwrap()
    }
}
