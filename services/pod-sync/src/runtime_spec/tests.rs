use super::*;

fn node() -> NodeContext {
    NodeContext {
        node_name: "n1".into(),
        pod_logs_dir: "/var/log/pods".into(),
        cgroups_per_qos: true,
        cgroup_root: "/".into(),
        cluster_dns: vec![],
        cluster_domain: String::new(),
        resolv_conf: "/nonexistent".into(),
        ips: crate::status::ips::NodeIps::single("192.0.2.1"),
        pod_pids_limit: -1,
        memory_capacity: 8 << 30,
        seccomp_default: false,
        root_dir: std::env::temp_dir().join(format!("pod-sync-test-{}", std::process::id())),
        ..NodeContext::for_unit_tests("pod-sync-test")
    }
}

fn pod() -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "ns", "uid": "u1", "labels": {"app": "web"}},
        "spec": {"containers": [{
            "name": "c", "image": "busybox:1.36",
            "command": ["sh", "-c", "echo $(GREETING) $(POD_NAME)"],
            "env": [
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "GREETING", "value": "hi-$(POD_NAME)"},
                {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                {"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}}
            ],
            "resources": {"limits": {"cpu": "500m", "memory": "64Mi"}},
            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            "ports": [{"containerPort": 80, "hostPort": 8080}]
        }]}
    }))
    .unwrap()
}

#[test]
fn env_is_resolved_and_expanded_in_order() {
    let p = pod();
    let env = container_env(
        &p,
        &p.spec.as_ref().unwrap().containers[0],
        &node(),
        "10.0.0.1",
        &EnvRefs::default(),
    )
    .unwrap();
    let get = |k: &str| {
        env.iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
            .unwrap()
    };
    assert_eq!(get("POD_NAME"), "web");
    assert_eq!(get("GREETING"), "hi-web");
    assert_eq!(get("NODE"), "n1");
    assert_eq!(get("APP"), "web");
    assert_eq!(get("MEM"), "64");
}

#[test]
fn container_config_carries_upstream_labels_and_resources() {
    let p = pod();
    let c = &p.spec.as_ref().unwrap().containers[0];
    let volumes = HashMap::from([(
        "data".to_string(),
        "/var/lib/kubelet/pods/u1/volumes/x/data".to_string(),
    )]);
    let node = node();
    let cfg = container_config(ContainerInputs {
        env_refs: &EnvRefs::default(),
        backoff_base: 0,
        pod: &p,
        container: c,
        attempt: 2,
        volumes: &volumes,
        pod_ip: "",
        node: &node,
    })
    .unwrap();
    assert_eq!(cfg.command, vec!["sh", "-c", "echo hi-web web"]);
    assert_eq!(cfg.labels[labels::POD_UID], "u1");
    assert_eq!(cfg.labels[labels::CONTAINER_NAME], "c");
    assert_eq!(cfg.annotations[labels::CONTAINER_HASH], container_hash(c));
    assert_eq!(cfg.log_path, "c/2.log");
    assert_eq!(cfg.mounts[0].container_path, "/data");
    // No terminationMessagePath in this spec, so no second mount.
    assert_eq!(cfg.mounts.len(), 1);
    let r = cfg.linux.unwrap().resources.unwrap();
    assert_eq!(
        (r.cpu_quota, r.cpu_period, r.cpu_shares),
        (50_000, 100_000, 512)
    );
    assert_eq!(r.memory_limit_in_bytes, 64 << 20);
}

/// Upstream's `TestGenerateLinuxContainerConfigResources`
/// (kuberuntime_container_linux_test.go), its pod-level row "Container Level Request
/// 128M/1C, Pod Level Limit 256M/3C": a container without limits of its own gets the pod's.
/// Then what `calculateLinuxResources` makes of a container with no request at all: the
/// shares of the limit it gets from the pod.
#[test]
fn a_container_gets_the_pod_level_limits_it_does_not_set() {
    let p: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "uid": "u1"},
        "spec": {
            "resources": {"limits": {"memory": "256Mi", "cpu": "3"}},
            "containers": [
                {"name": "c", "image": "i",
                 "resources": {"requests": {"memory": "128Mi", "cpu": "1"}}},
                {"name": "bare", "image": "i"}
            ]
        }
    }))
    .unwrap();
    let spec = p.spec.as_ref().unwrap();
    let r = linux_resources(&p, &spec.containers[0], &node());
    assert_eq!(
        (
            r.cpu_period,
            r.cpu_quota,
            r.cpu_shares,
            r.memory_limit_in_bytes
        ),
        (100_000, 300_000, 1024, 256 << 20)
    );
    let r = linux_resources(&p, &spec.containers[1], &node());
    assert_eq!(
        (
            r.cpu_period,
            r.cpu_quota,
            r.cpu_shares,
            r.memory_limit_in_bytes
        ),
        (100_000, 300_000, 3072, 256 << 20)
    );
}

#[test]
fn missing_volume_is_a_config_error() {
    let p = pod();
    let c = &p.spec.as_ref().unwrap().containers[0];
    let node = node();
    let err = container_config(ContainerInputs {
        env_refs: &EnvRefs::default(),
        backoff_base: 0,
        pod: &p,
        container: c,
        attempt: 0,
        volumes: &HashMap::new(),
        pod_ip: "",
        node: &node,
    })
    .unwrap_err();
    assert!(err.contains("no volume of that name"), "{err}");
}

#[test]
fn sandbox_config_names_the_pod_and_its_ports() {
    let p = pod();
    let cfg = sandbox_config(&p, 1, &node());
    let meta = cfg.metadata.unwrap();
    assert_eq!(
        (
            meta.name.as_str(),
            meta.namespace.as_str(),
            meta.uid.as_str(),
            meta.attempt
        ),
        ("web", "ns", "u1", 1)
    );
    assert_eq!(cfg.hostname, "web");
    assert_eq!(cfg.log_directory, "/var/log/pods/ns_web_u1");
    assert_eq!(cfg.port_mappings[0].host_port, 8080);
    assert_eq!(cfg.labels["app"], "web");
    assert_eq!(cfg.linux.unwrap().cgroup_parent, "/kubepods/podu1");
}

#[test]
fn config_map_and_secret_env_follow_upstream() {
    let p: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "ns", "uid": "u1"},
        "spec": {"containers": [{
            "name": "c", "image": "i",
            "envFrom": [{"configMapRef": {"name": "settings"}, "prefix": "CFG_"}],
            "env": [
                {"name": "CFG_MODE", "value": "override"},
                {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
                {"name": "MAYBE", "valueFrom": {"configMapKeyRef": {"name": "absent", "key": "k", "optional": true}}}
            ]
        }]}
    }))
    .unwrap();
    let c = &p.spec.as_ref().unwrap().containers[0];
    let refs = EnvRefs {
        connected: true,
        config_maps: HashMap::from([(
            "settings".to_string(),
            BTreeMap::from([
                ("MODE".to_string(), "fast".to_string()),
                ("LEVEL".to_string(), "3".to_string()),
            ]),
        )]),
        secrets: HashMap::from([(
            "creds".to_string(),
            BTreeMap::from([("password".to_string(), "hunter2".to_string())]),
        )]),
    };
    let env = container_env(&p, c, &node(), "", &refs).unwrap();
    let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    assert_eq!(get("CFG_MODE").as_deref(), Some("override"));
    assert_eq!(get("CFG_LEVEL").as_deref(), Some("3"));
    assert_eq!(get("PASSWORD").as_deref(), Some("hunter2"));
    assert_eq!(get("MAYBE"), None);
    assert_eq!(
        env_references(c),
        (
            vec!["absent".to_string(), "settings".to_string()],
            vec!["creds".to_string()]
        )
    );

    let missing = EnvRefs {
        connected: true,
        ..Default::default()
    };
    assert_eq!(
        container_env(&p, c, &node(), "", &missing).unwrap_err(),
        "configmap \"settings\" not found"
    );
    let offline = container_env(&p, c, &node(), "", &EnvRefs::default()).unwrap_err();
    assert!(offline.contains("no API server connection"), "{offline}");
}

fn with_mounts(mounts: serde_json::Value) -> Container {
    serde_json::from_value(serde_json::json!({"name": "c", "image": "i", "volumeMounts": mounts}))
        .unwrap()
}

#[test]
fn sub_path_expr_is_expanded_from_the_env_and_never_climbs() {
    let env = vec![
        ("POD_NAME".to_string(), "web".to_string()),
        ("UP".to_string(), "..".to_string()),
        ("ROOT".to_string(), "/etc".to_string()),
    ];
    let c = with_mounts(serde_json::json!([
        {"name": "data", "mountPath": "/all"},
        {"name": "data", "mountPath": "/a", "subPath": "logs"},
        {"name": "data", "mountPath": "/b", "subPathExpr": "pods/$(POD_NAME)"}
    ]));
    let got = sub_path_mounts(&c, &env).unwrap();
    let got: Vec<_> = got
        .iter()
        .map(|m| (m.volume_name.as_str(), m.sub_path.as_str(), m.mount_index))
        .collect();
    assert_eq!(got, [("data", "logs", 1), ("data", "pods/web", 2)]);
    let err = sub_path_mounts(
        &with_mounts(
            serde_json::json!([{"name": "d", "mountPath": "/x", "subPathExpr": "$(ROOT)"}]),
        ),
        &env,
    )
    .unwrap_err();
    assert_eq!(err, "error SubPath `/etc` must not be an absolute path");
    let err = sub_path_mounts(
        &with_mounts(
            serde_json::json!([{"name": "d", "mountPath": "/x", "subPathExpr": "a/$(UP)/$(UP)"}]),
        ),
        &env,
    )
    .unwrap_err();
    assert!(
        err.starts_with("unable to provision SubPath `a/../..`"),
        "{err}"
    );
}

#[test]
fn a_sub_path_mount_gets_only_the_prepared_bind_mount() {
    let mut p = pod();
    p.spec.as_mut().unwrap().containers[0].volume_mounts = Some(vec![
        serde_json::from_value(serde_json::json!(
            {"name": "data", "mountPath": "/data", "subPath": "evil"}
        ))
        .unwrap(),
    ]);
    let c = p.spec.as_ref().unwrap().containers[0].clone();
    let volumes = HashMap::from([("data".to_string(), "/vol/data".to_string())]);
    let node = node();
    let mut cfg = container_config(ContainerInputs {
        env_refs: &EnvRefs::default(),
        backoff_base: 0,
        pod: &p,
        container: &c,
        attempt: 0,
        volumes: &volumes,
        pod_ip: "",
        node: &node,
    })
    .unwrap();
    // Never the old `volume.join(subPath)`: that follows a planted `evil -> /`.
    assert_eq!(cfg.mounts[0].host_path, "");
    assert!(set_sub_path_mounts(&mut cfg, &c, &HashMap::new()).is_err());
    let prepared = HashMap::from([(0, "/root/pods/u1/volume-subpaths/data/c/0".to_string())]);
    set_sub_path_mounts(&mut cfg, &c, &prepared).unwrap();
    assert_eq!(cfg.mounts[0].host_path, prepared[&0]);
}

#[test]
fn pods_that_cannot_name_host_paths_are_refused() {
    let node = node();
    assert!(check_pod_paths(&pod(), &node).is_ok());
    for (field, bad) in [
        ("uid", "../../x"),
        ("uid", ".."),
        ("name", "a/b"),
        ("namespace", ".."),
    ] {
        let mut p = pod();
        match field {
            "uid" => p.metadata.uid = Some(bad.into()),
            "name" => p.metadata.name = Some(bad.into()),
            _ => p.metadata.namespace = Some(bad.into()),
        }
        assert!(check_pod_paths(&p, &node).is_err(), "{field}={bad}");
        assert!(
            pod_log_dir(&node.pod_logs_dir, &p).is_err(),
            "{field}={bad}"
        );
    }
    assert!(termination_message_file(Path::new("/r"), "u1", "../c", 0).is_err());
    assert_eq!(
        pod_log_dir(&node.pod_logs_dir, &pod()).unwrap(),
        Path::new("/var/log/pods/ns_web_u1")
    );
}

#[test]
fn only_the_name_and_image_decide_whether_a_running_container_changed() {
    let c: Container = serde_json::from_value(serde_json::json!({
        "name": "app", "image": "busybox:1.36",
        "resources": {"limits": {"memory": "64Mi"}}
    }))
    .unwrap();
    let made = nodeagent_proto::api::RuntimeContainer {
        spec_hash: container_hash(&c),
        upstream_hash: upstream_hash(&c),
        ..Default::default()
    };
    assert!(!container_changed(&c, &made));
    // An in-place resize (or anything a newer build serializes differently) is no change.
    let mut resized = c.clone();
    resized.resources.as_mut().unwrap().limits = Some(
        [(
            "memory".to_string(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("128Mi".into()),
        )]
        .into(),
    );
    assert!(!container_changed(&resized, &made));
    // A new image is.
    let mut updated = c.clone();
    updated.image = Some("busybox:1.37".into());
    assert!(container_changed(&updated, &made));
    // A container made by an older build (no upstream hash) keeps the old rule, so an
    // upgrade changes nothing for it: same spec, no change; another spec, a change.
    let older = nodeagent_proto::api::RuntimeContainer {
        spec_hash: container_hash(&c),
        ..Default::default()
    };
    assert!(!container_changed(&c, &older));
    assert!(container_changed(&resized, &older));
}

/// upstream: pkg/kubelet/kubelet_pods_test.go TestMakeMounts, the propagation cases, and
/// translateMountPropagation; the CRI enum is kubernetes/cri-api's `MountPropagation`
/// (PRIVATE 0, HOST_TO_CONTAINER 1, BIDIRECTIONAL 2), read from the wire value.
#[test]
fn mount_propagation_follows_the_cri_enum_and_bidirectional_needs_privilege() {
    let mount = |mode: Option<&str>| VolumeMount {
        name: "v".into(),
        mount_path: "/v".into(),
        mount_propagation: mode.map(str::to_string),
        ..Default::default()
    };
    let plain = Container::default();
    let privileged: Container = serde_json::from_value(serde_json::json!({
        "name": "c", "securityContext": {"privileged": true}
    }))
    .unwrap();
    for (mode, container, want) in [
        (None, &plain, Ok(0)),
        (Some("None"), &plain, Ok(0)),
        (Some("HostToContainer"), &plain, Ok(1)),
        (Some("HostToContainer"), &privileged, Ok(1)),
        (Some("Bidirectional"), &privileged, Ok(2)),
        (
            Some("Bidirectional"),
            &plain,
            Err("volumeMount \"v\": Bidirectional mount propagation is available only to privileged containers".to_string()),
        ),
        (
            Some("Sideways"),
            &privileged,
            Err("invalid MountPropagation mode: \"Sideways\"".to_string()),
        ),
    ] {
        let got = mount_propagation(container, &mount(mode)).map(|p| p as i32);
        assert_eq!(got, want, "{mode:?}");
    }
}

/// upstream's `makeBlockVolumes`: each `volumeDevices` entry is a CRI device from the
/// volume's host path (the pod's link) to its `devicePath`, `mrw`, or `r` for a claim
/// mounted `readOnly`; a device whose volume was not set up is an error.
#[test]
fn block_volumes_are_devices_read_only_as_the_claim_says() {
    let mut p = pod();
    let spec = p.spec.as_mut().unwrap();
    spec.volumes = Some(
        serde_json::from_value(serde_json::json!([
            {"name": "rw", "persistentVolumeClaim": {"claimName": "a"}},
            {"name": "ro", "persistentVolumeClaim": {"claimName": "b", "readOnly": true}},
            {"name": "data", "emptyDir": {}}
        ]))
        .unwrap(),
    );
    spec.containers[0].volume_devices = Some(
        serde_json::from_value(serde_json::json!([
            {"name": "rw", "devicePath": "/dev/xvda"},
            {"name": "ro", "devicePath": "/dev/xvdb"}
        ]))
        .unwrap(),
    );
    let c = p.spec.as_ref().unwrap().containers[0].clone();
    let link = |n: &str| format!("/var/lib/kubelet/pods/u1/volumeDevices/kubernetes.io~csi/pv-{n}");
    let mut volumes = HashMap::from([
        ("data".to_string(), "/vol/data".to_string()),
        ("rw".to_string(), link("a")),
        ("ro".to_string(), link("b")),
    ]);
    let node = node();
    let config = |volumes: &HashMap<String, String>| {
        container_config(ContainerInputs {
            env_refs: &EnvRefs::default(),
            backoff_base: 0,
            pod: &p,
            container: &c,
            attempt: 0,
            volumes,
            pod_ip: "",
            node: &node,
        })
    };
    let cfg = config(&volumes).unwrap();
    let devices: Vec<(&str, &str, &str)> = cfg
        .devices
        .iter()
        .map(|d| {
            (
                d.container_path.as_str(),
                d.host_path.as_str(),
                d.permissions.as_str(),
            )
        })
        .collect();
    assert_eq!(
        devices,
        vec![
            ("/dev/xvda", link("a").as_str(), "mrw"),
            ("/dev/xvdb", link("b").as_str(), "r"),
        ]
    );
    volumes.remove("ro");
    assert_eq!(
        config(&volumes).unwrap_err(),
        "cannot find volume \"ro\" to pass into container \"c\""
    );
    let mut relative = p.clone();
    relative.spec.as_mut().unwrap().containers[0]
        .volume_devices
        .as_mut()
        .unwrap()[0]
        .device_path = "dev/xvda".into();
    let c = relative.spec.as_ref().unwrap().containers[0].clone();
    let err = container_config(ContainerInputs {
        env_refs: &EnvRefs::default(),
        backoff_base: 0,
        pod: &relative,
        container: &c,
        attempt: 0,
        volumes: &volumes,
        pod_ip: "",
        node: &node,
    })
    .unwrap_err();
    assert_eq!(err, "error DevicePath `dev/xvda` must be an absolute path");
}
