use super::*;
use serde_json::json;

const MI: i64 = 1 << 20;

/// A pod from its `spec.resources` and its containers' `resources` (JSON).
fn pod(pod_level: serde_json::Value, containers: &[serde_json::Value]) -> Pod {
    let containers: Vec<_> = containers
        .iter()
        .enumerate()
        .map(|(i, r)| json!({"name": format!("c{i}"), "image": "i", "resources": r}))
        .collect();
    let mut spec = json!({"containers": containers});
    if !pod_level.is_null() {
        spec["resources"] = pod_level;
    }
    serde_json::from_value(json!({"metadata": {"name": "p", "uid": "u"}, "spec": spec})).unwrap()
}

/// KEP-2837's defaulting rules, as `defaultPodRequests`' comment states them: with pod-level
/// limits, (1) a resource the containers request defaults to their requests together, (2)
/// one they do not request defaults to the pod-level limit; without pod-level limits
/// nothing is defaulted.
#[test]
fn pod_level_requests_are_defaulted_as_the_api_server_does() {
    // (what, spec.resources, containers' resources, cpu request, memory request)
    type Row<'a> = (
        &'a str,
        serde_json::Value,
        Vec<serde_json::Value>,
        Option<i64>,
        Option<i64>,
    );
    let rows: Vec<Row> = vec![
        (
            "no container requests: the limits",
            json!({"limits": {"cpu": "1", "memory": "100Mi"}}),
            vec![json!({})],
            Some(1000),
            Some(100 * MI),
        ),
        (
            "containers' requests together (a container limit is its request)",
            json!({"limits": {"cpu": "1", "memory": "100Mi"}}),
            vec![
                json!({"requests": {"cpu": "100m"}}),
                json!({"limits": {"cpu": "200m"}}),
            ],
            Some(300),
            Some(100 * MI),
        ),
        (
            "a request the pod sets stays",
            json!({"requests": {"cpu": "500m"}, "limits": {"cpu": "1"}}),
            vec![json!({"requests": {"cpu": "100m"}})],
            Some(500),
            None,
        ),
        (
            "requests only: nothing defaulted",
            json!({"requests": {"memory": "10Mi"}}),
            vec![json!({"requests": {"cpu": "100m"}})],
            None,
            Some(10 * MI),
        ),
        (
            "a limit of a resource the node does not read is ignored",
            json!({"limits": {"ephemeral-storage": "1Gi"}}),
            vec![json!({"requests": {"cpu": "100m"}})],
            None,
            None,
        ),
    ];
    for (what, resources, containers, cpu, memory) in rows {
        let p = PodLevel::of(&pod(resources, &containers)).unwrap();
        assert_eq!(p.request(Resource::Cpu), cpu, "{what}: cpu");
        assert_eq!(p.request(Resource::Memory), memory, "{what}: memory");
    }
    assert_eq!(
        PodLevel::of(&pod(serde_json::Value::Null, &[json!({})])),
        None
    );
}

/// `IsPodLevelResourcesSet` and `PodRequests`: only supported resources count; a pod-level
/// request replaces the containers' sum of that resource only.
#[test]
fn pod_requests_take_the_pod_level_amount_where_set() {
    let p = pod(
        json!({"requests": {"memory": "300Mi"}}),
        &[
            json!({"requests": {"cpu": "100m", "memory": "50Mi"}}),
            json!({"requests": {"cpu": "50m"}}),
        ],
    );
    assert_eq!(pod_request(&p, Resource::Memory), 300 * MI);
    assert_eq!(pod_request(&p, Resource::Cpu), 150);
    let unsupported = pod(
        json!({"requests": {"ephemeral-storage": "1Gi"}}),
        &[json!({})],
    );
    assert!(set(&unsupported).is_none());
    let hugepages = pod(json!({"limits": {"hugepages-2Mi": "4Mi"}}), &[json!({})]);
    assert!(set(&hugepages).is_some());
    assert!(set(&pod(json!({}), &[json!({})])).is_none());
}

/// `PodLimits` and `ResourceConfigForPod`'s "limits declared": a pod-level limit declares the
/// pod limited even where a container sets none.
#[test]
fn pod_limits_and_effective_container_limits() {
    let p = pod(
        json!({"limits": {"cpu": "3", "memory": "256Mi"}}),
        &[
            json!({"requests": {"cpu": "1", "memory": "128Mi"}}),
            json!({"limits": {"memory": "64Mi"}}),
        ],
    );
    assert_eq!(
        pod_limit(&p, Resource::Cpu),
        Aggregate {
            total: 3000,
            every_container: true
        }
    );
    assert_eq!(pod_limit(&p, Resource::Memory).total, 256 * MI);
    let spec = p.spec.as_ref().unwrap();
    // kuberuntime_container_linux_test.go "Container Level Request 128M/1C, Pod Level Limit
    // 256M/3C": the container gets the pod's limits.
    assert_eq!(
        effective_container_limit(&p, &spec.containers[0], Resource::Cpu),
        Some(3000)
    );
    assert_eq!(
        effective_container_limit(&p, &spec.containers[0], Resource::Memory),
        Some(256 * MI)
    );
    // Its own limit wins.
    assert_eq!(
        effective_container_limit(&p, &spec.containers[1], Resource::Memory),
        Some(64 * MI)
    );
    // Without pod-level resources, a container without a limit has none.
    let plain = pod(
        serde_json::Value::Null,
        &[json!({"limits": {"memory": "64Mi"}}), json!({})],
    );
    let spec = plain.spec.as_ref().unwrap();
    assert_eq!(
        effective_container_limit(&plain, &spec.containers[1], Resource::Memory),
        None
    );
    assert_eq!(
        pod_limit(&plain, Resource::Memory),
        Aggregate {
            total: 64 * MI,
            every_container: false
        }
    );
}

#[test]
fn unclaimed_pod_memory_is_spread_over_all_containers() {
    // policy_test.go "burstable-pod-resources-unequal-container-requests": 2e9 requested by
    // the pod, 1e9 by one of its two containers: 5e8 each.
    let p = pod(
        json!({"requests": {"cpu": "5m", "memory": "2000000000"}, "limits": {"cpu": "5m", "memory": "2000001000"}}),
        &[
            json!({"requests": {"cpu": "3m", "memory": "1000000000"}, "limits": {"cpu": "5m", "memory": "1000000000"}}),
            json!({}),
        ],
    );
    assert_eq!(unclaimed_memory_per_container(&p), 500_000_000);
    assert_eq!(
        unclaimed_memory_per_container(&pod(serde_json::Value::Null, &[json!({})])),
        0
    );
}
