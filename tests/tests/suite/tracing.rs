//! One pod change is one trace: spans from config-source, pod-sync, volume and pleg,
//! correctly parented, exported over OTLP to a real gRPC collector endpoint.

use nodeagent_tests::otlp::{ReceivedSpan, Receiver};
use nodeagent_tests::{Node, NodeOptions, eventually, require_runtime};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_pod_start_is_one_trace_across_the_services() {
    if !require_runtime("one_pod_start_is_one_trace") {
        return;
    }
    let receiver = Receiver::default();
    let endpoint = receiver.start().await;
    let env = vec![("OTEL_EXPORTER_OTLP_ENDPOINT".to_string(), endpoint)];
    let node = Node::start(
        "trace",
        NodeOptions {
            env,
            ..Default::default()
        },
    )
    .await;
    node.write_manifest(
        "traced.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: traced\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: busybox:1.36\n    command: [\"sleep\", \"3600\"]\n    volumeMounts: [{name: scratch, mountPath: /scratch}]\n  volumes:\n  - {name: scratch, emptyDir: {}}\n",
    );
    let pod = eventually("the pod running", Duration::from_secs(60), || async {
        let pod = node.pod("traced").await?;
        if pod["status"]["phase"] == "Running" {
            Ok(pod)
        } else {
            Err(pod["status"].to_string())
        }
    })
    .await;
    let uid = pod["metadata"]["uid"].as_str().unwrap().to_string();

    // The batch exporters send every few seconds.
    let (trace, spans) = eventually("the pod's trace with spans from every service", Duration::from_secs(60), || async {
        let all = receiver.snapshot();
        let root = all
            .iter()
            .find(|s| s.service == "nodeagent-config-source" && s.attribute("k8s.pod.uid") == Some(uid.as_str()))
            .ok_or_else(|| format!("no config-source span for the pod yet ({} spans)", all.len()))?;
        let trace: Vec<ReceivedSpan> = all.iter().filter(|s| s.trace_id == root.trace_id).cloned().collect();
        let services: std::collections::BTreeSet<&str> = trace.iter().map(|s| s.service.as_str()).collect();
        let want = ["nodeagent-config-source", "nodeagent-pod-sync", "nodeagent-volume", "nodeagent-pleg"];
        let has_sandbox = trace.iter().any(|s| s.name == "runtime.v1.RuntimeService/RunPodSandbox");
        if want.iter().all(|w| services.contains(w)) && has_sandbox {
            Ok((root.trace_id.clone(), trace))
        } else {
            let mut seen: Vec<String> = all.iter().map(|s| format!("{}:{}:{}", s.service, s.name, &s.trace_id[..8])).collect();
            seen.sort();
            seen.dedup();
            seen.truncate(40);
            Err(format!("services in the trace so far: {services:?}, RunPodSandbox: {has_sandbox}; all spans: {seen:?}"))
        }
    })
    .await;

    let by_id = |id: &str| spans.iter().find(|s| s.span_id == id);
    // Every span but the root has its parent in the same trace.
    let root = spans
        .iter()
        .find(|s| s.parent_span_id.is_empty() || s.parent_span_id == "0000000000000000")
        .expect("a root span");
    assert_eq!(
        root.service, "nodeagent-config-source",
        "the trace starts where the change was seen: {root:?}"
    );
    for s in &spans {
        if s.span_id != root.span_id {
            assert!(
                by_id(&s.parent_span_id).is_some(),
                "span {} ({}) has no parent in trace {trace}",
                s.name,
                s.service
            );
        }
    }
    // The CRI RunPodSandbox span sits under pod-sync's sync span.
    let sandbox = spans
        .iter()
        .find(|s| s.name == "runtime.v1.RuntimeService/RunPodSandbox")
        .unwrap();
    let parent = by_id(&sandbox.parent_span_id).expect("RunPodSandbox's parent");
    assert_eq!(
        (parent.service.as_str(), parent.name.as_str()),
        ("nodeagent-pod-sync", "sync_pod")
    );
    assert_eq!(parent.attribute("k8s.pod.uid"), Some(uid.as_str()));
    assert_eq!(sandbox.attribute("rpc.system"), Some("grpc"));
    assert_eq!(
        sandbox.attribute("rpc.service"),
        Some("runtime.v1.RuntimeService")
    );
    assert_eq!(sandbox.attribute("rpc.method"), Some("RunPodSandbox"));
    // volume's server span is a child of pod-sync's client call.
    let volume = spans
        .iter()
        .find(|s| s.service == "nodeagent-volume" && s.name == "kubelet.v1.Volume/EnsurePodVolumes")
        .expect("volume server span");
    let caller = by_id(&volume.parent_span_id).expect("its caller");
    assert_eq!(caller.service, "nodeagent-pod-sync");
    assert_eq!(caller.name, "kubelet.v1.Volume/EnsurePodVolumes");
    node.stop().await;
}
