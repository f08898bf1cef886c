//! Bringing one pod to its desired state: sandbox, volumes, images, init containers in
//! order, then the app containers, with restart policy and back-off. Every step is
//! idempotent and decided from the runtime's current view, so a restarted pod-sync adopts
//! what runs instead of starting it again.

use crate::PodSync;
use crate::credentials;
use crate::init_plan::{self, InitView};
use crate::kill_order::{GraceClock, TerminationOrder};
use crate::runtime_spec::{self, ContainerInputs};
use crate::state::Backoff;
use crate::status::{Waiting, instances};
use crate::workers::SyncOutcome;
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

const RUNNING: i32 = cri::ContainerState::ContainerRunning as i32;
const EXITED: i32 = cri::ContainerState::ContainerExited as i32;
const CREATED: i32 = cri::ContainerState::ContainerCreated as i32;
const READY: i32 = cri::PodSandboxState::SandboxReady as i32;

/// Upstream crash-loop back-off: 10 s doubling to 5 min, forgotten after 10 min of running.
const BACKOFF_INITIAL: Duration = Duration::from_secs(10);
const BACKOFF_MAX: Duration = Duration::from_secs(300);
const BACKOFF_RESET: Duration = Duration::from_secs(600);

/// Upstream's FailedPostStartHook and FailedPreStopHook event messages: the hook's output
/// stays out ("do not record the message in the event so that secrets won't leak").
pub(crate) const POST_START_HOOK_FAILED: &str = "PostStartHook failed";
pub(crate) const PRE_STOP_HOOK_FAILED: &str = "PreStopHook failed";

/// A duration as Go's `time.Duration.String()` writes it (`10s`, `1m20s`, `5m0s`,
/// `1.5ms`): upstream's back-off messages print their durations so.
pub fn go_duration(d: Duration) -> String {
    fn decimal(v: u128, unit: u128) -> String {
        let (int, frac) = (v / unit, v % unit);
        if frac == 0 {
            return int.to_string();
        }
        let width = unit.ilog10() as usize;
        let frac = format!("{frac:0width$}");
        format!("{int}.{}", frac.trim_end_matches('0'))
    }
    let ns = d.as_nanos();
    if ns == 0 {
        return "0s".into();
    }
    if ns < 1_000 {
        return format!("{ns}ns");
    }
    if ns < 1_000_000 {
        return format!("{}µs", decimal(ns, 1_000));
    }
    if ns < 1_000_000_000 {
        return format!("{}ms", decimal(ns, 1_000_000));
    }
    let secs = ns / 1_000_000_000;
    let s = decimal(
        secs % 60 * 1_000_000_000 + ns % 1_000_000_000,
        1_000_000_000,
    );
    let (h, m) = (secs / 3600, secs / 60 % 60);
    if h > 0 {
        format!("{h}h{m}m{s}s")
    } else if m > 0 {
        format!("{m}m{s}s")
    } else {
        format!("{s}s")
    }
}

/// How long to wait before restarting a container that exited after `restarts` restarts.
pub fn crash_backoff(restarts: u32, ran_for: Duration) -> Duration {
    if restarts == 0 || ran_for >= BACKOFF_RESET {
        return Duration::ZERO;
    }
    let factor = 1u32
        .checked_shl(restarts.saturating_sub(1).min(16))
        .unwrap_or(u32::MAX);
    (BACKOFF_INITIAL * factor).min(BACKOFF_MAX)
}

/// The back-off base of the container that replaces one that exited after running for
/// `ran_for`: a run of 10 min or more resets the back-off, so restarts count from it.
pub fn next_backoff_base(exited_attempt: u32, exited_base: u32, ran_for: Duration) -> u32 {
    if ran_for >= BACKOFF_RESET {
        exited_attempt + 1
    } else {
        exited_base
    }
}

/// Whether a peer's answer only says it could not be reached (it is restarting), as opposed
/// to an answer about the pod.
pub fn peer_unreachable(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        tonic::Code::Unavailable | tonic::Code::Cancelled | tonic::Code::DeadlineExceeded
    ) || (status.code() == tonic::Code::Unknown && status.message().contains("transport error"))
}

/// Whether an exited container is restarted under the pod's restart policy.
pub fn should_restart(policy: &str, exit_code: i32) -> bool {
    match policy {
        "Always" => true,
        "OnFailure" => exit_code != 0,
        _ => false,
    }
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
        let spec = pod.spec.clone().unwrap_or_default();
        let policy = spec
            .restart_policy
            .clone()
            .unwrap_or_else(|| "Always".into());
        self.restore_pod_failure(pod);
        // Evicted, or stopped or refused for a node shutdown: for good. An evicted pod's
        // leftovers get no grace; a shutdown's stop keeps the grace it was given.
        if let Some(reason) = self.ended_by_node(&uid) {
            let grace = (reason == crate::evict::EVICTED).then_some(0);
            self.stop_everything(pod, rt, &reason, grace).await;
            return Ok(SyncOutcome::Terminated);
        }
        // Finished (Succeeded or Failed, as last published or as the API server has it):
        // never run again, whatever the runtime shows now (upstream SyncPod returns before
        // making anything for a terminal pod). What still runs of it is stopped.
        let known_phase = {
            let st = self.lock();
            let published = st.statuses.get(&uid).and_then(|p| p.status.as_ref());
            published.and_then(|s| s.phase.clone())
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
                // Upstream: the pod waits in ContainerCreating until its volumes mount
                // (the volume service posts the FailedMount event); we also say why.
                let message = status.message().to_string();
                tracing::warn!(%message, "volumes not ready");
                self.set_waiting_all(pod, "ContainerCreating", &message);
                return Ok(SyncOutcome::RetryAfter(Duration::from_secs(5)));
            }
        };

        let mut ready: Vec<_> = rt.sandboxes.iter().filter(|s| s.state == READY).collect();
        ready.sort_by_key(|s| std::cmp::Reverse(s.created_at_unix_nanos));
        for extra in ready.iter().skip(1) {
            tracing::info!(sandbox.id = %extra.id, "stopping a surplus sandbox");
            self.stop_sandbox(&extra.id).await;
            self.acted(&uid);
        }
        let (sandbox_id, pod_ip, fresh_sandbox) = match ready.first() {
            Some(s) => (s.id.clone(), s.ip.clone(), false),
            None => {
                let all_done = terminal(&spec, &policy, rt);
                if all_done {
                    return Ok(SyncOutcome::Terminated); // finished pod: nothing to run again
                }
                // Containers of a dead sandbox cannot be reused: stop them first.
                for c in rt.containers.iter().filter(|c| c.state == RUNNING) {
                    self.stop_container(&c.id, 0).await;
                }
                let attempt = rt
                    .sandboxes
                    .iter()
                    .map(|s| s.attempt + 1)
                    .max()
                    .unwrap_or(0);
                if !rt.sandboxes.is_empty() {
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
        // Each round that starts something turns a view into Running, which no plan starts
        // again: the rounds end.
        let initialized = loop {
            let plan = init_plan::compute(&init, &views, app_exists, policy != "Never");
            if plan.kill_pod {
                // The pod failed: release its sandbox, as for a finished pod.
                self.stop_sandbox(&sandbox_id).await;
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
                if k.probe.is_some() {
                    // Restarted by the next sync, with the back-off of its earlier runs.
                    views[k.index] = InitView::Exited { exit_code: -1 };
                    merge_retry(Duration::ZERO);
                    continue;
                }
                // A changed definition is replaced at once, as upstream (a new spec hash
                // has no back-off).
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
            return Ok(next_retry.map_or(SyncOutcome::Idle, SyncOutcome::RetryAfter));
        }

        // App containers.
        for c in &spec.containers {
            let latest = in_sandbox(&c.name).first().copied();
            match latest {
                Some(l) if l.state == RUNNING => {
                    let (unhealthy, started) = {
                        let mut st = self.lock();
                        (st.liveness_failed.remove(&l.id), st.started.contains(&l.id))
                    };
                    if unhealthy {
                        // A startup probe fails only before it has passed; after, it is the
                        // liveness probe (upstream's reasonStartupProbe / reasonLivenessProbe).
                        let (kind, probe) = if c.startup_probe.is_some() && !started {
                            ("startup", c.startup_probe.as_ref())
                        } else {
                            ("liveness", c.liveness_probe.as_ref())
                        };
                        // Upstream computePodActions: restarted unless the policy is Never.
                        let restart = policy != "Never";
                        let mut reason = format!("Container {} failed {kind} probe", c.name);
                        if restart {
                            reason.push_str(", will be restarted");
                        }
                        let grace = probe_kill_grace(pod, probe);
                        self.kill_container(Some(pod), &c.name, &l.id, grace, Some(&reason))
                            .await;
                        self.acted(&uid);
                        // The next sync restarts it by the policy, with the crash-loop
                        // back-off of its earlier restarts (upstream's doBackOff finds the
                        // previous dead instance, so repeated kills back off too).
                        merge_retry(Duration::ZERO);
                    } else if runtime_spec::container_changed(c, l) {
                        // Restarted whatever the policy: the spec asks for another container.
                        let reason =
                            format!("Container {} definition changed, will be restarted", c.name);
                        let grace = grace_seconds(pod);
                        self.kill_container(Some(pod), &c.name, &l.id, grace, Some(&reason))
                            .await;
                        self.acted(&uid);
                        let ctx = (sandbox_id.as_str(), pod_ip.as_str(), &volumes);
                        if let Some(wait) = self.replace_killed(pod, c, l, ctx).await? {
                            merge_retry(wait);
                        }
                    } else {
                        self.clear_waiting(&uid, &c.name);
                    }
                }
                Some(l) if l.state == CREATED => {
                    // Created by a pod-sync that died before starting it.
                    if self.start_created(pod, c, &l.id).await {
                        self.post_start(pod, c, &l.id).await;
                    }
                }
                Some(l) if l.state == EXITED => {
                    if !should_restart(&policy, l.exit_code) {
                        self.clear_waiting(&uid, &c.name);
                        continue;
                    }
                    if let Some(wait) = self
                        .restart_after_backoff(pod, c, l, &sandbox_id, &pod_ip, &volumes)
                        .await?
                    {
                        merge_retry(wait);
                    }
                }
                _ => {
                    // A new sandbox: a container whose last run (in an earlier sandbox)
                    // ended for good under the policy is not run again, as upstream's
                    // computePodActions skips succeeded containers under OnFailure.
                    let previous = instances(Some(rt), &c.name)
                        .first()
                        .copied()
                        .filter(|i| i.state == EXITED);
                    if previous.is_some_and(|i| !should_restart(&policy, i.exit_code)) {
                        self.clear_waiting(&uid, &c.name);
                        continue;
                    }
                    // One that ran in an earlier sandbox waits out its crash-loop back-off
                    // here too (upstream's doBackOff looks at every sandbox's containers).
                    let started = match previous {
                        Some(p) => {
                            self.restart_after_backoff(pod, c, p, &sandbox_id, &pod_ip, &volumes)
                                .await?
                        }
                        None => {
                            let attempt = next_attempt(rt, &c.name);
                            self.start_container(pod, c, attempt, &sandbox_id, &pod_ip, &volumes)
                                .await?
                        }
                    };
                    if let Some(wait) = started {
                        merge_retry(wait);
                    }
                }
            }
        }
        let finished = self
            .lock()
            .runtime
            .get(&uid)
            .filter(|rt| terminal(&spec, &policy, rt))
            .cloned();
        if let (None, false, Some(rt)) = (next_retry, fresh_sandbox, finished) {
            // Every regular container is done and none will restart. Sidecars ran only to
            // serve them: they are stopped in reverse order, each with its preStop hook and
            // the pod's grace (upstream, KEP-753), then the sandbox goes (its IP and
            // network), as upstream; the dead containers stay for their logs.
            for c in spec.init_containers.iter().flatten().rev() {
                let running = rt
                    .containers
                    .iter()
                    .find(|r| r.name == c.name && r.state == RUNNING && r.sandbox_id == sandbox_id);
                if let Some(r) = running {
                    self.kill_container(Some(pod), &c.name, &r.id, grace_seconds(pod), None)
                        .await;
                }
            }
            tracing::info!(sandbox.id = %sandbox_id, "pod finished; stopping its sandbox");
            self.stop_sandbox(&sandbox_id).await;
            self.acted(&uid);
            return Ok(SyncOutcome::Terminated);
        }
        Ok(next_retry.map_or(SyncOutcome::Idle, SyncOutcome::RetryAfter))
    }

    /// `activeDeadlineSeconds`: once the pod has been active longer, every container is
    /// stopped and the pod is Failed with reason DeadlineExceeded (`Err`: the sync is
    /// over). Otherwise `Ok` with the time left, if there is a deadline.
    async fn enforce_active_deadline(
        &self,
        pod: &Pod,
        rt: &RuntimePodStatus,
    ) -> Result<Option<Duration>, SyncOutcome> {
        let uid = k8s::pod_uid(pod);
        let Some(deadline) = pod.spec.as_ref().and_then(|s| s.active_deadline_seconds) else {
            return Ok(None);
        };
        let (failed, start_time) = {
            let st = self.lock();
            let published = st.statuses.get(uid).and_then(|p| p.status.as_ref());
            let start_time = published
                .or(pod.status.as_ref())
                .and_then(|s| s.start_time.as_ref())
                .map(|t| t.0.as_nanosecond() as i64);
            (st.pod_failed.contains_key(uid), start_time)
        };
        if !failed {
            // Upstream counts from the pod's status.startTime (set when the node first
            // reports the pod, before its images are pulled), else from its first sandbox.
            let first_sandbox = rt.sandboxes.iter().map(|s| s.created_at_unix_nanos).min();
            let Some(started) = start_time.or(first_sandbox) else {
                return Ok(None); // not started yet
            };
            let active =
                Duration::from_nanos((crate::workers::now_nanos() - started).max(0) as u64);
            let limit = Duration::from_secs(deadline.max(0) as u64);
            if active < limit {
                return Ok(Some(limit - active));
            }
            tracing::info!(
                active_deadline_seconds = deadline,
                "pod exceeded its active deadline"
            );
            self.lock().pod_failed.insert(
                uid.to_string(),
                Waiting {
                    reason: "DeadlineExceeded".into(),
                    message: "Pod was active on the node longer than the specified deadline".into(),
                },
            );
        }
        self.stop_everything(pod, rt, "DeadlineExceeded", None)
            .await;
        Err(SyncOutcome::Idle)
    }

    /// Stops every running container (gracefully, regular containers first and then the
    /// sidecars in reverse order, as upstream) and sandbox of a pod that failed.
    pub(crate) async fn stop_everything(
        &self,
        pod: &Pod,
        rt: &RuntimePodStatus,
        reason: &str,
        grace_override: Option<i64>,
    ) {
        let grace = grace_override.unwrap_or_else(|| grace_seconds(pod));
        let running: Vec<&RuntimeContainer> = rt
            .containers
            .iter()
            .filter(|c| c.state == RUNNING)
            .collect();
        let mut acted = !running.is_empty();
        if acted {
            tracing::info!(%reason, containers = running.len(), "stopping the pod's containers");
        }
        let names: Vec<&str> = running.iter().map(|c| c.name.as_str()).collect();
        let order = TerminationOrder::new(pod, &names);
        let clock = GraceClock::fixed(grace);
        let kills = running.iter().map(|c| {
            self.kill_container_ordered(Some(pod), &c.name, &c.id, &clock, None, Some(&order))
        });
        join_all(kills).await;
        for s in rt.sandboxes.iter().filter(|s| s.state == READY) {
            self.stop_sandbox(&s.id).await;
            acted = true;
        }
        if acted {
            self.acted(k8s::pod_uid(pod));
        }
    }

    /// Admission of the pod's security context (upstream's admit handlers: sysctls,
    /// AppArmor; and what this node cannot enforce): a pod that would run weaker than its
    /// spec is Failed with upstream's reason and nothing of it runs. `None`: admitted.
    async fn refuse_unadmitted(&self, pod: &Pod, rt: &RuntimePodStatus) -> Option<SyncOutcome> {
        let refusal = crate::security::admit(pod, &self.host_security)
            .err()
            .or_else(|| self.refuse_under_pressure(pod, rt))
            .or_else(|| self.refuse_beyond_allocatable(pod, rt))?;
        let first = {
            let mut st = self.lock();
            let failed = st.pod_failed.entry(k8s::pod_uid(pod).to_string());
            let first = matches!(failed, std::collections::hash_map::Entry::Vacant(_));
            failed.or_insert(Waiting {
                reason: refusal.reason.to_string(),
                message: refusal.message.clone(),
            });
            first
        };
        if first {
            tracing::error!(reason = refusal.reason, message = %refusal.message, "pod refused at admission");
        }
        self.stop_everything(pod, rt, refusal.reason, None).await;
        Some(SyncOutcome::Terminated)
    }

    /// upstream's resource admission (`admission`): a pod that has not started yet is
    /// admitted when it fits, beside every pod admitted or running that has not finished,
    /// into `maxPods` and allocatable cpu and memory; admitted once, it stays admitted.
    /// Critical pods are admitted whatever is left (upstream would evict others to make
    /// room for them; we do not).
    fn refuse_beyond_allocatable(
        &self,
        pod: &Pod,
        rt: &RuntimePodStatus,
    ) -> Option<crate::security::Refusal> {
        let uid = k8s::pod_uid(pod).to_string();
        let mut st = self.lock();
        if st.admitted.contains(&uid) {
            return None;
        }
        if !rt.sandboxes.is_empty() || !rt.containers.is_empty() || crate::oom::is_critical(pod) {
            st.admitted.insert(uid);
            return None;
        }
        let finished = |u: &str| {
            st.pod_failed.contains_key(u)
                || st
                    .statuses
                    .get(u)
                    .and_then(|p| p.status.as_ref())
                    .and_then(|s| s.phase.as_deref())
                    .is_some_and(|phase| matches!(phase, "Succeeded" | "Failed"))
        };
        let running: Vec<crate::admission::Requests> = st
            .desired
            .iter()
            .filter(|(u, _)| **u != uid && !finished(u))
            .filter(|(u, _)| {
                st.admitted.contains(*u)
                    || st
                        .runtime
                        .get(*u)
                        .is_some_and(|r| !r.sandboxes.is_empty() || !r.containers.is_empty())
            })
            .map(|(_, p)| crate::admission::requests(p))
            .collect();
        match crate::admission::fit(
            crate::admission::requests(pod),
            &running,
            &self.node.allocatable,
        ) {
            Ok(()) => {
                st.admitted.insert(uid);
                None
            }
            Err(refusal) => Some(refusal),
        }
    }

    /// upstream's node shutdown admission (every new pod is refused while the node shuts
    /// down) and eviction manager `Admit`: a pod that has not started yet is refused
    /// (Failed, reason Evicted) under DiskPressure or PIDPressure, and under MemoryPressure
    /// when it is BestEffort; critical pods are always admitted.
    fn refuse_under_pressure(
        &self,
        pod: &Pod,
        rt: &RuntimePodStatus,
    ) -> Option<crate::security::Refusal> {
        use nodeagent_config::eviction::Condition;
        if !rt.sandboxes.is_empty() || !rt.containers.is_empty() {
            return None;
        }
        if self.lock().shutting_down {
            return Some(crate::security::Refusal {
                reason: crate::shutdown::REFUSAL_REASON,
                message: crate::shutdown::REFUSAL_MESSAGE.into(),
            });
        }
        if crate::oom::is_critical(pod) {
            return None;
        }
        let pressure = self.lock().pressure.clone();
        // A BestEffort pod that tolerates the memory-pressure taint is let in as well.
        let tolerates = pod
            .spec
            .as_ref()
            .and_then(|s| s.tolerations.as_ref())
            .is_some_and(|ts| {
                ts.iter().any(|t| {
                    let key = t.key.as_deref().unwrap_or_default();
                    let effect = t.effect.as_deref().unwrap_or_default();
                    (key == "node.kubernetes.io/memory-pressure"
                        || (key.is_empty() && t.operator.as_deref() == Some("Exists")))
                        && (effect.is_empty() || effect == "NoSchedule")
                })
            });
        let best_effort =
            crate::cgroups::qos_class(pod) == crate::cgroups::QosClass::BestEffort && !tolerates;
        let refused: Vec<&str> = pressure
            .iter()
            .filter(|c| **c != Condition::MemoryPressure || best_effort)
            .map(|c| c.name())
            .collect();
        if refused.is_empty() {
            return None;
        }
        let names: Vec<&str> = pressure.iter().map(|c| c.name()).collect();
        Some(crate::security::Refusal {
            reason: crate::evict::EVICTED,
            // Go's %v of a slice: "[MemoryPressure DiskPressure]".
            message: format!("The node had condition: [{}]. ", names.join(" ")),
        })
    }

    /// runAsNonRoot (upstream `verifyRunAsNonRoot`), from runAsUser or else the image's
    /// user as the runtime reports it.
    async fn verify_non_root(&self, pod: &Pod, c: &Container) -> Result<(), String> {
        let (mut uid, mut user) = (None, String::new());
        if crate::security::needs_image_user(pod, c) {
            let mut images = self.cri.image.clone();
            let image = images
                .image_status(self.cri.request(ImageStatusRequest {
                    image: Some(ImageSpec {
                        image: c.image.clone().unwrap_or_default(),
                        ..Default::default()
                    }),
                    verbose: false,
                }))
                .await
                .map_err(|e| format!("cannot read the image's user: {}", e.message()))?
                .into_inner()
                .image
                .ok_or_else(|| "cannot read the image's user: image not found".to_string())?;
            uid = image.uid.map(|v| v.value);
            user = image.username;
        }
        crate::security::verify_run_as_non_root(pod, c, uid, &user)
    }

    /// Restarts an exited container once its crash-loop back-off has passed; returns how
    /// long is left otherwise.
    async fn restart_after_backoff(
        self: &Arc<Self>,
        pod: &Pod,
        c: &Container,
        exited: &RuntimeContainer,
        sandbox_id: &str,
        pod_ip: &str,
        volumes: &HashMap<String, String>,
    ) -> anyhow::Result<Option<Duration>> {
        let uid = k8s::pod_uid(pod);
        let ran_for = Duration::from_nanos(
            (exited.finished_at_unix_nanos - exited.started_at_unix_nanos).max(0) as u64,
        );
        let restarts = exited.attempt.saturating_sub(exited.backoff_base);
        let backoff = crash_backoff(restarts, ran_for);
        let since_exit = Duration::from_nanos(
            (crate::workers::now_nanos() - exited.finished_at_unix_nanos).max(0) as u64,
        );
        if since_exit < backoff {
            let left = backoff - since_exit;
            self.events.container(
                pod,
                &c.name,
                EventType::Warning,
                "BackOff",
                &format!(
                    "Back-off restarting failed container {} in pod {}({uid})",
                    c.name,
                    k8s::pod_full_name(pod)
                ),
            );
            self.set_waiting(
                uid,
                &c.name,
                "CrashLoopBackOff",
                &format!(
                    "back-off {} restarting failed container={} pod={}({uid})",
                    go_duration(backoff),
                    c.name,
                    k8s::pod_full_name(pod)
                ),
            );
            return Ok(Some(left));
        }
        let base = next_backoff_base(exited.attempt, exited.backoff_base, ran_for);
        let started = self
            .start_container(
                pod,
                c,
                (exited.attempt + 1, base),
                sandbox_id,
                pod_ip,
                volumes,
            )
            .await?;
        // Keep only the newest dead instance (it is the lastState); older ones go.
        self.remove_dead_except(uid, &c.name, &exited.id).await;
        Ok(started)
    }

    /// Starts the next instance of a container this sync has just killed for a changed
    /// spec, at once and whatever the restart policy: upstream starts it in the same
    /// SyncPod, and its back-off key (which includes the spec hash) is new. Older dead
    /// instances go.
    async fn replace_killed(
        self: &Arc<Self>,
        pod: &Pod,
        c: &Container,
        killed: &RuntimeContainer,
        (sandbox_id, pod_ip, volumes): (&str, &str, &HashMap<String, String>),
    ) -> anyhow::Result<Option<Duration>> {
        let ran_for = Duration::from_nanos(
            (crate::workers::now_nanos() - killed.started_at_unix_nanos).max(0) as u64,
        );
        let base = next_backoff_base(killed.attempt, killed.backoff_base, ran_for);
        let attempt = (killed.attempt + 1, base);
        let started = self
            .start_container(pod, c, attempt, sandbox_id, pod_ip, volumes)
            .await?;
        self.remove_dead_except(k8s::pod_uid(pod), &c.name, &killed.id)
            .await;
        Ok(started)
    }

    /// Pulls if needed, creates and starts one container. Returns a retry delay when it
    /// could not (the reason is recorded as the container's waiting state).
    async fn start_container(
        self: &Arc<Self>,
        pod: &Pod,
        c: &Container,
        (attempt, backoff_base): (u32, u32),
        sandbox_id: &str,
        pod_ip: &str,
        volumes: &HashMap<String, String>,
    ) -> anyhow::Result<Option<Duration>> {
        let uid = k8s::pod_uid(pod).to_string();
        if let Err((reason, message, retry)) = self.ensure_image(pod, c).await {
            tracing::warn!(k8s.container.name = %c.name, %reason, %message, "image not available");
            self.set_waiting(&uid, &c.name, reason, &message);
            // Upstream's "Error: ErrImagePull" (the error's reason, after the pull's own
            // event).
            self.failed(pod, c, reason);
            return Ok(Some(retry));
        }
        if let Err(message) = self.verify_non_root(pod, c).await {
            tracing::warn!(k8s.container.name = %c.name, %message, "CreateContainerConfigError");
            self.config_error(pod, c, &message);
            return Ok(Some(Duration::from_secs(10)));
        }
        let env_refs = match self.env_refs(pod, c).await {
            Ok(refs) => refs,
            Err(message) => {
                self.config_error(pod, c, &message);
                return Ok(Some(Duration::from_secs(10)));
            }
        };
        let sub_paths = match self.prepare_sub_paths(pod, c, pod_ip, &env_refs).await {
            Ok(paths) => paths,
            Err(message) => {
                tracing::warn!(k8s.container.name = %c.name, %message, "subPath refused");
                self.config_error(pod, c, &message);
                return Ok(Some(Duration::from_secs(10)));
            }
        };
        let config = match runtime_spec::container_config(ContainerInputs {
            pod,
            container: c,
            attempt,
            backoff_base,
            volumes,
            pod_ip,
            node: &self.node,
            env_refs: &env_refs,
        })
        .and_then(|mut cfg| {
            runtime_spec::set_sub_path_mounts(&mut cfg, c, &sub_paths).map(|()| cfg)
        }) {
            Ok(cfg) => cfg,
            Err(message) => {
                self.config_error(pod, c, &message);
                return Ok(Some(Duration::from_secs(10)));
            }
        };
        let sandbox_config = runtime_spec::sandbox_config(pod, 0, &self.node);
        let mut runtime = self.cri.runtime.clone();
        let created = runtime
            .create_container(self.cri.request(CreateContainerRequest {
                pod_sandbox_id: sandbox_id.to_string(),
                config: Some(config),
                sandbox_config: Some(sandbox_config),
            }))
            .await;
        self.acted(&uid);
        let id = match created {
            Ok(r) => r.into_inner().container_id,
            Err(e) => {
                tracing::warn!(k8s.container.name = %c.name, error = %e.message(), "CreateContainer failed");
                self.set_waiting(&uid, &c.name, "CreateContainerError", e.message());
                self.failed(pod, c, e.message());
                return Ok(Some(Duration::from_secs(10)));
            }
        };
        self.events.container(
            pod,
            &c.name,
            EventType::Normal,
            "Created",
            &format!("Created container: {}", c.name),
        );
        if self.start_created(pod, c, &id).await {
            self.post_start(pod, c, &id).await;
        }
        Ok(None)
    }

    /// Runs the postStart hook; a failed hook kills the container (upstream
    /// `FailedPostStartHook`), and the restart policy decides what follows.
    async fn post_start(&self, pod: &Pod, c: &Container, id: &str) {
        let Some(hook) = c.lifecycle.as_ref().and_then(|l| l.post_start.as_ref()) else {
            return;
        };
        let timeout = Duration::from_secs(grace_seconds(pod).max(2) as u64);
        if let Err(e) = self.run_hook(pod, c, id, hook, timeout).await {
            tracing::warn!(k8s.container.name = %c.name, error = %e, "FailedPostStartHook");
            // Upstream: without the hook's output, so no secret leaks into an event.
            self.events.container(
                pod,
                &c.name,
                EventType::Warning,
                "FailedPostStartHook",
                POST_START_HOOK_FAILED,
            );
            // Upstream's Killing message for this kill is the reason itself.
            let grace = grace_seconds(pod);
            self.kill_container(Some(pod), &c.name, id, grace, Some("FailedPostStartHook"))
                .await;
            self.acted(k8s::pod_uid(pod));
        }
    }

    /// Starts a created container; true when it started.
    async fn start_created(&self, pod: &Pod, c: &Container, id: &str) -> bool {
        let uid = k8s::pod_uid(pod);
        let mut runtime = self.cri.runtime.clone();
        let started = runtime
            .start_container(self.cri.request(StartContainerRequest {
                container_id: id.to_string(),
            }))
            .await;
        self.acted(uid);
        match started {
            Ok(_) => {
                tracing::info!(k8s.container.name = %c.name, container.id = %id, "container started");
                self.clear_waiting(uid, &c.name);
                self.events.container(
                    pod,
                    &c.name,
                    EventType::Normal,
                    "Started",
                    &format!("Started container {}", c.name),
                );
                true
            }
            Err(e) => {
                tracing::warn!(k8s.container.name = %c.name, error = %e.message(), "StartContainer failed");
                self.set_waiting(uid, &c.name, "RunContainerError", e.message());
                self.failed(pod, c, e.message());
                false
            }
        }
    }

    /// `imagePullPolicy`: Always pulls, IfNotPresent pulls when missing, Never never does.
    /// A pull tries each credential that matches the image (the pod's pull secrets', then
    /// the node's), in order, until one succeeds; without a matching credential it pulls
    /// anonymously (upstream `kuberuntime_image.go` `PullImage`).
    async fn ensure_image(
        &self,
        pod: &Pod,
        c: &Container,
    ) -> Result<(), (&'static str, String, Duration)> {
        let uid = k8s::pod_uid(pod);
        let image = c.image.clone().unwrap_or_default();
        // The API server defaults it; a pod that reaches us without one gets upstream's
        // default too (Always for `latest` or no tag).
        let policy = c
            .image_pull_policy
            .clone()
            .unwrap_or_else(|| config_source::manifest::default_pull_policy(&image).into());
        let event = |ty: EventType, reason: &str, message: &str| {
            self.events.container(pod, &c.name, ty, reason, message);
        };
        // Upstream: an image reference that does not parse is InvalidImageName (with an
        // InspectFailed event), before any look at the runtime.
        if let Some(message) = crate::pull::invalid_image_name(&image) {
            event(EventType::Warning, "InspectFailed", &message);
            return Err(("InvalidImageName", message, Duration::from_secs(30)));
        }
        let spec = ImageSpec {
            image: image.clone(),
            ..Default::default()
        };
        let mut images = self.cri.image.clone();
        let present = images
            .image_status(self.cri.request(ImageStatusRequest {
                image: Some(spec.clone()),
                verbose: false,
            }))
            .await
            .map(|r| r.into_inner().image.is_some())
            .map_err(|e| {
                (
                    "ErrImageInspect",
                    e.message().to_string(),
                    Duration::from_secs(10),
                )
            })?;
        if present && policy != "Always" {
            let message = format!("Container image \"{image}\" already present on machine");
            event(EventType::Normal, "Pulled", &message);
            return Ok(());
        }
        if policy == "Never" {
            let message =
                format!("Container image \"{image}\" is not present with pull policy of Never");
            event(EventType::Warning, "ErrImageNeverPull", &message);
            return Err(("ErrImageNeverPull", message, Duration::from_secs(30)));
        }
        let key = (uid.to_string(), image.clone());
        let now = Instant::now();
        if let Some(b) = self.lock().pull_backoff.get(&key).filter(|b| b.until > now) {
            // With the error of the failed pull, as upstream (so the registry's words stay
            // in the status during the back-off).
            let message = format!(
                "Back-off pulling image \"{image}\": ErrImagePull: {}",
                b.last_error
            );
            let until = b.until;
            event(
                EventType::Normal,
                "BackOff",
                &format!("Back-off pulling image \"{image}\""),
            );
            return Err(("ImagePullBackOff", message, until - now));
        }
        event(
            EventType::Normal,
            "Pulling",
            &format!("Pulling image \"{image}\""),
        );
        let pulled = match self.pull_credentials(pod, &image).await {
            Err(message) => Err(message),
            Ok(credentials) if credentials.is_empty() => {
                tracing::info!(%image, "pulling image");
                self.pull(uid, &spec, None).await
            }
            Ok(credentials) => {
                tracing::info!(%image, credentials = credentials.len(), "pulling image with credentials");
                let mut errors = Vec::new();
                let mut pulled = None;
                for credential in &credentials {
                    match self.pull(uid, &spec, Some(credential.to_cri())).await {
                        Ok(()) => {
                            pulled = Some(());
                            break;
                        }
                        Err(e) => errors.push(e),
                    }
                }
                match pulled {
                    Some(()) => Ok(()),
                    // Upstream's aggregate error: one alone, several in brackets.
                    None if errors.len() == 1 => Err(errors.remove(0)),
                    None => Err(format!("[{}]", errors.join(", "))),
                }
            }
        };
        // A failed pull is ErrImagePull even where a copy is present (policy Always): as
        // upstream, never a silent fall-back to what another pod may have pulled.
        match pulled {
            Ok(()) => {
                self.lock().pull_backoff.remove(&key);
                let took = now.elapsed();
                let size = self.image_size(&spec).await;
                event(
                    EventType::Normal,
                    "Pulled",
                    &format!(
                        "Successfully pulled image \"{image}\" in {took:?} ({took:?} including waiting). Image size: {size} bytes."
                    ),
                );
                Ok(())
            }
            Err(message) => {
                let retry = {
                    let mut st = self.lock();
                    let b = Backoff::next(st.pull_backoff.get(&key), now, message.clone());
                    let retry = b.until - now;
                    st.pull_backoff.insert(key, b);
                    retry
                };
                // Upstream: the event says which image; the waiting message is the
                // runtime's whole error.
                event(
                    EventType::Warning,
                    "Failed",
                    &format!("Failed to pull image \"{image}\": {message}"),
                );
                Err(("ErrImagePull", message, retry))
            }
        }
    }

    /// The image's size as the runtime reports it (0 when it cannot say).
    async fn image_size(&self, spec: &ImageSpec) -> u64 {
        let mut images = self.cri.image.clone();
        images
            .image_status(self.cri.request(ImageStatusRequest {
                image: Some(spec.clone()),
                verbose: false,
            }))
            .await
            .ok()
            .and_then(|r| r.into_inner().image)
            .map_or(0, |i| i.size)
    }

    /// Upstream's `Failed` event of a container that could not be made: "Error: <what>".
    fn failed(&self, pod: &Pod, c: &Container, what: &str) {
        self.events.container(
            pod,
            &c.name,
            EventType::Warning,
            "Failed",
            &format!("Error: {what}"),
        );
    }

    /// A CreateContainerConfigError: the waiting reason and upstream's Failed event.
    fn config_error(&self, pod: &Pod, c: &Container, message: &str) {
        self.set_waiting(
            k8s::pod_uid(pod),
            &c.name,
            "CreateContainerConfigError",
            message,
        );
        self.failed(pod, c, message);
    }

    /// The credentials to try for `image`, in upstream's order: those of the pod's pull
    /// secrets, then the node's own (its docker config file). `Err`: a pull secret that is
    /// not a valid docker config (upstream fails the pull with that error).
    async fn pull_credentials(
        &self,
        pod: &Pod,
        image: &str,
    ) -> Result<Vec<credentials::Credential>, String> {
        let Ok(reference) = crate::image_ref::parse_normalized_named(image) else {
            return Ok(Vec::new()); // the runtime says what is wrong with the name
        };
        let repository = reference.repository();
        let secrets = self.pull_secrets(pod).await;
        let mut found = credentials::secrets_keyring(&secrets)?.lookup(&repository);
        found.extend(credentials::node_keyring(&self.node.root_dir).lookup(&repository));
        Ok(found)
    }

    /// The pod's `imagePullSecrets` from the API server. One that cannot be had is left out
    /// with upstream's warning event (`FailedToRetrieveImagePullSecret`), and the pull goes
    /// on without it; a node without an API server has none to read.
    async fn pull_secrets(&self, pod: &Pod) -> Vec<Secret> {
        let names: Vec<String> = pod
            .spec
            .as_ref()
            .and_then(|s| s.image_pull_secrets.as_ref())
            .into_iter()
            .flatten()
            .map(|r| r.name.clone())
            .filter(|n| !n.is_empty())
            .collect();
        if names.is_empty() {
            return Vec::new();
        }
        let mut found = Vec::new();
        let mut failed = Vec::new();
        match &self.api {
            None => failed = names,
            Some(client) => {
                let api: Api<Secret> = Api::namespaced(client.clone(), k8s::pod_namespace(pod));
                for name in names {
                    match api.get_opt(&name).await {
                        Ok(Some(secret)) => found.push(secret),
                        Ok(None) => {
                            tracing::info!(secret = %name, error = "not found", "Unable to retrieve pull secret, the image pull may not succeed.");
                            failed.push(name);
                        }
                        Err(e) => {
                            tracing::info!(secret = %name, error = %e, "Unable to retrieve pull secret, the image pull may not succeed.");
                            failed.push(name);
                        }
                    }
                }
            }
        }
        if !failed.is_empty() {
            let message = format!(
                "Unable to retrieve some image pull secrets ({}); attempting to pull the image may not succeed.",
                failed.join(", ")
            );
            self.events.pod(
                pod,
                EventType::Warning,
                "FailedToRetrieveImagePullSecret",
                &message,
            );
        }
        found
    }

    async fn ensure_volumes(
        &self,
        pod: &Pod,
    ) -> Result<nodeagent_proto::api::EnsurePodVolumesResponse, tonic::Status> {
        let mut volume = self.volume.clone();
        volume
            .ensure_pod_volumes(EnsurePodVolumesRequest {
                pod_json: k8s::encode_pod(pod),
                trace: nodeagent_telemetry::current_trace_context(),
            })
            .await
            .map(|r| r.into_inner())
    }

    /// What init_plan needs to know of an init container's newest instance in the
    /// current sandbox.
    fn init_view(&self, c: &Container, latest: Option<&RuntimeContainer>) -> InitView {
        let Some(l) = latest else {
            return InitView::Absent;
        };
        match l.state {
            RUNNING => {
                let st = self.lock();
                InitView::Running {
                    id: l.id.clone(),
                    started: c.startup_probe.is_none() || st.started.contains(&l.id),
                    unhealthy: st.liveness_failed.contains(&l.id),
                    changed: runtime_spec::container_changed(c, l),
                }
            }
            CREATED => InitView::Created,
            EXITED => InitView::Exited {
                exit_code: l.exit_code,
            },
            // Unknown: a new instance is made.
            _ => InitView::Absent,
        }
    }

    /// A pod the API server already knows as Failed for a pod-level reason (Evicted,
    /// DeadlineExceeded, an admission refusal) stays so after a pod-sync restart: upstream
    /// never runs a pod whose status is terminal again.
    fn restore_pod_failure(&self, pod: &Pod) {
        let Some(status) = &pod.status else {
            return;
        };
        let reason = status.reason.clone().unwrap_or_default();
        if status.phase.as_deref() != Some("Failed") || reason.is_empty() {
            return;
        }
        let mut st = self.lock();
        st.pod_failed
            .entry(k8s::pod_uid(pod).to_string())
            .or_insert_with(|| Waiting {
                reason,
                message: status.message.clone().unwrap_or_default(),
            });
    }

    /// Has the volume service resolve and bind-mount the container's subPaths (it runs in
    /// the host mount namespace and never follows a symlink out of a volume); returns mount
    /// index -> host path.
    async fn prepare_sub_paths(
        &self,
        pod: &Pod,
        c: &Container,
        pod_ip: &str,
        env_refs: &runtime_spec::EnvRefs,
    ) -> Result<HashMap<u32, String>, String> {
        let env = runtime_spec::container_env(pod, c, &self.node, pod_ip, env_refs)?;
        let mounts = runtime_spec::sub_path_mounts(c, &env)?;
        if mounts.is_empty() {
            return Ok(HashMap::new());
        }
        let mut volume = self.volume.clone();
        volume
            .prepare_sub_paths(PrepareSubPathsRequest {
                pod_json: k8s::encode_pod(pod),
                container_name: c.name.clone(),
                mounts,
                trace: nodeagent_telemetry::current_trace_context(),
            })
            .await
            .map(|r| r.into_inner().host_paths.into_iter().collect())
            .map_err(|e| {
                format!(
                    "failed to prepare subPath for container {:?}: {}",
                    c.name,
                    e.message()
                )
            })
    }

    async fn run_sandbox(&self, pod: &Pod, attempt: u32) -> anyhow::Result<(String, String)> {
        let uid = k8s::pod_uid(pod).to_string();
        let runtime_handler = self
            .runtime_classes
            .handler(
                pod.spec
                    .as_ref()
                    .and_then(|s| s.runtime_class_name.as_deref()),
            )
            .map_err(anyhow::Error::msg)?;
        let config = runtime_spec::sandbox_config(pod, attempt, &self.node);
        if let Some(name) =
            crate::cgroups::pod_cgroup_name(pod, self.node.cgroups_per_qos, &self.node.cgroup_root)
        {
            let res = crate::cgroups::pod_resources(pod);
            self.cgroups
                .ensure(&name, &res, self.node.pod_pids_limit)
                .await
                .map_err(|e| {
                    anyhow::anyhow!(
                        "creating the pod cgroup {}: {e}",
                        name.path(self.node.cgroup_driver)
                    )
                })?;
        }
        std::fs::create_dir_all(&config.log_directory).map_err(|e| {
            anyhow::anyhow!("create pod log directory {}: {e}", config.log_directory)
        })?;
        let mut runtime = self.cri.runtime.clone();
        let resp = runtime
            .run_pod_sandbox(self.cri.request(RunPodSandboxRequest {
                config: Some(config),
                runtime_handler,
            }))
            .await;
        self.acted(&uid);
        let id = resp
            .map_err(|e| anyhow::anyhow!("RunPodSandbox: {}", e.message()))?
            .into_inner()
            .pod_sandbox_id;
        let ip = self
            .cri
            .sandbox_status(&id)
            .await
            .ok()
            .and_then(|s| s.network)
            .map(|n| n.ip)
            .unwrap_or_default();
        tracing::info!(sandbox.id = %id, pod.ip = %ip, attempt, "sandbox running");
        if !ip.is_empty() {
            self.lock().sandbox_ips.insert(uid.clone(), ip.clone());
        }
        Ok((id, ip))
    }

    pub(crate) async fn stop_container(&self, id: &str, grace_seconds: i64) {
        let mut runtime = self.cri.runtime.clone();
        if let Err(e) = runtime
            .stop_container(stop_request(id, grace_seconds))
            .await
            && !nodeagent_cri::is_not_found(&e)
        {
            tracing::warn!(container.id = %id, error = %e.message(), "StopContainer failed");
        }
    }

    pub(crate) async fn stop_sandbox(&self, id: &str) {
        let mut runtime = self.cri.runtime.clone();
        if let Err(e) = runtime
            .stop_pod_sandbox(self.cri.request(StopPodSandboxRequest {
                pod_sandbox_id: id.to_string(),
            }))
            .await
            && !nodeagent_cri::is_not_found(&e)
        {
            tracing::warn!(sandbox.id = %id, error = %e.message(), "StopPodSandbox failed");
        }
    }

    pub(crate) async fn remove_container(&self, id: &str) {
        let mut runtime = self.cri.runtime.clone();
        if let Err(e) = runtime
            .remove_container(self.cri.request(RemoveContainerRequest {
                container_id: id.to_string(),
            }))
            .await
            && !nodeagent_cri::is_not_found(&e)
        {
            tracing::warn!(container.id = %id, error = %e.message(), "RemoveContainer failed");
        }
    }

    /// Removes a sandbox (stopped or not); one already gone is fine.
    pub(crate) async fn remove_sandbox(&self, id: &str) -> Result<(), String> {
        let mut runtime = self.cri.runtime.clone();
        let req = self.cri.request(cri::RemovePodSandboxRequest {
            pod_sandbox_id: id.to_string(),
        });
        match runtime.remove_pod_sandbox(req).await {
            Err(e) if !nodeagent_cri::is_not_found(&e) => {
                Err(format!("RemovePodSandbox {id}: {}", e.message()))
            }
            _ => Ok(()),
        }
    }

    /// Dead containers of one name beyond the GC's keep count are removed, `keep` (the one
    /// just replaced, whose state the status reports) always kept, as the container GC
    /// would at its next pass.
    async fn remove_dead_except(&self, uid: &str, name: &str, keep: &str) {
        let max = self.gc.max_per_container;
        if max < 0 {
            return;
        }
        let dead: Vec<String> = {
            let st = self.lock();
            let mut others: Vec<_> = st
                .runtime
                .get(uid)
                .map(|r| {
                    r.containers
                        .iter()
                        .filter(|c| c.name == name && c.state == EXITED && c.id != keep)
                        .collect()
                })
                .unwrap_or_default();
            others.sort_by_key(|c| std::cmp::Reverse(c.created_at_unix_nanos));
            others
                .into_iter()
                .skip((max as usize).saturating_sub(1))
                .map(|c| c.id.clone())
                .collect()
        };
        for id in dead {
            self.remove_container(&id).await;
        }
    }

    fn set_waiting(&self, uid: &str, name: &str, reason: &str, message: &str) {
        self.lock()
            .waiting
            .entry(uid.to_string())
            .or_default()
            .insert(
                name.to_string(),
                Waiting {
                    reason: reason.to_string(),
                    message: message.to_string(),
                },
            );
    }

    fn set_waiting_all(&self, pod: &Pod, reason: &str, message: &str) {
        let spec = pod.spec.clone().unwrap_or_default();
        for c in spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
        {
            self.set_waiting(k8s::pod_uid(pod), &c.name, reason, message);
        }
    }

    fn clear_waiting(&self, uid: &str, name: &str) {
        if let Some(m) = self.lock().waiting.get_mut(uid) {
            m.remove(name);
        }
    }
}

/// Whether the pod has finished for good: every app container's newest instance exited
/// and the restart policy restarts none, or an init container failed under `Never`.
fn terminal(
    spec: &k8s_openapi::api::core::v1::PodSpec,
    policy: &str,
    rt: &RuntimePodStatus,
) -> bool {
    let exited_for_good = |name: &str, policy: &str| {
        instances(Some(rt), name)
            .first()
            .is_some_and(|i| i.state == EXITED && !should_restart(policy, i.exit_code))
    };
    let init_failed = policy == "Never"
        && spec.init_containers.iter().flatten().any(|c| {
            c.restart_policy.as_deref() != Some("Always")
                && instances(Some(rt), &c.name)
                    .first()
                    .is_some_and(|i| i.state == EXITED && i.exit_code != 0)
        });
    let apps_done = !spec.containers.is_empty()
        && spec
            .containers
            .iter()
            .all(|c| exited_for_good(&c.name, policy));
    init_failed || apps_done
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

/// The grace period to stop the pod's containers with: the deletion's own period when the
/// pod is being deleted, else `terminationGracePeriodSeconds` (default 30).
pub(crate) fn grace_seconds(pod: &Pod) -> i64 {
    pod.metadata
        .deletion_grace_period_seconds
        .or_else(|| {
            pod.spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds)
        })
        .unwrap_or(30)
        .max(0)
}

/// The grace period of a kill for a failed liveness or startup probe: the probe's own
/// `terminationGracePeriodSeconds` where it has one, unless the pod is being deleted
/// (upstream `setTerminationGracePeriod`).
pub(crate) fn probe_kill_grace(
    pod: &Pod,
    probe: Option<&k8s_openapi::api::core::v1::Probe>,
) -> i64 {
    match probe.and_then(|p| p.termination_grace_period_seconds) {
        Some(g) if pod.metadata.deletion_grace_period_seconds.is_none() => g.max(0),
        _ => grace_seconds(pod),
    }
}

#[cfg(test)]
mod tests {
    /// Go's own table for `Duration.String()` (`src/time/time_test.go`, `durationTests`),
    /// the non-negative rows; then the crash-loop back-off steps upstream's messages show.
    #[test]
    fn go_duration_as_go_writes_it() {
        use super::go_duration;
        use std::time::Duration;
        let ms = Duration::from_millis;
        for (want, d) in [
            ("0s", Duration::ZERO),
            ("1ns", Duration::from_nanos(1)),
            ("1.1µs", Duration::from_nanos(1100)),
            ("2.2ms", Duration::from_micros(2200)),
            ("3.3s", ms(3300)),
            ("4m5s", Duration::from_secs(4 * 60 + 5)),
            ("4m5.001s", ms(4 * 60_000 + 5001)),
            ("5h6m7.001s", ms(5 * 3_600_000 + 6 * 60_000 + 7001)),
            (
                "8m0.000000001s",
                Duration::from_secs(480) + Duration::from_nanos(1),
            ),
            (
                "2562047h47m16.854775807s",
                Duration::from_nanos(i64::MAX as u64),
            ),
        ] {
            assert_eq!(go_duration(d), want);
        }
        let steps: Vec<String> = (1..=6)
            .map(|r| go_duration(super::crash_backoff(r, Duration::ZERO)))
            .collect();
        assert_eq!(steps, ["10s", "20s", "40s", "1m20s", "2m40s", "5m0s"]);
    }

    use super::*;

    #[test]
    fn a_probes_own_grace_period_applies_unless_the_pod_is_being_deleted() {
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"terminationGracePeriodSeconds": 30, "containers": []}
        }))
        .unwrap();
        let probe = k8s_openapi::api::core::v1::Probe {
            termination_grace_period_seconds: Some(2),
            ..Default::default()
        };
        assert_eq!(probe_kill_grace(&pod, Some(&probe)), 2);
        assert_eq!(probe_kill_grace(&pod, Some(&Default::default())), 30);
        assert_eq!(probe_kill_grace(&pod, None), 30);
        pod.metadata.deletion_grace_period_seconds = Some(5);
        assert_eq!(probe_kill_grace(&pod, Some(&probe)), 5);
    }

    #[tokio::test]
    async fn a_peer_that_is_not_there_is_unreachable_not_an_error_about_the_pod() {
        let dir = tempfile::tempdir().unwrap();
        let gone = nodeagent_config::Address::Unix(dir.path().join("volume.sock"));
        let mut client = nodeagent_proto::api::volume_client::VolumeClient::new(
            nodeagent_transport::connect(&gone),
        );
        let status = client
            .list(nodeagent_proto::api::ListVolumesRequest {})
            .await
            .unwrap_err();
        assert!(peer_unreachable(&status), "{status:?}");
        assert!(!peer_unreachable(&tonic::Status::invalid_argument(
            "bad volume name"
        )));
    }

    #[test]
    fn backoff_doubles_to_five_minutes_and_resets() {
        let short = Duration::from_secs(1);
        assert_eq!(crash_backoff(0, short), Duration::ZERO);
        assert_eq!(crash_backoff(1, short), Duration::from_secs(10));
        assert_eq!(crash_backoff(2, short), Duration::from_secs(20));
        assert_eq!(crash_backoff(3, short), Duration::from_secs(40));
        assert_eq!(crash_backoff(10, short), Duration::from_secs(300));
        assert_eq!(crash_backoff(99, short), Duration::from_secs(300));
        assert_eq!(crash_backoff(5, Duration::from_secs(601)), Duration::ZERO);
        // After a long run the count starts again: the next quick crash waits 0 s, then 10 s.
        let long = Duration::from_secs(700);
        let base = next_backoff_base(7, 0, long);
        assert_eq!(base, 8);
        assert_eq!(crash_backoff(8 - base, short), Duration::ZERO);
        assert_eq!(
            crash_backoff(9 - next_backoff_base(8, base, short), short),
            Duration::from_secs(10)
        );
    }

    #[test]
    fn restart_policy() {
        assert!(should_restart("Always", 0));
        assert!(should_restart("OnFailure", 1));
        assert!(!should_restart("OnFailure", 0));
        assert!(!should_restart("Never", 1));
    }
}
