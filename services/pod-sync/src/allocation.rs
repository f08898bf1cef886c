//! In-place resize (KEP-1287, GA upstream): upstream's allocation manager
//! (`pkg/kubelet/allocation`). A pod's containers run with the resources the node
//! *allocated* them, which are the spec's until a resize asks for others; a resize is
//! admitted only when it fits the node beside the other pods' allocations, and until then
//! the pod keeps what it had, with a `PodResizePending` condition saying why (`Deferred`:
//! not now; `Infeasible`: never on this node). Once admitted, the new allocation is saved
//! *before* anything changes, then carried out in the running containers
//! (`UpdateContainerResources`, or a restart where `resizePolicy` says `RestartContainer`),
//! with `PodResizeInProgress` until every running container runs with it.
//!
//! Kept on disk (`<root-dir>/pod-sync/allocated-pods.json`, upstream's
//! `allocated_pods_state` and `actuated_pods_state` in one file), so a pod-sync restart in
//! the middle of a resize neither forgets a deferred resize (the spec would be taken as
//! allocated) nor loses track of a container not yet updated.
//!
//! Everything else in pod-sync (admission of other pods, QoS tiers, the pod cgroup, the
//! containers it creates, eviction ranking) reads the desired pods, which `intake` gives
//! the allocated resources: only this module and the resize step see what the spec asks.

use crate::container_manager::quantity;
use crate::node::admission::{self, NodeResources, Requests};
use k8s_openapi::api::core::v1::{Container, Pod, ResourceRequirements};
use nodeagent_proto::k8s;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// Container name -> its resources.
pub type Resources = BTreeMap<String, ResourceRequirements>;

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Allocations {
    /// uid -> each container's resources as last admitted.
    #[serde(default)]
    pub pods: BTreeMap<String, Resources>,
    /// container id -> the resources it runs with, where they are not its pod's
    /// allocation: it ran before a resize was admitted and has not been updated yet. A
    /// container with no entry runs with its pod's allocation (it was created with it, or
    /// updated to it).
    #[serde(default)]
    pub actuated: BTreeMap<String, ResourceRequirements>,
    /// uid -> what the spec asks for, where it is not the allocation (a resize not
    /// admitted yet). Not saved: the pod sources give it again.
    #[serde(skip)]
    pub wanted: BTreeMap<String, Resources>,
    /// Pods whose spec this process has seen: a change to one after that is a requested
    /// resize (one seen first after a restart may only be asked again).
    #[serde(skip)]
    pub seen: BTreeSet<String>,
    /// Changed since last saved.
    #[serde(skip)]
    pub dirty: bool,
}

/// `<root-dir>/pod-sync/allocated-pods.json`.
pub type Store = crate::saved::JsonFile<Allocations>;

pub fn store(root_dir: &std::path::Path) -> Store {
    Store::new(root_dir, "allocated-pods.json")
}

fn all_containers(pod: &Pod) -> impl Iterator<Item = &Container> {
    let spec = pod.spec.as_ref();
    spec.and_then(|s| s.init_containers.as_ref())
        .into_iter()
        .flatten()
        .chain(spec.map(|s| s.containers.iter()).into_iter().flatten())
}

/// Each container's resources in `pod`'s spec.
pub fn resources_of(pod: &Pod) -> Resources {
    all_containers(pod)
        .map(|c| (c.name.clone(), c.resources.clone().unwrap_or_default()))
        .collect()
}

/// `pod` with each container's resources as `resources` has them (upstream's
/// `updatePodFromAllocation`).
pub fn with_resources(mut pod: Pod, resources: &Resources) -> Pod {
    if let Some(spec) = pod.spec.as_mut() {
        let init = spec.init_containers.iter_mut().flatten();
        for c in init.chain(spec.containers.iter_mut()) {
            if let Some(r) = resources.get(&c.name) {
                c.resources = (r != &ResourceRequirements::default()).then(|| r.clone());
            }
        }
    }
    pod
}

/// One amount as a number: cpu in millicores, anything else in bytes (or units).
pub(crate) fn amount(name: &str, q: &str) -> Option<i64> {
    if name == "cpu" {
        quantity::cpu_millis(q)
    } else {
        quantity::bytes(q)
    }
}

/// Two resource lists asking for the same amounts, however each is written ("1" and
/// "1000m" are the same cpu, as the API server's canonical form would make them).
fn same_list(
    a: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
    b: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
) -> bool {
    let empty = BTreeMap::new();
    let (a, b) = (a.unwrap_or(&empty), b.unwrap_or(&empty));
    let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    keys.into_iter().all(|k| match (a.get(k), b.get(k)) {
        (Some(x), Some(y)) => x == y || amount(k, &x.0).is_some_and(|v| Some(v) == amount(k, &y.0)),
        _ => false,
    })
}

/// Two containers' resources asking for the same.
pub fn same(a: &ResourceRequirements, b: &ResourceRequirements) -> bool {
    same_list(a.requests.as_ref(), b.requests.as_ref())
        && same_list(a.limits.as_ref(), b.limits.as_ref())
}

fn same_all(a: &Resources, b: &Resources) -> bool {
    a.len() == b.len()
        && a.iter()
            .all(|(name, r)| b.get(name).is_some_and(|other| same(r, other)))
}

impl Allocations {
    /// The pod as it is to run: the spec's resources on its first sight (they are its
    /// allocation from then on), the allocation's after that, with what the spec asks
    /// kept in `wanted` when it differs.
    pub fn intake(&mut self, pod: Pod) -> Pod {
        let uid = k8s::pod_uid(&pod).to_string();
        let spec = resources_of(&pod);
        let asked_before = self.wanted.get(&uid).or_else(|| self.pods.get(&uid));
        if let (Some(before), false) = (asked_before, self.seen.insert(uid.clone())) {
            for (operation, requirement, resource) in requested_resizes(before, &spec) {
                nodeagent_telemetry::metrics::kubelet::record_requested_resize(
                    operation,
                    requirement,
                    &resource,
                );
            }
        }
        match self.pods.get(&uid) {
            None => {
                self.pods.insert(uid.clone(), spec);
                self.dirty = true;
                self.wanted.remove(&uid);
                pod
            }
            Some(allocated) if same_all(allocated, &spec) => {
                self.wanted.remove(&uid);
                pod
            }
            Some(allocated) => {
                let pod = with_resources(pod, allocated);
                self.wanted.insert(uid, spec);
                pod
            }
        }
    }

    /// Admits `uid`'s wanted resources: the containers `running` (id, name) made with the
    /// old allocation keep a record of it, then the allocation becomes the wanted one.
    /// The new allocation, or None when nothing was wanted.
    pub fn accept(&mut self, uid: &str, running: &[(String, String)]) -> Option<Resources> {
        let wanted = self.wanted.remove(uid)?;
        let old = self.pods.get(uid).cloned().unwrap_or_default();
        for (id, name) in running {
            if !self.actuated.contains_key(id)
                && let Some(r) = old.get(name)
            {
                self.actuated.insert(id.clone(), r.clone());
            }
        }
        self.pods.insert(uid.to_string(), wanted.clone());
        self.dirty = true;
        Some(wanted)
    }

    /// What container `id` (named `name`, of pod `uid`) runs with.
    pub fn actuated(&self, uid: &str, id: &str, name: &str) -> Option<&ResourceRequirements> {
        self.actuated
            .get(id)
            .or_else(|| self.pods.get(uid).and_then(|p| p.get(name)))
    }

    /// Container `id` now runs with `resources`.
    pub fn actuated_now(
        &mut self,
        uid: &str,
        id: &str,
        name: &str,
        resources: &ResourceRequirements,
    ) {
        let allocated = self.pods.get(uid).and_then(|p| p.get(name));
        if allocated.is_some_and(|a| same(a, resources)) {
            self.dirty |= self.actuated.remove(id).is_some();
        } else if self.actuated.get(id) != Some(resources) {
            self.actuated.insert(id.to_string(), resources.clone());
            self.dirty = true;
        }
    }

    /// Forgets pods not in `uids` and containers not in `ids`.
    pub fn retain(&mut self, uids: &BTreeSet<String>, ids: &BTreeSet<String>) {
        let before = (self.pods.len(), self.actuated.len());
        self.pods.retain(|u, _| uids.contains(u));
        self.wanted.retain(|u, _| uids.contains(u));
        self.seen.retain(|u| uids.contains(u));
        self.actuated.retain(|id, _| ids.contains(id));
        self.dirty |= before != (self.pods.len(), self.actuated.len());
    }
}

/// Why a resize waits (upstream's `PodResizePending` reasons).
pub const DEFERRED: &str = "Deferred";
pub const INFEASIBLE: &str = "Infeasible";

/// A resize that is not admitted: the condition's reason and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub reason: &'static str,
    pub message: String,
    /// Why an infeasible one is (`kubelet_pod_infeasible_resizes_total`'s `reason_detail`,
    /// upstream's words); empty for a deferred one.
    pub detail: &'static str,
}

/// What the resize admission knows beyond the pods.
pub struct Node<'a> {
    pub allocatable: &'a NodeResources,
    /// The other pods' allocated requests.
    pub others: &'a [Requests],
    /// The CPU manager's `static` policy is on.
    pub cpu_manager_static: bool,
}

/// Upstream's resize admission (`handlePodResourcesResize`: `canResizePod` and the admit
/// handlers), in its order and words: a static pod, a Guaranteed pod's CPUs under the
/// static CPU manager, or requests beyond allocatable can never be resized here
/// (Infeasible); requests that do not fit beside the other pods' allocations wait
/// (Deferred, the scheduler predicate's words).
pub fn admit(current: &Pod, wanted: &Pod, node: &Node<'_>) -> Result<(), Pending> {
    let infeasible = |detail: &'static str, message: String| {
        Err(Pending {
            reason: INFEASIBLE,
            message,
            detail,
        })
    };
    if crate::status::api_status::is_static(current) {
        return infeasible(
            "static_pod",
            "In-place resize of static-pods is not supported".into(),
        );
    }
    use crate::container_manager::cgroups::{QosClass, qos_class};
    if node.cpu_manager_static && qos_class(wanted) == QosClass::Guaranteed {
        let cpu = |p: &Pod| -> Vec<Option<i64>> {
            all_containers(p)
                .map(|c| quantity::ContainerResources::of(c).cpu_request)
                .collect()
        };
        if cpu(current) != cpu(wanted) {
            return infeasible(
                "guaranteed_pod_cpu_manager_static_policy",
                "Resize is infeasible for Guaranteed Pods alongside CPU Manager policy \"static\""
                    .into(),
            );
        }
    }
    let requests = admission::requests(wanted);
    let capacity = [
        ("memory", requests.memory, node.allocatable.memory),
        ("cpu", requests.cpu_millis, node.allocatable.cpu_millis),
    ];
    for (name, requested, capacity) in capacity {
        if requested > capacity {
            return infeasible(
                "insufficient_node_allocatable",
                format!(
                    "Node didn't have enough capacity: {name}, requested: {requested}, capacity: {capacity}"
                ),
            );
        }
    }
    admission::fit(requests, node.others, node.allocatable).map_err(|refusal| Pending {
        reason: DEFERRED,
        message: refusal.message,
        detail: "",
    })
}

/// The details upstream's resize events carry (allocation_manager.go's
/// `podResourceSummary` as JSON): the name and resources of each init container, then of
/// each container, as the pod is allocated, and the pod's generation; `ResizeStarted`
/// says "Pod resize started: " before it, `ResizeCompleted` "Pod resize completed: ".
pub fn resize_details(pod: &Pod) -> String {
    details(pod, None)
}

/// upstream's `ResizeDeferred` or `ResizeInfeasible` event (events/resize.go
/// `PodResizePendingMsg`): "Pod resize <reason>: " and the details of the pod as its spec
/// asks, with the condition's message as their `error`.
pub fn resize_pending_event(wanted: &Pod, pending: &Pending) -> (&'static str, String) {
    let reason = if pending.reason == INFEASIBLE {
        "ResizeInfeasible"
    } else {
        "ResizeDeferred"
    };
    let message = format!(
        "Pod resize {}: {}",
        pending.reason,
        details(wanted, Some(&pending.message))
    );
    (reason, message)
}

/// upstream's `ResizeError` event message (events/resize.go `PodResizeErrorMsg`), as a
/// 1.35 kubelet posts it: "Pod resize error: " and the allocated pod's details with the
/// error.
pub fn resize_error_message(allocated: &Pod, error: &str) -> String {
    format!("Pod resize error: {}", details(allocated, Some(error)))
}

/// `podResourceSummary` with its `error` (omitted when empty).
fn details(pod: &Pod, error: Option<&str>) -> String {
    let list = |cs: &[Container]| -> String {
        let items: Vec<serde_json::Value> = cs
            .iter()
            .map(|c| {
                serde_json::json!({
                    "name": c.name,
                    "resources": c.resources.clone().unwrap_or_default(),
                })
            })
            .collect();
        serde_json::to_string(&items).unwrap_or_default()
    };
    let spec = pod.spec.clone().unwrap_or_default();
    let mut out = String::from("{");
    let init = spec.init_containers.unwrap_or_default();
    if !init.is_empty() {
        out += &format!("\"initContainers\":{},", list(&init));
    }
    if !spec.containers.is_empty() {
        out += &format!("\"containers\":{},", list(&spec.containers));
    }
    out += &format!("\"generation\":{}", pod.metadata.generation.unwrap_or(0));
    if let Some(error) = error.filter(|e| !e.is_empty()) {
        out += &format!(",\"error\":{}", serde_json::Value::from(error));
    }
    out + "}"
}

/// What a pod update asks of each container's resources (upstream's
/// `kubelet_container_requested_resizes_total` labels): for every container in both, each
/// requirement (`requests`, `limits`) and resource whose amount changed, `add` (from
/// none), `remove` (to none), `increase` or `decrease`.
pub fn requested_resizes(
    old: &Resources,
    new: &Resources,
) -> Vec<(&'static str, &'static str, String)> {
    let mut out = Vec::new();
    for (name, after) in new {
        let Some(before) = old.get(name) else {
            continue;
        };
        for (requirement, a, b) in [
            ("requests", &before.requests, &after.requests),
            ("limits", &before.limits, &after.limits),
        ] {
            let empty = BTreeMap::new();
            let (a, b) = (a.as_ref().unwrap_or(&empty), b.as_ref().unwrap_or(&empty));
            let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for resource in keys {
                let value = |l: &BTreeMap<
                    String,
                    k8s_openapi::apimachinery::pkg::api::resource::Quantity,
                >| {
                    l.get(resource)
                        .and_then(|q| amount(resource, &q.0))
                        .unwrap_or(0)
                };
                let (x, y) = (value(a), value(b));
                let operation = match (x, y) {
                    (x, 0) if x != 0 => "remove",
                    (0, y) if y != 0 => "add",
                    (x, y) if y < x => "decrease",
                    (x, y) if y > x => "increase",
                    _ => continue,
                };
                out.push((operation, requirement, resource.clone()));
            }
        }
    }
    out
}

/// What orders pending resizes (upstream's `sortPendingResizes`), for one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingOrder {
    pub uid: String,
    /// The resize asks for more cpu or memory than the allocation
    /// (`isResizeIncreasingRequests`).
    pub increasing: bool,
    pub priority: i32,
    pub guaranteed: bool,
    /// When its `PodResizePending` condition was set (RFC 3339), if it has one.
    pub pending_since: Option<String>,
}

impl PendingOrder {
    pub fn of(uid: &str, allocated: &Pod, wanted: &Pod, pending_since: Option<String>) -> Self {
        use crate::container_manager::cgroups::{QosClass, qos_class};
        let (old, new) = (admission::requests(allocated), admission::requests(wanted));
        Self {
            uid: uid.to_string(),
            increasing: new.memory > old.memory || new.cpu_millis > old.cpu_millis,
            priority: allocated
                .spec
                .as_ref()
                .and_then(|s| s.priority)
                .unwrap_or(0),
            guaranteed: qos_class(allocated) == QosClass::Guaranteed,
            pending_since,
        }
    }
}

/// Upstream's `sortPendingResizes`: resizes that ask for no more first (they always fit),
/// then higher priority, then Guaranteed before the rest, then the longest pending (one
/// without a pending condition yet last); the uid decides the rest, so that the order
/// does not depend on the order they came in.
pub fn sort_pending(pending: &mut [PendingOrder]) {
    pending.sort_by(|a, b| {
        a.increasing
            .cmp(&b.increasing)
            .then(b.priority.cmp(&a.priority))
            .then(b.guaranteed.cmp(&a.guaranteed))
            .then(a.pending_since.is_none().cmp(&b.pending_since.is_none()))
            .then(a.pending_since.cmp(&b.pending_since))
            .then(a.uid.cmp(&b.uid))
    });
}

/// The two resize conditions a pod may carry (upstream's `PodResizePending` and
/// `PodResizeInProgress`), each with the pod generation it was set at.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResizeConditions {
    pub pending: Option<Condition>,
    pub in_progress: Option<Condition>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Condition {
    pub reason: String,
    pub message: String,
    pub generation: Option<i64>,
}

pub const POD_RESIZE_PENDING: &str = "PodResizePending";
pub const POD_RESIZE_IN_PROGRESS: &str = "PodResizeInProgress";

/// What one admission pass decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The spec asks for the allocation.
    NoResize,
    /// The wanted resources are the allocation now.
    Admitted,
    Pending(Pending),
}

impl ResizeConditions {
    /// Upstream's condition changes for an admission decision: nothing to resize clears
    /// the pending condition; an admitted resize clears it and starts (or restarts) the
    /// in-progress one; a pending one is set, leaving an earlier resize's progress as it is.
    /// True when the pending condition is new or changed (upstream then posts a
    /// `ResizeDeferred` or `ResizeInfeasible` event).
    pub fn after(&mut self, decision: &Decision, generation: Option<i64>) -> bool {
        let before = self.pending.clone();
        match decision {
            Decision::NoResize => self.pending = None,
            Decision::Admitted => {
                self.pending = None;
                self.in_progress = Some(Condition {
                    generation,
                    ..Default::default()
                });
            }
            Decision::Pending(p) => {
                self.pending = Some(Condition {
                    reason: p.reason.to_string(),
                    message: p.message.clone(),
                    generation,
                })
            }
        }
        self.pending.is_some() && self.pending != before
    }

    /// The resize had been deferred, and this decision admits it (upstream counts it in
    /// `kubelet_pod_deferred_accepted_resizes_total`).
    pub fn deferred_then_admitted(&self, decision: &Decision) -> bool {
        *decision == Decision::Admitted
            && self.pending.as_ref().is_some_and(|p| p.reason == DEFERRED)
    }

    /// An actuation failed: the in-progress condition says so (keeping the generation of
    /// the resize it belongs to, as upstream).
    pub fn failed(&mut self, message: String, generation: Option<i64>) {
        let generation = self
            .in_progress
            .as_ref()
            .map_or(generation, |c| c.generation);
        self.in_progress = Some(Condition {
            reason: "Error".into(),
            message,
            generation,
        });
    }

    /// The pod's conditions of these two kinds, in upstream's shape (status True;
    /// `now` as the transition time of a new one, an unchanged one keeps its own).
    pub fn to_api(
        &self,
        previous: &[k8s_openapi::api::core::v1::PodCondition],
        now: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
    ) -> Vec<k8s_openapi::api::core::v1::PodCondition> {
        [
            (POD_RESIZE_PENDING, &self.pending),
            (POD_RESIZE_IN_PROGRESS, &self.in_progress),
        ]
        .into_iter()
        .filter_map(|(kind, c)| {
            let c = c.as_ref()?;
            let reason = (!c.reason.is_empty()).then(|| c.reason.clone());
            let message = (!c.message.is_empty()).then(|| c.message.clone());
            let before = previous
                .iter()
                .find(|p| p.type_ == kind && p.reason == reason && p.message == message);
            Some(k8s_openapi::api::core::v1::PodCondition {
                type_: kind.to_string(),
                status: "True".into(),
                reason,
                message,
                observed_generation: c.generation,
                last_probe_time: before.and_then(|b| b.last_probe_time.clone()),
                last_transition_time: Some(
                    before
                        .and_then(|b| b.last_transition_time.clone())
                        .unwrap_or_else(|| now.clone()),
                ),
            })
        })
        .collect()
    }
}

#[cfg(test)]
mod tests;
