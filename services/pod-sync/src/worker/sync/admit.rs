//! What may stop a pod before anything of it runs, or end it for good: admission against
//! the node's resources and pressure, `activeDeadlineSeconds`, a pod-level failure the API
//! server already knows, and stopping everything of a pod that must not run.

use super::*;

/// Something of the pod is in the runtime: it was admitted before (by an earlier
/// pod-sync), and admission does not look at it again.
fn has_run(rt: &RuntimePodStatus) -> bool {
    !rt.sandboxes.is_empty() || !rt.containers.is_empty()
}

/// upstream's resource allocation refusal (`admission.GetPodAdmitResult`): an allocation
/// error of the CPU or device manager, in its words.
fn unexpected_admission_error(e: &str) -> crate::runtime_spec::security::Refusal {
    crate::runtime_spec::security::Refusal {
        reason: "UnexpectedAdmissionError",
        message: format!("Allocate failed due to {e}, which is unexpected"),
    }
}

impl PodSync {
    /// `activeDeadlineSeconds`: once the pod has been active longer, every container is
    /// stopped and the pod is Failed with reason DeadlineExceeded (`Err`: the sync is
    /// over). Otherwise `Ok` with the time left, if there is a deadline.
    pub(crate) async fn enforce_active_deadline(
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
                Duration::from_nanos((crate::worker::workers::now_nanos() - started).max(0) as u64);
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

    /// The one way pod-sync kills a set of a pod's running containers (upstream's
    /// `killContainersWithSyncResult`): all at once, each with its preStop hook and a
    /// Killing event, regular containers first and then the sidecars in reverse order,
    /// under one grace period for the whole set.
    pub(crate) async fn kill_in_order(
        &self,
        pod: &Pod,
        running: &[&RuntimeContainer],
        grace_seconds: i64,
    ) {
        let names: Vec<&str> = running.iter().map(|c| c.name.as_str()).collect();
        let order = TerminationOrder::new(pod, &names);
        let clock = GraceClock::fixed(grace_seconds);
        let kills = running.iter().map(|c| {
            self.kill_container_ordered(Some(pod), &c.name, &c.id, &clock, None, Some(&order))
        });
        join_all(kills).await;
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
        self.kill_in_order(pod, &running, grace).await;
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
    pub(crate) async fn refuse_unadmitted(
        self: &Arc<Self>,
        pod: &Pod,
        rt: &RuntimePodStatus,
    ) -> Option<SyncOutcome> {
        // Upstream's order of admit handlers (kubelet.go): eviction, sysctls, the resource
        // managers (CPUs, devices), then the predicate handler (resources, and preemption
        // for a critical pod).
        let mut refused = crate::runtime_spec::security::admit(pod, &self.host_security)
            .err()
            .or_else(|| self.refuse_under_pressure(pod, rt))
            .or_else(|| self.refuse_without_cpus(pod, rt));
        if refused.is_none() {
            refused = self.refuse_without_devices(pod, rt).await;
        }
        if refused.is_none() {
            match self.admit_resources(pod, rt) {
                Ok(preemption) => self.preempt(pod, preemption).await,
                Err(refusal) => refused = Some(refusal),
            }
        }
        let refusal = refused?;
        // upstream's rejectPod: a Warning event with the reason and message, and the pod
        // Failed with "Pod was rejected: " before the message.
        let first = {
            let mut st = self.lock();
            let failed = st.pod_failed.entry(k8s::pod_uid(pod).to_string());
            let first = matches!(failed, std::collections::hash_map::Entry::Vacant(_));
            failed.or_insert(Waiting {
                reason: refusal.reason.to_string(),
                message: format!("Pod was rejected: {}", refusal.message),
            });
            first
        };
        if first {
            tracing::error!(reason = refusal.reason, message = %refusal.message, "pod refused at admission");
            self.events.pod(
                pod,
                nodeagent_config::events::EventType::Warning,
                refusal.reason,
                &refusal.message,
            );
        }
        self.stop_everything(pod, rt, refusal.reason, None).await;
        Some(SyncOutcome::Terminated)
    }
}

/// The pods a critical pod's admission preempts, and the first resource it was short of
/// (`kubelet_preemptions`' `preemption_signal`).
#[derive(Debug, Default)]
pub(crate) struct Preemption {
    victims: Vec<Pod>,
    signal: &'static str,
}

impl PodSync {
    /// upstream's resource admission (`admission`): a pod that has not started yet is
    /// admitted when it fits, beside every pod admitted or running that has not finished,
    /// into `maxPods` and allocatable cpu, memory and ephemeral-storage; admitted once, it
    /// stays admitted. A critical pod that does not fit is admitted by preempting others
    /// (upstream's `CriticalPodAdmissionHandler`, [`crate::node::preemption`]): the pods
    /// returned, already counted out (Failed, `Preempting`), for the caller to stop.
    pub(crate) fn admit_resources(
        &self,
        pod: &Pod,
        rt: &RuntimePodStatus,
    ) -> Result<Preemption, crate::runtime_spec::security::Refusal> {
        use crate::node::preemption::{Candidate, handle_admission_failure};
        use crate::status::reasons::{PREEMPTED_MESSAGE, PREEMPTED_REASON};
        let uid = k8s::pod_uid(pod).to_string();
        let mut st = self.lock();
        if st.admitted.contains(&uid) || has_run(rt) {
            st.admitted.insert(uid);
            return Ok(Preemption::default());
        }
        let short = crate::node::admission::shortfalls(
            crate::node::admission::requests(pod),
            &st.admitted_requests(&uid),
            &self.node.allocatable,
        );
        let victims: Vec<Pod> = {
            let active: Vec<Candidate> = st.admitted_pods(&uid).map(Candidate::new).collect();
            handle_admission_failure(pod, &short, &active)?
                .into_iter()
                .map(|c| c.pod.clone())
                .collect()
        };
        for v in &victims {
            st.pod_failed.insert(
                k8s::pod_uid(v).to_string(),
                Waiting {
                    reason: PREEMPTED_REASON.into(),
                    message: PREEMPTED_MESSAGE.into(),
                },
            );
        }
        if let (Some(first), false) = (short.first(), victims.is_empty()) {
            tracing::info!(
                pod = %k8s::pod_full_name(pod),
                short_of = first.resource.name(),
                preempted = ?victims.iter().map(k8s::pod_full_name).collect::<Vec<_>>(),
                "admitting a critical pod by preempting others"
            );
        }
        st.admitted.insert(uid);
        Ok(Preemption {
            victims,
            signal: short.first().map_or("", |s| s.resource.name()),
        })
    }

    /// Stops each preempted pod, one after another, with its own grace period, as
    /// upstream's `evictPodsToFreeRequests` (a `Preempting` Warning event first; one
    /// `kubelet_preemptions` per pod, under the first resource short): its worker, which
    /// finds it ended for good, stops it, and this waits for that.
    async fn preempt(self: &Arc<Self>, for_pod: &Pod, preemption: Preemption) {
        use crate::status::reasons::{PREEMPTED_MESSAGE, PREEMPTED_REASON};
        for v in preemption.victims {
            tracing::warn!(
                pod = %k8s::pod_full_name(&v),
                requesting_pod = %k8s::pod_full_name(for_pod),
                "preempting pod to free up resources"
            );
            self.events.pod(
                &v,
                nodeagent_config::events::EventType::Warning,
                PREEMPTED_REASON,
                PREEMPTED_MESSAGE,
            );
            self.kill_pod_now(&v, None).await;
            nodeagent_telemetry::metrics::kubelet::record_preemption(preemption.signal);
        }
    }

    /// The CPU manager's admission (upstream's resource allocation admit handler): the
    /// exclusive CPUs of a Guaranteed pod's containers are assigned before anything of it
    /// runs; a pod that cannot have them is refused `UnexpectedAdmissionError` in
    /// upstream's words. A pod that runs already keeps what the state file says.
    pub(crate) fn refuse_without_cpus(
        &self,
        pod: &Pod,
        rt: &RuntimePodStatus,
    ) -> Option<crate::runtime_spec::security::Refusal> {
        if has_run(rt) {
            return None;
        }
        use crate::container_manager::cpu_manager::policy::AllocError;
        match self.cpu_manager.admit(pod).err()? {
            AllocError::Unexpected(e) => Some(unexpected_admission_error(&e)),
            // upstream's SMTAlignmentError is an admission error of its own type.
            AllocError::SmtAlignment(message) => Some(crate::runtime_spec::security::Refusal {
                reason: "SMTAlignmentError",
                message,
            }),
        }
    }

    /// The device manager's admission (upstream's resource allocation admit handler): the
    /// devices of each container that asks for a plugin's resource are chosen, and the
    /// plugin's `Allocate` answered, before anything of the pod runs; a pod that cannot
    /// have them is refused `UnexpectedAdmissionError` in upstream's words. A pod that
    /// runs already keeps what the checkpoint says.
    pub(crate) async fn refuse_without_devices(
        &self,
        pod: &Pod,
        rt: &RuntimePodStatus,
    ) -> Option<crate::runtime_spec::security::Refusal> {
        if has_run(rt) {
            return None;
        }
        let active = self.lock().active_uids();
        let e = self
            .device_manager
            .admit(pod, active.as_ref())
            .await
            .err()?;
        Some(unexpected_admission_error(&e))
    }

    /// upstream's node shutdown admission (every new pod is refused while the node shuts
    /// down) and eviction manager `Admit`: a pod that has not started yet is refused
    /// (Failed, reason Evicted) under DiskPressure or PIDPressure, and under MemoryPressure
    /// when it is BestEffort; critical pods are always admitted.
    pub(crate) fn refuse_under_pressure(
        &self,
        pod: &Pod,
        rt: &RuntimePodStatus,
    ) -> Option<crate::runtime_spec::security::Refusal> {
        use nodeagent_config::eviction::Condition;
        if has_run(rt) {
            return None;
        }
        if self.lock().shutting_down {
            return Some(crate::runtime_spec::security::Refusal {
                reason: crate::status::reasons::SHUTDOWN_REFUSAL_REASON,
                message: crate::status::reasons::SHUTDOWN_REFUSAL_MESSAGE.into(),
            });
        }
        if crate::container_manager::oom::is_critical(pod) {
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
        let best_effort = crate::container_manager::cgroups::qos_class(pod)
            == crate::container_manager::cgroups::QosClass::BestEffort
            && !tolerates;
        let refused: Vec<&str> = pressure
            .iter()
            .filter(|c| **c != Condition::MemoryPressure || best_effort)
            .map(|c| c.name())
            .collect();
        if refused.is_empty() {
            return None;
        }
        let names: Vec<&str> = pressure.iter().map(|c| c.name()).collect();
        Some(crate::runtime_spec::security::Refusal {
            reason: crate::status::reasons::EVICTED,
            // Go's %v of a slice: "[MemoryPressure DiskPressure]".
            message: format!("The node had condition: [{}]. ", names.join(" ")),
        })
    }

    /// A pod the API server already knows as Failed for a pod-level reason (Evicted,
    /// DeadlineExceeded, an admission refusal) stays so after a pod-sync restart: upstream
    /// never runs a pod whose status is terminal again.
    pub(crate) fn restore_pod_failure(&self, pod: &Pod) {
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
}
