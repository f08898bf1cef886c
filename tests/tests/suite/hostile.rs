//! Host paths built from hostile pod data, against the real containerd: a volume name that
//! climbs out of the pod dir is refused at the source; a symlink a container planted in an
//! emptyDir does not get a later container the host root through subPath; and subPath and
//! subPathExpr work normally and leave no mount and no pod dir behind.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use nodeagent_tests::{
    Node, NodeOptions, eventually, eventually_event, mount_points_under as mounts_under,
    require_runtime,
};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(90);

/// A static pod `name` whose container `c` sleeps.
fn sleeper(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: busybox:1.36\n    command: [\"sleep\", \"3600\"]\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_name_that_climbs_out_is_refused_and_creates_nothing() {
    if !require_runtime("hostile volume name") {
        return;
    }
    let node = Node::start("climb", NodeOptions::default()).await;
    node.write_manifest("good.yaml", &sleeper("good"));
    let before = node.running_container("good", "c", DEADLINE).await;
    let target = format!("/tmp/{}", node.name);
    let escape = format!("../../../../../../..{target}");
    assert!(!Path::new(&target).exists());
    node.write_manifest(
        "evil.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: evil\nspec:\n  containers:\n  - name: c\n    image: busybox:1.36\n    command: [\"sleep\", \"3600\"]\n    volumeMounts:\n    - name: \"{escape}\"\n      mountPath: /data\n  volumes:\n  - name: \"{escape}\"\n    emptyDir: {{}}\n"
        ),
    );
    // A pod written after it runs: config-source and pod-sync went on past the bad one,
    // so by then the bad one was either set up (the old bug) or refused.
    node.write_manifest("later.yaml", &sleeper("later"));
    node.running_container("later", "c", DEADLINE).await;
    assert!(!Path::new(&target).exists(), "{target} was created");
    assert!(node.pod("evil").await.is_err(), "the evil pod is listed");
    assert_eq!(node.container_id("evil", "c").await, None);
    let line = node.refused_manifest("evil.yaml", DEADLINE).await;
    assert!(
        line.contains("spec.volumes[0].name: Invalid value")
            && line.contains("a lowercase RFC 1123 label"),
        "{line}"
    );
    // The running pod is untouched: same container, still running.
    assert_eq!(node.running_container("good", "c", DEADLINE).await, before);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planted_symlink_to_the_host_root_is_refused_as_a_subpath() {
    if !require_runtime("subPath symlink escape") {
        return;
    }
    let node = Node::start("symlink", NodeOptions::default()).await;
    node.write_manifest(
        "plant.yaml",
        r#"apiVersion: v1
kind: Pod
metadata:
  name: plant
spec:
  terminationGracePeriodSeconds: 1
  initContainers:
  - name: plant
    image: busybox:1.36
    command: ["ln", "-s", "/", "/data/evil"]
    volumeMounts:
    - name: data
      mountPath: /data
  containers:
  - name: app
    image: busybox:1.36
    command: ["sleep", "3600"]
    volumeMounts:
    - name: data
      mountPath: /host
      subPath: evil
  volumes:
  - name: data
    emptyDir: {}
"#,
    );
    let message = node
        .waiting_message("plant", "app", "CreateContainerConfigError", DEADLINE)
        .await;
    assert!(
        message.contains("subPath \"evil\" resolves outside of volume \"data\""),
        "{message}"
    );
    // The link was planted (the init container ran), and nothing got mounted for it.
    let root = node.path("root");
    let link = std::fs::read_dir(root.join("pods"))
        .expect("pods dir")
        .flatten()
        .map(|e| e.path().join("volumes/kubernetes.io~empty-dir/data/evil"))
        .find(|p| p.is_symlink())
        .expect("the planted link");
    assert_eq!(std::fs::read_link(&link).unwrap(), Path::new("/"));
    assert_eq!(mounts_under(&root), Vec::<PathBuf>::new());
    assert_eq!(node.container_id("plant", "app").await, None);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sub_path_and_sub_path_expr_work_and_leave_nothing_behind() {
    if !require_runtime("subPath") {
        return;
    }
    let node = Node::start("subpath", NodeOptions::default()).await;
    node.write_manifest(
        "sub.yaml",
        r#"apiVersion: v1
kind: Pod
metadata:
  name: sub
spec:
  terminationGracePeriodSeconds: 1
  initContainers:
  - name: seed
    image: busybox:1.36
    command: ["sh", "-c", "mkdir -p /data/logs && echo one > /data/logs/f"]
    volumeMounts:
    - name: data
      mountPath: /data
  containers:
  - name: app
    image: busybox:1.36
    command: ["sh", "-c", "echo hi > /mine/x; sleep 3600"]
    env:
    - name: POD_NAME
      valueFrom:
        fieldRef:
          fieldPath: metadata.name
    volumeMounts:
    - name: data
      mountPath: /logs
      subPath: logs
    - name: data
      mountPath: /mine
      subPathExpr: pods/$(POD_NAME)
    - name: data
      mountPath: /all
  volumes:
  - name: data
    emptyDir: {}
"#,
    );
    let id = node.running_container("sub", "app", DEADLINE).await;
    assert_eq!(
        node.exec(&id, &["cat", "/logs/f"]).await.unwrap().trim(),
        "one"
    );
    let full = node.pod_name("sub");
    let written = format!("/all/pods/{full}/x");
    let got = eventually("the subPathExpr file", DEADLINE, || async {
        node.exec(&id, &["cat", &written]).await
    })
    .await;
    assert_eq!(got.trim(), "hi");
    let uid = node.pod("sub").await.unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    let pod_dir = node.path("root").join("pods").join(&uid);
    let subpaths = pod_dir.join("volume-subpaths/data/app");
    assert_eq!(
        mounts_under(&node.path("root")),
        vec![subpaths.join("0"), subpaths.join("1")]
    );
    node.remove_manifest("sub.yaml");
    eventually("no mount and no pod dir left", DEADLINE, || async {
        let mounts = mounts_under(&node.path("root"));
        if mounts.is_empty() && !pod_dir.exists() {
            Ok(())
        } else {
            Err(format!(
                "mounts {mounts:?}, pod dir exists: {}",
                pod_dir.exists()
            ))
        }
    })
    .await;
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_pod_with_a_climbing_volume_name_gets_a_failed_validation_event() {
    if !require_runtime("hostile api pod") {
        return;
    }
    let (server, node) = Node::start_with_api_server("apiclimb", NodeOptions::default()).await;
    let client = server.client();
    // API pods keep their names; named like a static pod here so the harness finds them.
    let name = node.pod_name("climb");
    let target = format!("/tmp/{name}");
    let escape = format!("../../../../../../..{target}");
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node.name,
            "containers": [{"name": "c", "image": "busybox:1.36", "command": ["sleep", "3600"],
                "volumeMounts": [{"name": escape, "mountPath": "/data"}]}],
            "volumes": [{"name": escape, "emptyDir": {}}]
        }
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    // A good pod created after it runs: by then the bad one was refused or set up.
    let good: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": node.pod_name("good"), "namespace": "default"},
        "spec": {"nodeName": node.name, "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": "busybox:1.36", "command": ["sleep", "3600"]}]}
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &good)
        .await
        .unwrap();
    node.running_container("good", "c", DEADLINE).await;
    assert!(!Path::new(&target).exists(), "{target} was created");
    let event = eventually_event(
        &client,
        "default",
        "a FailedValidation event",
        DEADLINE,
        |e| e.involved_object.name.as_deref() == Some(name.as_str()),
    )
    .await;
    assert_eq!(event.reason.as_deref(), Some("FailedValidation"));
    let message = event.message.unwrap_or_default();
    assert!(
        message.contains("spec.volumes[0].name: Invalid value"),
        "{message}"
    );
    assert!(!Path::new(&target).exists(), "{target} was created");
    assert_eq!(node.container_id("climb", "c").await, None);
    node.stop().await;
}
