//! Benchmark (issue 27): a pod created through the API server until it is Ready there,
//! 30 created one after another and 30 created at once, beside the same pods made directly
//! over CRI on the same containerd in the same run. The pods have no nodeName: the test
//! API server's scheduler binds them (on a pod's creation, at once). Prints a table;
//! asserts no timing. Run it with `bash tests/bench/api-pods.sh` (root and the test
//! containerd; it builds and measures the release binaries).
//!
//! Created → Ready is measured as a user's client sees it: from just before the create
//! call to the first look at the API server's copy (every 5 ms) with the Ready condition
//! True. Raw CRI: from the first CRI call to containerd's `started_at` of the container.

use super::node_bench::{EXITS_ON_TERM, Table, ms, now_nanos, percentile, started};
use k8s_openapi::api::core::v1::Pod;
use nodeagent_tests::apiserver::{ApiServer, ApiState};
use nodeagent_tests::apiserver_nodes::condition;
use nodeagent_tests::raw_pod::{raw_pod, remove_raw_leftovers, remove_raw_pod};
use nodeagent_tests::{Node, NodeOptions, eventually, require_runtime};
use std::time::{Duration, Instant};

const PODS: usize = 30;
const RAW_NS: &str = "bench-raw-api";
/// The API pods' namespace (what an interrupted run left is found by it).
const NS: &str = "api-bench";

fn pod(name: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": "busybox:1.36",
                            "command": ["sh", "-c", EXITS_ON_TERM]}],
        },
    }))
    .expect("pod")
}

/// Whether the object's Ready condition is True (a pod's or a node's).
fn is_ready(object: &serde_json::Value) -> bool {
    condition(object, "Ready").is_some_and(|c| c["status"] == "True")
}

fn ready(state: &ApiState, name: &str) -> bool {
    state.object("pods", NS, name).is_some_and(|p| is_ready(&p))
}

/// Waits until every pod of `names` is Ready; returns each one's time since `created[i]`.
async fn until_ready(state: &ApiState, names: &[String], created: &[Instant]) -> Vec<f64> {
    let mut done: Vec<Option<f64>> = vec![None; names.len()];
    let deadline = Instant::now() + Duration::from_secs(300);
    while done.iter().any(Option::is_none) {
        assert!(
            Instant::now() < deadline,
            "pods not Ready in 300 s: {done:?}"
        );
        for (i, name) in names.iter().enumerate() {
            if done[i].is_none() && ready(state, name) {
                done[i] = Some(created[i].elapsed().as_secs_f64() * 1000.0);
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    done.into_iter().flatten().collect()
}

fn row(table: &mut Table, what: &str, raw: &[f64], agent: &[f64]) {
    for (p, label) in [(0.5, "p50"), (0.99, "p99")] {
        let (r, a) = (percentile(raw, p), percentile(agent, p));
        table.row(
            &format!("{what}, {label}"),
            format!("{r:.0} ms"),
            format!("{a:.0} ms"),
            format!("{:+.0} ms, {:.2}×", a - r, a / r),
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark of about two minutes: tests/bench/api-pods.sh runs it"]
async fn api_pod_created_to_ready() {
    if !require_runtime("API pod benchmark") {
        return;
    }
    let state = ApiState::default();
    state.cluster.enable(None);
    let server = ApiServer::start(state.clone(), 0).await;
    let node = Node::start(
        "apibench",
        NodeOptions {
            kubeconfig: Some(server.kubeconfig()),
            // Upstream's default relist period, not the tests' 500 ms.
            pleg_relist_period: Some("1s".into()),
            ..Default::default()
        },
    )
    .await;
    eventually("the node Ready", Duration::from_secs(60), || async {
        let n = state.object("nodes", "", &node.name).ok_or("no node")?;
        is_ready(&n)
            .then_some(())
            .ok_or_else(|| "not Ready".to_string())
    })
    .await;
    let pods: kube::Api<Pod> = kube::Api::namespaced(server.client(), NS);
    let cri = node.cri.clone();
    let logs = node.path("raw-logs");
    remove_raw_leftovers(&cri, RAW_NS).await;
    remove_raw_leftovers(&cri, NS).await;
    let mut table = Table::default();

    // One after another: raw CRI, then through the API server.
    let mut raw_serial = Vec::new();
    for i in 0..PODS {
        let t0 = now_nanos();
        let p = raw_pod(
            &cri,
            RAW_NS,
            &format!("serial-{i}"),
            EXITS_ON_TERM,
            &logs,
            false,
        )
        .await;
        let (_, started_at) = started(&cri, &p.0, &p.1).await;
        raw_serial.push(ms(started_at - t0));
        remove_raw_pod(&cri, &p, 1).await;
    }
    let mut serial = Vec::new();
    for i in 0..PODS {
        let name = format!("serial-{i}");
        let t0 = Instant::now();
        pods.create(&Default::default(), &pod(&name))
            .await
            .expect("create");
        serial.extend(until_ready(&state, &[name], &[t0]).await);
    }
    row(
        &mut table,
        "created → Ready, one at a time",
        &raw_serial,
        &serial,
    );
    for i in 0..PODS {
        let _ = pods
            .delete(&format!("serial-{i}"), &Default::default())
            .await;
    }
    eventually("the serial pods gone", Duration::from_secs(120), || async {
        let mut left = 0;
        for i in 0..PODS {
            left += node
                .runtime_container_ids(NS, &format!("serial-{i}"))
                .await
                .len();
        }
        (left == 0)
            .then_some(())
            .ok_or(format!("{left} containers"))
    })
    .await;

    // At once.
    let t0 = now_nanos();
    let raw = futures::future::join_all((0..PODS).map(|i| {
        let (cri, logs) = (cri.clone(), logs.clone());
        async move {
            let p = raw_pod(
                &cri,
                RAW_NS,
                &format!("burst-{i}"),
                EXITS_ON_TERM,
                &logs,
                false,
            )
            .await;
            let (_, started_at) = started(&cri, &p.0, &p.1).await;
            (p, ms(started_at - t0))
        }
    }))
    .await;
    let raw_burst: Vec<f64> = raw.iter().map(|(_, t)| *t).collect();
    for (p, _) in &raw {
        remove_raw_pod(&cri, p, 1).await;
    }
    let names: Vec<String> = (0..PODS).map(|i| format!("burst-{i}")).collect();
    let created: Vec<Instant> = futures::future::join_all(names.iter().map(|name| {
        let pods = pods.clone();
        async move {
            let t = Instant::now();
            pods.create(&Default::default(), &pod(name))
                .await
                .expect("create");
            t
        }
    }))
    .await;
    let burst = until_ready(&state, &names, &created).await;
    row(
        &mut table,
        &format!("created → Ready, {PODS} at once"),
        &raw_burst,
        &burst,
    );
    table.print();
    for name in &names {
        let _ = pods.delete(name, &Default::default()).await;
    }
    node.stop().await;
    remove_raw_leftovers(&cri, NS).await;
}
