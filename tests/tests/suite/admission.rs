//! Resource admission as upstream's kubelet does it (pkg/kubelet/lifecycle/predicate.go):
//! a pod asking for more CPU than allocatable is Failed `OutOfcpu`, one asking for more
//! ephemeral-storage `OutOfephemeral-storage`, a pod beyond `maxPods` is Failed `OutOfpods`,
//! each with InsufficientResourceError's message after upstream's "Pod was rejected: "
//! (kubelet.go `rejectPod`), nothing of it runs,
//! and a refused pod does not count against the pods that come after it. A critical pod (a
//! static one: upstream's `IsCriticalPod`) that does not fit preempts the cheapest pods
//! instead (pkg/kubelet/preemption), and is refused `UnexpectedAdmissionError` where no
//! pods would make room.

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;
use nix::sys::signal::Signal;
use nodeagent_config::Service;
use nodeagent_tests::{
    Node, NodeOptions, api_pod, api_pod_in_phase, eventually, eventually_event, require_runtime,
};
use serde_json::json;
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(90);

async fn create(pods: &Api<Pod>, node: &Node, name: &str, cpu: Option<&str>) -> String {
    let resources = match cpu {
        Some(c) => json!({"requests": {"cpu": c}}),
        None => json!({}),
    };
    create_with(pods, node, name, resources).await
}

async fn create_with(
    pods: &Api<Pod>,
    node: &Node,
    name: &str,
    resources: serde_json::Value,
) -> String {
    let name = node.pod_name(name);
    let extra = json!({"spec": {"containers": [{"name": "c", "image": "busybox:1.36",
        "command": ["sleep", "3600"], "resources": resources}]}});
    pods.create(&PostParams::default(), &api_pod(&name, &node.name, extra))
        .await
        .unwrap();
    name
}

/// How many of pod `full_name`'s containers run now.
async fn running_in(node: &Node, full_name: &str) -> usize {
    let running = nodeagent_proto::cri::ContainerState::ContainerRunning as i32;
    node.containers()
        .await
        .into_iter()
        .filter(|c| {
            c.labels.get("io.kubernetes.pod.name").map(String::as_str) == Some(full_name)
                && c.state == running
        })
        .count()
}

fn reason_and_message(p: &Pod) -> (String, String) {
    let s = p.status.clone().unwrap_or_default();
    (s.reason.unwrap_or_default(), s.message.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_beyond_max_pods_or_allocatable_cpu_are_refused_in_upstreams_words() {
    if !require_runtime("admission") {
        return;
    }
    let (server, node) = Node::start_with_api_server(
        "admission",
        NodeOptions {
            extra_config: "maxPods: 2\n".into(),
            // A short resync, so that the refused pods' quiet is measured over several.
            sync_frequency: Some(format!("{}s", SYNC.as_secs())),
            ..Default::default()
        },
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    let cpus = nodeagent_config::machine::cpus() * 1000;

    // More CPU than the node has: OutOfcpu, and no container.
    let hog = create(&pods, &node, "hog", Some("1000")).await;
    let refused = api_pod_in_phase(&pods, &hog, "Failed", DEADLINE).await;
    assert_eq!(
        reason_and_message(&refused),
        (
            "OutOfcpu".to_string(),
            format!(
                "Pod was rejected: Node didn't have enough resource: cpu, requested: 1000000, used: 0, capacity: {cpus}"
            )
        )
    );
    assert_eq!(node.container_id("hog", "c").await, None);

    // More ephemeral-storage than the node's filesystem holds (a limit, which is also the
    // request by defaulting): OutOfephemeral-storage, against the allocatable the Node
    // shows (node-status reports it in Ki).
    let filler = create_with(
        &pods,
        &node,
        "filler",
        json!({"limits": {"ephemeral-storage": "1000Ti"}}),
    )
    .await;
    let refused = api_pod_in_phase(&pods, &filler, "Failed", DEADLINE).await;
    let (reason, message) = reason_and_message(&refused);
    assert_eq!(reason, "OutOfephemeral-storage", "{message}");
    let prefix = "Pod was rejected: Node didn't have enough resource: ephemeral-storage, requested: 1099511627776000, used: 0, capacity: ";
    let capacity: i64 = message
        .strip_prefix(prefix)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("{message}"));
    let shown: k8s_openapi::api::core::v1::Node =
        Api::all(server.client()).get(&node.name).await.unwrap();
    let shown = shown.status.unwrap().allocatable.unwrap()["ephemeral-storage"]
        .0
        .clone();
    let shown_bytes = shown
        .strip_suffix("Ki")
        .and_then(|k| k.parse::<i64>().ok())
        .map(|k| k * 1024)
        .unwrap_or_else(|| panic!("allocatable ephemeral-storage {shown}"));
    assert!(
        capacity > 0 && (capacity - shown_bytes).abs() < 1024,
        "admitted against {capacity}, the Node shows {shown}"
    );
    assert_eq!(node.container_id("filler", "c").await, None);

    // Two fit (the refused one does not count), the third is one too many.
    let a = create(&pods, &node, "a", Some("100m")).await;
    api_pod_in_phase(&pods, &a, "Running", DEADLINE).await;
    let b = create(&pods, &node, "b", None).await;
    api_pod_in_phase(&pods, &b, "Running", DEADLINE).await;
    let c = create(&pods, &node, "c", None).await;
    let refused = api_pod_in_phase(&pods, &c, "Failed", DEADLINE).await;
    assert_eq!(
        reason_and_message(&refused),
        (
            "OutOfpods".to_string(),
            "Pod was rejected: Node didn't have enough resource: pods, requested: 1, used: 2, capacity: 2"
                .to_string()
        )
    );
    assert_eq!(node.container_id("c", "c").await, None);
    // The admitted ones run on.
    for name in [&a, &b] {
        api_pod_in_phase(&pods, name, "Running", DEADLINE).await;
    }

    // The resyncs leave a refused pod alone: upstream's rejectPod starts no worker for
    // it, and its pod workers drop every update to a finished pod. Only the refused pods
    // sync as "create" (no sandbox), the running ones as "sync": over three resync
    // periods, in which the running pods' syncs show that resyncs happened, "create"
    // stays. It is read once it held for one period: the API server's echo of a refused
    // pod's Failed status (a watch UPDATE) may still sync it once.
    let held = std::cell::Cell::new((worker_syncs(&node).await.create, Instant::now()));
    let before = eventually("the refused pods' syncs to hold", DEADLINE, || async {
        let now = worker_syncs(&node).await;
        let (create, since) = held.get();
        if now.create != create {
            held.set((now.create, Instant::now()));
            Err(format!("{create} -> {now:?}"))
        } else if since.elapsed() < SYNC {
            Err(format!("{now:?} for {:?}", since.elapsed()))
        } else {
            Ok(now)
        }
    })
    .await;
    let resynced = eventually("three resyncs of the running pods", DEADLINE, || async {
        let now = worker_syncs(&node).await;
        if now.sync >= before.sync + 6.0 {
            Ok(now)
        } else {
            Err(format!("{before:?} -> {now:?}"))
        }
    })
    .await;
    assert_eq!(
        resynced.create, before.create,
        "the refused pods were synced again: {before:?} -> {resynced:?}"
    );
    node.stop().await;
    drop(server);
}

/// `syncFrequency` in the first test.
const SYNC: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Copy)]
struct WorkerSyncs {
    create: f64,
    sync: f64,
}

/// `kubelet_pod_worker_duration_seconds_count` by upstream's operation type.
async fn worker_syncs(node: &Node) -> WorkerSyncs {
    let r = node.api.get("/metrics").await.expect("/metrics");
    assert_eq!(r.status, 200, "/metrics: {}", r.text());
    let families = crate::prom::parse(&r.text()).expect("/metrics parses");
    let count = |op: &str| {
        families
            .get("kubelet_pod_worker_duration_seconds")
            .into_iter()
            .flat_map(|f| &f.samples)
            .filter(|s| {
                s.name == "kubelet_pod_worker_duration_seconds_count"
                    && s.labels.get("operation_type").map(String::as_str) == Some(op)
            })
            .map(|s| s.value)
            .sum()
    };
    WorkerSyncs {
        create: count("create"),
        sync: count("sync"),
    }
}

/// Upstream's critical pod preemption, seen as a user sees it: on a node full at `maxPods`
/// with a Burstable and a BestEffort API pod, a static pod (critical) preempts the
/// BestEffort one (preemption_test.go "choose between bestEffort and burstable"), which
/// ends Failed with upstream's reason, message, DisruptionTarget condition and `Preempting`
/// event, while the Burstable one runs on untouched. A second static pod that no set of
/// pods can make room for is refused with upstream's `UnexpectedAdmissionError` text. A
/// SIGKILL of pod-sync in between changes none of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_critical_static_pod_preempts_the_cheapest_pod_as_upstream() {
    if !require_runtime("preemption") {
        return;
    }
    let (server, mut node) = Node::start_with_api_server(
        "preemption",
        NodeOptions {
            extra_config: "maxPods: 2\n".into(),
            ..Default::default()
        },
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    let burstable = create(&pods, &node, "burstable", Some("100m")).await;
    api_pod_in_phase(&pods, &burstable, "Running", DEADLINE).await;
    let best_effort = create(&pods, &node, "best-effort", None).await;
    api_pod_in_phase(&pods, &best_effort, "Running", DEADLINE).await;
    // (`container_id` takes the name before the node suffix.)
    let burstable_id = node.container_id("burstable", "c").await;
    assert!(burstable_id.is_some());

    let static_pod = |name: &str, resources: serde_json::Value| {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
               "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
                   "name": "c", "image": "busybox:1.36", "command": ["sleep", "3600"],
                   "resources": resources}]}})
        .to_string()
    };
    node.write_manifest("critical.yaml", &static_pod("critical", json!({})));
    let preempted = api_pod_in_phase(&pods, &best_effort, "Failed", DEADLINE).await;
    assert_eq!(
        reason_and_message(&preempted),
        (
            "Preempting".to_string(),
            "Preempted in order to admit critical pod".to_string()
        )
    );
    let conditions = preempted.status.unwrap().conditions.unwrap_or_default();
    let disruption = conditions
        .iter()
        .find(|c| c.type_ == "DisruptionTarget")
        .unwrap_or_else(|| panic!("no DisruptionTarget: {conditions:?}"));
    assert_eq!(
        (
            disruption.status.as_str(),
            disruption.reason.as_deref(),
            disruption.message.as_deref()
        ),
        (
            "True",
            Some("TerminationByKubelet"),
            Some("Pod was preempted by Kubelet to accommodate a critical pod.")
        )
    );
    eventually_event(
        &server.client(),
        "default",
        "the Preempting event",
        DEADLINE,
        |e| {
            e.reason.as_deref() == Some("Preempting")
                && e.type_.as_deref() == Some("Warning")
                && e.message.as_deref() == Some("Preempted in order to admit critical pod")
                && e.involved_object.name.as_deref() == Some(best_effort.as_str())
        },
    )
    .await;
    // The victim's own worker stopped it, once (upstream's killPodNow hands the kill to
    // the pod worker and waits): one Killing event in upstream's words, posted once.
    let killed = |e: &k8s_openapi::api::core::v1::Event| {
        e.reason.as_deref() == Some("Killing")
            && e.involved_object.name.as_deref() == Some(best_effort.as_str())
    };
    let killing = eventually_event(
        &server.client(),
        "default",
        "the preempted pod's Killing event",
        DEADLINE,
        killed,
    )
    .await;
    assert_eq!(
        (killing.message.as_deref(), killing.count.unwrap_or(1)),
        (Some("Stopping container c"), 1)
    );
    node.pod_in_phase("critical", "Running", DEADLINE).await;
    // Counted as upstream's `Preemptions`, under the resource short of.
    eventually("kubelet_preemptions in /metrics", DEADLINE, || async {
        let body = node.api.get("/metrics").await?.text();
        body.lines()
            .any(|l| l == "kubelet_preemptions{preemption_signal=\"pods\"} 1")
            .then_some(())
            .ok_or_else(|| {
                body.lines()
                    .filter(|l| l.contains("preemption"))
                    .collect::<Vec<_>>()
                    .join("\n")
            })
    })
    .await;
    // The Burstable pod was not chosen: the same container, running.
    api_pod_in_phase(&pods, &burstable, "Running", DEADLINE).await;
    assert_eq!(node.container_id("burstable", "c").await, burstable_id);
    assert_eq!(
        running_in(&node, &best_effort).await,
        0,
        "nothing of the preempted pod runs"
    );
    let critical_id = node.container_id("critical", "c").await;
    assert!(critical_id.is_some());

    // A pod-sync killed and started again changes none of it: the preempted pod stays
    // Failed for the same reason and never runs again, the other two keep their containers.
    node.signal(Service::PodSync, Signal::SIGKILL).await;
    node.spawn(Service::PodSync);
    node.wait_serving(Service::PodSync).await;
    for (pod, want) in [("burstable", &burstable_id), ("critical", &critical_id)] {
        nodeagent_tests::consistently(
            &format!("{pod} keeps its container across the restart"),
            Duration::from_secs(10),
            Duration::from_millis(500),
            || async {
                let got = node.container_id(pod, "c").await;
                (got == *want)
                    .then_some(())
                    .ok_or_else(|| format!("{got:?}, was {want:?}"))
            },
        )
        .await;
    }
    let preempted = api_pod_in_phase(&pods, &best_effort, "Failed", DEADLINE).await;
    assert_eq!(reason_and_message(&preempted).0, "Preempting");
    let events: Api<k8s_openapi::api::core::v1::Event> =
        Api::namespaced(server.client(), "default");
    let kills: Vec<_> = events
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(killed)
        .map(|e| e.count.unwrap_or(1))
        .collect();
    assert_eq!(kills, [1], "killed once, not again after the restart");
    assert_eq!(
        running_in(&node, &best_effort).await,
        0,
        "the preempted pod never runs again"
    );

    // No set of pods frees a thousand CPUs: refused, as upstream words it. (The pod it is
    // also short of would be freed by the Burstable pod: only cpu is left unmet.)
    node.write_manifest(
        "huge.yaml",
        &static_pod("huge", json!({"requests": {"cpu": "1000"}})),
    );
    let refused = node.pod_in_phase("huge", "Failed", DEADLINE).await;
    assert_eq!(
        refused["status"]["reason"], "UnexpectedAdmissionError",
        "{refused}"
    );
    let message = refused["status"]["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with(
            "Pod was rejected: Unexpected error while attempting to recover from admission \
             failure: preemption: error finding a set of pods to preempt: no set of running \
             pods found to reclaim resources: [(res: cpu, q: "
        ),
        "{message}"
    );
    api_pod_in_phase(&pods, &burstable, "Running", DEADLINE).await;
    assert_eq!(node.container_id("burstable", "c").await, burstable_id);
    node.stop().await;
    drop(server);
}
