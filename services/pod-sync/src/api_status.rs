//! The status manager's API half (when connected to an API server): pod status is patched
//! onto pods that came from the API server, immediately on change and again every
//! `syncPeriod` (10 s), and a gracefully deleted pod is deleted with grace 0 once its
//! containers are gone, which completes the deletion as upstream does.

use crate::PodSync;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use nodeagent_proto::k8s;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// Upstream status manager `syncPeriod`.
const STATUS_RESYNC: Duration = Duration::from_secs(10);

fn from_api(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(k8s::labels::CONFIG_SOURCE))
        .is_some_and(|s| s == "api")
}

/// Patches changed statuses, and all of them every resync period.
pub async fn run(sync: Arc<PodSync>, client: kube::Client) {
    let mut rx = sync.status_tx.subscribe();
    let mut sent: HashMap<String, k8s_openapi::api::core::v1::PodStatus> = HashMap::new();
    let mut resync = tokio::time::interval(STATUS_RESYNC);
    loop {
        let force = tokio::select! {
            _ = sync.shutdown.wait() => return,
            _ = resync.tick() => true,
            m = rx.recv() => {
                if let Ok(update) = &m {
                    for uid in &update.removed_uids {
                        sent.remove(uid);
                    }
                }
                false
            }
        };
        let pods: Vec<Pod> = sync
            .lock()
            .statuses
            .values()
            .filter(|p| from_api(p))
            .cloned()
            .collect();
        for pod in pods {
            let uid = k8s::pod_uid(&pod).to_string();
            let Some(status) = pod.status.clone() else {
                continue;
            };
            if !force && sent.get(&uid) == Some(&status) {
                continue;
            }
            let api: Api<Pod> = Api::namespaced(client.clone(), k8s::pod_namespace(&pod));
            let patch = serde_json::json!({"metadata": {"uid": uid}, "status": status});
            match api
                .patch_status(
                    k8s::pod_name(&pod),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
            {
                Ok(_) => {
                    sent.insert(uid, status);
                }
                Err(e) => {
                    tracing::warn!(pod = %k8s::pod_full_name(&pod), error = %e, "patching pod status failed; will retry")
                }
            }
        }
    }
}

/// Completes a graceful deletion: the pod's containers are gone, so the API object goes.
pub async fn finish_deletion(client: &kube::Client, pod: &Pod) {
    if !from_api(pod) || pod.metadata.deletion_timestamp.is_none() {
        return;
    }
    let api: Api<Pod> = Api::namespaced(client.clone(), k8s::pod_namespace(pod));
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: pod.metadata.uid.clone(),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(k8s::pod_name(pod), &params).await {
        Ok(_) => tracing::info!(pod = %k8s::pod_full_name(pod), "graceful deletion completed"),
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => {
            tracing::warn!(pod = %k8s::pod_full_name(pod), error = %e, "completing the deletion failed")
        }
    }
}
