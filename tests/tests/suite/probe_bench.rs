//! Benchmark: the probe service's CPU with 100 pods × 2 probes (an httpGet readiness probe
//! and a tcpSocket liveness probe, `periodSeconds: 1`), beside the same 200 checks a second
//! made directly from one thread of this process with the same HTTP client library. Prints
//! a table with the ratio; asserts no timing.
//! Run it with `bash tests/bench/probe-cpu.sh` (root and the test containerd).

use k8s_openapi::api::core::v1::HTTPGetAction;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use nodeagent_config::Service;
use nodeagent_tests::{Node, NodeOptions, eventually, require_runtime};
use std::time::{Duration, Instant};

const PODS: usize = 100;
const WINDOW: Duration = Duration::from_secs(60);

/// Clock ticks per second of /proc's utime and stime (USER_HZ, 100 on Linux).
const TICKS: f64 = 100.0;

/// utime + stime, in seconds, of the /proc stat file at `path`.
fn cpu_seconds(path: &str) -> f64 {
    let stat = std::fs::read_to_string(path).unwrap_or_default();
    // Fields after the command (which may hold spaces) start after the last ')'.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of stat; 12 and 13 after ") state".
    (ticks(11) + ticks(12)) / TICKS
}

/// The same checks the probe service makes, from one thread with its own runtime: every
/// second one HTTP GET and one TCP connect per pod. Returns that thread's CPU seconds.
fn direct_checks(ips: Vec<String>, window: Duration) -> f64 {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let before = cpu_seconds("/proc/thread-self/stat");
    rt.block_on(async {
        let action = HTTPGetAction {
            path: Some("/etc/hostname".into()),
            port: IntOrString::Int(8080),
            ..Default::default()
        };
        let started = Instant::now();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        while started.elapsed() < window {
            tick.tick().await;
            let checks = ips.iter().map(|ip| {
                let action = action.clone();
                async move {
                    let timeout = Duration::from_secs(1);
                    let _ = nodeagent_cri::http_probe::http_probe(&action, ip, 8080, timeout).await;
                    let _ = tokio::time::timeout(
                        timeout,
                        tokio::net::TcpStream::connect((ip.as_str(), 8080)),
                    )
                    .await;
                }
            });
            futures::future::join_all(checks).await;
        }
    });
    cpu_seconds("/proc/thread-self/stat") - before
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "a benchmark of several minutes: tests/bench/probe-cpu.sh runs it"]
async fn probe_cpu_at_100_pods_with_2_probes_each() {
    if !require_runtime("probe benchmark") {
        return;
    }
    let node = Node::start("probe_bench", NodeOptions::default()).await;
    for i in 0..PODS {
        node.write_manifest(
            &format!("p{i}.yaml"),
            &format!(
                "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p{i}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: web\n    image: busybox:1.36\n    command: [\"httpd\", \"-f\", \"-p\", \"8080\", \"-h\", \"/\"]\n    readinessProbe:\n      httpGet: {{path: /etc/hostname, port: 8080}}\n      periodSeconds: 1\n    livenessProbe:\n      tcpSocket: {{port: 8080}}\n      periodSeconds: 1\n"
            ),
        );
    }
    let started = Instant::now();
    let ips: Vec<String> = eventually("100 pods ready", Duration::from_secs(600), || async {
        let pods = node.pods().await?;
        let ready: Vec<String> = pods
            .iter()
            .filter(|p| {
                p["status"]["conditions"].as_array().is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True")
                })
            })
            .filter_map(|p| p["status"]["podIP"].as_str().map(String::from))
            .collect();
        if ready.len() >= PODS {
            Ok(ready)
        } else {
            Err(format!("{} ready", ready.len()))
        }
    })
    .await;
    eprintln!("{PODS} pods ready after {:?}", started.elapsed());
    let pid = node
        .service_pid(Service::Probe)
        .expect("the probe service's pid");
    let stat = format!("/proc/{pid}/stat");
    let before = cpu_seconds(&stat);
    let measured = Instant::now();
    tokio::time::sleep(WINDOW).await;
    let probe_cpu = (cpu_seconds(&stat) - before) / measured.elapsed().as_secs_f64();
    let rss = nodeagent_tests::rss_kib(pid).unwrap_or(0);
    let direct = tokio::task::spawn_blocking(move || direct_checks(ips, WINDOW))
        .await
        .unwrap()
        / WINDOW.as_secs_f64();
    let checks_per_second = (2 * PODS) as f64;
    println!("\nprobe service, {PODS} pods × 2 probes at periodSeconds 1 ({WINDOW:?} each):");
    println!("| measure | probe service | direct, one thread | ratio |");
    println!("|---|---|---|---|");
    println!(
        "| CPU (cores) | {probe_cpu:.4} | {direct:.4} | {:.2} |",
        probe_cpu / direct.max(1e-9)
    );
    println!(
        "| CPU per check (µs) | {:.0} | {:.0} | |",
        probe_cpu / checks_per_second * 1e6,
        direct / checks_per_second * 1e6
    );
    println!(
        "| probe service RSS (MiB) | {:.1} | | |",
        rss as f64 / 1024.0
    );
    node.stop().await;
}
