//! Device plugins and the pod-resources API's devices (issue 33), against the real
//! containerd and a device plugin process built from the repo
//! (`nodeagent-test-device-plugin`, upstream's v1beta1 API: fake devices backed by real
//! character devices). Judged by upstream's words and files: the kubelet documentation's
//! "Device Plugins" page (a plugin registers on `device-plugins/kubelet.sock`; a pod asks
//! for the resource in its limits; the kubelet removes the directory's sockets at its
//! start and a plugin registers again), `devicemanager/manager.go`'s texts for a pod that
//! cannot have its devices (`UnexpectedAdmissionError`, "Allocate failed due to ..., which
//! is unexpected", `rejectPod`'s "Pod was rejected: "), its `GetCapacity` (allocatable is
//! the healthy devices; a plugin gone leaves them unhealthy), its checkpoint file
//! (`kubelet_internal_checkpoint`, `{"Data":{"PodDeviceEntries":...}}`), and by what the
//! container itself sees (the device node, writable through the device cgroup; the
//! plugin's environment and mount).
//! Attacked: SIGKILLs of every service and of the plugin while the pods run: no device
//! is given again (the plugin logs no new Allocate), nothing a user watches moves, the
//! pod-resources API answers the same; a plugin registering with another API version is
//! refused in upstream's words. Upstream's metrics (`metrics.go`:
//! `kubelet_device_plugin_registration_total`, `kubelet_device_plugin_alloc_duration_seconds`)
//! count the registrations and time the Allocate calls.

use nix::sys::signal::Signal;
use nodeagent_config::Service;
use nodeagent_proto::deviceplugin::RegisterRequest;
use nodeagent_proto::deviceplugin::registration_client::RegistrationClient;
use nodeagent_proto::podresources::pod_resources_lister_client::PodResourcesListerClient;
use nodeagent_proto::podresources::{AllocatableResourcesRequest, ListPodResourcesRequest};
use nodeagent_tests::{Node, NodeOptions, eventually, require_runtime};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(90);
const RESOURCE: &str = "example.com/fake";

struct Plugin {
    child: Child,
    state_dir: PathBuf,
    plugin_dir: PathBuf,
}

impl Plugin {
    fn start(node: &Node) -> Self {
        let state_dir = node.path("fake-devices");
        let plugin_dir = node.path("root/device-plugins");
        std::fs::create_dir_all(&state_dir).unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(node.path("device-plugin.log"))
            .unwrap();
        let child = Command::new(nodeagent_tests::test_binary("nodeagent-test-device-plugin"))
            .arg("--plugin-dir")
            .arg(&plugin_dir)
            .arg("--state-dir")
            .arg(&state_dir)
            .args([
                "--resource",
                RESOURCE,
                "--devices",
                "2",
                "--preferred",
                "--pre-start",
            ])
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("the test device plugin starts");
        Self {
            child,
            state_dir,
            plugin_dir,
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The plugin's log of Allocate, GetPreferredAllocation and PreStartContainer calls.
    fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.state_dir.join("allocations.log"))
            .unwrap_or_default()
            .lines()
            .map(String::from)
            .collect()
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        self.kill();
    }
}

fn manifest(name: &str) -> String {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": "busybox:1.36",
                            "command": ["sleep", "3600"],
                            "resources": {"limits": {RESOURCE: "1"}}}],
        }
    })
    .to_string()
}

/// The Node's capacity and allocatable of the plugin's resource (absent: "").
async fn node_resource(node: &Node) -> Result<(String, String), String> {
    let n = node.node_object().await?;
    let get = |k: &str| {
        n["status"][k][RESOURCE]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    Ok((get("capacity"), get("allocatable")))
}

async fn eventually_resource(node: &Node, want: (&str, &str), what: &str) {
    eventually(what, DEADLINE, || async {
        let got = node_resource(node).await?;
        (got.0 == want.0 && got.1 == want.1)
            .then_some(())
            .ok_or_else(|| format!("capacity/allocatable {got:?}, want {want:?}"))
    })
    .await
}

/// Each listed pod (namespace/name) with its container's devices, and the allocatable
/// device IDs, as the pod-resources API answers.
type PodDevices = Vec<(String, Vec<(String, Vec<String>)>)>;
type Listed = (PodDevices, Vec<String>);

async fn pod_resources(node: &Node) -> Result<Listed, String> {
    let address = nodeagent_config::Address::Unix(node.path("root/pod-resources/kubelet.sock"));
    let mut client = PodResourcesListerClient::new(nodeagent_transport::connect(&address));
    let list = client
        .list(ListPodResourcesRequest {})
        .await
        .map_err(|e| e.to_string())?
        .into_inner();
    let mut pods: PodDevices = list
        .pod_resources
        .into_iter()
        .map(|p| {
            let containers = p
                .containers
                .into_iter()
                .map(|c| {
                    let ids = c
                        .devices
                        .into_iter()
                        .filter(|d| d.resource_name == RESOURCE)
                        .flat_map(|d| d.device_ids)
                        .collect();
                    (c.name, ids)
                })
                .collect();
            (format!("{}/{}", p.namespace, p.name), containers)
        })
        .collect();
    pods.sort();
    let allocatable = client
        .get_allocatable_resources(AllocatableResourcesRequest {})
        .await
        .map_err(|e| e.to_string())?
        .into_inner()
        .devices
        .into_iter()
        .flat_map(|d| d.device_ids)
        .collect();
    Ok((pods, allocatable))
}

/// What the container sees of its device: the plugin's environment variable, the device
/// node it names (written to: the device cgroup lets it through), the plugin's mount.
async fn device_seen(node: &Node, id: &str) -> Result<String, String> {
    let out = node
        .exec(
            id,
            &[
                "sh",
                "-c",
                "echo $FAKE_DEVICES; ls /dev | grep fake; echo x > /dev/$FAKE_DEVICES && echo written; cat /run/fake-devices/vendor",
            ],
        )
        .await?;
    let lines: Vec<&str> = out.lines().collect();
    match lines.as_slice() {
        [env, listed, "written", "nodeagent test device plugin"] if env == listed => {
            Ok(env.to_string())
        }
        _ => Err(format!("the container sees {out:?}")),
    }
}

fn checkpoint_entries(node: &Node) -> Vec<(String, String, Value)> {
    let text =
        std::fs::read_to_string(node.path("root/device-plugins/kubelet_internal_checkpoint"))
            .unwrap_or_default();
    let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    let mut entries: Vec<(String, String, Value)> = v["Data"]["PodDeviceEntries"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            (
                e["PodUID"].as_str().unwrap_or_default().to_string(),
                e["ResourceName"].as_str().unwrap_or_default().to_string(),
                e["DeviceIDs"].clone(),
            )
        })
        .collect();
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    entries
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_devices_reach_containers_once_and_survive_restarts() {
    if !require_runtime("device_plugins") {
        return;
    }
    let mut node = Node::start("device-plugins", NodeOptions::default()).await;
    let mut plugin = Plugin::start(&node);
    eventually_resource(&node, ("2", "2"), "the plugin's two devices on the Node").await;

    // A plugin of another API version is refused, in upstream's words.
    let mut registration = RegistrationClient::new(nodeagent_transport::connect(
        &nodeagent_config::Address::Unix(plugin.plugin_dir.join("kubelet.sock")),
    ));
    let refused = registration
        .register(RegisterRequest {
            version: "v1alpha1".into(),
            endpoint: "old.sock".into(),
            resource_name: "example.com/old".into(),
            options: None,
        })
        .await
        .unwrap_err();
    assert_eq!(
        refused.message(),
        r#"requested API version "v1alpha1" is not supported by kubelet. Supported version is ["v1beta1"]"#
    );

    // Two pods, one device each: disjoint, each seen inside its container.
    node.write_manifest("a.yaml", &manifest("a"));
    node.write_manifest("b.yaml", &manifest("b"));
    let a = node.running_container("a", "c", DEADLINE).await;
    let b = node.running_container("b", "c", DEADLINE).await;
    let dev_a = device_seen(&node, &a).await.unwrap();
    let dev_b = device_seen(&node, &b).await.unwrap();
    assert_ne!(dev_a, dev_b, "one device each");
    // The plugin's annotation reached the runtime's container.
    for (id, dev) in [(&a, &dev_a), (&b, &dev_b)] {
        let containers = node.containers().await;
        let c = containers.iter().find(|c| &c.id == id).unwrap();
        assert_eq!(
            c.annotations.get("example.com/fake-devices"),
            Some(dev),
            "{:?}",
            c.annotations
        );
    }
    let calls = plugin.calls();
    let allocated: Vec<&String> = calls
        .iter()
        .filter(|l| l.starts_with("Allocate "))
        .collect();
    assert_eq!(allocated.len(), 2, "{calls:?}");
    // The plugin's preference was asked and followed (it prefers the highest ID: the first
    // pod got fake-1), and PreStartContainer was called, as the plugin's options asked.
    assert!(
        calls.iter().any(|l| l == "GetPreferredAllocation fake-1")
            && calls.contains(&"Allocate fake-1".to_string()),
        "{calls:?}"
    );
    assert!(
        calls.iter().any(|l| l.starts_with("PreStartContainer ")),
        "{calls:?}"
    );

    // upstream's metrics: two registrations counted (ours and the refused one), two
    // Allocate calls timed, by resource name.
    let mut metrics = nodeagent_proto::api::metrics_client::MetricsClient::new(
        nodeagent_transport::connect(&node.socket(Service::PodSync)),
    );
    let text = metrics
        .scrape(nodeagent_proto::api::ScrapeRequest {})
        .await
        .unwrap()
        .into_inner()
        .text;
    // The service's own exposition (http-server's /metrics serves it with upstream's TYPE
    // lines): each sample's value by its name and resource.
    let value = |sample: &str, resource: &str| {
        let label = format!("resource_name=\"{resource}\"");
        text.lines()
            .find(|l| l.starts_with(&format!("{sample}{{")) && l.contains(&label))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
    };
    assert_eq!(
        value("kubelet_device_plugin_registration_total", RESOURCE),
        Some(1.0)
    );
    assert_eq!(
        value(
            "kubelet_device_plugin_registration_total",
            "example.com/old"
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            "kubelet_device_plugin_alloc_duration_seconds_count",
            RESOURCE
        ),
        Some(2.0)
    );

    // The pod-resources API: each pod's container with its device, both devices allocatable.
    let name = |p: &str| format!("default/{}", node.pod_name(p));
    let (listed, allocatable) = pod_resources(&node).await.unwrap();
    assert!(
        listed.contains(&(name("a"), vec![("c".into(), vec![dev_a.clone()])])),
        "{listed:?}"
    );
    assert!(
        listed.contains(&(name("b"), vec![("c".into(), vec![dev_b.clone()])])),
        "{listed:?}"
    );
    assert_eq!(
        allocatable,
        vec!["fake-0".to_string(), "fake-1".to_string()]
    );

    // The checkpoint, upstream's file: one entry per pod, the device without topology.
    let uid = |v: &Value| v["metadata"]["uid"].as_str().unwrap().to_string();
    let (uid_a, uid_b) = (
        uid(&node.pod("a").await.unwrap()),
        uid(&node.pod("b").await.unwrap()),
    );
    let mut want = vec![
        (uid_a.clone(), RESOURCE.to_string(), json!({"-1": [dev_a]})),
        (uid_b.clone(), RESOURCE.to_string(), json!({"-1": [dev_b]})),
    ];
    want.sort_by(|x, y| x.0.cmp(&y.0));
    assert_eq!(checkpoint_entries(&node), want);

    // A third pod: no device is left; refused before anything of it runs.
    node.write_manifest("c.yaml", &manifest("third"));
    let refused = node.pod_in_phase("third", "Failed", DEADLINE).await;
    assert_eq!(refused["status"]["reason"], "UnexpectedAdmissionError");
    assert_eq!(
        refused["status"]["message"],
        format!(
            "Pod was rejected: Allocate failed due to requested number of devices unavailable for {RESOURCE}. Requested: 1, Available: 0, which is unexpected"
        )
    );
    assert_eq!(node.container_id("third", "c").await, None);

    // SIGKILL each of the seven services, then the plugin: no device is given again,
    // nothing a user watches moves, the pod-resources API answers the same.
    let before = (node.watched("a").await, node.watched("b").await);
    assert_eq!(
        (&before.0[0], &before.0[1]),
        (&json!("Running"), &json!("True"))
    );
    let resources_before = pod_resources(&node).await.unwrap();
    let calls_before = plugin.calls().len();
    for service in Service::ALL {
        node.signal(service, Signal::SIGKILL).await;
        node.spawn(service);
        node.wait_serving(service).await;
    }
    plugin.kill();
    let mut plugin = Plugin::start(&node);
    // upstream's allocatable is the healthy devices, held or not (the scheduler counts
    // the held ones).
    eventually_resource(
        &node,
        ("2", "2"),
        "the plugin's devices on the Node after the restarts",
    )
    .await;
    let resources_after = eventually("the pod-resources API back", DEADLINE, || async {
        let r = pod_resources(&node).await?;
        (r == resources_before)
            .then_some(r.clone())
            .ok_or_else(|| format!("{r:?}, want {resources_before:?}"))
    })
    .await;
    assert_eq!(resources_after, resources_before);
    for _ in 0..3 {
        node.wait_relists(2).await;
        assert_eq!(node.watched("a").await, before.0);
        assert_eq!(node.watched("b").await, before.1);
        assert_eq!(device_seen(&node, &a).await.unwrap(), dev_a);
        assert_eq!(device_seen(&node, &b).await.unwrap(), dev_b);
        assert_eq!(
            node.pod("third").await.unwrap()["status"]["phase"],
            "Failed"
        );
    }
    assert_eq!(
        plugin.calls().len(),
        calls_before,
        "no device was allocated again: {:?}",
        plugin.calls()
    );
    assert_eq!(checkpoint_entries(&node), want);

    // A device turned unhealthy leaves allocatable; a plugin gone leaves none.
    std::fs::write(plugin.state_dir.join("unhealthy"), "fake-0\n").unwrap();
    eventually_resource(&node, ("2", "1"), "fake-0 unhealthy").await;
    let (_, allocatable) = pod_resources(&node).await.unwrap();
    assert_eq!(allocatable, vec!["fake-1".to_string()]);
    plugin.kill();
    eventually_resource(&node, ("2", "0"), "the plugin gone").await;
    node.write_manifest("d.yaml", &manifest("fourth"));
    let refused = node.pod_in_phase("fourth", "Failed", DEADLINE).await;
    assert_eq!(
        refused["status"]["message"],
        format!(
            "Pod was rejected: Allocate failed due to no healthy devices present; cannot allocate unhealthy devices {RESOURCE}, which is unexpected"
        )
    );
    assert_eq!(
        node.watched("a").await,
        before.0,
        "a running pod keeps its device"
    );

    // A pod that goes gives its device back (the checkpoint forgets it).
    node.remove_manifest("a.yaml");
    eventually("a's device freed", DEADLINE, || async {
        let entries = checkpoint_entries(&node);
        (entries.len() == 1 && entries[0].0 == uid_b)
            .then_some(())
            .ok_or_else(|| format!("{entries:?}"))
    })
    .await;
    drop(plugin);
    node.stop().await;
}
