//! The pod status in the API server, as upstream's status manager keeps it: conditions
//! this node does not own (a readiness gate's, set by a controller) survive every status
//! patch of the node, `spec.readinessGates` hold `Ready` back with upstream's reason and
//! message, a pod-sync restart changes no transition time, start time or pod IP, and the
//! node's patches (two-way strategic merge patches) leave no stale container state behind
//! when a container goes from running to terminated, and a change of one container's
//! status keeps the others' (the lists are atomic upstream, sent whole).

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use nix::sys::signal::Signal;
use nodeagent_config::Service;
use nodeagent_tests::{Node, NodeOptions, consistently, eventually, require_runtime};
use serde_json::{Value, json};
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(90);
const GATE: &str = "example.com/load-balancer";

fn condition(pod: &Value, t: &str) -> Option<Value> {
    pod["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == t)
        .cloned()
}

async fn api_pod(pods: &Api<Pod>, name: &str) -> Result<Value, String> {
    let p = pods.get(name).await.map_err(|e| e.to_string())?;
    Ok(serde_json::to_value(p).unwrap())
}

/// Sets the gate's condition as a controller would (strategic merge on pods/status).
async fn set_gate(pods: &Api<Pod>, name: &str, status: &str) {
    let patch = json!({"status": {"conditions": [{"type": GATE, "status": status}]}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .expect("patch the gate's condition");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_gates_and_foreign_conditions_survive_the_nodes_patches() {
    if !require_runtime("pod status") {
        return;
    }
    let (server, mut node) =
        Node::start_with_api_server("pod-status", NodeOptions::default()).await;
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    let name = node.pod_name("gated");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node.name,
            "terminationGracePeriodSeconds": 1,
            "readinessGates": [{"conditionType": GATE}],
            "containers": [{"name": "c", "image": "busybox:1.36",
                "command": ["sh", "-c", "touch /tmp/ready; trap 'exit 0' TERM; while true; do sleep 0.2; done"],
                "readinessProbe": {"exec": {"command": ["test", "-f", "/tmp/ready"]}, "periodSeconds": 1}}]
        }
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();

    // Containers ready, the gate's condition missing: Ready is False, as upstream says.
    eventually("Ready held back by the gate", DEADLINE, || async {
        let p = api_pod(&pods, &name).await?;
        let ready = condition(&p, "Ready").ok_or("no Ready yet")?;
        let containers = condition(&p, "ContainersReady").ok_or("no ContainersReady")?;
        let expected =
            format!("corresponding condition of pod readiness gate \"{GATE}\" does not exist.");
        if containers["status"] == "True"
            && ready["status"] == "False"
            && ready["reason"] == "ReadinessGatesNotReady"
            && ready["message"] == expected.as_str()
        {
            Ok(())
        } else {
            Err(p["status"].to_string())
        }
    })
    .await;

    // A controller sets the gate: Ready.
    set_gate(&pods, &name, "True").await;
    eventually("Ready once the gate is True", DEADLINE, || async {
        let p = api_pod(&pods, &name).await?;
        match condition(&p, "Ready") {
            Some(r) if r["status"] == "True" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;

    // The container turns unready: the node patches the status, and the gate's condition
    // (which the node does not own) is still there, still True.
    let id = node.container_id("gated", "c").await.expect("container id");
    node.exec(&id, &["rm", "/tmp/ready"])
        .await
        .expect("exec rm");
    eventually("not ready, the gate kept", DEADLINE, || async {
        let p = api_pod(&pods, &name).await?;
        let ready = condition(&p, "Ready").ok_or("no Ready")?;
        let gate = condition(&p, GATE)
            .ok_or_else(|| format!("the gate's condition is gone: {}", p["status"]))?;
        if ready["status"] == "False"
            && ready["reason"] == "ContainersNotReady"
            && gate["status"] == "True"
        {
            Ok(())
        } else {
            Err(p["status"].to_string())
        }
    })
    .await;
    node.exec(&id, &["touch", "/tmp/ready"])
        .await
        .expect("exec touch");
    set_gate(&pods, &name, "False").await;
    eventually("not ready while the gate is False", DEADLINE, || async {
        let p = api_pod(&pods, &name).await?;
        let ready = condition(&p, "Ready").ok_or("no Ready")?;
        let containers = condition(&p, "ContainersReady").ok_or("no ContainersReady")?;
        let expected =
            format!("the status of pod readiness gate \"{GATE}\" is not \"True\", but False");
        if containers["status"] == "True"
            && ready["status"] == "False"
            && ready["message"] == expected.as_str()
        {
            Ok(())
        } else {
            Err(p["status"].to_string())
        }
    })
    .await;

    // A pod-sync restart changes no transition time, start time or IP: the restarted
    // pod-sync starts from the API server's copy (upstream would stamp new times).
    let before = api_pod(&pods, &name).await.unwrap();
    let times = |p: &Value| {
        let mut t: Vec<(String, String)> = p["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                (
                    c["type"].as_str().unwrap_or_default().to_string(),
                    c["lastTransitionTime"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                )
            })
            .collect();
        t.sort();
        (
            t,
            p["status"]["startTime"].clone(),
            p["status"]["podIP"].clone(),
        )
    };
    node.signal(Service::PodSync, Signal::SIGKILL).await;
    node.spawn(Service::PodSync);
    let served = eventually(
        "the restarted pod-sync serves the pod",
        DEADLINE,
        || async { node.pod("gated").await },
    )
    .await;
    assert_eq!(times(&served), times(&before), "in /pods after the restart");
    assert_eq!(
        times(&api_pod(&pods, &name).await.unwrap()),
        times(&before),
        "in the API server after the restart"
    );

    // Running, then terminated: the API's container state holds the new state only.
    let short = node.pod_name("short");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": short, "namespace": "default"},
        "spec": {
            "nodeName": node.name,
            "restartPolicy": "Never",
            "containers": [{"name": "c", "image": "busybox:1.36", "command": ["sh", "-c", "sleep 2; exit 3"]}]
        }
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    eventually("short seen running", DEADLINE, || async {
        let p = api_pod(&pods, &short).await?;
        if p["status"]["containerStatuses"][0]["state"]["running"].is_object() {
            Ok(())
        } else {
            Err(p["status"].to_string())
        }
    })
    .await;
    let p = eventually("short failed", DEADLINE, || async {
        let p = api_pod(&pods, &short).await?;
        if p["status"]["phase"] == "Failed" {
            Ok(p)
        } else {
            Err(p["status"].to_string())
        }
    })
    .await;
    let state = &p["status"]["containerStatuses"][0]["state"];
    assert_eq!(
        state
            .as_object()
            .map(|s| s.keys().cloned().collect::<Vec<_>>()),
        Some(vec!["terminated".to_string()]),
        "{state}"
    );
    assert_eq!(state["terminated"]["exitCode"], 3);

    // Two containers, one of which ends: the API's list still holds both, whole. The
    // container status lists are atomic upstream (types.go gives them no patch strategy),
    // so the API server replaces them with what a patch holds, and a patch must carry the
    // whole list, as upstream's CreateTwoWayMergePatch does.
    let pair = node.pod_name("pair");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": pair, "namespace": "default"},
        "spec": {
            "nodeName": node.name,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {"name": "a", "image": "busybox:1.36",
                 "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.2; done"]},
                {"name": "b", "image": "busybox:1.36", "command": ["sh", "-c", "sleep 2; exit 0"]}
            ]
        }
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let p = eventually("b ended, a still listed running", DEADLINE, || async {
        let p = api_pod(&pods, &pair).await?;
        let statuses = p["status"]["containerStatuses"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let state = |n: &str| {
            statuses
                .iter()
                .find(|c| c["name"] == n)
                .map(|c| c["state"].clone())
        };
        match (state("a"), state("b")) {
            (Some(a), Some(b)) if a["running"].is_object() && b["terminated"].is_object() => Ok(p),
            _ => Err(p["status"].to_string()),
        }
    })
    .await;
    for c in p["status"]["containerStatuses"].as_array().unwrap() {
        assert!(
            c["image"] == "busybox:1.36" && c["imageID"].as_str().is_some_and(|i| !i.is_empty()),
            "a whole status for {}: {c}",
            c["name"]
        );
    }
    assert_eq!(
        p["status"]["containerStatuses"].as_array().unwrap().len(),
        2
    );
    node.stop().await;
}

/// `activeDeadlineSeconds` counts from the pod's `startTime`, as upstream: a pod that never
/// got a sandbox (its config map is missing, so its volumes never mount) still fails with
/// DeadlineExceeded, and its container, never started, is reported terminated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_active_deadline_counts_from_the_start_time_even_without_a_sandbox() {
    if !require_runtime("active deadline") {
        return;
    }
    let (server, node) = Node::start_with_api_server("deadline", NodeOptions::default()).await;
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    let name = node.pod_name("stuck");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node.name,
            "activeDeadlineSeconds": 3,
            "volumes": [{"name": "cfg", "configMap": {"name": "never-created"}}],
            "containers": [{"name": "c", "image": "busybox:1.36", "command": ["true"],
                "volumeMounts": [{"name": "cfg", "mountPath": "/cfg"}]}]
        }
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let p = eventually("Failed with DeadlineExceeded", DEADLINE, || async {
        let p = api_pod(&pods, &name).await?;
        if p["status"]["phase"] == "Failed" {
            Ok(p)
        } else {
            Err(p["status"].to_string())
        }
    })
    .await;
    assert_eq!(p["status"]["reason"], "DeadlineExceeded", "{}", p["status"]);
    // Upstream's TerminatePod (status_manager_test.go TestTerminatePod_DefaultUnknownStatus,
    // "no previous state"): the container that never started is not left waiting in the
    // failed pod; it is terminated, ContainerStatusUnknown, 137.
    let state = eventually("the container terminated", DEADLINE, || async {
        let p = api_pod(&pods, &name).await?;
        let state = p["status"]["containerStatuses"][0]["state"].clone();
        match state["terminated"]["reason"].as_str() {
            Some("ContainerStatusUnknown") => Ok(state),
            _ => Err(p["status"].to_string()),
        }
    })
    .await;
    assert_eq!(state["terminated"]["exitCode"], 137, "{state}");
    assert_eq!(
        state["terminated"]["message"],
        "The container could not be located when the pod was terminated",
        "{state}"
    );
    assert!(
        node.sandboxes().await.is_empty(),
        "no sandbox was ever made"
    );
    node.stop().await;
}

/// A pod deleted while the API server refuses its status writes: the node tears it down,
/// but does not delete it at the API server before that has its terminal phase (upstream's
/// status manager deletes only such a pod, `canBeDeleted`; status_manager_test.go
/// `TestDeletePodBeforeFinished`). What a controller watching the pod sees: it never goes
/// away saying Running, and the object deleted says Succeeded or Failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_pod_goes_at_the_api_server_only_with_its_terminal_phase() {
    if !require_runtime("pod status") {
        return;
    }
    let (server, node) = Node::start_with_api_server("pod-final", NodeOptions::default()).await;
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    let name = node.pod_name("ender");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node.name,
            "terminationGracePeriodSeconds": 2,
            "containers": [{"name": "c", "image": "busybox:1.36",
                "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.2; done"]}]
        }
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    eventually("Running at the API server", DEADLINE, || async {
        let p = api_pod(&pods, &name).await?;
        (p["status"]["phase"] == "Running")
            .then_some(())
            .ok_or_else(|| p["status"].to_string())
    })
    .await;
    let version = pods
        .get(&name)
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let params = WatchParams::default().fields(&format!("metadata.name={name}"));
    let mut watch = pods.watch(&params, &version).await.unwrap().boxed();
    let seen = tokio::spawn(async move {
        let mut phases = Vec::new();
        while let Some(Ok(event)) = watch.next().await {
            match event {
                WatchEvent::Modified(p) => {
                    phases.push(("MODIFIED", p.status.and_then(|s| s.phase)))
                }
                WatchEvent::Deleted(p) => {
                    phases.push(("DELETED", p.status.and_then(|s| s.phase)));
                    break;
                }
                _ => {}
            }
        }
        phases
    });

    // Every status write refused from now on, then the deletion.
    use std::sync::atomic::Ordering::SeqCst;
    server
        .state
        .fail_pod_status_writes
        .store(usize::MAX, SeqCst);
    pods.delete(&name, &DeleteParams::default()).await.unwrap();
    eventually(
        "the container gone, its status refused",
        DEADLINE,
        || async {
            let gone = node.container_id("ender", "c").await.is_none();
            let refused = server.state.failed_pod_status_writes.load(SeqCst);
            (gone && refused > 0)
                .then_some(())
                .ok_or_else(|| format!("container gone: {gone}, refused writes: {refused}"))
        },
    )
    .await;
    consistently(
        "the pod kept at the API server while it cannot say it ended",
        Duration::from_secs(6),
        Duration::from_millis(500),
        || async {
            let p = api_pod(&pods, &name).await?;
            p["metadata"]["deletionTimestamp"]
                .is_string()
                .then_some(())
                .ok_or_else(|| p["metadata"].to_string())
        },
    )
    .await;

    // The API server takes writes again: the terminal phase, then the deletion.
    server.state.fail_pod_status_writes.store(0, SeqCst);
    let phases = tokio::time::timeout(DEADLINE, seen)
        .await
        .expect("the pod deleted at the API server")
        .unwrap();
    let (last, phase) = phases.last().cloned().unwrap();
    assert_eq!(last, "DELETED", "{phases:?}");
    assert!(
        matches!(phase.as_deref(), Some("Succeeded" | "Failed")),
        "deleted saying {phase:?}: {phases:?}"
    );
    node.stop().await;
}
