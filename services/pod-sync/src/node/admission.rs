//! Resource admission, as upstream's kubelet admits a pod before it runs anything of it
//! (pkg/kubelet/lifecycle/predicate.go: `generalFilter`, the pods, cpu, memory and
//! ephemeral-storage checks of the scheduler's `noderesources.Fit`): the node's pod count
//! (`maxPods`) and the requests of the pods it already runs, against allocatable. A pod
//! that does not fit is Failed with upstream's reason (`OutOf<resource>`) and message, and
//! nothing of it runs. Only the first resource that does not fit is named, in upstream's
//! order (pods, cpu, memory, ephemeral-storage), as predicate.go takes `reasons[0]`.
//! Extended resources are not checked: this node advertises none (no device plugins), and
//! predicate.go drops a request for one the node does not have
//! (`removeMissingExtendedResources`) before it checks.

use crate::container_manager::quantity::{self, ContainerResources as R};
use crate::runtime_spec::security::Refusal;
use k8s_openapi::api::core::v1::Pod;
use nodeagent_config::aggregate::{aggregate, overhead};

/// What the node admits pods against: `maxPods`, and allocatable cpu (millicores),
/// memory and ephemeral-storage (bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeResources {
    pub pods: i64,
    pub cpu_millis: i64,
    pub memory: i64,
    pub ephemeral_storage: i64,
}

impl NodeResources {
    /// This machine's, as node-status reports allocatable (capacity less kubeReserved,
    /// systemReserved and the hard eviction threshold; ephemeral-storage is the
    /// filesystem of `root_dir`, or of `/` before it exists).
    pub fn of_this_node(
        kubelet: &nodeagent_config::KubeletConfiguration,
        root_dir: &std::path::Path,
    ) -> Self {
        let allocatable = nodeagent_config::eviction::allocatable(
            &capacity(root_dir),
            kubelet,
            &hard_thresholds(kubelet),
        );
        let get = |k: &str| allocatable.get(k).copied().unwrap_or(0) as i64;
        NodeResources {
            pods: i64::from(kubelet.max_pods),
            cpu_millis: get("cpu"),
            memory: get("memory"),
            ephemeral_storage: get("ephemeral-storage"),
        }
    }
}

/// The configured eviction thresholds (none where they do not parse: the eviction manager
/// says why).
fn hard_thresholds(
    kubelet: &nodeagent_config::KubeletConfiguration,
) -> nodeagent_config::eviction::Thresholds {
    nodeagent_config::eviction::Thresholds::from_config(kubelet).unwrap_or_default()
}

/// upstream's `validateNodeAllocatable` for this machine: an error, in upstream's words,
/// where kubeReserved, systemReserved and the hard eviction threshold reserve more than
/// the node has.
pub fn validate_reservation(
    kubelet: &nodeagent_config::KubeletConfiguration,
    root_dir: &std::path::Path,
) -> Result<(), String> {
    nodeagent_config::eviction::validate_reservation(
        &capacity(root_dir),
        kubelet,
        &hard_thresholds(kubelet),
    )
}

/// This machine's capacity as upstream's container manager takes it: cpu, memory and pid
/// ([`capacity_but_storage`]) and ephemeral-storage (the filesystem of `root_dir`, or of
/// `/` before it exists).
pub fn capacity(root_dir: &std::path::Path) -> std::collections::BTreeMap<String, u64> {
    let fs = if root_dir.exists() {
        root_dir
    } else {
        std::path::Path::new("/")
    };
    let mut capacity = capacity_but_storage();
    capacity.insert(
        "ephemeral-storage".to_string(),
        nodeagent_config::machine::statvfs(fs).map_or(0, |s| s.capacity),
    );
    capacity
}

/// This machine's cpu (millicores), memory (bytes) and pid (the kernel's most tasks,
/// pkg/kubelet/stats/pidlimit) capacity.
pub fn capacity_but_storage() -> std::collections::BTreeMap<String, u64> {
    let mut capacity = cpu_and_memory_capacity();
    if let (Some(max), _) = nodeagent_config::machine::rlimit() {
        capacity.insert("pid".into(), max.max(0) as u64);
    }
    capacity
}

/// This machine's cpu (millicores) and memory (bytes), as capacity lists them.
pub fn cpu_and_memory_capacity() -> std::collections::BTreeMap<String, u64> {
    std::collections::BTreeMap::from([
        (
            "cpu".to_string(),
            nodeagent_config::machine::cpus() as u64 * 1000,
        ),
        (
            "memory".to_string(),
            nodeagent_config::machine::memory_bytes(),
        ),
    ])
}

/// A pod's requests as upstream's `PodRequests` counts them (init containers and sidecars
/// as they run, a pod-level request in place of the containers' sum, `overhead` added; a
/// request left unset is its limit, as the API's defaulting makes it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Requests {
    pub cpu_millis: i64,
    pub memory: i64,
    pub ephemeral_storage: i64,
}

pub fn requests(pod: &Pod) -> Requests {
    use nodeagent_config::pod_level::{Resource, pod_request};
    Requests {
        cpu_millis: pod_request(pod, Resource::Cpu) + overhead(pod, "cpu", quantity::cpu_millis),
        memory: pod_request(pod, Resource::Memory) + overhead(pod, "memory", quantity::bytes),
        ephemeral_storage: aggregate(pod, |c| R::of(c).ephemeral_storage_request).total
            + overhead(pod, "ephemeral-storage", quantity::bytes),
    }
}

/// One resource a pod was short of (upstream's `InsufficientResourceError`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Insufficient {
    /// predicate.go's reason: `OutOf<resource>`.
    pub reason: &'static str,
    pub resource: Resource,
    pub requested: i64,
    pub used: i64,
    pub capacity: i64,
}

impl Insufficient {
    /// How much more the node would need (`GetInsufficientAmount`).
    pub fn amount(&self) -> i64 {
        self.requested - (self.capacity - self.used)
    }

    pub fn refusal(&self) -> Refusal {
        Refusal {
            reason: self.reason,
            message: format!(
                "Node didn't have enough resource: {}, requested: {}, used: {}, capacity: {}",
                self.resource.name(),
                self.requested,
                self.used,
                self.capacity
            ),
        }
    }
}

/// A resource admission counts: the pod count and what pods request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    Pods,
    Cpu,
    Memory,
    EphemeralStorage,
}

impl Resource {
    pub fn name(self) -> &'static str {
        match self {
            Resource::Pods => "pods",
            Resource::Cpu => "cpu",
            Resource::Memory => "memory",
            Resource::EphemeralStorage => "ephemeral-storage",
        }
    }

    /// What a pod with `r` requests takes of this resource (a pod is one of `pods`).
    pub fn of(self, r: &Requests) -> i64 {
        match self {
            Resource::Pods => 1,
            Resource::Cpu => r.cpu_millis,
            Resource::Memory => r.memory,
            Resource::EphemeralStorage => r.ephemeral_storage,
        }
    }
}

/// Every resource a pod with `pod` requests is short of beside the `running` ones, in
/// upstream's order (noderesources `fitsRequest`: pods, cpu, memory, ephemeral-storage).
pub fn shortfalls(pod: Requests, running: &[Requests], node: &NodeResources) -> Vec<Insufficient> {
    let mut out = Vec::new();
    let pods = running.len() as i64;
    if pods + 1 > node.pods {
        out.push(Insufficient {
            reason: "OutOfpods",
            resource: Resource::Pods,
            requested: 1,
            used: pods,
            capacity: node.pods,
        });
    }
    let checks = [
        ("OutOfcpu", Resource::Cpu, node.cpu_millis),
        ("OutOfmemory", Resource::Memory, node.memory),
        (
            "OutOfephemeral-storage",
            Resource::EphemeralStorage,
            node.ephemeral_storage,
        ),
    ];
    for (reason, resource, capacity) in checks {
        let used: i64 = running.iter().map(|r| resource.of(r)).sum();
        let requested = resource.of(&pod);
        if requested > 0 && requested > capacity - used {
            out.push(Insufficient {
                reason,
                resource,
                requested,
                used,
                capacity,
            });
        }
    }
    out
}

/// Whether a pod with `pod` requests fits beside the `running` ones; the refusal in
/// upstream's words when not (`InsufficientResourceError`), naming the first resource short
/// as predicate.go takes `reasons[0]`.
pub fn fit(pod: Requests, running: &[Requests], node: &NodeResources) -> Result<(), Refusal> {
    match shortfalls(pod, running, node).first() {
        Some(short) => Err(short.refusal()),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODE: NodeResources = NodeResources {
        pods: 3,
        cpu_millis: 2000,
        memory: 4 << 30,
        ephemeral_storage: 10 << 30,
    };

    fn req(cpu_millis: i64, memory: i64) -> Requests {
        Requests {
            cpu_millis,
            memory,
            ephemeral_storage: 0,
        }
    }

    fn storage(ephemeral_storage: i64) -> Requests {
        Requests {
            ephemeral_storage,
            ..Requests::default()
        }
    }

    /// Rows in the manner of upstream's noderesources `TestEnoughRequests` and
    /// lifecycle's `TestGeneralPredicates`: the first resource short is named, with
    /// predicate.go's reason `OutOf<resource>` and InsufficientResourceError's message.
    #[test]
    fn the_first_resource_short_is_refused_in_upstreams_words() {
        /// (case, the pod's requests, the running pods', the refusal: reason and message).
        type Row = (
            &'static str,
            Requests,
            Vec<Requests>,
            Option<(&'static str, &'static str)>,
        );
        let cases: [Row; 10] = [
            ("no requests, room", req(0, 0), vec![req(0, 0)], None),
            (
                "exactly what is left",
                req(1000, 1 << 30),
                vec![req(1000, 3 << 30)],
                None,
            ),
            (
                "too many pods",
                req(0, 0),
                vec![req(0, 0); 3],
                Some((
                    "OutOfpods",
                    "Node didn't have enough resource: pods, requested: 1, used: 3, capacity: 3",
                )),
            ),
            (
                "too much cpu",
                req(1500, 0),
                vec![req(1000, 0)],
                Some((
                    "OutOfcpu",
                    "Node didn't have enough resource: cpu, requested: 1500, used: 1000, capacity: 2000",
                )),
            ),
            (
                "too much memory",
                req(0, 2 << 30),
                vec![req(0, 3 << 30)],
                Some((
                    "OutOfmemory",
                    "Node didn't have enough resource: memory, requested: 2147483648, used: 3221225472, capacity: 4294967296",
                )),
            ),
            (
                "cpu is named before memory",
                req(3000, 8 << 30),
                vec![],
                Some((
                    "OutOfcpu",
                    "Node didn't have enough resource: cpu, requested: 3000, used: 0, capacity: 2000",
                )),
            ),
            (
                "a pod with no requests fits on a full cpu",
                req(0, 0),
                vec![req(2000, 0)],
                None,
            ),
            // TestEnoughRequests' "storage ephemeral local storage request exceeds
            // allocatable" and its fitting neighbour.
            (
                "too much ephemeral-storage",
                storage(6 << 30),
                vec![storage(5 << 30)],
                Some((
                    "OutOfephemeral-storage",
                    "Node didn't have enough resource: ephemeral-storage, requested: 6442450944, used: 5368709120, capacity: 10737418240",
                )),
            ),
            (
                "ephemeral-storage exactly what is left",
                storage(5 << 30),
                vec![storage(5 << 30)],
                None,
            ),
            (
                "memory is named before ephemeral-storage",
                Requests {
                    cpu_millis: 0,
                    memory: 8 << 30,
                    ephemeral_storage: 20 << 30,
                },
                vec![],
                Some((
                    "OutOfmemory",
                    "Node didn't have enough resource: memory, requested: 8589934592, used: 0, capacity: 4294967296",
                )),
            ),
        ];
        for (name, pod, running, want) in cases {
            let got = fit(pod, &running, &NODE)
                .err()
                .map(|r| (r.reason, r.message));
            assert_eq!(got, want.map(|(r, m)| (r, m.to_string())), "{name}");
        }
    }

    #[test]
    fn requests_count_init_containers_sidecars_and_overhead() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "spec": {
                "overhead": {"cpu": "50m", "memory": "1Mi"},
                "initContainers": [
                    {"name": "big-init", "resources": {"requests": {"cpu": "2", "memory": "1Gi"}}},
                    {"name": "sidecar", "restartPolicy": "Always",
                     "resources": {"requests": {"cpu": "100m"}, "limits": {"memory": "64Mi"}}},
                ],
                "containers": [
                    {"name": "app", "resources": {"requests": {"cpu": "500m", "memory": "128Mi"},
                                                  "limits": {"ephemeral-storage": "1Gi"}}},
                ],
            }
        }))
        .unwrap();
        // Peak: the first init container alone (2 CPUs, 1 GiB) beats the sidecar and the
        // app together (600m, 192 Mi); the overhead comes on top.
        assert_eq!(
            requests(&pod),
            Requests {
                cpu_millis: 2050,
                memory: (1 << 30) + (1 << 20),
                // The app's limit, its request by defaulting.
                ephemeral_storage: 1 << 30,
            }
        );
    }
}
