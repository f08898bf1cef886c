use super::*;

fn rr(requests: &[(&str, &str)], limits: &[(&str, &str)]) -> ResourceRequirements {
    let list = |l: &[(&str, &str)]| {
        (!l.is_empty()).then(|| {
            l.iter()
                .map(|(k, v)| {
                    (
                        k.to_string(),
                        k8s_openapi::apimachinery::pkg::api::resource::Quantity(v.to_string()),
                    )
                })
                .collect()
        })
    };
    ResourceRequirements {
        requests: list(requests),
        limits: list(limits),
        ..Default::default()
    }
}

/// upstream's `TestComputePodActionsForPodResize` rows on what counts as a change.
#[test]
fn changes_as_the_runtime_sees_them() {
    // "Update container CPU resources to equivalent value": 1m and 2m are both the
    // minimum shares.
    assert!(changed(&rr(&[("cpu", "2m")], &[]), &rr(&[("cpu", "1m")], &[])).is_empty());
    // "Update container CPU and memory resources".
    assert_eq!(
        changed(
            &rr(
                &[("cpu", "100m"), ("memory", "100Mi")],
                &[("cpu", "200m"), ("memory", "200Mi")]
            ),
            &rr(
                &[("cpu", "50m"), ("memory", "50Mi")],
                &[("cpu", "100m"), ("memory", "100Mi")]
            ),
        ),
        ["cpu", "memory"]
    );
    // Only the memory limit.
    assert_eq!(
        changed(
            &rr(&[("cpu", "1")], &[("memory", "200Mi")]),
            &rr(&[("cpu", "1000m")], &[("memory", "300Mi")]),
        ),
        ["memory"]
    );
    // A CPU limit at the minimum quota stays the minimum quota.
    assert!(changed(&rr(&[], &[("cpu", "5m")]), &rr(&[], &[("cpu", "10m")])).is_empty());
    assert_eq!(
        changed(&rr(&[], &[("cpu", "10m")]), &rr(&[], &[("cpu", "20m")])),
        ["cpu"]
    );
}

#[test]
fn the_pod_cgroup_holds_both_sizes_on_the_way() {
    use crate::container_manager::cgroups::PodResources;
    let a = PodResources {
        cpu_shares: 1024,
        cpu_quota_us: Some(100_000),
        memory_limit_bytes: Some(100),
        memory_min: None,
    };
    let b = PodResources {
        cpu_shares: 512,
        cpu_quota_us: Some(200_000),
        memory_limit_bytes: None,
        memory_min: None,
    };
    assert_eq!(
        wider(&a, &b),
        PodResources {
            cpu_shares: 1024,
            cpu_quota_us: Some(200_000),
            memory_limit_bytes: None,
            memory_min: None,
        }
    );
}
