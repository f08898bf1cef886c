//! QoS classes as upstream's table, cgroup parents by driver, the runtime's driver.

use super::*;

fn pod(resources: serde_json::Value) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "uid": "u1"},
        "spec": {"containers": [{"name": "c", "image": "i", "resources": resources}]}
    }))
    .unwrap()
}

/// Upstream's test helper `getResourceList(cpu, memory)`: "" leaves a resource out.
fn list(cpu: &str, memory: &str) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    if !cpu.is_empty() {
        m.insert("cpu".into(), cpu.into());
    }
    if !memory.is_empty() {
        m.insert("memory".into(), memory.into());
    }
    serde_json::Value::Object(m)
}

/// Upstream's `TestComputePodQOS` (pkg/apis/core/v1/helper/qos/qos_test.go), its rows
/// by name; `getResourceList(cpu, memory)` with "" for a resource left out. The
/// pod-level rows (PodLevelResources) are in [`qos_classes_with_pod_level_resources`].
#[test]
fn qos_classes_as_upstreams_table() {
    use QosClass::*;
    fn c(name: &str, requests: serde_json::Value, limits: serde_json::Value) -> serde_json::Value {
        serde_json::json!({"name": name, "image": "i", "resources": {"requests": requests, "limits": limits}})
    }
    fn hugepages(mut l: serde_json::Value) -> serde_json::Value {
        l["hugepages-2Mi"] = "1Gi".into();
        l
    }
    let pod = |containers: Vec<serde_json::Value>, init: Vec<serde_json::Value>| -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": "u1"},
            "spec": {"containers": containers, "initContainers": init}
        }))
        .unwrap()
    };
    let g = || c("guaranteed", list("100m", "100Mi"), list("100m", "100Mi"));
    let be = || c("best-effort", list("", ""), list("", ""));
    let rows: Vec<(
        &str,
        Vec<serde_json::Value>,
        Vec<serde_json::Value>,
        QosClass,
    )> = vec![
        ("guaranteed", vec![g()], vec![], Guaranteed),
        ("guaranteed-guaranteed", vec![g(), g()], vec![], Guaranteed),
        (
            "best-effort-best-effort",
            vec![be(), be()],
            vec![],
            BestEffort,
        ),
        ("best-effort", vec![be()], vec![], BestEffort),
        (
            "best-effort-burstable",
            vec![be(), c("burstable", list("1", ""), list("2", ""))],
            vec![],
            Burstable,
        ),
        (
            "best-effort-guaranteed",
            vec![
                be(),
                c("guaranteed", list("10m", "100Mi"), list("10m", "100Mi")),
            ],
            vec![],
            Burstable,
        ),
        (
            "burstable-cpu-guaranteed-memory",
            vec![c("burstable", list("", "100Mi"), list("", "100Mi"))],
            vec![],
            Burstable,
        ),
        (
            "burstable-no-limits",
            vec![c("burstable", list("100m", "100Mi"), list("", ""))],
            vec![],
            Burstable,
        ),
        (
            "burstable-guaranteed",
            vec![c("burstable", list("1", "100Mi"), list("2", "100Mi")), g()],
            vec![],
            Burstable,
        ),
        (
            "burstable-unbounded-but-requests-match-limits",
            vec![
                c("burstable", list("100m", "100Mi"), list("200m", "200Mi")),
                c("burstable-unbounded", list("100m", "100Mi"), list("", "")),
            ],
            vec![],
            Burstable,
        ),
        (
            "burstable-1",
            vec![c("burstable", list("10m", "100Mi"), list("100m", "200Mi"))],
            vec![],
            Burstable,
        ),
        (
            "burstable-2",
            vec![c("burstable", list("0", "0"), list("100m", "200Mi"))],
            vec![],
            Burstable,
        ),
        (
            "best-effort-hugepages",
            vec![c(
                "best-effort",
                hugepages(list("0", "0")),
                hugepages(list("0", "0")),
            )],
            vec![],
            BestEffort,
        ),
        (
            "init-container",
            vec![be()],
            vec![c("burstable", list("10m", "100Mi"), list("100m", "200Mi"))],
            Burstable,
        ),
    ];
    for (name, containers, init, want) in rows {
        assert_eq!(qos_class(&pod(containers, init)), want, "{name}");
    }
    // The API server's defaulting, which upstream's table does not exercise: limits
    // alone are requests too.
    assert_eq!(
        qos_class(&pod(
            vec![c("l", serde_json::json!({}), list("1", "1Gi"))],
            vec![]
        )),
        Guaranteed
    );
}

/// Upstream's `TestComputePodQOS` rows with `podLevelResourcesEnabled: true`
/// (`newPodWithResources(name, containers, getResourceRequirements(requests, limits))`), by
/// name: the pod-level resources alone decide.
#[test]
fn qos_classes_with_pod_level_resources() {
    use QosClass::*;
    let c = |name: &str, requests, limits| -> serde_json::Value {
        serde_json::json!({"name": name, "image": "i", "resources": {"requests": requests, "limits": limits}})
    };
    let pod = |containers: Vec<serde_json::Value>, requests, limits| -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": "u1"},
            "spec": {"containers": containers,
                     "resources": {"requests": requests, "limits": limits}}
        }))
        .unwrap()
    };
    let be = || c("best-effort", list("", ""), list("", ""));
    let rows: Vec<(&str, Pod, QosClass)> = vec![
        (
            "guaranteed-with-pod-level-resources",
            pod(vec![be()], list("10m", "100Mi"), list("10m", "100Mi")),
            Guaranteed,
        ),
        (
            "guaranteed-with-pod-and-container-level-resources",
            pod(
                vec![c("burstable", list("3m", "10Mi"), list("5m", "20Mi"))],
                list("10m", "100Mi"),
                list("10m", "100Mi"),
            ),
            Guaranteed,
        ),
        (
            "burstable-with-pod-level-resources",
            pod(vec![be()], list("10m", "10Mi"), list("20m", "50Mi")),
            Burstable,
        ),
        (
            "burstable-with-pod-and-container-level-resources",
            pod(
                vec![c("burstable", list("5m", "10Mi"), list("5m", "10Mi"))],
                list("10m", "10Mi"),
                list("20m", "50Mi"),
            ),
            Burstable,
        ),
        (
            "burstable-with-pod-and-container-level-requests",
            pod(
                vec![c("burstable", list("5m", "10Mi"), list("", ""))],
                list("10m", "10Mi"),
                list("", ""),
            ),
            Burstable,
        ),
        (
            "burstable-with-pod-and-container-level-resources-2",
            pod(
                vec![
                    c("burstable", list("5m", "10Mi"), list("", "")),
                    c("guaranteed", list("5m", "10Mi"), list("5m", "10Mi")),
                ],
                list("10m", "10Mi"),
                list("5m", ""),
            ),
            Burstable,
        ),
        // Not upstream's rows: the API server's defaulting (`defaultPodRequests`), which
        // the table's pods have already had. Pod-level limits alone are the requests.
        (
            "pod-level limits only",
            pod(vec![be()], list("", ""), list("500m", "64Mi")),
            Guaranteed,
        ),
        // Containers that request are what the pod requests: less than its limits.
        (
            "pod-level limits, container requests",
            pod(
                vec![c("c", list("100m", ""), list("", ""))],
                list("", ""),
                list("500m", "64Mi"),
            ),
            Burstable,
        ),
        // Pod-level resources set with nothing in them: the containers are not read.
        (
            "empty pod-level resources",
            pod(
                vec![c("guaranteed", list("1", "1Gi"), list("1", "1Gi"))],
                list("", ""),
                list("", ""),
            ),
            BestEffort,
        ),
    ];
    for (name, pod, want) in rows {
        assert_eq!(qos_class(&pod), want, "{name}");
    }
}

/// Upstream's `TestResourceConfigForPod` (pkg/kubelet/cm/helpers_linux_test.go), its
/// pod-level rows by name (enforceCPULimits, the default 100 ms period): shares from the
/// pod-level cpu request, quota and memory limit from the pod-level limits, whatever the
/// containers set.
#[test]
fn pod_cgroup_from_pod_level_resources_as_upstreams_table() {
    let pod = |pod_level: serde_json::Value,
               containers: Vec<serde_json::Value>,
               init: Vec<serde_json::Value>|
     -> Pod {
        let c =
            |r: serde_json::Value| serde_json::json!({"name": "c", "image": "i", "resources": r});
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": "u1"},
            "spec": {"resources": pod_level,
                     "containers": containers.into_iter().map(c).collect::<Vec<_>>(),
                     "initContainers": init.into_iter().map(c).collect::<Vec<_>>()}
        }))
        .unwrap()
    };
    let req = |cpu, mem| serde_json::json!({"requests": list(cpu, mem)});
    let both =
        |rc, rm, lc, lm| serde_json::json!({"requests": list(rc, rm), "limits": list(lc, lm)});
    let none = || serde_json::json!({});
    const MI: i64 = 1 << 20;
    let shares = milli_cpu_to_shares;
    let limited = |cpu_shares: u64, quota: i64, memory: i64| PodResources {
        cpu_shares,
        cpu_quota_us: Some(quota),
        memory_limit_bytes: Some(memory),
        memory_min: None,
    };
    let shares_only = |cpu_shares: u64| PodResources {
        cpu_shares,
        ..Default::default()
    };
    let rows: Vec<(&str, Pod, PodResources)> = vec![
        (
            "besteffort-with-pod-level-resources-enabled",
            pod(both("", "", "", ""), vec![both("", "", "", "")], vec![]),
            shares_only(2),
        ),
        (
            "burstable-with-pod-level-requests",
            pod(req("100m", "100Mi"), vec![none()], vec![]),
            shares_only(shares(100)),
        ),
        (
            "burstable-with-pod-and-container-level-requests",
            pod(
                req("100m", "100Mi"),
                vec![both("10m", "50Mi", "", "")],
                vec![],
            ),
            shares_only(shares(100)),
        ),
        (
            "burstable-with-pod-level-resources",
            pod(both("100m", "100Mi", "200m", "200Mi"), vec![none()], vec![]),
            limited(shares(100), 20_000, 200 * MI),
        ),
        (
            "burstable-with-pod-and-container-level-resources",
            pod(
                both("100m", "100Mi", "200m", "200Mi"),
                vec![both("10m", "50Mi", "50m", "100Mi")],
                vec![],
            ),
            limited(shares(100), 20_000, 200 * MI),
        ),
        (
            "burstable-with-partial-pod-level-resources-limits",
            pod(
                req("200m", "300Mi"),
                vec![both("200m", "200Mi", "200m", "200Mi")],
                vec![],
            ),
            limited(shares(200), 20_000, 200 * MI),
        ),
        (
            "guaranteed-with-pod-level-resources",
            pod(both("100m", "100Mi", "100m", "100Mi"), vec![none()], vec![]),
            limited(shares(100), 10_000, 100 * MI),
        ),
        (
            "guaranteed-with-pod-and-container-level-resources",
            pod(
                both("100m", "100Mi", "100m", "100Mi"),
                vec![both("10m", "50Mi", "50m", "100Mi")],
                vec![],
            ),
            limited(shares(100), 10_000, 100 * MI),
        ),
        (
            "guaranteed-pod-level-resources-with-init-containers",
            pod(
                both("100m", "100Mi", "100m", "100Mi"),
                vec![both("10m", "50Mi", "50m", "50Mi")],
                vec![both("10m", "50Mi", "50m", "50Mi")],
            ),
            limited(shares(100), 10_000, 100 * MI),
        ),
    ];
    for (name, pod, want) in rows {
        assert_eq!(pod_resources(&pod), want, "{name}");
    }
}

/// The shape of containerd 1.6's `config` in a verbose CRI status
/// (pkg/cri/config/config.go's JSON names), as deploy/runtime/setup.sh configures it.
#[test]
fn the_runtimes_driver_from_containerds_status() {
    let config = |options: serde_json::Value| {
        serde_json::json!({
            "containerd": {
                "snapshotter": "overlayfs",
                "defaultRuntimeName": "runc",
                "runtimes": {
                    "runc": {"runtimeType": "io.containerd.runc.v2", "options": options},
                    "kata": {"runtimeType": "io.containerd.kata.v2", "options": {}}
                }
            },
            "sandboxImage": "registry.k8s.io/pause:3.9"
        })
        .to_string()
    };
    let runc = |d| Some(("runc".to_string(), d));
    assert_eq!(
        runtime_cgroup_driver(&config(serde_json::json!({"SystemdCgroup": true}))),
        runc(CgroupDriver::Systemd)
    );
    assert_eq!(
        runtime_cgroup_driver(&config(serde_json::json!({"SystemdCgroup": false}))),
        runc(CgroupDriver::Cgroupfs)
    );
    // runc's default when the option is not set.
    assert_eq!(
        runtime_cgroup_driver(&config(serde_json::json!({"BinaryName": "runc"}))),
        runc(CgroupDriver::Cgroupfs)
    );
    let kata = config(serde_json::json!({})).replace(
        "\"defaultRuntimeName\":\"runc\"",
        "\"defaultRuntimeName\":\"kata\"",
    );
    assert_eq!(runtime_cgroup_driver(&kata), None);
    assert_eq!(runtime_cgroup_driver("{}"), None);
    assert_eq!(runtime_cgroup_driver("not json"), None);
}

#[test]
fn cgroup_parent_by_qos() {
    let p = pod(serde_json::json!({}));
    let fs = CgroupDriver::Cgroupfs;
    assert_eq!(
        pod_cgroup_parent(&p, true, "/", fs).as_deref(),
        Some("/kubepods/besteffort/podu1")
    );
    // What containerd gets under the systemd driver (it takes the last slice).
    assert_eq!(
        pod_cgroup_parent(&p, true, "/", CgroupDriver::Systemd).as_deref(),
        Some("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podu1.slice")
    );
    assert_eq!(pod_cgroup_parent(&p, false, "/", fs), None);
    // A UID that climbs names no cgroup at all (never "/kubepods/besteffort/pod../..").
    for bad in ["/../../system.slice", "..", ""] {
        let mut p = p.clone();
        p.metadata.uid = Some(bad.into());
        assert_eq!(pod_cgroup_parent(&p, true, "/", fs), None, "{bad:?}");
        assert_eq!(
            pod_cgroup_parent(&p, true, "/", CgroupDriver::Systemd),
            None
        );
    }
}

#[test]
fn pod_limits_are_sums_only_when_every_container_sets_them() {
    let two = |a: serde_json::Value, b: serde_json::Value| -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": "u1"},
            "spec": {"containers": [
                {"name": "a", "image": "i", "resources": a},
                {"name": "b", "image": "i", "resources": b}]}
        }))
        .unwrap()
    };
    let full = serde_json::json!({"limits": {"cpu": "250m", "memory": "64Mi"}});
    let r = pod_resources(&two(full.clone(), full.clone()));
    assert_eq!(
        r,
        PodResources {
            cpu_shares: 512,
            cpu_quota_us: Some(50_000),
            memory_limit_bytes: Some(128 << 20),
            memory_min: None,
        }
    );
    let r = pod_resources(&two(full, serde_json::json!({"requests": {"cpu": "100m"}})));
    assert_eq!(
        r,
        PodResources {
            cpu_shares: 358,
            cpu_quota_us: None,
            memory_limit_bytes: None,
            memory_min: None,
        }
    );
}

#[test]
fn pod_limits_count_init_containers_sidecars_and_overhead() {
    let spec = |spec: serde_json::Value| -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": "u1"}, "spec": spec
        }))
        .unwrap()
    };
    let c = |name: &str, res: serde_json::Value| serde_json::json!({"name": name, "image": "i", "resources": res});
    let mem = |m: &str| serde_json::json!({"limits": {"memory": m}});
    let both = |cpu: &str, m: &str| serde_json::json!({"limits": {"cpu": cpu, "memory": m}});
    let mut sidecar = c("side", both("100m", "8Mi"));
    sidecar["restartPolicy"] = "Always".into();
    const MI: i64 = 1 << 20;
    let rows = [
        (
            "a big init container raises the pod memory limit",
            spec(serde_json::json!({
                "initContainers": [c("init", mem("64Mi"))],
                "containers": [c("app", mem("16Mi"))]})),
            PodResources {
                cpu_shares: 2,
                cpu_quota_us: None,
                memory_limit_bytes: Some(64 * MI),
                memory_min: None,
            },
        ),
        (
            "an unlimited init container leaves the pod unlimited",
            spec(serde_json::json!({
                "initContainers": [c("init", serde_json::json!({"requests": {"memory": "1Mi"}}))],
                "containers": [c("app", mem("16Mi"))]})),
            PodResources {
                cpu_shares: 2,
                cpu_quota_us: None,
                memory_limit_bytes: None,
                memory_min: None,
            },
        ),
        (
            "a sidecar adds to the regular containers, and to a later init container",
            spec(serde_json::json!({
                "initContainers": [sidecar, c("init", both("1", "64Mi"))],
                "containers": [c("app", both("250m", "16Mi"))]})),
            PodResources {
                cpu_shares: 1126, // (1000m + 100m) * 1024 / 1000
                cpu_quota_us: Some(110_000),
                memory_limit_bytes: Some(72 * MI),
                memory_min: None,
            },
        ),
        (
            "overhead is added to requests and to the limits there are",
            spec(serde_json::json!({
                "overhead": {"cpu": "50m", "memory": "4Mi"},
                "containers": [c("app", both("250m", "16Mi"))]})),
            PodResources {
                cpu_shares: 307, // 300m
                cpu_quota_us: Some(30_000),
                memory_limit_bytes: Some(20 * MI),
                memory_min: None,
            },
        ),
        (
            "BestEffort gets the minimum shares and nothing else",
            spec(serde_json::json!({
                "overhead": {"cpu": "50m"},
                "containers": [c("app", serde_json::json!({}))]})),
            PodResources {
                cpu_shares: 2,
                cpu_quota_us: None,
                memory_limit_bytes: None,
                memory_min: None,
            },
        ),
    ];
    for (what, pod, want) in rows {
        assert_eq!(pod_resources(&pod), want, "{what}");
    }
}

#[test]
fn pod_cgroup_is_created_with_its_limits_on_v1() {
    let fs = tempfile::tempdir().unwrap();
    for ctl in ["cpu", "memory", "pids"] {
        std::fs::create_dir_all(fs.path().join(ctl)).unwrap();
    }
    let res = PodResources {
        cpu_shares: 512,
        cpu_quota_us: Some(50_000),
        memory_limit_bytes: Some(1 << 20),
        memory_min: None,
    };
    ensure_pod_cgroup(fs.path(), "/kubepods/podu1", &res, 100).unwrap();
    let read = |p: &str| std::fs::read_to_string(fs.path().join(p)).unwrap();
    assert_eq!(read("cpu/kubepods/podu1/cpu.shares"), "512");
    assert_eq!(read("cpu/kubepods/podu1/cpu.cfs_quota_us"), "50000");
    assert_eq!(
        read("memory/kubepods/podu1/memory.limit_in_bytes"),
        "1048576"
    );
    assert_eq!(read("pids/kubepods/podu1/pids.max"), "100");
}

#[test]
fn removal_walks_every_hierarchy() {
    let fs = tempfile::tempdir().unwrap();
    for ctl in ["memory", "pids"] {
        std::fs::create_dir_all(fs.path().join(ctl).join("kubepods/besteffort/podu1/ctr")).unwrap();
    }
    remove_pod_cgroup(fs.path(), "/kubepods/besteffort/podu1").unwrap();
    assert!(!fs.path().join("memory/kubepods/besteffort/podu1").exists());
    assert!(fs.path().join("memory/kubepods/besteffort").exists());
    remove_pod_cgroup(fs.path(), "/kubepods/besteffort/podu1").unwrap();
}

/// `kubepods` and the tiers for upstream's `activeTestPods`
/// (pkg/kubelet/cm/qos_container_manager_linux_test.go: a Guaranteed pod of 1 CPU, a
/// Burstable one requesting 1 CPU with a limit of 2, another requesting 2), as
/// `setCPUCgroupConfig` and `getCgroupConfig` set them: burstable the shares of the 3
/// CPUs its pods request (3072), besteffort `MinShares`, `kubepods` the shares and memory
/// of what it is limited to. Under a root of its own (`cgroupRoot: /r`).
#[test]
fn qos_tiers_for_upstreams_active_test_pods() {
    let guaranteed = pod(serde_json::json!({
        "requests": {"memory": "128Mi", "cpu": "1"}, "limits": {"memory": "128Mi", "cpu": "1"}}));
    let burstable1 = pod(serde_json::json!({
        "requests": {"memory": "128Mi", "cpu": "1"}, "limits": {"memory": "256Mi", "cpu": "2"}}));
    let burstable2 = pod(serde_json::json!({"requests": {"memory": "256Mi", "cpu": "2"}}));
    let best_effort = pod(serde_json::json!({}));
    let limits = PodsLimits {
        cpu_millis: 1500,
        memory: 3 << 30,
        pids: 4096,
    };
    let tiers = qos_cgroups(
        "/r",
        limits,
        [&guaranteed, &burstable1, &burstable2, &best_effort],
        false,
    );
    let by_name: Vec<(String, PodResources, i64)> = tiers
        .into_iter()
        .map(|(n, r, p)| (n.to_cgroupfs(), r, p))
        .collect();
    assert_eq!(
        by_name,
        vec![
            (
                "/r/kubepods".to_string(),
                PodResources {
                    cpu_shares: 1536,
                    cpu_quota_us: None,
                    memory_limit_bytes: Some(3 << 30),
                    memory_min: None,
                },
                4096
            ),
            (
                "/r/kubepods/burstable".to_string(),
                PodResources {
                    cpu_shares: 3072,
                    ..Default::default()
                },
                0
            ),
            (
                "/r/kubepods/besteffort".to_string(),
                PodResources {
                    cpu_shares: 2,
                    ..Default::default()
                },
                0
            ),
        ]
    );
    // No Burstable pod: MilliCPUToShares(0) is MinShares, as upstream's.
    let none = qos_cgroups("/", limits, [&guaranteed], false);
    assert_eq!(none[1].0.to_cgroupfs(), "/kubepods/burstable");
    assert_eq!(none[1].1.cpu_shares, 2);
    assert_eq!(milli_cpu_to_shares(0), 2);
    assert_eq!(milli_cpu_to_shares(1), 2);
    assert_eq!(milli_cpu_to_shares(250), 256);
    assert_eq!(milli_cpu_to_shares(i64::MAX), 262_144);
    // With memory QoS, `memory.min` of `burstable` its pods' requests and of `kubepods`
    // the Guaranteed and Burstable pods' (qos_container_manager_linux.go `setMemoryQoS`);
    // back to 0 once no pod requests any.
    let all = [&guaranteed, &burstable1, &burstable2, &best_effort];
    let with = qos_cgroups("/r", limits, all, true);
    // upstream's TestQoSContainerCgroup values for these pods: 512Mi and 384Mi.
    assert_eq!(with[0].1.memory_min, Some(512 << 20));
    assert_eq!(with[1].1.memory_min, Some(384 << 20));
    assert_eq!(with[2].1.memory_min, None);
    let empty = qos_cgroups("/r", limits, [&best_effort], true);
    assert_eq!(
        (empty[0].1.memory_min, empty[1].1.memory_min),
        (Some(0), Some(0))
    );
}

/// `enforceNodeAllocatable: [pods]` (the default) limits `kubepods` to capacity less the
/// reservations, and not less the eviction threshold (upstream's
/// `getNodeAllocatableAbsolute`); without `pods` it gets the capacity.
#[test]
fn kubepods_is_allocatable_less_reservations_only_where_enforced() {
    let mut kubelet = nodeagent_config::KubeletConfiguration::default();
    kubelet.kube_reserved.insert("cpu".into(), "500m".into());
    kubelet
        .system_reserved
        .insert("memory".into(), "1Gi".into());
    kubelet.eviction_hard = Some(std::collections::BTreeMap::from([(
        "memory.available".to_string(),
        "2Gi".to_string(),
    )]));
    kubelet.system_reserved.insert("pid".into(), "1000".into());
    kubelet.kube_reserved.insert("pid".into(), "24".into());
    let enforced = PodsLimits::of_this_node(&kubelet);
    let cpus = nodeagent_config::machine::cpus() as i64 * 1000;
    let memory = nodeagent_config::machine::memory_bytes() as i64;
    // Upstream's pid capacity: min(kernel.pid_max, kernel.threads-max).
    let read = |p: &str| -> i64 { std::fs::read_to_string(p).unwrap().trim().parse().unwrap() };
    let tasks = read("/proc/sys/kernel/pid_max").min(read("/proc/sys/kernel/threads-max"));
    assert_eq!(enforced.cpu_millis, cpus - 500);
    assert_eq!(enforced.memory, memory - (1 << 30));
    assert_eq!(enforced.pids, tasks - 1024);
    kubelet.enforce_node_allocatable = vec!["none".into()];
    let capacity = PodsLimits::of_this_node(&kubelet);
    assert_eq!(
        (capacity.cpu_millis, capacity.memory, capacity.pids),
        (cpus, memory, tasks)
    );
}
