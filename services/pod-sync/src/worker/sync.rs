//! Bringing one pod to its desired state: sandbox, volumes, images, init containers in
//! order, then the app containers, with restart policy and back-off. Every step is
//! idempotent and decided from the runtime's current view, so a restarted pod-sync adopts
//! what runs instead of starting it again.

use crate::PodSync;
use crate::images::credentials;
use crate::runtime_spec::{self, ContainerInputs};
use crate::state::Backoff;
use crate::status::{Waiting, instances};
use crate::worker::init_plan::{self, InitView};
use crate::worker::kill_order::{GraceClock, TerminationOrder, grace_seconds, probe_kill_grace};
use crate::worker::workers::SyncOutcome;
use futures::future::join_all;
use k8s_openapi::api::core::v1::{Container, Pod, Secret};
use kube::api::Api;
use nodeagent_config::events::EventType;
use nodeagent_proto::api::{
    EnsurePodVolumesRequest, PrepareSubPathsRequest, RuntimeContainer, RuntimePodStatus,
};
use nodeagent_proto::cri::{
    self, CreateContainerRequest, ImageSpec, ImageStatusRequest, RemoveContainerRequest,
    RunPodSandboxRequest, StartContainerRequest, StopContainerRequest, StopPodSandboxRequest,
};
use nodeagent_proto::k8s;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod admit;
mod backoff;
mod containers;
mod ephemeral;
mod images;
mod plan;
mod resize;
mod runtime_calls;

pub use backoff::{crash_backoff, go_duration, next_backoff_base};
use plan::{KillReason, ProbeResults, SandboxPlan, Start};
pub(crate) use resize::record_resize_counts;

const RUNNING: i32 = cri::ContainerState::ContainerRunning as i32;
const EXITED: i32 = cri::ContainerState::ContainerExited as i32;
const CREATED: i32 = cri::ContainerState::ContainerCreated as i32;
const READY: i32 = cri::PodSandboxState::SandboxReady as i32;

/// Upstream's FailedPostStartHook and FailedPreStopHook event messages: the hook's output
/// stays out ("do not record the message in the event so that secrets won't leak").
pub(crate) const POST_START_HOOK_FAILED: &str = "PostStartHook failed";
pub(crate) const PRE_STOP_HOOK_FAILED: &str = "PreStopHook failed";

/// Whether a peer's answer only says it could not be reached (it is restarting), as opposed
/// to an answer about the pod.
pub fn peer_unreachable(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        tonic::Code::Unavailable | tonic::Code::Cancelled | tonic::Code::DeadlineExceeded
    ) || (status.code() == tonic::Code::Unknown && status.message().contains("transport error"))
}

impl PodSync {
    pub(crate) async fn sync_pod(
        self: &Arc<Self>,
        pod: &Pod,
        rt: &RuntimePodStatus,
    ) -> anyhow::Result<SyncOutcome> {
        let uid = k8s::pod_uid(pod);
        let before = self.lock().last_action.get(uid).copied();
        let outcome = self.sync_pod_inner(pod, rt).await;
        if self.lock().last_action.get(uid).copied() != before {
            self.observe(uid).await;
        }
        self.publish_status(uid).await;
        outcome
    }

    async fn sync_pod_inner(
        self: &Arc<Self>,
        pod: &Pod,
        rt: &RuntimePodStatus,
    ) -> anyhow::Result<SyncOutcome> {
        let uid = k8s::pod_uid(pod).to_string();
        let policy = plan::restart_policy(pod);
        self.restore_pod_failure(pod);
        // Evicted, preempted, or stopped or refused for a node shutdown: for good. The kill
        // the node asked for has its grace period; an evicted pod's leftovers get none.
        if let Some(reason) = self.ended_by_node(&uid) {
            let requested = self
                .lock()
                .kill_requests
                .get(&uid)
                .map(|k| k.grace_override);
            let grace = requested
                .unwrap_or_else(|| (reason == crate::status::reasons::EVICTED).then_some(0));
            self.stop_everything(pod, rt, &reason, grace).await;
            return Ok(SyncOutcome::Terminated);
        }
        // Finished (Succeeded or Failed, as last published or as the API server has it):
        // never run again, whatever the runtime shows now (upstream SyncPod returns before
        // making anything for a terminal pod). What still runs of it is stopped.
        let known_phase = {
            let st = self.lock();
            let published = st.statuses.get(&uid).and_then(|p| p.status.as_ref());
            // After a restart, what the pod published before it: a finished pod's record.
            published
                .or_else(|| st.finished.get(&uid))
                .and_then(|s| s.phase.clone())
        };
        let api_phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if !crate::status::may_start(known_phase.as_deref(), api_phase) {
            self.stop_everything(pod, rt, "pod finished", None).await;
            return Ok(SyncOutcome::Terminated);
        }
        if let Some(outcome) = self.refuse_unadmitted(pod, rt).await {
            return Ok(outcome);
        }
        let deadline_left = match self.enforce_active_deadline(pod, rt).await {
            Err(outcome) => return Ok(outcome),
            Ok(left) => left,
        };
        // In-place resize (upstream's handlePodResourcesResize): the pod runs with its
        // allocation, which an admitted resize changes before anything below reads it.
        let (resized, resize_deferred) = self.admit_resize(pod, rt).await;
        let pod = resized.as_ref().unwrap_or(pod);
        let spec = pod.spec.clone().unwrap_or_default();

        // Refused, not sanitized: a pod whose names cannot form safe host paths never runs,
        // even if config-source were bypassed.
        if let Err(message) = runtime_spec::check_pod_paths(pod, &self.node) {
            tracing::error!(%message, "pod refused");
            self.set_waiting_all(pod, "CreateContainerConfigError", &message);
            return Ok(SyncOutcome::RetryAfter(Duration::from_secs(60)));
        }

        // Volumes first: nothing starts without them. Idempotent, so done every sync.
        let volumes = match self.ensure_volumes(pod).await {
            Ok(v) => {
                if self.evict_for_local_storage(pod, rt, &v.over_limit).await {
                    return Ok(SyncOutcome::Terminated);
                }
                v.host_paths.into_iter().collect::<HashMap<_, _>>()
            }
            Err(status) if peer_unreachable(&status) => {
                // The volume service is restarting: nothing is wrong with the pod.
                tracing::info!(error = %status.message(), "volume service unreachable; retrying");
                return Ok(SyncOutcome::RetryAfter(Duration::from_secs(1)));
            }
            Err(status) => {
                // Upstream: the pod waits in ContainerCreating, with no message, until its
                // volumes mount; why is in the FailedMount event the volume service posts.
                // A standalone node has no events, so there the status says why.
                let message = status.message().to_string();
                tracing::warn!(%message, "volumes not ready");
                let shown = if self.api.is_some() { "" } else { &message };
                self.set_waiting_all(pod, "ContainerCreating", shown);
                return Ok(SyncOutcome::RetryAfter(Duration::from_secs(5)));
            }
        };

        // The sandbox (upstream's PodSandboxChanged): decided by plan, carried out here.
        let running: Vec<&RuntimeContainer> = rt
            .containers
            .iter()
            .filter(|c| c.state == RUNNING)
            .collect();
        let (sandbox_id, pod_ip, fresh_sandbox) = match plan::plan_sandbox(pod, rt) {
            SandboxPlan::Keep { id, ip, surplus } => {
                for extra in &surplus {
                    tracing::info!(sandbox.id = %extra, "stopping a surplus sandbox");
                    self.stop_sandbox(extra).await;
                    self.acted(&uid);
                }
                (id, ip, false)
            }
            SandboxPlan::Finished => {
                // Nothing to run again; what still runs of it (in a dead sandbox) is killed.
                if !running.is_empty() {
                    self.kill_in_order(pod, &running, grace_seconds(pod)).await;
                    self.acted(&uid);
                }
                return Ok(SyncOutcome::Terminated);
            }
            SandboxPlan::Create { attempt, changed } => {
                // Containers of a dead sandbox cannot be reused: they are killed as
                // upstream's KillPod does (preStop hooks, Killing events, the pod's grace),
                // then the pod gets a new sandbox.
                self.kill_in_order(pod, &running, grace_seconds(pod)).await;
                if changed {
                    self.events.pod(
                        pod,
                        EventType::Normal,
                        "SandboxChanged",
                        "Pod sandbox changed, it will be killed and re-created.",
                    );
                }
                let (id, ip) = match self.run_sandbox(pod, attempt).await {
                    Ok(sandbox) => sandbox,
                    Err(e) => {
                        let message = format!("Failed to create pod sandbox: {e}");
                        self.events.pod(
                            pod,
                            EventType::Warning,
                            "FailedCreatePodSandBox",
                            &message,
                        );
                        return Err(e);
                    }
                };
                (id, ip, true)
            }
        };
        // Instances of a container in the sandbox in use (none in a sandbox just made).
        let in_sandbox = |name: &str| -> Vec<&RuntimeContainer> {
            instances(Some(rt), name)
                .into_iter()
                .filter(|c| !fresh_sandbox && c.sandbox_id == sandbox_id)
                .collect()
        };

        let mut next_retry: Option<Duration> = None;
        let mut merge_retry = |d: Duration| {
            next_retry = Some(next_retry.map_or(d, |r: Duration| r.min(d)));
        };

        if let Some(left) = deadline_left {
            merge_retry(left);
        }
        if resize_deferred {
            merge_retry(resize::DEFERRED_RETRY);
        }

        // Ephemeral containers first (upstream's SyncPod step 5: a pod whose init container
        // fails can still be debugged), in the sandbox the pod keeps; one just made has
        // none of the pod's containers yet, and the next sync starts them there. One that
        // could not start is retried, but holds back neither the pod's end nor its
        // other containers.
        let mut ephemeral_retry = None;
        if !fresh_sandbox {
            let ctx = (sandbox_id.as_str(), pod_ip.as_str(), &volumes);
            ephemeral_retry = self.start_ephemeral_containers(pod, rt, ctx).await?;
        }

        // Init containers and sidecars (upstream's computeInitContainerActions): decided
        // by init_plan, carried out here.
        let init = spec.init_containers.clone().unwrap_or_default();
        let app_exists = spec
            .containers
            .iter()
            .any(|c| !in_sandbox(&c.name).is_empty());
        let mut views: Vec<InitView> = init
            .iter()
            .map(|c| self.init_view(c, in_sandbox(&c.name).first().copied()))
            .collect();
        // What we start here counts at once: a sidecar without a startup probe lets the
        // next init container start in this same sync, not after the next relist.
        let mut killed: Vec<usize> = Vec::new();
        // Containers this sync killed: the runtime view still shows them running.
        let mut killed_ids: Vec<String> = Vec::new();
        // Each round that starts something turns a view into Running, which no plan starts
        // again: the rounds end.
        let initialized = loop {
            let plan = init_plan::compute(&init, &views, app_exists, policy != "Never");
            if plan.kill_pod {
                // The pod failed (an init container under `Never`): its sidecars are
                // killed as upstream's KillPod kills them (preStop hooks, the pod's grace,
                // reverse order), then its sandbox goes, as for a finished pod.
                self.stop_everything(pod, rt, "an init container failed", None)
                    .await;
                self.acted(&uid);
                return Ok(SyncOutcome::Terminated);
            }
            for k in &plan.to_kill {
                let c = &init[k.index];
                let grace = match k.probe {
                    Some("startup") => probe_kill_grace(pod, c.startup_probe.as_ref()),
                    Some(_) => probe_kill_grace(pod, c.liveness_probe.as_ref()),
                    None => grace_seconds(pod),
                };
                self.lock().liveness_failed.remove(&k.id);
                self.kill_container(Some(pod), &c.name, &k.id, grace, Some(&k.message))
                    .await;
                self.acted(&uid);
                killed.push(k.index);
                killed_ids.push(k.id.clone());
                if k.probe.is_some() {
                    // Restarted by the next sync, with the back-off of its earlier runs.
                    views[k.index] = InitView::Exited { exit_code: -1 };
                    merge_retry(Duration::ZERO);
                    continue;
                }
                // A changed definition is replaced at once, as upstream (a new spec hash
                // has no back-off), and so is one whose state was unknown.
                let Some(l) = in_sandbox(&c.name).first().copied() else {
                    continue;
                };
                let ctx = (sandbox_id.as_str(), pod_ip.as_str(), &volumes);
                match self.replace_killed(pod, c, l, ctx).await? {
                    None => views[k.index] = InitView::just_started(c),
                    Some(wait) => {
                        views[k.index] = InitView::Exited { exit_code: -1 };
                        merge_retry(wait);
                    }
                }
            }
            let mut progressed = false;
            for &i in plan.to_start.iter().filter(|i| !killed.contains(i)) {
                let c = &init[i];
                let latest = in_sandbox(&c.name).first().copied();
                let started = match latest {
                    Some(l) if l.state == EXITED => {
                        self.restart_after_backoff(pod, c, l, &sandbox_id, &pod_ip, &volumes)
                            .await?
                    }
                    Some(l) if l.state == CREATED => {
                        if self.start_created(pod, c, &l.id).await {
                            self.post_start(pod, c, &l.id).await;
                            None
                        } else {
                            Some(Duration::from_secs(10))
                        }
                    }
                    _ => {
                        let attempt = next_attempt(rt, &c.name);
                        self.start_container(pod, c, attempt, &sandbox_id, &pod_ip, &volumes)
                            .await?
                    }
                };
                match started {
                    None => {
                        progressed = true;
                        views[i] = InitView::just_started(c);
                    }
                    // A sidecar in back-off holds back neither the containers after it
                    // nor, once the pod is initialized, the regular containers.
                    Some(wait) if init_plan::is_sidecar(c) => merge_retry(wait),
                    Some(wait) => return Ok(SyncOutcome::RetryAfter(wait)),
                }
            }
            if !progressed {
                break plan.initialized;
            }
        };
        if !initialized {
            // pleg tells us when an init container exits, probe when a sidecar's startup
            // probe passes.
            return Ok(retry_outcome(next_retry, ephemeral_retry));
        }

        // Regular containers (upstream's computePodActions): decided by plan, carried out
        // here, the kills first.
        let app = {
            let st = self.lock();
            let probes = ProbeResults {
                unhealthy: Some(&st.liveness_failed),
                started: Some(&st.started),
            };
            plan::plan_app_containers(pod, rt, (!fresh_sandbox).then_some(&sandbox_id), probes)
        };
        let by_id = |id: &str| rt.containers.iter().find(|c| c.id == id);
        killed_ids.extend(app.to_kill.iter().map(|k| k.id.clone()));
        for k in &app.to_kill {
            let c = &spec.containers[k.index];
            let grace = match k.reason {
                KillReason::LivenessProbe => probe_kill_grace(pod, c.liveness_probe.as_ref()),
                KillReason::StartupProbe => probe_kill_grace(pod, c.startup_probe.as_ref()),
                KillReason::DefinitionChanged | KillReason::Unknown => grace_seconds(pod),
            };
            self.lock().liveness_failed.remove(&k.id);
            self.kill_container(Some(pod), &c.name, &k.id, grace, Some(&k.message))
                .await;
            self.acted(&uid);
        }
        for (index, c) in spec.containers.iter().enumerate() {
            let acted_on = app.to_kill.iter().any(|k| k.index == index)
                || app.to_start.iter().any(|(i, _)| *i == index);
            if !acted_on {
                self.clear_waiting(&uid, &c.name);
            }
        }
        let ctx = (sandbox_id.as_str(), pod_ip.as_str(), &volumes);
        for (index, start) in &app.to_start {
            let c = &spec.containers[*index];
            let wait = match start {
                // Restarted by the next sync, with the crash-loop back-off of its earlier
                // restarts (upstream's doBackOff finds the previous dead instance, so
                // repeated kills back off too).
                Start::NextSync => Some(Duration::ZERO),
                Start::Replacing { killed } => match by_id(killed) {
                    Some(l) => self.replace_killed(pod, c, l, ctx).await?,
                    None => Some(Duration::ZERO),
                },
                Start::Created { id } => {
                    if self.start_created(pod, c, id).await {
                        self.post_start(pod, c, id).await;
                    }
                    None
                }
                Start::AfterBackoff { previous } => match by_id(previous) {
                    Some(p) => {
                        self.restart_after_backoff(pod, c, p, &sandbox_id, &pod_ip, &volumes)
                            .await?
                    }
                    None => Some(Duration::ZERO),
                },
                Start::New {
                    attempt,
                    backoff_base,
                } => {
                    let attempt = (*attempt, *backoff_base);
                    self.start_container(pod, c, attempt, &sandbox_id, &pod_ip, &volumes)
                        .await?
                }
            };
            if let Some(wait) = wait {
                merge_retry(wait);
            }
        }
        // An admitted resize carried out in the running containers.
        if !fresh_sandbox
            && let Some(wait) = self
                .actuate_resize(pod, rt, (&sandbox_id, &killed_ids), ctx)
                .await?
        {
            merge_retry(wait);
        }
        if app.kill_pod && next_retry.is_none() && !fresh_sandbox {
            // Every regular container is done and none will restart. Sidecars ran only to
            // serve them: they are stopped in reverse order, each with its preStop hook and
            // the pod's grace (upstream, KEP-753), and ephemeral containers with them (at
            // once: they wait for nothing), as upstream's KillPod; then the sandbox goes
            // (its IP and network); the dead containers stay for their logs.
            let others: Vec<&RuntimeContainer> = rt
                .containers
                .iter()
                .filter(|r| r.state == RUNNING && r.sandbox_id == sandbox_id)
                .filter(|r| !spec.containers.iter().any(|c| c.name == r.name))
                .collect();
            self.kill_in_order(pod, &others, grace_seconds(pod)).await;
            tracing::info!(sandbox.id = %sandbox_id, "pod finished; stopping its sandbox");
            self.stop_sandbox(&sandbox_id).await;
            self.acted(&uid);
            return Ok(SyncOutcome::Terminated);
        }
        Ok(retry_outcome(next_retry, ephemeral_retry))
    }
}

/// Idle, or a retry after the sooner of two delays.
fn retry_outcome(a: Option<Duration>, b: Option<Duration>) -> SyncOutcome {
    match (a, b) {
        (Some(a), Some(b)) => SyncOutcome::RetryAfter(a.min(b)),
        (Some(d), None) | (None, Some(d)) => SyncOutcome::RetryAfter(d),
        (None, None) => SyncOutcome::Idle,
    }
}

/// The next attempt number for a container, and its back-off base: one past the newest
/// instance of that name, keeping that instance's base.
fn next_attempt(rt: &RuntimePodStatus, name: &str) -> (u32, u32) {
    instances(Some(rt), name)
        .first()
        .map(|c| (c.attempt + 1, c.backoff_base))
        .unwrap_or((0, 0))
}

/// A StopContainer with `grace_seconds` for the container to stop, and the call itself
/// bounded a little beyond that.
pub(crate) fn stop_request(id: &str, grace_seconds: i64) -> tonic::Request<StopContainerRequest> {
    let mut req = tonic::Request::new(StopContainerRequest {
        container_id: id.to_string(),
        timeout: grace_seconds,
    });
    req.set_timeout(Duration::from_secs(grace_seconds.max(0) as u64 + 30));
    req
}

#[cfg(test)]
mod tests;
