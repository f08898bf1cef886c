//! Upstream's pkg/kubelet/preemption/preemption_test.go, its tables row by row with their
//! names, over its fixtures (`getTestPods`): one container each, requests as listed.

use super::*;
use serde_json::json;
use std::collections::{BTreeSet, HashMap};

const MI: i64 = 1 << 20;

/// `getTestPods`: (name, requests (cpu, memory), limits (cpu, memory), priority).
fn all_pods() -> HashMap<&'static str, Pod> {
    type Fixture<'a> = (&'a str, (&'a str, &'a str), (&'a str, &'a str), Option<i32>);
    let fixtures: [Fixture; 9] = [
        ("tiny", ("1m", "1Mi"), ("", ""), None),
        ("bestEffort", ("", ""), ("", ""), None),
        (
            "cluster-critical",
            ("100m", "100Mi"),
            ("", ""),
            Some(2_000_000_000),
        ),
        (
            "node-critical",
            ("100m", "100Mi"),
            ("", ""),
            Some(2_000_000_100),
        ),
        ("burstable", ("100m", "100Mi"), ("", ""), None),
        ("guaranteed", ("100m", "100Mi"), ("100m", "100Mi"), None),
        ("high-request-burstable", ("300m", "300Mi"), ("", ""), None),
        (
            "high-request-guaranteed",
            ("300m", "300Mi"),
            ("300m", "300Mi"),
            None,
        ),
        // TestSmallerResourceRequest's own pods.
        ("low-memory", ("100m", "50Mi"), ("", ""), None),
    ];
    let list = |(cpu, memory): (&str, &str)| {
        let mut m = serde_json::Map::new();
        if !cpu.is_empty() {
            m.insert("cpu".into(), cpu.into());
            m.insert("memory".into(), memory.into());
        }
        serde_json::Value::Object(m)
    };
    fixtures
        .into_iter()
        .map(|(name, requests, limits, priority)| {
            let mut spec = json!({"containers": [{
                "name": format!("{name}-container"), "image": "i",
                "resources": {"requests": list(requests), "limits": list(limits)}}]});
            if let Some(p) = priority {
                spec["priority"] = p.into();
            }
            let pod = serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "kube-system", "annotations": {}},
                "spec": spec
            }))
            .unwrap();
            (name, pod)
        })
        .collect()
}

/// `getAdmissionRequirementList(cpu, memory, pods)`: millicores, MiB, pods; 0 left out.
fn reqs(cpu: i64, memory: i64, pods: i64) -> Vec<Requirement> {
    [
        (Resource::Cpu, cpu),
        (Resource::Memory, memory * MI),
        (Resource::Pods, pods),
    ]
    .into_iter()
    .filter(|(_, q)| *q > 0)
    .map(|(resource, quantity)| Requirement { resource, quantity })
    .collect()
}

fn names(pods: &[Candidate]) -> BTreeSet<String> {
    pods.iter()
        .map(|p| p.pod.metadata.name.clone().unwrap())
        .collect()
}

/// `TestGetPodsToPreempt` and `TestEvictPodsToFreeRequests` (whose killer fakes only
/// record what `getPodsToPreempt` chose): the pods chosen, compared as `podListEqual`
/// does (in any order), or an error.
#[test]
fn pods_to_preempt_as_upstreams_table() {
    let all = all_pods();
    let six = [
        "cluster-critical",
        "bestEffort",
        "burstable",
        "high-request-burstable",
        "guaranteed",
        "high-request-guaranteed",
    ];
    let five = &six[1..];
    type Row<'a> = (
        &'a str,
        &'a str,
        Vec<&'a str>,
        Vec<Requirement>,
        Option<Vec<&'a str>>,
    );
    let rows: Vec<Row> = vec![
        (
            "no requirements",
            "cluster-critical",
            vec![],
            reqs(0, 0, 0),
            Some(vec![]),
        ),
        ("no pods", "cluster-critical", vec![], reqs(0, 0, 1), None),
        (
            "equal pods and resources requirements",
            "cluster-critical",
            vec!["burstable"],
            reqs(100, 100, 1),
            Some(vec!["burstable"]),
        ),
        (
            "higher requirements than pod requests",
            "cluster-critical",
            vec!["burstable"],
            reqs(200, 200, 2),
            None,
        ),
        (
            "choose between bestEffort and burstable",
            "cluster-critical",
            vec!["burstable", "bestEffort"],
            reqs(0, 0, 1),
            Some(vec!["bestEffort"]),
        ),
        (
            "choose between burstable and guaranteed",
            "cluster-critical",
            vec!["burstable", "guaranteed"],
            reqs(0, 0, 1),
            Some(vec!["burstable"]),
        ),
        (
            "choose lower request burstable if it meets requirements",
            "cluster-critical",
            vec!["bestEffort", "high-request-burstable", "burstable"],
            reqs(100, 100, 0),
            Some(vec!["burstable"]),
        ),
        (
            "choose higher request burstable if lower does not meet requirements",
            "cluster-critical",
            vec!["bestEffort", "burstable", "high-request-burstable"],
            reqs(150, 150, 0),
            Some(vec!["high-request-burstable"]),
        ),
        (
            "multiple pods required",
            "cluster-critical",
            five.to_vec(),
            reqs(350, 350, 0),
            Some(vec!["burstable", "high-request-burstable"]),
        ),
        (
            "evict guaranteed when we have to, and dont evict the extra burstable",
            "cluster-critical",
            five.to_vec(),
            reqs(0, 550, 0),
            Some(vec!["high-request-burstable", "high-request-guaranteed"]),
        ),
        (
            "evict cluster critical pod for node critical pod",
            "node-critical",
            vec!["cluster-critical"],
            reqs(100, 0, 0),
            Some(vec!["cluster-critical"]),
        ),
        (
            "can not evict node critical pod for cluster critical pod",
            "cluster-critical",
            vec!["node-critical"],
            reqs(100, 0, 0),
            None,
        ),
        (
            "evict guaranteed when we have to, and dont evict the high request guaranteed pod",
            "cluster-critical",
            vec![
                "bestEffort",
                "high-request-burstable",
                "guaranteed",
                "high-request-guaranteed",
            ],
            reqs(0, 350, 0),
            Some(vec!["high-request-burstable", "guaranteed"]),
        ),
        // TestEvictPodsToFreeRequests.
        (
            "critical pods cannot be preempted",
            "cluster-critical",
            vec!["cluster-critical"],
            reqs(0, 0, 1),
            None,
        ),
        (
            "best effort pods are not preempted when attempting to free resources",
            "cluster-critical",
            vec!["bestEffort"],
            reqs(0, 1, 0),
            None,
        ),
        (
            "multiple pods evicted",
            "cluster-critical",
            six.to_vec(),
            reqs(0, 550, 0),
            Some(vec!["high-request-burstable", "high-request-guaranteed"]),
        ),
    ];
    for (name, preemptor, input, requirements, want) in rows {
        let candidates: Vec<Candidate> = input.iter().map(|n| Candidate::new(&all[n])).collect();
        let got = pods_to_preempt(&all[preemptor], &candidates, &requirements);
        match want {
            Some(want) => assert_eq!(
                names(&got.unwrap_or_else(|e| panic!("{name}: {e}"))),
                want.iter().map(|s| s.to_string()).collect(),
                "{name}"
            ),
            None => assert!(got.is_err(), "{name}: {got:?}"),
        }
    }
}

/// `TestAdmissionRequirementsDistance`.
#[test]
fn distance_as_upstreams_table() {
    let all = all_pods();
    let rows = [
        ("no requirements", reqs(0, 0, 0), "burstable", 0.0),
        (
            "no requests, some requirements",
            reqs(100, 100, 1),
            "bestEffort",
            2.0,
        ),
        (
            "equal requests and requirements",
            reqs(100, 100, 1),
            "burstable",
            0.0,
        ),
        (
            "higher requests than requirements",
            reqs(50, 50, 0),
            "burstable",
            0.0,
        ),
    ];
    for (name, requirements, pod, want) in rows {
        assert_eq!(
            distance(&requirements, &Candidate::new(&all[pod])),
            want,
            "{name}"
        );
    }
}

/// `TestAdmissionRequirementsSubtract` (compared as `admissionRequirementListEqual`).
#[test]
fn subtract_as_upstreams_table() {
    let all = all_pods();
    let rows = [
        (
            "subtract a pod from no requirements",
            reqs(0, 0, 0),
            "burstable",
            reqs(0, 0, 0),
        ),
        (
            "subtract no requests from some requirements",
            reqs(100, 100, 1),
            "bestEffort",
            reqs(100, 100, 0),
        ),
        (
            "equal requests and requirements",
            reqs(100, 100, 1),
            "burstable",
            reqs(0, 0, 0),
        ),
        (
            "subtract higher requests than requirements",
            reqs(50, 50, 0),
            "burstable",
            reqs(0, 0, 0),
        ),
        (
            "subtract lower requests than requirements",
            reqs(200, 200, 1),
            "burstable",
            reqs(100, 100, 0),
        ),
    ];
    for (name, initial, pod, want) in rows {
        assert_eq!(
            subtract(&initial, &[Candidate::new(&all[pod])]),
            want,
            "{name}"
        );
    }
}

/// `TestSmallerResourceRequest`: memory decides first, equal is "smaller". (Its last row,
/// two pods differing only in `storage`, is two pods of no cpu or memory request: true.)
#[test]
fn smaller_resource_request_as_upstreams_table() {
    let all = all_pods();
    let pod = |memory: &str, cpu: &str| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "image": "i",
                "resources": {"requests": {"memory": memory, "cpu": cpu}}}]}
        }))
        .unwrap()
    };
    let (high_memory, high_cpu) = (pod("200Mi", "100m"), pod("50Mi", "200m"));
    let c = Candidate::new;
    let rows = [
        (
            "some requests vs no requests should return false",
            c(&all["low-memory"]),
            c(&all["bestEffort"]),
            false,
        ),
        (
            "lower memory should return true",
            c(&all["low-memory"]),
            c(&high_memory),
            true,
        ),
        (
            "memory priority over CPU",
            c(&high_memory),
            c(&high_cpu),
            false,
        ),
        (
            "equal resource request should return true",
            c(&all["low-memory"]),
            c(&all["low-memory"]),
            true,
        ),
        (
            "resource type other than CPU and memory are ignored",
            c(&all["bestEffort"]),
            c(&all["bestEffort"]),
            true,
        ),
    ];
    for (name, a, b, want) in rows {
        assert_eq!(smaller_resource_request(&a, &b), want, "{name}");
    }
}

/// `TestHandleAdmissionFailure`'s rows with resource reasons only (the other reasons are
/// refusals this node decides before resources): a pod that is not critical keeps its
/// refusal, a critical one gets the pods to preempt or `UnexpectedAdmissionError`.
#[test]
fn handle_admission_failure_as_upstreams_table() {
    let all = all_pods();
    // `getPredicateFailureReasons(cpu, memory, pods)`: capacity = used, so the amount
    // short is what is requested.
    let short = |cpu: i64, memory: i64, pods: i64| -> Vec<Insufficient> {
        reqs(cpu, memory, pods)
            .into_iter()
            .map(|r| Insufficient {
                reason: "OutOf",
                resource: r.resource,
                requested: r.quantity,
                used: r.quantity * 5 / 4,
                capacity: r.quantity * 5 / 4,
            })
            .collect()
    };
    fn pick<'a>(all: &'a HashMap<&'static str, Pod>, names: &[&str]) -> Vec<Candidate<'a>> {
        names.iter().map(|n| Candidate::new(&all[*n])).collect()
    }
    let c = |names: &[&str]| pick(&all, names);
    let got = handle_admission_failure(
        &all["cluster-critical"],
        &short(0, 0, 1),
        &c(&["cluster-critical"]),
    );
    assert_eq!(
        got.unwrap_err().reason,
        "UnexpectedAdmissionError",
        "critical pods cannot be preempted"
    );
    let got = handle_admission_failure(&all["guaranteed"], &short(0, 1, 0), &c(&["burstable"]));
    assert_eq!(
        got.unwrap_err().reason,
        "OutOf",
        "non-critical pod should not trigger eviction"
    );
    let got = handle_admission_failure(
        &all["cluster-critical"],
        &short(0, 1, 0),
        &c(&["bestEffort"]),
    );
    assert_eq!(
        got.unwrap_err().message,
        "Unexpected error while attempting to recover from admission failure: preemption: error \
         finding a set of pods to preempt: no set of running pods found to reclaim resources: \
         [(res: memory, q: 1048576), ]",
        "best effort pods are not preempted when attempting to free resources"
    );
    let six = c(&[
        "cluster-critical",
        "bestEffort",
        "burstable",
        "high-request-burstable",
        "guaranteed",
        "high-request-guaranteed",
    ]);
    let got = handle_admission_failure(&all["cluster-critical"], &short(0, 550, 0), &six).unwrap();
    assert_eq!(
        names(&got),
        ["high-request-burstable", "high-request-guaranteed"]
            .map(String::from)
            .into(),
        "multiple pods evicted"
    );
}
