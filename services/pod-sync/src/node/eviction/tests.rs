use super::*;
use nodeagent_config::eviction::Value;

const MI: u64 = 1 << 20;

fn pod(uid: &str, priority: i32, usage: u64, request: u64) -> Candidate {
    Candidate {
        uid: uid.into(),
        priority,
        usage,
        request,
        containers: vec![("c".into(), usage, request)],
        critical: false,
    }
}

fn order(signal: Signal, mut pods: Vec<Candidate>) -> Vec<String> {
    rank(signal, &mut pods);
    pods.into_iter().map(|p| p.uid).collect()
}

#[test]
fn memory_ranks_over_request_then_priority_then_excess() {
    let pods = vec![
        pod("within-request", 0, 900 * MI, 1000 * MI),
        pod("over-high-priority", 1000, 300 * MI, 100 * MI),
        pod("over-small", 0, 150 * MI, 100 * MI),
        pod("over-big", 0, 600 * MI, 0),
    ];
    assert_eq!(
        order(Signal::MemoryAvailable, pods.clone()),
        [
            "over-big",
            "over-small",
            "over-high-priority",
            "within-request"
        ]
    );
    // Disk ranks the same way on ephemeral storage.
    assert_eq!(
        order(Signal::NodeFsAvailable, pods),
        [
            "over-big",
            "over-small",
            "over-high-priority",
            "within-request"
        ]
    );
}

#[test]
fn pids_rank_by_priority_then_count() {
    let pods = vec![
        pod("many-high", 10, 500, 0),
        pod("few", 0, 5, 0),
        pod("many", 0, 400, 0),
    ];
    assert_eq!(
        order(Signal::PidAvailable, pods),
        ["many", "few", "many-high"]
    );
}

#[test]
fn the_message_is_upstreams() {
    let t = Threshold {
        signal: Signal::MemoryAvailable,
        value: Value::Quantity(100 * MI),
        grace_period: Duration::ZERO,
        min_reclaim: None,
    };
    let o = Observed {
        available: 50 * MI,
        capacity: 1000 * MI,
    };
    let mut c = pod("p", 0, 500 * MI, 0);
    c.containers.push(("quiet".into(), MI, 2 * MI));
    assert_eq!(
        message(&t, &o, &c),
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. \
         Container c was using 500Mi, request is 0, has larger consumption of memory. "
    );
    let disk = Threshold {
        signal: Signal::NodeFsAvailable,
        value: Value::Percentage(0.5),
        grace_period: Duration::ZERO,
        min_reclaim: None,
    };
    let o = Observed {
        available: 10 * MI,
        capacity: 100 * MI,
    };
    assert!(
        message(&disk, &o, &pod("p", 0, 0, 0))
            .starts_with("The node was low on resource: ephemeral-storage. Threshold quantity: 50Mi, available: 10Mi. ")
    );
    let pids = Threshold {
        signal: Signal::PidAvailable,
        value: Value::Quantity(1000),
        grace_period: Duration::ZERO,
        min_reclaim: None,
    };
    let o = Observed {
        available: 500,
        capacity: 4_000_000,
    };
    assert_eq!(
        message(&pids, &o, &pod("p", 0, 800, 0)),
        "The node was low on resource: pids. Threshold quantity: 1000, available: 500. "
    );
}

#[test]
fn the_event_names_the_offending_containers() {
    let t = Threshold {
        signal: Signal::MemoryAvailable,
        value: Value::Quantity(100 * MI),
        grace_period: Duration::ZERO,
        min_reclaim: None,
    };
    let mut c = pod("p", 0, 500 * MI, 0);
    c.containers.push(("quiet".into(), MI, 2 * MI));
    c.containers.push(("big".into(), 300 * MI, 100 * MI));
    let a = annotations(&t, &c);
    assert_eq!(a["offending_containers"], "c,big");
    assert_eq!(a["offending_containers_usage"], "500Mi,300Mi");
    assert_eq!(a["starved_resource"], "memory");
}

#[test]
fn soft_thresholds_wait_out_their_grace_and_memory_goes_first() {
    let text = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
                evictionHard:\n  nodefs.available: 10%\n\
                evictionSoft:\n  memory.available: 1Gi\n\
                evictionSoftGracePeriod:\n  memory.available: 30s\n";
    let kubelet = nodeagent_config::parse(text).unwrap().0;
    let mut m = Manager {
        thresholds: Thresholds::from_config(&kubelet).unwrap(),
        max_pod_grace: 0,
        root_dir: "/".into(),
        pod_logs_dir: "/".into(),
        cgroups: Cgroups::detect(),
        met: BTreeSet::new(),
        first_met: HashMap::new(),
        images_on_nodefs: true,
    };
    let obs = Observations::from([
        (
            Signal::MemoryAvailable,
            Observed {
                available: 512 * MI,
                capacity: 8192 * MI,
            },
        ),
        (
            Signal::NodeFsAvailable,
            Observed {
                available: 5,
                capacity: 100,
            },
        ),
    ]);
    let t0 = Instant::now();
    let due = m.update(&obs, t0);
    assert_eq!(
        due.iter().map(|t| t.signal).collect::<Vec<_>>(),
        [Signal::NodeFsAvailable]
    );
    let due = m.update(&obs, t0 + Duration::from_secs(31));
    assert_eq!(due.len(), 2);
    let refs: Vec<&Threshold> = due.iter().collect();
    assert_eq!(
        first_to_reclaim(&refs).unwrap().signal,
        Signal::MemoryAvailable
    );
    // The soft threshold's clock restarts once it is no longer met.
    let calm = Observations::from([(
        Signal::MemoryAvailable,
        Observed {
            available: 4096 * MI,
            capacity: 8192 * MI,
        },
    )]);
    assert!(m.update(&calm, t0 + Duration::from_secs(32)).is_empty());
    assert!(
        m.update(&obs, t0 + Duration::from_secs(33))
            .iter()
            .all(|t| t.is_hard())
    );
}

#[test]
fn local_storage_limits_are_checked_for_the_pod_then_each_container() {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "uid": "u"},
        "spec": {"containers": [
            {"name": "a", "image": "i", "resources": {"limits": {"ephemeral-storage": "4Mi"}}},
            {"name": "b", "image": "i", "resources": {"limits": {"ephemeral-storage": "10Mi"}}},
            {"name": "c", "image": "i"}
        ]}
    }))
    .unwrap();
    assert!(has_storage_limit(&pod));
    let usage = |a: u64, b: u64, total: u64| Candidate {
        uid: "u".into(),
        priority: 0,
        usage: total,
        request: 0,
        containers: vec![
            ("a".into(), a, 0),
            ("b".into(), b, 0),
            ("c".into(), 50 * MI, 0),
        ],
        critical: false,
    };
    assert_eq!(local_storage_violation(&pod, &usage(MI, MI, 14 * MI)), None);
    assert_eq!(
        local_storage_violation(&pod, &usage(5 * MI, MI, 6 * MI)),
        Some((
            SIGNAL_EPHEMERAL_CONTAINER_FS_LIMIT,
            "Container a exceeded its local ephemeral storage limit \"4Mi\". ".to_string()
        ))
    );
    assert_eq!(
        local_storage_violation(&pod, &usage(MI, MI, 15 * MI)),
        Some((
            SIGNAL_EPHEMERAL_POD_FS_LIMIT,
            "Pod ephemeral local storage usage exceeds the total limit of containers 14Mi. "
                .to_string()
        ))
    );
    let unlimited: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}
    }))
    .unwrap();
    assert!(!has_storage_limit(&unlimited));
    assert_eq!(
        local_storage_violation(&unlimited, &usage(0, 0, 100 * MI)),
        None
    );
}
