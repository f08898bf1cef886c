//! How operators run the node agent, exercised for real by the scripts under deploy/ and
//! compose/ (each prints a PASS/FAIL line per check): the systemd units verified by
//! `systemd-analyze verify` and booted with systemd as PID 1 in a locally built container,
//! and the docker-compose node. These need root and a Docker engine; they take the same
//! lock as the runtime tests so that two heavy tests never share the two cores.

use nodeagent_config::Service;
use nodeagent_tests::binary;
use std::path::PathBuf;
use std::time::Duration;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("repo root")
        .to_path_buf()
}

fn bin_dir() -> String {
    binary(Service::PodSync)
        .parent()
        .expect("bin dir")
        .display()
        .to_string()
}

/// Docker and root, or a skip outside CI.
fn require_docker(test: &str) -> bool {
    let root = nix::unistd::geteuid().is_root();
    let docker = std::process::Command::new("docker")
        .arg("info")
        .output()
        .is_ok_and(|o| o.status.success());
    if root && docker {
        return true;
    }
    let why =
        format!("{test} needs root and a running Docker engine (root: {root}, docker: {docker})");
    nodeagent_tests::skip_unless_ci(&why)
}

/// Runs a script from the repository root; panics with its output unless it exits 0.
async fn run_script(script: &str, args: &[String], limit: Duration) {
    run_script_with(script, args, &[], limit).await
}

/// [`run_script`] with these environment variables set.
async fn run_script_with(script: &str, args: &[String], env: &[(&str, &str)], limit: Duration) {
    let _lease = nodeagent_tests::runtime::lease().await;
    let started = std::time::Instant::now();
    let run = tokio::process::Command::new("bash")
        .arg(script)
        .args(args)
        .envs(env.iter().copied())
        .current_dir(repo_root())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(limit, run)
        .await
        .unwrap_or_else(|_| panic!("{script} did not finish within {limit:?}"))
        .expect("run the script");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{script} took {:?}\n{stdout}", started.elapsed());
    assert!(
        out.status.success(),
        "{script} failed ({:?})\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    assert!(
        stdout.contains("PASS"),
        "{script} reported no checks:\n{stdout}"
    );
    assert!(
        !stdout.lines().any(|l| l.trim_start().starts_with("FAIL")),
        "{stdout}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn systemd_units_pass_systemd_analyze_verify() {
    let analyze = std::process::Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !analyze {
        nodeagent_tests::skip_unless_ci("systemd-analyze is not installed");
        return;
    }
    run_script(
        "deploy/systemd/verify.sh",
        &["--security".into(), bin_dir()],
        Duration::from_secs(300),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn systemd_as_pid_1_runs_the_node_and_restarts_units_without_disturbing_pods() {
    if !require_docker("systemd_as_pid_1") {
        return;
    }
    run_script(
        "deploy/systemd/test-in-container.sh",
        &[bin_dir()],
        Duration::from_secs(1800),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_compose_node_survives_restarts_and_down_leaves_nothing() {
    if !require_docker("docker_compose_node") {
        return;
    }
    run_script("compose/test.sh", &[bin_dir()], Duration::from_secs(1800)).await;
}

/// The README's cluster as a user tries it, kubectl only (issue 27): the compose
/// `cluster` profile, a configMap, a secret, a pod that mounts both and its token, logs,
/// exec, port-forward, describe, a configMap update, delete. The script prints the
/// session's transcript. Then two more compose nodes join (NODES=3): three Ready, a pod
/// pinned to each runs in its node's containerd, and one node's services stopped leave the
/// others untouched while its Ready goes Unknown (NodeStatusUnknown).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_compose_cluster_serves_a_kubectl_user_session() {
    if !require_docker("docker_compose_cluster") {
        return;
    }
    run_script_with(
        "compose/cluster-test.sh",
        &[bin_dir()],
        &[("NODES", "3")],
        Duration::from_secs(1200),
    )
    .await;
}
