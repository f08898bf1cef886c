//! Ephemeral containers (`kubectl debug`), carried out: upstream's
//! `EphemeralContainersToStart` (planned by `plan::plan_ephemeral`), each started once, in
//! its target's PID namespace when it names one, and never restarted.

use super::plan;
use crate::PodSync;
use crate::status::instances;
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use nodeagent_proto::api::RuntimePodStatus;
use nodeagent_proto::k8s;
use nodeagent_proto::k8s::ephemeral_as_container;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

/// The ephemeral containers a status shows an instance of (its container id, or a state
/// other than waiting): they ran, and must not run again.
pub(crate) fn ran_in(status: &PodStatus) -> impl Iterator<Item = String> + '_ {
    status
        .ephemeral_container_statuses
        .iter()
        .flatten()
        .filter(|s| {
            s.container_id.is_some()
                || s.state
                    .as_ref()
                    .is_some_and(|st| st.running.is_some() || st.terminated.is_some())
        })
        .map(|s| s.name.clone())
}

impl PodSync {
    /// The ephemeral containers the pod's statuses say ran: the one published last, a
    /// finished pod's record, and the API server's copy (after a restart of pod-sync).
    fn ephemeral_ran(&self, pod: &Pod) -> HashSet<String> {
        let uid = k8s::pod_uid(pod);
        let st = self.lock();
        let published = st.statuses.get(uid).and_then(|p| p.status.as_ref());
        [published, st.finished.get(uid), pod.status.as_ref()]
            .into_iter()
            .flatten()
            .flat_map(ran_in)
            .collect()
    }

    /// Starts the ephemeral containers the plan names; the soonest retry of one that could
    /// not start (it stays unstarted, so the next sync tries it again, as upstream).
    pub(crate) async fn start_ephemeral_containers(
        self: &Arc<Self>,
        pod: &Pod,
        rt: &RuntimePodStatus,
        ctx: (&str, &str, &HashMap<String, String>),
    ) -> anyhow::Result<Option<Duration>> {
        let list = pod
            .spec
            .as_ref()
            .and_then(|s| s.ephemeral_containers.as_deref())
            .unwrap_or_default();
        if list.is_empty() {
            // Most pods: nothing to look up.
            return Ok(None);
        }
        let ran = self.ephemeral_ran(pod);
        let ran: HashSet<&str> = ran.iter().map(String::as_str).collect();
        let mut retry: Option<Duration> = None;
        for index in plan::plan_ephemeral(pod, rt, &ran) {
            let e = &list[index];
            let c = ephemeral_as_container(e);
            // Upstream's getTargetID: the newest instance of the target, in any state.
            let target = e.target_container_name.as_deref().filter(|t| !t.is_empty());
            let target_id = match target.map(|t| (t, instances(Some(rt), t).first().copied())) {
                None => None,
                Some((_, Some(found))) => Some(found.id.clone()),
                Some((t, None)) => {
                    let message = format!("unable to find target container {t}");
                    tracing::warn!(k8s.container.name = %c.name, %message, "ephemeral container not started");
                    self.config_error(pod, &c, &message);
                    retry = Some(
                        retry.map_or(Duration::from_secs(10), |r| r.min(Duration::from_secs(10))),
                    );
                    continue;
                }
            };
            tracing::info!(k8s.container.name = %c.name, target = ?target, "starting an ephemeral container");
            if let Some(wait) = self
                .create_and_start(pod, &c, (0, 0), ctx, target_id.as_deref())
                .await?
            {
                retry = Some(retry.map_or(wait, |r| r.min(wait)));
            }
        }
        Ok(retry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The fields `kubectl debug` sets survive the conversion; the target is not a field of
    // a container.
    #[test]
    fn an_ephemeral_container_runs_as_the_container_it_describes() {
        let e: k8s_openapi::api::core::v1::EphemeralContainer =
            serde_json::from_value(serde_json::json!({
                "name": "debugger-x", "image": "busybox:1.36", "command": ["sh"],
                "args": ["-c", "ps"], "stdin": true, "tty": true,
                "imagePullPolicy": "IfNotPresent", "targetContainerName": "app",
                "terminationMessagePolicy": "File",
                "volumeMounts": [{"name": "data", "mountPath": "/data"}]
            }))
            .unwrap();
        let c = ephemeral_as_container(&e);
        assert_eq!(c.name, "debugger-x");
        assert_eq!(c.image.as_deref(), Some("busybox:1.36"));
        assert_eq!(c.command, Some(vec!["sh".to_string()]));
        assert_eq!(c.args.as_ref().map(Vec::len), Some(2));
        assert_eq!((c.stdin, c.tty), (Some(true), Some(true)));
        assert_eq!(c.volume_mounts.as_ref().map(Vec::len), Some(1));
        assert_eq!(c.image_pull_policy.as_deref(), Some("IfNotPresent"));
    }

    #[test]
    fn a_status_tells_which_ephemeral_containers_ran() {
        let status: PodStatus = serde_json::from_value(serde_json::json!({
            "ephemeralContainerStatuses": [
                {"name": "done", "image": "b", "imageID": "", "ready": false, "restartCount": 0,
                 "state": {"terminated": {"exitCode": 0}}},
                {"name": "up", "image": "b", "imageID": "", "ready": false, "restartCount": 0,
                 "containerID": "containerd://x", "state": {"running": {}}},
                {"name": "pulling", "image": "b", "imageID": "", "ready": false, "restartCount": 0,
                 "state": {"waiting": {"reason": "ErrImagePull"}}}
            ]
        }))
        .unwrap();
        let ran: Vec<String> = ran_in(&status).collect();
        assert_eq!(ran, ["done", "up"]);
    }
}
