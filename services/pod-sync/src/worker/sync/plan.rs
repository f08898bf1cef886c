//! What one sync does to a pod's sandbox and regular containers: upstream's
//! `computePodActions` (pkg/kubelet/kuberuntime/kuberuntime_manager.go), with its
//! `PodSandboxChanged` and `ShouldContainerBeRestarted`, as pure functions of the pod, the
//! runtime's view of it and the probe results. Init containers and sidecars are planned by
//! `init_plan` (upstream's `computeInitContainerActions`); `sync.rs` only carries the plans
//! out. Upstream's own table (`TestComputePodActions`) drives these in `plan/tests.rs`.
//!
//! Departures from upstream, on purpose (each has its row in the table, with the reason):
//! - Several ready sandboxes: the newest is kept and the others stopped. Upstream kills the
//!   pod and makes a new one; a surplus sandbox here is one that a pod-sync killed between
//!   RunPodSandbox and recording it left behind, and restarting every container of the pod
//!   for it would break the promise that a restart of ours disturbs nothing.
//! - A ready sandbox without an IP is kept: our relist leaves the IP empty when one
//!   PodSandboxStatus call fails, so an empty IP is no proof the network is gone, and
//!   recreating the sandbox on a passing CRI error would restart the whole pod.
//! - A container found Created (a pod-sync died between CreateContainer and
//!   StartContainer) is started, not replaced by a new one.

use crate::restart_policy::{container_should_restart, restarts_after_kill};
use crate::status::instances;
use crate::worker::init_plan::InitView;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use nodeagent_proto::api::{RuntimeContainer, RuntimePodStatus, RuntimeSandbox};
use nodeagent_proto::cri;
use std::collections::HashSet;

const RUNNING: i32 = cri::ContainerState::ContainerRunning as i32;
const EXITED: i32 = cri::ContainerState::ContainerExited as i32;
const CREATED: i32 = cri::ContainerState::ContainerCreated as i32;
const SANDBOX_READY: i32 = cri::PodSandboxState::SandboxReady as i32;

/// What the probes say of the pod's running containers (by container id).
#[derive(Debug, Default, Clone, Copy)]
pub struct ProbeResults<'a> {
    /// Its liveness probe failed, or its startup probe before it passed.
    pub unhealthy: Option<&'a HashSet<String>>,
    /// Its startup probe passed (or it has none).
    pub started: Option<&'a HashSet<String>>,
}

impl ProbeResults<'_> {
    fn unhealthy(&self, id: &str) -> bool {
        self.unhealthy.is_some_and(|s| s.contains(id))
    }
    fn started(&self, id: &str) -> bool {
        self.started.is_some_and(|s| s.contains(id))
    }
}

/// The sandbox a sync works in (upstream's `CreateSandbox`, `SandboxID`, `Attempt`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SandboxPlan {
    /// The newest ready sandbox; `surplus` are the other ready ones, to stop.
    Keep {
        id: String,
        ip: String,
        surplus: Vec<String>,
    },
    /// No ready sandbox: the pod's running containers are killed (upstream's `KillPod`),
    /// then a new sandbox is made with `attempt`. `changed` when the pod had one before
    /// (upstream's SandboxChanged event).
    Create { attempt: u32, changed: bool },
    /// No ready sandbox, and none is made: the pod has finished (upstream: `KillPod` without
    /// `CreateSandbox`). What still runs of it is killed.
    Finished,
}

/// The restart policy, upstream's default `Always` where unset.
pub fn restart_policy(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        .unwrap_or("Always")
}

/// Upstream's `PodSandboxChanged` and the first half of `computePodActions`.
pub fn plan_sandbox(pod: &Pod, rt: &RuntimePodStatus) -> SandboxPlan {
    let mut ready: Vec<&RuntimeSandbox> = rt
        .sandboxes
        .iter()
        .filter(|s| s.state == SANDBOX_READY)
        .collect();
    ready.sort_by_key(|s| std::cmp::Reverse(s.created_at_unix_nanos));
    if let Some(newest) = ready.first() {
        return SandboxPlan::Keep {
            id: newest.id.clone(),
            ip: newest.ip.clone(),
            surplus: ready[1..].iter().map(|s| s.id.clone()).collect(),
        };
    }
    let attempt = rt
        .sandboxes
        .iter()
        .map(|s| s.attempt + 1)
        .max()
        .unwrap_or(0);
    let policy = restart_policy(pod);
    // Under Never a pod whose sandbox died after any container was made does not run again
    // ("Should not restart the pod, just return"); with no container made yet, its sandbox
    // is retried.
    if policy == "Never" && attempt != 0 && !rt.containers.is_empty() {
        return SandboxPlan::Finished;
    }
    // No regular container left to start (OnFailure's succeeded ones are not run again)
    // and the pod was initialized (a regular container was made): nothing to make a
    // sandbox for.
    let containers = regular_containers(pod);
    let to_start = containers
        .iter()
        .filter(|c| !(policy == "OnFailure" && succeeded(rt, &c.name)))
        .count();
    let initialized = containers
        .iter()
        .any(|c| !instances(Some(rt), &c.name).is_empty());
    if to_start == 0 && initialized {
        return SandboxPlan::Finished;
    }
    SandboxPlan::Create {
        attempt,
        changed: !rt.sandboxes.is_empty(),
    }
}

fn regular_containers(pod: &Pod) -> &[Container] {
    pod.spec.as_ref().map_or(&[], |s| &s.containers)
}

/// Upstream's `containerSucceeded`: the newest instance exited 0.
fn succeeded(rt: &RuntimePodStatus, name: &str) -> bool {
    instances(Some(rt), name)
        .first()
        .is_some_and(|c| c.state == EXITED && c.exit_code == 0)
}

/// How a regular container is started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    /// A new container, with this attempt and back-off base (one past its newest instance).
    New { attempt: u32, backoff_base: u32 },
    /// After the crash-loop back-off of this exited instance (in any sandbox of the pod).
    AfterBackoff { previous: String },
    /// A container made but never started: start it.
    Created { id: String },
    /// The replacement of one killed in this same sync for a changed definition, at once
    /// (a new spec has no back-off).
    Replacing { killed: String },
    /// Killed in this sync for a failed probe: the next sync restarts it, after the
    /// back-off of its earlier runs.
    NextSync,
}

/// Why a running (or unknown) container is killed: upstream's `containerKillReason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillReason {
    /// Its spec changed (upstream leaves this reason empty).
    DefinitionChanged,
    LivenessProbe,
    StartupProbe,
    /// Its state is unknown: killed before it is started again, so that two instances never
    /// run (upstream's `reasonUnknown`).
    Unknown,
}

/// One container to kill (upstream's `containerToKillInfo`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerKill {
    pub index: usize,
    pub id: String,
    pub message: String,
    pub reason: KillReason,
}

/// The regular containers' half of `computePodActions`, once the pod is initialized.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct AppPlan {
    /// Spec indexes, in spec order, with how each is started.
    pub to_start: Vec<(usize, Start)>,
    pub to_kill: Vec<ContainerKill>,
    /// Nothing runs on and nothing is started: the pod is done (upstream's `KillPod`).
    pub kill_pod: bool,
}

/// The regular containers' actions. `sandbox` is the sandbox in use (`None` for one just
/// made, which holds nothing yet).
pub fn plan_app_containers(
    pod: &Pod,
    rt: &RuntimePodStatus,
    sandbox: Option<&str>,
    probes: ProbeResults<'_>,
) -> AppPlan {
    let policy = restart_policy(pod);
    let no_spec = PodSpec::default();
    let spec = pod.spec.as_ref().unwrap_or(&no_spec);
    let deleting = pod.metadata.deletion_timestamp.is_some();
    let containers = regular_containers(pod);
    let mut plan = AppPlan::default();
    let mut keep = 0;
    for (index, c) in containers.iter().enumerate() {
        let all = instances(Some(rt), &c.name);
        let latest = all
            .iter()
            .copied()
            .find(|i| sandbox.is_some_and(|s| i.sandbox_id == s));
        let Some(latest) = latest else {
            // Not in this sandbox: a new one, or after the back-off of its run in an earlier
            // sandbox (upstream's doBackOff looks at every sandbox's containers), unless that
            // run ended for good under the policy.
            let previous = all.first().copied().filter(|i| i.state == EXITED);
            let start = match previous {
                _ if deleting => None,
                Some(p) if !container_should_restart(c, spec, p.exit_code) => None,
                Some(p) => Some(Start::AfterBackoff {
                    previous: p.id.clone(),
                }),
                None => Some(next_new(&all)),
            };
            plan.to_start.extend(start.map(|s| (index, s)));
            continue;
        };
        if latest.state != RUNNING {
            if let Some(start) = restart_not_running(latest, &all, (c, spec), deleting) {
                if latest.state != CREATED && latest.state != EXITED {
                    plan.to_kill.push(ContainerKill {
                        index,
                        id: latest.id.clone(),
                        message: "Container is in \"unknown\" state, try killing it before restart"
                            .into(),
                        reason: KillReason::Unknown,
                    });
                }
                plan.to_start.push((index, start));
            }
            continue;
        }
        // Running: killed for a changed definition (restarted whatever the policy), a failed
        // liveness probe, or a failed startup probe (restarted unless the policy is Never).
        let (message, reason, restart) = if crate::runtime_spec::container_changed(c, latest) {
            (
                format!("Container {} definition changed", c.name),
                KillReason::DefinitionChanged,
                true,
            )
        } else if probes.unhealthy(&latest.id) {
            // A startup probe fails only before it has passed; after, it is the liveness probe.
            let startup = c.startup_probe.is_some() && !probes.started(&latest.id);
            let (kind, reason) = if startup {
                ("startup", KillReason::StartupProbe)
            } else {
                ("liveness", KillReason::LivenessProbe)
            };
            (
                format!("Container {} failed {kind} probe", c.name),
                reason,
                restarts_after_kill(c, policy != "Never"),
            )
        } else {
            keep += 1;
            continue;
        };
        let message = if restart {
            let start = if reason == KillReason::DefinitionChanged {
                Start::Replacing {
                    killed: latest.id.clone(),
                }
            } else {
                Start::NextSync
            };
            plan.to_start.push((index, start));
            format!("{message}, will be restarted")
        } else {
            message
        };
        plan.to_kill.push(ContainerKill {
            index,
            id: latest.id.clone(),
            message,
            reason,
        });
    }
    plan.kill_pod = keep == 0 && plan.to_start.is_empty();
    plan
}

/// A container that is not running in the sandbox in use: upstream's
/// `ShouldContainerBeRestarted`, and how.
fn restart_not_running(
    latest: &RuntimeContainer,
    all: &[&RuntimeContainer],
    (c, spec): (&Container, &PodSpec),
    deleting: bool,
) -> Option<Start> {
    if deleting {
        return None;
    }
    match latest.state {
        CREATED => Some(Start::Created {
            id: latest.id.clone(),
        }),
        EXITED if container_should_restart(c, spec, latest.exit_code) => {
            Some(Start::AfterBackoff {
                previous: latest.id.clone(),
            })
        }
        EXITED => None,
        // Unknown: always restarted, after a kill.
        _ => Some(next_new(all)),
    }
}

/// A new instance: one past the newest, keeping its back-off base.
fn next_new(all: &[&RuntimeContainer]) -> Start {
    let (attempt, backoff_base) = all
        .first()
        .map(|c| (c.attempt + 1, c.backoff_base))
        .unwrap_or((0, 0));
    Start::New {
        attempt,
        backoff_base,
    }
}

/// The ephemeral containers to start (upstream's `EphemeralContainersToStart`, by spec
/// index): those the runtime has no instance of, in any sandbox of the pod, since an
/// ephemeral container is never restarted. Planned whenever the pod keeps its sandbox,
/// initialized or not (upstream: "Ephemeral containers may be started even if
/// initialization is not yet complete").
///
/// Better than upstream, whose only record is the runtime's: one that `ran` (its status
/// shows it started, the published one or the API server's copy) is not started again
/// when its dead container is gone (removed by the container GC or by hand), where
/// upstream would run the command a second time.
pub fn plan_ephemeral(pod: &Pod, rt: &RuntimePodStatus, ran: &HashSet<&str>) -> Vec<usize> {
    let ephemeral = pod
        .spec
        .as_ref()
        .and_then(|s| s.ephemeral_containers.as_deref())
        .unwrap_or_default();
    ephemeral
        .iter()
        .enumerate()
        .filter(|(_, e)| !ran.contains(e.name.as_str()))
        .filter(|(_, e)| instances(Some(rt), &e.name).is_empty())
        .map(|(i, _)| i)
        .collect()
}

/// What `init_plan` needs to know of an init container's newest instance in the sandbox
/// in use.
pub fn init_view(
    c: &Container,
    latest: Option<&RuntimeContainer>,
    probes: ProbeResults<'_>,
) -> InitView {
    let Some(l) = latest else {
        return InitView::Absent;
    };
    match l.state {
        RUNNING => InitView::Running {
            id: l.id.clone(),
            started: c.startup_probe.is_none() || probes.started(&l.id),
            unhealthy: probes.unhealthy(&l.id),
            changed: crate::runtime_spec::container_changed(c, l),
        },
        CREATED => InitView::Created,
        EXITED => InitView::Exited {
            exit_code: l.exit_code,
        },
        _ => InitView::Unknown { id: l.id.clone() },
    }
}

#[cfg(test)]
mod tests;
