//! The merged desired state: each source delivers its complete set of pods (SET
//! semantics, as upstream `PodConfig` in `PodConfigNotificationIncremental` mode), and the
//! store turns the difference into ADD / UPDATE / REMOVE deltas with revisions.

use k8s_openapi::api::core::v1::Pod;
use nodeagent_proto::api::{PodConfigUpdate, SourcePod, TraceContext, pod_config_update::Op};
use nodeagent_proto::k8s::{self, labels};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use tokio::sync::broadcast;

pub struct PodStore {
    /// source -> uid -> pod.
    sources: BTreeMap<String, BTreeMap<String, Pod>>,
    /// Sources configured on this node; "all sources ready" waits for each.
    configured: BTreeSet<String>,
    seen: BTreeSet<String>,
    /// Sources whose set was restored from a checkpoint and has not been listed since.
    restored: BTreeSet<String>,
    /// uid -> when first seen (the config.seen annotation), stable across re-reads.
    first_seen: HashMap<String, String>,
    /// uid -> trace context of the pod's last change.
    traces: HashMap<String, TraceContext>,
    revision: u64,
    tx: broadcast::Sender<PodConfigUpdate>,
}

impl PodStore {
    pub fn new(configured: impl IntoIterator<Item = &'static str>) -> Self {
        let (tx, _) = broadcast::channel(1024);
        Self {
            sources: BTreeMap::new(),
            configured: configured.into_iter().map(String::from).collect(),
            seen: BTreeSet::new(),
            restored: BTreeSet::new(),
            first_seen: HashMap::new(),
            traces: HashMap::new(),
            revision: 0,
            tx,
        }
    }

    pub fn all_sources_ready(&self) -> bool {
        self.configured.iter().all(|s| self.seen.contains(s))
    }

    /// Every source has listed or served a restored set.
    pub fn all_sources_served(&self) -> bool {
        self.configured
            .iter()
            .all(|s| self.seen.contains(s) || self.restored.contains(s))
    }

    /// The full desired set, and a receiver for every delta after it.
    pub fn subscribe(&self) -> (PodConfigUpdate, broadcast::Receiver<PodConfigUpdate>) {
        let pods = self
            .sources
            .iter()
            .flat_map(|(source, pods)| pods.values().map(move |p| source_pod(source, p)))
            .map(|mut sp| {
                sp.trace = self.traces.get(&sp.uid).cloned();
                sp
            })
            .collect();
        (self.message(Op::Snapshot, pods), self.tx.subscribe())
    }

    fn message(&self, op: Op, pods: Vec<SourcePod>) -> PodConfigUpdate {
        PodConfigUpdate {
            op: op as i32,
            revision: self.revision,
            pods,
            sources_seen: self.seen.iter().cloned().collect(),
            all_sources_ready: self.all_sources_ready(),
            all_sources_served: self.all_sources_served(),
            trace: nodeagent_telemetry::current_trace_context(),
            snapshot_continues: false,
        }
    }

    /// Replaces one source's pods; sends the deltas. Returns the names refused because
    /// another source (or an earlier entry) already has a pod of that name.
    pub fn set_source(&mut self, source: &str, pods: Vec<Pod>) -> Vec<String> {
        self.set_source_pods(source, pods, true)
    }

    /// Like [`Self::set_source`], but for a set restored from a checkpoint: the source has
    /// not listed yet, so "all sources ready" still waits for it (nothing absent from a
    /// checkpoint may be removed on its word).
    pub fn restore_source(&mut self, source: &str, pods: Vec<Pod>) -> Vec<String> {
        self.set_source_pods(source, pods, false)
    }

    fn set_source_pods(&mut self, source: &str, pods: Vec<Pod>, listed: bool) -> Vec<String> {
        let mut refused = Vec::new();
        let taken: BTreeSet<String> = self
            .sources
            .iter()
            .filter(|(s, _)| s.as_str() != source)
            .flat_map(|(_, pods)| pods.values().map(full_name))
            .collect();
        let mut next = BTreeMap::new();
        let mut names = BTreeSet::new();
        for mut pod in pods {
            let name = full_name(&pod);
            if taken.contains(&name) || !names.insert(name.clone()) {
                refused.push(name);
                continue;
            }
            let uid = k8s::pod_uid(&pod).to_string();
            let seen = self
                .first_seen
                .entry(uid.clone())
                .or_insert_with(now_rfc3339)
                .clone();
            pod.metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(labels::CONFIG_SEEN.into(), seen);
            next.insert(uid, pod);
        }
        let prev = self.sources.remove(source).unwrap_or_default();
        let added: Vec<SourcePod> = next
            .iter()
            .filter(|(uid, _)| !prev.contains_key(*uid))
            .map(|(_, p)| source_pod(source, p))
            .collect();
        let updated: Vec<SourcePod> = next
            .iter()
            .filter(|(uid, p)| prev.get(*uid).is_some_and(|old| old != *p))
            .map(|(_, p)| source_pod(source, p))
            .collect();
        let removed: Vec<SourcePod> = prev
            .iter()
            .filter(|(uid, _)| !next.contains_key(*uid))
            .map(|(_, p)| source_pod(source, p))
            .collect();
        for p in &removed {
            self.first_seen.remove(&p.uid);
        }
        self.sources.insert(source.to_string(), next);
        // The deltas of a source's first list still say "not all sources ready": a consumer
        // that acted on the first of them would take every pod not yet added for unwanted.
        // The source counts as seen once all of them are sent.
        let first_list = listed && !self.seen.contains(source);
        let first_restore =
            !listed && !self.seen.contains(source) && !self.restored.contains(source);
        // A pod that gained a deletionTimestamp is being deleted gracefully: DELETE.
        let (deleting, updated): (Vec<SourcePod>, Vec<SourcePod>) =
            updated.into_iter().partition(|sp| {
                k8s::decode_pod(&sp.pod_json).is_ok_and(|p| p.metadata.deletion_timestamp.is_some())
            });
        for (op, pods) in [
            (Op::Remove, removed),
            (Op::Add, added),
            (Op::Update, updated),
            (Op::Delete, deleting),
        ] {
            // One message per pod change, each in its own span: one pod change is one
            // trace across config-source, pod-sync, volume, pleg and the runtime.
            for mut pod in pods {
                let span = change_span(op, &pod);
                self.revision += 1;
                pod.trace = span.in_scope(nodeagent_telemetry::current_trace_context);
                match (&pod.trace, op) {
                    (Some(t), Op::Add | Op::Update) => {
                        self.traces.insert(pod.uid.clone(), t.clone());
                    }
                    _ => {
                        self.traces.remove(&pod.uid);
                    }
                }
                let message = span.in_scope(|| self.message(op, vec![pod]));
                let _ = self.tx.send(message);
            }
        }
        if first_list {
            self.seen.insert(source.to_string());
            self.restored.remove(source);
        }
        if first_restore {
            self.restored.insert(source.to_string());
        }
        if (first_list && self.all_sources_ready())
            || (first_restore && self.all_sources_served() && !self.all_sources_ready())
        {
            // Tell watchers that every source has now delivered its first list (or a
            // restored one).
            self.revision += 1;
            let _ = self.tx.send(self.message(Op::Reconcile, Vec::new()));
        }
        refused
    }
}

/// Hands one source's complete set to the store and reports the pods it refused.
pub fn publish(store: &std::sync::Mutex<PodStore>, source: &str, pods: Vec<Pod>) {
    publish_listed(store, source, pods, true);
}

/// [`publish`], or with `listed: false` a restored set that does not count as the source's
/// first list.
pub fn publish_listed(
    store: &std::sync::Mutex<PodStore>,
    source: &str,
    pods: Vec<Pod>,
    listed: bool,
) {
    let mut store = store.lock().unwrap_or_else(|e| e.into_inner());
    let refused = if listed {
        store.set_source(source, pods)
    } else {
        store.restore_source(source, pods)
    };
    drop(store);
    for name in refused {
        tracing::error!(source, pod = %name, "duplicate pod name; only the first definition is used");
    }
}

fn change_span(op: Op, pod: &SourcePod) -> tracing::Span {
    let decoded = k8s::decode_pod(&pod.pod_json).unwrap_or_default();
    tracing::info_span!(
        "pod_config_change",
        otel.name = %format_args!("config-source {}", op.as_str_name()),
        k8s.pod.uid = %pod.uid,
        k8s.pod.name = %k8s::pod_name(&decoded),
        k8s.namespace.name = %k8s::pod_namespace(&decoded),
        source = %pod.source,
    )
}

fn full_name(pod: &Pod) -> String {
    format!("{}/{}", k8s::pod_namespace(pod), k8s::pod_name(pod))
}

fn source_pod(source: &str, pod: &Pod) -> SourcePod {
    SourcePod {
        source: source.to_string(),
        pod_json: k8s::encode_pod(pod),
        uid: k8s::pod_uid(pod).to_string(),
        trace: None,
    }
}

fn now_rfc3339() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or_default();
    k8s_openapi::jiff::Timestamp::from_nanosecond(nanos)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, uid: &str, image: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "default", "uid": uid},
            "spec": {"containers": [{"name": "c", "image": image}]}
        }))
        .unwrap()
    }

    fn ops(rx: &mut broadcast::Receiver<PodConfigUpdate>) -> Vec<(Op, Vec<String>)> {
        let mut out = Vec::new();
        while let Ok(m) = rx.try_recv() {
            out.push((m.op(), m.pods.iter().map(|p| p.uid.clone()).collect()));
        }
        out
    }

    #[test]
    fn set_semantics_produce_deltas() {
        let mut store = PodStore::new(["file"]);
        let (snap, mut rx) = store.subscribe();
        assert_eq!(snap.op(), Op::Snapshot);
        assert!(!snap.all_sources_ready);

        store.set_source("file", vec![pod("a", "1", "x:1"), pod("b", "2", "x:1")]);
        assert_eq!(
            ops(&mut rx),
            vec![
                (Op::Add, vec!["1".into()]),
                (Op::Add, vec!["2".into()]),
                (Op::Reconcile, vec![])
            ]
        );
        assert!(store.all_sources_ready());

        store.set_source("file", vec![pod("a", "1", "x:2"), pod("c", "3", "x:1")]);
        assert_eq!(
            ops(&mut rx),
            vec![
                (Op::Remove, vec!["2".into()]),
                (Op::Add, vec!["3".into()]),
                (Op::Update, vec!["1".into()])
            ]
        );
        // The same set again changes nothing.
        store.set_source("file", vec![pod("a", "1", "x:2"), pod("c", "3", "x:1")]);
        assert!(ops(&mut rx).is_empty());

        let (snap, _) = store.subscribe();
        assert_eq!(snap.pods.len(), 2);
        assert!(snap.all_sources_ready);
    }

    #[test]
    fn no_delta_of_a_first_list_claims_every_source_ready() {
        let mut store = PodStore::new(["file"]);
        let (_, mut rx) = store.subscribe();
        store.set_source("file", vec![pod("a", "u1", "i"), pod("b", "u2", "i")]);
        let mut ready = Vec::new();
        while let Ok(m) = rx.try_recv() {
            ready.push((m.op(), m.all_sources_ready));
        }
        assert_eq!(
            ready,
            vec![(Op::Add, false), (Op::Add, false), (Op::Reconcile, true)]
        );
        store.set_source("file", vec![pod("a", "u1", "i")]);
        assert!(
            rx.try_recv().unwrap().all_sources_ready,
            "later lists: ready"
        );
    }

    #[test]
    fn a_restored_set_is_served_but_does_not_make_the_source_ready() {
        let mut store = PodStore::new(["api"]);
        let (_, mut rx) = store.subscribe();
        store.restore_source("api", vec![pod("a", "u1", "i")]);
        assert!(!store.all_sources_ready());
        assert!(store.all_sources_served());
        assert_eq!(
            ops(&mut rx),
            vec![(Op::Add, vec!["u1".to_string()]), (Op::Reconcile, vec![])]
        );
        store.set_source("api", vec![]);
        assert!(store.all_sources_ready());
        assert_eq!(
            ops(&mut rx),
            vec![
                (Op::Remove, vec!["u1".to_string()]),
                (Op::Reconcile, vec![])
            ]
        );
    }

    #[test]
    fn a_duplicate_name_is_refused_not_duplicated() {
        let mut store = PodStore::new(["file", "http"]);
        store.set_source("file", vec![pod("a", "1", "x:1")]);
        let refused = store.set_source("http", vec![pod("a", "9", "x:1"), pod("b", "2", "x:1")]);
        assert_eq!(refused, vec!["default/a".to_string()]);
        assert_eq!(store.subscribe().0.pods.len(), 2);
    }
}
