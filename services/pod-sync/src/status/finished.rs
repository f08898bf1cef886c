//! Finished pods, kept on disk. A pod whose phase became Succeeded or Failed never runs
//! again (upstream's `SyncPod` returns before making anything for it), even after a
//! pod-sync restart that finds its dead containers and sandbox removed (by the container
//! GC, `crictl rm`, an operator). An API pod's terminal status is also at the API server;
//! a static pod's is nowhere else, so without this file a finished static pod ran again
//! after a restart. `<root-dir>/pod-sync/finished-pods.json` maps each finished pod's uid
//! to the status it last published; an entry goes when its pod is cleaned up, or when the
//! pod sources, all of them listed, no longer have the pod.

use crate::PodSync;
use crate::saved::JsonFile;
use k8s_openapi::api::core::v1::PodStatus;
use std::collections::BTreeMap;
use std::path::Path;

/// uid -> the terminal status the pod last published.
pub type Finished = BTreeMap<String, PodStatus>;

/// `<root-dir>/pod-sync/finished-pods.json`.
pub type Store = JsonFile<Finished>;

pub fn store(root_dir: &Path) -> Store {
    Store::new(root_dir, "finished-pods.json")
}

/// Records `status` for `uid` when its phase is terminal (and differs from the record);
/// true when the record changed and must be saved.
pub fn record(finished: &mut Finished, uid: &str, status: &PodStatus) -> bool {
    if !super::is_terminal(status.phase.as_deref()) {
        return false;
    }
    if finished.get(uid) == Some(status) {
        return false;
    }
    finished.insert(uid.to_string(), status.clone());
    true
}

impl PodSync {
    /// Writes the finished pods' records as they are now. Saves are serialized and each
    /// writes the latest records, so the file never goes back to an older set.
    pub(crate) async fn save_finished(&self) {
        let _one_at_a_time = self.finished_saves.lock().await;
        let records = self.lock().finished.clone();
        if let Err(e) = self.finished_store.save(&records).await {
            tracing::warn!(error = %e, "cannot keep the finished pods' records; a finished static pod whose containers are removed could run again after a restart");
        }
    }

    /// Forgets the records of pods that no source wants and that are not being terminated
    /// (removed while pod-sync was down); saves when something went.
    pub(crate) fn prune_finished(self: &std::sync::Arc<Self>) {
        let pruned = {
            let mut st = self.lock();
            if !st.sources_ready {
                return;
            }
            let st = &mut *st;
            let before = st.finished.len();
            let (desired, terminating) = (&st.desired, &st.terminating);
            st.finished
                .retain(|uid, _| desired.contains_key(uid) || terminating.contains_key(uid));
            before != st.finished.len()
        };
        if pruned {
            let this = self.clone();
            tokio::spawn(async move { this.save_finished().await });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(phase: &str) -> PodStatus {
        PodStatus {
            phase: Some(phase.into()),
            ..Default::default()
        }
    }

    #[test]
    fn only_terminal_statuses_are_recorded_once() {
        let mut finished = Finished::new();
        assert!(!record(&mut finished, "a", &status("Running")));
        assert!(!record(&mut finished, "a", &status("Pending")));
        assert!(finished.is_empty());
        assert!(record(&mut finished, "a", &status("Succeeded")));
        assert!(
            !record(&mut finished, "a", &status("Succeeded")),
            "unchanged: no save"
        );
        assert!(record(&mut finished, "b", &status("Failed")));
        assert_eq!(finished.len(), 2);
    }

    #[tokio::test]
    async fn records_survive_a_restart_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        let mut finished = Finished::new();
        record(&mut finished, "a", &status("Succeeded"));
        store(dir.path()).save(&finished).await.unwrap();
        assert_eq!(store(dir.path()).load().await, finished);
    }
}
