//! Probe scale-out (issue 11): three `--probe-instance`s (and no default one) divide 100
//! pods among them; when one is SIGKILLed its pods are probed by the other two, and no
//! pod's readiness flips on the way (pod-sync's status stream is recorded throughout). The
//! node page shows each instance's results.

use nix::sys::signal::Signal;
use nodeagent_config::{Address, Service};
use nodeagent_tests::chaos::{self, SharedRecords};
use nodeagent_tests::{Node, NodeOptions, eventually, ready_results, require_runtime};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

const PODS: usize = 100;
const INSTANCES: [&str; 3] = ["a", "b", "c"];
/// Pods of the killed instance made unready on purpose, to see that someone probes them.
const BROKEN: usize = 3;

/// busybox httpd; ready while /www/ready.html exists (httpGet every second: cheap, where an
/// exec probe would cost a runc exec per pod per second).
fn pod(name: &str) -> String {
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {"chaos/generation": "0"}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "app",
                "image": "busybox:1.36",
                "command": ["sh", "-c",
                    "mkdir -p /www && echo ok > /www/ready.html && exec httpd -f -p 8080 -h /www"],
                "readinessProbe": {
                    "httpGet": {"path": "/ready.html", "port": 8080},
                    "periodSeconds": 1,
                    "failureThreshold": 2
                }
            }]
        }
    });
    serde_json::to_string_pretty(&pod).expect("pod json")
}

/// The pod UIDs that probe instance at `socket` holds a readiness result for: the pods it
/// probes (an instance drops the results of pods it no longer owns).
async fn probed_by(socket: &Address) -> Result<BTreeSet<String>, String> {
    Ok(ready_results(socket)
        .await?
        .into_iter()
        .map(|r| r.pod_uid)
        .collect())
}

/// Full pod name -> uid, from the recorded status stream.
fn uids(records: &SharedRecords) -> BTreeMap<String, String> {
    records
        .lock()
        .unwrap()
        .current("stream")
        .into_iter()
        .map(|p| (p.name, p.uid))
        .collect()
}

fn ready(records: &SharedRecords, name: &str) -> Option<bool> {
    let r = records.lock().unwrap();
    let pod = r.current("stream").into_iter().find(|p| p.name == name)?;
    Some(pod.containers.get("app")?.ready)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_of_a_killed_probe_instance_move_without_a_readiness_flip() {
    if !require_runtime("probe_scale") {
        return;
    }
    let t0 = Instant::now();
    let options = NodeOptions {
        no_default_probe: true,
        ..NodeOptions::default()
    };
    let mut node = Node::start("probe-scale", options).await;
    eprintln!(
        "node started after {:.1}s (runtime lock included)",
        t0.elapsed().as_secs_f64()
    );
    for id in INSTANCES {
        node.spawn_probe_instance(id);
    }
    let records = chaos::new_records();
    let names: Vec<String> = (0..PODS).map(|i| format!("scale-{i}")).collect();
    {
        let mut r = records.lock().unwrap();
        for n in &names {
            r.desired.insert(node.pod_name(n), 0);
        }
    }
    let stream = tokio::spawn(chaos::follow_status_stream(
        node.socket(Service::PodSync),
        records.clone(),
    ));
    for n in &names {
        node.write_manifest(&format!("{n}.json"), &pod(n));
    }

    eventually("all 100 pods Ready", Duration::from_secs(180), || async {
        let healthy = records
            .lock()
            .unwrap()
            .current("stream")
            .iter()
            .filter(|p| p.is_healthy())
            .count();
        (healthy == PODS)
            .then_some(())
            .ok_or(format!("{healthy}/{PODS} ready"))
    })
    .await;
    eprintln!("all ready after {:.1}s", t0.elapsed().as_secs_f64());
    let all: BTreeSet<String> = uids(&records).into_values().collect();

    // Each instance probes about a third, and every pod has exactly one prober.
    let shares: BTreeMap<&str, BTreeSet<String>> = eventually(
        "the pods divided among a, b, c",
        Duration::from_secs(30),
        || async {
            let mut shares = BTreeMap::new();
            for id in INSTANCES {
                shares.insert(id, probed_by(&node.probe_instance_socket(id)).await?);
            }
            let total: usize = shares.values().map(BTreeSet::len).sum();
            let union: BTreeSet<String> = shares.values().flatten().cloned().collect();
            let counts: Vec<usize> = shares.values().map(BTreeSet::len).collect();
            if total != PODS || union != all {
                return Err(format!("shares {counts:?} do not partition the pods"));
            }
            if counts.iter().any(|n| !(15..=55).contains(n)) {
                return Err(format!("unbalanced shares {counts:?}"));
            }
            Ok(shares)
        },
    )
    .await;
    eprintln!(
        "shares: {:?}",
        shares.iter().map(|(k, v)| (k, v.len())).collect::<Vec<_>>()
    );

    // The node page shows every instance's results: a pod of each share has its readiness
    // result in `/ui/api/pod` (http-server follows each `probe-<id>.sock`).
    for (id, share) in &shares {
        let uid = share.first().unwrap().clone();
        eventually(
            &format!("the node page's readiness result of a pod {id} probes"),
            Duration::from_secs(30),
            || async {
                let body = node.api.get(&format!("/ui/api/pod?uid={uid}")).await?;
                let pod: serde_json::Value = serde_json::from_str(&body.text())
                    .map_err(|e| format!("{e}: {}", body.text()))?;
                let seen = pod["probes"].as_array().into_iter().flatten().any(|p| {
                    p["container"] == "app"
                        && p["kind"] == "readiness"
                        && p["results"][0]["outcome"] == "Success"
                });
                seen.then_some(()).ok_or_else(|| format!("{pod}"))
            },
        )
        .await;
    }

    let killed = Instant::now();
    node.signal_probe_instance("b", Signal::SIGKILL).await;
    let of_b = shares["b"].clone();
    eventually(
        "a and c probe b's pods",
        Duration::from_secs(30),
        || async {
            let a = probed_by(&node.probe_instance_socket("a")).await?;
            let c = probed_by(&node.probe_instance_socket("c")).await?;
            let orphans = of_b
                .iter()
                .filter(|u| !a.contains(*u) && !c.contains(*u))
                .count();
            (orphans == 0)
                .then_some(())
                .ok_or(format!("{orphans} of b's {} pods not probed", of_b.len()))
        },
    )
    .await;
    eprintln!(
        "b's pods taken over after {:.1}s",
        killed.elapsed().as_secs_f64()
    );

    // A few of b's pods fail their probe once: someone must see it, then see them recover.
    let by_uid: BTreeMap<String, String> =
        uids(&records).into_iter().map(|(n, u)| (u, n)).collect();
    let broken: Vec<String> = of_b
        .iter()
        .take(BROKEN)
        .map(|u| by_uid[u].clone())
        .collect();
    for name in &broken {
        // Its readiness is meant to change now: not counted as a flip.
        records.lock().unwrap().desired.remove(name);
        let short = name.trim_end_matches(&format!("-{}", node.name));
        let id = node.container_id(short, "app").await.expect("container");
        node.exec(&id, &["rm", "/www/ready.html"])
            .await
            .expect("rm");
    }
    for name in &broken {
        eventually(
            &format!("{name} unready"),
            Duration::from_secs(20),
            || async {
                (ready(&records, name) == Some(false))
                    .then_some(())
                    .ok_or("still ready".to_string())
            },
        )
        .await;
        let short = name.trim_end_matches(&format!("-{}", node.name));
        let id = node.container_id(short, "app").await.expect("container");
        node.exec(&id, &["sh", "-c", "echo ok > /www/ready.html"])
            .await
            .expect("restore");
    }
    for name in &broken {
        eventually(
            &format!("{name} ready again"),
            Duration::from_secs(20),
            || async {
                (ready(&records, name) == Some(true))
                    .then_some(())
                    .ok_or("still unready".to_string())
            },
        )
        .await;
    }

    stream.abort();
    let violations = records.lock().unwrap().violations.clone();
    assert!(
        violations.is_empty(),
        "readiness or status regressed: {violations:#?}"
    );
    eprintln!("test body took {:.1}s", t0.elapsed().as_secs_f64());
    node.stop().await;
}
