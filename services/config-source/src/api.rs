//! The API server source: a kube-rs watcher of the pods bound to this node
//! (`spec.nodeName=<node>`, all namespaces). The watcher re-lists after `410 Gone` and
//! backs off on errors; each complete list and each change becomes the "api" source's
//! full set in the store (SET semantics). Invalid pods are refused with a log line and a
//! Warning Event on the pod.
//!
//! The last list is kept in a checkpoint file (`<root-dir>/config-source/api-pods.json`): a
//! config-source that starts while the API server is unreachable serves those pods as the
//! "api" set, so their statuses stay in every view, but does not count the source as listed,
//! so nothing absent from the checkpoint is removed on its word. The first real list
//! replaces it.

use crate::store::PodStore;
use crate::{manifest, validation};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event as WatchEvent};
use nodeagent_proto::k8s;
use nodeagent_transport::Shutdown;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A checkpoint is written at most this often (status patches change pods often).
const CHECKPOINT_PERIOD: Duration = Duration::from_secs(2);
/// A checkpoint larger than this is not read (maxPods pods of at most 1.5 MiB each fit).
const CHECKPOINT_MAX_BYTES: u64 = 256 << 20;

pub struct ApiSource {
    client: kube::Client,
    node_name: String,
    store: Arc<Mutex<PodStore>>,
    /// uids already reported as invalid (one log line and one Event each).
    reported: HashSet<String>,
    /// The last list, kept across restarts.
    checkpoint: Checkpoint,
}

impl ApiSource {
    pub fn new(
        client: kube::Client,
        node_name: String,
        store: Arc<Mutex<PodStore>>,
        root_dir: &Path,
    ) -> Self {
        Self {
            client,
            node_name,
            store,
            reported: HashSet::new(),
            checkpoint: Checkpoint {
                path: root_dir.join("config-source").join("api-pods.json"),
                saved: BTreeSet::new(),
                dirty: false,
            },
        }
    }

    pub async fn run(mut self, shutdown: Shutdown) {
        let api: Api<Pod> = Api::all(self.client.clone());
        let config =
            watcher::Config::default().fields(&format!("spec.nodeName={}", self.node_name));
        let mut stream = watcher::watcher(api, config).default_backoff().boxed();
        let mut pods: BTreeMap<String, Pod> = BTreeMap::new();
        let mut listing: BTreeMap<String, Pod> = BTreeMap::new();
        let mut last_error = String::new();
        self.restore(&mut pods).await;
        // Until the first list the set is the restored checkpoint: nothing to save.
        let mut listed = false;
        let mut tick = tokio::time::interval(CHECKPOINT_PERIOD);
        loop {
            let event = tokio::select! {
                _ = shutdown.wait() => return,
                _ = tick.tick() => {
                    self.checkpoint.flush(&pods).await;
                    continue;
                }
                e = stream.next() => match e {
                    Some(e) => e,
                    None => return,
                },
            };
            match event {
                Ok(WatchEvent::Init) => listing.clear(),
                Ok(WatchEvent::InitApply(p)) => {
                    listing.insert(k8s::pod_uid(&p).to_string(), p);
                }
                Ok(WatchEvent::InitDone) => {
                    pods = std::mem::take(&mut listing);
                    tracing::info!(pods = pods.len(), "API server pods listed");
                    last_error.clear();
                    listed = true;
                    self.publish(&pods).await;
                }
                Ok(WatchEvent::Apply(p)) => {
                    pods.insert(k8s::pod_uid(&p).to_string(), p);
                    self.publish(&pods).await;
                }
                Ok(WatchEvent::Delete(p)) => {
                    let uid = k8s::pod_uid(&p).to_string();
                    // A force delete of a pod (its last copy says period 0, maybe during a
                    // graceful deletion): pod-sync hears of the shorter period before the
                    // pod goes, as upstream's kubelet takes it from that copy.
                    if shortens_deletion(pods.get(&uid), &p) {
                        pods.insert(uid.clone(), p);
                        self.publish(&pods).await;
                    }
                    pods.remove(&uid);
                    self.publish(&pods).await;
                }
                Err(e) => {
                    let text = e.to_string();
                    if text != last_error {
                        tracing::warn!(source = "api", error = %text, "API server watch failed; retrying with back-off");
                        last_error = text;
                    }
                    continue;
                }
            }
            if listed {
                self.checkpoint.changed(&pods).await;
            }
        }
    }

    /// Serves the checkpointed list, if any, until the API server lists.
    async fn restore(&mut self, pods: &mut BTreeMap<String, Pod>) {
        let path = self.checkpoint.path.clone();
        let read = tokio::task::spawn_blocking(move || read_checkpoint(&path)).await;
        match read {
            Ok(Ok(Some(restored))) if !restored.is_empty() => {
                tracing::info!(pods = restored.len(), checkpoint = %self.checkpoint.path.display(), "serving the API server's last list until it answers");
                self.checkpoint.saved = restored.keys().cloned().collect();
                *pods = restored;
                let valid = self.valid_pods(pods).await;
                crate::store::publish_listed(&self.store, "api", valid, false);
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::warn!(checkpoint = %self.checkpoint.path.display(), error = %e, "API pod checkpoint unreadable; ignored")
            }
            Err(e) => tracing::warn!(error = %e, "API pod checkpoint read failed"),
        }
    }

    /// Validates every pod and hands the valid ones to the store as the "api" set.
    async fn publish(&mut self, pods: &BTreeMap<String, Pod>) {
        let valid = self.valid_pods(pods).await;
        crate::store::publish(&self.store, "api", valid);
    }

    /// The pods to run: mirror pods skipped, defaults applied, invalid ones refused (one
    /// log line and one Event each).
    async fn valid_pods(&mut self, pods: &BTreeMap<String, Pod>) -> Vec<Pod> {
        let mut valid = Vec::new();
        for pod in pods.values() {
            // A mirror pod is this node's own record of a static pod: never run it.
            let mirror = pod
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(k8s::labels::CONFIG_MIRROR));
            if mirror {
                continue;
            }
            let mut pod = pod.clone();
            manifest::apply_api_defaults(&mut pod);
            pod.metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(k8s::labels::CONFIG_SOURCE.into(), "api".into());
            match validation::validate_pod(&pod) {
                Ok(()) => valid.push(pod),
                Err(reason) => {
                    let uid = k8s::pod_uid(&pod).to_string();
                    if self.reported.insert(uid) {
                        tracing::error!(source = "api", pod = %k8s::pod_full_name(&pod), %reason, "invalid pod refused");
                        self.warn(
                            &pod,
                            &format!(
                                "Error validating pod {} from api, ignoring: {reason}",
                                k8s::pod_full_name(&pod)
                            ),
                        )
                        .await;
                    }
                }
            }
        }
        valid
    }

    /// Records a Warning Event on the pod (reason FailedValidation, as upstream).
    async fn warn(&self, pod: &Pod, message: &str) {
        use nodeagent_config::events::{EventType, post};
        let (ty, reason) = (EventType::Warning, "FailedValidation");
        post(&self.client, pod, ty, reason, message, &self.node_name).await;
    }
}

/// The checkpoint file and what was last written to it.
struct Checkpoint {
    path: PathBuf,
    /// UIDs in the file: a pod added or removed is written at once, other changes (status
    /// patches, often) at most every [`CHECKPOINT_PERIOD`].
    saved: BTreeSet<String>,
    dirty: bool,
}

impl Checkpoint {
    async fn changed(&mut self, pods: &BTreeMap<String, Pod>) {
        self.dirty = true;
        if !pods.keys().eq(self.saved.iter()) {
            self.flush(pods).await;
        }
    }

    /// Writes the list if it changed (temp file and rename, on the blocking pool).
    async fn flush(&mut self, pods: &BTreeMap<String, Pod>) {
        if !self.dirty {
            return;
        }
        self.dirty = false;
        self.saved = pods.keys().cloned().collect();
        let list: Vec<Pod> = pods.values().cloned().collect();
        let path = self.path.clone();
        let written = tokio::task::spawn_blocking(move || write_checkpoint(&path, &list)).await;
        if let Ok(Err(e)) | Err(e) = written.map_err(std::io::Error::other) {
            tracing::warn!(checkpoint = %self.path.display(), error = %e, "API pod checkpoint not written");
        }
    }
}

fn read_checkpoint(path: &Path) -> std::io::Result<Option<BTreeMap<String, Pod>>> {
    use std::io::Read;
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let size = file.metadata()?.len();
    if size > CHECKPOINT_MAX_BYTES {
        return Err(std::io::Error::other(format!(
            "{size} bytes, more than {CHECKPOINT_MAX_BYTES}"
        )));
    }
    let mut data = Vec::new();
    file.take(CHECKPOINT_MAX_BYTES).read_to_end(&mut data)?;
    let list: Vec<Pod> = serde_json::from_slice(&data).map_err(std::io::Error::other)?;
    Ok(Some(
        list.into_iter()
            .map(|p| (k8s::pod_uid(&p).to_string(), p))
            .collect(),
    ))
}

fn write_checkpoint(path: &Path, pods: &[Pod]) -> std::io::Result<()> {
    nodeagent_config::state::write_json(path, &pods)
}

/// Whether the deleted copy of a pod asks for a shorter deletion than the copy we hold.
fn shortens_deletion(held: Option<&Pod>, deleted: &Pod) -> bool {
    let Some(new) = deleted.metadata.deletion_grace_period_seconds else {
        return false;
    };
    held.is_some_and(|old| {
        old.metadata
            .deletion_grace_period_seconds
            .is_none_or(|g| new < g)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_round_trips_and_a_missing_one_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config-source/api-pods.json");
        assert!(read_checkpoint(&path).unwrap().is_none());
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a", "namespace": "default", "uid": "u1"},
            "spec": {"containers": [{"name": "c", "image": "i"}]}
        }))
        .unwrap();
        write_checkpoint(&path, std::slice::from_ref(&pod)).unwrap();
        let back = read_checkpoint(&path).unwrap().unwrap();
        assert_eq!(back.get("u1"), Some(&pod));
        std::fs::write(&path, b"{not json").unwrap();
        assert!(read_checkpoint(&path).is_err());
    }

    fn pod(grace: Option<i64>) -> Pod {
        let mut p = Pod::default();
        p.metadata.deletion_grace_period_seconds = grace;
        p
    }

    #[test]
    fn only_a_shorter_deletion_is_passed_on_before_the_pod_goes() {
        assert!(shortens_deletion(Some(&pod(Some(300))), &pod(Some(0))));
        assert!(shortens_deletion(Some(&pod(None)), &pod(Some(0))));
        assert!(!shortens_deletion(Some(&pod(Some(30))), &pod(Some(30))));
        assert!(!shortens_deletion(Some(&pod(Some(30))), &pod(None)));
        assert!(!shortens_deletion(None, &pod(Some(0))));
    }
}
