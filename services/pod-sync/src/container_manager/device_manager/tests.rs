use super::checkpoint::{Checkpoint, Data, Entry, checksum};
use super::*;
use nodeagent_proto::deviceplugin::{NumaNode as PluginNuma, TopologyInfo as PluginTopology};

/// Two `kubelet_internal_checkpoint` files written by upstream's kubelet, as published
/// (a kind node with NVIDIA's plugin, and Alibaba Cloud's GPUOps documentation): their
/// checksums are what ours computes, so each side reads the other's file.
#[test]
fn checksums_are_upstream_kubelets() {
    let written = br#"{"Data":{"PodDeviceEntries":[{"PodUID":"bf52b2cd-b611-4e79-86b1-280b283185c3","ContainerName":"check","ResourceName":"nvidia.com/gpu","DeviceIDs":{"-1":["tegra"]},"AllocResp":"Ch8KFk5WSURJQV9WSVNJQkxFX0RFVklDRVMSBXRlZ3Jh"}],"RegisteredDevices":{"nvidia.com/gpu":["tegra"]}},"Checksum":3660592824}"#;
    let cp = Checkpoint::decode(written).expect("upstream's file is read");
    assert_eq!(cp.checksum, 3660592824);
    let entries = cp.data.entries.as_ref().unwrap();
    let resp = ContainerAllocateResponse::decode(&entries[0].alloc_resp.as_ref().unwrap()[..])
        .expect("AllocResp is the plugin's protobuf answer");
    assert_eq!(
        resp.envs.get("NVIDIA_VISIBLE_DEVICES").map(String::as_str),
        Some("tegra")
    );
    // Written again, the file is upstream's, byte for byte.
    assert_eq!(Checkpoint::of(cp.data.clone()).encode(), written.to_vec());

    let nil_entries = br#"{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{"nvidia.com/gpu":["GPU-0650a168-e770-3ea8-8ac3-8a1d419763e0"]}},"Checksum":3952659280}"#;
    let cp = Checkpoint::decode(nil_entries).expect("upstream's file is read");
    assert_eq!(cp.data.entries, None);
    assert_eq!(Checkpoint::of(cp.data).encode(), nil_entries.to_vec());
}

#[test]
fn a_corrupted_checkpoint_is_refused() {
    let tampered = br#"{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{"nvidia.com/gpu":["GPU-0650a168-e770-3ea8-8ac3-8a1d419763e1"]}},"Checksum":3952659280}"#;
    assert_eq!(
        Checkpoint::decode(tampered).unwrap_err(),
        "checkpoint is corrupted"
    );
}

fn set(ids: &[&str]) -> BTreeSet<String> {
    ids.iter().map(|s| s.to_string()).collect()
}

fn choice<'a>(
    needed: usize,
    existing: Option<&'a BTreeSet<String>>,
    healthy: Option<&'a BTreeSet<String>>,
    in_use: &'a BTreeSet<String>,
    reusable: &'a BTreeSet<String>,
) -> Choice<'a> {
    Choice {
        resource: "example.com/dev",
        needed,
        existing,
        healthy,
        in_use,
        reusable,
    }
}

/// upstream's `devicesToAllocate` paths and texts (manager.go; manager_test.go's
/// `TestDevicesToAllocateConflictWithUpdateAllocatedDevices` and `TestPodContainerDeviceAllocation`
/// cases: enough, not enough, unregistered, nothing healthy, reuse of an init container's).
#[test]
fn devices_are_chosen_as_upstream_chooses_them() {
    let none = set(&[]);
    let healthy = set(&["d0", "d1", "d2"]);
    // Unregistered, and registered with nothing healthy.
    assert_eq!(
        choice(1, None, None, &none, &none).start().unwrap_err(),
        "cannot allocate unregistered device example.com/dev"
    );
    assert_eq!(
        choice(1, None, Some(&none), &none, &none)
            .start()
            .unwrap_err(),
        "no healthy devices present; cannot allocate unhealthy devices example.com/dev"
    );
    // Not enough free.
    let used = set(&["d0", "d1"]);
    assert_eq!(
        choice(2, None, Some(&healthy), &used, &none)
            .start()
            .unwrap_err(),
        "requested number of devices unavailable for example.com/dev. Requested: 2, Available: 1"
    );
    // Enough: the plugin's preference first (only what is free of it), then in order.
    let d1 = set(&["d1"]);
    let c = choice(2, None, Some(&healthy), &d1, &none);
    let Chosen::Ask {
        allocated,
        available,
    } = c.start().unwrap()
    else {
        panic!("the plugin is asked")
    };
    assert_eq!(available, set(&["d0", "d2"]));
    let with_pref = c
        .finish(allocated.clone(), &available, &["d1".into(), "d2".into()])
        .unwrap();
    assert_eq!(with_pref, set(&["d0", "d2"]));
    assert_eq!(
        c.finish(allocated, &available, &[]).unwrap(),
        set(&["d0", "d2"])
    );
    // An init container's devices are taken first.
    let reusable = set(&["d2"]);
    assert_eq!(
        choice(1, None, Some(&healthy), &set(&["d2"]), &reusable)
            .start()
            .unwrap(),
        Chosen::Done(set(&["d2"]))
    );
    // A container that has its devices keeps them, while they are healthy.
    let mine = set(&["d1"]);
    assert_eq!(
        choice(1, Some(&mine), Some(&healthy), &mine, &none)
            .start()
            .unwrap(),
        Chosen::Already(mine.clone())
    );
    assert_eq!(
        choice(1, Some(&mine), Some(&set(&["d0"])), &mine, &none)
            .start()
            .unwrap_err(),
        "previously allocated devices are no longer healthy; cannot allocate unhealthy devices example.com/dev"
    );
}

fn device(id: &str, health: &str, numa: Option<i64>) -> Device {
    Device {
        id: id.into(),
        health: health.into(),
        topology: numa.map(|n| PluginTopology {
            nodes: vec![PluginNuma { id: n }],
        }),
    }
}

fn manager(dir: &Path) -> DeviceManager {
    DeviceManager::start(dir).expect("starts")
}

fn client() -> DevicePluginClient<Channel> {
    DevicePluginClient::new(nodeagent_transport::connect(
        &nodeagent_config::Address::Unix("/nonexistent/plugin.sock".into()),
    ))
}

/// upstream's `TestUpdateCapacityAllocatable`: healthy devices are capacity and
/// allocatable, unhealthy ones capacity only; a plugin that goes leaves allocatable zero
/// at once and its capacity until the grace period ends, then the resource is retired.
#[tokio::test]
async fn capacity_follows_health_and_the_plugins_grace_period() {
    let root = tempfile::tempdir().unwrap();
    let m = manager(root.path());
    let g = m.connected("example.com/dev", client(), DevicePluginOptions::default());
    m.listed(
        "example.com/dev",
        g,
        vec![
            device("d0", HEALTHY, None),
            device("d1", HEALTHY, Some(0)),
            device("d2", "Unhealthy", None),
        ],
    );
    let c = m.capacity();
    assert_eq!(c.capacity["example.com/dev"], 3);
    assert_eq!(c.allocatable["example.com/dev"], 2);
    // A stream of an older registration is ignored.
    m.listed("example.com/dev", g + 7, vec![]);
    assert_eq!(m.capacity().allocatable["example.com/dev"], 2);
    m.disconnected("example.com/dev", g);
    let c = m.capacity();
    assert_eq!(
        (
            c.capacity["example.com/dev"],
            c.allocatable["example.com/dev"]
        ),
        (3, 0)
    );
    let later = m.capacity_at(Instant::now() + STOP_GRACE_PERIOD);
    assert!(!later.capacity.contains_key("example.com/dev"));
    assert_eq!(later.retired, vec!["example.com/dev".to_string()]);
    // Registered again, it is counted again.
    let g = m.connected("example.com/dev", client(), DevicePluginOptions::default());
    m.listed("example.com/dev", g, vec![device("d0", HEALTHY, None)]);
    let c = m.capacity();
    assert_eq!(c.allocatable["example.com/dev"], 1);
    assert!(c.retired.is_empty());
}

/// upstream's restart path (`readCheckpoint`): the pods' devices come back from the file;
/// the resources it names are known with no device until their plugin registers; the
/// sockets left in the directory go, the checkpoint stays.
#[tokio::test]
async fn a_restart_keeps_assignments_and_waits_for_the_plugins() {
    let root = tempfile::tempdir().unwrap();
    let m = manager(root.path());
    let g = m.connected("example.com/dev", client(), DevicePluginOptions::default());
    m.listed(
        "example.com/dev",
        g,
        vec![device("d0", HEALTHY, None), device("d1", HEALTHY, Some(1))],
    );
    {
        let mut st = m.lock();
        let mut ids = DevicesPerNuma::new();
        ids.insert(1, vec!["d1".into()]);
        let mut response = ContainerAllocateResponse::default();
        response.envs.insert("DEV".into(), "d1".into());
        st.pods
            .entry("pod-a".into())
            .or_default()
            .entry("app".into())
            .or_default()
            .insert("example.com/dev".into(), Allocation { ids, response });
        m.save(&st);
    }
    let plugin_socket = dir(root.path()).join("plugin.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&plugin_socket).unwrap();
    drop(m);

    let m = manager(root.path());
    assert!(
        !plugin_socket.exists(),
        "a plugin's socket is removed at start"
    );
    let c = m.capacity();
    assert_eq!(
        (
            c.capacity["example.com/dev"],
            c.allocatable["example.com/dev"]
        ),
        (0, 0)
    );
    let run = m.run_options("pod-a", "app").expect("restored");
    assert_eq!(run.envs, vec![("DEV".to_string(), "d1".to_string())]);
    let devs = m.container_devices("pod-a", "app");
    assert_eq!(devs.len(), 1);
    assert_eq!(devs[0].device_ids, vec!["d1".to_string()]);
    assert_eq!(devs[0].topology.as_ref().unwrap().nodes[0].id, 1);
    // The held device stays taken whatever the plugin lists.
    let g = m.connected("example.com/dev", client(), DevicePluginOptions::default());
    m.listed(
        "example.com/dev",
        g,
        vec![device("d0", HEALTHY, None), device("d1", HEALTHY, Some(1))],
    );
    assert_eq!(m.lock().in_use("example.com/dev"), set(&["d1"]));
    // A pod no longer active gives them back.
    assert_eq!(
        m.release_inactive(&BTreeSet::new()),
        vec!["pod-a".to_string()]
    );
    assert!(m.lock().in_use("example.com/dev").is_empty());
}

/// The registration's refusals: upstream's texts for the version and the resource name,
/// and an endpoint that would lead out of the plugins' directory.
#[test]
fn registrations_are_checked() {
    let ok = RegisterRequest {
        version: "v1beta1".into(),
        endpoint: "fake.sock".into(),
        resource_name: "example.com/dev".into(),
        options: None,
    };
    assert_eq!(plugins::check(&ok), Ok(()));
    let old = RegisterRequest {
        version: "v1alpha".into(),
        ..ok.clone()
    };
    assert_eq!(
        plugins::check(&old).unwrap_err(),
        r#"requested API version "v1alpha" is not supported by kubelet. Supported version is ["v1beta1"]"#
    );
    let native = RegisterRequest {
        resource_name: "cpu".into(),
        ..ok.clone()
    };
    assert_eq!(
        plugins::check(&native).unwrap_err(),
        r#"the ResourceName "cpu" is invalid"#
    );
    for endpoint in ["../../run/containerd/containerd.sock", "", "..", "a/b"] {
        let hostile = RegisterRequest {
            endpoint: endpoint.into(),
            ..ok.clone()
        };
        assert!(plugins::check(&hostile).is_err(), "{endpoint:?}");
    }
}

use nodeagent_proto::deviceplugin::RegisterRequest;

#[test]
fn an_entry_without_numa_or_answer_prints_nil() {
    // Go's nil map and nil []byte print `<nil>`; an empty map `map[]`.
    let with = |ids| Data {
        entries: Some(vec![Entry {
            pod_uid: "u".into(),
            container: "c".into(),
            resource: "r/x".into(),
            device_ids: ids,
            alloc_resp: None,
        }]),
        registered: Some(BTreeMap::new()),
    };
    assert_ne!(
        checksum(&with(None)),
        checksum(&with(Some(BTreeMap::new())))
    );
}

/// A plugin that answers its options and never its `Allocate`.
struct HungPlugin;

type Devices = std::pin::Pin<
    Box<
        dyn tokio_stream::Stream<
                Item = Result<nodeagent_proto::deviceplugin::ListAndWatchResponse, tonic::Status>,
            > + Send,
    >,
>;

#[tonic::async_trait]
impl nodeagent_proto::deviceplugin::device_plugin_server::DevicePlugin for HungPlugin {
    async fn get_device_plugin_options(
        &self,
        _: tonic::Request<nodeagent_proto::deviceplugin::Empty>,
    ) -> Result<tonic::Response<DevicePluginOptions>, tonic::Status> {
        Ok(tonic::Response::new(DevicePluginOptions::default()))
    }

    type ListAndWatchStream = Devices;

    async fn list_and_watch(
        &self,
        _: tonic::Request<nodeagent_proto::deviceplugin::Empty>,
    ) -> Result<tonic::Response<Devices>, tonic::Status> {
        Err(tonic::Status::unimplemented("not in this test"))
    }

    async fn get_preferred_allocation(
        &self,
        _: tonic::Request<PreferredAllocationRequest>,
    ) -> Result<
        tonic::Response<nodeagent_proto::deviceplugin::PreferredAllocationResponse>,
        tonic::Status,
    > {
        Err(tonic::Status::unimplemented("not in this test"))
    }

    async fn allocate(
        &self,
        _: tonic::Request<AllocateRequest>,
    ) -> Result<tonic::Response<nodeagent_proto::deviceplugin::AllocateResponse>, tonic::Status>
    {
        std::future::pending().await
    }

    async fn pre_start_container(
        &self,
        _: tonic::Request<PreStartContainerRequest>,
    ) -> Result<
        tonic::Response<nodeagent_proto::deviceplugin::PreStartContainerResponse>,
        tonic::Status,
    > {
        Err(tonic::Status::unimplemented("not in this test"))
    }
}

/// A plugin that never answers `Allocate` refuses its pod once the call's time is up
/// (upstream would wait without end, holding every pod that asks for a device), and the
/// device it was about to get is free again.
#[tokio::test]
async fn a_plugin_that_hangs_refuses_its_pod_and_holds_nothing() {
    let root = tempfile::tempdir().unwrap();
    let mut m = manager(root.path());
    m.call_timeout = Duration::from_millis(300);
    let socket = dir(root.path()).join("hung.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(
                nodeagent_proto::deviceplugin::device_plugin_server::DevicePluginServer::new(
                    HungPlugin,
                ),
            )
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    let client = DevicePluginClient::new(nodeagent_transport::connect(
        &nodeagent_config::Address::Unix(socket),
    ));
    let g = m.connected("example.com/dev", client, DevicePluginOptions::default());
    m.listed("example.com/dev", g, vec![device("d0", HEALTHY, None)]);
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "uid": "p"},
        "spec": {"containers": [{"name": "c", "image": "i",
            "resources": {"limits": {"example.com/dev": "1"}}}]}
    }))
    .unwrap();
    let err = tokio::time::timeout(Duration::from_secs(10), m.admit(&pod, None))
        .await
        .expect("the admission ends")
        .unwrap_err();
    assert_eq!(
        err,
        "rpc error: code = DeadlineExceeded desc = the device plugin did not answer Allocate within 300ms"
    );
    assert!(m.lock().in_use("example.com/dev").is_empty());
}
