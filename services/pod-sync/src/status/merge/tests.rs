//! upstream: pkg/kubelet/status/status_manager_test.go `TestMergePodStatus`, its 13 cases
//! under their names, from upstream's `getPodStatus()` (Running, Ready and PodScheduled
//! True, message "Message"). Compared as upstream compares: conditions by type, status and
//! reason in any order (`conditionsEqual`), then phase, reason and message (`statusEqual`).

use super::*;

fn cond(t: &str, status: &str, reason: Option<&str>) -> PodCondition {
    PodCondition {
        type_: t.into(),
        status: status.into(),
        reason: reason.map(String::from),
        ..Default::default()
    }
}

/// Upstream's `getPodStatus()`.
fn base() -> PodStatus {
    PodStatus {
        phase: Some("Running".into()),
        conditions: Some(vec![
            cond("Ready", "True", None),
            cond("PodScheduled", "True", None),
        ]),
        message: Some("Message".into()),
        ..Default::default()
    }
}

fn with(mut s: PodStatus, c: PodCondition) -> PodStatus {
    s.conditions.get_or_insert_with(Vec::new).push(c);
    s
}

fn failed(mut s: PodStatus) -> PodStatus {
    s.phase = Some("Failed".into());
    s
}

fn disruption(reason: &str) -> PodCondition {
    cond("DisruptionTarget", "True", Some(reason))
}

fn feature(status: &str) -> PodCondition {
    cond("example.com/feature", status, None)
}

/// Upstream's expected status: a phase, its conditions, reason and message.
fn want(
    phase: &str,
    conditions: Vec<PodCondition>,
    reason: Option<&str>,
    message: &str,
) -> PodStatus {
    PodStatus {
        phase: Some(phase.into()),
        conditions: Some(conditions),
        reason: reason.map(String::from),
        message: Some(message.into()),
        ..Default::default()
    }
}

/// Upstream's `conditionsEqual` and `statusEqual`.
fn same(got: &PodStatus, want: &PodStatus) -> bool {
    let key = |s: &PodStatus| {
        let mut v: Vec<(String, String, Option<String>)> = s
            .conditions
            .iter()
            .flatten()
            .map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone()))
            .collect();
        v.sort();
        v
    };
    key(got) == key(want)
        && (&got.phase, &got.reason, &got.message) == (&want.phase, &want.reason, &want.message)
}

#[test]
fn test_merge_pod_status() {
    let ready = || cond("Ready", "True", None);
    let scheduled = || cond("PodScheduled", "True", None);
    let not_ready = |t: &str| cond(t, "False", Some("PodFailed"));
    let to_failed_evicted = |mut s: PodStatus| {
        s.phase = Some("Failed".into());
        s.reason = Some("Evicted".into());
        s.message = Some("Was Evicted".into());
        s
    };
    let running_unknown = |mut s: PodStatus| {
        s.phase = Some("Running".into());
        s.reason = Some("Unknown".into());
        s.message = Some("Message".into());
        s
    };
    let mut readiness_changed = base();
    readiness_changed.conditions.as_mut().unwrap()[0].status = "False".into();
    let cases: Vec<(&str, bool, PodStatus, PodStatus, PodStatus)> = vec![
        ("no change", false, base(), base(), base()),
        (
            "add DisruptionTarget condition when transitioning into failed phase",
            false,
            base(),
            with(failed(base()), disruption("TerminationByKubelet")),
            want(
                "Failed",
                vec![
                    disruption("TerminationByKubelet"),
                    not_ready("Ready"),
                    scheduled(),
                    not_ready("ContainersReady"),
                ],
                None,
                "Message",
            ),
        ),
        (
            "don't add DisruptionTarget condition when transitioning into failed phase, but there might still be running containers",
            true,
            base(),
            with(failed(base()), disruption("TerminationByKubelet")),
            want("Running", vec![ready(), scheduled()], None, "Message"),
        ),
        (
            "preserve DisruptionTarget condition",
            false,
            with(base(), disruption("TerminationByKubelet")),
            base(),
            want(
                "Running",
                vec![ready(), scheduled(), disruption("TerminationByKubelet")],
                None,
                "Message",
            ),
        ),
        (
            "override DisruptionTarget condition",
            false,
            with(base(), disruption("EvictedByEvictionAPI")),
            with(failed(base()), disruption("TerminationByKubelet")),
            want(
                "Failed",
                vec![
                    not_ready("Ready"),
                    not_ready("ContainersReady"),
                    scheduled(),
                    disruption("TerminationByKubelet"),
                ],
                None,
                "Message",
            ),
        ),
        (
            "don't override DisruptionTarget condition when remaining in running phase",
            false,
            with(base(), disruption("EvictedByEvictionAPI")),
            with(base(), disruption("TerminationByKubelet")),
            want(
                "Running",
                vec![disruption("EvictedByEvictionAPI"), ready(), scheduled()],
                None,
                "Message",
            ),
        ),
        (
            "don't override DisruptionTarget condition when transitioning to failed phase but there might still be running containers",
            true,
            with(base(), disruption("EvictedByEvictionAPI")),
            with(failed(base()), disruption("TerminationByKubelet")),
            want(
                "Running",
                vec![disruption("EvictedByEvictionAPI"), ready(), scheduled()],
                None,
                "Message",
            ),
        ),
        (
            "readiness changes",
            false,
            base(),
            readiness_changed.clone(),
            want(
                "Running",
                vec![cond("Ready", "False", None), scheduled()],
                None,
                "Message",
            ),
        ),
        (
            "additional pod condition",
            false,
            with(base(), feature("True")),
            base(),
            want(
                "Running",
                vec![ready(), scheduled(), feature("True")],
                None,
                "Message",
            ),
        ),
        (
            "additional pod condition and readiness changes",
            false,
            with(base(), feature("True")),
            readiness_changed,
            want(
                "Running",
                vec![cond("Ready", "False", None), scheduled(), feature("True")],
                None,
                "Message",
            ),
        ),
        (
            "additional pod condition changes",
            false,
            with(base(), feature("True")),
            with(base(), feature("False")),
            want(
                "Running",
                vec![ready(), scheduled(), feature("True")],
                None,
                "Message",
            ),
        ),
        (
            "phase is transitioning to failed and no containers running",
            false,
            running_unknown(base()),
            to_failed_evicted(base()),
            want(
                "Failed",
                vec![
                    not_ready("Ready"),
                    not_ready("ContainersReady"),
                    scheduled(),
                ],
                Some("Evicted"),
                "Was Evicted",
            ),
        ),
        (
            "phase is transitioning to failed and containers running",
            true,
            running_unknown(base()),
            to_failed_evicted(base()),
            want(
                "Running",
                vec![ready(), scheduled()],
                Some("Unknown"),
                "Message",
            ),
        ),
    ];
    let mut failures = Vec::new();
    for (name, running, old, new, expected) in &cases {
        let got = merge_pod_status(old, new.clone(), *running);
        if !same(&got, expected) {
            failures.push(format!("{name}:\n  want {expected:?}\n  got  {got:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// Not a row of upstream's table but a line of its `mergePodStatus`
/// (`newPodStatus.ResourceClaimStatuses = oldPodStatus.ResourceClaimStatuses`): the claim
/// statuses the resource claim controller wrote stay, whatever the kubelet computed, so the
/// status patch never sends them away.
#[test]
fn resource_claim_statuses_are_the_api_servers() {
    use k8s_openapi::api::core::v1::PodResourceClaimStatus;
    let claims = vec![PodResourceClaimStatus {
        name: "gpu".into(),
        resource_claim_name: Some("pod-gpu-x7k2".into()),
    }];
    let old = PodStatus {
        resource_claim_statuses: Some(claims.clone()),
        ..base()
    };
    let merged = merge_pod_status(&old, base(), false);
    assert_eq!(merged.resource_claim_statuses, Some(claims));
    let merged = merge_pod_status(&base(), old.clone(), false);
    assert_eq!(
        merged.resource_claim_statuses, None,
        "not the kubelet's to set"
    );
}

/// Upstream `TestStatusEquality` (status_manager_test.go): ten container statuses in any
/// order are the same status (upstream shuffles them ten times; here ten rotations and
/// their reverses), and a difference in a condition the kubelet does not own
/// (upstream's `www.example.com/feature`, True against False) is no difference. Checked against the
/// broken rule too: plain equality calls both different.
#[test]
fn test_status_equality() {
    use k8s_openapi::api::core::v1::ContainerStatus;
    let statuses: Vec<ContainerStatus> = (0..10)
        .map(|i| ContainerStatus {
            name: format!("container{i}"),
            ..Default::default()
        })
        .collect();
    let pod_status = PodStatus {
        container_statuses: Some(statuses.clone()),
        ..Default::default()
    };
    for i in 0..10 {
        for reversed in [false, true] {
            let mut shuffled = statuses.clone();
            shuffled.rotate_left(i);
            if reversed {
                shuffled.reverse();
            }
            let other = PodStatus {
                container_statuses: Some(shuffled),
                ..Default::default()
            };
            assert!(
                equal_by_kubelet(&pod_status, &other),
                "Order of container statuses should not affect normalized equality. ({i}, {reversed})"
            );
            if i > 0 || reversed {
                assert_ne!(pod_status, other);
            }
        }
    }
    let mut old = pod_status.clone();
    let mut new = pod_status.clone();
    old.conditions = Some(vec![feature("False")]);
    new.conditions = Some(vec![feature("True")]);
    assert!(
        equal_by_kubelet(&old, &new),
        "Differences in pod condition not owned by kubelet should not affect normalized equality."
    );
    assert_ne!(old, new);
    // Not upstream's case, the rule's other half: a condition the kubelet owns counts.
    old.conditions = Some(vec![cond("Ready", "False", None)]);
    new.conditions = Some(vec![cond("Ready", "True", None)]);
    assert!(!equal_by_kubelet(&old, &new));
}
