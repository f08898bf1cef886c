//! Resource admission, as upstream's kubelet admits a pod before it runs anything of it
//! (pkg/kubelet/lifecycle/predicate.go: `generalFilter`, the pods, cpu and memory checks of
//! the scheduler's `noderesources.Fit`): the node's pod count (`maxPods`) and the
//! requests of the pods it already runs, against allocatable. A pod that does not fit is
//! Failed with upstream's reason (`OutOf<resource>`) and message, and nothing of it runs.
//! Only the first resource that does not fit is named, in upstream's order (pods, cpu,
//! memory), as predicate.go takes `reasons[0]`.

use crate::aggregate::{aggregate, overhead};
use crate::quantity::{self, ContainerResources as R};
use crate::security::Refusal;
use k8s_openapi::api::core::v1::Pod;

/// What the node admits pods against: `maxPods`, and allocatable cpu (millicores) and
/// memory (bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeResources {
    pub pods: i64,
    pub cpu_millis: i64,
    pub memory: i64,
}

impl NodeResources {
    /// This machine's, as node-status reports allocatable (capacity less kubeReserved,
    /// systemReserved and the hard eviction threshold).
    pub fn of_this_node(kubelet: &nodeagent_config::KubeletConfiguration) -> Self {
        let capacity = std::collections::BTreeMap::from([
            (
                "cpu".to_string(),
                nodeagent_config::machine::cpus() as u64 * 1000,
            ),
            (
                "memory".to_string(),
                nodeagent_config::machine::memory_bytes(),
            ),
        ]);
        let thresholds =
            nodeagent_config::eviction::Thresholds::from_config(kubelet).unwrap_or_default();
        let allocatable = nodeagent_config::eviction::allocatable(&capacity, kubelet, &thresholds);
        let get = |k: &str| allocatable.get(k).copied().unwrap_or(0) as i64;
        NodeResources {
            pods: i64::from(kubelet.max_pods),
            cpu_millis: get("cpu"),
            memory: get("memory"),
        }
    }
}

/// A pod's requests as upstream's `PodRequests` counts them (init containers and sidecars
/// as they run, `overhead` added; a request left unset is its limit, as the API's
/// defaulting makes it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Requests {
    pub cpu_millis: i64,
    pub memory: i64,
}

pub fn requests(pod: &Pod) -> Requests {
    Requests {
        cpu_millis: aggregate(pod, |c| R::of(c).cpu_request).total
            + overhead(pod, "cpu", quantity::cpu_millis),
        memory: aggregate(pod, |c| R::of(c).memory_request).total
            + overhead(pod, "memory", quantity::bytes),
    }
}

/// Whether a pod with `pod` requests fits beside the `running` ones; the refusal in
/// upstream's words when not (`InsufficientResourceError`).
pub fn fit(pod: Requests, running: &[Requests], node: &NodeResources) -> Result<(), Refusal> {
    let insufficient = |reason: &'static str, name: &str, requested: i64, used: i64, cap: i64| {
        Err(Refusal {
            reason,
            message: format!(
                "Node didn't have enough resource: {name}, requested: {requested}, used: {used}, capacity: {cap}"
            ),
        })
    };
    let pods = running.len() as i64;
    if pods + 1 > node.pods {
        return insufficient("OutOfpods", "pods", 1, pods, node.pods);
    }
    let cpu: i64 = running.iter().map(|r| r.cpu_millis).sum();
    if pod.cpu_millis > 0 && pod.cpu_millis > node.cpu_millis - cpu {
        return insufficient("OutOfcpu", "cpu", pod.cpu_millis, cpu, node.cpu_millis);
    }
    let memory: i64 = running.iter().map(|r| r.memory).sum();
    if pod.memory > 0 && pod.memory > node.memory - memory {
        return insufficient("OutOfmemory", "memory", pod.memory, memory, node.memory);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODE: NodeResources = NodeResources {
        pods: 3,
        cpu_millis: 2000,
        memory: 4 << 30,
    };

    fn req(cpu_millis: i64, memory: i64) -> Requests {
        Requests { cpu_millis, memory }
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
        let cases: [Row; 7] = [
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
                    {"name": "app", "resources": {"requests": {"cpu": "500m", "memory": "128Mi"}}},
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
                memory: (1 << 30) + (1 << 20)
            }
        );
    }
}
