//! Memory QoS (upstream's `MemoryQoS` feature gate, alpha and off by default; KEP-2570 as
//! upstream's kubelet runs it up to 1.35), on cgroup v2 only, as upstream checks
//! `IsCgroup2UnifiedMode`: a container's memory request is its cgroup's `memory.min`
//! (protected from reclaim) and a `memory.high` between its request and its limit (or node
//! allocatable, without a limit) throttles it before the limit kills it
//! (kuberuntime_container_linux.go `generateLinuxContainerResources`); the pod cgroup's
//! `memory.min` is the pod's requests (helpers_linux.go `ResourceConfigForPod`), the
//! `burstable` tier's the requests of its pods and `kubepods`' those of the Guaranteed and
//! Burstable pods together (qos_container_manager_linux.go `setMemoryQoS`). Better than
//! upstream 1.35 in two places, as upstream's 1.36 fixes them: a BestEffort container gets
//! a `memory.high` from node allocatable (kubernetes#137685), and a tier whose last pod
//! with a request went is set back to 0 instead of keeping the old value.

use crate::container_manager::quantity::ContainerResources;
use k8s_openapi::api::core::v1::{Container, Pod};
use std::collections::HashMap;
use std::path::Path;

/// What the containers' `memory.high` is computed from, where the gate is on and the
/// node runs cgroup v2.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MemoryQos {
    /// `memoryThrottlingFactor`.
    pub throttling_factor: f64,
    /// Node allocatable memory as upstream's `getNodeAllocatable` gives it to the runtime
    /// manager (capacity less kubeReserved and systemReserved), bytes.
    pub allocatable_memory: i64,
    /// The page size `memory.high` is rounded down to.
    pub page_size: i64,
}

impl MemoryQos {
    /// On with the `MemoryQoS` gate on a cgroup v2 node (`cgroup_fs` the unified tree's
    /// mount); None elsewhere (upstream leaves cgroup v1 nodes alone).
    pub fn of_this_node(
        kubelet: &nodeagent_config::KubeletConfiguration,
        cgroup_fs: &Path,
    ) -> Option<Self> {
        if !kubelet.memory_qos() {
            return None;
        }
        if !cgroup_fs.join("cgroup.controllers").exists() {
            tracing::warn!(
                "the MemoryQoS feature gate needs cgroup v2; this node runs v1, so it does nothing"
            );
            return None;
        }
        let allocatable = nodeagent_config::eviction::allocatable(
            &crate::node::admission::cpu_and_memory_capacity(),
            kubelet,
            &nodeagent_config::eviction::Thresholds::default(),
        );
        let page_size = nodeagent_config::machine::page_size();
        Some(Self {
            throttling_factor: kubelet.memory_throttling_factor,
            allocatable_memory: allocatable.get("memory").copied().unwrap_or(0) as i64,
            page_size,
        })
    }

    /// The container's `unified` cgroup v2 settings: `memory.min` its request (where it
    /// has one), `memory.high` `floor((request + factor × (limit − request)) / page) ×
    /// page`, node allocatable standing for a missing limit, where that is above the
    /// request and the request is not the limit.
    pub fn container_unified(&self, c: &Container) -> HashMap<String, String> {
        let r = ContainerResources::of(c);
        let request = r.memory_request.unwrap_or(0);
        let limit = r.memory_limit.unwrap_or(0);
        let mut unified = HashMap::new();
        if request != 0 {
            unified.insert("memory.min".to_string(), request.to_string());
        }
        if request != limit || request == 0 {
            let ceiling = if limit != 0 {
                limit
            } else {
                self.allocatable_memory
            };
            if ceiling > 0 {
                let high = (request as f64 + (ceiling - request) as f64 * self.throttling_factor)
                    / self.page_size as f64;
                let high = high.floor() as i64 * self.page_size;
                if high != 0 && high > request {
                    unified.insert("memory.high".to_string(), high.to_string());
                }
            }
        }
        unified
    }
}

/// The pod cgroup's `memory.min`: the pod's memory requests as upstream's `PodRequests`
/// counts them; None without any.
pub fn pod_memory_min(pod: &Pod) -> Option<i64> {
    let memory = crate::node::admission::requests(pod).memory;
    (memory > 0).then_some(memory)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::container_manager::cgroups::qos_memory_min;
    use serde_json::json;

    const MI: i64 = 1 << 20;
    const GI: i64 = 1 << 30;

    fn container(resources: serde_json::Value) -> Container {
        serde_json::from_value(json!({"name": "c", "resources": resources})).unwrap()
    }

    fn qos() -> MemoryQos {
        // kuberuntime_container_linux_test.go: fakeNodeAllocatableMemory = "32Gi", the
        // default factor 0.9, 4 KiB pages.
        MemoryQos {
            throttling_factor: 0.9,
            allocatable_memory: 32 * GI,
            page_size: 4096,
        }
    }

    fn unified(pairs: &[(&str, i64)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// `TestGenerateContainerConfigWithMemoryQoSEnforced`, its rows with their values
    /// worked out for 4 KiB pages (upstream computes them with the same formula).
    #[test]
    fn container_memory_min_and_high_as_upstreams_table() {
        let q = qos();
        // "Request128MBLimit256MB": memory.high = floor((128Mi + 0.9 × 128Mi) / 4Ki) × 4Ki.
        let c = container(json!({"requests": {"memory": "128Mi"}, "limits": {"memory": "256Mi"}}));
        assert_eq!(
            q.container_unified(&c),
            unified(&[("memory.min", 128 * MI), ("memory.high", 255_012_864)])
        );
        // "Request128MBWithoutLimit": node allocatable stands for the limit.
        let c = container(json!({"requests": {"memory": "128Mi"}}));
        assert_eq!(
            q.container_unified(&c),
            unified(&[("memory.min", 128 * MI), ("memory.high", 30_937_186_304)])
        );
        // "BestEffortUsesNodeAllocatableForMemoryHigh" (the kubernetes#137685 fix): no
        // memory.min, memory.high at 0.9 of allocatable (upstream also writes
        // memory.min "0", the kernel's default).
        let c = container(json!({}));
        assert_eq!(
            q.container_unified(&c),
            unified(&[("memory.high", 30_923_763_712)])
        );
        // Request equal to limit (a Guaranteed container's memory): no memory.high.
        let c = container(json!({"limits": {"memory": "64Mi"}}));
        assert_eq!(q.container_unified(&c), unified(&[("memory.min", 64 * MI)]));
    }

    #[test]
    fn the_tiers_sum_their_pods_requests() {
        let pod = |name: &str, resources: serde_json::Value| -> Pod {
            serde_json::from_value(json!({
                "metadata": {"name": name, "uid": name},
                "spec": {"containers": [{"name": "c", "resources": resources}]}
            }))
            .unwrap()
        };
        // qos_container_manager_linux_test.go's pods: Guaranteed 128Mi, Burstable
        // 128Mi/256Mi, Burstable 256Mi without a limit, and a BestEffort one.
        let pods = [
            pod("g", json!({"limits": {"memory": "128Mi", "cpu": "1"}})),
            pod(
                "b1",
                json!({"requests": {"memory": "128Mi"}, "limits": {"memory": "256Mi"}}),
            ),
            pod("b2", json!({"requests": {"memory": "256Mi"}})),
            pod("be", json!({})),
        ];
        assert_eq!(qos_memory_min(&pods), (384 * MI, 512 * MI));
        assert_eq!(pod_memory_min(&pods[1]), Some(128 * MI));
        assert_eq!(pod_memory_min(&pods[3]), None);
        assert_eq!(qos_memory_min(&pods[3..]), (0, 0));
    }
}
