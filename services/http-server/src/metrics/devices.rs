//! The device a filesystem is mounted from, as cAdvisor names it in its `device` label:
//! the path's `st_dev` matched against `/proc/self/mountinfo`'s `major:minor` field, whose
//! mount source (after ` - fstype `) is the device (`/dev/vda1`, `overlay`, `tmpfs`); and a
//! block device's name from its numbers, for the disk I/O series.

use std::path::Path;

/// The mount source of the filesystem holding `path`.
pub fn device_of(path: &Path) -> Option<String> {
    let st = nix::sys::stat::stat(path).ok()?;
    let dev = st.st_dev;
    let wanted = format!(
        "{}:{}",
        nix::sys::stat::major(dev),
        nix::sys::stat::minor(dev)
    );
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    source_of(&info, &wanted)
}

/// The block device `MAJ:MIN` as cAdvisor names it in its disk I/O series (its
/// `MachineInfoNamer`: `/dev/` and the kernel's name, here the `DEVNAME` of
/// /sys/dev/block/MAJ:MIN/uevent); None for a device the kernel does not list.
pub fn block_device_name(numbers: &str) -> Option<String> {
    let uevent = std::fs::read_to_string(format!("/sys/dev/block/{numbers}/uevent")).ok()?;
    devname(&uevent).map(|name| format!("/dev/{name}"))
}

/// `DEVNAME=` of a uevent file.
fn devname(uevent: &str) -> Option<&str> {
    uevent
        .lines()
        .find_map(|l| l.strip_prefix("DEVNAME="))
        .filter(|n| !n.is_empty())
}

/// The mount source of the first mountinfo line whose `major:minor` is `wanted`.
fn source_of(mountinfo: &str, wanted: &str) -> Option<String> {
    mountinfo.lines().find_map(|line| {
        let mut fields = line.split(' ');
        if fields.nth(2)? != wanted {
            return None;
        }
        let (_, after) = line.split_once(" - ")?;
        let mut after = after.split(' ');
        let _fstype = after.next()?;
        Some(unescape(after.next()?))
    })
}

/// mountinfo writes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && let Some(code) = b
                .get(i + 1..i + 4)
                .and_then(|o| std::str::from_utf8(o).ok())
                .and_then(|o| u8::from_str_radix(o, 8).ok())
        {
            out.push(code);
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "\
22 1 253:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
23 22 0:21 / /proc rw,nosuid shared:2 - proc proc rw
40 22 253:1 /var/lib/x /mnt/bind rw shared:1 - ext4 /dev/vda1 rw
41 22 0:50 / /mnt/odd rw - tmpfs my\\040disk rw
";

    #[test]
    fn the_device_is_the_mount_source_of_the_same_major_minor() {
        assert_eq!(source_of(INFO, "253:1").as_deref(), Some("/dev/vda1"));
        assert_eq!(source_of(INFO, "0:21").as_deref(), Some("proc"));
        assert_eq!(source_of(INFO, "0:50").as_deref(), Some("my disk"));
        assert_eq!(source_of(INFO, "9:9"), None);
    }

    #[test]
    fn a_block_device_is_named_from_its_uevent() {
        let uevent = "MAJOR=253\nMINOR=0\nDEVNAME=vda\nDEVTYPE=disk\nDISKSEQ=9\n";
        assert_eq!(devname(uevent), Some("vda"));
        assert_eq!(devname("MAJOR=7\nMINOR=0\n"), None);
        assert_eq!(block_device_name("4095:1048575"), None);
    }

    #[test]
    fn the_root_filesystem_has_a_device() {
        assert!(device_of(Path::new("/")).is_some_and(|d| !d.is_empty()));
    }
}
