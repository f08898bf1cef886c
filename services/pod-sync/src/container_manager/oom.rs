//! Each container's `oom_score_adj` (upstream `qos.GetContainerOOMScoreAdjust`): who the
//! kernel's OOM killer takes first when the node runs out of memory. BestEffort first,
//! then Burstable by how little of the node they asked for, Guaranteed and node-critical
//! pods last. (The sandbox's pause process gets containerd's own -998; CRI has no field.)

use crate::container_manager::cgroups::{QosClass, qos_class};
use k8s_openapi::api::core::v1::{Container, Pod};
use nodeagent_config::aggregate::is_sidecar;
use nodeagent_proto::k8s;

/// Upstream `guaranteedOOMScoreAdj`: Guaranteed and node-critical containers.
pub const GUARANTEED: i64 = -997;
/// Upstream `besteffortOOMScoreAdj`.
pub const BEST_EFFORT: i64 = 1000;
/// Upstream `scheduling.SystemCriticalPriority`.
const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// The container's `oom_score_adj`, for a node with `memory_capacity` bytes.
pub fn container_oom_score_adj(pod: &Pod, c: &Container, memory_capacity: u64) -> i64 {
    if is_node_critical(pod) {
        return GUARANTEED;
    }
    match qos_class(pod) {
        QosClass::Guaranteed => return GUARANTEED,
        QosClass::BestEffort => return BEST_EFFORT,
        QosClass::Burstable => {}
    }
    // A container asking for 10% of the node's memory gets 900: once it uses more than
    // it asked for, its score reaches 1000 and it goes first.
    let capacity = i128::from(memory_capacity.max(1));
    // A pod-level memory request its containers did not claim counts as requested by each
    // of them in equal parts (upstream's `remainingPodMemReqPerContainer`).
    let unclaimed = nodeagent_config::pod_level::unclaimed_memory_per_container(pod);
    let adj = |request: i64| {
        (1000 - (1000 * (i128::from(request) + i128::from(unclaimed))) / capacity) as i64
    };
    let mut score = adj(memory_request(c));
    // A sidecar must not go before the regular containers it serves: it gets at most the
    // score of the one that asked for the least.
    let spec = pod.spec.as_ref();
    let declared_as_sidecar = spec
        .and_then(|s| s.init_containers.as_ref())
        .is_some_and(|init| init.iter().any(|i| i.name == c.name));
    if is_sidecar(c) && declared_as_sidecar {
        let regular = spec.map(|s| s.containers.as_slice()).unwrap_or_default();
        if let Some(least) = regular.iter().map(memory_request).min() {
            score = score.min(adj(least));
        }
    }
    // Above every Guaranteed container (a Guaranteed pod using all of memory scores 3),
    // and below BestEffort ones.
    score.clamp(1000 + GUARANTEED, BEST_EFFORT - 1)
}

/// The container's memory request; a limit alone stands for the request, as the API
/// server's defaulting (and the kubelet's own for static pods) makes it.
fn memory_request(c: &Container) -> i64 {
    use nodeagent_config::pod_level::{Resource, container_request};
    container_request(c, Resource::Memory).unwrap_or(0)
}

/// Upstream `IsCriticalPod`: static, mirror, or of a priority of at least
/// system-critical's. Eviction never takes one.
pub(crate) fn is_critical(pod: &Pod) -> bool {
    let annotations = pod.metadata.annotations.as_ref();
    let annotation = |key: &str| annotations.and_then(|a| a.get(key));
    let is_static = annotation(k8s::labels::CONFIG_SOURCE).is_some_and(|s| s != "api");
    let is_mirror = annotation(k8s::labels::CONFIG_MIRROR).is_some();
    let priority = pod.spec.as_ref().and_then(|s| s.priority);
    is_static || is_mirror || priority.is_some_and(|p| p >= SYSTEM_CRITICAL_PRIORITY)
}

/// Upstream `IsNodeCriticalPod`: class system-node-critical, and critical.
fn is_node_critical(pod: &Pod) -> bool {
    is_critical(pod)
        && pod
            .spec
            .as_ref()
            .and_then(|s| s.priority_class_name.as_deref())
            == Some("system-node-critical")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    const GI: u64 = 1 << 30;

    fn pod(meta: Value, spec: Value) -> Pod {
        let mut m = json!({"name": "p", "uid": "u1"});
        m.as_object_mut()
            .unwrap()
            .extend(meta.as_object().unwrap().clone());
        serde_json::from_value(json!({"metadata": m, "spec": spec})).unwrap()
    }

    fn c(name: &str, res: Value) -> Value {
        json!({"name": name, "image": "i", "resources": res})
    }

    fn sidecar(name: &str, res: Value) -> Value {
        let mut s = c(name, res);
        s["restartPolicy"] = "Always".into();
        s
    }

    fn req(memory: &str) -> Value {
        json!({"requests": {"memory": memory}})
    }

    /// Upstream's `TestGetContainerOOMScoreAdjust` (pkg/kubelet/qos/policy_test.go), its
    /// rows with `podLevelResourcesFeatureEnabled: true`, by name, on its node of 4e9 bytes:
    /// the pod's QoS comes from its pod-level resources, and the memory it requests beyond
    /// its containers' requests is spread over them.
    #[test]
    fn scores_with_pod_level_resources_as_upstream() {
        let resources = |rc: &str, rm: &str, lc: &str, lm: &str| json!({"requests": {"cpu": rc, "memory": rm}, "limits": {"cpu": lc, "memory": lm}});
        // The fixtures' pod-level resources: requests 5m / 2e9 (sampleDefaultPodMemRequest),
        // limits 5m / 2e9 (Guaranteed) or 2e9+1000 (Burstable).
        let guaranteed = resources("5m", "2000000000", "5m", "2000000000");
        let burstable = resources("5m", "2000000000", "5m", "2000001000");
        let same = || resources("5m", "1000000000", "5m", "1000000000");
        let none = || json!({});
        let unequal = |mem_limit: &str| resources("3m", "1000000000", "5m", mem_limit);
        let spec = |pod_level: &Value, containers: Vec<Value>, init: Vec<Value>| json!({"resources": pod_level, "containers": containers, "initContainers": init});
        // (fixture, spec, [(container, score)])
        type Row<'a> = (&'a str, Value, Vec<(&'a str, i64)>);
        let rows: Vec<Row> = vec![
            (
                "guaranteed-pod-resources-no-container-resources",
                spec(
                    &guaranteed,
                    vec![
                        c("no-request-limit-1", none()),
                        c("no-request-limit-2", none()),
                    ],
                    vec![],
                ),
                vec![("no-request-limit-1", -997), ("no-request-limit-2", -997)],
            ),
            (
                "guaranteed-pod-resources-equal-container-resources",
                spec(
                    &guaranteed,
                    vec![
                        c("guaranteed-container-1", same()),
                        c("guaranteed-container-2", same()),
                    ],
                    vec![],
                ),
                vec![
                    ("guaranteed-container-1", -997),
                    ("guaranteed-container-2", -997),
                ],
            ),
            (
                "guaranteed-pod-resources-unequal-container-requests",
                spec(
                    &guaranteed,
                    vec![
                        c("burstable-container", unequal("1000001000")),
                        c("best-effort-container", none()),
                    ],
                    vec![],
                ),
                vec![
                    ("burstable-container", -997),
                    ("best-effort-container", -997),
                ],
            ),
            (
                "burstable-pod-resources-no-container-resources",
                spec(
                    &burstable,
                    vec![
                        c("no-request-limit-1", none()),
                        c("no-request-limit-2", none()),
                    ],
                    vec![],
                ),
                vec![("no-request-limit-1", 750), ("no-request-limit-2", 750)],
            ),
            (
                "burstable-pod-resources-equal-container-requests",
                spec(
                    &burstable,
                    vec![
                        c("guaranteed-container-1", same()),
                        c("guaranteed-container-2", same()),
                    ],
                    vec![],
                ),
                vec![
                    ("guaranteed-container-1", 750),
                    ("guaranteed-container-2", 750),
                ],
            ),
            (
                "burstable-pod-resources-unequal-container-requests",
                spec(
                    &burstable,
                    vec![
                        c("burstable-container", unequal("1000000000")),
                        c("best-effort-container", none()),
                    ],
                    vec![],
                ),
                vec![("burstable-container", 625), ("best-effort-container", 875)],
            ),
            (
                "burstable-pod-resources-no-container-resources-with-sidecar",
                spec(
                    &burstable,
                    vec![c("no-request-limit", none())],
                    vec![sidecar("no-request-limit-sidecar", none())],
                ),
                vec![("no-request-limit", 750), ("no-request-limit-sidecar", 750)],
            ),
            (
                "burstable-pod-resources-equal-container-requests-with-sidecar",
                spec(
                    &burstable,
                    vec![c("burstable-container", req("1000000000"))],
                    vec![sidecar("burstable-sidecar", req("1000000000"))],
                ),
                vec![("burstable-container", 750), ("burstable-sidecar", 750)],
            ),
            (
                "burstable-pod-resources-unequal-container-requests-with-sidecar",
                spec(
                    &burstable,
                    vec![
                        c("burstable-container-1", req("1000000000")),
                        c("burstable-container-2", req("500000000")),
                    ],
                    vec![sidecar("burstable-sidecar", req("200000000"))],
                ),
                vec![
                    ("burstable-container-1", 725),
                    ("burstable-container-2", 850),
                    ("burstable-sidecar", 850),
                ],
            ),
        ];
        for (fixture, spec, want) in rows {
            let p = pod(json!({}), spec);
            let s = p.spec.as_ref().unwrap();
            for (name, score) in want {
                let container = s
                    .containers
                    .iter()
                    .chain(s.init_containers.iter().flatten())
                    .find(|c| c.name == name)
                    .unwrap();
                assert_eq!(
                    container_oom_score_adj(&p, container, 4_000_000_000),
                    score,
                    "{fixture}: {name}"
                );
            }
        }
    }

    #[test]
    fn scores_as_upstream() {
        let guaranteed = json!({"limits": {"cpu": "1", "memory": "1Gi"}});
        let static_pod = json!({"annotations": {"kubernetes.io/config.source": "file"}});
        // (what, metadata, spec, container name, score on a 10 GiB node)
        let rows: Vec<(&str, Value, Value, &str, i64)> = vec![
            (
                "BestEffort",
                json!({}),
                json!({"containers": [c("a", json!({}))]}),
                "a",
                1000,
            ),
            (
                "Guaranteed",
                json!({}),
                json!({"containers": [c("a", guaranteed.clone())]}),
                "a",
                -997,
            ),
            (
                "Burstable asking for 10% of memory",
                json!({}),
                json!({"containers": [c("a", req("1Gi"))]}),
                "a",
                900,
            ),
            (
                "Burstable with a memory limit only: the limit is the request",
                json!({}),
                json!({"containers": [c("a", json!({"limits": {"memory": "5Gi"}, "requests": {"cpu": "1"}}))]}),
                "a",
                500,
            ),
            (
                "Burstable asking for no memory stays below BestEffort",
                json!({}),
                json!({"containers": [c("a", json!({"requests": {"cpu": "100m"}}))]}),
                "a",
                999,
            ),
            (
                "Burstable asking for all of memory stays above Guaranteed",
                json!({}),
                json!({"containers": [c("a", req("20Gi"))]}),
                "a",
                3,
            ),
            (
                "a static system-node-critical pod, even BestEffort",
                json!({"annotations": {"kubernetes.io/config.source": "file"}}),
                json!({"priorityClassName": "system-node-critical", "containers": [c("a", json!({}))]}),
                "a",
                -997,
            ),
            (
                "a mirror-annotated system-node-critical pod",
                json!({"annotations": {"kubernetes.io/config.mirror": "h"}}),
                json!({"priorityClassName": "system-node-critical", "containers": [c("a", json!({}))]}),
                "a",
                -997,
            ),
            (
                "an API pod of priority system-node-critical",
                json!({"annotations": {"kubernetes.io/config.source": "api"}}),
                json!({"priorityClassName": "system-node-critical", "priority": 2_000_001_000,
                       "containers": [c("a", json!({}))]}),
                "a",
                -997,
            ),
            (
                "an API pod naming the class without its priority is not critical",
                json!({"annotations": {"kubernetes.io/config.source": "api"}}),
                json!({"priorityClassName": "system-node-critical", "containers": [c("a", json!({}))]}),
                "a",
                1000,
            ),
            (
                "a static pod of another class is scored by its QoS",
                static_pod.clone(),
                json!({"priorityClassName": "system-cluster-critical", "containers": [c("a", json!({}))]}),
                "a",
                1000,
            ),
            (
                "a small sidecar scores as the smallest regular container",
                json!({}),
                json!({"initContainers": [sidecar("s", req("100Mi"))],
                       "containers": [c("a", req("2Gi")), c("b", req("1Gi"))]}),
                "s",
                900,
            ),
            (
                "a big sidecar keeps its own, lower score",
                json!({}),
                json!({"initContainers": [sidecar("s", req("5Gi"))],
                       "containers": [c("a", req("1Gi"))]}),
                "s",
                500,
            ),
            (
                "a regular init container is scored alone",
                json!({}),
                json!({"initContainers": [c("i", req("100Mi"))],
                       "containers": [c("a", req("1Gi"))]}),
                "i",
                991,
            ),
        ];
        for (what, meta, spec, name, want) in rows {
            let p = pod(meta, spec);
            let s = p.spec.as_ref().unwrap();
            let container = s
                .init_containers
                .iter()
                .flatten()
                .chain(&s.containers)
                .find(|c| c.name == name)
                .unwrap();
            assert_eq!(
                container_oom_score_adj(&p, container, 10 * GI),
                want,
                "{what}"
            );
        }
    }
}
