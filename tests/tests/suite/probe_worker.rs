//! The probe worker as upstream's (`pkg/kubelet/prober/worker.go`, whose table tests drive
//! `services/probe/src/worker.rs`), shown on the real runtime through what `kubectl
//! describe pod` shows: the Unhealthy events and the restart count.
//!
//! - A liveness probe that failed holds until the new container comes: the container being
//!   killed is not probed again (upstream's `onHold`, kubernetes #21751). One Unhealthy per
//!   container, however long its kill takes.
//! - A pod being deleted gets no liveness verdict: its liveness worker says Success once and
//!   ends (upstream: "Pod deletion requested, setting probe result to success"), so a
//!   container whose liveness check fails while it shuts down is neither reported
//!   Unhealthy nor restarted.

use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use nodeagent_tests::{Node, NodeOptions, api_pod, consistently, eventually, require_runtime};
use serde_json::json;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(90);

/// The Unhealthy events' total count for pod `name` (one Event per reason and message,
/// whose `count` grows, as upstream's recorder folds them).
async fn unhealthy(events: &Api<Event>, name: &str) -> Result<(i32, Vec<String>), String> {
    let list = events
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?;
    let mine: Vec<Event> = list
        .items
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(name))
        .filter(|e| e.reason.as_deref() == Some("Unhealthy"))
        .collect();
    Ok((
        mine.iter().map(|e| e.count.unwrap_or(1)).sum(),
        mine.iter()
            .map(|e| e.message.clone().unwrap_or_default())
            .collect(),
    ))
}

/// The restart count of container `c` as the API server has it.
async fn restarts(pods: &Api<Pod>, name: &str) -> Result<i32, String> {
    let pod = pods.get(name).await.map_err(|e| e.to_string())?;
    Ok(pod
        .status
        .and_then(|s| s.container_statuses)
        .and_then(|c| c.into_iter().find(|c| c.name == "c"))
        .map_or(0, |c| c.restart_count))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_liveness_probe_holds_while_its_container_is_killed() {
    if !require_runtime("liveness hold") {
        return;
    }
    let (server, node) = Node::start_with_api_server("liveness-hold", NodeOptions::default()).await;
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    let events: Api<Event> = Api::namespaced(server.client(), "default");
    let name = node.pod_name("hold");
    // Fails at once (threshold 1, every second); the container takes 5 s to stop after
    // SIGTERM, within its 30 s grace period.
    let pod = api_pod(
        &name,
        &node.name,
        json!({"spec": {"terminationGracePeriodSeconds": 30, "containers": [{"name": "c", "image": "busybox:1.36",
            "command": ["sh", "-c", "trap 'sleep 5; exit 0' TERM; while true; do sleep 0.2; done"],
            "livenessProbe": {"exec": {"command": ["test", "-f", "/tmp/never"]},
                              "periodSeconds": 1, "failureThreshold": 1}}]}}),
    );
    pods.create(&PostParams::default(), &pod).await.unwrap();
    // The first container killed and replaced.
    eventually("the first restart", DEADLINE, || async {
        match restarts(&pods, &name).await? {
            n if n >= 1 => Ok(()),
            n => Err(format!("restartCount {n}")),
        }
    })
    .await;
    // Events first, the restart count after: each container counted in the events has
    // been counted in the restarts (or is the one running). Without the hold, the 5 s of
    // each kill add about 5 Unhealthy events per container.
    let (count, messages) = unhealthy(&events, &name).await.unwrap();
    let restarted = restarts(&pods, &name).await.unwrap();
    assert!(
        count >= 1 && count <= restarted + 1,
        "{count} Unhealthy for {restarted} restarts: one per container ({messages:?})"
    );
    assert!(
        messages
            .iter()
            .all(|m| m.starts_with("Liveness probe failed: ")),
        "{messages:?}"
    );
    pods.delete(&name, &DeleteParams::default()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_being_deleted_gets_no_liveness_verdict() {
    if !require_runtime("liveness on deletion") {
        return;
    }
    let (server, node) =
        Node::start_with_api_server("liveness-deletion", NodeOptions::default()).await;
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    let events: Api<Event> = Api::namespaced(server.client(), "default");
    let name = node.pod_name("leaving");
    // Healthy until SIGTERM; then, a second later, its liveness check fails for the 6 s it
    // takes to stop.
    let pod = api_pod(
        &name,
        &node.name,
        json!({"spec": {"terminationGracePeriodSeconds": 30, "containers": [{"name": "c", "image": "busybox:1.36",
            "command": ["sh", "-c",
                "trap 'sleep 1; touch /tmp/leaving; sleep 6; exit 0' TERM; while true; do sleep 0.2; done"],
            "livenessProbe": {"exec": {"command": ["test", "!", "-f", "/tmp/leaving"]},
                              "periodSeconds": 1, "failureThreshold": 1}}]}}),
    );
    pods.create(&PostParams::default(), &pod).await.unwrap();
    eventually("Running, liveness passing", DEADLINE, || async {
        let pod = pods.get(&name).await.map_err(|e| e.to_string())?;
        let running = pod
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c.first())
            .and_then(|c| c.state.as_ref())
            .is_some_and(|s| s.running.is_some());
        // A few liveness runs passed (period 1 s): Running for 3 s.
        let since = pod
            .status
            .as_ref()
            .and_then(|s| s.start_time.as_ref())
            .map(|t| {
                k8s_openapi::jiff::Timestamp::now()
                    .duration_since(t.0)
                    .as_secs()
            })
            .unwrap_or(0);
        (running && since >= 3)
            .then_some(())
            .ok_or_else(|| format!("running {running}, for {since} s"))
    })
    .await;
    pods.delete(&name, &DeleteParams::default()).await.unwrap();
    // The whole shutdown (7 s), and then some: no Unhealthy event, no restart.
    consistently(
        "no liveness verdict while the pod terminates",
        Duration::from_secs(10),
        Duration::from_millis(250),
        || async {
            let (count, messages) = unhealthy(&events, &name).await?;
            if count > 0 {
                return Err(format!("{count} Unhealthy: {messages:?}"));
            }
            match restarts(&pods, &name).await {
                Ok(n) if n > 0 => Err(format!("restarted {n} times")),
                _ => Ok(()),
            }
        },
    )
    .await;
    eventually("the pod gone", DEADLINE, || async {
        match pods.get_opt(&name).await.map_err(|e| e.to_string())? {
            None => Ok(()),
            Some(_) => Err("still there".into()),
        }
    })
    .await;
}
