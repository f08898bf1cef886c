//! The CPU manager against upstream's tables: `state_checkpoint_test.go`'s
//! `TestCheckpointStateRestore` (the file format and its checksum, byte for byte), the
//! 4-CPU rows of `cpu_manager_test.go` (`TestCPUManagerAdd`, `TestCPUManagerGenerate`),
//! `policy_static_test.go`'s `TestStaticPolicyRemove` and its "not enough cpus" words,
//! and `validateState`'s errors.

use super::checkpoint::Checkpoint;
use super::policy::{AllocError, Assignments, Options, StaticPolicy, Topology};
use super::*;

fn set(text: &str) -> CpuSet {
    CpuSet::parse(text).unwrap()
}

/// A state: the shared pool `default`, and one pod's containers with their CPUs.
fn state(default: &str, pod: &str, containers: &[(&str, &str)]) -> Assignments {
    let mut s = Assignments {
        default: set(default),
        ..Default::default()
    };
    for (c, cpus) in containers {
        s.entries
            .entry(pod.into())
            .or_default()
            .insert(c.to_string(), set(cpus));
    }
    s
}

/// `TestCheckpointStateRestore`: each row's file as upstream's test writes it, the
/// configured policy, and the error (a substring) or the state restored.
#[test]
fn checkpoint_restore_as_upstreams_table() {
    let restore = |json: &str, policy: &str| -> Result<Assignments, String> {
        Checkpoint::decode(json.as_bytes())?.into_assignments(policy)
    };
    let pod = |entries: &[(&str, &str)]| -> Assignments { state("", "pod", entries) };
    // "Restore default cpu set"
    let got = restore(
        r#"{"policyName": "none", "defaultCPUSet": "4-6", "entries": {}, "checksum": 354655845}"#,
        "none",
    )
    .unwrap();
    assert_eq!(
        got,
        Assignments {
            default: set("4-6"),
            ..Default::default()
        }
    );
    // "Restore valid checkpoint"
    let got = restore(
        r#"{"policyName": "none", "defaultCPUSet": "1-3",
            "entries": {"pod": {"container1": "4-6", "container2": "1-3"}},
            "checksum": 3610638499}"#,
        "none",
    )
    .unwrap();
    let mut want = pod(&[("container1", "4-6"), ("container2", "1-3")]);
    want.default = set("1-3");
    assert_eq!(got, want);
    // "Restore checkpoint with invalid checksum"
    let err = restore(
        r#"{"policyName": "none", "defaultCPUSet": "4-6", "entries": {}, "checksum": 1337}"#,
        "none",
    )
    .unwrap_err();
    assert_eq!(err, "checkpoint is corrupted");
    // "Restore checkpoint with invalid JSON": Go says "unexpected end of JSON input".
    assert!(restore("{", "none").unwrap_err().contains("EOF"));
    // "Restore checkpoint with invalid policy name"
    let err = restore(
        r#"{"policyName": "other", "defaultCPUSet": "1-3", "entries": {}, "checksum": 1394507217}"#,
        "none",
    )
    .unwrap_err();
    assert_eq!(
        err,
        r#"configured policy "none" differs from state checkpoint policy "other""#
    );
    // "Restore checkpoint with unparsable default cpu set"
    let err = restore(
        r#"{"policyName": "none", "defaultCPUSet": "1.3", "entries": {}, "checksum": 3021697696}"#,
        "none",
    )
    .unwrap_err();
    assert_eq!(
        err,
        r#"could not parse default cpu set "1.3": strconv.Atoi: parsing "1.3": invalid syntax"#
    );
    // "Restore checkpoint with unparsable assignment entry"
    let err = restore(
        r#"{"policyName": "none", "defaultCPUSet": "1-3",
            "entries": {"pod": {"container1": "4-6", "container2": "asd"}},
            "checksum": 962272150}"#,
        "none",
    )
    .unwrap_err();
    assert_eq!(
        err,
        r#"could not parse cpuset "asd" for container "container2" in pod "pod": strconv.Atoi: parsing "asd": invalid syntax"#
    );
    // "Restore checkpoint from checkpoint with v1 checksum"
    let got = restore(
        r#"{"policyName": "none", "defaultCPUSet": "1-3", "checksum": 1694838852}"#,
        "none",
    )
    .unwrap();
    assert_eq!(
        got,
        Assignments {
            default: set("1-3"),
            ..Default::default()
        }
    );
    // "Restore checkpoint with migration" (V1 entries by container ID, 3680390589) is not
    // ported: the V1 format (before 1.16) is not read here; its entries do not parse as V2.
    assert!(
        restore(
            r#"{"policyName": "none", "defaultCPUSet": "1-3",
                "entries": {"containerID1": "4-6", "containerID2": "1-3"},
                "checksum": 3680390589}"#,
            "none"
        )
        .is_err()
    );
}

/// The files upstream's kubelet writes, byte for byte (a none-policy node's, and a static
/// node's with one pod, from a real node).
#[test]
fn checkpoint_files_as_upstreams_kubelet_writes_them() {
    let none = Checkpoint::of("none", &Assignments::default());
    assert_eq!(
        String::from_utf8(none.encode()).unwrap(),
        r#"{"policyName":"none","defaultCpuSet":"","checksum":1353318690}"#
    );
    let real = r#"{"policyName":"static","defaultCpuSet":"0,4-27","entries":{"39b37746-7f5e-4064-b8e1-eebd2bfaa003":{"app":"1-3"}},"checksum":3300516549}"#;
    let state = Checkpoint::decode(real.as_bytes())
        .unwrap()
        .into_assignments("static")
        .unwrap();
    assert_eq!(state.default, set("0,4-27"));
    assert_eq!(
        String::from_utf8(Checkpoint::of("static", &state).encode()).unwrap(),
        real
    );
    // A null entries map is Go's nil map: another checksum.
    let null = r#"{"policyName":"none","defaultCpuSet":"","entries":null,"checksum":1353318690}"#;
    assert_eq!(
        Checkpoint::decode(null.as_bytes()).unwrap_err(),
        "checkpoint is corrupted"
    );
    // Checksum 0 is accepted (old file backends), as upstream.
    assert!(
        Checkpoint::decode(br#"{"policyName":"none","defaultCpuSet":"","checksum":0}"#).is_ok()
    );
}

fn flat(n: u32) -> Topology {
    Topology::new((0..n).map(|cpu| (cpu, 0, cpu)).collect())
}

/// upstream's `topoSingleSocketHT`: 8 CPUs, 4 cores of 2 threads (core i: i and i+4).
fn single_socket_ht() -> Topology {
    Topology::new((0..8).map(|cpu| (cpu, 0, cpu % 4)).collect())
}

/// upstream's `topoDualSocketHT`: 12 CPUs, 2 sockets of 3 cores of 2 threads; socket 0
/// has 0,2,4,6,8,10 (cores 0,2,4 with siblings +6), socket 1 the odd ones.
fn dual_socket_ht() -> Topology {
    Topology::new(
        (0..12)
            .map(|cpu| (cpu, cpu % 2, if cpu < 6 { cpu } else { cpu - 6 }))
            .collect(),
    )
}

fn pod(uid: &str, init: &[(&str, &str)], containers: &[(&str, &str)]) -> Pod {
    let c = |(name, cpu): &(&str, &str)| {
        serde_json::json!({"name": name, "image": "i", "resources": {
            "requests": {"cpu": cpu, "memory": "100Mi"},
            "limits": {"cpu": cpu, "memory": "100Mi"}}})
    };
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": uid, "uid": uid},
        "spec": {
            "initContainers": init.iter().map(c).collect::<Vec<_>>(),
            "containers": containers.iter().map(c).collect::<Vec<_>>(),
        }
    }))
    .unwrap()
}

/// `TestCPUManagerAdd`: 4 CPUs (1-4 here as upstream's), none reserved beyond the policy's
/// own; a container asking for 2 gets the two lowest, the shared set keeps the rest; one
/// asking for more than is free fails in upstream's words.
#[test]
fn allocation_as_upstreams_cpu_manager_add() {
    let topo = Topology::new((1..=4).map(|cpu| (cpu, 0, cpu)).collect());
    let policy = StaticPolicy {
        topology: topo,
        reserved: CpuSet::new(),
        options: Default::default(),
    };
    let mut s = Assignments::default();
    policy.start(&mut s).unwrap();
    assert_eq!(s.default, set("1-4"));
    policy
        .allocate_pod(&mut s, &pod("p", &[], &[("c", "2")]))
        .unwrap();
    assert_eq!(s.entries["p"]["c"], set("1-2"));
    assert_eq!(s.default, set("3-4"));
    let err = policy
        .allocate_pod(&mut s, &pod("q", &[], &[("c", "3")]))
        .unwrap_err();
    assert_eq!(
        err,
        "not enough cpus available to satisfy request: requested=3, available=2"
    );
    // Nothing of the refused pod stays assigned.
    assert!(!s.entries.contains_key("q"));
    assert_eq!(s.default, set("3-4"));
}

/// `TestStaticPolicyRemove`, its three rows (one container removed at a time).
#[test]
fn removal_as_upstreams_static_policy_remove() {
    let policy = StaticPolicy {
        topology: single_socket_ht(),
        reserved: set("0"),
        options: Default::default(),
    };
    for (assigned, default, want) in [
        (vec![("fakeContainer1", "1-3")], "4-7", "1-7"),
        (
            vec![("fakeContainer1", "1-3"), ("fakeContainer2", "4-7")],
            "",
            "1-3",
        ),
        (
            vec![("fakeContainer1", "1,3,5"), ("fakeContainer2", "2,4")],
            "6-7",
            "1,3,5-7",
        ),
    ] {
        let mut s = state(default, "fakePod", &assigned);
        policy.remove_container(&mut s, "fakePod", "fakeContainer1");
        assert_eq!(s.default, set(want), "{assigned:?}");
        assert!(
            !s.entries
                .get("fakePod")
                .is_some_and(|e| e.contains_key("fakeContainer1"))
        );
    }
}

/// `TestStaticPolicyAdd`'s error rows on `topoSingleSocketHT` (reserved {0}), in
/// upstream's words, and `TestStaticPolicyStart`'s rows on `topoDualSocketHT` (two
/// reserved CPUs are a whole core: 0 and its sibling 6).
#[test]
fn static_policy_add_and_start_as_upstreams() {
    let policy = StaticPolicy::new(single_socket_ht(), &CpuSet::new(), 1000).unwrap();
    assert_eq!(policy.reserved, set("0"));
    // "GuPodMultipleCores, SingleSocketHT, NoAllocExpectError"
    let mut s = state("0,7", "fakePod", &[("fakeContainer100", "1-6")]);
    assert_eq!(
        policy
            .allocate_pod(&mut s, &pod("p", &[], &[("fakeContainer3", "2")]))
            .unwrap_err(),
        "not enough cpus available to satisfy request: requested=2, available=1"
    );
    // "GuPodSingleCore, SingleSocketHT, ExpectError"
    let mut s = Assignments {
        default: set("0-7"),
        ..Default::default()
    };
    assert_eq!(
        policy
            .allocate_pod(&mut s, &pod("p", &[], &[("c", "8")]))
            .unwrap_err(),
        "not enough cpus available to satisfy request: requested=8, available=7"
    );
    // "NonGuPod, SingleSocketHT, NoAlloc" (1000m/2000m) and "GuPodNonIntegerCore" (977m).
    let burstable: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "b", "uid": "b"},
        "spec": {"containers": [{"name": "c", "image": "i", "resources": {
            "requests": {"cpu": "1000m", "memory": "1G"}, "limits": {"cpu": "2000m", "memory": "1G"}}}]}
    }))
    .unwrap();
    policy.allocate_pod(&mut s, &burstable).unwrap();
    policy
        .allocate_pod(&mut s, &pod("f", &[], &[("c", "977m")]))
        .unwrap();
    assert!(s.entries.is_empty());
    assert_eq!(s.default, set("0-7"));
    assert_eq!(policy.cpus_of(&s, "b", "c"), s.default);

    let policy = StaticPolicy::new(dual_socket_ht(), &CpuSet::new(), 2000).unwrap();
    assert_eq!(policy.reserved, set("0,6"));
    let mut s = Assignments::default();
    policy.start(&mut s).unwrap();
    assert_eq!(s.default, set("0-11"));
    let mut s = Assignments {
        default: set("0-1"),
        ..Default::default()
    };
    assert_eq!(
        policy.start(&mut s).unwrap_err(),
        r#"not all reserved cpus: "0,6" are present in defaultCpuSet: "0-1""#
    );

    // The StrictCPUReservationOption rows: "some of reserved cores are present in
    // available cpuset" and "assigned core 2 is still present in available cpuset"; and a
    // new state's shared pool leaves the reserved CPUs out (validateState's allCPUs).
    let strict = StaticPolicy {
        options: Options {
            strict_cpu_reservation: true,
            ..Default::default()
        },
        ..policy.clone()
    };
    let mut s = Assignments {
        default: set("0-1"),
        ..Default::default()
    };
    assert_eq!(
        strict.start(&mut s).unwrap_err(),
        r#"some of strictly reserved cpus: "0" are present in defaultCpuSet: "0-1""#
    );
    // (upstream's rows reserve nothing here)
    let unreserved = |strict_cpu_reservation| StaticPolicy {
        reserved: CpuSet::new(),
        options: Options {
            strict_cpu_reservation,
            ..Default::default()
        },
        ..policy.clone()
    };
    for p in [unreserved(false), unreserved(true)] {
        let mut s = state("2-11", "fakePod", &[("0", "0-2")]);
        assert_eq!(
            p.start(&mut s).unwrap_err(),
            r#"pod: fakePod, container: 0 cpuset: "0-2" overlaps with default cpuset "2-11""#
        );
    }
    let mut s = Assignments::default();
    strict.start(&mut s).unwrap();
    assert_eq!(s.default, set("1-5,7-11"));
    // Restored: the shared pool and the assignments cover every CPU but the reserved.
    strict.start(&mut s).unwrap();
    let mut whole = Assignments {
        default: set("0-11"),
        ..Default::default()
    };
    assert_eq!(
        strict.start(&mut whole).unwrap_err(),
        r#"some of strictly reserved cpus: "0,6" are present in defaultCpuSet: "0-11""#
    );
    let mut short = Assignments {
        default: set("1-5,7-10"),
        ..Default::default()
    };
    assert_eq!(
        strict.start(&mut short).unwrap_err(),
        r#"current set of available CPUs "1-5,7-11" doesn't match with CPUs in state "1-5,7-10""#
    );
    // A Guaranteed pod's CPUs come from the pool as before, and the reserved stay out.
    let mut s = Assignments::default();
    strict.start(&mut s).unwrap();
    strict
        .allocate_pod(&mut s, &pod("g", &[], &[("c", "2")]))
        .unwrap();
    assert!(s.default.intersection(&set("0,6")).is_empty());
    assert_eq!(s.default.union(&s.assigned()), set("1-5,7-11"));
}

/// Ours, on upstream's topologies and its packing rule (whole sockets, then whole cores,
/// then threads of cores already split): no upstream row pins these.
#[test]
fn allocation_packs_cores_and_sockets() {
    let policy = StaticPolicy::new(single_socket_ht(), &CpuSet::new(), 1000).unwrap();
    let mut s = Assignments::default();
    policy.start(&mut s).unwrap();
    policy
        .allocate_pod(&mut s, &pod("p", &[], &[("c", "2")]))
        .unwrap();
    assert_eq!(s.entries["p"]["c"], set("1,5"));
    policy
        .allocate_pod(&mut s, &pod("q", &[], &[("c", "1")]))
        .unwrap();
    assert_eq!(s.entries["q"]["c"], set("4"));
    let policy = StaticPolicy::new(dual_socket_ht(), &CpuSet::new(), 1000).unwrap();
    let mut s = Assignments::default();
    policy.start(&mut s).unwrap();
    policy
        .allocate_pod(&mut s, &pod("p", &[], &[("c", "6")]))
        .unwrap();
    assert_eq!(s.entries["p"]["c"], set("1,3,5,7,9,11"));
}

/// upstream's init-container reuse (`TestStaticPolicyAddWithInitContainers` in spirit): an
/// init container's CPUs go to the app container after it; a sidecar's stay its own.
#[test]
fn init_container_cpus_are_reused_by_the_app_containers() {
    let policy = StaticPolicy {
        topology: flat(4),
        reserved: set("0"),
        options: Default::default(),
    };
    let mut s = Assignments::default();
    policy.start(&mut s).unwrap();
    policy
        .allocate_pod(&mut s, &pod("p", &[("init", "2")], &[("app", "2")]))
        .unwrap();
    assert_eq!(s.entries["p"]["init"], set("1-2"));
    assert_eq!(s.entries["p"]["app"], set("1-2"));
    assert_eq!(s.default, set("0,3"));
    policy.remove_pod(&mut s, "p");
    assert_eq!(s.default, set("0-3"));
    // A sidecar (restartPolicy Always) runs beside the app: no reuse.
    let mut sidecar = pod("q", &[("side", "1")], &[("app", "2")]);
    sidecar
        .spec
        .as_mut()
        .unwrap()
        .init_containers
        .as_mut()
        .unwrap()[0]
        .restart_policy = Some("Always".into());
    policy.allocate_pod(&mut s, &sidecar).unwrap();
    assert_eq!(s.entries["q"]["side"], set("1"));
    assert_eq!(s.entries["q"]["app"], set("2-3"));
    assert_eq!(s.default, set("0"));
}

/// `TestCPUManagerGenerate` and `validateState`: the start-up errors in upstream's words.
#[test]
fn start_up_errors_as_upstreams() {
    assert_eq!(
        StaticPolicy::new(flat(4), &CpuSet::new(), 0).unwrap_err(),
        "[cpumanager] the static policy requires systemreserved.cpu + kubereserved.cpu to be greater than zero"
    );
    // Fractional reservations round up (1500m: two CPUs).
    assert_eq!(
        StaticPolicy::new(flat(4), &CpuSet::new(), 1500)
            .unwrap()
            .reserved,
        set("0-1")
    );
    assert_eq!(
        StaticPolicy::new(flat(4), &CpuSet::new(), 5000).unwrap_err(),
        "[cpumanager] unable to reserve the required amount of CPUs (size of  did not equal 5)"
    );
    assert_eq!(
        StaticPolicy::new(flat(2), &set("1"), 0).unwrap().reserved,
        set("1")
    );
    let policy = StaticPolicy {
        topology: flat(4),
        reserved: set("0"),
        options: Default::default(),
    };
    let state = |default: &str, entries: &[(&str, &str)]| {
        let mut s = Assignments {
            default: set(default),
            ..Default::default()
        };
        for (c, cpus) in entries {
            s.entries
                .entry("pod".into())
                .or_default()
                .insert(c.to_string(), set(cpus));
        }
        s
    };
    assert_eq!(
        policy.start(&mut state("", &[("c", "1")])).unwrap_err(),
        "default cpuset cannot be empty"
    );
    assert_eq!(
        policy.start(&mut state("1-3", &[])).unwrap_err(),
        r#"not all reserved cpus: "0" are present in defaultCpuSet: "1-3""#
    );
    assert_eq!(
        policy
            .start(&mut state("0-2", &[("c", "2-3")]))
            .unwrap_err(),
        r#"pod: pod, container: c cpuset: "2-3" overlaps with default cpuset "0-2""#
    );
    assert_eq!(
        policy.start(&mut state("0-1", &[("c", "2")])).unwrap_err(),
        r#"current set of available CPUs "0-3" doesn't match with CPUs in state "0-2""#
    );
    policy.start(&mut state("0-1", &[("c", "2-3")])).unwrap();
}

fn static_config(reserved: &str) -> nodeagent_config::KubeletConfiguration {
    nodeagent_config::KubeletConfiguration {
        cpu_manager_policy: "static".into(),
        reserved_system_cpus: reserved.into(),
        ..Default::default()
    }
}

/// The manager over its file: an assignment survives a restart (a new manager on the
/// same root directory), the file is upstream's, a pod no longer active gives its CPUs
/// back, and a file of another policy stops the start in upstream's words.
#[test]
fn assignments_survive_a_restart_and_are_released_when_the_pod_goes() {
    let dir = tempfile::tempdir().unwrap();
    let start = |cfg: &nodeagent_config::KubeletConfiguration| {
        CpuManager::start_with(cfg, dir.path(), flat(2))
    };
    let m = start(&static_config("0")).unwrap();
    m.admit(&pod("g1", &[], &[("c", "1")])).unwrap();
    assert_eq!(m.cpuset("g1", "c").as_deref(), Some("1"));
    assert_eq!(m.cpuset("other", "c").as_deref(), Some("0"));
    let err = m.admit(&pod("g2", &[], &[("c", "1")])).unwrap_err();
    assert_eq!(
        err,
        "not enough cpus available to satisfy request: requested=1, available=0"
    );
    let file = std::fs::read_to_string(dir.path().join(STATE_FILE)).unwrap();
    assert_eq!(
        file,
        format!(
            r#"{{"policyName":"static","defaultCpuSet":"0","entries":{{"g1":{{"c":"1"}}}},"checksum":{}}}"#,
            Checkpoint::of("static", &m.snapshot()).checksum
        )
    );
    drop(m);
    let m = start(&static_config("0")).unwrap();
    assert_eq!(m.cpuset("g1", "c").as_deref(), Some("1"));
    // The running containers: each gets its cpuset once, then nothing is out of date.
    let running = vec![
        ("id1".to_string(), "g1".to_string(), "c".to_string()),
        ("id2".to_string(), "b".to_string(), "c".to_string()),
    ];
    assert_eq!(
        m.out_of_date(&running),
        vec![("id1".into(), "1".into()), ("id2".into(), "0".into())]
    );
    m.applied("id1", "1");
    m.applied("id2", "0");
    assert!(m.out_of_date(&running).is_empty());
    // g1 goes: its CPU returns to the shared set, which b then gets.
    let active: std::collections::BTreeSet<String> = ["b".to_string()].into();
    assert_eq!(m.release_inactive(&active), vec!["g1".to_string()]);
    assert_eq!(
        m.out_of_date(&running[1..]),
        vec![("id2".into(), "0-1".into())]
    );
    drop(m);
    // A none-policy node on a static file: upstream's error, naming the file.
    let err = start(&nodeagent_config::KubeletConfiguration::default())
        .err()
        .unwrap();
    assert!(
        err.starts_with(r#"could not restore state from checkpoint: configured policy "none" differs from state checkpoint policy "static", please drain this node and delete the CPU manager checkpoint file"#),
        "{err}"
    );
    // The none policy sets no cpuset and writes upstream's none file.
    std::fs::remove_file(dir.path().join(STATE_FILE)).unwrap();
    let m = start(&nodeagent_config::KubeletConfiguration::default()).unwrap();
    assert_eq!(m.cpuset("g1", "c"), None);
    assert_eq!(
        std::fs::read_to_string(dir.path().join(STATE_FILE)).unwrap(),
        r#"{"policyName":"none","defaultCpuSet":"","checksum":1353318690}"#
    );
}

/// `TestStaticPolicyAdd`'s `smtalignOptionTestCases` (policy_static_test.go), with
/// `full-pcpus-only`: a request that is not whole cores, or more than the free CPUs of
/// cores without a reserved CPU (kubernetes #113537), is an `SMTAlignmentError` in
/// upstream's words, and nothing is assigned; whole cores are given otherwise.
#[test]
fn full_pcpus_only_as_upstreams_smtalign_rows() {
    let full = Options {
        full_pcpus_only: true,
        ..Default::default()
    };
    // "GuPodSingleCore, SingleSocketHT, ExpectAllocOneCPU" (one CPU reserved: {0}).
    let policy = StaticPolicy::new(single_socket_ht(), &CpuSet::new(), 1000)
        .unwrap()
        .with_options(full);
    let mut s = Assignments {
        default: set("0-7"),
        ..Default::default()
    };
    let err = policy
        .allocate_pod(&mut s, &pod("p", &[], &[("fakeContainer2", "1")]))
        .unwrap_err();
    assert_eq!(
        err,
        AllocError::SmtAlignment(
            "SMT Alignment Error: requested 1 cpus not multiple cpus per core = 2".into()
        )
    );
    assert!(s.entries.is_empty());
    // "GuPodManyCores, topoDualSocketHT, ExpectDoNotAllocPartialCPU": reserved {1,6},
    // whose siblings 7 and 0 are not given either.
    let policy = StaticPolicy::new(dual_socket_ht(), &set("1,6"), 0)
        .unwrap()
        .with_options(full);
    let mut s = Assignments {
        default: set("0,2-5,7-11"),
        ..Default::default()
    };
    assert_eq!(
        policy
            .allocate_pod(&mut s, &pod("p", &[], &[("fakeContainerBug113537_1", "10")]))
            .unwrap_err(),
        AllocError::SmtAlignment("SMT Alignment Error: not enough free physical CPUs: available physical CPUs = 8, requested CPUs = 10, CPUs per core = 2".into())
    );
    // "GuPodManyCores, topoDualSocketHT, AutoReserve, ExpectAllocAllCPUs" and
    // "... ExpectAllocAllCPUs" (reserved {0,6}): every CPU but the reserved core.
    for reserved in [CpuSet::new(), set("0,6")] {
        let policy = StaticPolicy::new(dual_socket_ht(), &reserved, 2000)
            .unwrap()
            .with_options(full);
        assert_eq!(policy.reserved, set("0,6"));
        let mut s = Assignments {
            default: set("1-5,7-11"),
            ..Default::default()
        };
        policy
            .allocate_pod(
                &mut s,
                &pod("p", &[], &[("fakeContainerBug113537_2", "10")]),
            )
            .unwrap();
        assert_eq!(s.entries["p"]["fakeContainerBug113537_2"], set("1-5,7-11"));
    }
    // "GuPodMultipleCores, topoQuadSocketFourWayHT": an SMT level of 4 (here one socket
    // of two 4-thread cores, upstream's topology is 4 sockets of them): 3 is refused.
    let four_way = Topology::new((0..8).map(|cpu| (cpu, 0, cpu % 2)).collect());
    let policy = StaticPolicy {
        topology: four_way,
        reserved: CpuSet::new(),
        options: full,
    };
    let mut s = Assignments {
        default: set("0-7"),
        ..Default::default()
    };
    assert_eq!(
        policy
            .allocate_pod(&mut s, &pod("p", &[], &[("c", "3")]))
            .unwrap_err(),
        "SMT Alignment Error: requested 3 cpus not multiple cpus per core = 4"
    );
    // Without the option the same request is given its CPUs (a lone thread among them).
    let policy = StaticPolicy {
        options: Options::default(),
        ..policy
    };
    policy
        .allocate_pod(&mut s, &pod("p", &[], &[("c", "3")]))
        .unwrap();
}
