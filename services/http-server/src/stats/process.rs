//! What /proc says about one process (its cgroups, CPU time, resident memory, start time
//! and parent) and which process serves a Unix socket (its SO_PEERCRED), for the
//! Summary's `kubelet` and `runtime` system containers.

use std::path::Path;

/// A process's cgroup in the hierarchies the Summary reads: v1's cpuacct and memory
/// hierarchies (which may differ), or v2's one path for both.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProcCgroups {
    pub cpu: Option<String>,
    pub memory: Option<String>,
}

/// Parses `/proc/<pid>/cgroup`: the `0::` line on v2, and on v1 the lines whose
/// controller lists hold `cpuacct` and `memory` (`4:memory:/a`, `2:cpu,cpuacct:/b`).
pub fn parse_cgroup_file(text: &str, v2: bool) -> ProcCgroups {
    let mut found = ProcCgroups::default();
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if v2 {
            if id == "0" && controllers.is_empty() {
                found.cpu = Some(path.to_string());
                found.memory = Some(path.to_string());
            }
            continue;
        }
        for controller in controllers.split(',') {
            match controller {
                "cpuacct" => found.cpu = Some(path.to_string()),
                "memory" => found.memory = Some(path.to_string()),
                _ => {}
            }
        }
    }
    found
}

/// The fields of `/proc/<pid>/stat` the Summary uses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProcStat {
    pub ppid: u32,
    pub minor_faults: u64,
    pub major_faults: u64,
    /// utime + stime, in clock ticks.
    pub cpu_ticks: u64,
    /// Clock ticks after boot.
    pub start_ticks: u64,
}

/// Parses `/proc/<pid>/stat`. The command name (field 2) may hold spaces and parentheses,
/// so the fields are counted from its last `)`.
pub fn parse_stat(text: &str) -> Option<ProcStat> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is field 3 (state) of proc(5).
    let field = |n: usize| -> Option<u64> { fields.get(n - 3)?.parse().ok() };
    Some(ProcStat {
        ppid: u32::try_from(field(4)?).ok()?,
        minor_faults: field(10)?,
        major_faults: field(12)?,
        cpu_ticks: field(14)? + field(15)?,
        start_ticks: field(22)?,
    })
}

/// A `/proc/<pid>/status` field given in kB (`VmRSS`, `VmSwap`), in bytes.
pub fn status_bytes(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(key)?.strip_prefix(':')?;
        let kib: u64 = rest.split_whitespace().next()?.parse().ok()?;
        Some(kib * 1024)
    })
}

pub fn read_stat(pid: u32) -> Option<ProcStat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

pub fn read_status(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/status")).ok()
}

pub fn read_cgroups(pid: u32, v2: bool) -> Option<ProcCgroups> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    Some(parse_cgroup_file(&text, v2))
}

/// The process that listens on the Unix socket at `path`, from the peer credentials of a
/// connection to it. None when nothing answers, or the server is outside our pid
/// namespace (pid 0).
pub fn socket_server_pid(path: &Path) -> Option<u32> {
    use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
    let stream = std::os::unix::net::UnixStream::connect(path).ok()?;
    let cred = getsockopt(&stream, PeerCredentials).ok()?;
    u32::try_from(cred.pid()).ok().filter(|pid| *pid > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_cgroup_file_of_v1_and_v2() {
        let v1 = "12:pids:/system.slice/containerd.service\n\
                  4:memory:/system.slice/containerd.service\n\
                  2:cpu,cpuacct:/system.slice/containerd.service\n\
                  1:name=systemd:/system.slice/containerd.service\n\
                  0::/system.slice/containerd.service\n";
        let c = parse_cgroup_file(v1, false);
        assert_eq!(c.cpu.as_deref(), Some("/system.slice/containerd.service"));
        assert_eq!(
            c.memory.as_deref(),
            Some("/system.slice/containerd.service")
        );
        // Separate cpu and cpuacct hierarchies, and a memory cgroup of its own.
        let split = "4:memory:/process_api/abc\n2:cpuacct:/\n1:cpu:/\n0::/\n";
        let c = parse_cgroup_file(split, false);
        assert_eq!(
            (c.cpu.as_deref(), c.memory.as_deref()),
            (Some("/"), Some("/process_api/abc"))
        );
        let v2 = "0::/kubelet.slice/nodeagent-pleg.service\n";
        let c = parse_cgroup_file(v2, true);
        assert_eq!(c.cpu, c.memory);
        assert_eq!(
            c.cpu.as_deref(),
            Some("/kubelet.slice/nodeagent-pleg.service")
        );
        // A path holding ':' stays whole; v1 lines are not read on v2.
        let c = parse_cgroup_file("4:memory:/a\n0::/odd:name\n", true);
        assert_eq!(c.memory.as_deref(), Some("/odd:name"));
        assert_eq!(
            parse_cgroup_file("garbage\n", false),
            ProcCgroups::default()
        );
    }

    #[test]
    fn reads_stat_past_an_awkward_command_name() {
        let stat = "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 1500 0 7 0 250 50 0 0 20 0 \
                    12 0 987654 123456789 2000 18446744073709551615\n";
        assert_eq!(
            parse_stat(stat),
            Some(ProcStat {
                ppid: 1,
                minor_faults: 1500,
                major_faults: 7,
                cpu_ticks: 300,
                start_ticks: 987_654,
            })
        );
        assert_eq!(parse_stat("4242 (short) S 1 2"), None);
    }

    #[test]
    fn reads_status_sizes_in_bytes() {
        let status = "Name:\tcontainerd\nVmRSS:\t   51200 kB\nVmSwap:\t       8 kB\n";
        assert_eq!(status_bytes(status, "VmRSS"), Some(50 << 20));
        assert_eq!(status_bytes(status, "VmSwap"), Some(8192));
        assert_eq!(status_bytes(status, "VmHWM"), None);
    }

    #[test]
    fn the_server_of_a_socket_is_found_by_its_peer_credentials() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        assert_eq!(socket_server_pid(&path), Some(std::process::id()));
        assert_eq!(socket_server_pid(&dir.path().join("none.sock")), None);
    }
}
