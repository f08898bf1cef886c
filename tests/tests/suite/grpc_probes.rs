//! gRPC probes (`grpc.health.v1`) against a real container: a test image (busybox plus
//! `nodeagent-test-grpc-health`, served by the test registry and pulled by the real
//! containerd) whose service `app` turns NOT_SERVING while `/tmp/app-unhealthy` exists.
//! A passing gRPC liveness probe never restarts the container, a gRPC readiness probe
//! with a `service` name follows that service both ways, and a gRPC probe on a port
//! nothing serves fails with upstream's message and restarts its container.

use crate::prom;

use nodeagent_config::Service;
use nodeagent_tests::registry::{Image, Registry, nonce, remove_images};
use nodeagent_tests::{Node, NodeOptions, container_status, eventually, require_runtime};
use serde_json::Value;
use std::path::Path;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(90);
const REPOSITORY: &str = "test/grpc-health";

/// (ready, restartCount, container id) of container `c`.
fn state(pod: &Value, c: &str) -> (Option<bool>, i64, String) {
    let s = container_status(pod, c);
    (
        s.and_then(|s| s["ready"].as_bool()),
        s.and_then(|s| s["restartCount"].as_i64()).unwrap_or(-1),
        s.and_then(|s| s["containerID"].as_str())
            .unwrap_or_default()
            .to_string(),
    )
}

/// How many liveness probes of container `c` of `pod` succeeded, from `/metrics/probes`.
async fn successful_liveness_probes(node: &Node, pod: &str, c: &str) -> Result<f64, String> {
    let reply = node.api.get("/metrics/probes").await?;
    let families = prom::parse(&reply.text())?;
    Ok(families
        .get("prober_probe_total")
        .map(|f| {
            f.samples
                .iter()
                .filter(|s| {
                    s.labels.get("pod").map(String::as_str) == Some(pod)
                        && s.labels.get("container").map(String::as_str) == Some(c)
                        && s.labels.get("probe_type").map(String::as_str) == Some("Liveness")
                        && s.labels.get("result").map(String::as_str) == Some("successful")
                })
                .map(|s| s.value)
                .sum()
        })
        .unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_liveness_and_readiness_probes_follow_the_health_service() {
    if !require_runtime("gRPC probes") {
        return;
    }
    let server = Path::new(env!("CARGO_BIN_EXE_nodeagent-test-grpc-health"));
    let image = Image::busybox_with(&nonce(), &[(server, "/grpc-health")]);
    let registry = Registry::start(REPOSITORY, &nonce(), image, "", "").await;
    let node = Node::start("grpc-probes", NodeOptions::default()).await;
    remove_images(&node.cri, REPOSITORY).await;
    node.write_manifest(
        "grpc.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata:
  name: grpc
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: server
    image: {image}
    imagePullPolicy: IfNotPresent
    command: ["/grpc-health", "9090"]
    livenessProbe:
      grpc:
        port: 9090
      periodSeconds: 1
      failureThreshold: 1
    readinessProbe:
      grpc:
        port: 9090
        service: app
      periodSeconds: 1
      failureThreshold: 1
"#,
            image = registry.image_ref()
        ),
    );
    let pod_name = node.pod_name("grpc");
    // Ready: the readiness probe asked for service "app" and got SERVING.
    let first = eventually("the gRPC server ready", DEADLINE, || async {
        let pod = node.pod("grpc").await?;
        match state(&pod, "server") {
            (Some(true), _, id) => Ok(id),
            _ => Err(pod["status"].to_string()),
        }
    })
    .await;
    // The liveness probe passes again and again; the container is never restarted.
    eventually("five successful gRPC liveness probes", DEADLINE, || async {
        let n = successful_liveness_probes(&node, &pod_name, "server").await?;
        if n >= 5.0 {
            Ok(())
        } else {
            Err(format!("{n} so far"))
        }
    })
    .await;
    let pod = node.pod("grpc").await.unwrap();
    assert_eq!(
        state(&pod, "server"),
        (Some(true), 0, first.clone()),
        "{pod}"
    );

    // Service "app" goes NOT_SERVING: not ready, and still not restarted ("" serves).
    let id = first.split("://").nth(1).unwrap().to_string();
    node.exec(&id, &["touch", "/tmp/app-unhealthy"])
        .await
        .expect("exec touch");
    eventually("not ready while app is NOT_SERVING", DEADLINE, || async {
        let pod = node.pod("grpc").await?;
        match state(&pod, "server") {
            (Some(false), 0, id) if id == first => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let probe_log = node.log(Service::Probe);
    assert!(
        probe_log.contains(r#"service unhealthy (responded with \"NOT_SERVING\")"#)
            || probe_log.contains(r#"service unhealthy (responded with "NOT_SERVING")"#),
        "upstream's message in the probe log: {probe_log}"
    );
    node.exec(&id, &["rm", "/tmp/app-unhealthy"])
        .await
        .expect("exec rm");
    eventually("ready again", DEADLINE, || async {
        let pod = node.pod("grpc").await?;
        match state(&pod, "server") {
            (Some(true), 0, id) if id == first => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;

    // A gRPC liveness probe on a port nothing serves fails and restarts its container.
    node.write_manifest(
        "refused.yaml",
        r#"apiVersion: v1
kind: Pod
metadata:
  name: refused
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: busybox:1.36
    command: ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.2; done"]
    livenessProbe:
      grpc:
        port: 9999
      periodSeconds: 1
      failureThreshold: 1
"#,
    );
    eventually(
        "the refused pod's container restarted",
        DEADLINE,
        || async {
            let pod = node.pod("refused").await?;
            match state(&pod, "c") {
                (_, n, _) if n >= 1 => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    let probe_log = node.log(Service::Probe);
    assert!(
        probe_log.contains("error: failed to connect service at"),
        "upstream's message in the probe log: {probe_log}"
    );
    // The gRPC server's pod was untouched by all of this.
    let pod = node.pod("grpc").await.unwrap();
    assert_eq!(state(&pod, "server"), (Some(true), 0, first), "{pod}");
    let cri = node.cri.clone();
    node.stop().await;
    remove_images(&cri, REPOSITORY).await;
}
