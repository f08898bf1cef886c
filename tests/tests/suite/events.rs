//! The kubelet's events, as `kubectl describe pod` shows them, posted by pod-sync and
//! probe to the test API server for a real pod on the real containerd: Pulled (image
//! already present), Created, Started, Unhealthy from a failing liveness probe (one Event
//! whose `count` grows, not one Event per failure), Killing with upstream's liveness
//! message, BackOff for the restart that follows, ErrImageNeverPull with `Error:
//! ErrImageNeverPull`, and Killing "Stopping container" on deletion. Each names its
//! container by `fieldPath` and comes from the `kubelet` component on this node;
//! `/metrics` counts them.

use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use nodeagent_tests::{Node, NodeOptions, eventually, require_runtime};
use serde_json::json;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(90);

/// The events about pod `name`, as (reason, fieldPath, message, count, type).
async fn events_of(
    events: &Api<Event>,
    name: &str,
) -> Result<Vec<(String, String, String, i32, String)>, String> {
    let list = events
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?;
    Ok(list
        .items
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(name))
        .map(|e| {
            (
                e.reason.unwrap_or_default(),
                e.involved_object.field_path.unwrap_or_default(),
                e.message.unwrap_or_default(),
                e.count.unwrap_or_default(),
                e.type_.unwrap_or_default(),
            )
        })
        .collect())
}

/// Waits until pod `name` has an event with `reason` whose message satisfies `message`;
/// returns (fieldPath, message, count, type).
async fn wait_event(
    events: &Api<Event>,
    name: &str,
    reason: &str,
    message: impl Fn(&str) -> bool,
) -> (String, String, i32, String) {
    let message = &message;
    eventually(&format!("{reason} event of {name}"), DEADLINE, || async {
        let all = events_of(events, name).await?;
        all.iter()
            .find(|e| e.0 == reason && message(&e.2))
            .map(|e| (e.1.clone(), e.2.clone(), e.3, e.4.clone()))
            .ok_or_else(|| format!("{all:?}"))
    })
    .await
}

/// Creates pod `name` on the node with these containers and a grace period of 1 s.
async fn create(pods: &Api<Pod>, node: &Node, name: &str, containers: serde_json::Value) {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": node.name, "terminationGracePeriodSeconds": 1, "containers": containers}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_events_for_a_pods_life() {
    if !require_runtime("events") {
        return;
    }
    let (server, node) = Node::start_with_api_server("events", NodeOptions::default()).await;
    let client = server.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let name = node.pod_name("sick");
    create(
        &pods,
        &node,
        &name,
        json!([{"name": "app", "image": "busybox:1.36", "imagePullPolicy": "IfNotPresent",
            "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.2; done"],
            "livenessProbe": {"exec": {"command": ["test", "-f", "/tmp/never"]},
                              "periodSeconds": 1, "failureThreshold": 3}}]),
    )
    .await;

    let app = "spec.containers{app}";
    let (path, _, _, ty) = wait_event(&events, &name, "Pulled", |m| {
        m == "Container image \"busybox:1.36\" already present on machine"
    })
    .await;
    assert_eq!((path.as_str(), ty.as_str()), (app, "Normal"));
    let (path, _, _, _) =
        wait_event(&events, &name, "Created", |m| m == "Created container: app").await;
    assert_eq!(path, app);
    wait_event(&events, &name, "Started", |m| m == "Started container app").await;

    // A failing liveness probe: Unhealthy on each failure, one Event with a growing count.
    // Its message is upstream's "%s probe failed: %s" with the exec's output, raw and here
    // empty (pkg/kubelet/prober/prober.go; pkg/probe/exec/exec.go returns the output as
    // the message, whatever the exit code).
    let (path, message, _, ty) = wait_event(&events, &name, "Unhealthy", |m| {
        m == "Liveness probe failed: "
    })
    .await;
    assert_eq!((path.as_str(), ty.as_str()), (app, "Warning"), "{message}");
    let (_, _, count, _) = wait_event(&events, &name, "Unhealthy", |_| true).await;
    let (_, _, later, _) = {
        let events = &events;
        let name = &name;
        eventually(
            "the Unhealthy event's count grows",
            DEADLINE,
            || async move {
                let all = events_of(events, name).await?;
                let unhealthy: Vec<_> = all.iter().filter(|e| e.0 == "Unhealthy").collect();
                match unhealthy.as_slice() {
                    [one] if one.3 >= count + 2 => {
                        Ok((one.1.clone(), one.2.clone(), one.3, one.4.clone()))
                    }
                    other => Err(format!("{other:?}")),
                }
            },
        )
        .await
    };
    assert!(later >= count + 2);
    wait_event(&events, &name, "Killing", |m| {
        m == "Container app failed liveness probe, will be restarted"
    })
    .await;

    // An image that may not be pulled and is not there (another pod: each pod may burst
    // 25 events, as upstream's spam filter allows, and this one retries at every sync).
    let absent = node.pod_name("absent");
    create(
        &pods,
        &node,
        &absent,
        json!([{"name": "absent", "image": "nodeagent.invalid/absent:1",
            "imagePullPolicy": "Never", "command": ["true"]}]),
    )
    .await;
    let (path, _, _, ty) = wait_event(&events, &absent, "ErrImageNeverPull", |m| {
        m == "Container image \"nodeagent.invalid/absent:1\" is not present with pull policy of Never"
    })
    .await;
    assert_eq!(
        (path.as_str(), ty.as_str()),
        ("spec.containers{absent}", "Warning")
    );
    wait_event(&events, &absent, "Failed", |m| {
        m == "Error: ErrImageNeverPull"
    })
    .await;

    // Every event comes from the kubelet on this node.
    let list = events.list(&ListParams::default()).await.unwrap();
    for e in list
        .items
        .iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(&name))
    {
        let source = e.source.clone().unwrap_or_default();
        assert_eq!(source.component.as_deref(), Some("kubelet"), "{e:?}");
        assert_eq!(source.host.as_deref(), Some(node.name.as_str()), "{e:?}");
        assert_eq!(e.involved_object.kind.as_deref(), Some("Pod"));
    }

    // The killed container exited; its restart waits out the crash-loop back-off.
    wait_event(&events, &name, "BackOff", |m| {
        m.starts_with(&format!(
            "Back-off restarting failed container app in pod {name}_default("
        ))
    })
    .await;

    // Deletion of a pod whose container runs: Killing "Stopping container c".
    let calm = node.pod_name("calm");
    create(
        &pods,
        &node,
        &calm,
        json!([{"name": "c", "image": "busybox:1.36",
            "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.2; done"]}]),
    )
    .await;
    wait_event(&events, &calm, "Started", |m| m == "Started container c").await;
    pods.delete(&calm, &DeleteParams::default()).await.unwrap();
    wait_event(&events, &calm, "Killing", |m| m == "Stopping container c").await;

    // /metrics counts what was posted.
    eventually("events counted in /metrics", DEADLINE, || async {
        let body = node.api.get("/metrics").await?.text();
        let posted = |reason: &str| {
            body.lines().any(|l| {
                l.starts_with("nodeagent_events_total{")
                    && l.contains(&format!("reason=\"{reason}\""))
                    && l.contains("outcome=\"posted\"")
            })
        };
        if posted("Started") && posted("Unhealthy") && posted("Killing") {
            Ok(())
        } else {
            Err(body
                .lines()
                .filter(|l| l.starts_with("nodeagent_events"))
                .collect::<Vec<_>>()
                .join("\n"))
        }
    })
    .await;
    node.stop().await;
}
