//! Node pressure conditions under real pressure: the node's root directory on a small
//! loop-mounted ext4 filesystem that the test fills (DiskPressure), and a pod that forks
//! hundreds of processes (PIDPressure). What a user watches is checked: the Node object in
//! the API server, node events, and that the pod already running is not touched. Needs root
//! (losetup, mount) and containerd.

use k8s_openapi::api::core::v1::{Node as KubeNode, NodeCondition};
use kube::Api;
use nodeagent_config::Service;
use nodeagent_tests::{Node, NodeOptions, eventually, eventually_event, require_runtime};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(90);

/// A small ext4 filesystem on a loop device, mounted at `at` until dropped.
struct LoopFs {
    image: PathBuf,
    at: PathBuf,
}

impl LoopFs {
    fn mount(image: &Path, at: &Path, mib: u64) -> LoopFs {
        let f = std::fs::File::create(image).expect("create the image");
        f.set_len(mib << 20).expect("size the image");
        drop(f);
        let ok = |c: &mut Command| {
            let out = c.output().expect("run");
            assert!(
                out.status.success(),
                "{c:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        // -m 0: no blocks reserved for root, so what statvfs calls available is all free.
        ok(Command::new("mkfs.ext4")
            .args(["-q", "-F", "-m", "0"])
            .arg(image));
        std::fs::create_dir_all(at).expect("mkdir");
        ok(Command::new("mount")
            .args(["-o", "loop"])
            .arg(image)
            .arg(at));
        LoopFs {
            image: image.to_path_buf(),
            at: at.to_path_buf(),
        }
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        // Lazy: the node's own mounts under it (none expected) must not keep it.
        let _ = Command::new("umount").arg("-l").arg(&self.at).status();
        let _ = std::fs::remove_file(&self.image);
    }
}

async fn conditions(node: &Node) -> Result<Vec<NodeCondition>, String> {
    let n: KubeNode =
        serde_json::from_value(node.node_object().await?).map_err(|e| e.to_string())?;
    Ok(n.status.and_then(|s| s.conditions).unwrap_or_default())
}

fn status_of(conditions: &[NodeCondition], kind: &str) -> String {
    conditions
        .iter()
        .find(|c| c.type_ == kind)
        .map(|c| format!("{} ({})", c.status, c.reason.as_deref().unwrap_or_default()))
        .unwrap_or_else(|| "missing".into())
}

async fn wait_condition(node: &Node, kind: &str, want: &str) -> NodeCondition {
    eventually(&format!("{kind} {want}"), DEADLINE, || async {
        let cs = conditions(node).await?;
        cs.iter()
            .find(|c| c.type_ == kind && c.status == want)
            .cloned()
            .ok_or_else(|| format!("{kind} is {}", status_of(&cs, kind)))
    })
    .await
}

const SLEEPER: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: bystander
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: busybox:1.36
    command: ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]
"#;

/// The bystander's container, once running.
async fn bystander(node: &Node) -> String {
    eventually("the bystander running", DEADLINE, || async {
        node.container_id("bystander", "main")
            .await
            .ok_or_else(|| "no container yet".to_string())
    })
    .await
}

/// pod-sync's eviction manager and node-status read the signals every 2 s instead of
/// upstream's 10 (`--eviction-monitoring-period`): the tests wait on what they see.
fn fast_monitoring() -> Vec<(Service, Vec<String>)> {
    [Service::PodSync, Service::NodeStatus]
        .into_iter()
        .map(|s| (s, vec!["--eviction-monitoring-period=2s".to_string()]))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_pressure_follows_a_filling_nodefs_and_holds_through_a_restart() {
    if !require_runtime("disk pressure") {
        return;
    }
    // The transition period is long enough that the restart below happens inside it.
    let options = NodeOptions {
        extra_config: "evictionHard:\n  nodefs.available: 50%\n\
                       evictionPressureTransitionPeriod: 40s\nnodeStatusUpdateFrequency: 1s\n"
            .into(),
        no_services: true,
        service_args: fast_monitoring(),
        ..Default::default()
    };
    let (server, mut node) = Node::start_with_api_server("diskpressure", options).await;
    let fs = LoopFs::mount(&node.path("nodefs.img"), &node.path("root"), 96);
    for s in Service::ALL {
        node.spawn(s);
    }
    node.write_manifest("bystander.yaml", SLEEPER);
    let container = bystander(&node).await;

    let calm = wait_condition(&node, "DiskPressure", "False").await;
    assert_eq!(calm.reason.as_deref(), Some("KubeletHasNoDiskPressure"));
    assert_eq!(
        status_of(&conditions(&node).await.unwrap(), "Ready"),
        "True (KubeletReady)"
    );

    // Fill the node's filesystem to about 70 %: less than half of it is available.
    let fill = fs.at.join("fill");
    let status = Command::new("fallocate")
        .args(["-l", "66M"])
        .arg(&fill)
        .status()
        .expect("fallocate");
    assert!(status.success());
    let pressed = wait_condition(&node, "DiskPressure", "True").await;
    assert_eq!(pressed.reason.as_deref(), Some("KubeletHasDiskPressure"));
    assert_eq!(
        pressed.message.as_deref(),
        Some("kubelet has disk pressure")
    );
    assert!(pressed.last_transition_time.is_some());

    // The user's view: the Node in the API server and the node event.
    let client = server.client();
    let nodes: Api<KubeNode> = Api::all(client.clone());
    eventually(
        "the Node's DiskPressure True in the API server",
        DEADLINE,
        || async {
            let n = nodes.get(&node.name).await.map_err(|e| e.to_string())?;
            let cs = n.status.and_then(|s| s.conditions).unwrap_or_default();
            (status_of(&cs, "DiskPressure") == "True (KubeletHasDiskPressure)")
                .then_some(())
                .ok_or_else(|| status_of(&cs, "DiskPressure"))
        },
    )
    .await;
    let name = node.name.clone();
    let event = eventually_event(
        &client,
        "default",
        "the NodeHasDiskPressure event",
        DEADLINE,
        |e| {
            e.reason.as_deref() == Some("NodeHasDiskPressure")
                && e.involved_object.name.as_deref() == Some(name.as_str())
        },
    )
    .await;
    assert_eq!(
        event.message.as_deref(),
        Some(format!("Node {name} status is now: NodeHasDiskPressure").as_str())
    );
    assert_eq!(event.involved_object.kind.as_deref(), Some("Node"));

    // A new pod is refused while the disk is short (once pod-sync's eviction manager has
    // seen it): Failed, reason Evicted, with upstream's admission message.
    eventually(
        "pod-sync's eviction manager sees the threshold met",
        DEADLINE,
        || async {
            node.log(Service::PodSync)
                .contains("eviction threshold met")
                .then_some(())
                .ok_or_else(|| "not yet".to_string())
        },
    )
    .await;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), "default");
    let late = node.pod_name("late");
    pods.create(
        &kube::api::PostParams::default(),
        &nodeagent_tests::api_pod(&late, &node.name, serde_json::json!({})),
    )
    .await
    .unwrap();
    let refused = nodeagent_tests::api_pod_in_phase(&pods, &late, "Failed", DEADLINE).await;
    let status = refused.status.unwrap();
    assert_eq!(status.reason.as_deref(), Some("Evicted"));
    assert_eq!(
        status.message.as_deref(),
        Some("Pod was rejected: The node had condition: [DiskPressure]. ")
    );
    assert!(
        node.container_id("late", "c").await.is_none(),
        "nothing of a refused pod runs"
    );

    // Free the space: the condition holds through the transition period, also across a
    // restart of node-status.
    std::fs::remove_file(&fill).expect("free the space");
    node.signal(Service::NodeStatus, nix::sys::signal::Signal::SIGKILL)
        .await;
    node.spawn(Service::NodeStatus);
    node.wait_serving(Service::NodeStatus).await;
    let held = conditions(&node)
        .await
        .expect("node status after the restart");
    assert_eq!(
        status_of(&held, "DiskPressure"),
        "True (KubeletHasDiskPressure)",
        "a restart inside the transition period must not clear the condition"
    );
    let cleared = wait_condition(&node, "DiskPressure", "False").await;
    assert_eq!(cleared.reason.as_deref(), Some("KubeletHasNoDiskPressure"));
    eventually_event(
        &client,
        "default",
        "the NodeHasNoDiskPressure event",
        DEADLINE,
        |e| {
            e.reason.as_deref() == Some("NodeHasNoDiskPressure")
                && e.involved_object.name.as_deref() == Some(name.as_str())
        },
    )
    .await;

    // Nothing was evicted or restarted: the same container, still running. (Static pods
    // are critical: eviction never takes them, so the filled disk above evicted nobody.)
    assert_eq!(
        node.container_id("bystander", "main").await,
        Some(container.clone())
    );
    let pod = node.pod("bystander").await.expect("listed");
    assert_eq!(pod["status"]["phase"], "Running");

    // Now a pod fills the disk through its emptyDir: it is evicted (node-level reclaim
    // finds nothing to free), its emptyDir goes with it, and the pressure ends.
    let writer = node.pod_name("writer");
    pods.create(
        &kube::api::PostParams::default(),
        &nodeagent_tests::api_pod(
            &writer,
            &node.name,
            serde_json::json!({"spec": {
                "volumes": [{"name": "scratch", "emptyDir": {}}],
                "containers": [{"name": "c", "image": "busybox:1.36",
                    "command": ["sh", "-c", "dd if=/dev/zero of=/scratch/big bs=1M count=66; \
                                 trap 'exit 0' TERM; while true; do sleep 0.2; done"],
                    "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}]}}),
        ),
    )
    .await
    .unwrap();
    let evicted = nodeagent_tests::api_pod_in_phase(&pods, &writer, "Failed", DEADLINE).await;
    let status = evicted.status.unwrap();
    assert_eq!(status.reason.as_deref(), Some("Evicted"), "{status:?}");
    let message = status.message.unwrap_or_default();
    assert!(
        message
            .starts_with("The node was low on resource: ephemeral-storage. Threshold quantity: "),
        "{message}"
    );
    wait_condition(&node, "DiskPressure", "False").await;
    let uid = evicted.metadata.uid.unwrap();
    assert!(
        !fs.at
            .join(format!(
                "pods/{uid}/volumes/kubernetes.io~empty-dir/scratch/big"
            ))
            .exists(),
        "the evicted pod's emptyDir is gone"
    );
    assert_eq!(
        node.container_id("bystander", "main").await,
        Some(container)
    );
    node.stop().await;
    drop(fs);
}

/// The tasks the kernel allows less the tasks now (what pid.available measures).
fn pids_available() -> i64 {
    let read = |p: &str| -> i64 { std::fs::read_to_string(p).unwrap().trim().parse().unwrap() };
    let max = read("/proc/sys/kernel/pid_max").min(read("/proc/sys/kernel/threads-max"));
    let loadavg = std::fs::read_to_string("/proc/loadavg").unwrap();
    let now: i64 = loadavg
        .split_whitespace()
        .nth(3)
        .unwrap()
        .split_once('/')
        .unwrap()
        .1
        .parse()
        .unwrap();
    max - now
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pid_pressure_follows_a_pod_that_forks_and_ends_with_it() {
    if !require_runtime("PID pressure") {
        return;
    }
    let options = NodeOptions {
        no_services: true,
        service_args: fast_monitoring(),
        ..Default::default()
    };
    let mut node = Node::start("pidpressure", options).await;
    // Measured while this test holds the runtime (no other node runs): the threshold sits
    // 800 tasks below what is available before the node starts. The node itself (about 150
    // tasks) stays clear of it; a pod of 1600 processes does not.
    let threshold = pids_available() - 800;
    node.append_config(&format!(
        "evictionHard:\n  pid.available: \"{threshold}\"\nevictionPressureTransitionPeriod: 5s\n"
    ))
    .await;
    for s in Service::ALL {
        node.spawn(s);
    }
    node.write_manifest("bystander.yaml", SLEEPER);
    let container = bystander(&node).await;
    let calm = wait_condition(&node, "PIDPressure", "False").await;
    assert_eq!(calm.reason.as_deref(), Some("KubeletHasSufficientPID"));

    node.write_manifest(
        "forker.yaml",
        r#"apiVersion: v1
kind: Pod
metadata:
  name: forker
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: busybox:1.36
    command: ["sh", "-c", "i=0; while [ $i -lt 1600 ]; do sleep 3600 & i=$((i+1)); done; wait"]
"#,
    );
    let pressed = wait_condition(&node, "PIDPressure", "True").await;
    assert_eq!(pressed.reason.as_deref(), Some("KubeletHasInsufficientPID"));
    assert_eq!(
        pressed.message.as_deref(),
        Some("kubelet has insufficient PID available")
    );
    // The other conditions are untouched by it.
    let cs = conditions(&node).await.unwrap();
    assert_eq!(
        status_of(&cs, "MemoryPressure"),
        "False (KubeletHasSufficientMemory)"
    );

    node.remove_manifest("forker.yaml");
    let cleared = wait_condition(&node, "PIDPressure", "False").await;
    assert_eq!(cleared.reason.as_deref(), Some("KubeletHasSufficientPID"));
    assert_eq!(
        node.container_id("bystander", "main").await,
        Some(container)
    );
    node.stop().await;
}

/// What memory.available measures now (MemTotal less the root cgroup's working set), in
/// bytes: the same reading the agent's eviction manager and node-status use.
fn memory_available() -> u64 {
    let o = nodeagent_config::eviction::observe(
        &nodeagent_config::cgroupfs::Cgroups::detect(),
        Path::new("/"),
        None,
    );
    o[&nodeagent_config::eviction::Signal::MemoryAvailable].available
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_pressure_evicts_the_pod_using_the_most_over_its_request_and_only_it() {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::PostParams;
    use nodeagent_tests::{api_pod, api_pod_in_phase};
    use serde_json::json;
    if !require_runtime("memory pressure eviction") {
        return;
    }
    let options = NodeOptions {
        no_services: true,
        service_args: fast_monitoring(),
        ..Default::default()
    };
    let (server, mut node) = Node::start_with_api_server("mempressure", options).await;
    // The threshold sits 1200 MiB below what is available before the node starts: a pod
    // holding 2400 MiB in a memory-backed emptyDir crosses it, the node itself does not.
    // The margins stand up to the rest of the host's memory moving by 1 GiB meanwhile (the
    // cgroup v2 guest runs beside: at 700/1400 MiB, a guest growing by 2.5 GB kept the
    // pressure on after the eviction).
    let threshold_kib = (memory_available() - (1200 << 20)) / 1024;
    node.append_config(&format!(
        "evictionHard:\n  memory.available: {threshold_kib}Ki\nevictionPressureTransitionPeriod: 10s\n"
    ))
    .await;
    for s in Service::ALL {
        node.spawn(s);
    }
    let client = server.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let quiet = node.pod_name("quiet");
    let hog = node.pod_name("hog");
    // The quiet pod asked for more than it uses; the hog asked for 64Mi and takes 2400Mi.
    pods.create(
        &PostParams::default(),
        &api_pod(
            &quiet,
            &node.name,
            json!({"spec": {"containers": [{"name": "c", "image": "busybox:1.36",
                "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.2; done"],
                "resources": {"requests": {"memory": "32Mi"}}}]}}),
        ),
    )
    .await
    .unwrap();
    api_pod_in_phase(&pods, &quiet, "Running", DEADLINE).await;
    let quiet_id = node.container_id("quiet", "c").await.expect("quiet runs");
    wait_condition(&node, "MemoryPressure", "False").await;
    pods.create(
        &PostParams::default(),
        &api_pod(
            &hog,
            &node.name,
            json!({"spec": {
                "volumes": [{"name": "mem", "emptyDir": {"medium": "Memory"}}],
                "containers": [{"name": "c", "image": "busybox:1.36",
                    "command": ["sh", "-c", "dd if=/dev/zero of=/mem/big bs=1M count=2400; \
                                 trap 'exit 0' TERM; while true; do sleep 0.2; done"],
                    "resources": {"requests": {"memory": "64Mi"}},
                    "volumeMounts": [{"name": "mem", "mountPath": "/mem"}]}]}}),
        ),
    )
    .await
    .unwrap();

    let evicted = api_pod_in_phase(&pods, &hog, "Failed", DEADLINE).await;
    let status = evicted.status.unwrap();
    assert_eq!(status.reason.as_deref(), Some("Evicted"), "{status:?}");
    let message = status.message.unwrap_or_default();
    assert!(
        message.starts_with(&format!(
            "The node was low on resource: memory. Threshold quantity: {threshold_kib}Ki, available: "
        )),
        "{message}"
    );
    assert!(
        message.contains("Container c was using ")
            && message.ends_with(", request is 64Mi, has larger consumption of memory. "),
        "{message}"
    );
    let disruption = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "DisruptionTarget")
        .expect("a DisruptionTarget condition");
    assert_eq!(disruption.reason.as_deref(), Some("TerminationByKubelet"));
    let hog_name = hog.clone();
    let event = eventually_event(&client, "default", "the Evicted event", DEADLINE, |e| {
        e.reason.as_deref() == Some("Evicted")
            && e.type_.as_deref() == Some("Warning")
            && e.involved_object.name.as_deref() == Some(hog_name.as_str())
    })
    .await;
    let annotations = event.metadata.annotations.unwrap_or_default();
    assert_eq!(
        annotations.get("offending_containers").map(String::as_str),
        Some("c")
    );
    assert_eq!(
        annotations.get("starved_resource").map(String::as_str),
        Some("memory")
    );
    let name = node.name.clone();
    eventually_event(
        &client,
        "default",
        "the NodeHasInsufficientMemory event",
        DEADLINE,
        |e| {
            e.reason.as_deref() == Some("NodeHasInsufficientMemory")
                && e.involved_object.name.as_deref() == Some(name.as_str())
        },
    )
    .await;
    // The hog's memory went with it: the pressure ends, and the quiet pod was not touched
    // (the same container, still Running) through the transition period and after.
    wait_condition(&node, "MemoryPressure", "False").await;
    let quiet_now = pods.get(&quiet).await.unwrap();
    assert_eq!(quiet_now.status.unwrap().phase.as_deref(), Some("Running"));
    assert_eq!(node.container_id("quiet", "c").await, Some(quiet_id));
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_over_its_ephemeral_storage_limit_is_evicted_and_only_its_pod() {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::PostParams;
    use nodeagent_tests::{api_pod, api_pod_in_phase};
    use serde_json::json;
    if !require_runtime("ephemeral-storage limit eviction") {
        return;
    }
    let (server, node) = Node::start_with_api_server("storagelimit", NodeOptions::default()).await;
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    let forever = "trap 'exit 0' TERM; while true; do sleep 0.2; done";
    let container = |name: &str, limit: &str, command: String| {
        json!({"name": name, "image": "busybox:1.36", "command": ["sh", "-c", command],
               "resources": {"limits": {"ephemeral-storage": limit}}})
    };
    let filler = node.pod_name("filler");
    let calm = node.pod_name("calm");
    // The filler's first container writes 12 MiB into its own filesystem, over its 4Mi; the
    // pod as a whole stays under the sum of its limits (104Mi).
    pods.create(
        &PostParams::default(),
        &api_pod(
            &filler,
            &node.name,
            json!({"spec": {"containers": [
                container("a", "4Mi", format!("dd if=/dev/zero of=/big bs=1M count=12; {forever}")),
                container("b", "100Mi", forever.to_string()),
            ]}}),
        ),
    )
    .await
    .unwrap();
    pods.create(
        &PostParams::default(),
        &api_pod(
            &calm,
            &node.name,
            json!({"spec": {"containers": [container("c", "4Mi", forever.to_string())]}}),
        ),
    )
    .await
    .unwrap();
    api_pod_in_phase(&pods, &calm, "Running", DEADLINE).await;
    let calm_id = node.container_id("calm", "c").await.expect("calm runs");
    let evicted = api_pod_in_phase(&pods, &filler, "Failed", DEADLINE).await;
    let status = evicted.status.unwrap();
    assert_eq!(status.reason.as_deref(), Some("Evicted"), "{status:?}");
    assert_eq!(
        status.message.as_deref(),
        Some("Container a exceeded its local ephemeral storage limit \"4Mi\". ")
    );
    let calm_now = pods.get(&calm).await.unwrap();
    assert_eq!(calm_now.status.unwrap().phase.as_deref(), Some("Running"));
    assert_eq!(node.container_id("calm", "c").await, Some(calm_id));
    node.stop().await;
}
