//! CSI inline ephemeral volumes and CSI driver registration (issue 32), against the real
//! containerd and a CSI driver process built from the repo (`nodeagent-test-csi-driver`,
//! the CSI spec's protobuf, registering through the kubelet's plugin registration API as
//! node-driver-registrar does). Judged by upstream's words and files, not ours:
//! - the plugin manager's handshake (`GetInfo`, then `NotifyRegistrationStatus`) on a
//!   socket in `<root-dir>/plugins_registry` (`pkg/kubelet/pluginmanager`);
//! - `nodeinfomanager`: the node's CSINode (`spec.drivers[]` with the driver's node ID,
//!   owned by the Node) and the Node's `csi.volume.kubernetes.io/nodeid` annotation, both
//!   cleared when the driver's socket goes;
//! - `csi_mounter.go`: the target path `pods/<uid>/volumes/kubernetes.io~csi/<name>/mount`,
//!   `vol_data.json` beside it, the volume handle `csi-` + sha256(pod UID + volume name),
//!   the pod attributes of `podInfoOnMount` (`csi.storage.k8s.io/pod.name`, ...,
//!   `csi.storage.k8s.io/ephemeral: "true"`), no staging for an inline volume;
//! - `csi_plugin.go`'s refusals, as `kubectl describe` shows them in FailedMount events:
//!   a driver not registered, a CSIDriver without the `Ephemeral` mode.
//!
//! Attacked: the volume service SIGKILLed while the pod runs (no second publish, the mount
//! stays, the pod stays Ready); a driver that is absent when the pod comes (the pod waits,
//! a bystander pod is untouched, and it starts once the driver registers); a failing
//! unpublish (the mount is never removed behind the driver's back; the pod's teardown
//! completes once the driver answers).

use k8s_openapi::api::core::v1::{Node as ApiNode, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use nix::sys::signal::Signal;
use nodeagent_config::Service;
use nodeagent_tests::{
    Node, NodeOptions, api_pod, consistently, eventually, eventually_event, mount_points_under,
    require_runtime,
};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(90);
const DRIVER: &str = "hostpath.csi.nodeagent.test";

struct Driver {
    child: Option<Child>,
    state_dir: PathBuf,
    registry_dir: PathBuf,
    args: Vec<String>,
    log: PathBuf,
}

impl Driver {
    fn new(node: &Node, extra: &[&str]) -> Self {
        let state_dir = node.path("csi-driver");
        std::fs::create_dir_all(&state_dir).unwrap();
        let mut args = vec![
            "--registry-dir".to_string(),
            node.path("root/plugins_registry").display().to_string(),
            "--csi-socket".into(),
            state_dir.join("csi.sock").display().to_string(),
            "--state-dir".into(),
            state_dir.display().to_string(),
            "--node-id".into(),
            format!("id-of-{}", node.name),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        Self {
            child: None,
            registry_dir: node.path("root/plugins_registry"),
            log: node.path("csi-driver.log"),
            state_dir,
            args,
        }
    }

    fn start(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(nodeagent_tests::test_binary("nodeagent-test-csi-driver"))
            .args(&self.args)
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("the test CSI driver starts");
        self.child = Some(child);
    }

    /// Stops it as a registrar stops (SIGTERM: its registration socket goes).
    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::kill(pid, Signal::SIGTERM);
            let _ = child.wait();
        }
    }

    /// The driver's CSI endpoint (all its services, as an external-attacher reaches it).
    fn socket(&self) -> PathBuf {
        self.state_dir.join("csi.sock")
    }

    fn log_lines(&self, file: &str) -> Vec<Value> {
        std::fs::read_to_string(self.state_dir.join(file))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    fn calls(&self, rpc: &str) -> Vec<Value> {
        self.log_lines("calls.log")
            .into_iter()
            .filter(|c| c["rpc"] == rpc)
            .collect()
    }

    /// The calls after the first `n` that could change a volume (all but the capability
    /// and info queries).
    fn changing_calls_since(&self, n: usize) -> Vec<Value> {
        self.log_lines("calls.log")
            .into_iter()
            .skip(n)
            .filter(|c| c["rpc"] != "NodeGetCapabilities" && c["rpc"] != "NodeGetInfo")
            .collect()
    }

    fn inject(&self, file: &str, message: Option<&str>) {
        let path = self.state_dir.join(file);
        match message {
            Some(m) => std::fs::write(path, m).unwrap(),
            None => {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

impl Drop for Driver {
    /// Stops the driver and detaches the loop devices of its block volumes (a test that
    /// failed half way must not leave them to the host, which has few).
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let volumes = std::fs::read_dir(self.state_dir.join("volumes"));
        for file in volumes.into_iter().flatten().flatten() {
            if file.path().extension().is_none_or(|e| e != "img") {
                continue;
            }
            let listed = Command::new("losetup").arg("-j").arg(file.path()).output();
            let listed = listed.map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
            for line in listed.unwrap_or_default().lines() {
                if let Some(device) = line.split(':').next() {
                    let _ = Command::new("losetup").arg("-d").arg(device).status();
                }
            }
        }
    }
}

fn csi_driver_object(modes: &[&str]) -> CSIDriver {
    serde_json::from_value(json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
        "metadata": {"name": DRIVER},
        "spec": {"attachRequired": false, "podInfoOnMount": true,
                 "volumeLifecycleModes": modes, "fsGroupPolicy": "File"},
    }))
    .unwrap()
}

/// A node with an API server that has the driver's CSIDriver (inline volumes allowed),
/// the API's pods, and the driver (not started yet).
async fn start(
    test: &str,
    options: NodeOptions,
) -> (
    nodeagent_tests::apiserver::ApiServer,
    Node,
    Api<Pod>,
    Driver,
) {
    let (server, node) = Node::start_with_api_server(test, options).await;
    let client = server.client();
    let drivers: Api<CSIDriver> = Api::all(client.clone());
    drivers
        .create(&PostParams::default(), &csi_driver_object(&["Ephemeral"]))
        .await
        .unwrap();
    let driver = Driver::new(&node, &[]);
    (server, node, Api::namespaced(client, "default"), driver)
}

/// A pod whose container prints the driver's file in its inline volume, then sleeps.
fn csi_pod(name: &str, node: &Node) -> Pod {
    api_pod(
        name,
        &node.name,
        json!({"spec": {
            "securityContext": {"fsGroup": 2345},
            "containers": [{"name": "c", "image": "busybox:1.36",
                "command": ["sh", "-c", "cat /data/content; echo; trap 'exit 0' TERM; while true; do sleep 0.2; done"],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
            "volumes": [{"name": "data", "csi": {"driver": DRIVER,
                "volumeAttributes": {"content": format!("hello from {name}")}}}],
        }}),
    )
}

/// Upstream's `makeVolumeHandle`, computed here independently of the product.
fn upstream_handle(uid: &str, volume: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, format!("{uid}{volume}").as_bytes());
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("csi-{hex}")
}

async fn uid_of(pods: &Api<Pod>, name: &str) -> String {
    pods.get(name).await.unwrap().metadata.uid.unwrap()
}

async fn ready(pods: &Api<Pod>, name: &str) -> Result<(), String> {
    let p = pods.get(name).await.map_err(|e| e.to_string())?;
    let ready = p
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    ready
        .then_some(())
        .ok_or_else(|| format!("{name} not Ready: {:?}", p.status))
}

/// The node's CSINode drivers as (name, nodeID), and the Node's annotation.
async fn registered(client: &kube::Client, node: &Node) -> (Vec<(String, String)>, Option<String>) {
    let csinodes: Api<CSINode> = Api::all(client.clone());
    let drivers = csinodes
        .get_opt(&node.name)
        .await
        .ok()
        .flatten()
        .map(|c| {
            c.spec
                .drivers
                .into_iter()
                .map(|d| (d.name, d.node_id))
                .collect()
        })
        .unwrap_or_default();
    let nodes: Api<ApiNode> = Api::all(client.clone());
    let annotation = nodes.get(&node.name).await.ok().and_then(|n| {
        n.metadata
            .annotations
            .and_then(|a| a.get("csi.volume.kubernetes.io/nodeid").cloned())
    });
    (drivers, annotation)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inline_volume_is_published_by_its_registered_driver_and_survives_restarts() {
    if !require_runtime("csi") {
        return;
    }
    // Pods resync every 2 s here, so that the windows below see several set-up passes.
    let options = NodeOptions {
        sync_frequency: Some("2s".into()),
        ..NodeOptions::default()
    };
    let (server, mut node, pods, mut driver) = start("csi", options).await;
    let client = server.client();

    // A pod whose driver is not there yet waits, with upstream's FailedMount message; a
    // bystander pod runs meanwhile.
    let early = format!("early-{}", node.name);
    let bystander = format!("bystander-{}", node.name);
    pods.create(&PostParams::default(), &csi_pod(&early, &node))
        .await
        .unwrap();
    pods.create(
        &PostParams::default(),
        &api_pod(&bystander, &node.name, json!({})),
    )
    .await
    .unwrap();
    let want = format!(
        "MountVolume.SetUp failed for volume \"data\" : kubernetes.io/csi: mounter.SetUpAt failed to get CSI client: driver name {DRIVER} not found in the list of registered CSI drivers"
    );
    let event = eventually_event(
        &client,
        "default",
        "FailedMount for the absent driver",
        DEADLINE,
        |e| {
            e.reason.as_deref() == Some("FailedMount")
                && e.involved_object.name.as_deref() == Some(early.as_str())
        },
    )
    .await;
    assert_eq!(event.message.as_deref(), Some(want.as_str()));
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    // As `kubectl describe pod` shows it to a user.
    let kubeconfig = node.path("kubectl.kubeconfig");
    std::fs::write(&kubeconfig, server.kubeconfig()).unwrap();
    let described = tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["describe", "pod", &early])
        .env("HOME", node.path(""))
        .env_remove("KUBECONFIG")
        .output()
        .await
        .expect("kubectl runs");
    let described = String::from_utf8_lossy(&described.stdout);
    assert!(
        described.lines().any(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            words.first() == Some(&"Warning")
                && words.get(1) == Some(&"FailedMount")
                && l.trim_end().ends_with(&want)
        }),
        "kubectl describe pod:\n{described}"
    );
    eventually("the bystander Ready", DEADLINE, || ready(&pods, &bystander)).await;
    let phase = pods.get(&early).await.unwrap().status.and_then(|s| s.phase);
    assert_eq!(phase.as_deref(), Some("Pending"));

    // The driver registers: the handshake, the CSINode and the annotation.
    driver.start();
    let node_id = format!("id-of-{}", node.name);
    eventually(
        "the driver on the node's CSINode and annotation",
        DEADLINE,
        || async {
            let got = registered(&client, &node).await;
            let want = (
                vec![(DRIVER.to_string(), node_id.clone())],
                Some(json!({DRIVER: node_id}).to_string()),
            );
            (got == want)
                .then_some(())
                .ok_or_else(|| format!("{got:?}"))
        },
    )
    .await;
    // The CSINode is written before the driver is told (upstream's plugin manager
    // notifies after its handler returns): wait for the notification itself.
    let notified = || {
        driver
            .log_lines("registration.log")
            .into_iter()
            .filter(|l| l["rpc"] == "NotifyRegistrationStatus")
            .collect::<Vec<Value>>()
    };
    eventually("the registration notified", DEADLINE, || async {
        (!notified().is_empty())
            .then_some(())
            .ok_or_else(|| "not yet".to_string())
    })
    .await;
    assert_eq!(
        notified(),
        vec![json!({"rpc": "NotifyRegistrationStatus", "registered": true, "error": ""})]
    );
    let csinode: Api<CSINode> = Api::all(client.clone());
    let owners = csinode
        .get(&node.name)
        .await
        .unwrap()
        .metadata
        .owner_references
        .unwrap_or_default();
    assert_eq!(
        owners
            .iter()
            .map(|o| (o.kind.as_str(), o.name.as_str()))
            .collect::<Vec<_>>(),
        vec![("Node", node.name.as_str())]
    );

    // The waiting pod starts, its container sees the driver's volume.
    eventually("the early pod Ready", DEADLINE, || ready(&pods, &early)).await;
    let uid = uid_of(&pods, &early).await;
    let id = node
        .container_id("early", "c")
        .await
        .expect("the container");
    let seen = node.exec(&id, &["cat", "/data/content"]).await.unwrap();
    assert_eq!(seen, format!("hello from {early}"));
    let publishes = driver.calls("NodePublishVolume");
    assert_eq!(publishes.len(), 1, "{publishes:?}");
    let publish = &publishes[0];
    let target = node.path(&format!(
        "root/pods/{uid}/volumes/kubernetes.io~csi/data/mount"
    ));
    assert_eq!(publish["volume_id"], upstream_handle(&uid, "data"));
    assert_eq!(publish["target_path"], target.display().to_string());
    assert_eq!(
        publish["staging_target_path"], "",
        "no staging for an inline volume"
    );
    assert_eq!(publish["access_mode"], "SINGLE_NODE_WRITER");
    assert_eq!(publish["readonly"], false);
    assert_eq!(
        publish["volume_context"],
        json!({
            "content": format!("hello from {early}"),
            "csi.storage.k8s.io/ephemeral": "true",
            "csi.storage.k8s.io/pod.name": early,
            "csi.storage.k8s.io/pod.namespace": "default",
            "csi.storage.k8s.io/pod.uid": uid,
            "csi.storage.k8s.io/serviceAccount.name": "default",
        })
    );
    assert!(
        mount_points_under(&target).contains(&target),
        "{target:?} is a mount point"
    );
    let vol_data: Value = serde_json::from_slice(
        &std::fs::read(target.parent().unwrap().join("vol_data.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(vol_data["driverName"], DRIVER);
    assert_eq!(vol_data["volumeHandle"], upstream_handle(&uid, "data"));
    assert_eq!(vol_data["specVolID"], "data");
    assert_eq!(vol_data["volumeLifecycleMode"], "Ephemeral");
    // fsGroup under the driver's `File` policy: the volume's root belongs to the group.
    let group = node
        .exec(&id, &["stat", "-c", "%g", "/data"])
        .await
        .unwrap();
    assert_eq!(group.trim(), "2345");

    // The volume service SIGKILLed and back: nothing is published again, nothing is
    // unmounted, the pod stays Ready through it.
    node.signal(Service::Volume, Signal::SIGKILL).await;
    node.spawn(Service::Volume);
    node.wait_serving(Service::Volume).await;
    consistently(
        "the pod Ready, its volume mounted once",
        Duration::from_secs(5),
        Duration::from_millis(200),
        || async {
            ready(&pods, &early).await?;
            if !mount_points_under(&target).contains(&target) {
                return Err("the volume was unmounted".into());
            }
            let n = driver.calls("NodePublishVolume").len();
            (n == 1)
                .then_some(())
                .ok_or_else(|| format!("{n} publishes"))
        },
    )
    .await;

    // An unpublish that fails leaves the volume mounted (never unmounted behind the
    // driver's back); once the driver answers, the teardown completes.
    driver.inject("fail-unpublish", Some("the backend is busy"));
    pods.delete(&early, &DeleteParams::default()).await.unwrap();
    eventually("an unpublish tried", DEADLINE, || async {
        let n = driver.calls("NodeUnpublishVolume").len();
        (n > 0).then_some(()).ok_or_else(|| "none yet".to_string())
    })
    .await;
    consistently(
        "the volume mounted while its driver fails to unpublish",
        Duration::from_secs(5),
        Duration::from_millis(200),
        || async {
            mount_points_under(&target)
                .contains(&target)
                .then_some(())
                .ok_or_else(|| "unmounted".to_string())
        },
    )
    .await;
    driver.inject("fail-unpublish", None);
    let pod_dir = node.path(&format!("root/pods/{uid}"));
    eventually("the pod's directory gone", DEADLINE, || async {
        (!pod_dir.exists())
            .then_some(())
            .ok_or_else(|| format!("{:?}", mount_points_under(&pod_dir)))
    })
    .await;
    let unpublish = driver.calls("NodeUnpublishVolume").pop().unwrap();
    assert_eq!(unpublish["volume_id"], upstream_handle(&uid, "data"));
    assert_eq!(unpublish["target_path"], target.display().to_string());
    assert!(
        !driver
            .state_dir
            .join("volumes")
            .join(upstream_handle(&uid, "data"))
            .exists(),
        "the ephemeral volume's data is gone with it"
    );
    ready(&pods, &bystander).await.unwrap();

    // The driver goes (its registration socket removed): deregistered from the CSINode and
    // the annotation.
    driver.stop();
    assert!(
        !driver
            .registry_dir
            .join(format!("{DRIVER}-reg.sock"))
            .exists()
    );
    eventually(
        "the driver gone from the CSINode and the annotation",
        DEADLINE,
        || async {
            let got = registered(&client, &node).await;
            (got == (vec![], None))
                .then_some(())
                .ok_or_else(|| format!("{got:?}"))
        },
    )
    .await;
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_upstreams_and_disturb_nothing() {
    if !require_runtime("csi") {
        return;
    }
    let (server, node) = Node::start_with_api_server("csi-refusals", NodeOptions::default()).await;
    let client = server.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");

    // A registrar offering only CSI 0.3 is told why it was refused, and nothing registers.
    let mut old = Driver::new(&node, &["--versions", "0.3.0"]);
    old.start();
    let refusal = eventually("the refusal notified", DEADLINE, || async {
        let refused: Vec<Value> = old
            .log_lines("registration.log")
            .into_iter()
            .filter(|l| l["rpc"] == "NotifyRegistrationStatus" && l["registered"] == false)
            .collect();
        refused
            .first()
            .cloned()
            .ok_or_else(|| "none yet".to_string())
    })
    .await;
    // The operation generator's and ValidatePlugin's words around validateVersions'.
    assert_eq!(
        refusal["error"],
        format!(
            "RegisterPlugin error -- plugin validation failed with err: validation failed for CSI Driver {DRIVER} at endpoint {}: kubernetes.io/csi: ValidatePlugin for CSI driver \"{DRIVER}\" failed. None of the versions specified [\"0.3.0\"] are supported. err=highest supported version reported is 0.3.0, must be v1.x",
            old.state_dir.join("csi.sock").display()
        )
    );
    assert_eq!(registered(&client, &node).await, (vec![], None));
    old.stop();

    let mut driver = Driver::new(&node, &[]);
    driver.start();
    eventually("the driver registered", DEADLINE, || async {
        let got = registered(&client, &node).await;
        (got.0.len() == 1)
            .then_some(())
            .ok_or_else(|| format!("{got:?}"))
    })
    .await;

    // A CSIDriver that does not list Ephemeral: upstream's refusal, and no publish.
    let drivers: Api<CSIDriver> = Api::all(client.clone());
    drivers
        .create(&PostParams::default(), &csi_driver_object(&["Persistent"]))
        .await
        .unwrap();
    let refused = format!("refused-{}", node.name);
    pods.create(&PostParams::default(), &csi_pod(&refused, &node))
        .await
        .unwrap();
    let event = eventually_event(
        &client,
        "default",
        "FailedMount for the mode",
        DEADLINE,
        |e| {
            e.reason.as_deref() == Some("FailedMount")
                && e.involved_object.name.as_deref() == Some(refused.as_str())
        },
    )
    .await;
    assert_eq!(
        event.message.as_deref(),
        Some(format!("MountVolume.SetUp failed for volume \"data\" : kubernetes.io/csi: mounter.SetupAt failed to check volume lifecycle mode: volume mode \"Ephemeral\" not supported by driver {DRIVER} (only supports [\"Persistent\"])").as_str())
    );
    assert!(driver.calls("NodePublishVolume").is_empty());

    // A publish that fails: the driver's own error in the event; the pod starts once the
    // driver succeeds.
    driver.inject("fail-publish", Some("no space left on the backend"));
    drivers
        .delete(DRIVER, &DeleteParams::default())
        .await
        .unwrap();
    drivers
        .create(
            &PostParams::default(),
            &csi_driver_object(&["Persistent", "Ephemeral"]),
        )
        .await
        .unwrap();
    let event = eventually_event(
        &client,
        "default",
        "FailedMount for the publish",
        DEADLINE,
        |e| {
            e.reason.as_deref() == Some("FailedMount")
                && e.involved_object.name.as_deref() == Some(refused.as_str())
                && e.message.as_deref().is_some_and(|m| m.contains("no space"))
        },
    )
    .await;
    assert_eq!(
        event.message.as_deref(),
        Some(
            "MountVolume.SetUp failed for volume \"data\" : rpc error: code = Internal desc = no space left on the backend"
        )
    );
    driver.inject("fail-publish", None);
    eventually("the pod Ready once the driver publishes", DEADLINE, || {
        ready(&pods, &refused)
    })
    .await;
    node.stop().await;
}

/// Which process a kill hits.
#[derive(Debug, Clone, Copy)]
enum Victim {
    Volume,
    PodSync,
    Driver,
}

async fn kill_and_restart(node: &mut Node, driver: &mut Driver, victim: Victim) {
    match victim {
        Victim::Volume | Victim::PodSync => {
            let service = if matches!(victim, Victim::Volume) {
                Service::Volume
            } else {
                Service::PodSync
            };
            node.signal(service, Signal::SIGKILL).await;
            node.spawn(service);
            node.wait_serving(service).await;
        }
        Victim::Driver => {
            // SIGKILL: its registration socket stays behind, as a crashed registrar's does,
            // and the restarted one binds a new one (the registry sees it replaced).
            if let Some(mut child) = driver.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
            driver.start();
        }
    }
}

/// A pod with its inline volume (`csi_pod`), the claim `shared` mounted at /shared and the
/// Block claim `disk` as the device /dev/xvda.
fn csi_pod_with_claims(name: &str, node: &Node) -> Pod {
    let mut pod = serde_json::to_value(csi_pod(name, node)).unwrap();
    let volumes = pod["spec"]["volumes"].as_array_mut().unwrap();
    volumes.push(json!({"name": "shared", "persistentVolumeClaim": {"claimName": "shared"}}));
    volumes.push(json!({"name": "disk", "persistentVolumeClaim": {"claimName": "disk"}}));
    pod["spec"]["containers"][0]["volumeMounts"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "shared", "mountPath": "/shared"}));
    pod["spec"]["containers"][0]["volumeDevices"] =
        json!([{"name": "disk", "devicePath": "/dev/xvda"}]);
    serde_json::from_value(pod).unwrap()
}

/// SIGKILLs of the volume service, pod-sync and the driver at random moments of mount
/// and unmount cycles (a fixed seed in CI; `CSI_CHAOS_SEED` and `CSI_CHAOS_CYCLES` for a
/// longer run by hand). Upstream's volume reconstruction has had long-lived bugs here
/// (volumes unmounted under running pods, mounts left behind after a restart): a pod
/// that keeps running keeps its volumes, mounted and never unpublished, its claimed
/// volumes (a filesystem and a Block one, which every pod of the cycles shares) are
/// never unstaged while it runs, and every other pod's volumes are unpublished through
/// the driver, with nothing left mounted or mapped; once the last pod goes, the claimed
/// volumes are unstaged and the block volume's loop device detached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kills_at_any_step_unmount_nothing_in_use_and_leave_nothing_behind() {
    if !require_runtime("csi") {
        return;
    }
    let env = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let mut rng = nodeagent_tests::chaos::Rng::new(env("CSI_CHAOS_SEED", 32));
    let cycles = env("CSI_CHAOS_CYCLES", 20);
    let (server, mut node, pods, driver) = start("csi-kills", NodeOptions::default()).await;
    drop(driver);
    let client = server.client();
    let drivers: Api<CSIDriver> = Api::all(client.clone());
    drivers
        .delete(DRIVER, &DeleteParams::default())
        .await
        .unwrap();
    drivers
        .create(&PostParams::default(), &claims::persistent_driver(true))
        .await
        .unwrap();
    let shared_handle = format!("vol-{}", node.name);
    claims::bound_claim(&client, "shared", "pv-shared", &shared_handle).await;
    let disk_handle = format!("blk-{}", node.name);
    claims::new_claim(&client, "disk").await;
    claims::bind_to(
        &client,
        "disk",
        "pv-disk",
        json!({"volumeMode": "Block", "csi": {"driver": DRIVER, "volumeHandle": disk_handle,
            "volumeAttributes": {"content": "made for disk"}}}),
    )
    .await;
    let block_base = node.path("root/plugins/kubernetes.io/csi/volumeDevices");
    let staging = node.path(&format!(
        "root/plugins/kubernetes.io/csi/{DRIVER}/{}/globalmount",
        claims::sha256_hex(&shared_handle)
    ));
    let mut driver = Driver::new(&node, &["--stage"]);
    driver.start();
    // Both claims need attach: the test API server's attach/detach controller and the
    // driver's external-attacher attach them while the steady pod uses them, and detach
    // them only after it goes.
    server.state.attachers.deploy(DRIVER, &driver.socket());

    let steady = node.pod_name("steady");
    pods.create(&PostParams::default(), &csi_pod_with_claims(&steady, &node))
        .await
        .unwrap();
    eventually("the steady pod Ready", DEADLINE, || ready(&pods, &steady)).await;
    let steady_uid = uid_of(&pods, &steady).await;
    let steady_handle = upstream_handle(&steady_uid, "data");
    let steady_target = node.path(&format!(
        "root/pods/{steady_uid}/volumes/kubernetes.io~csi/data/mount"
    ));
    let steady_id = node.container_id("steady", "c").await.unwrap();
    let steady_shared = node.path(&format!(
        "root/pods/{steady_uid}/volumes/kubernetes.io~csi/pv-shared/mount"
    ));
    let steady_disk = block_base.join("publish/pv-disk").join(&steady_uid);

    let victims = [Victim::Volume, Victim::PodSync, Victim::Driver];
    for cycle in 0..cycles {
        let name = node.pod_name(&format!("cycle{cycle}"));
        pods.create(&PostParams::default(), &csi_pod_with_claims(&name, &node))
            .await
            .unwrap();
        tokio::time::sleep(rng.millis(0, 2500)).await;
        let victim = rng.pick(&victims);
        eprintln!("cycle {cycle}: {victim:?} killed while {name} starts");
        kill_and_restart(&mut node, &mut driver, victim).await;
        eventually(&format!("{name} Ready"), DEADLINE, || ready(&pods, &name)).await;
        let uid = uid_of(&pods, &name).await;

        pods.delete(&name, &DeleteParams::default()).await.unwrap();
        tokio::time::sleep(rng.millis(0, 2500)).await;
        let victim = rng.pick(&victims);
        eprintln!("cycle {cycle}: {victim:?} killed while {name} goes");
        kill_and_restart(&mut node, &mut driver, victim).await;
        let pod_dir = node.path(&format!("root/pods/{uid}"));
        eventually(&format!("{name}'s directory gone"), DEADLINE, || async {
            (!pod_dir.exists())
                .then_some(())
                .ok_or_else(|| format!("{:?}", mount_points_under(&pod_dir)))
        })
        .await;

        // The steady pod: Ready, its volume mounted and readable, never unpublished.
        ready(&pods, &steady).await.unwrap();
        assert!(mount_points_under(&steady_target).contains(&steady_target));
        let seen = node
            .exec(&steady_id, &["cat", "/data/content"])
            .await
            .unwrap();
        assert_eq!(seen, format!("hello from {steady}"));
        assert!(mount_points_under(&steady_shared).contains(&steady_shared));
        assert!(mount_points_under(&staging).contains(&staging));
        let seen = node
            .exec(&steady_id, &["cat", "/shared/content"])
            .await
            .unwrap();
        assert_eq!(seen, "made for shared");
        assert!(mount_points_under(&steady_disk).contains(&steady_disk));
        let seen = node
            .exec(&steady_id, &["head", "-c", "13", "/dev/xvda"])
            .await
            .unwrap();
        assert_eq!(seen, "made for disk");
        let unstages = driver.calls("NodeUnstageVolume");
        assert!(unstages.is_empty(), "unstaged while in use: {unstages:?}");
        let detaches = driver.calls("ControllerUnpublishVolume");
        assert!(detaches.is_empty(), "detached while in use: {detaches:?}");
    }
    assert_eq!(
        driver.calls("ControllerPublishVolume").len(),
        2,
        "each claim attached once"
    );

    // Every publish but the steady pod's was followed by an unpublish of the same volume,
    // the steady one never; the driver keeps only the steady pod's data; nothing of the
    // cycles' pods is mounted.
    // Each inline volume has its own handle; the shared claim's publications are told
    // apart by their target paths.
    let mut last: std::collections::BTreeMap<String, String> = Default::default();
    for call in driver.log_lines("calls.log") {
        let rpc = call["rpc"].as_str().unwrap_or_default();
        if rpc == "NodePublishVolume" || rpc == "NodeUnpublishVolume" {
            let key = if call["volume_id"] == shared_handle.as_str()
                || call["volume_id"] == disk_handle.as_str()
            {
                call["target_path"].as_str().unwrap().to_string()
            } else {
                call["volume_id"].as_str().unwrap().to_string()
            };
            last.insert(key, rpc.to_string());
        }
    }
    assert_eq!(last.len() as u64, 3 * (cycles + 1), "{last:?}");
    let steady_unpublished = driver
        .calls("NodeUnpublishVolume")
        .into_iter()
        .filter(|c| c["volume_id"] == steady_handle.as_str())
        .count();
    assert_eq!(
        steady_unpublished, 0,
        "the steady pod's volume was never unpublished"
    );
    let steady_shared_key = steady_shared.display().to_string();
    let steady_disk_key = steady_disk.display().to_string();
    for (key, rpc) in &last {
        let want = if *key == steady_handle || *key == steady_shared_key || *key == steady_disk_key
        {
            "NodePublishVolume"
        } else {
            "NodeUnpublishVolume"
        };
        assert_eq!(rpc, want, "{key}");
    }
    let mut kept: Vec<String> = std::fs::read_dir(driver.state_dir.join("volumes"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    kept.sort();
    let mut want_kept = vec![
        steady_handle.clone(),
        shared_handle.clone(),
        format!("{disk_handle}.img"),
    ];
    want_kept.sort();
    assert_eq!(kept, want_kept);
    let mut csi_mounts: Vec<PathBuf> = mount_points_under(&node.path("root/pods"))
        .into_iter()
        .filter(|p| p.to_string_lossy().contains("kubernetes.io~csi"))
        .collect();
    csi_mounts.sort();
    let mut want_mounts = vec![steady_target, steady_shared];
    want_mounts.sort();
    assert_eq!(csi_mounts, want_mounts);
    // Of the block volume, only the steady pod's publication and global map file.
    let mut block_mounts = mount_points_under(&block_base);
    block_mounts.sort();
    let mut want_block = vec![
        steady_disk.clone(),
        block_base.join("pv-disk/dev").join(&steady_uid),
    ];
    want_block.sort();
    assert_eq!(block_mounts, want_block);
    let links: Vec<String> = std::fs::read_dir(node.path("root/pods"))
        .unwrap()
        .flatten()
        .filter(|p| {
            p.path()
                .join("volumeDevices/kubernetes.io~csi/pv-disk")
                .symlink_metadata()
                .is_ok()
        })
        .map(|p| p.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        links,
        vec![steady_uid.clone()],
        "only the steady pod's link"
    );

    // The last pod goes: the claimed volume is unstaged, once, and nothing stays mounted.
    pods.delete(&steady, &DeleteParams::default())
        .await
        .unwrap();
    let staging_dir = staging.parent().unwrap().to_path_buf();
    let disk_file = driver
        .state_dir
        .join("volumes")
        .join(format!("{disk_handle}.img"));
    eventually("the claimed volumes unstaged", DEADLINE, || async {
        let left: Vec<PathBuf> = mount_points_under(&node.path("root"))
            .into_iter()
            .filter(|p| p.to_string_lossy().contains("csi"))
            .collect();
        let unstages = driver.calls("NodeUnstageVolume").len();
        let loops = String::from_utf8_lossy(
            &Command::new("losetup")
                .arg("-j")
                .arg(&disk_file)
                .output()
                .expect("losetup runs")
                .stdout,
        )
        .into_owned();
        (left.is_empty()
            && unstages == 2
            && !staging_dir.exists()
            && !block_base.exists()
            && loops.is_empty())
        .then_some(())
        .ok_or_else(|| format!("{left:?}, {unstages} unstages, loops {loops:?}"))
    })
    .await;
    // Then both detached: no VolumeAttachment left.
    let attachments: Api<k8s_openapi::api::storage::v1::VolumeAttachment> =
        Api::all(client.clone());
    eventually("the claims detached", DEADLINE, || async {
        let left = attachments
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .len();
        let detaches = driver.calls("ControllerUnpublishVolume").len();
        (left == 0 && detaches == 2)
            .then_some(())
            .ok_or_else(|| format!("{left} attachments, {detaches} detaches"))
    })
    .await;
    node.stop().await;
}
mod attach;
mod block;
mod claim_usage;
mod claims;
mod tokens;
