//! In-place resize carried out (upstream's `handlePodResourcesResize`, then
//! `computePodResizeAction` and `doPodResizeAction`): a resize the spec asks for is
//! admitted or left pending (`allocation::admit`), and an admitted one is applied to the
//! running containers: `UpdateContainerResources` where every changed resource's
//! `resizePolicy` is `NotRequired`, a restart of the container where one says
//! `RestartContainer`. The pod cgroup is raised before the containers and lowered after
//! them, and a memory limit is never set below what the container uses now.

use super::*;
use crate::allocation::{self, Decision, Resources};
use crate::container_manager::quantity;
use k8s_openapi::api::core::v1::ResourceRequirements;
use nodeagent_proto::cri::{
    ContainerStatsRequest, LinuxContainerResources, UpdateContainerResourcesRequest,
};

/// How soon a deferred resize is tried again (upstream's pending resizes are retried on
/// a timer too, and whenever a pod's allocation changes).
pub(super) const DEFERRED_RETRY: Duration = Duration::from_secs(30);

/// The containers a resize applies to: the regular ones and the sidecars (a
/// non-restartable init container's resources cannot change).
fn resizable(pod: &Pod) -> Vec<&Container> {
    let spec = pod.spec.as_ref();
    let sidecars = spec
        .and_then(|s| s.init_containers.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| init_plan::is_sidecar(c));
    sidecars
        .chain(spec.map(|s| s.containers.iter()).into_iter().flatten())
        .collect()
}

/// The resize policy of `c` for `resource` (`NotRequired` when unset, as the API defaults).
fn policy<'a>(c: &'a Container, resource: &str) -> &'a str {
    c.resize_policy
        .iter()
        .flatten()
        .find(|p| p.resource_name == resource)
        .map_or("NotRequired", |p| p.restart_policy.as_str())
}

/// The resources (cpu, memory) whose amounts differ between `have` and `want`, as the
/// runtime sees them: CPU requests at or below the minimum shares (2m) are the same, and
/// so are CPU limits at or below the minimum quota (10m), as upstream compares them.
pub(crate) fn changed(
    have: &ResourceRequirements,
    want: &ResourceRequirements,
) -> Vec<&'static str> {
    let get = |r: &ResourceRequirements, limits: bool, name: &str| {
        let list = if limits { &r.limits } else { &r.requests };
        let q = list.as_ref().and_then(|l| l.get(name))?;
        allocation::amount(name, &q.0)
    };
    let cpu_same = |limits: bool| {
        let floor = if limits { 10 } else { 2 };
        match (get(have, limits, "cpu"), get(want, limits, "cpu")) {
            (Some(a), Some(b)) => a == b || (a <= floor && b <= floor),
            (None, None) => true,
            // No request is the minimum shares; no limit is no quota at all.
            (a, b) => !limits && a.unwrap_or(0) <= floor && b.unwrap_or(0) <= floor,
        }
    };
    let mut out = Vec::new();
    if !cpu_same(false) || !cpu_same(true) {
        out.push("cpu");
    }
    if get(have, false, "memory") != get(want, false, "memory")
        || get(have, true, "memory") != get(want, true, "memory")
    {
        out.push("memory");
    }
    out
}

/// A container's resources as numbers.
fn numbers(r: &ResourceRequirements) -> quantity::ContainerResources {
    quantity::ContainerResources::of(&Container {
        resources: Some(r.clone()),
        ..Default::default()
    })
}

/// The pod cgroup's limits that hold both before and after: each the larger.
fn wider(
    a: &crate::container_manager::cgroups::PodResources,
    b: &crate::container_manager::cgroups::PodResources,
) -> crate::container_manager::cgroups::PodResources {
    let max = |x: Option<i64>, y: Option<i64>| x.zip(y).map(|(x, y)| x.max(y));
    crate::container_manager::cgroups::PodResources {
        cpu_shares: a.cpu_shares.max(b.cpu_shares),
        cpu_quota_us: max(a.cpu_quota_us, b.cpu_quota_us),
        memory_limit_bytes: max(a.memory_limit_bytes, b.memory_limit_bytes),
        memory_min: None,
    }
}

/// What retries a pod's resize, as `kubelet_pod_deferred_accepted_resizes_total` labels
/// it: its own sync after a new resize (the pending condition is of an older generation)
/// is `pod_resized`; any other sync of it, on the deferred resizes' timer, `periodic_retry`.
pub(crate) fn retry_trigger(
    conditions: Option<&allocation::ResizeConditions>,
    generation: Option<i64>,
) -> &'static str {
    match conditions.and_then(|c| c.pending.as_ref()) {
        Some(p) if p.generation == generation => "periodic_retry",
        _ => "pod_resized",
    }
}

/// `kubelet_pod_pending_resizes` and `kubelet_pod_in_progress_resizes` from the pods'
/// resize conditions.
pub(crate) fn record_resize_counts(st: &crate::state::State) {
    let pending = st
        .resize
        .values()
        .filter_map(|c| c.pending.as_ref().map(|p| p.reason.as_str()));
    let in_progress = st
        .resize
        .values()
        .filter(|c| c.in_progress.is_some())
        .count();
    nodeagent_telemetry::metrics::kubelet::set_resize_counts(pending, in_progress as i64);
}

impl PodSync {
    /// Writes the allocations when they changed; a failed write is tried again at the
    /// next change.
    pub(crate) async fn save_allocations(&self) {
        let _one_at_a_time = self.allocation_saves.lock().await;
        let value = {
            let mut st = self.lock();
            if !st.allocations.dirty {
                return;
            }
            st.allocations.dirty = false;
            st.allocations.clone()
        };
        if let Err(e) = self.allocation_store.save(&value).await {
            tracing::warn!(error = %e, "cannot keep the pods' allocations; a restart could lose a pending resize");
            self.lock().allocations.dirty = true;
        }
    }

    /// upstream's `handlePodResourcesResize`: a resize the spec asks for is admitted (the
    /// pod with its new allocation is returned, saved before anything acts on it) or left
    /// pending with its reason (true: deferred, to be tried again).
    pub(crate) async fn admit_resize(
        self: &Arc<Self>,
        pod: &Pod,
        rt: &RuntimePodStatus,
    ) -> (Option<Pod>, bool) {
        let uid = k8s::pod_uid(pod).to_string();
        let (decision, admitted, others, changed) = {
            let mut st = self.lock();
            let trigger = retry_trigger(st.resize.get(&uid), pod.metadata.generation);
            if st.allocations.wanted.contains_key(&uid) {
                // A resize asked for joins the deferred ones, tried in upstream's order
                // (upstream pushes it to the pending queue and retries the queue): one
                // before it may take what is free first, and others may be admitted too.
                let before = st.resize.clone();
                let mut own = None;
                let mut others = Vec::new();
                let mut changed = Vec::new();
                for (u, decision, resized) in
                    self.retry_pending_resizes(&mut st, Some((&uid, pod, rt)), trigger)
                {
                    if u == uid {
                        own = Some((decision, resized));
                    } else if let (Decision::Admitted, Some(resized)) = (decision, resized) {
                        others.push((u, resized));
                    } else if st.resize.get(&u) != before.get(&u) {
                        // Still pending, with a new message: its status says so now, as
                        // upstream's retry syncs every pod whose conditions changed (not
                        // one whose did not: two deferred pods do not wake each other
                        // forever).
                        changed.push(u);
                    }
                }
                let (decision, resized) =
                    own.unwrap_or_else(|| self.decide_resize(&mut st, (&uid, trigger), pod, rt));
                (decision, resized, others, changed)
            } else {
                let (decision, resized) = self.decide_resize(&mut st, (&uid, trigger), pod, rt);
                (decision, resized, Vec::new(), Vec::new())
            }
        };
        for (other, resized) in &others {
            self.resize_started(resized);
            self.trigger(other);
        }
        for other in &changed {
            self.trigger(other);
        }
        if let Some(resized) = &admitted {
            self.resize_started(resized);
        }
        // A pod's first allocation, or a new one, is on disk before anything runs with it:
        // a restart must not take a later spec for what it was allocated.
        self.save_allocations().await;
        match &decision {
            Decision::NoResize => {}
            Decision::Admitted => {
                tracing::info!(pod = %k8s::pod_full_name(pod), "resize admitted");
            }
            Decision::Pending(p) => {
                tracing::info!(pod = %k8s::pod_full_name(pod), reason = p.reason, message = %p.message, "resize pending")
            }
        }
        let deferred =
            matches!(&decision, Decision::Pending(p) if p.reason == allocation::DEFERRED);
        (admitted, deferred)
    }

    /// One pod's resize admission against the other pods' allocations, under the state
    /// lock: the decision, its conditions set, and, when admitted, the pod with its new
    /// allocation (the desired copy updated too).
    fn decide_resize(
        &self,
        st: &mut crate::state::State,
        (uid, trigger): (&str, &'static str),
        pod: &Pod,
        rt: &RuntimePodStatus,
    ) -> (Decision, Option<Pod>) {
        let decision = match st.allocations.wanted.get(uid) {
            None => Decision::NoResize,
            Some(wanted) => {
                let wanted = allocation::with_resources(pod.clone(), wanted);
                let others = st.admitted_requests(uid);
                let node = allocation::Node {
                    allocatable: &self.node.allocatable,
                    others: &others,
                    cpu_manager_static: self.cpu_manager.is_static(),
                };
                match allocation::admit(pod, &wanted, &node) {
                    Ok(()) => Decision::Admitted,
                    Err(pending) => Decision::Pending(pending),
                }
            }
        };
        let mut admitted = None;
        if decision == Decision::Admitted {
            // Every container made with the old allocation that may still run: the
            // running ones and those created but not started yet.
            let made: Vec<(String, String)> = rt
                .containers
                .iter()
                .filter(|c| c.state == RUNNING || c.state == CREATED)
                .map(|c| (c.id.clone(), c.name.clone()))
                .collect();
            if let Some(new) = st.allocations.accept(uid, &made) {
                let resized = allocation::with_resources(pod.clone(), &new);
                if let Some(d) = st.desired.get_mut(uid) {
                    *d = allocation::with_resources(d.clone(), &new);
                }
                admitted = Some(resized);
            }
        }
        let wanted = st
            .allocations
            .wanted
            .get(uid)
            .map(|w| allocation::with_resources(pod.clone(), w));
        let conditions = st.resize.entry(uid.to_string()).or_default();
        if conditions.deferred_then_admitted(&decision) {
            nodeagent_telemetry::metrics::kubelet::record_deferred_accepted_resize(trigger);
        }
        let pending_changed = conditions.after(&decision, pod.metadata.generation);
        if *conditions == Default::default() {
            st.resize.remove(uid);
        }
        if let (Decision::Pending(p), true) = (&decision, pending_changed) {
            if p.reason == allocation::INFEASIBLE {
                nodeagent_telemetry::metrics::kubelet::record_infeasible_resize(p.detail);
            }
            // upstream's ResizeDeferred / ResizeInfeasible: once per new or changed
            // pending condition, with the resources the spec asks for.
            let (reason, message) =
                allocation::resize_pending_event(wanted.as_ref().unwrap_or(pod), p);
            self.events.pod(pod, EventType::Warning, reason, &message);
        }
        record_resize_counts(st);
        (decision, admitted)
    }

    /// upstream's `retryPendingResizes`: every deferred resize (and `asking`'s, the pod
    /// whose sync asks for one, with its runtime state) tried in upstream's order
    /// (`sortPendingResizes`: those asking for no more first, then by priority, QoS class
    /// and how long they waited), each against the allocations as the ones before it left
    /// them, so that what is free goes to the first in that order. Each pod's decision,
    /// and its pod with the new allocation where admitted (the other workers carry theirs
    /// out at their next sync; the allocation is saved before anything acts on it).
    pub(crate) fn retry_pending_resizes(
        &self,
        st: &mut crate::state::State,
        asking: Option<(&str, &Pod, &RuntimePodStatus)>,
        trigger: &'static str,
    ) -> Vec<(String, Decision, Option<Pod>)> {
        let asking_uid = asking.map(|(u, _, _)| u);
        let mut order: Vec<allocation::PendingOrder> = st
            .resize
            .iter()
            .filter(|(_, c)| {
                c.pending
                    .as_ref()
                    .is_some_and(|p| p.reason == allocation::DEFERRED)
            })
            .map(|(uid, _)| uid.as_str())
            .chain(asking_uid)
            .collect::<std::collections::BTreeSet<&str>>()
            .into_iter()
            .filter_map(|uid| {
                let allocated = st.desired.get(uid)?;
                let wanted =
                    allocation::with_resources(allocated.clone(), st.allocations.wanted.get(uid)?);
                let since = st
                    .statuses
                    .get(uid)
                    .and_then(|p| p.status.as_ref())
                    .and_then(|s| s.conditions.as_ref())
                    .and_then(|cs| {
                        cs.iter()
                            .find(|c| c.type_ == allocation::POD_RESIZE_PENDING)
                    })
                    .and_then(|c| c.last_transition_time.as_ref())
                    .and_then(|t| serde_json::to_value(t).ok())
                    .and_then(|v| v.as_str().map(str::to_string));
                Some(allocation::PendingOrder::of(uid, allocated, &wanted, since))
            })
            .collect();
        allocation::sort_pending(&mut order);
        let mut out = Vec::new();
        for o in order {
            let (pod, rt) = match asking {
                Some((u, pod, rt)) if u == o.uid => (pod.clone(), rt.clone()),
                _ => match (st.desired.get(&o.uid), st.runtime.get(&o.uid)) {
                    (Some(p), Some(r)) => (p.clone(), r.clone()),
                    _ => continue,
                },
            };
            let (decision, resized) = self.decide_resize(st, (&o.uid, trigger), &pod, &rt);
            if decision == Decision::Admitted && Some(o.uid.as_str()) != asking_uid {
                tracing::info!(pod = %k8s::pod_full_name(&pod), "deferred resize admitted");
            }
            out.push((o.uid, decision, resized));
        }
        out
    }

    /// Carries the pod's allocation out in its running containers of `sandbox_id` but those
    /// this sync killed already (upstream's `doPodResizeAction`); a retry delay when
    /// something failed. Clears
    /// `PodResizeInProgress` once every one runs with it (a `ResizeCompleted` event).
    pub(crate) async fn actuate_resize(
        self: &Arc<Self>,
        pod: &Pod,
        rt: &RuntimePodStatus,
        (sandbox_id, killed): (&str, &[String]),
        ctx: (&str, &str, &HashMap<String, String>),
    ) -> anyhow::Result<Option<Duration>> {
        let uid = k8s::pod_uid(pod).to_string();
        let mut updates: Vec<(&Container, &RuntimeContainer, ResourceRequirements)> = Vec::new();
        let mut restarts: Vec<(&Container, &RuntimeContainer)> = Vec::new();
        {
            let st = self.lock();
            for c in resizable(pod) {
                let Some(r) = rt.containers.iter().find(|r| {
                    r.name == c.name
                        && r.state == RUNNING
                        && r.sandbox_id == sandbox_id
                        && !killed.contains(&r.id)
                }) else {
                    continue;
                };
                let want = c.resources.clone().unwrap_or_default();
                let Some(have) = st.allocations.actuated(&uid, &r.id, &c.name).cloned() else {
                    continue;
                };
                let diff = changed(&have, &want);
                if diff.is_empty() {
                    continue;
                }
                if diff.iter().any(|res| policy(c, res) == "RestartContainer") {
                    restarts.push((c, r));
                } else {
                    updates.push((c, r, have));
                }
            }
        }
        if updates.is_empty() && restarts.is_empty() {
            // A container killed by this sync comes back with the allocation; until the
            // next sync sees it, the resize is not done.
            if killed.is_empty() {
                self.resize_done(pod);
            }
            return Ok(None);
        }
        let mut retry = None;
        // upstream's computePodResizeAction: a container whose policy asks for it is
        // killed and started again with its new resources (a restart that counts).
        for (c, r) in &restarts {
            let message = format!("Container {} resize requires restart", c.name);
            self.kill_container(
                Some(pod),
                &c.name,
                &r.id,
                grace_seconds(pod),
                Some(&message),
            )
            .await;
            self.acted(&uid);
            if let Some(wait) = self.replace_killed(pod, c, r, ctx).await? {
                retry = Some(wait);
            }
        }
        // upstream's doPodResizeAction, timed (`kubelet_pod_resize_duration_milliseconds`).
        let started = std::time::Instant::now();
        let in_place = match updates.is_empty() {
            true => Ok(()),
            false => self.update_in_place(pod, &uid, &updates).await,
        };
        if !updates.is_empty() {
            nodeagent_telemetry::metrics::kubelet::record_resize_duration(
                started.elapsed().as_millis() as f64,
                in_place.is_ok(),
            );
        }
        if let Err(message) = in_place {
            tracing::warn!(pod = %k8s::pod_full_name(pod), %message, "resize failed");
            // upstream's ResizeError (events/resize.go `PodResizeErrorMsg`): the pod as
            // allocated, with the error.
            self.events.pod(
                pod,
                EventType::Warning,
                "ResizeError",
                &allocation::resize_error_message(pod, &message),
            );
            let mut st = self.lock();
            st.resize
                .entry(uid.clone())
                .or_default()
                .failed(message, pod.metadata.generation);
            record_resize_counts(&st);
            retry = Some(Duration::from_secs(10));
        }
        if retry.is_none() && restarts.is_empty() {
            self.resize_done(pod);
        }
        self.save_allocations().await;
        Ok(retry)
    }

    /// upstream's `ResizeStarted` event, once a resize is admitted: the pod as newly
    /// allocated.
    pub(crate) fn resize_started(&self, resized: &Pod) {
        self.events.pod(
            resized,
            EventType::Normal,
            "ResizeStarted",
            &format!(
                "Pod resize started: {}",
                allocation::resize_details(resized)
            ),
        );
    }

    /// Nothing left to carry out: the in-progress condition goes.
    fn resize_done(&self, pod: &Pod) {
        let uid = k8s::pod_uid(pod);
        let mut st = self.lock();
        let Some(conditions) = st.resize.get_mut(uid) else {
            return;
        };
        if conditions.in_progress.take().is_some() {
            tracing::info!(pod = %k8s::pod_full_name(pod), "resize completed");
            drop(st);
            self.events.pod(
                pod,
                EventType::Normal,
                "ResizeCompleted",
                &format!("Pod resize completed: {}", allocation::resize_details(pod)),
            );
            st = self.lock();
        }
        if st.resize.get(uid).is_some_and(|c| *c == Default::default()) {
            st.resize.remove(uid);
        }
        record_resize_counts(&st);
    }

    /// `UpdateContainerResources` for each of `updates` (container, its runtime instance,
    /// what it runs with now), the pod cgroup widened first and set to the pod's
    /// allocation after; a memory limit below a container's current use is refused in
    /// upstream's words and nothing of that container changes.
    async fn update_in_place(
        &self,
        pod: &Pod,
        uid: &str,
        updates: &[(&Container, &RuntimeContainer, ResourceRequirements)],
    ) -> Result<(), String> {
        use crate::container_manager::cgroups;
        let cgroup =
            cgroups::pod_cgroup_name(pod, self.node.cgroups_per_qos, &self.node.cgroup_root);
        let new_pod = cgroups::pod_resources(pod);
        let before: Resources = updates
            .iter()
            .map(|(c, _, have)| (c.name.clone(), have.clone()))
            .collect();
        let old_pod = cgroups::pod_resources(&allocation::with_resources(pod.clone(), &before));
        // upstream's doPodResizeAction: neither the pod's nor a container's memory limit
        // goes below what it uses now, the pod named first (a 1.35 kubelet's words:
        // "cannot decrease memory limits: [attempting to set pod memory limit (134217728)
        // below current usage (319180800), attempting to set container \"probe\" ...]").
        let mut below_usage = Vec::new();
        if let (Some(name), Some(limit)) = (&cgroup, new_pod.memory_limit_bytes)
            && old_pod.memory_limit_bytes.is_none_or(|old| limit < old)
            && let Some(usage) =
                cgroups::memory_usage(&self.cgroups.fs, &name.path(self.node.cgroup_driver))
            && usage > limit as u64
        {
            below_usage.push(format!(
                "attempting to set pod memory limit ({limit}) below current usage ({usage})"
            ));
        }
        for (c, r, have) in updates {
            let new = quantity::ContainerResources::of(c).memory_limit;
            let old = numbers(have).memory_limit;
            let Some(limit) = new.filter(|n| old.is_none_or(|o| n < &o)) else {
                continue;
            };
            if let Some(usage) = self.memory_usage(&r.id).await
                && usage > limit as u64
            {
                below_usage.push(format!(
                    "attempting to set container {:?} memory limit ({limit}) below current usage ({usage})",
                    c.name
                ));
            }
        }
        match below_usage.len() {
            0 => {}
            1 => return Err(format!("cannot decrease memory limits: {}", below_usage[0])),
            _ => {
                return Err(format!(
                    "cannot decrease memory limits: [{}]",
                    below_usage.join(", ")
                ));
            }
        }
        if let Some(name) = &cgroup {
            self.cgroups
                .ensure(name, &wider(&old_pod, &new_pod), self.node.pod_pids_limit)
                .await
                .map_err(|e| format!("resizing the pod cgroup: {e}"))?;
        }
        // Decreases first, so that the pod's total never exceeds its cgroup on the way.
        let mut ordered: Vec<_> = updates.iter().collect();
        ordered.sort_by_key(|(c, _, have)| {
            let (new, old) = (quantity::ContainerResources::of(c), numbers(have));
            (new.memory_limit > old.memory_limit) || (new.cpu_request > old.cpu_request)
        });
        for (c, r, _) in ordered {
            let linux: LinuxContainerResources = runtime_spec::linux_resources(pod, c, &self.node);
            let mut runtime = self.cri.runtime.clone();
            let request = self.cri.request(UpdateContainerResourcesRequest {
                container_id: r.id.clone(),
                linux: Some(linux),
                ..Default::default()
            });
            runtime
                .update_container_resources(request)
                .await
                .map_err(|e| format!("updating container {:?}: {}", c.name, e.message()))?;
            tracing::info!(container = %c.name, container.id = %r.id, "container resized in place");
            let want = c.resources.clone().unwrap_or_default();
            self.lock()
                .allocations
                .actuated_now(uid, &r.id, &c.name, &want);
        }
        if let Some(name) = &cgroup {
            self.cgroups
                .ensure(name, &new_pod, self.node.pod_pids_limit)
                .await
                .map_err(|e| format!("resizing the pod cgroup: {e}"))?;
        }
        Ok(())
    }

    /// A container's memory use now, as the runtime's stats give it.
    async fn memory_usage(&self, id: &str) -> Option<u64> {
        let mut runtime = self.cri.runtime.clone();
        let stats = runtime
            .container_stats(self.cri.request(ContainerStatsRequest {
                container_id: id.to_string(),
            }))
            .await
            .ok()?
            .into_inner()
            .stats?;
        stats.memory?.usage_bytes.map(|u| u.value)
    }
}

#[cfg(test)]
mod tests;
