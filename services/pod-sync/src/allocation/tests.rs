//! Upstream's own table: `TestRetryPendingResizes` (pkg/kubelet/allocation/
//! allocation_manager_test.go; `TestHandlePodResourcesResize` before 1.34), its rows under
//! their names. The node has 4 CPUs and 4 GiB allocatable; two other pods (one with a
//! sidecar) hold 1 CPU and 1 GiB each; the resized pod asks for `original` and then
//! `new`. Upstream matches the Deferred messages as prefixes, the Infeasible ones whole.

use super::*;
use k8s_openapi::api::core::v1::PodSpec;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::json;

const NODE: NodeResources = NodeResources {
    pods: 110,
    cpu_millis: 4000,
    memory: 4 << 30,
    ephemeral_storage: 0,
};

fn list(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, Quantity>> {
    (!pairs.is_empty()).then(|| {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
            .collect()
    })
}

fn pod(requests: &[(&str, &str)], limits: &[(&str, &str)]) -> Pod {
    Pod {
        metadata: serde_json::from_value(
            json!({"uid": "1111", "name": "pod1", "namespace": "ns1"}),
        )
        .unwrap(),
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "c1".into(),
                image: Some("i1".into()),
                resources: Some(ResourceRequirements {
                    requests: list(requests),
                    limits: list(limits),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// testPod2 (a sidecar of 1 CPU, 1Gi) and testPod3 (a container of 1 CPU, 1Gi).
fn others() -> Vec<Requests> {
    vec![
        Requests {
            cpu_millis: 1000,
            memory: 1 << 30,
            ephemeral_storage: 0,
        };
        2
    ]
}

/// A resource list as (name, quantity) pairs.
type List = &'static [(&'static str, &'static str)];

struct Row {
    name: &'static str,
    original: (List, List),
    new: (List, List),
    /// None: admitted (upstream expects `PodResizeInProgress`); Some: pending, with the
    /// reason and the start of the message.
    pending: Option<(&'static str, &'static str)>,
}

const C1000_M1G: &[(&str, &str)] = &[("cpu", "1"), ("memory", "1Gi")];

fn rows() -> Vec<Row> {
    vec![
        Row {
            name: "Request CPU and memory decrease - expect InProgress",
            original: (C1000_M1G, &[]),
            new: (&[("cpu", "500m"), ("memory", "500Mi")], &[]),
            pending: None,
        },
        Row {
            name: "Request CPU increase, memory decrease - expect InProgress",
            original: (C1000_M1G, &[]),
            new: (&[("cpu", "1500m"), ("memory", "500Mi")], &[]),
            pending: None,
        },
        Row {
            name: "Request CPU decrease, memory increase - expect InProgress",
            original: (C1000_M1G, &[]),
            new: (&[("cpu", "500m"), ("memory", "1500Mi")], &[]),
            pending: None,
        },
        Row {
            name: "Request CPU and memory increase beyond current capacity - expect Deferred",
            original: (C1000_M1G, &[]),
            new: (&[("cpu", "2500m"), ("memory", "2500Mi")], &[]),
            pending: Some((DEFERRED, "Node didn't have enough resource: cpu")),
        },
        Row {
            name: "Request CPU decrease and memory increase beyond current capacity - expect Deferred",
            original: (C1000_M1G, &[]),
            new: (&[("cpu", "500m"), ("memory", "2500Mi")], &[]),
            pending: Some((DEFERRED, "Node didn't have enough resource: memory")),
        },
        Row {
            name: "Request memory increase beyond node capacity - expect Infeasible",
            original: (C1000_M1G, &[]),
            new: (&[("cpu", "1"), ("memory", "4500Mi")], &[]),
            pending: Some((
                INFEASIBLE,
                "Node didn't have enough capacity: memory, requested: 4718592000, capacity: 4294967296",
            )),
        },
        Row {
            name: "Request CPU increase beyond node capacity - expect Infeasible",
            original: (C1000_M1G, &[]),
            new: (&[("cpu", "5000m"), ("memory", "1Gi")], &[]),
            pending: Some((
                INFEASIBLE,
                "Node didn't have enough capacity: cpu, requested: 5000, capacity: 4000",
            )),
        },
        Row {
            name: "Increase CPU from min shares",
            original: (&[("cpu", "2m")], &[]),
            new: (&[("cpu", "1")], &[]),
            pending: None,
        },
        Row {
            name: "Decrease CPU to min shares",
            original: (&[("cpu", "1")], &[]),
            new: (&[("cpu", "2m")], &[]),
            pending: None,
        },
        Row {
            name: "Increase CPU from min limit",
            original: (&[("cpu", "10m")], &[("cpu", "10m")]),
            new: (&[("cpu", "10m")], &[("cpu", "20m")]),
            pending: None,
        },
        Row {
            name: "Decrease CPU to min limit",
            original: (&[("cpu", "10m")], &[("cpu", "20m")]),
            new: (&[("cpu", "10m")], &[("cpu", "10m")]),
            pending: None,
        },
    ]
}

/// One pass as pod-sync makes it: intake of the original pod, then of the resized one,
/// then the admission.
fn run(row: &Row, cpu_manager_static: bool) -> (Decision, Allocations, Pod) {
    let mut alloc = Allocations::default();
    let original = pod(row.original.0, row.original.1);
    alloc.intake(original.clone());
    let resized = pod(row.new.0, row.new.1);
    let running = alloc.intake(resized.clone());
    let others = others();
    let node = Node {
        allocatable: &NODE,
        others: &others,
        cpu_manager_static,
    };
    let decision = if !alloc.wanted.contains_key("1111") {
        Decision::NoResize
    } else {
        match admit(&running, &resized, &node) {
            Ok(()) => {
                alloc.accept("1111", &[("c-id".into(), "c1".into())]);
                Decision::Admitted
            }
            Err(p) => Decision::Pending(p),
        }
    };
    (decision, alloc, running)
}

#[test]
fn test_retry_pending_resizes() {
    let mut failed = Vec::new();
    for row in rows() {
        let (decision, alloc, _) = run(&row, false);
        let ok = match (&decision, row.pending) {
            (Decision::Admitted, None) => {
                // The allocation is the new spec; the running container keeps a record of
                // what it still runs with until it is updated.
                same_all(
                    &alloc.pods["1111"],
                    &resources_of(&pod(row.new.0, row.new.1)),
                ) && alloc.actuated.contains_key("c-id")
            }
            (Decision::Pending(p), Some((reason, message))) => {
                let whole = reason == INFEASIBLE;
                p.reason == reason
                    && if whole {
                        p.message == message
                    } else {
                        p.message.starts_with(message)
                    }
                    && same_all(
                        &alloc.pods["1111"],
                        &resources_of(&pod(row.original.0, row.original.1)),
                    )
            }
            _ => false,
        };
        if !ok {
            failed.push(format!("{}: got {decision:?}", row.name));
        }
    }
    assert!(failed.is_empty(), "rows failed:\n{}", failed.join("\n"));
}

#[test]
fn no_resize_keeps_the_spec_and_asks_nothing() {
    // upstream's "No resize" row: the same requests, written another way, are no resize.
    let mut alloc = Allocations::default();
    alloc.intake(pod(C1000_M1G, &[]));
    let same_again = alloc.intake(pod(&[("cpu", "1000m"), ("memory", "1024Mi")], &[]));
    assert!(alloc.wanted.is_empty());
    assert_eq!(
        same_again.spec.unwrap().containers[0].resources,
        Some(ResourceRequirements {
            requests: list(&[("cpu", "1000m"), ("memory", "1024Mi")]),
            ..Default::default()
        })
    );
}

#[test]
fn a_pending_resize_runs_the_pod_with_its_allocation() {
    let row = &rows()[4]; // Deferred
    let (decision, alloc, running) = run(row, false);
    assert!(matches!(decision, Decision::Pending(_)));
    // What the rest of pod-sync sees is the allocation, not the spec's new requests.
    assert_eq!(
        running.spec.unwrap().containers[0].resources,
        Some(ResourceRequirements {
            requests: list(C1000_M1G),
            ..Default::default()
        })
    );
    assert!(alloc.wanted.contains_key("1111"));
}

#[test]
fn static_pods_and_static_cpus_are_infeasible() {
    // upstream's "static pod, expect Infeasible" and the CPU manager row of IsPodResizeInfeasible.
    let mut static_pod = pod(C1000_M1G, &[]);
    static_pod.metadata.annotations = Some(BTreeMap::from([(
        "kubernetes.io/config.source".to_string(),
        "file".to_string(),
    )]));
    let others = others();
    let node = Node {
        allocatable: &NODE,
        others: &others,
        cpu_manager_static: true,
    };
    let resized = pod(&[("cpu", "500m"), ("memory", "1Gi")], &[]);
    assert_eq!(
        admit(&static_pod, &resized, &node).unwrap_err().message,
        "In-place resize of static-pods is not supported"
    );
    let guaranteed = pod(C1000_M1G, C1000_M1G);
    let more_cpu = pod(
        &[("cpu", "2"), ("memory", "1Gi")],
        &[("cpu", "2"), ("memory", "1Gi")],
    );
    assert_eq!(
        admit(&guaranteed, &more_cpu, &node).unwrap_err(),
        Pending {
            reason: INFEASIBLE,
            message:
                "Resize is infeasible for Guaranteed Pods alongside CPU Manager policy \"static\""
                    .into(),
            detail: "guaranteed_pod_cpu_manager_static_policy",
        }
    );
    // Memory alone may change: the CPUs stay.
    let more_memory = pod(
        &[("cpu", "1"), ("memory", "2Gi")],
        &[("cpu", "1"), ("memory", "2Gi")],
    );
    assert_eq!(admit(&guaranteed, &more_memory, &node), Ok(()));
}

#[test]
fn conditions_follow_upstreams_rows() {
    // "CPU increase in progress, new allocation - expect InProgress reset" and
    // "Deferred resize doesn't clear in-progress status".
    let original = Condition {
        reason: String::new(),
        message: "original in-progress".into(),
        generation: Some(1),
    };
    let mut c = ResizeConditions {
        pending: Some(Condition {
            message: "original pending".into(),
            ..Default::default()
        }),
        in_progress: Some(original.clone()),
    };
    c.after(&Decision::Admitted, Some(2));
    assert_eq!(c.pending, None);
    assert_eq!(c.in_progress.as_ref().unwrap().message, "");
    assert_eq!(c.in_progress.as_ref().unwrap().generation, Some(2));

    let mut c = ResizeConditions {
        pending: None,
        in_progress: Some(original.clone()),
    };
    let deferred = Pending {
        reason: DEFERRED,
        message: "Node didn't have enough resource: memory".into(),
        detail: "",
    };
    assert!(
        c.after(&Decision::Pending(deferred.clone()), Some(3)),
        "new"
    );
    // The same decision again changes nothing: upstream posts no second event.
    assert!(!c.after(&Decision::Pending(deferred.clone()), Some(3)));
    // A newer generation's resize deferred again is a change.
    assert!(c.after(&Decision::Pending(deferred.clone()), Some(4)));
    c.after(&Decision::Pending(deferred), Some(3));
    assert_eq!(c.pending.as_ref().unwrap().reason, DEFERRED);
    assert_eq!(c.in_progress, Some(original.clone()));
    // "No resize": a pending condition goes, progress stays.
    c.after(&Decision::NoResize, Some(3));
    assert_eq!(c.pending, None);
    assert_eq!(c.in_progress, Some(original));
    // An error keeps the generation of the resize it belongs to.
    c.failed("boom".into(), Some(9));
    let p = c.in_progress.unwrap();
    assert_eq!((p.reason.as_str(), p.generation), ("Error", Some(1)));
}

#[test]
fn a_container_updated_to_its_allocation_needs_no_record() {
    let mut alloc = Allocations::default();
    alloc.intake(pod(C1000_M1G, &[]));
    alloc.intake(pod(&[("cpu", "500m"), ("memory", "1Gi")], &[]));
    alloc.accept("1111", &[("c-id".into(), "c1".into())]);
    assert_eq!(
        alloc.actuated("1111", "c-id", "c1").unwrap().requests,
        list(C1000_M1G)
    );
    let new = alloc.pods["1111"]["c1"].clone();
    alloc.actuated_now("1111", "c-id", "c1", &new);
    assert!(alloc.actuated.is_empty());
    assert!(same(alloc.actuated("1111", "c-id", "c1").unwrap(), &new));
    // Saved and read back: the same allocation, nothing wanted.
    let json = serde_json::to_string(&alloc).unwrap();
    let back: Allocations = serde_json::from_str(&json).unwrap();
    assert_eq!(back.pods, alloc.pods);
    assert!(back.wanted.is_empty());
}

/// Upstream's `TestSortPendingResizes` (allocation_manager_test.go): seven pods allocated
/// 1 cpu and 1Gi, pushed in order and in reverse, always sorted the same. Pod 0's
/// decrease is made at pod level upstream (InPlacePodLevelResourcesVerticalScaling, alpha,
/// not served here): here its container asks for less, as pod 1's does.
#[test]
fn pending_resizes_sort_as_upstreams_table() {
    let allocated = pod(&[("cpu", "1"), ("memory", "1Gi")], &[]);
    let smaller = pod(&[("cpu", "500m"), ("memory", "500Mi")], &[]);
    let larger = pod(&[("cpu", "1500m"), ("memory", "1500Mi")], &[]);
    let mut prioritized = allocated.clone();
    prioritized.spec.as_mut().unwrap().priority = Some(100);
    let guaranteed = pod(
        &[("cpu", "1"), ("memory", "1Gi")],
        &[("cpu", "1"), ("memory", "1Gi")],
    );
    let guaranteed_larger = pod(
        &[("cpu", "1500m"), ("memory", "1500Mi")],
        &[("cpu", "1500m"), ("memory", "1500Mi")],
    );
    let t = |s: &str| Some(s.to_string());
    let rows = [
        PendingOrder::of("0", &allocated, &smaller, None),
        PendingOrder::of("1", &allocated, &smaller, None),
        PendingOrder::of("2", &prioritized, &larger, None),
        PendingOrder::of("3", &guaranteed, &guaranteed_larger, None),
        PendingOrder::of("4", &allocated, &larger, t("2026-01-01T00:00:00Z")),
        PendingOrder::of("5", &allocated, &larger, t("2026-01-01T00:00:01Z")),
        PendingOrder::of("6", &allocated, &larger, None),
    ];
    let expected: Vec<&str> = vec!["0", "1", "2", "3", "4", "5", "6"];
    for reverse in [false, true] {
        let mut pending = rows.to_vec();
        if reverse {
            pending.reverse();
        }
        sort_pending(&mut pending);
        let got: Vec<&str> = pending.iter().map(|p| p.uid.as_str()).collect();
        assert_eq!(got, expected, "pushed in reverse: {reverse}");
    }
}

/// Upstream's resize event details, checked against what a 1.36 kubelet printed for
/// `kubectl describe` ("Pod resize started: {...}", "Pod resize completed: {...}", both
/// with these details) and the row of `TestRecordPodDeferredAcceptedResizes` (requests
/// only, generation 0).
#[test]
fn resize_event_details_as_upstream_prints_them() {
    let mut p: Pod = serde_json::from_value(json!({
        "metadata": {"name": "resize-demo", "generation": 2},
        "spec": {"containers": [{"name": "app", "image": "i", "resources": {
            "limits": {"cpu": "500m", "memory": "256Mi"},
            "requests": {"cpu": "300m", "memory": "128Mi"}}}]}
    }))
    .unwrap();
    assert_eq!(
        resize_details(&p),
        r#"{"containers":[{"name":"app","resources":{"limits":{"cpu":"500m","memory":"256Mi"},"requests":{"cpu":"300m","memory":"128Mi"}}}],"generation":2}"#
    );
    p = serde_json::from_value(json!({
        "metadata": {"name": "pod1"},
        "spec": {"containers": [{"name": "c1", "image": "i1", "resources": {
            "requests": {"cpu": "500m", "memory": "500Mi"}}}]}
    }))
    .unwrap();
    assert_eq!(
        resize_details(&p),
        r#"{"containers":[{"name":"c1","resources":{"requests":{"cpu":"500m","memory":"500Mi"}}}],"generation":0}"#
    );
    // Init containers first (a sidecar and a plain one), a container without resources
    // as `{}`.
    p = serde_json::from_value(json!({
        "metadata": {"name": "p", "generation": 3},
        "spec": {"initContainers": [{"name": "side", "image": "i", "restartPolicy": "Always",
                  "resources": {"requests": {"cpu": "10m"}}}],
                 "containers": [{"name": "c", "image": "i"}]}
    }))
    .unwrap();
    assert_eq!(
        resize_details(&p),
        r#"{"initContainers":[{"name":"side","resources":{"requests":{"cpu":"10m"}}}],"containers":[{"name":"c","resources":{}}],"generation":3}"#
    );
}

/// upstream events/resize.go `PodResizePendingMsg` (the message `handlePodResourcesResize`
/// posts with `ResizeDeferred` or `ResizeInfeasible`): the prefix with the condition's
/// reason, then the desired pod's `podResourceSummary` with the message as `error`. The
/// 1.37 blog on resize preemption prints one: `Pod resize ...: {"containers":[{"name":"app",
/// "resources":{"limits":{"cpu":"6","memory":"1Gi"},"requests":{"cpu":"6","memory":"1Gi"}}}],
/// "generation":2,"error":"Node didn't have enough resource: cpu, requested: 6000, used:
/// 3950, capacity: 8000"}`.
#[test]
fn pending_resize_events_read_as_upstreams() {
    let mut wanted = pod(
        &[("cpu", "6"), ("memory", "1Gi")],
        &[("cpu", "6"), ("memory", "1Gi")],
    );
    wanted.spec.as_mut().unwrap().containers[0].name = "app".into();
    wanted.metadata.generation = Some(2);
    let deferred = Pending {
        reason: DEFERRED,
        message:
            "Node didn't have enough resource: cpu, requested: 6000, used: 3950, capacity: 8000"
                .into(),
        detail: "",
    };
    assert_eq!(
        resize_pending_event(&wanted, &deferred),
        (
            "ResizeDeferred",
            "Pod resize Deferred: {\"containers\":[{\"name\":\"app\",\"resources\":{\"limits\":{\"cpu\":\"6\",\"memory\":\"1Gi\"},\"requests\":{\"cpu\":\"6\",\"memory\":\"1Gi\"}}}],\"generation\":2,\"error\":\"Node didn't have enough resource: cpu, requested: 6000, used: 3950, capacity: 8000\"}".to_string()
        )
    );
    let infeasible = Pending {
        reason: INFEASIBLE,
        message: "In-place resize of static-pods is not supported".into(),
        detail: "static_pod",
    };
    let (reason, message) = resize_pending_event(&wanted, &infeasible);
    assert_eq!(reason, "ResizeInfeasible");
    assert!(
        message.starts_with("Pod resize Infeasible: {\"containers\""),
        "{message}"
    );
    assert!(message.ends_with(",\"error\":\"In-place resize of static-pods is not supported\"}"));
}

/// upstream's `kubelet_container_requested_resizes_total` operations (the help text: one
/// of `add`, `remove`, `increase` or `decrease`, each resource and requirement counted
/// apart; a container new in the spec is no resize of it).
#[test]
fn requested_resizes_are_counted_per_resource_and_requirement() {
    let before = resources_of(&pod(
        &[("cpu", "100m"), ("memory", "64Mi")],
        &[("memory", "128Mi")],
    ));
    let after = resources_of(&pod(
        &[("cpu", "200m")],
        &[("cpu", "1"), ("memory", "96Mi")],
    ));
    let mut got = requested_resizes(&before, &after);
    got.sort();
    let mut want = vec![
        ("increase", "requests", "cpu".to_string()),
        ("remove", "requests", "memory".to_string()),
        ("add", "limits", "cpu".to_string()),
        ("decrease", "limits", "memory".to_string()),
    ];
    want.sort();
    assert_eq!(got, want);
    // The same amounts written differently ask for nothing.
    let same = resources_of(&pod(
        &[("cpu", "0.1"), ("memory", "67108864")],
        &[("memory", "128Mi")],
    ));
    assert_eq!(requested_resizes(&before, &same), vec![]);
    let mut other = pod(&[("cpu", "1")], &[]);
    other.spec.as_mut().unwrap().containers[0].name = "new".into();
    assert_eq!(requested_resizes(&before, &resources_of(&other)), vec![]);
}

/// upstream `TestRecordPodDeferredAcceptedResizes`: an admitted resize counts only if it
/// had been deferred ("no pending condition": nothing), under what retried it.
#[test]
fn deferred_accepted_resizes_count_only_after_a_deferral() {
    let none = ResizeConditions::default();
    assert!(!none.deferred_then_admitted(&Decision::Admitted));
    let deferred = ResizeConditions {
        pending: Some(Condition {
            reason: DEFERRED.into(),
            generation: Some(1),
            ..Default::default()
        }),
        in_progress: None,
    };
    assert!(deferred.deferred_then_admitted(&Decision::Admitted));
    assert!(!deferred.deferred_then_admitted(&Decision::NoResize));
    let infeasible = ResizeConditions {
        pending: Some(Condition {
            reason: INFEASIBLE.into(),
            ..Default::default()
        }),
        in_progress: None,
    };
    assert!(!infeasible.deferred_then_admitted(&Decision::Admitted));
}
