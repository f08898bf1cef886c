//! The CPU manager's static policy (issue 30) on the real containerd, judged by what
//! upstream documents and writes ("Control CPU Management Policies on the Node": a
//! Guaranteed pod's container with whole CPUs gets them exclusively, every other container
//! runs on the shared pool, which keeps `reservedSystemCPUs`; the state in
//! `<root-dir>/cpu_manager_state`, upstream's JSON; a pod that cannot have its CPUs is
//! refused `UnexpectedAdmissionError` with `admission/errors.go`'s and `rejectPod`'s
//! words), and by what the container's own processes see (`Cpus_allowed_list` of
//! `/proc/self/status`, which follows the container cgroup's cpuset on cgroup v1 and v2).
//! The pod-resources API (upstream's `v1.PodResourcesLister` on
//! `<root-dir>/pod-resources/kubelet.sock`, what monitoring agents read) shows each pod's
//! exclusive CPUs and the allocatable ones.
//! Attacked: a SIGKILL of each service in turn changes no assignment, no container, no
//! phase, no pod-resources answer; a pod going gives its CPU back to the running shared
//! containers; a state file of another policy stops pod-sync's start in upstream's words
//! and disturbs no running pod.

use nix::sys::signal::Signal;
use nodeagent_config::Service;
use nodeagent_config::cpuset::CpuSet;
use nodeagent_proto::podresources::pod_resources_lister_client::PodResourcesListerClient;
use nodeagent_proto::podresources::{
    AllocatableResourcesRequest, GetPodResourcesRequest, ListPodResourcesRequest,
};
use nodeagent_tests::{Node, NodeOptions, eventually, require_runtime};
use serde_json::{Value, json};
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(90);

fn manifest(name: &str, resources: Value) -> String {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": "busybox:1.36",
                            "command": ["sleep", "3600"], "resources": resources}],
        }
    })
    .to_string()
}

/// The CPUs a process of the container may run on.
async fn allowed(node: &Node, id: &str) -> Result<CpuSet, String> {
    let out = node
        .exec(id, &["grep", "Cpus_allowed_list", "/proc/self/status"])
        .await?;
    let list = out.split_whitespace().nth(1).unwrap_or_default();
    CpuSet::parse(list).map_err(|e| format!("{out:?}: {e}"))
}

async fn eventually_allowed(node: &Node, id: &str, want: &CpuSet, what: &str) {
    eventually(what, DEADLINE, || async {
        let got = allowed(node, id).await?;
        (got == *want)
            .then_some(())
            .ok_or_else(|| format!("Cpus_allowed_list {got}, want {want}"))
    })
    .await
}

fn state_file(node: &Node) -> Value {
    let text = std::fs::read_to_string(node.path("root/cpu_manager_state")).unwrap_or_default();
    serde_json::from_str(&text).unwrap_or(Value::Null)
}

/// A Guaranteed pod asking for `cpus` whole CPUs, once refused at admission.
async fn refused_greedy(node: &Node, cpus: usize) -> Value {
    node.write_manifest(
        "greedy.yaml",
        &manifest(
            "greedy",
            json!({"limits": {"cpu": cpus.to_string(), "memory": "32Mi"}}),
        ),
    );
    node.pod_in_phase("greedy", "Failed", DEADLINE).await
}

/// What the pod-resources API answers: each listed pod (namespace/name) with its
/// containers' exclusive CPU ids, and the allocatable CPU ids.
type Listed = (Vec<(String, Vec<(String, Vec<i64>)>)>, Vec<i64>);

async fn pod_resources(node: &Node) -> Result<Listed, String> {
    let address = nodeagent_config::Address::Unix(node.path("root/pod-resources/kubelet.sock"));
    let mut client = PodResourcesListerClient::new(nodeagent_transport::connect(&address));
    let list = client
        .list(ListPodResourcesRequest {})
        .await
        .map_err(|e| e.to_string())?
        .into_inner();
    let pods = list
        .pod_resources
        .into_iter()
        .map(|p| {
            let containers = p
                .containers
                .into_iter()
                .map(|c| (c.name, c.cpu_ids))
                .collect();
            (format!("{}/{}", p.namespace, p.name), containers)
        })
        .collect();
    let allocatable = client
        .get_allocatable_resources(AllocatableResourcesRequest {})
        .await
        .map_err(|e| e.to_string())?
        .into_inner()
        .cpu_ids;
    Ok((pods, allocatable))
}

/// The host's online CPUs (`/sys/devices/system/cpu/online`).
fn online_cpus() -> CpuSet {
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
    CpuSet::parse(online.trim()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_policy_gives_guaranteed_containers_cpus_of_their_own_across_restarts() {
    if !require_runtime("cpu_manager") {
        return;
    }
    let all = online_cpus();
    assert!(
        all.size() >= 2,
        "the static policy needs two CPUs to show anything (one reserved, one exclusive); this machine has {all}"
    );
    let reserved: CpuSet = all.iter().take(1).collect();
    let mut node = Node::start(
        "cpu-manager",
        NodeOptions {
            extra_config: format!(
                "cpuManagerPolicy: static\nreservedSystemCPUs: \"{reserved}\"\ncpuManagerReconcilePeriod: 1s\n"
            ),
            ..Default::default()
        },
    )
    .await;
    node.write_manifest(
        "exclusive.yaml",
        &manifest(
            "exclusive",
            json!({"limits": {"cpu": "1", "memory": "32Mi"}}),
        ),
    );
    node.write_manifest(
        "shared.yaml",
        // No cpu request: with one CPU reserved, allocatable cpu is the one the exclusive
        // pod takes, and a static pod asking for more is refused (upstream's admission,
        // with nothing it may preempt).
        &manifest("shared", json!({"requests": {"memory": "16Mi"}})),
    );
    let exclusive = node.running_container("exclusive", "c", DEADLINE).await;
    let shared = node.running_container("shared", "c", DEADLINE).await;
    let own = allowed(&node, &exclusive).await.unwrap();
    assert_eq!(own.size(), 1, "one CPU of its own: {own}");
    assert!(
        own.intersection(&reserved).is_empty(),
        "never a reserved CPU: {own}"
    );
    let pool = all.difference(&own);
    eventually_allowed(
        &node,
        &shared,
        &pool,
        "the shared pod on the pool without it",
    )
    .await;

    // The state file as upstream's kubelet writes it: its fields in its order.
    let uid = node.pod("exclusive").await.unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    let text = std::fs::read_to_string(node.path("root/cpu_manager_state")).unwrap();
    let head = format!(
        r#"{{"policyName":"static","defaultCpuSet":"{pool}","entries":{{"{uid}":{{"c":"{own}"}}}},"checksum":"#
    );
    assert!(text.starts_with(&head), "{text}\nwant {head}…");
    assert!(
        state_file(&node)["checksum"].as_u64().unwrap_or(0) > 0,
        "{text}"
    );

    // The pod-resources API: the exclusive pod's container with its CPU, the shared one
    // with none (upstream's GetCPUs gives exclusive CPUs only), every CPU but the reserved
    // allocatable; Get of one pod, and upstream's words for a pod that is not there.
    let cpu_ids = |set: &CpuSet| set.iter().map(i64::from).collect::<Vec<i64>>();
    let (listed, allocatable) = pod_resources(&node).await.unwrap();
    let exclusive_name = format!("default/{}", node.pod_name("exclusive"));
    let shared_name = format!("default/{}", node.pod_name("shared"));
    assert!(
        listed.contains(&(
            exclusive_name.clone(),
            vec![("c".to_string(), cpu_ids(&own))]
        )),
        "{listed:?}"
    );
    assert!(
        listed.contains(&(shared_name.clone(), vec![("c".to_string(), vec![])])),
        "{listed:?}"
    );
    assert_eq!(allocatable, cpu_ids(&all.difference(&reserved)));
    let address = nodeagent_config::Address::Unix(node.path("root/pod-resources/kubelet.sock"));
    let mut client = PodResourcesListerClient::new(nodeagent_transport::connect(&address));
    let got = client
        .get(GetPodResourcesRequest {
            pod_name: node.pod_name("exclusive"),
            pod_namespace: "default".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .pod_resources
        .unwrap();
    assert_eq!(got.containers[0].cpu_ids, cpu_ids(&own));
    let missing = client
        .get(GetPodResourcesRequest {
            pod_name: "nowhere".into(),
            pod_namespace: "default".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(
        missing.message(),
        "pod nowhere in namespace default not found"
    );
    let resources_before = pod_resources(&node).await.unwrap();

    // More CPUs than are free: refused before anything of it runs, in upstream's words.
    let want = all.size();
    let refused = refused_greedy(&node, want).await;
    assert_eq!(refused["status"]["reason"], "UnexpectedAdmissionError");
    assert_eq!(
        refused["status"]["message"],
        format!(
            "Pod was rejected: Allocate failed due to not enough cpus available to satisfy request: requested={want}, available={}, which is unexpected",
            all.size() - 1 - reserved.size()
        )
    );
    assert_eq!(node.container_id("greedy", "c").await, None);

    // SIGKILL every service, one after another (pod-sync, which holds the CPU manager,
    // among them): nothing a user watches moves, nor the state file.
    let before = (
        node.watched("exclusive").await,
        node.watched("shared").await,
    );
    assert_eq!(before.0[0], "Running");
    assert_eq!(before.0[1], "True");
    let file_before = std::fs::read(node.path("root/cpu_manager_state")).unwrap();
    for service in Service::ALL {
        node.signal(service, Signal::SIGKILL).await;
        node.spawn(service);
        node.wait_serving(service).await;
    }
    let resources_after = eventually("the pod-resources API back", DEADLINE, || {
        pod_resources(&node)
    })
    .await;
    assert_eq!(resources_after, resources_before);
    // Through a few reconcile periods after the restart.
    for _ in 0..5 {
        node.wait_relists(2).await;
        assert_eq!(node.watched("exclusive").await, before.0);
        assert_eq!(node.watched("shared").await, before.1);
        assert_eq!(allowed(&node, &exclusive).await.unwrap(), own);
        assert_eq!(allowed(&node, &shared).await.unwrap(), pool);
        assert_eq!(
            std::fs::read(node.path("root/cpu_manager_state")).unwrap(),
            file_before
        );
        assert_eq!(
            node.pod("greedy").await.unwrap()["status"]["phase"],
            "Failed"
        );
    }

    // The exclusive pod goes: its CPU is shared again, the running shared pod gets it.
    node.remove_manifest("exclusive.yaml");
    node.remove_manifest("greedy.yaml");
    eventually_allowed(&node, &shared, &all, "the shared pod on every CPU").await;
    let state = state_file(&node);
    assert_eq!(state["defaultCpuSet"], all.to_string(), "{state}");
    assert!(state.get("entries").is_none(), "{state}");

    // A state file of another policy (a node switched without draining): pod-sync does not
    // start, in upstream's words, and the running pod is not touched.
    node.signal(Service::PodSync, Signal::SIGKILL).await;
    let good = std::fs::read(node.path("root/cpu_manager_state")).unwrap();
    std::fs::write(
        node.path("root/cpu_manager_state"),
        r#"{"policyName":"none","defaultCpuSet":"","checksum":1353318690}"#,
    )
    .unwrap();
    node.spawn(Service::PodSync);
    let pid = node.service_pid(Service::PodSync).unwrap();
    eventually("pod-sync refuses to start", DEADLINE, || async {
        let log = node.log(Service::PodSync);
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let exited = stat.is_empty() || stat.split_whitespace().nth(2) == Some("Z");
        (exited
            && log.contains(r#"start cpu manager error: could not restore state from checkpoint: configured policy "static" differs from state checkpoint policy "none", please drain this node and delete the CPU manager checkpoint file"#))
        .then_some(())
        .ok_or_else(|| format!("exited: {exited}; log tail: {}", &log[log.len().saturating_sub(600)..]))
    })
    .await;
    let _ = node.signal(Service::PodSync, Signal::SIGKILL).await;
    assert_eq!(
        node.container_id("shared", "c").await.as_deref(),
        Some(shared.as_str()),
        "the shared pod's container runs on"
    );
    std::fs::write(node.path("root/cpu_manager_state"), good).unwrap();
    node.spawn(Service::PodSync);
    node.wait_serving(Service::PodSync).await;
    assert_eq!(node.watched("shared").await, before.1);
    node.stop().await;
}

/// `full-pcpus-only` (upstream's `FullPCPUsOnlyOption`) on this machine: a pod asking for
/// more CPUs than the free whole cores without a reserved CPU is Failed with upstream's
/// own admission reason, `SMTAlignmentError`, and its message as it is (no "Allocate
/// failed due to"); a pod of whole cores runs on CPUs of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_pcpus_only_refuses_a_pod_with_upstreams_smt_alignment_error() {
    if !require_runtime("cpu_manager") {
        return;
    }
    let all = online_cpus();
    let reserved: CpuSet = all.iter().take(1).collect();
    let node = Node::start(
        "cpu-manager-full-pcpus",
        NodeOptions {
            extra_config: format!(
                "cpuManagerPolicy: static\nreservedSystemCPUs: \"{reserved}\"\ncpuManagerPolicyOptions:\n  full-pcpus-only: \"true\"\n"
            ),
            ..Default::default()
        },
    )
    .await;
    // The machine's SMT level, as the kernel tells it.
    let siblings = std::fs::read_to_string(format!(
        "/sys/devices/system/cpu/cpu{}/topology/thread_siblings_list",
        all.iter().last().unwrap()
    ))
    .unwrap();
    let per_core = CpuSet::parse(siblings.trim()).unwrap().size();
    let free_whole = all.size() - per_core; // the reserved CPU's core is not given
    let want = all.size();
    let refused = refused_greedy(&node, want).await;
    assert_eq!(refused["status"]["reason"], "SMTAlignmentError");
    let message = if !want.is_multiple_of(per_core) {
        format!(
            "Pod was rejected: SMT Alignment Error: requested {want} cpus not multiple cpus per core = {per_core}"
        )
    } else {
        format!(
            "Pod was rejected: SMT Alignment Error: not enough free physical CPUs: available physical CPUs = {free_whole}, requested CPUs = {want}, CPUs per core = {per_core}"
        )
    };
    assert_eq!(refused["status"]["message"], message);
    assert_eq!(node.container_id("greedy", "c").await, None);
    if free_whole >= per_core {
        node.write_manifest(
            "whole.yaml",
            &manifest(
                "whole",
                json!({"limits": {"cpu": per_core.to_string(), "memory": "32Mi"}}),
            ),
        );
        let id = node.running_container("whole", "c", DEADLINE).await;
        let own = allowed(&node, &id).await.unwrap();
        assert_eq!(own.size(), per_core, "a whole core of its own: {own}");
        assert!(own.intersection(&reserved).is_empty(), "{own}");
    }
    node.stop().await;
}

/// `strict-cpu-reservation` (upstream's StrictCPUReservationOption, beta since 1.32, in
/// "Control CPU Management Policies on the Node": "the reserved CPUs ... will not be
/// available to any ... pods, including BestEffort and Burstable"): a BestEffort pod's
/// container runs on every CPU but the reserved ones, the state file's shared set leaves
/// them out (policy_static.go `validateState`), and a SIGKILL of pod-sync changes neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_cpu_reservation_keeps_shared_containers_off_the_reserved_cpus() {
    if !require_runtime("cpu_manager") {
        return;
    }
    let all = online_cpus();
    if all.size() < 2 {
        nodeagent_tests::skip_unless_ci(
            "strict-cpu-reservation needs a CPU besides the reserved one",
        );
        return;
    }
    let reserved: CpuSet = all.iter().take(1).collect();
    let shared = all.difference(&reserved);
    let mut node = Node::start(
        "cpu-manager-strict",
        NodeOptions {
            extra_config: format!(
                "cpuManagerPolicy: static\nreservedSystemCPUs: \"{reserved}\"\ncpuManagerPolicyOptions:\n  strict-cpu-reservation: \"true\"\n"
            ),
            ..Default::default()
        },
    )
    .await;
    node.write_manifest("besteffort.yaml", &manifest("besteffort", json!({})));
    let id = node.running_container("besteffort", "c", DEADLINE).await;
    eventually_allowed(
        &node,
        &id,
        &shared,
        "the BestEffort container off the reserved CPUs",
    )
    .await;
    assert_eq!(state_file(&node)["defaultCpuSet"], shared.to_string());
    node.signal(Service::PodSync, Signal::SIGKILL).await;
    node.spawn(Service::PodSync);
    node.wait_serving(Service::PodSync).await;
    nodeagent_tests::consistently(
        "the container and its CPUs across the restart",
        Duration::from_secs(6),
        Duration::from_millis(500),
        || async {
            let now = node.container_id("besteffort", "c").await;
            let cpus = allowed(&node, &id).await?;
            (now.as_deref() == Some(id.as_str()) && cpus == shared)
                .then_some(())
                .ok_or_else(|| format!("{now:?} on {cpus}"))
        },
    )
    .await;
    assert_eq!(state_file(&node)["defaultCpuSet"], shared.to_string());
    node.stop().await;
}
