//! Benchmark: `/stats/summary` latency (p50, p99) on a node running 100 pods, and the
//! resident memory of http-server. Prints numbers, asserts no timing.
//! Run it with `bash tests/bench/stats-summary.sh` (root and the test containerd).

use nodeagent_tests::{Node, NodeOptions, eventually, require_runtime};
use std::time::{Duration, Instant};

const PODS: usize = 100;
const REQUESTS: usize = 200;

/// VmRSS of the node's http-server.
fn http_server_rss_kib(node: &Node) -> Option<u64> {
    nodeagent_tests::rss_kib(node.service_pid(nodeagent_config::Service::HttpServer)?)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "a benchmark of several minutes: tests/bench/stats-summary.sh runs it"]
async fn stats_summary_latency_at_100_pods() {
    if !require_runtime("stats benchmark") {
        return;
    }
    let node = Node::start("stats_bench", NodeOptions::default()).await;
    for i in 0..PODS {
        node.write_manifest(
            &format!("p{i}.yaml"),
            &format!(
                "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p{i}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: busybox:1.36\n    command: [\"sleep\", \"3600\"]\n"
            ),
        );
    }
    let started = Instant::now();
    eventually(
        "100 pods in the summary",
        Duration::from_secs(600),
        || async {
            let r = node.api.get("/stats/summary").await?;
            let s: serde_json::Value =
                serde_json::from_slice(&r.body).map_err(|e| e.to_string())?;
            let n = s["pods"]
                .as_array()
                .map(|p| {
                    p.iter()
                        .filter(|p| p["containers"].as_array().is_some_and(|c| !c.is_empty()))
                        .count()
                })
                .unwrap_or(0);
            (n >= PODS)
                .then_some(())
                .ok_or_else(|| format!("{n} pods running"))
        },
    )
    .await;
    eprintln!("{PODS} pods running after {:?}", started.elapsed());
    let rss_before = http_server_rss_kib(&node);
    let mut latencies = Vec::with_capacity(REQUESTS);
    for _ in 0..REQUESTS {
        let t = Instant::now();
        let r = node.api.get("/stats/summary").await.expect("summary");
        latencies.push(t.elapsed());
        assert_eq!(r.status, 200, "{}", r.text());
    }
    latencies.sort();
    let rss_after = http_server_rss_kib(&node);
    // The same node's runtime, asked directly over CRI for what a summary needs from it:
    // the pods, the containers and their stats (one round, the calls in parallel).
    let mut raw = Vec::with_capacity(REQUESTS);
    for _ in 0..REQUESTS {
        let t = Instant::now();
        let mut runtime = node.cri.runtime.clone();
        let stats = node
            .cri
            .request(nodeagent_cri::api::ListContainerStatsRequest { filter: None });
        let (sandboxes, containers, stats) = tokio::join!(
            node.cri.list_sandboxes(None),
            node.cri.list_containers(None),
            runtime.list_container_stats(stats)
        );
        raw.push(t.elapsed());
        assert!(sandboxes.is_ok() && containers.is_ok() && stats.is_ok());
    }
    raw.sort();
    // A request that does no work: the cost of a new TLS connection and authentication.
    let mut healthz = Vec::with_capacity(REQUESTS);
    for _ in 0..REQUESTS {
        let t = Instant::now();
        let r = node.api.get("/healthz").await.expect("healthz");
        healthz.push(t.elapsed());
        assert_eq!(r.status, 200);
    }
    healthz.sort();
    let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1000.0);
    let ratio = |a: Duration, b: Duration| format!("{:.2}x", a.as_secs_f64() / b.as_secs_f64());
    println!(
        "\n{PODS} pods, {REQUESTS} sequential requests each (a new TLS connection per request)"
    );
    println!("| measure | p50 | p99 | max |");
    println!("|---|---|---|---|");
    for (name, l) in [
        ("GET /stats/summary", &latencies),
        (
            "raw CRI: ListPodSandbox + ListContainers + ListContainerStats",
            &raw,
        ),
        ("GET /healthz (connection + authentication only)", &healthz),
    ] {
        println!(
            "| {name} | {} | {} | {} |",
            ms(percentile(l, 0.5)),
            ms(percentile(l, 0.99)),
            ms(l[l.len() - 1])
        );
    }
    println!(
        "summary / raw CRI at p50: {}",
        ratio(percentile(&latencies, 0.5), percentile(&raw, 0.5))
    );
    println!(
        "http-server RSS: {} KiB before, {} KiB after the requests",
        rss_before.map_or("?".into(), |v| v.to_string()),
        rss_after.map_or("?".into(), |v| v.to_string()),
    );
    node.stop().await;
}
