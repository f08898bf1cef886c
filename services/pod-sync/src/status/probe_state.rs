//! Probe results as pod-sync holds them, so that a restart of probe, of pod-sync, or of
//! both flips no `ready` or `started` value (upstream shipped that bug repeatedly:
//! kubernetes #78733, #125397, #135795, #142305).
//!
//! - Values are keyed by container ID, so a new container (a new ID) starts as upstream:
//!   not ready, and not started until its startup probe passes.
//! - Only a result a probe worker actually produced changes a value. A probe snapshot
//!   (after probe or pod-sync reconnects) replaces nothing: a container absent from it
//!   keeps its value, so a restarted probe, whose workers start with fresh counters, does
//!   not make a passing container unready while it re-proves it. A real Failure (after
//!   `failureThreshold` fresh failures) still flips it.
//! - The ready/started values are written to `<root-dir>/pod-sync/probe-values.json`
//!   (temp file + rename, on a blocking thread) BEFORE pod-sync uses them, and read back
//!   at start: a restarted pod-sync publishes what it published last, not "not ready"
//!   until probe's snapshot arrives. Entries of containers the runtime no longer has are
//!   pruned. Liveness failures are not kept: after a restart they need real failures
//!   again, with fresh counters, as upstream.

use nodeagent_proto::api::ProbeResultUpdate;
use nodeagent_proto::api::probe_result::{Kind, Outcome};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::path::Path;

/// The probe-derived values pod-sync publishes from, per container ID.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeValues {
    /// container ID -> the last readiness result.
    pub ready: HashMap<String, bool>,
    /// Containers whose startup probe has succeeded.
    pub started: HashSet<String>,
}

impl ProbeValues {
    /// Applies the results a probe produced; returns the uids of pods that changed. A
    /// snapshot is applied like a delta: what it leaves out keeps its value.
    pub fn apply(
        &mut self,
        liveness_failed: &mut HashSet<String>,
        update: &ProbeResultUpdate,
    ) -> Vec<String> {
        let mut touched = Vec::new();
        for r in &update.results {
            let id = r.container_id.clone();
            let success = r.outcome() == Outcome::Success;
            let changed = match (r.kind(), success) {
                (Kind::Readiness, _) => self.ready.insert(id, success) != Some(success),
                (Kind::Startup, true) => self.started.insert(id),
                // A failed startup probe kills the container, as a failed liveness one does.
                (Kind::Liveness | Kind::Startup, false) => {
                    tracing::info!(pod.uid = %r.pod_uid, k8s.container.name = %r.container_name, message = %r.message, kind = ?r.kind(), "probe failed");
                    liveness_failed.insert(id);
                    true
                }
                (Kind::Liveness, true) => liveness_failed.remove(&id),
                (Kind::Unspecified, _) => false,
            };
            if changed {
                touched.push(r.pod_uid.clone());
            }
        }
        touched.sort();
        touched.dedup();
        touched
    }

    /// Forgets containers the runtime no longer has; true when something went.
    pub fn prune(&mut self, live: &HashSet<&str>) -> bool {
        let before = (self.ready.len(), self.started.len());
        self.ready.retain(|id, _| live.contains(id.as_str()));
        self.started.retain(|id| live.contains(id.as_str()));
        before != (self.ready.len(), self.started.len())
    }
}

/// Where the values live on disk: `<root-dir>/pod-sync/probe-values.json`.
pub type Store = crate::saved::JsonFile<ProbeValues>;

/// The probe values' file under `root_dir`.
pub fn store(root_dir: &Path) -> Store {
    Store::new(root_dir, "probe-values.json")
}

#[cfg(test)]
mod tests;
