//! Readiness and started survive restarts of probe, of pod-sync and of both at once: every
//! `ready`/`started` value pod-sync's status stream shows is recorded per container ID, and
//! none may go from true to false while the probes keep passing. A probe that really
//! starts failing after a restart still flips readiness.

use nix::sys::signal::Signal;
use nodeagent_config::Service;
use nodeagent_tests::chaos::{PodView, follow_pod_sync_status, pod_views};
use nodeagent_tests::{Node, NodeOptions, eventually, ready_results, require_runtime};
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(90);
const PODS: usize = 12;

/// Every value each container ID has shown, in order, and the true -> false flips.
#[derive(Default)]
struct Transitions {
    /// container ID -> (ready, started) last shown.
    last: BTreeMap<String, (bool, bool)>,
    /// container ID -> pod name, for the report.
    names: BTreeMap<String, String>,
    flips: Vec<String>,
    observations: u64,
    /// Snapshots received (one per (re)connect to pod-sync).
    snapshots: u64,
}

impl Transitions {
    fn observe(&mut self, pod: &PodView) {
        for c in pod.containers.values().filter(|c| !c.id.is_empty()) {
            self.observations += 1;
            self.names.insert(c.id.clone(), pod.name.clone());
            let now = (c.ready, c.started);
            if let Some(&(ready, started)) = self.last.get(&c.id) {
                if ready && !c.ready {
                    self.flips.push(format!("{} ready true -> false", pod.name));
                }
                if started && !c.started {
                    self.flips
                        .push(format!("{} started true -> false", pod.name));
                }
            }
            self.last.insert(c.id.clone(), now);
        }
    }

    /// Containers currently shown ready and started.
    fn ready(&self) -> usize {
        self.last.values().filter(|(r, s)| *r && *s).count()
    }
}

type Shared = Arc<Mutex<Transitions>>;

/// Records every snapshot and delta of pod-sync's status stream, reconnecting after breaks.
async fn follow_status(node_socket: nodeagent_config::Address, record: Shared) {
    follow_pod_sync_status(node_socket, move |update| {
        let Some(update) = update else { return };
        let mut r = record.lock().unwrap();
        r.snapshots += u64::from(update.snapshot);
        for view in pod_views(update) {
            r.observe(&view);
        }
    })
    .await
}

/// Twelve pods: readiness by exec, httpGet (busybox httpd) and tcpSocket, half of them with
/// a startup probe, some with liveness probes and an initial delay.
fn pod(i: usize) -> String {
    let httpd = "mkdir -p /www && echo ok > /www/index.html && touch /tmp/ready && exec httpd -f -p 8080 -h /www";
    let readiness = match i % 3 {
        0 => json!({"exec": {"command": ["test", "-f", "/tmp/ready"]}}),
        1 => json!({"httpGet": {"path": "/index.html", "port": 8080}}),
        _ => json!({"tcpSocket": {"port": 8080}}),
    };
    let mut readiness = readiness;
    readiness["periodSeconds"] = json!(1);
    readiness["failureThreshold"] = json!(1);
    if i % 4 == 3 {
        readiness["initialDelaySeconds"] = json!(4);
    }
    let mut c = json!({
        "name": "c", "image": "busybox:1.36",
        "command": ["sh", "-c", httpd],
        "readinessProbe": readiness,
    });
    if i.is_multiple_of(2) {
        c["startupProbe"] = json!({"exec": {"command": ["test", "-f", "/tmp/ready"]}, "periodSeconds": 1, "failureThreshold": 30});
    }
    if i.is_multiple_of(3) {
        c["livenessProbe"] =
            json!({"tcpSocket": {"port": 8080}, "periodSeconds": 1, "failureThreshold": 3});
    }
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("r{i}")},
        "spec": {"terminationGracePeriodSeconds": 1, "containers": [c]}
    })
    .to_string()
}

/// How many containers probe's own snapshot has a successful readiness result for.
async fn probe_ready_results(node: &Node) -> Result<usize, String> {
    Ok(ready_results(&node.socket(Service::Probe)).await?.len())
}

/// Waits until the restarted services are back, the status stream has a snapshot newer
/// than `snapshots_before` and probe has re-proved every container, so that the next kill
/// hits a node whose pod-sync and probe really ran.
async fn settled(node: &Node, record: &Shared, want: usize, snapshots_before: u64, what: &str) {
    node.wait_serving(Service::PodSync).await;
    node.wait_serving(Service::Probe).await;
    eventually(what, DEADLINE, || async {
        let proved = probe_ready_results(node).await?;
        let (shown, snapshots) = {
            let r = record.lock().unwrap();
            (r.ready(), r.snapshots)
        };
        if proved >= want && shown >= want && snapshots > snapshots_before {
            Ok(())
        } else {
            Err(format!(
                "probe proved {proved}, stream shows {shown} ready of {want}, {snapshots} snapshots"
            ))
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarts_of_probe_and_pod_sync_flip_no_readiness() {
    if !require_runtime("readiness across restarts") {
        return;
    }
    let mut node = Node::start("readiness", NodeOptions::default()).await;
    let record: Shared = Arc::default();
    let follower = tokio::spawn(follow_status(node.socket(Service::PodSync), record.clone()));
    for i in 0..PODS {
        node.write_manifest(&format!("r{i}.yaml"), &pod(i));
    }
    let t = std::time::Instant::now();
    settled(&node, &record, PODS, 0, "every pod ready").await;
    eprintln!("{PODS} pods ready in {:?}", t.elapsed());
    let before: Vec<String> = record.lock().unwrap().last.keys().cloned().collect();

    let rounds: [&[Service]; 3] = [
        &[Service::Probe],
        &[Service::PodSync],
        &[Service::Probe, Service::PodSync],
    ];
    for services in rounds {
        for round in 0..2 {
            // Only a pod-sync restart makes the stream reconnect with a new snapshot.
            let snapshots = record.lock().unwrap().snapshots;
            let snapshots_before = snapshots - u64::from(!services.contains(&Service::PodSync));
            for s in services {
                node.signal(*s, Signal::SIGKILL).await;
            }
            for s in services {
                node.spawn(*s);
            }
            let t = std::time::Instant::now();
            let what = format!("back after killing {services:?} ({round})");
            settled(&node, &record, PODS, snapshots_before, &what).await;
            eprintln!(
                "killed {services:?}: all ready and re-proved after {:?}",
                t.elapsed()
            );
        }
    }

    // /pods agrees at the end, with the same containers, never restarted.
    let pods = node.pods().await.unwrap();
    let views: Vec<PodView> = pods.iter().filter_map(PodView::from_json).collect();
    assert_eq!(views.len(), PODS, "{pods:?}");
    for v in &views {
        for c in v.containers.values() {
            assert!(c.ready && c.started && c.restarts == 0, "{v:?}");
            assert!(before.contains(&c.id), "{} was replaced: {v:?}", v.name);
        }
    }
    follower.abort();
    let (observations, containers, flips) = {
        let r = record.lock().unwrap();
        (r.observations, r.names.len(), r.flips.clone())
    };
    eprintln!("observed {observations} container states over {containers} containers");
    assert!(
        flips.is_empty(),
        "{} true -> false flips: {flips:?}",
        flips.len()
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_that_fails_after_a_probe_restart_still_flips_readiness() {
    if !require_runtime("readiness failure after a restart") {
        return;
    }
    let mut node = Node::start("unready", NodeOptions::default()).await;
    let record: Shared = Arc::default();
    let follower = tokio::spawn(follow_status(node.socket(Service::PodSync), record.clone()));
    node.write_manifest("r0.yaml", &pod(0));
    settled(&node, &record, 1, 0, "the pod ready").await;
    node.signal(Service::Probe, Signal::SIGKILL).await;
    node.spawn(Service::Probe);
    let snapshots = record.lock().unwrap().snapshots;
    settled(
        &node,
        &record,
        1,
        snapshots - 1,
        "probe back, the pod ready",
    )
    .await;
    let id = node.container_id("r0", "c").await.expect("container");
    node.exec(&id, &["rm", "/tmp/ready"]).await.unwrap();
    eventually("the pod unready in /pods", DEADLINE, || async {
        let pod = node.pod("r0").await?;
        let c = &pod["status"]["containerStatuses"][0];
        if c["ready"] == false && c["started"] == true {
            Ok(())
        } else {
            Err(c.to_string())
        }
    })
    .await;
    follower.abort();
    node.stop().await;
}
