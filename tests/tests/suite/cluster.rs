//! Three nodes, one API server (issue 27): three node agents, each on its own containerd,
//! register with the test API server (its scheduler and node lifecycle controller on, as
//! kube-scheduler and kube-controller-manager would be). `kubectl get nodes` shows three
//! Ready nodes; a pod pinned to each (a required node affinity on `kubernetes.io/hostname`,
//! which the scheduler follows as upstream's NodeAffinity filter) runs there. Then every
//! service of the third node stops: the
//! other two nodes' pods stay as they were (same containers, Ready) for the whole time,
//! while the third node's Lease stops being renewed and the API server's node lifecycle
//! shows what upstream's would (Ready Unknown with reason NodeStatusUnknown, the
//! unreachable taints, its pod's Ready condition False; pkg/controller/nodelifecycle), and
//! the taint eviction controller deletes the pod there that tolerates the unreachable
//! taint for 2 s only (DisruptionTarget `DeletionByTaintManager`, a TaintManagerEviction
//! event), while the one with the default 300 s (DefaultTolerationSeconds admission) stays.
//! Its services started again, the node is Ready, the taints are lifted, its pod, never
//! restarted, is Ready again, and the evicted one is terminated and gone.

use nodeagent_tests::apiserver::{ApiServer, ApiState};
use nodeagent_tests::apiserver_nodes::condition;
use nodeagent_tests::{Node, NodeOptions, consistently, eventually, require_runtime};
use serde_json::Value;
use std::time::Duration;

const NODES: usize = 3;
/// The pods' namespace: what an interrupted run left in the three runtimes is found by it.
const NS: &str = "three-nodes";
/// The API server's `--node-monitor-grace-period` here: a few of the nodes' 1 s status
/// and 2 s lease renewals (upstream's ratio of 50 s to 10 s).
const GRACE: Duration = Duration::from_secs(8);
const DEADLINE: Duration = Duration::from_secs(60);
/// How often the nodes renew their Lease (a quarter of `nodeLeaseDurationSeconds: 8`).
const RENEW: Duration = Duration::from_secs(2);

fn ready_status(object: &Value) -> String {
    condition(object, "Ready")
        .and_then(|c| c["status"].as_str())
        .unwrap_or("none")
        .to_string()
}

fn pod_yaml(name: &str, node: &str) -> Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "terminationGracePeriodSeconds": 2,
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}}},
            "containers": [{
                "name": "c", "image": "busybox:1.36",
                "command": ["sh", "-c", "trap 'exit 0' TERM; touch /tmp/ready; while true; do sleep 1; done"],
                "readinessProbe": {"exec": {"command": ["test", "-f", "/tmp/ready"]}, "periodSeconds": 1},
            }],
        },
    })
}

/// `kubectl get nodes` as a user types it: (name, STATUS) per row.
fn kubectl_nodes(server: &ApiServer) -> Result<Vec<(String, String)>, String> {
    let out = std::process::Command::new("kubectl")
        .args(["--server", &server.url(), "get", "nodes", "--no-headers"])
        .env("HOME", std::env::temp_dir())
        .env_remove("KUBECONFIG")
        .output()
        .map_err(|e| format!("kubectl: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut cells = l.split_whitespace();
            Some((cells.next()?.to_string(), cells.next()?.to_string()))
        })
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_and_one_goes_silent_as_the_node_lifecycle_controller_shows_it() {
    if !require_runtime("three nodes") {
        return;
    }
    if super::kubectl::require_kubectl("three nodes").is_none() {
        return;
    }
    let state = ApiState::default();
    state.cluster.enable(Some(GRACE));
    let server = ApiServer::start(state.clone(), 0).await;
    let leases = nodeagent_tests::runtime::leases(NODES).await;
    let mut nodes = Vec::new();
    for lease in leases {
        let options = NodeOptions {
            kubeconfig: Some(server.kubeconfig()),
            extra_config: "nodeStatusUpdateFrequency: 1s\nnodeLeaseDurationSeconds: 8\n".into(),
            ..Default::default()
        };
        nodes.push(Node::start_on("cluster", options, lease).await);
    }
    let names: Vec<String> = nodes.iter().map(|n| n.name.clone()).collect();
    for node in &nodes {
        nodeagent_tests::raw_pod::remove_raw_leftovers(&node.cri, NS).await;
    }

    // kubectl get nodes: three Ready nodes.
    eventually("kubectl get nodes: three Ready", DEADLINE, || async {
        let rows = kubectl_nodes(&server)?;
        let ready = names
            .iter()
            .all(|n| rows.iter().any(|(name, st)| name == n && st == "Ready"));
        if ready && rows.len() == NODES {
            Ok(())
        } else {
            Err(format!("{rows:?}"))
        }
    })
    .await;

    let client = server.client();
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(client.clone(), NS);

    // A pod asking more CPU than any node's allocatable (as each node posts it) stays
    // Pending, unbound, in kube-scheduler's words.
    let mut greedy = pod_yaml("greedy", "");
    greedy["spec"].as_object_mut().unwrap().remove("affinity");
    greedy["spec"]["containers"][0]["resources"] = serde_json::json!({"requests": {"cpu": "1000"}});
    pods.create(
        &Default::default(),
        &serde_json::from_value(greedy).unwrap(),
    )
    .await
    .expect("create greedy");
    let want = format!(
        "0/{NODES} nodes are available: {NODES} Insufficient cpu. preemption: 0/{NODES} nodes are available: {NODES} No preemption victims found for incoming pod.."
    );
    eventually(
        "greedy Unschedulable: Insufficient cpu",
        DEADLINE,
        || async {
            let p = state.object("pods", NS, "greedy").ok_or("no pod")?;
            let scheduled = p["status"]["conditions"]
                .as_array()
                .and_then(|c| c.iter().find(|c| c["type"] == "PodScheduled").cloned())
                .ok_or_else(|| format!("no PodScheduled: {}", p["status"]))?;
            match (
                &scheduled["reason"],
                &scheduled["message"],
                &p["spec"]["nodeName"],
            ) {
                (r, m, n) if r == "Unschedulable" && *m == want.as_str() && n.is_null() => Ok(()),
                _ => Err(format!("{scheduled} nodeName {}", p["spec"]["nodeName"])),
            }
        },
    )
    .await;
    pods.delete("greedy", &Default::default())
        .await
        .expect("delete greedy");

    // A pod pinned to each node runs there and is Ready.
    for (i, node) in names.iter().enumerate() {
        let pod = serde_json::from_value(pod_yaml(&format!("pinned-{i}"), node)).unwrap();
        pods.create(&Default::default(), &pod)
            .await
            .expect("create");
    }
    // And one more on the third node that tolerates its being unreachable for 2 s only.
    let mut leaving = pod_yaml("leaving", &names[2]);
    leaving["spec"]["tolerations"] = serde_json::json!([{"key": "node.kubernetes.io/unreachable",
        "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 2}]);
    pods.create(
        &Default::default(),
        &serde_json::from_value(leaving).unwrap(),
    )
    .await
    .expect("create leaving");
    for (i, node) in nodes.iter().enumerate() {
        let name = format!("pinned-{i}");
        eventually(
            &format!("{name} Ready on {}", node.name),
            DEADLINE,
            || async {
                let p = state.object("pods", NS, &name).ok_or("no pod")?;
                if p["spec"]["nodeName"] != node.name.as_str() {
                    return Err(format!("bound to {}", p["spec"]["nodeName"]));
                }
                match ready_status(&p).as_str() {
                    "True" => Ok(()),
                    s => Err(format!("Ready {s}")),
                }
            },
        )
        .await;
        // Its containers are in that node's containerd.
        let listed = node.runtime_container_ids(NS, &name).await;
        assert_eq!(listed.len(), 1, "{name} on {}: {listed:?}", node.name);
    }
    let before: Vec<Vec<String>> = {
        let mut all = Vec::new();
        for (i, node) in nodes.iter().enumerate() {
            all.push(node.runtime_container_ids(NS, &format!("pinned-{i}")).await);
        }
        all
    };

    // The third node's services stop (its pods keep running in its containerd).
    let silent = nodes.pop().expect("third node");
    let silent_name = silent.name.clone();
    let mut silent = silent;
    let stopped_at = std::time::Instant::now();
    for s in nodeagent_config::Service::ALL {
        silent.signal(s, nix::sys::signal::Signal::SIGTERM).await;
    }
    let lease_before = state
        .object("leases", "kube-node-lease", &silent_name)
        .map(|l| l["spec"]["renewTime"].clone());

    // The other two stay untouched: Ready nodes, Ready pods, the same containers, for as
    // long as it takes the silent node to go Unknown and then some.
    let went_unknown = std::sync::Arc::new(std::sync::Mutex::new(None::<Duration>));
    consistently(
        "the two other nodes and their pods untouched while the third goes Unknown",
        GRACE + Duration::from_secs(12),
        Duration::from_millis(500),
        || async {
            for (i, node) in nodes.iter().enumerate() {
                let n = state.object("nodes", "", &node.name).ok_or("node gone")?;
                if ready_status(&n) != "True" {
                    return Err(format!("{} Ready {}", node.name, ready_status(&n)));
                }
                let p = state
                    .object("pods", NS, &format!("pinned-{i}"))
                    .ok_or("pod gone")?;
                if ready_status(&p) != "True" {
                    return Err(format!("pinned-{i} Ready {}", ready_status(&p)));
                }
                let ids = node.runtime_container_ids(NS, &format!("pinned-{i}")).await;
                if ids != before[i] {
                    return Err(format!("pinned-{i}: {:?} -> {ids:?}", before[i]));
                }
            }
            let n = state
                .object("nodes", "", &silent_name)
                .ok_or("silent node gone")?;
            if ready_status(&n) == "Unknown" {
                went_unknown
                    .lock()
                    .unwrap()
                    .get_or_insert(stopped_at.elapsed());
            }
            Ok(())
        },
    )
    .await;
    let after = *went_unknown.lock().unwrap();
    let after = after.expect("the silent node's Ready went Unknown within the window");
    // The grace period runs from the last heartbeat the API server saw: at most one lease
    // renewal (2 s) before the services began to stop.
    assert!(
        after + RENEW >= GRACE,
        "Ready went Unknown {after:?} after the services began to stop, before the grace \
         period {GRACE:?} since their last heartbeat"
    );
    let lease_after = state
        .object("leases", "kube-node-lease", &silent_name)
        .map(|l| l["spec"]["renewTime"].clone());
    assert_eq!(
        lease_before, lease_after,
        "nobody renews a stopped node's Lease"
    );

    // Upstream's wording and taints (node_lifecycle_controller.go), the pod marked not
    // Ready (MarkPodsNotReady), and `kubectl get nodes` says NotReady.
    let n = state.object("nodes", "", &silent_name).expect("node");
    for ty in ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure"] {
        let c = condition(&n, ty).unwrap_or_else(|| panic!("{ty} missing: {n}"));
        assert_eq!(c["status"], "Unknown", "{ty}: {c}");
        assert_eq!(c["reason"], "NodeStatusUnknown", "{ty}: {c}");
        assert_eq!(
            c["message"], "Kubelet stopped posting node status.",
            "{ty}: {c}"
        );
    }
    let taints: Vec<String> = n["spec"]["taints"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            format!(
                "{}:{}",
                t["key"].as_str().unwrap_or(""),
                t["effect"].as_str().unwrap_or("")
            )
        })
        .collect();
    assert!(
        taints.contains(&"node.kubernetes.io/unreachable:NoSchedule".into())
            && taints.contains(&"node.kubernetes.io/unreachable:NoExecute".into()),
        "{taints:?}"
    );
    let p = state.object("pods", NS, "pinned-2").expect("pod");
    assert_eq!(ready_status(&p), "False", "{}", p["status"]);
    let rows = kubectl_nodes(&server).expect("kubectl get nodes");
    assert!(
        rows.contains(&(silent_name.clone(), "NotReady".into())),
        "kubectl get nodes: {rows:?}"
    );
    // Its pod still runs on its containerd: nothing on the node acted on the API's view.
    assert_eq!(
        silent.runtime_container_ids(NS, "pinned-2").await,
        before[2]
    );

    // The taint eviction controller: `leaving` (2 s) is deleted, with upstream's condition
    // and event; pinned-2 (the admission's default 300 s) stays.
    let evicted = eventually("leaving marked for deletion", DEADLINE, || async {
        let p = state.object("pods", NS, "leaving").ok_or("leaving gone")?;
        if p["metadata"]["deletionTimestamp"].is_null() {
            return Err(format!("not deleted: {}", p["spec"]["tolerations"]));
        }
        Ok(p)
    })
    .await;
    let target = condition(&evicted, "DisruptionTarget").expect("DisruptionTarget");
    assert_eq!(
        (&target["status"], &target["reason"], &target["message"]),
        (
            &Value::from("True"),
            &Value::from("DeletionByTaintManager"),
            &Value::from("Taint manager: deleting due to NoExecute taint")
        ),
        "{target}"
    );
    let events = state.objects("events");
    assert!(
        events.iter().any(|e| e["reason"] == "TaintManagerEviction"
            && e["message"] == format!("Marking for deletion Pod {NS}/leaving").as_str()
            && e["involvedObject"]["name"] == "leaving"),
        "no TaintManagerEviction event for leaving"
    );
    let p = state.object("pods", NS, "pinned-2").expect("pod");
    assert!(
        p["metadata"]["deletionTimestamp"].is_null(),
        "pinned-2 tolerates 300 s: {}",
        p["spec"]["tolerations"]
    );

    // Back: the node's services start again; Ready, untainted, its pod Ready with the
    // same container.
    silent.spawn_all();
    eventually(
        "the third node Ready again, taints lifted",
        DEADLINE,
        || async {
            let n = state.object("nodes", "", &silent_name).ok_or("node")?;
            let tainted = n["spec"]["taints"].as_array().is_some_and(|t| {
                t.iter()
                    .any(|t| t["key"] == "node.kubernetes.io/unreachable")
            });
            match (ready_status(&n).as_str(), tainted) {
                ("True", false) => Ok(()),
                (s, t) => Err(format!("Ready {s}, tainted {t}")),
            }
        },
    )
    .await;
    eventually("pinned-2 Ready again", DEADLINE, || async {
        let p = state.object("pods", NS, "pinned-2").ok_or("pod")?;
        match ready_status(&p).as_str() {
            "True" => Ok(()),
            s => Err(format!("Ready {s}")),
        }
    })
    .await;
    assert_eq!(
        silent.runtime_container_ids(NS, "pinned-2").await,
        before[2],
        "the pod ran on, never restarted"
    );
    // The evicted pod: its kubelet, back, terminates it and completes the deletion.
    eventually("leaving terminated and gone", DEADLINE, || async {
        match state.object("pods", NS, "leaving") {
            None => Ok(()),
            Some(p) => Err(format!("{}", p["status"]["phase"])),
        }
    })
    .await;
    eventually(
        "leaving's containers gone from the third node's containerd",
        DEADLINE,
        || async {
            match silent.runtime_container_ids(NS, "leaving").await {
                ids if ids.is_empty() => Ok(()),
                ids => Err(format!("{ids:?}")),
            }
        },
    )
    .await;
    nodes.push(silent);
    for node in nodes {
        let cri = node.cri.clone();
        node.stop().await;
        // API pods carry no node suffix, which the harness's cleanup goes by.
        nodeagent_tests::raw_pod::remove_raw_leftovers(&cri, NS).await;
    }
}
