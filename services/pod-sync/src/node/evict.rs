//! Local-storage eviction of one pod (upstream eviction manager's `emptyDirLimitEviction`):
//! an emptyDir on disk that uses more than its `sizeLimit` evicts its pod at once (grace
//! period 0, as upstream for local storage), which ends Failed with reason Evicted,
//! upstream's message, a DisruptionTarget condition and an Evicted Warning event.
//!
//! The volume service measures the usage at every set-up (each pod sync), so the check runs
//! every `syncFrequency` for a running pod. Node-level eviction (pressure signals, ranking)
//! is not here.

use crate::PodSync;
use crate::status::Waiting;
use crate::status::reasons::EVICTED;
use k8s_openapi::api::core::v1::Pod;
use nodeagent_proto::api::{EmptyDirOverLimit, RuntimePodStatus};
use nodeagent_proto::k8s;

/// Upstream `emptyDirMessageFmt` (the trailing space is upstream's).
pub fn empty_dir_message(over: &EmptyDirOverLimit) -> String {
    format!(
        "Usage of EmptyDir volume {:?} exceeds the limit {:?}. ",
        over.volume, over.size_limit
    )
}

impl PodSync {
    /// Evicts `pod` if a volume is over its limit; true if it did (the sync is over).
    /// A pod evicted before is stopped by `sync_pod` before its volumes are set up.
    pub(crate) async fn evict_for_local_storage(
        &self,
        pod: &Pod,
        rt: &RuntimePodStatus,
        over: &[EmptyDirOverLimit],
    ) -> bool {
        let Some(first) = over.first() else {
            return false;
        };
        let message = empty_dir_message(first);
        tracing::warn!(
            volume = %first.volume,
            size_limit = %first.size_limit,
            used_bytes = first.used_bytes,
            "evicting the pod: an emptyDir exceeds its sizeLimit"
        );
        self.lock().pod_failed.insert(
            k8s::pod_uid(pod).to_string(),
            Waiting {
                reason: EVICTED.into(),
                message: message.clone(),
            },
        );
        self.events.pod(
            pod,
            nodeagent_config::events::EventType::Warning,
            EVICTED,
            &message,
        );
        self.stop_everything(pod, rt, EVICTED, Some(0)).await;
        nodeagent_telemetry::metrics::kubelet::record_eviction(
            crate::node::eviction::SIGNAL_EMPTY_DIR_FS_LIMIT,
        );
        true
    }

    /// Why the node ended the pod for good, if it did: evicted, preempted, or stopped or
    /// refused for a node shutdown (its sync then only stops what still runs).
    pub(crate) fn ended_by_node(&self, uid: &str) -> Option<String> {
        let st = self.lock();
        st.pod_failed
            .get(uid)
            .map(|f| f.reason.clone())
            .filter(|r| {
                [
                    EVICTED,
                    crate::status::reasons::PREEMPTED_REASON,
                    crate::status::reasons::SHUTDOWN_REASON,
                    crate::status::reasons::SHUTDOWN_REFUSAL_REASON,
                ]
                .contains(&r.as_str())
            })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_message_is_upstreams() {
        let over = nodeagent_proto::api::EmptyDirOverLimit {
            volume: "scratch".into(),
            size_limit: "1Mi".into(),
            used_bytes: 5 << 20,
        };
        assert_eq!(
            super::empty_dir_message(&over),
            "Usage of EmptyDir volume \"scratch\" exceeds the limit \"1Mi\". "
        );
    }
}
