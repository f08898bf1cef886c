//! The chaos suite: the promise that any service may die at any moment while nothing a user
//! watches changes. CI runs a short fixed-seed run; a long run is
//! `CHAOS_SECONDS=1200 CHAOS_SEED=7 CHAOS_PODS=50 cargo nextest run -p nodeagent-tests
//! --test chaos --no-capture` (see the README).

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use nix::sys::signal::Signal;
use nodeagent_config::Service;
use nodeagent_tests::apiserver::{ApiServer, ApiState};
use nodeagent_tests::chaos::{
    self, ChaosSettings, KILLABLE, Rng, SharedRecords, chaos_pod, converged, leftovers, percentiles,
};
use nodeagent_tests::{Node, NodeOptions, eventually, require_runtime};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How long a view may take to show every wanted pod healthy again after one action.
const CONVERGE: Duration = Duration::from_secs(180);

/// Restarts the node's containerd (one deploy/runtime/setup.sh runs); containers keep
/// running in their shims, as with any containerd restart.
async fn restart_containerd(node: &Node) {
    let deploy = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/runtime");
    let index = node.runtime().index;
    // setup.sh starts the test instances up to NODEAGENT_TEST_RUNTIMES, and stops those
    // beyond it when it is set: never set it lower than what runs (other tests' runtimes).
    let asked = std::env::var("NODEAGENT_TEST_RUNTIMES")
        .ok()
        .and_then(|n| n.parse::<usize>().ok());
    let instances = asked.map(|n| n.max(index)).or((index > 0).then_some(index));
    for (script, arg) in [("stop.sh", index.to_string()), ("setup.sh", String::new())] {
        let mut command = tokio::process::Command::new("bash");
        command
            .arg(format!("{deploy}/{script}"))
            .args((!arg.is_empty()).then_some(arg));
        if let Some(n) = instances {
            command.env("NODEAGENT_TEST_RUNTIMES", n.to_string());
        }
        let out = command.output().await.expect("run the runtime script");
        assert!(
            out.status.success(),
            "{script} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The second http-server instance of the chaos node: the node's API stays up while
/// either instance restarts (never both at once).
const SECOND_HTTP: &str = "2";

/// SIGKILLs `services`, restarts them after a systemd-like delay and, sometimes, kills them
/// again during start-up. An http-server kill hits the two instances in turn.
async fn kill_cycle(
    node: &mut Node,
    rng: &mut Rng,
    services: &[Service],
    kills: &mut BTreeMap<&'static str, u32>,
    records: &SharedRecords,
) {
    let api_kill = || records.lock().unwrap().note_api_kill();
    let mut services = services.to_vec();
    // The two instances' turns alternate, so that both are killed in any run.
    let count = |k: &str| kills.get(k).copied().unwrap_or(0);
    if services.contains(&Service::HttpServer) && count("http-server") > count("http-server-2") {
        services.retain(|s| *s != Service::HttpServer);
        api_kill();
        node.kill_http_server_instance(SECOND_HTTP);
        *kills.entry("http-server-2").or_default() += 1;
        tokio::time::sleep(rng.millis(0, 1000)).await;
        node.spawn_http_server_instance(SECOND_HTTP);
    }
    let services = &services[..];
    let kill = async |node: &mut Node, kills: &mut BTreeMap<&'static str, u32>| {
        for s in services {
            if *s == Service::HttpServer {
                api_kill();
            }
            node.signal(*s, Signal::SIGKILL).await;
            *kills.entry(s.name()).or_default() += 1;
        }
    };
    kill(node, kills).await;
    // These delays are the scenario, not waits for a condition: systemd's RestartSec, and
    // a second kill at a random moment of the start-up.
    tokio::time::sleep(rng.millis(0, 1000)).await;
    for s in services {
        node.spawn(*s);
    }
    if rng.chance(15) {
        tokio::time::sleep(rng.millis(10, 400)).await;
        kill(node, kills).await;
        tokio::time::sleep(Duration::from_millis(100)).await; // systemd's default RestartSec
        for s in services {
            node.spawn(*s);
        }
    }
}

/// One change of the desired pods: create, replace (a new generation) or delete.
fn churn(
    node: &Node,
    rng: &mut Rng,
    records: &SharedRecords,
    settings: &ChaosSettings,
    next_index: &mut usize,
) -> &'static str {
    let host_dir = node.path("host");
    let mut r = records.lock().unwrap();
    // The records use full pod names (static pods get the node's name as a suffix).
    let names: Vec<String> = r.desired.keys().cloned().collect();
    let roll = rng.below(3);
    if roll == 0 || names.len() <= settings.pods / 2 {
        let name = format!("c{next_index}");
        let index = *next_index;
        *next_index += 1;
        r.desired.insert(node.pod_name(&name), 1);
        node.write_manifest(
            &format!("{name}.json"),
            &chaos_pod(&name, index, 1, &host_dir),
        );
        return "create";
    }
    let full = names[rng.below(names.len() as u64) as usize].clone();
    let suffix = format!("-{}", node.name);
    let name = full.strip_suffix(&suffix).unwrap_or(&full).to_string();
    if roll == 1 {
        let generation = r.desired[&full] + 1;
        r.desired.insert(full, generation);
        let index: usize = name[1..].parse().unwrap_or(0);
        let text = chaos_pod(&name, index, generation, &host_dir);
        node.write_manifest(&format!("{name}.json"), &text);
        "replace"
    } else {
        r.desired.remove(&full);
        node.remove_manifest(&format!("{name}.json"));
        "delete"
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_kills_disturb_no_pod_and_flip_no_status() {
    if !require_runtime("chaos") {
        return;
    }
    let settings = ChaosSettings::from_env(90, 24);
    eprintln!("chaos settings: {settings:?}");
    let mut node = Node::start("chaos", NodeOptions::default()).await;
    std::fs::create_dir_all(node.path("host")).unwrap();
    let records = chaos::new_records();
    let mut rng = Rng::new(settings.seed);
    {
        let mut r = records.lock().unwrap();
        for i in 0..settings.pods {
            let name = format!("c{i}");
            r.desired.insert(node.pod_name(&name), 1);
            let text = chaos_pod(&name, i, 1, &node.path("host"));
            node.write_manifest(&format!("{name}.json"), &text);
        }
    }
    node.spawn_http_server_instance(SECOND_HTTP);
    let views = chaos::follow_views(&node, &records, Duration::from_millis(500));
    let started = Instant::now();
    eventually("every pod healthy", Duration::from_secs(600), || {
        converged(&node, &records)
    })
    .await;
    eprintln!(
        "{} pods healthy after {:.1}s",
        settings.pods,
        started.elapsed().as_secs_f64()
    );
    // The API's availability is measured from here: before its first complete status the
    // node has nothing to answer /pods with.
    records.lock().unwrap().reset_availability();
    let mut pids = BTreeMap::new();
    for c in node.containers().await {
        pids.insert(c.id.clone(), chaos::container_pid(&node, &c.id).await);
    }

    let mut kills: BTreeMap<&'static str, u32> = BTreeMap::new();
    let mut recoveries: BTreeMap<&'static str, Vec<Duration>> = BTreeMap::new();
    let mut next_index = settings.pods;
    let mut containerd_restarted = false;
    let run_start = Instant::now();
    let deadline = run_start + Duration::from_secs(settings.seconds);
    while Instant::now() < deadline {
        let action = if !containerd_restarted && run_start.elapsed() * 2 > deadline - run_start {
            containerd_restarted = true;
            restart_containerd(&node).await;
            "containerd restart"
        } else if rng.chance(70) {
            let first = rng.pick(&KILLABLE);
            let mut services = vec![first];
            if rng.chance(20) {
                let second = rng.pick(&KILLABLE);
                if second != first {
                    services.push(second);
                }
            }
            kill_cycle(&mut node, &mut rng, &services, &mut kills, &records).await;
            if services.len() > 1 {
                "kill two"
            } else {
                "kill one"
            }
        } else {
            let op = churn(&node, &mut rng, &records, &settings, &mut next_index);
            if rng.chance(40) {
                tokio::time::sleep(rng.millis(0, 500)).await;
                let s = rng.pick(&KILLABLE);
                kill_cycle(&mut node, &mut rng, &[s], &mut kills, &records).await;
            }
            op
        };
        eprintln!("{:.1}s: {action}", run_start.elapsed().as_secs_f64());
        let t = Instant::now();
        eventually(&format!("convergence after {action}"), CONVERGE, || async {
            converged(&node, &records).await?;
            let second =
                nodeagent_transport::connect(&node.http_server_instance_socket(SECOND_HTTP));
            nodeagent_transport::check_health(second, "", Duration::from_secs(2))
                .await
                .map_err(|e| format!("http-server {SECOND_HTTP} not serving: {e}"))
        })
        .await;
        recoveries.entry(action).or_default().push(t.elapsed());
        tokio::time::sleep(rng.millis(0, 1500)).await;
    }

    // Everything removed is fully gone: no sandbox, container, mount, pod dir, cgroup or log dir.
    let removed: Vec<(String, String)> = {
        let r = records.lock().unwrap();
        let wanted: Vec<String> = r
            .current("stream")
            .into_iter()
            .filter(|p| r.wanted(p))
            .map(|p| p.uid)
            .collect();
        r.seen
            .iter()
            .filter(|(uid, _)| !wanted.contains(uid))
            .map(|(u, n)| (u.clone(), n.clone()))
            .collect()
    };
    for (uid, name) in &removed {
        eventually(
            &format!("{name} ({uid}) fully removed"),
            Duration::from_secs(60),
            || async {
                let left = leftovers(&node, uid).await;
                if left.is_empty() {
                    Ok(())
                } else {
                    Err(left.join(", "))
                }
            },
        )
        .await;
    }
    // Containers that ran from the start still run as the same processes.
    let mut same_pid = 0;
    for c in node.containers().await {
        if let Some(Some(pid)) = pids.get(&c.id) {
            let now = chaos::container_pid(&node, &c.id).await;
            assert_eq!(now, Some(*pid), "container {} changed its process", c.id);
            assert_eq!(c.metadata.as_ref().map(|m| m.attempt), Some(0));
            same_pid += 1;
        }
    }
    drop(views);

    let violations = report(
        &records,
        &settings,
        &kills,
        &recoveries,
        removed.len(),
        same_pid,
    );
    assert_eq!(violations, 0, "{violations} violations (listed above)");
    // The node's API answered through every restart: at least 99.9 % of /pods polls, and
    // never a list missing a wanted pod it had listed. A poll the instance SIGKILLed held
    // at that moment dies with it (no drain after a SIGKILL, no other process has its
    // connection): counted apart, and only when a kill fell within the poll.
    let (polls, failed, unanswered, lost, api_kills, half_empty) = {
        let r = records.lock().unwrap();
        let failed = r.unavailable.get("/pods").copied().unwrap_or(0);
        (
            r.polls,
            failed,
            r.unanswered.clone(),
            r.lost_in_flight.clone(),
            r.api_kills.len(),
            r.half_empty.clone(),
        )
    };
    eprintln!(
        "/pods polls: {polls}, unanswered: {failed} {unanswered:?}, lost in flight with a \
         killed instance: {} {lost:?} ({api_kills} http-server kills), half-empty: {half_empty:?}",
        lost.len()
    );
    assert!(
        failed * 1000 <= polls,
        "/pods answered {} of {polls} polls (under 99.9 %); unanswered: {unanswered:?}",
        polls - failed
    );

    assert!(
        half_empty.is_empty(),
        "half-empty /pods answers: {half_empty:?}"
    );
    assert!(same_pid > 0, "no container lived through the whole run");
    node.stop().await;
}

/// Prints the run's numbers; returns how many violations were recorded.
fn report(
    records: &SharedRecords,
    settings: &ChaosSettings,
    kills: &BTreeMap<&'static str, u32>,
    recoveries: &BTreeMap<&'static str, Vec<Duration>>,
    removed: usize,
    same_pid: usize,
) -> usize {
    let r = records.lock().unwrap();
    let total_kills: u32 = kills.values().sum();
    eprintln!(
        "\n=== chaos report (seed {}, {} s, {} pods at start) ===",
        settings.seed, settings.seconds, settings.pods
    );
    eprintln!("kills: {total_kills} {kills:?}");
    eprintln!(
        "{:<20} {:>6} {:>8} {:>8} {:>8}",
        "action", "count", "p50 s", "p99 s", "max s"
    );
    for (action, samples) in recoveries {
        let (p50, p99, max) = percentiles(samples);
        eprintln!(
            "{action:<20} {:>6} {p50:>8.2} {p99:>8.2} {max:>8.2}",
            samples.len()
        );
    }
    eprintln!("removed pods checked for leftovers: {removed}");
    eprintln!("containers alive since the start, same PID and attempt 0: {same_pid}");
    eprintln!(
        "observations: {:?}; views unavailable (polls/reconnects): {:?}",
        r.observations, r.unavailable
    );
    eprintln!("violations: {}", r.violations.len());
    for v in &r.violations {
        eprintln!(
            "  {:.1}s {} {}: {}",
            v.at.as_secs_f64(),
            v.view,
            v.pod,
            v.what
        );
    }
    r.violations.len()
}

fn api_pod(name: &str, node: &str, command: &str, restart: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node,
            "restartPolicy": restart,
            "terminationGracePeriodSeconds": 2,
            "containers": [{
                "name": "c", "image": "busybox:1.36",
                "command": ["sh", "-c", command],
                "readinessProbe": {"exec": {"command": ["true"]}, "periodSeconds": 2}
            }]
        }
    }))
    .unwrap()
}

fn api_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True")
}

/// The API server goes away for a while (CHAOS_API_OUTAGE_SECONDS, 20 in CI, 300 for the
/// issue's five minutes): pods keep running, services restarted meanwhile disturb nothing,
/// and when it is back the statuses (including a pod that finished during the outage) and
/// the node lease catch up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_server_outage_disturbs_no_pod_and_statuses_catch_up() {
    use k8s_openapi::api::coordination::v1::Lease;
    if !require_runtime("api server outage") {
        return;
    }
    let outage: u64 = std::env::var("CHAOS_API_OUTAGE_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let server = ApiServer::start(ApiState::default(), 0).await;
    let port = server.port;
    let options = NodeOptions {
        kubeconfig: Some(server.kubeconfig()),
        extra_config: "nodeLeaseDurationSeconds: 4\nnodeStatusUpdateFrequency: 1s\n".into(),
        ..Default::default()
    };
    let mut node = Node::start("outage", options).await;
    let client = kube::Client::try_from(kube::Config::new(server.url().parse().unwrap())).unwrap();
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let steady = format!("steady-{}", node.name);
    let finisher = format!("finisher-{}", node.name);
    let forever = "trap 'exit 0' TERM; while true; do sleep 0.5; done";
    // The finisher exits during the outage; the API learns it only afterwards.
    let finish = format!("sleep {}; exit 0", outage / 2 + 5);
    for p in [
        api_pod(&steady, &node.name, forever, "Always"),
        api_pod(&finisher, &node.name, &finish, "Never"),
    ] {
        pods.create(&PostParams::default(), &p).await.unwrap();
    }
    for name in [&steady, &finisher] {
        eventually(
            &format!("{name} Ready in the API"),
            Duration::from_secs(120),
            || async {
                let p = pods.get(name).await.map_err(|e| e.to_string())?;
                if api_ready(&p) {
                    Ok(())
                } else {
                    Err(format!("{:?}", p.status))
                }
            },
        )
        .await;
    }
    let ids: Vec<String> = node.containers().await.into_iter().map(|c| c.id).collect();
    let leases: Api<Lease> = Api::namespaced(pods.clone().into_client(), "kube-node-lease");
    let before = eventually("the node lease", Duration::from_secs(60), || async {
        let l = leases.get(&node.name).await.map_err(|e| e.to_string())?;
        l.spec
            .and_then(|s| s.renew_time)
            .ok_or_else(|| "no renewTime".to_string())
    })
    .await;

    let state = server.stop().await;
    let outage_end = tokio::time::Instant::now() + Duration::from_secs(outage);
    // Every service that talks to the API server restarts while it is away.
    for s in [Service::ConfigSource, Service::PodSync, Service::NodeStatus] {
        node.signal(s, Signal::SIGKILL).await;
        node.spawn(s);
        node.wait_serving(s).await;
    }
    eventually(
        "steady Running and Ready in /pods during the outage",
        Duration::from_secs(60),
        || async {
            let all = node.pods().await?;
            let p = all
                .iter()
                .find(|p| p["metadata"]["name"] == steady.as_str())
                .ok_or("steady not listed")?;
            let view = chaos::PodView::from_json(p).ok_or("no view")?;
            if view.is_healthy() {
                Ok(())
            } else {
                Err(format!("{view:?}"))
            }
        },
    )
    .await;
    // The outage's length is the scenario, not a wait for a condition.
    tokio::time::sleep_until(outage_end).await;
    let server = ApiServer::start(state, port).await;
    let client = kube::Client::try_from(kube::Config::new(server.url().parse().unwrap())).unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    eventually(
        "the finisher's Succeeded reaches the API",
        Duration::from_secs(120),
        || async {
            let p = pods.get(&finisher).await.map_err(|e| e.to_string())?;
            match p.status.and_then(|s| s.phase) {
                Some(phase) if phase == "Succeeded" => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    let p = pods.get(&steady).await.unwrap();
    assert!(api_ready(&p), "steady stayed Ready: {:?}", p.status);
    let leases: Api<Lease> = Api::namespaced(client, "kube-node-lease");
    eventually(
        "the lease renewed after the outage",
        Duration::from_secs(60),
        || async {
            let l = leases.get(&node.name).await.map_err(|e| e.to_string())?;
            let renewed = l.spec.and_then(|s| s.renew_time).ok_or("no renewTime")?;
            if renewed.0 > before.0 {
                Ok(())
            } else {
                Err(format!("renewed at {renewed:?}"))
            }
        },
    )
    .await;
    let still: Vec<String> = node.containers().await.into_iter().map(|c| c.id).collect();
    for id in &ids {
        assert!(still.contains(id), "container {id} survived the outage");
    }
    node.stop().await;
}
