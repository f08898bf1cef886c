//! Upgrades and downgrades, one service at a time: each service is replaced by the previous
//! release's binary (built by tests/upgrade/build-previous.sh into target/previous; its schema
//! lacks every field and RPC added since) and then by the current one again, while pods run
//! and are created and removed. Pods must stay untouched in both directions, and starting a
//! current binary must change nothing a user watches.

use nix::sys::signal::Signal;
use nodeagent_config::Service;
use nodeagent_tests::chaos::{self, SharedRecords, chaos_pod, converged};
use nodeagent_tests::{Node, NodeOptions, eventually, require_runtime};
use std::path::PathBuf;
use std::time::Duration;

const CONVERGE: Duration = Duration::from_secs(120);

/// target/previous, next to the current binaries, if the previous release was built.
fn previous_binaries() -> Option<PathBuf> {
    let exe = std::env::current_exe().expect("current exe");
    let target = exe.parent()?.parent()?.parent()?.to_path_buf();
    let dir = target.join("previous");
    if dir.join("nodeagent-pod-sync").exists() {
        return Some(dir);
    }
    let why = format!(
        "the upgrade test needs the previous release's binaries in {}: run tests/upgrade/build-previous.sh (the README's test command does)",
        dir.display()
    );
    nodeagent_tests::skip_unless_ci(&why);
    None
}

async fn swap(node: &mut Node, service: Service, binary: Option<&PathBuf>) {
    node.signal(service, Signal::SIGTERM).await;
    match binary {
        Some(b) => node.spawn_from(service, b),
        None => node.spawn(service),
    }
    node.wait_serving(service).await;
}

async fn settle(node: &Node, records: &SharedRecords, what: &str) {
    eventually(what, CONVERGE, || converged(node, records)).await;
}

fn add_pod(node: &Node, records: &SharedRecords, prefix: &str, index: usize) {
    let name = format!("{prefix}{index}");
    records
        .lock()
        .unwrap()
        .desired
        .insert(node.pod_name(&name), 1);
    node.write_manifest(
        &format!("{name}.json"),
        &chaos_pod(&name, index, 1, &node.path("host")),
    );
}

fn remove_pod(node: &Node, records: &SharedRecords, index: usize) {
    let name = format!("u{index}");
    records
        .lock()
        .unwrap()
        .desired
        .remove(&node.pod_name(&name));
    node.remove_manifest(&format!("{name}.json"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_service_downgraded_and_upgraded_alone_leaves_pods_and_statuses_untouched() {
    if !require_runtime("upgrade") {
        return;
    }
    let Some(previous) = previous_binaries() else {
        return;
    };
    let mut node = Node::start("upgrade", NodeOptions::default()).await;
    std::fs::create_dir_all(node.path("host")).unwrap();
    let records = chaos::new_records();
    // Stable pods live through every swap; churn pods come and go meanwhile.
    for i in 0..4 {
        add_pod(&node, &records, "s", i);
    }
    add_pod(&node, &records, "u", 0);
    let views = chaos::follow_views(&node, &records, Duration::from_millis(300));
    settle(&node, &records, "every pod healthy").await;
    let mut original: Vec<String> = node.containers().await.into_iter().map(|c| c.id).collect();
    original.sort();

    let mut downgrade_findings = Vec::new();
    for (step, service) in Service::ALL.into_iter().enumerate() {
        let next = step + 1;
        // Down to the previous release: pods must stay; what it shows is its own business.
        let before = records.lock().unwrap().violations.len();
        swap(
            &mut node,
            service,
            Some(&previous.join(format!("nodeagent-{}", service.name()))),
        )
        .await;
        settle(
            &node,
            &records,
            &format!("convergence with the previous {}", service.name()),
        )
        .await;
        // A pod created and one removed while the old build runs (new fields meet old code).
        add_pod(&node, &records, "u", next);
        remove_pod(&node, &records, next - 1);
        settle(
            &node,
            &records,
            &format!("churn with the previous {}", service.name()),
        )
        .await;
        let during = records.lock().unwrap().violations.len() - before;
        if during > 0 {
            downgrade_findings.push(format!("{}: {during}", service.name()));
        }

        // Up to the current build again: nothing a user watches may change.
        let before = records.lock().unwrap().violations.len();
        swap(&mut node, service, None).await;
        settle(
            &node,
            &records,
            &format!("convergence with the current {}", service.name()),
        )
        .await;
        let r = records.lock().unwrap();
        let after: Vec<_> = r.violations[before..].to_vec();
        assert!(
            after.is_empty(),
            "upgrading {} back to the current build changed what users see: {after:?}",
            service.name()
        );
    }
    // The stable pods still run the very containers they started with.
    let now: Vec<String> = node.containers().await.into_iter().map(|c| c.id).collect();
    let kept: Vec<&String> = original.iter().filter(|id| now.contains(id)).collect();
    assert_eq!(
        kept.len(),
        original.len() - 1,
        "every stable pod's container survived (the first churn pod was removed): had {original:?}, now {now:?}"
    );
    eprintln!(
        "upgrade report: {} original containers kept; violations while a previous build ran: {}",
        kept.len(),
        if downgrade_findings.is_empty() {
            "none".to_string()
        } else {
            downgrade_findings.join(", ")
        }
    );
    drop(views);
    node.stop().await;
}
