//! pod-sync's last complete pod list, which `/pods` serves (marked) while pod-sync is away.
//!
//! Each instance keeps the list its follower holds in memory and, at most once a second,
//! in `<root-dir>/http-server/last-pods.json` (with the wall-clock time it was current), so
//! that an instance that starts while pod-sync is away (a restart of both, or a fresh
//! instance beside one that had the list) answers at once with what the node ran, instead
//! of waiting for pod-sync's status gate or failing while another instance answers.
//! Upstream's kubelet keeps none: its `/pods` answers nothing until its own restart is over.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::watch;

/// How long after pod-sync was last heard `/pods` still serves its last complete list.
/// A restarted pod-sync serves again within its status gate (45 s at most); past this the
/// list is too old to stand for the node, and `/pods` answers 503.
pub const LAST_PODS_MAX_AGE: Duration = Duration::from_secs(60);

/// How long a `/pods` request waits, when pod-sync is away and no list young enough is at
/// hand (in memory or on disk), for the follower's first complete list before answering
/// 503. It covers pod-sync's restart and its status gate while probe answers
/// (`STATUS_GATE_MAX`, 15 s).
pub const FIRST_LIST_WAIT: Duration = Duration::from_secs(20);

/// How often at most the list is written to disk.
const PERSIST_EVERY: Duration = Duration::from_secs(1);

/// The list's file under the root directory.
pub fn file(root_dir: &Path) -> PathBuf {
    root_dir.join("http-server").join("last-pods.json")
}

/// A list and when it was last known current.
#[derive(Clone)]
struct Stamped {
    pods: Arc<Vec<Vec<u8>>>,
    at: Instant,
    wall: SystemTime,
}

/// The last complete list, kept current by the follower of pod-sync's status stream: as new
/// as pod-sync's last word before it went away (not as old as the last `/pods` request
/// this instance happened to serve, which with several instances sharing the port may be
/// minutes old and lack pods that run).
pub struct LastPods {
    list: watch::Sender<Option<Stamped>>,
    disk: Option<PathBuf>,
}

impl LastPods {
    /// A list kept in memory and, with `disk`, in that file.
    pub fn new(disk: Option<PathBuf>) -> Self {
        Self {
            list: watch::Sender::new(None),
            disk,
        }
    }

    /// pod-sync's current list.
    pub fn keep(&self, pods: Vec<Vec<u8>>) {
        self.list.send_replace(Some(Stamped {
            pods: Arc::new(pods),
            at: Instant::now(),
            wall: SystemTime::now(),
        }));
    }

    /// The follower's stream broke: the list it held was current until now (pod-sync may
    /// have said nothing new for minutes while it ran).
    pub fn touch(&self) {
        self.list.send_if_modified(|last| match last {
            Some(s) => {
                s.at = Instant::now();
                s.wall = SystemTime::now();
                true
            }
            None => false,
        });
    }

    /// The last list and its age, if it is younger than [`LAST_PODS_MAX_AGE`]: this
    /// instance's own, else the one on disk.
    pub fn recent(&self) -> Option<(Vec<Vec<u8>>, Duration)> {
        let own = self.list.borrow().clone();
        if let Some(s) = own.filter(|s| young(s.at.elapsed())) {
            return Some((s.pods.to_vec(), s.at.elapsed()));
        }
        let path = self.disk.as_ref()?;
        match read(path) {
            Ok(Some((pods, age))) if young(age) => Some((pods, age)),
            Ok(_) => None,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot read the last pod list");
                None
            }
        }
    }

    /// The pods this node has, as far as this instance knows: its follower's last list
    /// whatever its age (pod-sync says nothing while no status changes, so a quiet node's
    /// list grows old and stays right), else [`Self::recent`]'s.
    pub fn latest(&self) -> Option<Vec<Vec<u8>>> {
        let own = self.list.borrow().as_ref().map(|s| s.pods.to_vec());
        own.or_else(|| self.recent().map(|(pods, _)| pods))
    }

    /// The next list of this instance's follower young enough to serve, waiting up to
    /// `within` for one.
    pub async fn next_within(&self, within: Duration) -> Option<Vec<Vec<u8>>> {
        let mut changes = self.list.subscribe();
        let wanted = |v: &Option<Stamped>| v.as_ref().is_some_and(|s| young(s.at.elapsed()));
        let got = tokio::time::timeout(within, changes.wait_for(wanted)).await;
        let got = got.ok()?.ok()?;
        (*got).as_ref().map(|s| s.pods.to_vec())
    }

    /// Writes the list to disk after every change (or touch), at most once per
    /// [`PERSIST_EVERY`], for as long as it runs.
    pub async fn persist(self: Arc<Self>) {
        let Some(path) = self.disk.clone() else {
            return;
        };
        let mut changes = self.list.subscribe();
        changes.mark_changed(); // a list kept before this started
        while changes.changed().await.is_ok() {
            let last = changes.borrow_and_update().clone();
            if let Some(s) = last {
                let to = path.clone();
                let written = tokio::task::spawn_blocking(move || write(&to, &s)).await;
                if let Ok(Err(e)) = written {
                    tracing::warn!(path = %path.display(), error = %e, "cannot keep the last pod list on disk");
                }
            }
            tokio::time::sleep(PERSIST_EVERY).await;
        }
    }
}

fn young(age: Duration) -> bool {
    age < LAST_PODS_MAX_AGE
}

/// The file: `{"at": <unix ms>, "pods": [<pod>, ...]}`, 0600 (pod specs), through a
/// temporary file of this process's own (several instances write it). Not synced: after a
/// crash of the machine a torn or empty file is refused, and the list is long too old to
/// serve anyway.
fn write(path: &Path, s: &Stamped) -> std::io::Result<()> {
    let at = s
        .wall
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    let mut bytes = format!("{{\"at\":{at},\"pods\":[").into_bytes();
    for (i, pod) in s.pods.iter().enumerate() {
        if i > 0 {
            bytes.push(b',');
        }
        bytes.extend_from_slice(pod);
    }
    bytes.extend_from_slice(b"]}");
    nodeagent_config::state::write_unsynced(path, &bytes)
}

/// The list in the file and its age; None when there is no file, or it says it is from
/// the future (the clock was set back: its age is unknown).
fn read(path: &Path) -> std::io::Result<Option<(Vec<Vec<u8>>, Duration)>> {
    #[derive(serde::Deserialize)]
    struct Stored {
        at: u64,
        pods: Vec<serde_json::Value>,
    }
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let stored: Stored = serde_json::from_slice(&bytes).map_err(std::io::Error::other)?;
    let at = SystemTime::UNIX_EPOCH + Duration::from_millis(stored.at);
    let Ok(age) = SystemTime::now().duration_since(at) else {
        return Ok(None);
    };
    let pods = stored
        .pods
        .iter()
        .map(|p| serde_json::to_vec(p).map_err(std::io::Error::other))
        .collect::<Result<_, _>>()?;
    Ok(Some((pods, age)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({"metadata": {"name": name}})).unwrap()
    }

    #[tokio::test]
    async fn an_instance_with_no_list_of_its_own_serves_the_one_another_kept_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        let path = file(dir.path());
        let first = Arc::new(LastPods::new(Some(path.clone())));
        let writer = tokio::spawn(first.clone().persist());
        first.keep(vec![pod("a"), pod("b")]);
        let second = LastPods::new(Some(path.clone()));
        let deadline = Instant::now() + Duration::from_secs(10);
        let (pods, age) = loop {
            if let Some(got) = second.recent() {
                break got;
            }
            assert!(Instant::now() < deadline, "the list never reached the disk");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        writer.abort();
        assert_eq!(pods, vec![pod("a"), pod("b")]);
        assert!(age < LAST_PODS_MAX_AGE);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "pod specs are for root only");
    }

    #[test]
    fn a_list_on_disk_too_old_or_from_the_future_or_torn_is_not_served() {
        let dir = tempfile::tempdir().unwrap();
        let path = file(dir.path());
        let reader = LastPods::new(Some(path.clone()));
        assert!(reader.recent().is_none(), "no file");
        let stamped = |wall| Stamped {
            pods: Arc::new(vec![pod("a")]),
            at: Instant::now(),
            wall,
        };
        let old = SystemTime::now() - LAST_PODS_MAX_AGE - Duration::from_secs(1);
        write(&path, &stamped(old)).unwrap();
        assert!(reader.recent().is_none(), "older than LAST_PODS_MAX_AGE");
        let future = SystemTime::now() + Duration::from_secs(3600);
        write(&path, &stamped(future)).unwrap();
        assert!(reader.recent().is_none(), "from the future");
        std::fs::write(&path, b"{\"at\":1,\"pods\":[{").unwrap();
        assert!(reader.recent().is_none(), "torn");
        write(&path, &stamped(SystemTime::now())).unwrap();
        assert_eq!(reader.recent().unwrap().0, vec![pod("a")]);
    }

    #[test]
    fn a_broken_stream_restamps_the_list_it_held() {
        let last = LastPods::new(None);
        last.keep(vec![pod("a")]);
        let long_ago = Instant::now() - LAST_PODS_MAX_AGE - Duration::from_secs(1);
        last.list.send_modify(|s| s.as_mut().unwrap().at = long_ago);
        assert!(last.recent().is_none(), "pod-sync quiet for over a minute");
        last.touch();
        assert_eq!(last.recent().unwrap().0, vec![pod("a")]);
    }

    #[test]
    fn the_pods_of_a_quiet_node_are_still_its_pods() {
        let last = LastPods::new(None);
        assert!(last.latest().is_none(), "no list yet");
        last.keep(vec![pod("a")]);
        let long_ago = Instant::now() - LAST_PODS_MAX_AGE - Duration::from_secs(1);
        last.list.send_modify(|s| s.as_mut().unwrap().at = long_ago);
        assert!(last.recent().is_none());
        assert_eq!(last.latest().unwrap(), vec![pod("a")]);
    }
}
