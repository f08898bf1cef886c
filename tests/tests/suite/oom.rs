//! The kernel's OOM killer, for real:
//!
//! - a container over its 32 MiB memory limit is killed by it: containerd reports it
//!   `OOMKilled` (exit code 137), restartPolicy Always restarts it with the last state
//!   kept, Never leaves the pod Failed; node-status's watcher reads the kill from the
//!   kernel log and posts no node event for a container's own limit (as upstream);
//! - a child process killed inside a container that survives it is counted in cAdvisor's
//!   `container_oom_events_total` (the cgroup's `oom_kill` count);
//! - a node-wide OOM (`a_node_wide_oom_...`) posts upstream's `SystemOOM` Node event
//!   naming the victim process, its container and pod, also when it happened while
//!   node-status was down (the watcher resumes from the kernel log position it kept).
//!   That test runs the whole node out of memory, so it runs only where that harms
//!   nothing: the cgroup v2 guest (`tests/cgroup2/suite.sh` sets
//!   `NODEAGENT_TEST_NODE_OOM=1`; 4 GiB, its own kernel), which CI always runs.
//!
//! Needs root and containerd.

use k8s_openapi::api::core::v1::Event;
use nodeagent_config::Service;
use nodeagent_tests::{
    Node, NodeOptions, consistently, eventually, eventually_event, require_runtime,
};
use serde_json::Value;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(120);
/// This test runs only in the cgroup v2 guest: debug builds under TCG, about five times
/// slower than the host, beside other phases of deploy/test.sh. On a loaded machine a
/// restarted node-status once took 82 s there to follow the kernel log again, queued
/// SystemOOM 97 s after its start and had not posted it (its API calls took seconds
/// each) when the 120 s deadline passed (a run of 9a8ea1f).
const GUEST_DEADLINE: Duration = Duration::from_secs(300);

/// busybox tail keeps its one endless line in memory: it grows until killed.
const GROW: &str = "[\"tail\", \"/dev/zero\"]";

fn manifest(name: &str, policy: &str, limit: Option<&str>, command: &str) -> String {
    let resources = limit
        .map(|l| format!("    resources:\n      limits:\n        memory: {l}\n"))
        .unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  restartPolicy: {policy}\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: busybox:1.36\n    command: {command}\n{resources}"
    )
}

/// The kernel's count of OOM kills since boot.
fn oom_kills() -> u64 {
    let vmstat = std::fs::read_to_string("/proc/vmstat").unwrap_or_default();
    vmstat
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

fn container(pod: &Value) -> Value {
    pod["status"]["containerStatuses"][0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_over_its_memory_limit_is_oom_killed_and_follows_its_restart_policy() {
    if !require_runtime("OOM kills") {
        return;
    }
    let (server, node) = Node::start_with_api_server("oomkill", NodeOptions::default()).await;
    node.write_manifest(
        "always.yaml",
        &manifest("always", "Always", Some("32Mi"), GROW),
    );
    node.write_manifest(
        "never.yaml",
        &manifest("never", "Never", Some("32Mi"), GROW),
    );

    let restarted = eventually("always: OOMKilled and restarted", DEADLINE, || async {
        let pod = node.pod("always").await?;
        let c = container(&pod);
        let last = &c["lastState"]["terminated"];
        if c["restartCount"].as_i64() >= Some(1) && last["reason"] == "OOMKilled" {
            Ok(c)
        } else {
            Err(c.to_string())
        }
    })
    .await;
    assert_eq!(restarted["lastState"]["terminated"]["exitCode"], 137);

    let failed = eventually("never: Failed, OOMKilled", DEADLINE, || async {
        let pod = node.pod("never").await?;
        if pod["status"]["phase"] == "Failed" {
            Ok(pod)
        } else {
            Err(pod["status"].to_string())
        }
    })
    .await;
    let c = container(&failed);
    assert_eq!(c["state"]["terminated"]["reason"], "OOMKilled", "{c}");
    assert_eq!(c["state"]["terminated"]["exitCode"], 137, "{c}");
    assert_eq!(c["restartCount"], 0, "{c}");

    // node-status's watcher read the kill from the kernel log, and took it for what it is:
    // a container's own limit, not the node's, so no SystemOOM (as upstream).
    eventually("the OOM watcher saw the kill", DEADLINE, || async {
        let log = node.log(Service::NodeStatus);
        if log.contains("OOM kill within a memory limit") && log.contains("process=\"tail\"") {
            Ok(())
        } else {
            Err("not in node-status's log".to_string())
        }
    })
    .await;
    // Events are posted in the background: the absence of one is concluded only after the
    // recorder had 5 s to post it.
    let events: kube::Api<Event> = kube::Api::namespaced(server.client(), "default");
    consistently(
        "no SystemOOM event for a container's own limit",
        Duration::from_secs(5),
        Duration::from_millis(250),
        || async {
            let all = events
                .list(&Default::default())
                .await
                .map_err(|e| e.to_string())?;
            match all
                .items
                .iter()
                .find(|e| e.reason.as_deref() == Some("SystemOOM"))
            {
                Some(e) => Err(format!("{:?}", e.message)),
                None => Ok(()),
            }
        },
    )
    .await;
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oom_kill_inside_a_surviving_container_is_counted_in_cadvisor_metrics() {
    if !require_runtime("container_oom_events_total") {
        return;
    }
    let node = Node::start("oomcount", NodeOptions::default()).await;
    // The shell (PID 1) outlives its child: the OOM killer takes the growing tail, the
    // container keeps running, and its cgroup counts the kill.
    node.write_manifest(
        "child.yaml",
        &manifest(
            "child",
            "Always",
            Some("32Mi"),
            "[\"sh\", \"-c\", \"tail /dev/zero; echo child-killed; exec sleep 3600\"]",
        ),
    );
    let pod = node.pod_name("child");
    let line = eventually(
        "container_oom_events_total of the pod",
        DEADLINE,
        || async {
            let text = node
                .api
                .get("/metrics/cadvisor")
                .await
                .map_err(|e| e.to_string())?
                .text();
            text.lines()
                .find(|l| {
                    l.starts_with("container_oom_events_total{")
                        && l.contains("container=\"c\"")
                        && l.contains(&format!("pod=\"{pod}\""))
                        && l.split(' ').nth(1).and_then(|v| v.parse::<f64>().ok()) >= Some(1.0)
                })
                .map(str::to_string)
                .ok_or_else(|| {
                    let ours: Vec<_> = text
                        .lines()
                        .filter(|l| {
                            l.contains(&format!("pod=\"{pod}\"")) && l.contains("memory_usage")
                        })
                        .collect();
                    let counts: Vec<_> = text
                        .lines()
                        .filter(|l| l.starts_with("container_oom_events_total"))
                        .collect();
                    format!("no count of 1 yet: {ours:?} {counts:?}")
                })
        },
    )
    .await;
    assert!(line.contains("namespace=\"default\""), "{line}");
    let pod = node.pod("child").await.unwrap();
    let c = container(&pod);
    assert_eq!(c["restartCount"], 0, "the container itself survived: {c}");
    assert!(c["state"]["running"].is_object(), "{c}");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_wide_oom_posts_system_oom_even_while_node_status_is_down() {
    if !require_runtime("node-wide OOM") {
        return;
    }
    // Never a pass without running: deploy/test.sh leaves this test out on the host (and
    // says so), and the guest's run sets the variable.
    assert!(
        std::env::var_os("NODEAGENT_TEST_NODE_OOM").is_some(),
        "this test runs the whole machine out of memory; it runs in the cgroup v2 guest \
         (bash tests/cgroup2/suite.sh), which sets NODEAGENT_TEST_NODE_OOM=1"
    );
    let (server, mut node) = Node::start_with_api_server("nodeoom", NodeOptions::default()).await;
    let client = server.client();
    // A pod start writes to the kernel log (the veth joins the bridge): node-status keeps
    // the position it reached.
    node.write_manifest(
        "sleeper.yaml",
        &manifest("sleeper", "Always", None, "[\"sleep\", \"3600\"]"),
    );
    let kept = node.path("root/node-status/kmsg.json");
    eventually(
        "node-status keeps its kernel log position",
        GUEST_DEADLINE,
        || async {
            if kept.exists() {
                Ok(())
            } else {
                Err("no kmsg.json yet".to_string())
            }
        },
    )
    .await;

    // node-status goes down; a pod without a limit eats the machine's memory until the
    // kernel kills (BestEffort: oom_score_adj 1000, the first victims). Four growing
    // processes, so that no single allocation is refused before the node runs out.
    node.signal(Service::NodeStatus, nix::sys::signal::Signal::SIGKILL)
        .await;
    let before = oom_kills();
    node.write_manifest(
        "hog.yaml",
        &manifest(
            "hog",
            "Never",
            None,
            "[\"sh\", \"-c\", \"for i in 1 2 3 4; do tail /dev/zero & done; wait\"]",
        ),
    );
    eventually("a node-wide OOM kill", Duration::from_secs(600), || async {
        if oom_kills() > before {
            Ok(())
        } else {
            let pod = node.pod("hog").await?;
            Err(format!("none yet; the hog: {}", container(&pod)))
        }
    })
    .await;
    node.remove_manifest("hog.yaml");
    node.spawn(Service::NodeStatus);

    let name = node.name.clone();
    let hog = node.pod_name("hog");
    let event: Event = eventually_event(&client, "default", "SystemOOM", GUEST_DEADLINE, |e| {
        e.reason.as_deref() == Some("SystemOOM")
            && e.involved_object.name.as_deref() == Some(name.as_str())
    })
    .await;
    let message = event.message.unwrap_or_default();
    assert!(
        message.starts_with("System OOM encountered, victim process: tail, pid: ")
            && message.ends_with(&format!(", container: c, pod: default/{hog}")),
        "{message}"
    );
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(event.involved_object.kind.as_deref(), Some("Node"));
    node.stop().await;
}
