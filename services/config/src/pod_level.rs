//! Pod-level `spec.resources` (upstream's PodLevelResources, KEP-2837: beta and on by
//! default since 1.34): cpu and memory requests and limits for the pod as a whole, which
//! its containers share. What the node reads from them, as upstream computes it:
//!
//! - the defaulting the API server applies (`pkg/apis/core/v1/defaults.go`
//!   `defaultPodRequests`), done here on read, as the containers' request-from-limit
//!   defaulting is, so that static pods and pods from any API server are read alike;
//! - the pod's requests and limits (component-helpers `resource/helpers.go` `PodRequests`,
//!   `PodLimits`): a pod-level amount replaces the containers' sum for that resource;
//! - a container's effective limit (kuberuntime_container_linux.go `getCPULimit`,
//!   `getMemoryLimit`): a container without a limit of its own gets the pod's;
//! - the share of a pod-level memory request its containers did not claim, spread over
//!   them for their OOM scores (pkg/kubelet/qos `remainingPodMemReqPerContainer`).
//!
//! Hugepages are a supported pod-level resource upstream; this node offers none, so only
//! cpu and memory are read.

use crate::aggregate::{Aggregate, aggregate};
use crate::quantity::{bytes, cpu_millis};
use k8s_openapi::api::core::v1::{Container, Pod, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use std::collections::BTreeMap;

/// Upstream's `IsSupportedPodLevelResource`: cpu, memory and hugepages of any size.
pub fn is_supported(name: &str) -> bool {
    matches!(name, "cpu" | "memory") || name.starts_with("hugepages-")
}

/// Upstream's `SupportedPodLevelResources`, as its validation lists them.
pub const SUPPORTED: [&str; 3] = ["cpu", "hugepages-", "memory"];

/// The two resources the node reads at pod level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    /// Millicores.
    Cpu,
    /// Bytes.
    Memory,
}

impl Resource {
    pub const ALL: [Resource; 2] = [Resource::Cpu, Resource::Memory];

    pub fn name(self) -> &'static str {
        match self {
            Resource::Cpu => "cpu",
            Resource::Memory => "memory",
        }
    }

    /// A quantity of this resource as a number (None: unparsable).
    pub fn amount(self, q: &Quantity) -> Option<i64> {
        match self {
            Resource::Cpu => cpu_millis(&q.0),
            Resource::Memory => bytes(&q.0),
        }
    }

    /// An amount as a quantity in upstream's canonical form for whole numbers: cpu as
    /// cores or millicores, memory with the largest binary suffix that divides it (a
    /// decimal-suffixed sum upstream would print as `1G` prints here as bytes).
    pub fn format(self, v: i64) -> String {
        match self {
            Resource::Cpu if v % 1000 == 0 => (v / 1000).to_string(),
            Resource::Cpu => format!("{v}m"),
            Resource::Memory => {
                let suffixes = ["Ei", "Pi", "Ti", "Gi", "Mi", "Ki"];
                for (i, suffix) in suffixes.iter().enumerate() {
                    let unit = 1i64 << (10 * (6 - i));
                    if v != 0 && v % unit == 0 {
                        return format!("{}{suffix}", v / unit);
                    }
                }
                v.to_string()
            }
        }
    }

    fn of(self, list: &Option<BTreeMap<String, Quantity>>) -> Option<i64> {
        list.as_ref()?.get(self.name()).and_then(|q| self.amount(q))
    }
}

/// A container's request of `r`, or its limit where it sets no request (the API's
/// defaulting, which the kubelet repeats for static pods).
pub fn container_request(c: &Container, r: Resource) -> Option<i64> {
    let res = c.resources.as_ref()?;
    r.of(&res.requests).or_else(|| r.of(&res.limits))
}

/// A container's own limit of `r`.
pub fn container_limit(c: &Container, r: Resource) -> Option<i64> {
    r.of(&c.resources.as_ref()?.limits)
}

/// A pod's pod-level cpu and memory, its requests defaulted as the API server defaults them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodLevel {
    /// The requests (after `defaultPodRequests`) and limits, of the supported resources.
    requests: BTreeMap<String, Quantity>,
    limits: BTreeMap<String, Quantity>,
}

impl PodLevel {
    /// The pod's `spec.resources`, None where it has none. Where it sets limits, a request it
    /// leaves out is the containers' requests of that resource together (when any container
    /// requests it), else the limit (upstream's `defaultPodRequests`; hugepages are never
    /// taken from the containers, as they cannot be overcommitted).
    pub fn of(pod: &Pod) -> Option<Self> {
        let spec = pod.spec.as_ref()?;
        let ResourceRequirements {
            requests, limits, ..
        } = spec.resources.clone()?;
        let supported = |m: Option<BTreeMap<String, Quantity>>| -> BTreeMap<String, Quantity> {
            m.unwrap_or_default()
                .into_iter()
                .filter(|(k, _)| is_supported(k))
                .collect()
        };
        let (mut requests, limits) = (supported(requests), supported(limits));
        if !limits.is_empty() {
            for r in Resource::ALL {
                let requested = spec
                    .containers
                    .iter()
                    .chain(spec.init_containers.iter().flatten())
                    .any(|c| container_request(c, r).is_some());
                if requested && !requests.contains_key(r.name()) {
                    let total = aggregate(pod, |c| container_request(c, r)).total;
                    requests.insert(r.name().into(), Quantity(r.format(total)));
                }
            }
            for (k, v) in &limits {
                requests.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
        Some(Self { requests, limits })
    }

    /// The supported resources' requests (defaulted) and limits, as quantities.
    pub fn requests(&self) -> &BTreeMap<String, Quantity> {
        &self.requests
    }

    pub fn limits(&self) -> &BTreeMap<String, Quantity> {
        &self.limits
    }

    /// Upstream's `IsPodLevelResourcesSet`: a supported resource requested or limited.
    pub fn is_set(&self) -> bool {
        !self.requests.is_empty() || !self.limits.is_empty()
    }

    /// Upstream's `IsPodLevelRequestsSet` (after defaulting).
    pub fn requests_set(&self) -> bool {
        !self.requests.is_empty()
    }

    /// The pod-level request of `r` (None: not set, or unparsable).
    pub fn request(&self, r: Resource) -> Option<i64> {
        self.requests.get(r.name()).and_then(|q| r.amount(q))
    }

    /// The pod-level limit of `r`.
    pub fn limit(&self, r: Resource) -> Option<i64> {
        self.limits.get(r.name()).and_then(|q| r.amount(q))
    }
}

/// The pod's pod-level resources where it sets any (`IsPodLevelResourcesSet`).
pub fn set(pod: &Pod) -> Option<PodLevel> {
    PodLevel::of(pod).filter(PodLevel::is_set)
}

/// Upstream's `PodRequests` of `r`, overhead left out: the pod-level request where the pod
/// sets pod-level requests and one of `r`, else its containers' together (init containers
/// and sidecars as they run).
pub fn pod_request(pod: &Pod, r: Resource) -> i64 {
    PodLevel::of(pod)
        .filter(PodLevel::requests_set)
        .and_then(|p| p.request(r))
        .unwrap_or_else(|| aggregate(pod, |c| container_request(c, r)).total)
}

/// Upstream's `PodLimits` of `r`, overhead left out, and whether it is a limit of the whole
/// pod (`ResourceConfigForPod`'s "limits declared"): the pod-level limit where set (declared
/// when above zero), else the containers' together (declared when every container sets one).
pub fn pod_limit(pod: &Pod, r: Resource) -> Aggregate {
    let containers = aggregate(pod, |c| container_limit(c, r));
    match set(pod).and_then(|p| p.limit(r)) {
        Some(limit) => Aggregate {
            total: limit,
            every_container: limit > 0 || containers.every_container,
        },
        None => containers,
    }
}

/// A container's limit of `r` as its cgroup gets it (upstream's `getCPULimit`,
/// `getMemoryLimit`): its own, or, where it sets none (or zero) and the pod sets pod-level
/// resources, the pod's limit of `r`.
pub fn effective_container_limit(pod: &Pod, c: &Container, r: Resource) -> Option<i64> {
    let own = container_limit(c, r).filter(|v| *v != 0);
    match set(pod) {
        Some(p) if own.is_none() => p.limit(r).filter(|v| *v != 0),
        _ => own,
    }
}

/// The memory a pod-level request holds beyond its containers' own requests, per container
/// (upstream's `remainingPodMemReqPerContainer`): each container's OOM score counts it as
/// requested. Zero without a pod-level memory request.
pub fn unclaimed_memory_per_container(pod: &Pod) -> i64 {
    let Some(request) = PodLevel::of(pod)
        .filter(PodLevel::requests_set)
        .and_then(|p| p.request(Resource::Memory))
        .filter(|v| *v != 0)
    else {
        return 0;
    };
    let Some(spec) = &pod.spec else {
        return 0;
    };
    let n = (spec.containers.len() + spec.init_containers.as_ref().map_or(0, Vec::len)) as i64;
    let claimed = aggregate(pod, |c| container_request(c, Resource::Memory)).total;
    if n == 0 { 0 } else { (request - claimed) / n }
}

#[cfg(test)]
mod tests;
