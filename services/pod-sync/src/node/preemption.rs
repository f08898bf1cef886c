//! Critical pod preemption (upstream's pkg/kubelet/preemption `CriticalPodAdmissionHandler`):
//! a critical pod (static, mirror, or of system-critical priority) that does not fit only
//! for lack of resources is admitted by preempting other pods: the fewest, cheapest
//! ones, BestEffort before Burstable before Guaranteed, chosen by upstream's distance rule.
//! Each is Failed with reason `Preempting`, a `Preempting` Warning event and a
//! DisruptionTarget condition, and its containers are stopped with their own grace period
//! before the critical pod runs. Where no set of pods would make room, the critical pod is
//! refused `UnexpectedAdmissionError` with upstream's message.

use crate::container_manager::cgroups::{QosClass, qos_class};
use crate::container_manager::oom::is_critical;
use crate::node::admission::{Insufficient, Requests, Resource, requests};
use crate::runtime_spec::security::Refusal;
use k8s_openapi::api::core::v1::Pod;

/// One resource still to be freed, and how much (`admissionRequirement`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Requirement {
    pub resource: Resource,
    pub quantity: i64,
}

impl From<&Insufficient> for Requirement {
    fn from(short: &Insufficient) -> Self {
        Requirement {
            resource: short.resource,
            quantity: short.amount(),
        }
    }
}

/// A pod that could be preempted, with what it requests.
#[derive(Debug, Clone, Copy)]
pub struct Candidate<'a> {
    pub pod: &'a Pod,
    requests: Requests,
}

impl<'a> Candidate<'a> {
    pub fn new(pod: &'a Pod) -> Self {
        Self {
            pod,
            requests: requests(pod),
        }
    }

    fn request(&self, r: Resource) -> i64 {
        r.of(&self.requests)
    }
}

/// Upstream's `admissionRequirementList.toString`, as its error messages print it.
fn to_string(reqs: &[Requirement]) -> String {
    let mut s = String::from("[");
    for r in reqs {
        s += &format!("(res: {}, q: {}), ", r.resource.name(), r.quantity);
    }
    s + "]"
}

/// How far a pod's requests are from meeting `reqs`: each requirement weighs the same, as
/// the square of the fraction the pod leaves unmet (`distance`).
pub fn distance(reqs: &[Requirement], pod: &Candidate) -> f64 {
    reqs.iter()
        .map(|r| {
            let remaining = (r.quantity - pod.request(r.resource)) as f64;
            if remaining > 0.0 {
                (remaining / r.quantity as f64).powi(2)
            } else {
                0.0
            }
        })
        .sum()
}

/// What would remain of `reqs` once `pods` were preempted (`subtract`).
pub fn subtract(reqs: &[Requirement], pods: &[Candidate]) -> Vec<Requirement> {
    reqs.iter()
        .filter_map(|r| {
            let mut quantity = r.quantity;
            for p in pods {
                quantity -= p.request(r.resource);
                if quantity <= 0 {
                    break;
                }
            }
            (quantity > 0).then_some(Requirement {
                resource: r.resource,
                quantity,
            })
        })
        .collect()
}

/// Whether `a` requests less than `b`, memory first, then cpu; true when equal
/// (`smallerResourceRequest`).
pub fn smaller_resource_request(a: &Candidate, b: &Candidate) -> bool {
    for r in [Resource::Memory, Resource::Cpu] {
        let (x, y) = (a.request(r), b.request(r));
        if x != y {
            return x < y;
        }
    }
    true
}

/// Whether `preemptor` may preempt `preemptee`: a critical pod any pod that is not, else
/// only a pod of a lower priority (upstream's `kubetypes.Preemptable`).
pub fn preemptable(preemptor: &Pod, preemptee: &Pod) -> bool {
    if is_critical(preemptor) && !is_critical(preemptee) {
        return true;
    }
    let priority = |p: &Pod| p.spec.as_ref().and_then(|s| s.priority);
    match (priority(preemptor), priority(preemptee)) {
        (Some(a), Some(b)) => a > b,
        _ => false,
    }
}

/// The pods of `pods` to preempt, taken one at a time by the shortest distance to what
/// remains (ties: the smaller request), until nothing remains (`getPodsToPreemptByDistance`;
/// a taken pod's place goes to the last one, as upstream's swap-remove).
fn by_distance<'a>(
    mut pods: Vec<Candidate<'a>>,
    mut reqs: Vec<Requirement>,
) -> Result<Vec<Candidate<'a>>, String> {
    let mut out = Vec::new();
    while !reqs.is_empty() {
        if pods.is_empty() {
            return Err(format!(
                "no set of running pods found to reclaim resources: {}",
                to_string(&reqs)
            ));
        }
        let mut best = (reqs.len() + 1) as f64;
        let mut best_index = 0;
        for (i, p) in pods.iter().enumerate() {
            let d = distance(&reqs, p);
            if d < best || (d == best && smaller_resource_request(p, &pods[best_index])) {
                best = d;
                best_index = i;
            }
        }
        let taken = pods.swap_remove(best_index);
        reqs = subtract(&reqs, &[taken]);
        out.push(taken);
    }
    Ok(out)
}

/// The pods to preempt to free `reqs` for `preemptor` (`getPodsToPreempt`): Guaranteed
/// pods only where the Burstable and BestEffort ones together cannot make room, then as
/// few Burstable ones as the rest needs, then BestEffort ones.
pub fn pods_to_preempt<'a>(
    preemptor: &Pod,
    pods: &[Candidate<'a>],
    reqs: &[Requirement],
) -> Result<Vec<Candidate<'a>>, String> {
    let (mut best_effort, mut burstable, mut guaranteed) = (Vec::new(), Vec::new(), Vec::new());
    for p in pods.iter().filter(|p| preemptable(preemptor, p.pod)) {
        match qos_class(p.pod) {
            QosClass::BestEffort => best_effort.push(*p),
            QosClass::Burstable => burstable.push(*p),
            QosClass::Guaranteed => guaranteed.push(*p),
        }
    }
    let all: Vec<_> = [&best_effort[..], &burstable[..], &guaranteed[..]].concat();
    let unmet = subtract(reqs, &all);
    if !unmet.is_empty() {
        return Err(format!(
            "no set of running pods found to reclaim resources: {}",
            to_string(&unmet)
        ));
    }
    let lower = [&best_effort[..], &burstable[..]].concat();
    let guaranteed_out = by_distance(guaranteed, subtract(reqs, &lower))?;
    let burstable_out = by_distance(
        burstable,
        subtract(reqs, &[&best_effort[..], &guaranteed_out[..]].concat()),
    )?;
    let best_effort_out = by_distance(
        best_effort,
        subtract(reqs, &[&burstable_out[..], &guaranteed_out[..]].concat()),
    )?;
    Ok([best_effort_out, burstable_out, guaranteed_out].concat())
}

/// What admission does with a pod that is `short` of resources among the `active` pods
/// (`HandleAdmissionFailure` for resource reasons only): a pod that is not critical is
/// refused for the first resource short; a critical one gets the pods to preempt, or is
/// refused `UnexpectedAdmissionError` where there is no such set.
pub fn handle_admission_failure<'a>(
    pod: &Pod,
    short: &[Insufficient],
    active: &[Candidate<'a>],
) -> Result<Vec<Candidate<'a>>, Refusal> {
    let Some(first) = short.first() else {
        return Ok(Vec::new());
    };
    if !is_critical(pod) {
        return Err(first.refusal());
    }
    let reqs: Vec<Requirement> = short.iter().map(Requirement::from).collect();
    pods_to_preempt(pod, active, &reqs).map_err(|e| Refusal {
        reason: "UnexpectedAdmissionError",
        message: format!(
            "Unexpected error while attempting to recover from admission failure: preemption: error finding a set of pods to preempt: {e}"
        ),
    })
}

#[cfg(test)]
mod tests;
