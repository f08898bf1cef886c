//! The status manager's API half (when connected to an API server): pod status is patched
//! onto pods that came from the API server, immediately on change and again every
//! `syncPeriod` (10 s); static pods get a mirror pod that carries their status; and a
//! gracefully deleted pod is deleted with grace 0 once its
//! containers are gone, which completes the deletion as upstream does.

use crate::PodSync;
use crate::runtime_spec::EnvRefs;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, PodStatus, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use nodeagent_proto::k8s;
use std::collections::BTreeMap;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// Upstream status manager `syncPeriod`.
pub(crate) const STATUS_RESYNC: Duration = Duration::from_secs(10);

fn from_api(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(k8s::labels::CONFIG_SOURCE))
        .is_some_and(|s| s == "api")
}

pub(crate) fn is_static(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(k8s::labels::CONFIG_SOURCE))
        .is_some_and(|s| s == "file" || s == "http")
}

/// What the loop does with one pod's status once it was not skipped ([`unchanged`]).
#[derive(Debug, PartialEq)]
pub(crate) enum Step {
    /// The API server has it already: remembered as sent, and no call (upstream patches
    /// only a status that differs).
    AlreadyThere(PodStatus),
    /// A strategic merge patch of `diff`; once it succeeds, `status` is what was sent.
    Patch {
        status: PodStatus,
        diff: serde_json::Value,
    },
}

/// Upstream's `updateStatusInternal`: a status equal, as far as the kubelet writes it
/// (`isPodStatusByKubeletEqual`), to the last one sent is not sent again, but at a resync.
/// Compared with what was sent, merged: a status whose merge held a terminal phase back
/// differs from it, so it is merged again at the next change and goes out as soon as no
/// container may run, not only at the resync.
pub(crate) fn unchanged(new: &PodStatus, sent: Option<&PodStatus>, resync: bool) -> bool {
    !resync && sent.is_some_and(|sent| super::merge::equal_by_kubelet(sent, new))
}

/// Upstream's `syncPod`, the decision: the new status merged with the API server's copy
/// (`mergePodStatus`: no terminal phase while a container may still run), then a two-way
/// patch from what the API server has (what was last sent, or at a resync, which repairs
/// drift, and before the first patch, the API server's copy as last seen), sent only when
/// it is not empty.
pub(crate) fn plan(
    new: PodStatus,
    sent: Option<&PodStatus>,
    api_view: Option<&PodStatus>,
    resync: bool,
    could_have_running: bool,
) -> Step {
    let base = api_view.or(sent).cloned().unwrap_or_default();
    let status = super::merge::merge_pod_status(&base, new, could_have_running);
    let old = match (resync, sent) {
        (false, Some(sent)) => Some(sent),
        _ => api_view,
    };
    let diff = nodeagent_config::status_patch::two_way(
        &serde_json::to_value(old).unwrap_or_default(),
        &serde_json::to_value(&status).unwrap_or_default(),
    );
    if diff.as_object().is_some_and(|d| d.is_empty()) {
        Step::AlreadyThere(status)
    } else {
        Step::Patch { status, diff }
    }
}

/// Patches changed statuses, and all of them every resync period. Static pods get a
/// mirror pod (annotation `kubernetes.io/config.mirror`), which carries their status.
pub async fn run(sync: Arc<PodSync>, client: kube::Client) {
    let mut rx = sync.status_tx.subscribe();
    let mut sent: HashMap<String, k8s_openapi::api::core::v1::PodStatus> = HashMap::new();
    // static pod uid -> (namespace, name) of its mirror pod.
    let mut mirrors: HashMap<String, (String, String)> = HashMap::new();
    let mut resync = tokio::time::interval(STATUS_RESYNC);
    loop {
        let (force, removed) = tokio::select! {
            _ = sync.shutdown.wait() => return,
            _ = resync.tick() => (true, Vec::new()),
            m = rx.recv() => (false, m.map(|u| u.removed_uids).unwrap_or_default()),
        };
        for uid in removed {
            sent.remove(&uid);
            if let Some((ns, name)) = mirrors.remove(&uid) {
                delete_mirror(&client, &ns, &name).await;
            }
        }
        let pods: Vec<Pod> = sync
            .lock()
            .statuses
            .values()
            .filter(|p| from_api(p) || is_static(p))
            .cloned()
            .collect();
        for pod in pods {
            let uid = k8s::pod_uid(&pod).to_string();
            let Some(status) = pod.status.clone() else {
                continue;
            };
            if unchanged(&status, sent.get(&uid), force) {
                continue;
            }
            // What the API server has: what we last sent, or (on a resync, which repairs
            // drift, and before our first patch) the API server's copy as last seen.
            let mut api_view = sync
                .lock()
                .desired
                .get(&uid)
                .filter(|_| from_api(&pod))
                .and_then(|p| p.status.clone());
            let target_uid = if is_static(&pod) {
                match ensure_mirror(&client, &pod).await {
                    Ok((mirror_uid, mirror_status)) => {
                        api_view = mirror_status;
                        mirrors.insert(
                            uid.clone(),
                            (
                                k8s::pod_namespace(&pod).to_string(),
                                k8s::pod_name(&pod).to_string(),
                            ),
                        );
                        mirror_uid
                    }
                    Err(e) => {
                        tracing::warn!(pod = %k8s::pod_full_name(&pod), error = %e, "creating the mirror pod failed; will retry");
                        continue;
                    }
                }
            } else {
                uid.clone()
            };
            // The node's own /pods shows the status unmerged, as upstream's status cache
            // does; the API server gets it merged.
            let could_have_running =
                super::could_have_running_containers(sync.lock().runtime.get(&uid));
            let (status, diff) = match plan(
                status,
                sent.get(&uid),
                api_view.as_ref(),
                force,
                could_have_running,
            ) {
                Step::AlreadyThere(status) => {
                    sent.insert(uid, status);
                    continue;
                }
                Step::Patch { status, diff } => (status, diff),
            };
            let api: Api<Pod> = Api::namespaced(client.clone(), k8s::pod_namespace(&pod));
            let patch = serde_json::json!({"metadata": {"uid": target_uid}, "status": diff});
            match api
                .patch_status(
                    k8s::pod_name(&pod),
                    &PatchParams::default(),
                    &Patch::Strategic(&patch),
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

/// Makes sure the static pod's mirror pod exists and matches its hash; returns its uid.
/// Returns the mirror's uid and the status the API server has for it (None when new).
async fn ensure_mirror(
    client: &kube::Client,
    pod: &Pod,
) -> Result<(String, Option<k8s_openapi::api::core::v1::PodStatus>), String> {
    let api: Api<Pod> = Api::namespaced(client.clone(), k8s::pod_namespace(pod));
    let hash = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(k8s::labels::CONFIG_HASH))
        .cloned()
        .unwrap_or_default();
    if let Some(existing) = api
        .get_opt(k8s::pod_name(pod))
        .await
        .map_err(|e| e.to_string())?
    {
        let existing_hash = existing
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(k8s::labels::CONFIG_MIRROR));
        match existing_hash {
            Some(h) if *h == hash && existing.metadata.deletion_timestamp.is_none() => {
                return Ok((existing.metadata.uid.unwrap_or_default(), existing.status));
            }
            // The mirror of an older version of the static pod: upstream replaces it.
            Some(_) => delete_mirror(client, k8s::pod_namespace(pod), k8s::pod_name(pod)).await,
            // A regular pod holds the name; it is not ours to delete (as upstream).
            None => {
                return Err(format!(
                    "pod {} exists and is not a mirror pod",
                    k8s::pod_full_name(pod)
                ));
            }
        }
    }
    let mut annotations = pod.metadata.annotations.clone().unwrap_or_default();
    annotations.insert(k8s::labels::CONFIG_MIRROR.into(), hash);
    let mirror = Pod {
        metadata: kube::api::ObjectMeta {
            name: pod.metadata.name.clone(),
            namespace: pod.metadata.namespace.clone(),
            labels: pod.metadata.labels.clone(),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: pod.spec.clone(),
        status: None,
    };
    let created = api
        .create(&kube::api::PostParams::default(), &mirror)
        .await
        .map_err(|e| e.to_string())?;
    tracing::info!(pod = %k8s::pod_full_name(pod), "mirror pod created");
    Ok((created.metadata.uid.unwrap_or_default(), created.status))
}

async fn delete_mirror(client: &kube::Client, ns: &str, name: &str) {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => {
            tracing::warn!(pod = %name, namespace = %ns, error = %e, "deleting the mirror pod failed")
        }
    }
}

impl PodSync {
    /// Fetches the ConfigMaps and Secrets a container's env uses (none are needed: an
    /// empty, disconnected set). A missing one is left out; `container_env` decides
    /// whether that is an error (it is unless optional).
    pub(crate) async fn env_refs(
        &self,
        pod: &Pod,
        c: &k8s_openapi::api::core::v1::Container,
    ) -> Result<EnvRefs, String> {
        let (config_maps, secrets) = crate::runtime_spec::env_references(c);
        let Some(client) = &self.api else {
            return Ok(EnvRefs::default());
        };
        let ns = k8s::pod_namespace(pod);
        let mut refs = EnvRefs {
            connected: true,
            ..Default::default()
        };
        let cm_api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
        for name in config_maps {
            if let Some(cm) = cm_api
                .get_opt(&name)
                .await
                .map_err(|e| format!("reading configmap {name:?}: {e}"))?
            {
                refs.config_maps.insert(name, cm.data.unwrap_or_default());
            }
        }
        let secret_api: Api<Secret> = Api::namespaced(client.clone(), ns);
        for name in secrets {
            if let Some(s) = secret_api
                .get_opt(&name)
                .await
                .map_err(|e| format!("reading secret {name:?}: {e}"))?
            {
                let mut data: BTreeMap<String, String> = s
                    .data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
                    .collect();
                data.extend(s.string_data.unwrap_or_default());
                refs.secrets.insert(name, data);
            }
        }
        Ok(refs)
    }
}

/// Sends a terminated pod's final status (its terminal phase and stopped containers)
/// before the pod is deleted, as a two-way patch from the API server's copy. Whether the
/// API server now has it (sent, nothing to send, or the pod gone there): upstream's
/// status manager deletes a pod only then (`canBeDeleted`).
pub async fn patch_terminal_status(
    client: &kube::Client,
    pod: &Pod,
    status: &k8s_openapi::api::core::v1::PodStatus,
) -> bool {
    if !from_api(pod) {
        return true;
    }
    // What the kubelet does not own stays the API server's (upstream's mergePodStatus).
    let mut status = status.clone();
    status.resource_claim_statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.clone());
    let diff = nodeagent_config::status_patch::two_way(
        &serde_json::to_value(&pod.status).unwrap_or_default(),
        &serde_json::to_value(&status).unwrap_or_default(),
    );
    if diff.as_object().is_some_and(|d| d.is_empty()) {
        return true;
    }
    let api: Api<Pod> = Api::namespaced(client.clone(), k8s::pod_namespace(pod));
    let patch = serde_json::json!({"metadata": {"uid": k8s::pod_uid(pod)}, "status": diff});
    match api
        .patch_status(
            k8s::pod_name(pod),
            &PatchParams::default(),
            &Patch::Strategic(&patch),
        )
        .await
    {
        Ok(_) => {
            tracing::info!(pod = %k8s::pod_full_name(pod), phase = ?status.phase, "terminal status sent");
            true
        }
        // Gone, or another pod of that name now (the UID precondition): nothing of ours
        // is left there to tell.
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => true,
        Err(e) => {
            tracing::warn!(pod = %k8s::pod_full_name(pod), error = %e, "sending the terminal status failed");
            false
        }
    }
}

/// Completes a graceful deletion: the pod's containers are gone, so the API object goes.
/// Whether it is gone (or was not ours to delete).
pub async fn finish_deletion(client: &kube::Client, pod: &Pod) -> bool {
    if !from_api(pod) || pod.metadata.deletion_timestamp.is_none() {
        return true;
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
        Ok(_) => {
            tracing::info!(pod = %k8s::pod_full_name(pod), "graceful deletion completed");
            true
        }
        // Gone, or another pod of that name now (the UID precondition).
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => true,
        Err(e) => {
            tracing::warn!(pod = %k8s::pod_full_name(pod), error = %e, "completing the deletion failed");
            false
        }
    }
}

#[cfg(test)]
mod tests;
