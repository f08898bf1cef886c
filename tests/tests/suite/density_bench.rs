//! Benchmark (issue 29): density. N pods (500 by default, `BENCH_PODS`) written at once and
//! removed at once through the node agent, beside the same N pods made and removed directly
//! over CRI by a raw client making 4, 8 and 16 calls at a time (`BENCH_RAW_CONCURRENCY`),
//! the best of which is the baseline; then, with the N pods running, what grows with the pod
//! count: pleg's relist against a raw `ListPodSandbox` + `ListContainers`, pod-sync's memory
//! per pod, the `/pods` answer, one new pod's start against the same start on the idle
//! node, and the agent's CPU per pod start. Prints a table; asserts no timing. Run it with
//! `bash tests/bench/node.sh density` (root, the test containerd, the release build).
//!
//! Every pod is one busybox container whose PID 1 exits on SIGTERM, grace 1 s, as in
//! `node_bench`. Start times come from containerd's `started_at` against the first
//! manifest's rename (or the raw client's first call); teardowns are timed until the
//! runtime lists none of the pods, polled every 100 ms.

use super::node_bench::{
    EXITS_ON_TERM, Table, cpu_ticks, manifest, memory, ms, now_nanos, percentile, relist_ms,
    rename_in, running_containers, started, until_no_sandboxes, until_running,
};
use nodeagent_config::Service;
use nodeagent_cri::Cri;
use nodeagent_tests::raw_pod::{raw_pod, remove_leftovers, remove_raw_leftovers, remove_raw_pod};
use nodeagent_tests::{Node, NodeOptions, eventually, http_get, require_runtime};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The CRI namespace of the raw pods.
const RAW_NS: &str = "bench-density";
/// One new pod started this many times, on the idle node and beside the N pods.
const SINGLE: usize = 7;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// N raw pods made with `concurrent` calls at a time, then removed the same way (grace
/// 1 s): (seconds until the last container started, seconds until all were removed).
async fn raw_burst(
    cri: &Cri,
    logs: &std::path::Path,
    pods: usize,
    concurrent: usize,
) -> (f64, f64) {
    let slots = Arc::new(tokio::sync::Semaphore::new(concurrent));
    let t0 = now_nanos();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..pods {
        let (cri, logs, slots) = (cri.clone(), logs.to_path_buf(), slots.clone());
        tasks.spawn(async move {
            let _slot = slots.acquire_owned().await.unwrap();
            raw_pod(
                &cri,
                RAW_NS,
                &format!("c{concurrent}-{i}"),
                EXITS_ON_TERM,
                &logs,
                false,
            )
            .await
        });
    }
    let made: Vec<_> = tasks.join_all().await;
    let mut latest = 0;
    for (sb, c) in &made {
        latest = latest.max(started(cri, sb, c).await.1);
    }
    let up = ms(latest - t0) / 1000.0;
    let t = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for pod in made {
        let (cri, slots) = (cri.clone(), slots.clone());
        tasks.spawn(async move {
            let _slot = slots.acquire_owned().await.unwrap();
            remove_raw_pod(&cri, &pod, 1).await
        });
    }
    tasks.join_all().await;
    (up, t.elapsed().as_secs_f64())
}

/// One pod renamed in, waited for, then removed and waited out: manifest in → container
/// started (ms, containerd's `started_at`).
async fn one_start(node: &Node, name: &str) -> f64 {
    let full = node.pod_name(name);
    let t0 = rename_in(node, name, &manifest(name, EXITS_ON_TERM, false));
    let (sb, c) = eventually(
        &format!("{full}'s container running"),
        Duration::from_secs(120),
        || async {
            running_containers(node)
                .await
                .into_iter()
                .find(|(p, _, _)| *p == full)
                .map(|(_, sb, c)| (sb, c))
                .ok_or_else(|| "not yet".to_string())
        },
    )
    .await;
    let (_, started_at) = started(&node.cri, &sb, &c).await;
    node.remove_manifest(&format!("{name}.json"));
    let gone = || async {
        match running_containers(node)
            .await
            .iter()
            .any(|(p, _, _)| *p == full)
        {
            false => Ok(()),
            true => Err("still running".to_string()),
        }
    };
    eventually(&format!("{full} gone"), Duration::from_secs(120), gone).await;
    ms(started_at - t0)
}

/// p50 of `samples` raw relists: ListPodSandbox then ListContainers, as pleg makes them.
async fn raw_relist_ms(cri: &Cri, samples: usize) -> f64 {
    let mut took = Vec::new();
    for _ in 0..samples {
        let t = Instant::now();
        cri.list_sandboxes(None).await.expect("ListPodSandbox");
        cri.list_containers(None).await.expect("ListContainers");
        took.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    percentile(&took, 0.5)
}

/// p50 of `samples` `/pods` answers on the read-only port (ms) and the answer's size.
async fn pods_answer_ms(node: &Node, samples: usize) -> (f64, usize) {
    let (mut took, mut size) = (Vec::new(), 0);
    for _ in 0..samples {
        let t = Instant::now();
        let (code, body) = http_get(node.read_only_port, "/pods").await.expect("/pods");
        took.push(t.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(code, 200, "{body}");
        size = body.len();
    }
    (percentile(&took, 0.5), size)
}

/// `nodeagent_runtime_call_limit` in the node's `/metrics`.
async fn call_limit(node: &Node) -> String {
    let body = node.api.get("/metrics").await.expect("/metrics").text();
    body.lines()
        .find_map(|l| l.strip_prefix("nodeagent_runtime_call_limit "))
        .unwrap_or("?")
        .to_string()
}

fn services_cpu_ticks(node: &Node) -> u64 {
    Service::ALL
        .iter()
        .filter_map(|s| node.service_pid(*s))
        .map(cpu_ticks)
        .sum()
}

fn pod_sync_pss(node: &Node) -> f64 {
    memory(node)
        .into_iter()
        .find(|(s, _, _)| *s == Service::PodSync)
        .map(|(_, _, pss)| pss)
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark of about ten minutes: tests/bench/node.sh density runs it"]
async fn density_beside_raw_cri() {
    if !require_runtime("density benchmark") {
        return;
    }
    let pods: usize = env_or("BENCH_PODS", 500);
    let concurrencies: Vec<usize> = std::env::var("BENCH_RAW_CONCURRENCY")
        .unwrap_or_else(|_| "4,8,16".into())
        .split(',')
        .filter_map(|c| c.trim().parse().ok())
        .collect();
    // Extra pod-sync flags, to compare settings in one place (`--flag=value ...`).
    let pod_sync_args: Vec<String> = std::env::var("BENCH_POD_SYNC_ARGS")
        .unwrap_or_default()
        .split_whitespace()
        .map(String::from)
        .collect();
    let node = Node::start(
        "density",
        NodeOptions {
            // Upstream's default relist period, not the tests' 500 ms.
            pleg_relist_period: Some("1s".into()),
            service_args: vec![(Service::PodSync, pod_sync_args.clone())],
            // Upstream's default maxPods (110) would refuse the rest: static pods are
            // critical, and preempting one critical pod for another is not done.
            extra_config: format!("maxPods: {}\n", pods + 2 * SINGLE + 10),
            ..Default::default()
        },
    )
    .await;
    for s in Service::ALL {
        node.wait_serving(s).await;
    }
    let cri = node.cri.clone();
    let logs = node.path("raw-logs");
    remove_raw_leftovers(&cri, RAW_NS).await;
    // The pods an interrupted run's node agent left (named `*-density-<node suffix>`).
    remove_leftovers(&cri, |m| m.name.contains("-density-")).await;
    // A runtime with hundreds of pods answers slowly: a longer call timeout for the raw side.
    let patient = Cri::connect(
        &node.runtime().endpoint().parse().unwrap(),
        Duration::from_secs(300),
    );
    let mut table = Table::default();

    // The idle node: one pod's start, and pod-sync's memory.
    let mut idle_start = Vec::new();
    for i in 0..SINGLE {
        idle_start.push(one_start(&node, &format!("idle-{i}")).await);
    }
    let idle_pss = pod_sync_pss(&node);

    // The raw client at each concurrency; the best is the baseline.
    let mut raw = Vec::new();
    for &c in &concurrencies {
        let (up, down) = raw_burst(&patient, &logs, pods, c).await;
        eprintln!("[bench] raw, {c} at a time: {pods} up in {up:.1} s, removed in {down:.1} s");
        table.row(
            &format!("raw client, {c} calls at a time: {pods} up / removed"),
            format!("{up:.1} s / {down:.1} s"),
            "—".into(),
            format!("{:.1} pods/s up", pods as f64 / up),
        );
        raw.push((c, up, down));
    }
    let best_up = raw
        .iter()
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .copied()
        .expect("a raw concurrency");
    let best_down = raw
        .iter()
        .min_by(|a, b| a.2.total_cmp(&b.2))
        .copied()
        .expect("a raw concurrency");

    // The agent: N manifests renamed in at once.
    let cpu_before = services_cpu_ticks(&node);
    let mut first = None;
    for i in 0..pods {
        let name = format!("d-{i}");
        let t = rename_in(&node, &name, &manifest(&name, EXITS_ON_TERM, false));
        first.get_or_insert(t);
    }
    let latest = until_running(&node, pods).await;
    let agent_up = ms(latest - first.unwrap()) / 1000.0;
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    let cpu_per_pod = (services_cpu_ticks(&node) - cpu_before) as f64 / ticks / pods as f64;
    let bound_after_burst = call_limit(&node).await;
    table.row(
        &format!("{pods} pods at once → all running"),
        format!("{:.1} s ({} at a time)", best_up.1, best_up.0),
        format!("{agent_up:.1} s"),
        format!("{:.2}×", agent_up / best_up.1),
    );

    // Beside the N running pods.
    eventually(
        "/pods lists every pod",
        Duration::from_secs(300),
        || async {
            let (code, body) = http_get(node.read_only_port, "/pods").await?;
            let n = serde_json::from_str::<serde_json::Value>(&body)
                .map_err(|e| format!("{code}: {e}"))?["items"]
                .as_array()
                .map(|a| a.len())
                .unwrap_or(0);
            (n >= pods).then_some(()).ok_or(format!("{n} listed"))
        },
    )
    .await;
    let pss = pod_sync_pss(&node);
    let relist = relist_ms(&node, 10).await;
    let raw_relist = raw_relist_ms(&patient, 10).await;
    let (answer, size) = pods_answer_ms(&node, 10).await;
    let mut busy_start = Vec::new();
    for i in 0..SINGLE {
        busy_start.push(one_start(&node, &format!("busy-{i}")).await);
    }

    // The agent: the N manifests removed at once.
    let t = Instant::now();
    for i in 0..pods {
        node.remove_manifest(&format!("d-{i}.json"));
    }
    let agent_down = until_no_sandboxes(&node, t).await.as_secs_f64();
    let bound_after_teardown = call_limit(&node).await;
    table.row(
        "pod-sync's bound on expensive runtime calls after the burst / the teardown",
        "—".into(),
        format!("{bound_after_burst} / {bound_after_teardown}"),
        String::new(),
    );
    table.row(
        &format!("{pods} pods removed → all gone (grace 1 s)"),
        format!("{:.1} s ({} at a time)", best_down.2, best_down.0),
        format!("{agent_down:.1} s"),
        format!("{:.2}×", agent_down / best_down.2),
    );
    let (idle_p50, busy_p50) = (percentile(&idle_start, 0.5), percentile(&busy_start, 0.5));
    table.row(
        &format!("one new pod: manifest in → container started, p50, idle / beside {pods}"),
        "—".into(),
        format!("{idle_p50:.0} / {busy_p50:.0} ms"),
        format!("+{:.0} ms", busy_p50 - idle_p50),
    );
    table.row(
        &format!("relist at {pods} pods, p50 (pleg: max)"),
        format!("{raw_relist:.1} ms"),
        format!("{:.1} ({:.1}) ms", relist.0, relist.1),
        format!("{:.2}×", relist.0 / raw_relist),
    );
    table.row(
        &format!("pod-sync PSS, idle / {pods} pods (per pod)"),
        "—".into(),
        format!(
            "{idle_pss:.1} / {pss:.1} MiB ({:.0} KiB)",
            (pss - idle_pss) * 1024.0 / pods as f64
        ),
        String::new(),
    );
    table.row(
        &format!("`/pods` answer at {pods} pods, p50 (size)"),
        "—".into(),
        format!("{answer:.1} ms ({:.1} MB)", size as f64 / 1e6),
        String::new(),
    );
    table.row(
        "CPU of the seven services per pod start (burst)",
        "—".into(),
        format!("{:.1} ms", cpu_per_pod * 1000.0),
        String::new(),
    );
    if !pod_sync_args.is_empty() {
        println!("\npod-sync flags: {}", pod_sync_args.join(" "));
    }
    table.print();
    node.stop().await;
    remove_raw_leftovers(&cri, RAW_NS).await;
}
