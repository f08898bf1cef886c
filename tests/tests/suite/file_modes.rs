//! What a local user of the node (uid 65534, not root) can reach on disk, tried for real:
//! nothing of a pod. The root directory, `pods/` and each pod's directory are 0750 as
//! upstream's (`setupDataDirs`, `makePodDataDirs`), so the secret volume, the service
//! account token and the emptyDir below them are out of reach whatever their own modes
//! (an emptyDir is 0777 for the pod's users, a token may be 0644); the services' state
//! files (the API server's pod list, with whole pod specs) are 0600.

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, PostParams};
use nodeagent_tests::{Node, NodeOptions, api_pod, eventually, require_runtime};
use serde_json::json;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(90);
const NOBODY: u32 = 65534;

/// Runs `sh -c script` as uid/gid 65534; its exit status and stderr.
fn as_nobody(script: &str) -> (bool, String) {
    let out = std::process::Command::new("/bin/sh")
        .args(["-c", script])
        .uid(NOBODY)
        // As root, std drops the supplementary groups too (setgroups(0)).
        .gid(NOBODY)
        .output()
        .expect("run as nobody");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

/// The one file named `name` below `dir` (found as root).
fn find(dir: &Path, name: &str) -> Option<PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        if entry.file_name() == name && path.is_file() {
            return Some(path);
        }
        if entry.file_type().ok()?.is_dir()
            && let Some(found) = find(&path, name)
        {
            return Some(found);
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_user_reads_no_secret_and_writes_no_empty_dir() {
    if !require_runtime("file modes") {
        return;
    }
    let (server, node) = Node::start_with_api_server("filemodes", NodeOptions::default()).await;
    // The node's temp dir is 0700 by itself: open it as /var/lib is, so that only the
    // agent's own modes stand between a local user and the pods.
    std::fs::set_permissions(node.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let client = server.client();
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "db"},
        "data": {"password": "aHVudGVyMg=="}
    }))
    .unwrap();
    Api::<Secret>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    // Named with the node's suffix, as the harness finds pods.
    let pod = api_pod(
        &node.pod_name("modes"),
        &node.name,
        json!({"spec": {
            "containers": [{"name": "c", "image": "busybox:1.36",
                "command": ["sh", "-c", "echo mine > /scratch/mine; trap 'exit 0' TERM; while true; do sleep 1; done"],
                "volumeMounts": [
                    {"name": "db", "mountPath": "/db"},
                    {"name": "scratch", "mountPath": "/scratch"}]}],
            "volumes": [
                {"name": "db", "secret": {"secretName": "db", "defaultMode": 420}},
                {"name": "scratch", "emptyDir": {}}]
        }}),
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let created = pods.create(&PostParams::default(), &pod).await.unwrap();
    let uid = created.metadata.uid.unwrap();
    node.running_container("modes", "c", DEADLINE).await;

    let root = node.path("root");
    let pod_dir = root.join("pods").join(&uid);
    let password = eventually("the secret written", DEADLINE, || async {
        find(&pod_dir.join("volumes"), "password").ok_or("not yet".to_string())
    })
    .await;
    let scratch = pod_dir.join("volumes/kubernetes.io~empty-dir/scratch");
    assert!(scratch.join("mine").exists());
    for dir in [&root, &root.join("pods"), &pod_dir] {
        assert_eq!(mode(dir), 0o750, "{}", dir.display());
    }

    // The attacks, as uid 65534.
    let (read, why) = as_nobody(&format!("cat {}", password.display()));
    assert!(!read, "a local user read the secret {}", password.display());
    assert!(why.contains("Permission denied"), "{why}");
    let (wrote, why) = as_nobody(&format!("echo evil > {}/evil", scratch.display()));
    assert!(!wrote, "a local user wrote into the emptyDir");
    assert!(why.contains("Permission denied"), "{why}");
    let (listed, _) = as_nobody(&format!("ls {}", root.join("pods").display()));
    assert!(!listed, "a local user listed the pods");
    let token = find(&pod_dir.join("volumes"), "token");
    if let Some(token) = token {
        assert!(
            !as_nobody(&format!("cat {}", token.display())).0,
            "a local user read the token"
        );
    }

    // State files: whole pod specs and node state, root's alone.
    let api_pods = root.join("config-source/api-pods.json");
    eventually("config-source's API checkpoint", DEADLINE, || async {
        api_pods.exists().then_some(()).ok_or("not yet".to_string())
    })
    .await;
    assert_eq!(mode(&api_pods), 0o600, "{}", api_pods.display());
    assert!(!as_nobody(&format!("cat {}", api_pods.display())).0);
    let probe_values = root.join("pod-sync/probe-values.json");
    if probe_values.exists() {
        assert_eq!(mode(&probe_values), 0o600);
    }
    node.stop().await;
}
