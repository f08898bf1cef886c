//! The OOM watcher (upstream `pkg/kubelet/oom`, which reads the kernel log through
//! cAdvisor's oomparser): every `oom-kill:` record in `/dev/kmsg` is parsed, and one where
//! the whole node ran out of memory (`global_oom`, or the root memory cgroup: upstream's
//! victim container "/") becomes a Warning `SystemOOM` event on the Node, with upstream's
//! message (`System OOM encountered, victim process: <comm>, pid: <pid>`) followed, when the
//! victim was in a container the runtime knows, by `, container: <name>, pod:
//! <namespace>/<name>`. An OOM inside a container's or pod's own limit is not a node event
//! (as upstream): containerd reports that container `OOMKilled`.
//!
//! Unlike upstream, which starts at the end of the log each time, the position reached is
//! kept in `<root-dir>/node-status/kmsg.json` with the boot id, so an OOM while node-status
//! was being restarted is still reported, and none twice.

use nodeagent_config::events::{EventRecorder, EventType};
use nodeagent_cri::Cri;
use nodeagent_proto::k8s::labels;
use nodeagent_transport::Shutdown;
use serde::{Deserialize, Serialize};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How often the position reached is saved when it moved.
const SAVE_EVERY: Duration = Duration::from_secs(5);
pub const REASON: &str = "SystemOOM";

/// One kill by the kernel's OOM killer, from its `oom-kill:` record.
#[derive(Debug, Clone, PartialEq)]
pub struct OomKill {
    pub task: String,
    pub pid: u32,
    /// The whole node ran out of memory (not a memory cgroup's limit).
    pub node_wide: bool,
    /// The victim's memory cgroup.
    pub task_memcg: String,
}

/// A `/dev/kmsg` record: its sequence number and message (the first line, after `;`).
pub fn parse_record(record: &str) -> Option<(u64, &str)> {
    let (header, rest) = record.split_once(';')?;
    let seq = header.split(',').nth(1)?.parse().ok()?;
    Some((seq, rest.lines().next().unwrap_or_default()))
}

/// Parses the kernel's (≥ 4.19) summary of a kill:
/// `oom-kill:constraint=…,nodemask=…,cpuset=…,mems_allowed=…,{global_oom|oom_memcg=…},task_memcg=…,task=<comm>,pid=<pid>,uid=<uid>`.
pub fn parse_oom(message: &str) -> Option<OomKill> {
    let body = message.trim_start().strip_prefix("oom-kill:")?;
    // The command name may hold commas: it runs from ",task=" to the last ",pid=".
    let task_at = body.rfind(",task=")?;
    let after_task = &body[task_at + ",task=".len()..];
    let pid_at = after_task.rfind(",pid=")?;
    let task = after_task[..pid_at].to_string();
    let pid = after_task[pid_at + ",pid=".len()..]
        .split(',')
        .next()?
        .parse()
        .ok()?;
    let fields: Vec<&str> = body[..task_at].split(',').collect();
    let value = |key: &str| {
        fields
            .iter()
            .find_map(|f| f.strip_prefix(key)?.strip_prefix('='))
    };
    let node_wide = fields.contains(&"global_oom") || value("oom_memcg") == Some("/");
    Some(OomKill {
        task,
        pid,
        node_wide,
        task_memcg: value("task_memcg").unwrap_or_default().to_string(),
    })
}

/// The container id in a memory cgroup path (cgroupfs `…/pod<uid>/<id>`, systemd
/// `…/cri-containerd-<id>.scope`).
pub fn container_id(memcg: &str) -> Option<&str> {
    let last = memcg.rsplit('/').next()?;
    let id = last
        .strip_prefix("cri-containerd-")
        .and_then(|s| s.strip_suffix(".scope"))
        .unwrap_or(last);
    (id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())).then_some(id)
}

/// The upstream message, and the victim's container when the runtime knows it.
pub fn message(kill: &OomKill, container: Option<(String, String, String)>) -> String {
    let mut text = "System OOM encountered".to_string();
    if !kill.task.is_empty() && kill.pid != 0 {
        text.push_str(&format!(
            ", victim process: {}, pid: {}",
            kill.task, kill.pid
        ));
    }
    if let Some((container, namespace, pod)) = container {
        text.push_str(&format!(", container: {container}, pod: {namespace}/{pod}"));
    }
    text
}

#[derive(Debug, Default, Serialize, Deserialize, PartialEq)]
struct Position {
    boot_id: String,
    seq: u64,
}

fn position_file(root_dir: &Path) -> PathBuf {
    root_dir.join("node-status").join("kmsg.json")
}

fn save(path: &Path, position: &Position) {
    if let Err(e) = nodeagent_config::state::write_json(path, position) {
        tracing::warn!(path = %path.display(), error = %e, "OOM watcher: cannot keep the kernel log position");
    }
}

/// Names the victim's container (name, namespace, pod) from the runtime's labels.
async fn victim(cri: &Cri, kill: &OomKill) -> Option<(String, String, String)> {
    let id = container_id(&kill.task_memcg)?;
    let status = cri.container_status(id).await.ok()?.status?;
    let label = |k: &str| status.labels.get(k).cloned().unwrap_or_default();
    Some((
        label(labels::CONTAINER_NAME),
        label(labels::POD_NAMESPACE),
        label(labels::POD_NAME),
    ))
}

/// Follows `/dev/kmsg` until `shutdown`; without it (no permission, a container without
/// the device) logs once why and watches nothing.
pub async fn run(root_dir: PathBuf, cri: Cri, events: EventRecorder, shutdown: Shutdown) {
    use std::os::unix::fs::OpenOptionsExt;
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open("/dev/kmsg")
    {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!(error = %e, "OOM watcher off: cannot read /dev/kmsg (no SystemOOM events)");
            return;
        }
    };
    let path = position_file(&root_dir);
    let boot = nodeagent_config::machine::boot_id();
    let saved: Option<Position> = std::fs::read(&path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .filter(|p: &Position| p.boot_id == boot);
    // Nothing kept from this boot: what the log holds is from before us.
    if saved.is_none()
        && let Err(e) = nix::unistd::lseek(&file, 0, nix::unistd::Whence::SeekEnd)
    {
        tracing::warn!(error = %e, "OOM watcher: cannot skip the kernel log's past");
    }
    let mut position = saved.unwrap_or(Position {
        boot_id: boot,
        seq: 0,
    });
    let resume_after = position.seq;
    tracing::info!(resume_after, "OOM watcher following the kernel log");
    // SAFETY: the AsyncFd owns the file, so the descriptor stays open for exactly as
    // long as it is registered.
    #[allow(unsafe_code)]
    let registered = unsafe { tokio::io::unix::AsyncFd::register(file) };
    let fd = match registered.map_err(|e| e.into_parts().1) {
        Ok(fd) => fd,
        Err(e) => {
            tracing::warn!(error = %e, "OOM watcher off: cannot poll /dev/kmsg");
            return;
        }
    };
    let mut buf = vec![0u8; 8192];
    let mut tick = tokio::time::interval(SAVE_EVERY);
    let mut saved_seq = position.seq;
    loop {
        let mut guard = tokio::select! {
            _ = shutdown.wait() => break,
            _ = tick.tick() => {
                if position.seq != saved_seq {
                    save(&path, &position);
                    saved_seq = position.seq;
                }
                continue;
            }
            g = fd.readable() => match g {
                Ok(g) => g,
                Err(e) => {
                    tracing::warn!(error = %e, "OOM watcher: polling /dev/kmsg failed; stopping");
                    break;
                }
            },
        };
        loop {
            match guard.try_io(|f| f.get_ref().read(&mut buf)) {
                Ok(Ok(n)) => {
                    let text = String::from_utf8_lossy(&buf[..n]);
                    let Some((seq, line)) = parse_record(&text) else {
                        continue;
                    };
                    if seq <= resume_after && resume_after != 0 {
                        continue;
                    }
                    position.seq = seq;
                    let Some(kill) = parse_oom(line) else {
                        continue;
                    };
                    if !kill.node_wide {
                        tracing::info!(process = %kill.task, pid = kill.pid, memcg = %kill.task_memcg, "OOM kill within a memory limit");
                        continue;
                    }
                    let text = message(&kill, victim(&cri, &kill).await);
                    tracing::warn!(%text, "system OOM");
                    events.node(EventType::Warning, REASON, &text);
                    save(&path, &position);
                    saved_seq = position.seq;
                }
                // Records overwritten before we read them: the next read gives the oldest
                // one left.
                Ok(Err(e)) if e.raw_os_error() == Some(nix::libc::EPIPE) => continue,
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "OOM watcher: reading /dev/kmsg failed");
                    break;
                }
                Err(_would_block) => break,
            }
        }
    }
    if position.seq != saved_seq {
        save(&path, &position);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CID: &str = "4f2ad5e8b2b84a0c8e2b2f3c0d1e9a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f";

    #[test]
    fn records_and_kills_parse() {
        let record = format!(
            "6,4711,123456789,-;oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,task_memcg=/kubepods/besteffort/pod1234/{CID},task=tail,pid=4242,uid=0\n SUBSYSTEM=x\n"
        );
        let (seq, line) = parse_record(&record).unwrap();
        assert_eq!(seq, 4711);
        let kill = parse_oom(line).unwrap();
        assert_eq!(
            kill,
            OomKill {
                task: "tail".into(),
                pid: 4242,
                node_wide: true,
                task_memcg: format!("/kubepods/besteffort/pod1234/{CID}"),
            }
        );
        assert_eq!(container_id(&kill.task_memcg), Some(CID));
        assert_eq!(
            message(&kill, Some(("c".into(), "default".into(), "hog".into()))),
            "System OOM encountered, victim process: tail, pid: 4242, container: c, pod: default/hog"
        );
        assert_eq!(
            message(&kill, None),
            "System OOM encountered, victim process: tail, pid: 4242"
        );
    }

    #[test]
    fn a_limit_is_not_the_node_and_odd_names_survive() {
        let memcg = "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=abc,mems_allowed=0-1,oom_memcg=/kubepods/pod1,task_memcg=/kubepods/pod1/x,task=a,b=c,pid=7,uid=0";
        let kill = parse_oom(memcg).unwrap();
        assert!(!kill.node_wide);
        assert_eq!(kill.task, "a,b=c");
        assert_eq!(kill.pid, 7);
        let root = "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,2,oom_memcg=/,task_memcg=/system.slice/x.service,task=java,pid=9,uid=0";
        assert!(parse_oom(root).unwrap().node_wide);
        assert_eq!(
            container_id(&format!(
                "/kubepods.slice/kubepods-pod1.slice/cri-containerd-{CID}.scope"
            )),
            Some(CID)
        );
        assert_eq!(container_id("/system.slice/containerd.service"), None);
        assert_eq!(parse_oom("Out of memory: Killed process 1 (init)"), None);
        assert_eq!(parse_record("no header"), None);
    }
}
