//! Benchmark: the same pods started and removed through the node agent and directly over
//! CRI, in one run on one containerd, with the agent's memory and CPU per service and
//! pleg's relist time at 100 and 500 pods. Prints a table (ratios included); asserts no
//! timing. Run it with `bash tests/bench/node.sh` (root and the test containerd; it builds
//! and measures the release binaries).
//!
//! Start latencies come from containerd's own timestamps (`created_at`, `started_at`)
//! against the moment the manifest was renamed into the static pod directory (or the first
//! CRI call was made), never from polling. Teardowns are timed until the runtime lists
//! nothing of the pods, polled every 100 ms.

use nodeagent_config::Service;
use nodeagent_cri::Cri;
use nodeagent_cri::api as cri;
use nodeagent_proto::k8s::labels;
use nodeagent_tests::raw_pod::{raw_pod, remove_raw_leftovers, remove_raw_pod};
use nodeagent_tests::{
    Node, NodeOptions, eventually, eventually_every, http_get, require_runtime, rss_kib,
};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Single-pod starts measured each way, one after the other.
const SINGLE: usize = 30;
const BURST: usize = 100;
/// The CRI namespace of the raw pods.
const RAW_NS: &str = "bench-raw";
const RELIST_PODS: usize = 500;
/// PID 1 exits on SIGTERM (a trap, then `wait` returns at once).
pub(crate) const EXITS_ON_TERM: &str = "trap 'exit 0' TERM; sleep 3600 & wait";
/// PID 1 without a handler: SIGTERM is ignored, the grace period runs out.
const IGNORES_TERM: &str = "sleep 3600";

pub(crate) fn now_nanos() -> i64 {
    nodeagent_cri::now_nanos()
}

pub(crate) fn ms(nanos: i64) -> f64 {
    nanos as f64 / 1e6
}

pub(crate) fn percentile(values: &[f64], p: f64) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)]
}

/// A static pod of one busybox container running `script`, with exec readiness and
/// liveness probes when `probes`. The probes begin 30 s after the container starts, so
/// that a burst of starts compares the same work through the agent and over raw CRI
/// (which probes nothing); the steady state after it has 200 probes running.
pub(crate) fn manifest(name: &str, script: &str, probes: bool) -> String {
    let probe = |kind: &str| {
        format!(
            ",\"{kind}\": {{\"exec\": {{\"command\": [\"true\"]}}, \"periodSeconds\": 10, \"initialDelaySeconds\": 30}}"
        )
    };
    let probes = if probes {
        format!("{}{}", probe("readinessProbe"), probe("livenessProbe"))
    } else {
        String::new()
    };
    format!(
        "{{\"apiVersion\": \"v1\", \"kind\": \"Pod\", \"metadata\": {{\"name\": \"{name}\"}}, \
         \"spec\": {{\"terminationGracePeriodSeconds\": 1, \"containers\": [{{\"name\": \"c\", \
         \"image\": \"busybox:1.36\", \"command\": [\"sh\", \"-c\", \"{script}\"]{probes}}}]}}}}"
    )
}

/// Writes a manifest beside the static pod directory, then renames it in: the agent sees
/// one complete file. Returns the rename's time.
pub(crate) fn rename_in(node: &Node, name: &str, text: &str) -> i64 {
    let staged = node.path(&format!("{name}.json"));
    std::fs::write(&staged, text).unwrap();
    let t = now_nanos();
    std::fs::rename(&staged, node.path(&format!("manifests/{name}.json"))).unwrap();
    t
}

/// (sandbox created_at, container started_at) of a pod, once its container started.
pub(crate) async fn started(cri: &Cri, sandbox: &str, container: &str) -> (i64, i64) {
    let sb = cri.sandbox_status(sandbox).await.expect("PodSandboxStatus");
    let c = cri
        .container_status(container)
        .await
        .expect("ContainerStatus")
        .status
        .expect("a status");
    (sb.created_at, c.started_at)
}

/// The running containers of this node's pods: (pod full name, sandbox id, container id).
pub(crate) async fn running_containers(node: &Node) -> Vec<(String, String, String)> {
    let running = cri::ContainerState::ContainerRunning as i32;
    node.containers()
        .await
        .into_iter()
        .filter(|c| c.state == running)
        .map(|c| {
            (
                c.labels[labels::POD_NAME].clone(),
                c.pod_sandbox_id.clone(),
                c.id.clone(),
            )
        })
        .collect()
}

/// Polls (100 ms) until the runtime lists no sandbox of this node; the time it took from
/// `since`.
pub(crate) async fn until_no_sandboxes(node: &Node, since: Instant) -> Duration {
    eventually_every(
        "no sandbox of the node left",
        Duration::from_secs(900),
        Duration::from_millis(100),
        || async {
            match node.sandboxes().await.len() {
                0 => Ok(since.elapsed()),
                n => Err(format!("{n} sandboxes")),
            }
        },
    )
    .await
}

/// Waits until `n` of this node's containers run; the latest `started_at` among them.
pub(crate) async fn until_running(node: &Node, n: usize) -> i64 {
    let found = eventually(
        &format!("{n} containers running"),
        Duration::from_secs(900),
        || async {
            let found = running_containers(node).await;
            (found.len() >= n)
                .then_some(found.clone())
                .ok_or_else(|| format!("{} running", found.len()))
        },
    )
    .await;
    let mut latest = 0;
    for (_, sandbox, container) in &found {
        latest = latest.max(started(&node.cri, sandbox, container).await.1);
    }
    latest
}

/// (user + system CPU ticks) of a process.
pub(crate) fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command's closing parenthesis; utime and stime are 14 and 15.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let f: Vec<&str> = rest.split_whitespace().collect();
    f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
}

/// Proportional set size (KiB) of a process.
fn pss_kib(pid: u32) -> Option<u64> {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    rollup
        .lines()
        .find_map(|l| l.strip_prefix("Pss:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// (RSS, PSS) in MiB of every service.
pub(crate) fn memory(node: &Node) -> Vec<(Service, f64, f64)> {
    Service::ALL
        .iter()
        .filter_map(|s| {
            let pid = node.service_pid(*s)?;
            Some((
                *s,
                rss_kib(pid)? as f64 / 1024.0,
                pss_kib(pid)? as f64 / 1024.0,
            ))
        })
        .collect()
}

/// pleg's relist duration (ms) over `samples` successive relists: (p50, max).
pub(crate) async fn relist_ms(node: &Node, samples: usize) -> (f64, f64) {
    let mut seen = Vec::new();
    let mut last = 0;
    for _ in 0..samples {
        let (at, took) = node.next_relist(last).await;
        last = at;
        seen.push(took);
    }
    (
        percentile(&seen, 0.5),
        seen.iter().copied().fold(0.0, f64::max),
    )
}

#[derive(Default)]
pub(crate) struct Table(Vec<(String, String, String, String)>);

impl Table {
    pub(crate) fn row(&mut self, what: &str, raw: String, agent: String, ratio: String) {
        eprintln!("[bench] {what}: raw {raw}, agent {agent} {ratio}");
        self.0.push((what.into(), raw, agent, ratio));
    }

    pub(crate) fn print(&self) {
        println!("\n| measure | raw CRI | node agent | agent − raw, or ratio |");
        println!("|---|---|---|---|");
        for (what, raw, agent, ratio) in &self.0 {
            println!("| {what} | {raw} | {agent} | {ratio} |");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark of about ten minutes: tests/bench/node.sh runs it"]
async fn the_agent_beside_raw_cri() {
    if !require_runtime("node benchmark") {
        return;
    }
    let node = Node::start(
        "bench",
        NodeOptions {
            // Upstream's default relist period, not the tests' 500 ms.
            pleg_relist_period: Some("1s".into()),
            ..Default::default()
        },
    )
    .await;
    for s in Service::ALL {
        node.wait_serving(s).await;
    }
    let mut table = Table::default();
    let logs = node.path("raw-logs");
    let cri = node.cri.clone();
    remove_raw_leftovers(&cri, RAW_NS).await;
    // Idle: pleg has relisted twice since every service served, and /pods answers.
    let (first_relist, _) = node.next_relist(now_nanos()).await;
    node.next_relist(first_relist).await;
    eventually("/pods answers", Duration::from_secs(60), || async {
        match http_get(node.read_only_port, "/pods").await? {
            (200, _) => Ok(()),
            (code, body) => Err(format!("{code}: {body}")),
        }
    })
    .await;
    let idle = memory(&node);

    // One pod at a time: raw CRI, then the agent.
    let (mut raw_sandbox, mut raw_start) = (Vec::new(), Vec::new());
    for i in 0..SINGLE {
        let t0 = now_nanos();
        let pod = raw_pod(
            &cri,
            RAW_NS,
            &format!("single-{i}"),
            EXITS_ON_TERM,
            &logs,
            false,
        )
        .await;
        let (created, started_at) = started(&cri, &pod.0, &pod.1).await;
        raw_sandbox.push(ms(created - t0));
        raw_start.push(ms(started_at - t0));
        remove_raw_pod(&cri, &pod, 1).await;
    }
    let (mut sandbox, mut start, mut shown) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..SINGLE {
        let name = format!("single-{i}");
        let full = node.pod_name(&name);
        let t0 = rename_in(&node, &name, &manifest(&name, EXITS_ON_TERM, false));
        // /pods, polled every 2 ms: when it first says Running.
        let seen = eventually_every(
            &format!("{full} Running in /pods"),
            Duration::from_secs(60),
            Duration::from_millis(2),
            || async {
                let (code, body) = http_get(node.read_only_port, "/pods").await?;
                let running = code == 200
                    && body.contains(&full)
                    && serde_json::from_str::<serde_json::Value>(&body)
                        .ok()
                        .and_then(|v| {
                            v["items"].as_array()?.iter().find_map(|p| {
                                (p["metadata"]["name"] == full.as_str()
                                    && p["status"]["phase"] == "Running")
                                    .then_some(())
                            })
                        })
                        .is_some();
                running
                    .then(now_nanos)
                    .ok_or_else(|| format!("/pods: {code}"))
            },
        )
        .await;
        let (_, sb, c) = running_containers(&node)
            .await
            .into_iter()
            .find(|(p, _, _)| *p == full)
            .expect("the pod's container");
        let (created, started_at) = started(&cri, &sb, &c).await;
        sandbox.push(ms(created - t0));
        start.push(ms(started_at - t0));
        shown.push(ms(seen - started_at));
        node.remove_manifest(&format!("{name}.json"));
        until_no_sandboxes(&node, Instant::now()).await;
    }
    for (what, raw, agent) in [
        (
            "one pod: manifest in → sandbox created",
            &raw_sandbox,
            &sandbox,
        ),
        (
            "one pod: manifest in → container started",
            &raw_start,
            &start,
        ),
    ] {
        for (p, label) in [(0.5, "p50"), (0.99, "p99")] {
            let (r, a) = (percentile(raw, p), percentile(agent, p));
            table.row(
                &format!("{what}, {label}"),
                format!("{r:.0} ms"),
                format!("{a:.0} ms"),
                format!("+{:.0} ms", a - r),
            );
        }
    }
    table.row(
        "container started → `/pods` says Running, p50 / p99",
        "—".into(),
        format!(
            "{:.0} / {:.0} ms",
            percentile(&shown, 0.5),
            percentile(&shown, 0.99)
        ),
        String::new(),
    );

    // 100 pods at once, then removed at once (their PID 1 exits on SIGTERM; grace 1 s).
    let t0 = now_nanos();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..BURST {
        let (cri, logs) = (cri.clone(), logs.clone());
        tasks.spawn(async move {
            raw_pod(
                &cri,
                RAW_NS,
                &format!("burst-{i}"),
                EXITS_ON_TERM,
                &logs,
                false,
            )
            .await
        });
    }
    let raw_pods: Vec<_> = tasks.join_all().await;
    let mut latest = 0;
    for (sb, c) in &raw_pods {
        latest = latest.max(started(&cri, sb, c).await.1);
    }
    let raw_burst = ms(latest - t0) / 1000.0;
    let t = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for pod in raw_pods {
        let cri = cri.clone();
        tasks.spawn(async move { remove_raw_pod(&cri, &pod, 1).await });
    }
    tasks.join_all().await;
    let raw_teardown = t.elapsed().as_secs_f64();

    let mut first = None;
    for i in 0..BURST {
        let name = format!("burst-{i}");
        let t = rename_in(&node, &name, &manifest(&name, EXITS_ON_TERM, true));
        first.get_or_insert(t);
    }
    let latest = until_running(&node, BURST).await;
    let agent_burst = ms(latest - first.unwrap()) / 1000.0;
    table.row(
        &format!("{BURST} pods at once → all running"),
        format!("{raw_burst:.1} s"),
        format!("{agent_burst:.1} s"),
        format!("{:.2}×", agent_burst / raw_burst),
    );

    // Steady state with 100 pods and 200 exec probes (every 10 s, from 30 s after each
    // container started): measured once every burst pod is Ready, so every readiness probe
    // has run.
    eventually(
        "every burst pod Ready in /pods",
        Duration::from_secs(300),
        || async {
            let (code, body) = http_get(node.read_only_port, "/pods").await?;
            let v: serde_json::Value =
                serde_json::from_str(&body).map_err(|e| format!("{code}: {e}"))?;
            let ready = v["items"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|p| {
                    p["metadata"]["name"]
                        .as_str()
                        .is_some_and(|n| n.starts_with("burst-"))
                })
                .filter(|p| {
                    p["status"]["conditions"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True")
                })
                .count();
            (ready == BURST)
                .then_some(())
                .ok_or_else(|| format!("{ready} of {BURST} Ready"))
        },
    )
    .await;
    let loaded = memory(&node);
    let pids: Vec<(Service, u32)> = Service::ALL
        .iter()
        .filter_map(|s| Some((*s, node.service_pid(*s)?)))
        .collect();
    let before: Vec<u64> = pids.iter().map(|(_, p)| cpu_ticks(*p)).collect();
    let window = Instant::now();
    let relist_100 = relist_ms(&node, 30).await;
    let seconds = window.elapsed().as_secs_f64();
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    let cpu: Vec<(Service, f64)> = pids
        .iter()
        .zip(before)
        .map(|((s, p), b)| (*s, (cpu_ticks(*p) - b) as f64 / ticks / seconds))
        .collect();

    // 500 pods for pleg: 400 more made directly (with the pod labels, so pleg counts them),
    // pod-sync paused meanwhile so that it does not remove pods no source wants.
    let pod_sync = nix::unistd::Pid::from_raw(node.service_pid(Service::PodSync).unwrap() as i32);
    nix::sys::signal::kill(pod_sync, nix::sys::signal::Signal::SIGSTOP).unwrap();
    // A runtime with 500 pods (and 200 exec probes) answers slowly: a longer call timeout.
    let patient = Cri::connect(
        &node.runtime().endpoint().parse().unwrap(),
        Duration::from_secs(300),
    );
    let mut tasks = tokio::task::JoinSet::new();
    let extra = std::sync::Arc::new(tokio::sync::Semaphore::new(4));
    for i in 0..RELIST_PODS - BURST {
        let (cri, logs, extra) = (patient.clone(), logs.clone(), extra.clone());
        tasks.spawn(async move {
            let _permit = extra.acquire().await.unwrap();
            raw_pod(
                &cri,
                RAW_NS,
                &format!("relist-{i}"),
                IGNORES_TERM,
                &logs,
                true,
            )
            .await
        });
    }
    let made = Instant::now();
    let relist_pods: Vec<_> = tasks.join_all().await;
    eprintln!(
        "[bench] {} more pods made directly in {:.1} s",
        relist_pods.len(),
        made.elapsed().as_secs_f64()
    );
    let relist_500 = relist_ms(&node, 30).await;
    let mut tasks = tokio::task::JoinSet::new();
    for pod in relist_pods {
        let (cri, extra) = (patient.clone(), extra.clone());
        tasks.spawn(async move {
            let _permit = extra.acquire().await.unwrap();
            remove_raw_pod(&cri, &pod, 0).await
        });
    }
    tasks.join_all().await;
    nix::sys::signal::kill(pod_sync, nix::sys::signal::Signal::SIGCONT).unwrap();
    table.row(
        "pleg relist, 100 pods / 500 pods, p50 (max)",
        "—".into(),
        format!(
            "{:.1} ({:.1}) / {:.1} ({:.1}) ms",
            relist_100.0, relist_100.1, relist_500.0, relist_500.1
        ),
        String::new(),
    );

    // The 100 agent pods removed at once.
    let t = Instant::now();
    for i in 0..BURST {
        node.remove_manifest(&format!("burst-{i}.json"));
    }
    let agent_teardown = until_no_sandboxes(&node, t).await.as_secs_f64();
    table.row(
        &format!("{BURST} pods removed → all gone (grace 1 s)"),
        format!("{raw_teardown:.1} s"),
        format!("{agent_teardown:.1} s"),
        format!("{:.2}×", agent_teardown / raw_teardown),
    );

    // 100 pods whose PID 1 ignores SIGTERM: each waits out its grace (1 s).
    for i in 0..BURST {
        let name = format!("deaf-{i}");
        rename_in(&node, &name, &manifest(&name, IGNORES_TERM, false));
    }
    until_running(&node, BURST).await;
    let t = Instant::now();
    for i in 0..BURST {
        node.remove_manifest(&format!("deaf-{i}.json"));
    }
    let deaf = until_no_sandboxes(&node, t).await.as_secs_f64();
    table.row(
        &format!("{BURST} pods whose PID 1 ignores SIGTERM, grace 1 s, removed"),
        "—".into(),
        format!("{deaf:.1} s"),
        String::new(),
    );

    let total = |m: &[(Service, f64, f64)]| {
        (
            m.iter().map(|(_, r, _)| r).sum::<f64>(),
            m.iter().map(|(_, _, p)| p).sum::<f64>(),
        )
    };
    let (idle_rss, idle_pss) = total(&idle);
    let (rss, pss) = total(&loaded);
    table.row(
        "RSS (PSS) of the seven services, 0 pods / 100 pods",
        "—".into(),
        format!("{idle_rss:.1} ({idle_pss:.1}) / {rss:.1} ({pss:.1}) MiB"),
        String::new(),
    );
    table.row(
        "CPU of the seven services, 100 pods, 200 probes",
        "—".into(),
        format!("{:.4} cores", cpu.iter().map(|(_, c)| c).sum::<f64>()),
        String::new(),
    );
    table.print();
    println!(
        "\n| service | RSS 0 pods | PSS 0 pods | RSS 100 pods | PSS 100 pods | CPU, 100 pods |"
    );
    println!("|---|---|---|---|---|---|");
    for s in Service::ALL {
        let at = |m: &[(Service, f64, f64)]| {
            m.iter()
                .find(|(x, _, _)| *x == s)
                .map(|(_, r, p)| (*r, *p))
                .unwrap_or_default()
        };
        let (ir, ip) = at(&idle);
        let (lr, lp) = at(&loaded);
        let c = cpu
            .iter()
            .find(|(x, _)| *x == s)
            .map(|(_, c)| *c)
            .unwrap_or_default();
        println!(
            "| {} | {ir:.1} MiB | {ip:.1} MiB | {lr:.1} MiB | {lp:.1} MiB | {c:.4} cores |",
            s.name()
        );
    }
    node.stop().await;
    remove_raw_leftovers(&cri, RAW_NS).await;
}

/// A span of a pod start's trace: (service, span name, its occurrence in the trace).
type Hop = (String, String, usize);

/// One hop's starts (ms after the rename) and durations (ms), one of each per pod.
struct HopTimes {
    hop: Hop,
    starts: Vec<f64>,
    took: Vec<f64>,
}

/// Where one pod start spends its time, hop by hop, from the OpenTelemetry spans the
/// services export: each static pod is renamed in, waited for (Running in `/pods`), then
/// removed; its trace (rooted at config-source) is cut at the end of the container's
/// StartContainer, and each span's start (after the rename) and duration are printed as
/// medians over the pods.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark of about a minute: tests/bench/node.sh runs it"]
async fn where_a_pod_start_spends_its_time() {
    if !require_runtime("span profile") {
        return;
    }
    const PODS: usize = 15;
    let receiver = nodeagent_tests::otlp::Receiver::default();
    let endpoint = receiver.start().await;
    let node = Node::start(
        "spans",
        NodeOptions {
            pleg_relist_period: Some("1s".into()),
            env: vec![("OTEL_EXPORTER_OTLP_ENDPOINT".into(), endpoint)],
            ..Default::default()
        },
    )
    .await;
    for s in Service::ALL {
        node.wait_serving(s).await;
    }
    let mut renamed = Vec::new();
    for i in 0..PODS {
        let name = format!("traced-{i}");
        let t0 = rename_in(&node, &name, &manifest(&name, EXITS_ON_TERM, false));
        let pod = eventually("the pod running", Duration::from_secs(60), || async {
            let p = node.pod(&name).await?;
            (p["status"]["phase"] == "Running")
                .then_some(p.clone())
                .ok_or_else(|| p["status"].to_string())
        })
        .await;
        renamed.push((pod["metadata"]["uid"].as_str().unwrap().to_string(), t0));
        node.remove_manifest(&format!("{name}.json"));
        until_no_sandboxes(&node, Instant::now()).await;
    }
    // Each pod's trace, up to the end of its StartContainer (the batch exporters send
    // every few seconds).
    let traces = eventually(
        "every pod's trace up to StartContainer",
        Duration::from_secs(60),
        || async {
            let all = receiver.snapshot();
            let mut traces = Vec::new();
            for (uid, t0) in &renamed {
                let root = all
                    .iter()
                    .find(|s| {
                        s.service == "nodeagent-config-source"
                            && s.attribute("k8s.pod.uid") == Some(uid.as_str())
                    })
                    .ok_or_else(|| format!("no root span for {uid}"))?;
                let trace: Vec<_> = all
                    .iter()
                    .filter(|s| s.trace_id == root.trace_id)
                    .cloned()
                    .collect();
                let started = trace
                    .iter()
                    .find(|s| s.name == "runtime.v1.RuntimeService/StartContainer")
                    .ok_or_else(|| format!("no StartContainer in {uid}'s trace yet"))?
                    .end_unix_nanos;
                let mut hops: Vec<_> = trace
                    .into_iter()
                    .filter(|s| s.start_unix_nanos <= started)
                    .collect();
                hops.sort_by_key(|s| s.start_unix_nanos);
                traces.push((*t0, started, hops));
            }
            Ok::<_, String>(traces)
        },
    )
    .await;
    node.stop().await;

    let mut rows: Vec<HopTimes> = Vec::new();
    let mut totals = Vec::new();
    for (t0, started, hops) in &traces {
        totals.push(ms(*started as i64 - t0));
        let mut seen: HashMap<(String, String), usize> = HashMap::new();
        for s in hops {
            let nth = seen.entry((s.service.clone(), s.name.clone())).or_default();
            let key = (s.service.clone(), s.name.clone(), *nth);
            *nth += 1;
            let start = ms(s.start_unix_nanos as i64 - t0);
            let took = ms(s.end_unix_nanos.saturating_sub(s.start_unix_nanos) as i64);
            match rows.iter_mut().find(|r| r.hop == key) {
                Some(row) => {
                    row.starts.push(start);
                    row.took.push(took);
                }
                None => rows.push(HopTimes {
                    hop: key,
                    starts: vec![start],
                    took: vec![took],
                }),
            }
        }
    }
    // Only hops seen in most pods' traces; ordered by when they start.
    rows.retain(|r| r.starts.len() * 2 > traces.len());
    rows.sort_by(|a, b| percentile(&a.starts, 0.5).total_cmp(&percentile(&b.starts, 0.5)));
    println!(
        "\n{PODS} pods, one at a time; manifest renamed in → StartContainer returned: p50 {:.1} ms, p99 {:.1} ms",
        percentile(&totals, 0.5),
        percentile(&totals, 0.99)
    );
    println!(
        "\n| service | span | starts at, p50 (ms after the rename) | takes, p50 (ms) | in pods |"
    );
    println!("|---|---|---|---|---|");
    for HopTimes {
        hop: (service, name, nth),
        starts,
        took,
    } in &rows
    {
        let name = if *nth > 0 {
            format!("{name} (#{})", nth + 1)
        } else {
            name.clone()
        };
        println!(
            "| {} | {name} | {:.1} | {:.1} | {} |",
            service.trim_start_matches("nodeagent-"),
            percentile(starts, 0.5),
            percentile(took, 0.5),
            starts.len()
        );
    }
}
