//! Persistent CSI volumes claimed by pods (issue 32), against the real containerd and the
//! test CSI driver offering STAGE_UNSTAGE_VOLUME. Judged by upstream's words and paths:
//! - the desired-state populator's claim checks and `WaitForAttachAndMount`'s FailedMount
//!   text (`Unable to attach or mount volumes: unmounted volumes=[...], unattached
//!   volumes=[...], failed to process volumes=[...]: error processing PVC ns/name: ...`),
//!   as `kubectl describe pod` shows it;
//! - `csi_attacher.go`: the VolumeAttachment `csi-` + sha256(handle + driver + node) that
//!   must say attached when the CSIDriver requires attach (its `attachmentMetadata` is the
//!   publish context; the test API server's attach/detach controller and external-attacher
//!   make and attach it through the driver's `ControllerPublishVolume`), the operation
//!   generator's VerifyControllerAttachedVolume (`volumesInUse`, then `volumesAttached`), the staging path `plugins/kubernetes.io/csi/<driver>/<sha256(handle)>/globalmount`
//!   with `vol_data.json` (`driverName`, `volumeHandle`) beside it, `UnmountDevice` only
//!   once no pod uses the volume;
//! - `csi_mounter.go`: the target `pods/<uid>/volumes/kubernetes.io~csi/<pv name>/mount`,
//!   `volumeLifecycleMode: Persistent`, `csi.storage.k8s.io/ephemeral: "false"`.
//!
//! Attacked: the data must outlive every pod that wrote it; a second pod on the same volume
//! keeps it staged while the first goes; the volume service SIGKILLed while a pod uses the
//! volume (nothing unstaged, unpublished or published again).

use super::attach::detached;
use super::*;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Patch, PatchParams};

/// sha256 in hex, computed here independently of the product.
pub(super) fn sha256_hex(text: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// A CSIDriver for persistent volumes, attach required or not.
pub(super) fn persistent_driver(attach_required: bool) -> CSIDriver {
    serde_json::from_value(json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
        "metadata": {"name": DRIVER},
        "spec": {"attachRequired": attach_required, "podInfoOnMount": true,
                 "volumeLifecycleModes": ["Persistent", "Ephemeral"], "fsGroupPolicy": "File"},
    }))
    .unwrap()
}

/// A node, its API server with the driver's CSIDriver replaced by `csidriver`, and the
/// staging driver registered.
async fn start_with(
    test: &str,
    csidriver: CSIDriver,
) -> (
    nodeagent_tests::apiserver::ApiServer,
    Node,
    Api<Pod>,
    Driver,
) {
    start_with_driver(test, csidriver, "", &["--stage"]).await
}

/// As [`start_with`], with `extra_config` for the node and `driver_args` for the driver.
pub(super) async fn start_with_driver(
    test: &str,
    csidriver: CSIDriver,
    extra_config: &str,
    driver_args: &[&str],
) -> (
    nodeagent_tests::apiserver::ApiServer,
    Node,
    Api<Pod>,
    Driver,
) {
    // Pods resync every 2 s, so that the windows below see several set-up passes.
    let options = NodeOptions {
        sync_frequency: Some("2s".into()),
        extra_config: extra_config.into(),
        ..NodeOptions::default()
    };
    let (server, node, pods, _) = start(test, options).await;
    let client = server.client();
    let drivers: Api<CSIDriver> = Api::all(client.clone());
    drivers
        .delete(DRIVER, &DeleteParams::default())
        .await
        .unwrap();
    drivers
        .create(&PostParams::default(), &csidriver)
        .await
        .unwrap();
    let mut driver = Driver::new(&node, driver_args);
    driver.start();
    let node_id = format!("id-of-{}", node.name);
    eventually("the driver registered", DEADLINE, || async {
        let (drivers, _) = registered(&client, &node).await;
        (drivers == vec![(DRIVER.to_string(), node_id.clone())])
            .then_some(())
            .ok_or_else(|| format!("{drivers:?}"))
    })
    .await;
    (server, node, pods, driver)
}

/// A claim `claim` bound to a new PV `pv` of the driver with volume handle `handle`, as
/// the PV controller binds them (the claim's `volumeName` and phase Bound, the PV's
/// `claimRef` with the claim's UID).
pub(super) async fn bound_claim(client: &kube::Client, claim: &str, pv: &str, handle: &str) {
    new_claim(client, claim).await;
    bind(client, claim, pv, handle).await;
}

/// A new claim, not bound.
pub(super) async fn new_claim(client: &kube::Client, claim: &str) {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    claims
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": claim, "namespace": "default"},
                "spec": {"accessModes": ["ReadWriteOnce"],
                         "resources": {"requests": {"storage": "1Gi"}}},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
}

/// Binds the existing claim `claim` to a new PV `pv` of the driver, as the PV controller
/// does.
async fn bind(client: &kube::Client, claim: &str, pv: &str, handle: &str) {
    let source = json!({"csi": {"driver": DRIVER, "volumeHandle": handle,
        "volumeAttributes": {"content": format!("made for {claim}")}}});
    bind_to(client, claim, pv, source).await;
}

/// Binds the existing claim `claim` to a new PV `pv` whose volume source is `source`
/// (`{"csi": ...}`, `{"hostPath": ...}`, ...).
pub(super) async fn bind_to(client: &kube::Client, claim: &str, pv: &str, source: Value) {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let created = claims
        .patch(
            claim,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"volumeName": pv}})),
        )
        .await
        .unwrap();
    let mut spec = json!({"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"},
        "persistentVolumeReclaimPolicy": "Retain",
        "claimRef": {"kind": "PersistentVolumeClaim", "namespace": "default",
                     "name": claim, "uid": created.metadata.uid}});
    for (k, v) in source.as_object().unwrap() {
        spec[k] = v.clone();
    }
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    volumes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "PersistentVolume",
                "metadata": {"name": pv}, "spec": spec,
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    claims
        .patch_status(
            claim,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"phase": "Bound", "accessModes": ["ReadWriteOnce"],
                                            "capacity": {"storage": "1Gi"}}}),
            ),
        )
        .await
        .unwrap();
}

/// A pod that runs `script` with the claim mounted at /data.
pub(super) fn claim_pod(name: &str, node: &Node, claim: &str, script: &str) -> Pod {
    api_pod(
        name,
        &node.name,
        json!({"spec": {
            "securityContext": {"fsGroup": 2345},
            "containers": [{"name": "c", "image": "busybox:1.36",
                "command": ["sh", "-c", format!("{script}; trap 'exit 0' TERM; while true; do sleep 0.2; done")],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
        }}),
    )
}

/// Creates the pod `short` (its full name returned) running `script` with `claim` at
/// /data ([`claim_pod`]), and waits for it to be Ready.
pub(super) async fn run_claim_pod(
    pods: &Api<Pod>,
    node: &Node,
    short: &str,
    claim: &str,
    script: &str,
) -> String {
    let name = node.pod_name(short);
    pods.create(
        &PostParams::default(),
        &claim_pod(&name, node, claim, script),
    )
    .await
    .unwrap();
    eventually(&format!("{short} Ready"), DEADLINE, || ready(pods, &name)).await;
    name
}

/// The mounts under the node's root directory (what the note lists), relative to it.
pub(super) fn mounts(node: &Node) -> Vec<String> {
    let root = node.path("root");
    mount_points_under(&root)
        .into_iter()
        .map(|p| p.strip_prefix(&root).unwrap().display().to_string())
        .filter(|p| p.contains("csi"))
        .collect()
}

pub(super) async fn kubectl_describe(
    server: &nodeagent_tests::apiserver::ApiServer,
    node: &Node,
    pod: &str,
) -> String {
    kubectl(server, node, &["describe", "pod", pod]).await
}

/// What kubectl prints for `args` against the test API server (it must succeed).
pub(super) async fn kubectl(
    server: &nodeagent_tests::apiserver::ApiServer,
    node: &Node,
    args: &[&str],
) -> String {
    let kubeconfig = node.path("kubectl.kubeconfig");
    std::fs::write(&kubeconfig, server.kubeconfig()).unwrap();
    let out = tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(args)
        .env("HOME", node.path(""))
        .env_remove("KUBECONFIG")
        .output()
        .await
        .expect("kubectl runs");
    assert!(out.status.success(), "kubectl {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Whether `/metrics` counts a `volume_mount` of `plugin` ending in `status`
/// (`storage_operation_duration_seconds`; upstream's operation generator names a CSI
/// volume's plugin `kubernetes.io/csi:<driver>`, a hostPath one `kubernetes.io/host-path`,
/// a local one `kubernetes.io/local-volume`).
pub(super) async fn mount_counted(node: &Node, plugin: &str, status: &str) -> Result<(), String> {
    operation_counted(node, plugin, "volume_mount", status).await
}

/// Whether `/metrics` counts an `operation` of `plugin` ending in `status`
/// (`storage_operation_duration_seconds`).
pub(super) async fn operation_counted(
    node: &Node,
    plugin: &str,
    operation: &str,
    status: &str,
) -> Result<(), String> {
    let r = node.api.get("/metrics").await?;
    let text = r.text();
    let counted = text.lines().any(|l| {
        l.starts_with("storage_operation_duration_seconds_count{")
            && l.contains(&format!("volume_plugin=\"{plugin}\""))
            && l.contains(&format!("operation_name=\"{operation}\""))
            && l.contains(&format!("status=\"{status}\""))
    });
    counted.then_some(()).ok_or_else(|| {
        format!(
            "no {status} {operation} of {plugin} in /metrics ({})",
            r.status
        )
    })
}

/// Whether the pod `name` is Ready with its first container restarted `times` times or
/// more.
pub(super) async fn restarted(pods: &Api<Pod>, name: &str, times: i32) -> Result<(), String> {
    ready(pods, name).await?;
    let p = pods.get(name).await.map_err(|e| e.to_string())?;
    let restarts = p
        .status
        .and_then(|s| s.container_statuses)
        .and_then(|c| c.first().map(|c| c.restart_count))
        .unwrap_or_default();
    (restarts >= times)
        .then_some(())
        .ok_or_else(|| format!("{restarts} restarts"))
}

/// Whether `kubectl describe` lists a Warning FailedMount event whose message is `want`.
fn describes_failed_mount(described: &str, want: &str) -> bool {
    described.lines().any(|l| {
        let words: Vec<&str> = l.split_whitespace().collect();
        words.first() == Some(&"Warning")
            && words.get(1) == Some(&"FailedMount")
            && l.trim_end().ends_with(want)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claims_data_outlives_its_pods_and_is_unstaged_after_the_last() {
    if !require_runtime("csi") {
        return;
    }
    let (server, mut node, pods, driver) = start_with("csi-claim", persistent_driver(false)).await;
    let client = server.client();
    let pv = format!("pv-{}", node.name);
    let handle = format!("vol-{}", node.name);
    bound_claim(&client, "data", &pv, &handle).await;
    let staging = node.path(&format!(
        "root/plugins/kubernetes.io/csi/{DRIVER}/{}/globalmount",
        sha256_hex(&handle)
    ));
    eprintln!("mounts before any pod: {:?}", mounts(&node));

    // The writer: staged once, published at the PV's directory, sees the driver's volume.
    let writer = node.pod_name("writer");
    pods.create(
        &PostParams::default(),
        &claim_pod(
            &writer,
            &node,
            "data",
            "cat /data/content; echo; echo written-by-writer > /data/file",
        ),
    )
    .await
    .unwrap();
    eventually("the writer Ready", DEADLINE, || ready(&pods, &writer)).await;
    let writer_uid = uid_of(&pods, &writer).await;
    let writer_target = node.path(&format!(
        "root/pods/{writer_uid}/volumes/kubernetes.io~csi/{pv}/mount"
    ));
    let id = node.container_id("writer", "c").await.unwrap();
    eventually("the writer's file", DEADLINE, || async {
        node.exec(&id, &["cat", "/data/file"]).await
    })
    .await;
    let seen = node.exec(&id, &["cat", "/data/content"]).await.unwrap();
    assert_eq!(seen, "made for data");
    let plugin = format!("kubernetes.io/csi:{DRIVER}");
    eventually("the CSI mount counted", DEADLINE, || {
        mount_counted(&node, &plugin, "success")
    })
    .await;
    let stages = driver.calls("NodeStageVolume");
    assert_eq!(stages.len(), 1, "{stages:?}");
    assert_eq!(stages[0]["volume_id"], handle);
    assert_eq!(
        stages[0]["staging_target_path"],
        staging.display().to_string()
    );
    assert_eq!(stages[0]["access_mode"], "SINGLE_NODE_WRITER");
    assert_eq!(
        stages[0]["publish_context"],
        json!({}),
        "no attach, no publish context"
    );
    let publishes = driver.calls("NodePublishVolume");
    assert_eq!(publishes.len(), 1, "{publishes:?}");
    assert_eq!(
        publishes[0]["staging_target_path"],
        staging.display().to_string()
    );
    assert_eq!(
        publishes[0]["target_path"],
        writer_target.display().to_string()
    );
    assert_eq!(
        publishes[0]["volume_context"]["csi.storage.k8s.io/ephemeral"],
        "false"
    );
    assert_eq!(
        publishes[0]["volume_context"]["csi.storage.k8s.io/pod.name"],
        writer.as_str()
    );
    let staged: Value = serde_json::from_slice(
        &std::fs::read(staging.parent().unwrap().join("vol_data.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        staged,
        json!({"driverName": DRIVER, "volumeHandle": handle})
    );
    let published: Value = serde_json::from_slice(
        &std::fs::read(writer_target.parent().unwrap().join("vol_data.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(published["specVolID"], pv.as_str());
    assert_eq!(published["volumeLifecycleMode"], "Persistent");
    assert_eq!(published["volumeHandle"], handle.as_str());
    let with_writer = mounts(&node);
    eprintln!("mounts with the writer: {with_writer:?}");
    let root = node.path("root");
    let rel = |p: &std::path::Path| p.strip_prefix(&root).unwrap().display().to_string();
    assert!(with_writer.contains(&rel(&staging)), "{with_writer:?}");
    assert!(
        with_writer.contains(&rel(&writer_target)),
        "{with_writer:?}"
    );

    // A reader on the same claim: not staged again; the writer's file is there.
    let reader = run_claim_pod(&pods, &node, "reader", "data", "cat /data/file").await;
    let reader_id = node.container_id("reader", "c").await.unwrap();
    let seen = node.exec(&reader_id, &["cat", "/data/file"]).await.unwrap();
    assert_eq!(seen.trim(), "written-by-writer");
    assert_eq!(driver.calls("NodeStageVolume").len(), 1, "staged once");

    // The writer goes: its publication goes, the staging stays (the reader uses it).
    pods.delete(&writer, &DeleteParams::default())
        .await
        .unwrap();
    eventually("the writer's volume unpublished", DEADLINE, || async {
        let now = mounts(&node);
        (!now.contains(&rel(&writer_target)))
            .then_some(())
            .ok_or_else(|| format!("{now:?}"))
    })
    .await;
    eventually("the writer gone", DEADLINE, || async {
        match pods.get_opt(&writer).await {
            Ok(None) => Ok(()),
            other => Err(format!("{:?}", other.map(|p| p.map(|p| p.status)))),
        }
    })
    .await;
    consistently(
        "the reader keeps the staged volume",
        Duration::from_secs(3),
        Duration::from_millis(200),
        || async {
            ready(&pods, &reader).await?;
            let unstages = driver.calls("NodeUnstageVolume").len();
            let staged = mount_points_under(&staging).contains(&staging);
            (unstages == 0 && staged)
                .then_some(())
                .ok_or_else(|| format!("{unstages} unstages, staged: {staged}"))
        },
    )
    .await;
    let seen = node.exec(&reader_id, &["cat", "/data/file"]).await.unwrap();
    assert_eq!(seen.trim(), "written-by-writer");
    eprintln!("mounts with the reader alone: {:?}", mounts(&node));

    // The last one goes: unstaged, its directories gone, nothing of the volume mounted.
    pods.delete(&reader, &DeleteParams::default())
        .await
        .unwrap();
    eventually("the volume unstaged", DEADLINE, || async {
        let now = mounts(&node);
        let unstages = driver.calls("NodeUnstageVolume");
        (now.is_empty() && unstages.len() == 1 && !staging.parent().unwrap().exists())
            .then_some(())
            .ok_or_else(|| format!("{now:?} {unstages:?}"))
    })
    .await;
    let unstage = driver.calls("NodeUnstageVolume").pop().unwrap();
    assert_eq!(unstage["volume_id"], handle.as_str());
    assert_eq!(
        unstage["staging_target_path"],
        staging.display().to_string()
    );
    eprintln!("mounts after both pods: {:?}", mounts(&node));

    // A new pod on the claim: the data is there.
    let again = run_claim_pod(&pods, &node, "again", "data", "cat /data/file").await;
    let again_id = node.container_id("again", "c").await.unwrap();
    let seen = node.exec(&again_id, &["cat", "/data/file"]).await.unwrap();
    assert_eq!(
        seen.trim(),
        "written-by-writer",
        "the data outlived its pods"
    );
    eprintln!("mounts with the new pod: {:?}", mounts(&node));

    // The volume service SIGKILLed under it: nothing staged, published or unstaged again.
    let calls_before = driver.log_lines("calls.log").len();
    node.signal(Service::Volume, Signal::SIGKILL).await;
    node.spawn(Service::Volume);
    node.wait_serving(Service::Volume).await;
    consistently(
        "the new pod Ready, its volume kept",
        Duration::from_secs(12),
        Duration::from_millis(300),
        || async {
            ready(&pods, &again).await?;
            let changing = driver.changing_calls_since(calls_before);
            if !changing.is_empty() {
                return Err(format!("calls after the restart: {changing:?}"));
            }
            let now = mounts(&node);
            (now.len() == 2)
                .then_some(())
                .ok_or_else(|| format!("{now:?}"))
        },
    )
    .await;

    // The claim deleted under the running pod (or the API server away): the pod keeps its
    // volume, Ready and running through several set-up passes, as upstream's populator
    // never processes a running pod's volumes again.
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    claims
        .delete("data", &DeleteParams::default())
        .await
        .unwrap();
    consistently(
        "the pod Ready and running without its claim object",
        Duration::from_secs(8),
        Duration::from_millis(300),
        || async {
            ready(&pods, &again).await?;
            let p = pods.get(&again).await.map_err(|e| e.to_string())?;
            let running = p
                .status
                .and_then(|s| s.container_statuses)
                .and_then(|c| c.first().and_then(|c| c.state.clone()))
                .and_then(|s| s.running);
            if running.is_none() {
                return Err("the container is not shown running".into());
            }
            let now = mounts(&node);
            (now.len() == 2)
                .then_some(())
                .ok_or_else(|| format!("{now:?}"))
        },
    )
    .await;
    // Its container still restarts when it exits (the pod's sync goes on), with no
    // FailedMount for it.
    let _ = node.exec(&again_id, &["kill", "1"]).await;
    eventually("the container restarted and Ready", DEADLINE, || {
        restarted(&pods, &again, 1)
    })
    .await;
    // Even after the volume service restarts, the claim still gone: what it noted of the
    // pod's claimed volumes on disk keeps the pod going (upstream's reconstruction would
    // need the claim), and its container restarts again.
    node.signal(Service::Volume, Signal::SIGKILL).await;
    node.spawn(Service::Volume);
    node.wait_serving(Service::Volume).await;
    let again_id = node.container_id("again", "c").await.unwrap();
    let _ = node.exec(&again_id, &["kill", "1"]).await;
    eventually(
        "the container restarted again after the volume service's restart",
        DEADLINE,
        || restarted(&pods, &again, 2),
    )
    .await;
    let now = mounts(&node);
    assert_eq!(now.len(), 2, "{now:?}");
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), "default");
    let failed: Vec<String> = events
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some("FailedMount")
                && e.involved_object.name.as_deref() == Some(again.as_str())
        })
        .filter_map(|e| e.message)
        .collect();
    assert!(failed.is_empty(), "{failed:?}");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_is_missing_unbound_or_unattached_waits_with_upstreams_failed_mount() {
    if !require_runtime("csi") {
        return;
    }
    let (server, mut node, pods, driver) = start_with("csi-wait", persistent_driver(true)).await;
    let client = server.client();
    let pod = node.pod_name("waiter");
    let claim = format!("claim-{}", node.name);
    pods.create(
        &PostParams::default(),
        &claim_pod(&pod, &node, &claim, "cat /data/content"),
    )
    .await
    .unwrap();

    // No claim: upstream's populator error, wrapped by WaitForAttachAndMount.
    let want = format!(
        "Unable to attach or mount volumes: unmounted volumes=[data], unattached volumes=[], failed to process volumes=[data]: error processing PVC default/{claim}: failed to fetch PVC from API server: persistentvolumeclaims \"{claim}\" not found"
    );
    eventually_event(
        &client,
        "default",
        "FailedMount for the missing claim",
        DEADLINE,
        |e| {
            e.reason.as_deref() == Some("FailedMount")
                && e.message.as_deref() == Some(want.as_str())
        },
    )
    .await;
    let described = kubectl_describe(&server, &node, &pod).await;
    assert!(
        describes_failed_mount(&described, &want),
        "kubectl describe pod:\n{described}"
    );

    // A claim that is not bound yet.
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    claims
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": claim, "namespace": "default"},
                "spec": {"accessModes": ["ReadWriteOnce"],
                         "resources": {"requests": {"storage": "1Gi"}}},
                "status": {"phase": "Pending"},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let want = format!(
        "Unable to attach or mount volumes: unmounted volumes=[data], unattached volumes=[], failed to process volumes=[data]: error processing PVC default/{claim}: PVC is not bound"
    );
    eventually_event(
        &client,
        "default",
        "FailedMount for the unbound claim",
        DEADLINE,
        |e| {
            e.reason.as_deref() == Some("FailedMount")
                && e.message.as_deref() == Some(want.as_str())
        },
    )
    .await;
    claims
        .delete(&claim, &DeleteParams::default())
        .await
        .unwrap();

    // Bound while node-status is away: the Node cannot say the volume is in use, so
    // nothing goes on to attach or mount it (upstream's VerifyControllerAttachedVolume:
    // its words in the volume service's log, no event, as upstream's reconciler only logs
    // it).
    node.signal(Service::NodeStatus, Signal::SIGKILL).await;
    let pv = format!("pv-{}", node.name);
    let handle = format!("vol-{}", node.name);
    bound_claim(&client, &claim, &pv, &handle).await;
    let uid = uid_of(&pods, &pod).await;
    let unique = format!("kubernetes.io/csi/{DRIVER}^{handle}");
    let want = format!(
        "Volume has not been added to the list of VolumesInUse in the node's volume status for volume \"{pv}\" (UniqueName: \"{unique}\") pod \"{pod}\" (UID: \"{uid}\")"
    );
    eventually("the wait for volumesInUse in the log", DEADLINE, || async {
        node.log(Service::Volume)
            .contains(&format!("message={:?}", want))
            .then_some(())
            .ok_or_else(|| "not yet".to_string())
    })
    .await;
    // For a stated window (several 2 s passes): nothing staged, the pod waiting, the
    // Node listing nothing.
    consistently(
        "nothing staged before the volume is reported in use",
        Duration::from_secs(6),
        Duration::from_millis(500),
        || async {
            let phase = pods.get(&pod).await.unwrap().status.and_then(|s| s.phase);
            let stages = driver.calls("NodeStageVolume");
            let in_use = volumes_in_use(&client, &node).await;
            (phase.as_deref() == Some("Pending") && stages.is_empty() && in_use.is_empty())
                .then_some(())
                .ok_or_else(|| format!("{phase:?} {stages:?} {in_use:?}"))
        },
    )
    .await;
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), "default");
    let listed = events.list(&Default::default()).await.unwrap();
    assert!(
        !listed.items.iter().any(|e| e
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("VolumesInUse")),
        "no event for the wait"
    );
    // node-status back: the volume is in use on the Node as soon as a pod wants it,
    // before any attach (upstream's GetVolumesInUse reports the desired state).
    node.spawn(Service::NodeStatus);
    node.wait_serving(Service::NodeStatus).await;
    eventually("the volume in use on the Node", DEADLINE, || async {
        let in_use = volumes_in_use(&client, &node).await;
        (in_use == vec![unique.clone()])
            .then_some(())
            .ok_or_else(|| format!("{in_use:?}"))
    })
    .await;

    // Reported in use: the attach/detach controller makes the VolumeAttachment
    // (csi_attacher's name), but no external-attacher serves the driver yet, so it is not
    // attached and the Node does not list it as attached: VerifyControllerAttachedVolume's
    // words in the log, the pod waiting, nothing staged.
    let attachment = format!(
        "csi-{}",
        sha256_hex(&format!("{handle}{DRIVER}{}", node.name))
    );
    let attachments: Api<VolumeAttachment> = Api::all(client.clone());
    eventually("the VolumeAttachment made", DEADLINE, || async {
        let va = attachments.get_opt(&attachment).await.unwrap();
        let spec = va.as_ref().map(|va| &va.spec);
        (spec.is_some_and(|s| {
            s.attacher == DRIVER
                && s.node_name == node.name
                && s.source.persistent_volume_name.as_deref() == Some(pv.as_str())
        }))
        .then_some(())
        .ok_or_else(|| format!("{spec:?}"))
    })
    .await;
    let want = format!(
        "Volume not attached according to node status for volume \"{pv}\" (UniqueName: \"{unique}\") pod \"{pod}\" (UID: \"{uid}\")"
    );
    eventually(
        "the wait for volumesAttached in the log",
        DEADLINE,
        || async {
            node.log(Service::Volume)
                .contains(&format!("message={:?}", want))
                .then_some(())
                .ok_or_else(|| "not yet".to_string())
        },
    )
    .await;
    let phase = pods.get(&pod).await.unwrap().status.and_then(|s| s.phase);
    assert_eq!(phase.as_deref(), Some("Pending"));
    assert!(
        driver.calls("NodeStageVolume").is_empty(),
        "nothing staged before attach"
    );

    // The driver's external-attacher deployed: ControllerPublishVolume with the node's ID
    // from its CSINode, the attachment marked attached with the answer's publish context,
    // the Node listing it as attached, and the kubelet staging with that context.
    server.state.attachers.deploy(DRIVER, &driver.socket());
    eventually("the pod Ready", DEADLINE, || ready(&pods, &pod)).await;
    let published = driver.calls("ControllerPublishVolume");
    assert_eq!(published.len(), 1, "{published:?}");
    assert_eq!(published[0]["volume_id"], handle.as_str());
    assert_eq!(published[0]["node_id"], format!("id-of-{}", node.name));
    let stages = driver.calls("NodeStageVolume");
    assert_eq!(stages.len(), 1, "{stages:?}");
    assert_eq!(
        stages[0]["publish_context"],
        json!({"attachedTo": format!("id-of-{}", node.name)})
    );
    assert_eq!(volumes_in_use(&client, &node).await, vec![unique.clone()]);
    let shown = kubectl(
        &server,
        &node,
        &[
            "get",
            "node",
            &node.name,
            "-o",
            "jsonpath={.status.volumesAttached[*].name}",
        ],
    )
    .await;
    assert_eq!(shown.trim(), unique);

    // The pod gone and the volume unstaged: no longer in use, as kubectl shows the Node.
    pods.delete(&pod, &DeleteParams::default()).await.unwrap();
    eventually("the volume unstaged", DEADLINE, || async {
        (!driver.calls("NodeUnstageVolume").is_empty())
            .then_some(())
            .ok_or_else(|| "not yet".to_string())
    })
    .await;
    eventually("the volume no longer in use", DEADLINE, || async {
        let in_use = volumes_in_use(&client, &node).await;
        in_use
            .is_empty()
            .then_some(())
            .ok_or_else(|| format!("{in_use:?}"))
    })
    .await;
    // Then, and only then, detached (the attach/detach reconciler never detaches a volume
    // the node reports in use): ControllerUnpublishVolume after NodeUnstageVolume, the
    // attachment gone, the Node's lists empty as kubectl shows them.
    detached(&attachments, &attachment).await;
    let order: Vec<String> = driver
        .changing_calls_since(0)
        .into_iter()
        .map(|c| c["rpc"].as_str().unwrap_or_default().to_string())
        .filter(|rpc| rpc.contains("Unstage") || rpc.contains("Unpublish"))
        .collect();
    assert_eq!(
        order,
        [
            "NodeUnpublishVolume",
            "NodeUnstageVolume",
            "ControllerUnpublishVolume"
        ],
        "detached only once unmounted"
    );
    let unpublished = driver.calls("ControllerUnpublishVolume");
    assert_eq!(unpublished[0]["node_id"], format!("id-of-{}", node.name));
    for path in ["{.status.volumesInUse}", "{.status.volumesAttached}"] {
        let shown = kubectl(
            &server,
            &node,
            &["get", "node", &node.name, "-o", &format!("jsonpath={path}")],
        )
        .await;
        assert_eq!(shown.trim(), "", "{path}");
    }
    node.stop().await;
}

/// The Node's `status.volumesInUse`.
async fn volumes_in_use(client: &kube::Client, node: &Node) -> Vec<String> {
    let nodes: Api<ApiNode> = Api::all(client.clone());
    nodes
        .get(&node.name)
        .await
        .ok()
        .and_then(|n| n.status?.volumes_in_use)
        .unwrap_or_default()
}

/// A generic ephemeral volume: the claim `<pod>-<volume>` the API side made for the pod,
/// owned by it (the test API server's ephemeral volume controller), used once bound; a
/// claim of that name not made for the pod is refused with upstream's words.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generic_ephemeral_volume_uses_only_the_claim_made_for_its_pod() {
    if !require_runtime("csi") {
        return;
    }
    let (server, node, pods, driver) = start_with("csi-ephemeral", persistent_driver(false)).await;
    let client = server.client();
    let ephemeral_pod = |name: &str| -> Pod {
        api_pod(
            name,
            &node.name,
            json!({"spec": {
                "containers": [{"name": "c", "image": "busybox:1.36",
                    "command": ["sh", "-c", "cat /data/content; trap 'exit 0' TERM; while true; do sleep 0.2; done"],
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                "volumes": [{"name": "data", "ephemeral": {"volumeClaimTemplate": {
                    "metadata": {"labels": {"made-by": "template"}},
                    "spec": {"accessModes": ["ReadWriteOnce"],
                             "resources": {"requests": {"storage": "1Gi"}}}}}}],
            }}),
        )
    };

    // A claim by that name that someone else made: refused, not used.
    let squatted = node.pod_name("squatted");
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    claims
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": format!("{squatted}-data"), "namespace": "default"},
                "spec": {"accessModes": ["ReadWriteOnce"],
                         "resources": {"requests": {"storage": "1Gi"}}},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    bind(
        &client,
        &format!("{squatted}-data"),
        &format!("pv-squatted-{}", node.name),
        "vol-squatted",
    )
    .await;
    pods.create(&PostParams::default(), &ephemeral_pod(&squatted))
        .await
        .unwrap();
    let want = format!(
        "Unable to attach or mount volumes: unmounted volumes=[data], unattached volumes=[], failed to process volumes=[data]: PVC default/{squatted}-data was not created for pod default/{squatted} (pod is not owner)"
    );
    eventually_event(
        &client,
        "default",
        "FailedMount for the claim not the pod's",
        DEADLINE,
        |e| {
            e.reason.as_deref() == Some("FailedMount")
                && e.message.as_deref() == Some(want.as_str())
        },
    )
    .await;

    // The pod's own claim: made by the API side, owned by the pod; bound, it is used.
    let owned = node.pod_name("owned");
    pods.create(&PostParams::default(), &ephemeral_pod(&owned))
        .await
        .unwrap();
    let uid = uid_of(&pods, &owned).await;
    let claim = claims.get(&format!("{owned}-data")).await.unwrap();
    let owner = &claim.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
        ("Pod", uid.as_str(), Some(true))
    );
    let want = format!(
        "Unable to attach or mount volumes: unmounted volumes=[data], unattached volumes=[], failed to process volumes=[data]: error processing PVC default/{owned}-data: PVC is not bound"
    );
    eventually_event(
        &client,
        "default",
        "FailedMount until bound",
        DEADLINE,
        |e| {
            e.reason.as_deref() == Some("FailedMount")
                && e.message.as_deref() == Some(want.as_str())
        },
    )
    .await;
    let pv = format!("pv-owned-{}", node.name);
    bind(
        &client,
        &format!("{owned}-data"),
        &pv,
        &format!("vol-owned-{}", node.name),
    )
    .await;
    eventually("the pod Ready", DEADLINE, || ready(&pods, &owned)).await;
    let id = node.container_id("owned", "c").await.unwrap();
    let seen = node.exec(&id, &["cat", "/data/content"]).await.unwrap();
    assert_eq!(seen, format!("made for {owned}-data"));
    let target = node.path(&format!(
        "root/pods/{uid}/volumes/kubernetes.io~csi/{pv}/mount"
    ));
    assert!(mount_points_under(&target).contains(&target));
    let phase = pods
        .get(&squatted)
        .await
        .unwrap()
        .status
        .and_then(|s| s.phase);
    assert_eq!(
        phase.as_deref(),
        Some("Pending"),
        "the squatted claim is never used"
    );
    assert!(
        !driver
            .calls("NodePublishVolume")
            .iter()
            .any(|c| c["volume_id"] == "vol-squatted"),
        "the squatted claim's volume was never published"
    );
    node.stop().await;
}

/// A claim bound to a `hostPath` PV, as local-path provisioners make them: the pod gets the
/// host's directory (made by `DirectoryOrCreate`), what it writes stays on the host after
/// it goes and a new pod reads it; a `local` PV whose path is missing waits with
/// upstream's words.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_bound_to_a_host_path_volume_gets_the_hosts_directory() {
    if !require_runtime("csi") {
        return;
    }
    let (server, node, pods, _driver) = start("csi-hostpath", NodeOptions::default()).await;
    let client = server.client();
    let dir = node.path("local-path/pvc-1");
    new_claim(&client, "local-data").await;
    bind_to(
        &client,
        "local-data",
        &format!("pv-local-{}", node.name),
        json!({"hostPath": {"path": dir, "type": "DirectoryOrCreate"}}),
    )
    .await;
    let first = run_claim_pod(
        &pods,
        &node,
        "first",
        "local-data",
        "echo from-first > /data/file",
    )
    .await;
    eventually("the file on the host", DEADLINE, || async {
        std::fs::read_to_string(dir.join("file")).map_err(|e| e.to_string())
    })
    .await;
    eventually("the hostPath mount counted", DEADLINE, || {
        mount_counted(&node, "kubernetes.io/host-path", "success")
    })
    .await;
    pods.delete(&first, &DeleteParams::default()).await.unwrap();
    eventually("the first pod gone", DEADLINE, || async {
        match pods.get_opt(&first).await {
            Ok(None) => Ok(()),
            other => Err(format!("{:?}", other.map(|p| p.is_some()))),
        }
    })
    .await;
    assert_eq!(
        std::fs::read_to_string(dir.join("file")).unwrap(),
        "from-first\n"
    );
    let second = run_claim_pod(&pods, &node, "second", "local-data", "true").await;
    let id = node.container_id("second", "c").await.unwrap();
    let seen = node.exec(&id, &["cat", "/data/file"]).await.unwrap();
    assert_eq!(seen, "from-first\n");

    // A local PV whose directory is not there.
    let missing = node.path("local-path/missing");
    new_claim(&client, "local-missing").await;
    let pv = format!("pv-missing-{}", node.name);
    bind_to(
        &client,
        "local-missing",
        &pv,
        json!({"local": {"path": missing}}),
    )
    .await;
    let waiting = node.pod_name("waiting");
    pods.create(
        &PostParams::default(),
        &claim_pod(&waiting, &node, "local-missing", "true"),
    )
    .await
    .unwrap();
    let want = format!(
        "MountVolume.NewMounter initialization failed for volume \"{pv}\" : path {:?} does not exist",
        missing.display().to_string()
    );
    eventually_event(
        &client,
        "default",
        "FailedMount for the missing local path",
        DEADLINE,
        |e| {
            e.reason.as_deref() == Some("FailedMount")
                && e.message.as_deref() == Some(want.as_str())
        },
    )
    .await;
    eventually("the local volume's failure counted", DEADLINE, || {
        mount_counted(&node, "kubernetes.io/local-volume", "fail-unknown")
    })
    .await;
    ready(&pods, &second).await.unwrap();
    node.stop().await;
}

/// A driver offering VOLUME_MOUNT_GROUP applies the pod's fsGroup itself: upstream's
/// csi_attacher.go `MountDevice` hands it the fsGroup in `NodeStageVolume`'s mount
/// capability (`nodeStageFSGroupArg`), csi_mounter.go `SetUpAt` in `NodePublishVolume`'s,
/// and the kubelet changes no ownership itself (`applyFSGroup` is skipped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_with_volume_mount_group_gets_the_fs_group_at_stage_and_publish() {
    if !require_runtime("csi") {
        return;
    }
    let (server, node, pods, driver) = start_with_driver(
        "csi-mount-group",
        persistent_driver(false),
        "",
        &["--stage", "--volume-mount-group"],
    )
    .await;
    let client = server.client();
    let pv = format!("pv-{}", node.name);
    let handle = format!("vol-{}", node.name);
    bound_claim(&client, "data", &pv, &handle).await;
    // claim_pod's fsGroup is 2345.
    run_claim_pod(&pods, &node, "grouped", "data", "true").await;
    let stages = driver.calls("NodeStageVolume");
    assert_eq!(stages.len(), 1, "{stages:?}");
    assert_eq!(stages[0]["volume_mount_group"], "2345", "{stages:?}");
    let publishes = driver.calls("NodePublishVolume");
    assert_eq!(publishes.len(), 1, "{publishes:?}");
    assert_eq!(publishes[0]["volume_mount_group"], "2345", "{publishes:?}");
    use std::os::unix::fs::MetadataExt;
    let content = driver
        .state_dir
        .join("volumes")
        .join(&handle)
        .join("content");
    assert_eq!(
        std::fs::metadata(&content).unwrap().gid(),
        0,
        "the kubelet left the driver's ownership alone"
    );
    node.stop().await;
}
