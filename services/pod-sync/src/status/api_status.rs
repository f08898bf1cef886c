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

/// A mirror pod: the API server's record of a static pod (`kubernetes.io/config.mirror`).
fn is_mirror(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(k8s::labels::CONFIG_MIRROR))
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

/// Upstream's `HandlePodCleanups`, "orphaned mirror pods": the mirror pods on this node
/// (of `on_node`) whose static pod is neither desired nor still terminating (of
/// `statics`, by namespace and name). Asked once every source has listed its pods, since
/// before that a static pod may only not be known yet.
pub(crate) fn orphaned_mirrors<'a>(
    on_node: &'a [Pod],
    statics: &std::collections::BTreeSet<(String, String)>,
) -> Vec<&'a Pod> {
    on_node
        .iter()
        .filter(|p| is_mirror(p))
        .filter(|p| {
            let key = (
                k8s::pod_namespace(p).to_string(),
                k8s::pod_name(p).to_string(),
            );
            !statics.contains(&key)
        })
        .collect()
}

/// Deletes the mirror pods whose static pod went while no one was watching (pod-sync
/// was down, or the node agent restarted without the manifest): upstream's kubelet
/// deletes them at its housekeeping. Whether the API server could be asked.
async fn delete_orphaned_mirrors(sync: &PodSync, client: &kube::Client) -> bool {
    let statics: std::collections::BTreeSet<(String, String)> = {
        let st = sync.lock();
        st.desired
            .values()
            .chain(st.terminating.values())
            .filter(|p| is_static(p))
            .map(|p| {
                (
                    k8s::pod_namespace(p).to_string(),
                    k8s::pod_name(p).to_string(),
                )
            })
            .collect()
    };
    let api: Api<Pod> = Api::all(client.clone());
    let params =
        kube::api::ListParams::default().fields(&format!("spec.nodeName={}", sync.node.node_name));
    let on_node = match api.list(&params).await {
        Ok(list) => list.items,
        Err(e) => {
            tracing::warn!(error = %e, "listing this node's pods for orphaned mirror pods failed; will retry");
            return false;
        }
    };
    for orphan in orphaned_mirrors(&on_node, &statics) {
        tracing::info!(pod = %k8s::pod_full_name(orphan), "deleting the mirror pod of a static pod that is gone");
        delete_mirror(
            client,
            k8s::pod_namespace(orphan),
            k8s::pod_name(orphan),
            orphan.metadata.uid.clone(),
        )
        .await;
    }
    true
}

/// Patches changed statuses, and all of them every resync period. Static pods get a
/// mirror pod (annotation `kubernetes.io/config.mirror`), which carries their status.
pub async fn run(sync: Arc<PodSync>, client: kube::Client) {
    let mut rx = sync.status_tx.subscribe();
    let mut sent: HashMap<String, k8s_openapi::api::core::v1::PodStatus> = HashMap::new();
    // static pod uid -> (namespace, name, uid) of its mirror pod.
    let mut mirrors: HashMap<String, (String, String, String)> = HashMap::new();
    let mut resync = tokio::time::interval(STATUS_RESYNC);
    let mut orphans_deleted = false;
    loop {
        let (force, removed) = tokio::select! {
            _ = sync.shutdown.wait() => return,
            _ = resync.tick() => (true, Vec::new()),
            m = rx.recv() => (false, m.map(|u| u.removed_uids).unwrap_or_default()),
        };
        if force && !orphans_deleted && sync.lock().sources_ready {
            orphans_deleted = delete_orphaned_mirrors(&sync, &client).await;
        }
        for uid in removed {
            sent.remove(&uid);
            // Only the mirror of the pod removed: a newer version's, made meanwhile
            // under the same name, stays.
            if let Some((ns, name, mirror_uid)) = mirrors.remove(&uid) {
                delete_mirror(&client, &ns, &name, Some(mirror_uid)).await;
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
                                mirror_uid.clone(),
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

/// What the API server's pod of a static pod's name is to the status loop.
#[derive(Debug, PartialEq)]
pub(crate) enum Mirror {
    /// The static pod's mirror: the status goes onto it (its UID, its status there).
    Current {
        uid: String,
        status: Option<Box<PodStatus>>,
    },
    /// None yet, or one to replace first (`stale`: the mirror of an older version of the
    /// static pod, or one being deleted, deleted with its UID as the precondition).
    Create { stale: Option<String> },
    /// A regular pod holds the name: not ours to delete or to patch (the error to log).
    NotOurs(String),
}

/// Upstream's mirror rules (`syncPod` and `IsMirrorPodOf`): a pod of the same name and
/// namespace is the static pod's mirror when its `kubernetes.io/config.mirror`
/// annotation is the static pod's hash; a mirror being deleted or of another hash is
/// deleted and made anew; a pod with no such annotation is not a mirror at all.
pub(crate) fn mirror(static_pod: &Pod, existing: Option<&Pod>) -> Mirror {
    let Some(existing) = existing else {
        return Mirror::Create { stale: None };
    };
    let annotation = |pod: &Pod, key: &str| {
        pod.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .cloned()
    };
    let uid = existing.metadata.uid.clone().unwrap_or_default();
    match annotation(existing, k8s::labels::CONFIG_MIRROR) {
        None => Mirror::NotOurs(format!(
            "pod {} exists and is not a mirror pod",
            k8s::pod_full_name(existing)
        )),
        Some(hash)
            if hash == annotation(static_pod, k8s::labels::CONFIG_HASH).unwrap_or_default()
                && existing.metadata.deletion_timestamp.is_none() =>
        {
            Mirror::Current {
                uid,
                status: existing.status.clone().map(Box::new),
            }
        }
        Some(_) => Mirror::Create { stale: Some(uid) },
    }
}

/// The mirror pod of a static pod: its manifest as the API server gets it (upstream's
/// `CreateMirrorPod`: the static pod's metadata and spec, the hash as the mirror annotation).
fn mirror_of(pod: &Pod) -> Pod {
    let mut annotations = pod.metadata.annotations.clone().unwrap_or_default();
    let hash = annotations
        .get(k8s::labels::CONFIG_HASH)
        .cloned()
        .unwrap_or_default();
    annotations.insert(k8s::labels::CONFIG_MIRROR.into(), hash);
    Pod {
        metadata: kube::api::ObjectMeta {
            name: pod.metadata.name.clone(),
            namespace: pod.metadata.namespace.clone(),
            labels: pod.metadata.labels.clone(),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: pod.spec.clone(),
        status: None,
    }
}

/// Makes sure the static pod's mirror pod exists and matches its hash ([`mirror`]).
/// Returns the mirror's uid and the status the API server has for it (None when new).
async fn ensure_mirror(
    client: &kube::Client,
    pod: &Pod,
) -> Result<(String, Option<k8s_openapi::api::core::v1::PodStatus>), String> {
    let api: Api<Pod> = Api::namespaced(client.clone(), k8s::pod_namespace(pod));
    let existing = api
        .get_opt(k8s::pod_name(pod))
        .await
        .map_err(|e| e.to_string())?;
    match mirror(pod, existing.as_ref()) {
        Mirror::Current { uid, status } => return Ok((uid, status.map(|s| *s))),
        Mirror::NotOurs(e) => return Err(e),
        Mirror::Create { stale: Some(uid) } => {
            delete_mirror(
                client,
                k8s::pod_namespace(pod),
                k8s::pod_name(pod),
                Some(uid),
            )
            .await
        }
        Mirror::Create { stale: None } => {}
    }
    let created = api
        .create(&kube::api::PostParams::default(), &mirror_of(pod))
        .await
        .map_err(|e| e.to_string())?;
    tracing::info!(pod = %k8s::pod_full_name(pod), "mirror pod created");
    Ok((created.metadata.uid.unwrap_or_default(), created.status))
}

/// Deletes a mirror pod at once; with `uid`, only that one (upstream's `DeleteMirrorPod`
/// precondition: a mirror made meanwhile by someone else stays).
async fn delete_mirror(client: &kube::Client, ns: &str, name: &str, uid: Option<String>) {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: uid.map(|uid| Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
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

/// What completing a pod's removal asks of the API server, once the pod's containers
/// are gone (upstream's `TerminatePod` then `canBeDeleted`).
#[derive(Debug, PartialEq)]
pub(crate) struct Finish {
    /// The final status (terminal phase, stopped containers) as a two-way patch from the
    /// API server's copy, sent first; None when the API server has it already.
    pub patch: Option<serde_json::Value>,
    /// Whether the pod is then deleted with grace 0, which completes a graceful deletion:
    /// only a pod from the API server being deleted, never a static or a mirror pod.
    pub delete: bool,
}

/// The decision of [`Finish`], for a pod whose containers are gone and whose final status
/// is `terminal` (None: nothing new to tell).
pub(crate) fn finish(pod: &Pod, terminal: Option<&PodStatus>) -> Finish {
    if !from_api(pod) || is_mirror(pod) {
        return Finish {
            patch: None,
            delete: false,
        };
    }
    let patch = terminal.and_then(|status| {
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
        (!diff.as_object().is_some_and(|d| d.is_empty())).then_some(diff)
    });
    Finish {
        patch,
        delete: pod.metadata.deletion_timestamp.is_some(),
    }
}

/// Carries out [`finish`]: the terminal status first (the API server deletes a pod's
/// record only once it has its terminal phase, so a watcher never sees a pod go that
/// still said Running), then the deletion. Whether both are done (or were not ours to do).
pub async fn finish_removal(
    client: &kube::Client,
    pod: &Pod,
    terminal: Option<&PodStatus>,
) -> bool {
    let Finish { patch, delete } = finish(pod, terminal);
    let api: Api<Pod> = Api::namespaced(client.clone(), k8s::pod_namespace(pod));
    if let Some(diff) = patch {
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
                let phase = terminal.and_then(|s| s.phase.as_deref());
                tracing::info!(pod = %k8s::pod_full_name(pod), ?phase, "terminal status sent");
            }
            // Gone, or another pod of that name now (the UID precondition): nothing of
            // ours is left there to tell or to delete.
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => return true,
            Err(e) => {
                tracing::warn!(pod = %k8s::pod_full_name(pod), error = %e, "sending the terminal status failed");
                return false;
            }
        }
    }
    if !delete {
        return true;
    }
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
