use super::*;

fn config(yaml: &str) -> KubeletConfiguration {
    let text =
        format!("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{yaml}");
    crate::parse(&text).expect("config parses").0
}

const MI: u64 = 1 << 20;

#[test]
fn defaults_are_upstreams_and_a_set_evictionhard_replaces_them() {
    let t = Thresholds::from_config(&KubeletConfiguration::default()).unwrap();
    let got: Vec<(&str, String)> =
        t.0.iter()
            .map(|t| (t.signal.name(), t.value.to_string()))
            .collect();
    assert_eq!(
        got,
        [
            ("imagefs.available", "15%".to_string()),
            ("imagefs.inodesFree", "5%".into()),
            ("memory.available", "100Mi".into()),
            ("nodefs.available", "10%".into()),
            ("nodefs.inodesFree", "5%".into()),
        ]
    );
    assert!(t.0.iter().all(Threshold::is_hard));

    // Upstream: a user's evictionHard stands alone, unless mergeDefaultEvictionSettings.
    let only =
        Thresholds::from_config(&config("evictionHard:\n  memory.available: 1Gi\n")).unwrap();
    assert_eq!(only.0.len(), 1);
    assert_eq!(only.0[0].value, Value::Quantity(1 << 30));
    let merged = Thresholds::from_config(&config(
        "mergeDefaultEvictionSettings: true\nevictionHard:\n  memory.available: 1Gi\n",
    ))
    .unwrap();
    assert_eq!(merged.0.len(), 5);
    assert_eq!(
        merged.hard(Signal::MemoryAvailable).unwrap().value,
        Value::Quantity(1 << 30)
    );
    // "0%" and "100%" switch a signal off.
    let off = Thresholds::from_config(&config("evictionHard:\n  nodefs.available: 0%\n")).unwrap();
    assert!(off.0.is_empty());
}

#[test]
fn bad_thresholds_are_refused_with_upstreams_messages() {
    for (yaml, want) in [
        (
            "evictionHard:\n  memory.free: 1Gi\n",
            "unsupported eviction signal memory.free",
        ),
        (
            "evictionHard:\n  nodefs.available: \"-5%\"\n",
            "must be >= 0%",
        ),
        (
            "evictionHard:\n  nodefs.available: 101%\n",
            "must be <= 100%",
        ),
        (
            "evictionHard:\n  memory.available: \"0\"\n",
            "must be positive",
        ),
        (
            "evictionHard:\n  memory.available: lots\n",
            "is not a quantity",
        ),
        (
            "evictionSoft:\n  memory.available: 1Gi\n",
            "grace period must be specified for the soft eviction threshold memory.available",
        ),
        (
            "evictionSoft:\n  memory.available: 1Gi\nevictionSoftGracePeriod:\n  memory.available: soon\n",
            "evictionSoftGracePeriod[memory.available]",
        ),
        (
            "evictionMinimumReclaim:\n  disk: 1Gi\n",
            "unsupported eviction signal disk",
        ),
    ] {
        let c = config(yaml);
        let err = Thresholds::from_config(&c).unwrap_err();
        assert!(err.contains(want), "{yaml}: {err}");
        assert!(c.validate().unwrap_err().contains(want), "{yaml}");
    }
    let reserved = config("kubeReserved:\n  gpu: \"1\"\nsystemReserved:\n  memory: some\n");
    let err = reserved.validate().unwrap_err();
    assert!(
        err.contains("kubeReserved: unsupported resource \"gpu\""),
        "{err}"
    );
    assert!(err.contains("systemReserved[memory]"), "{err}");
}

#[test]
fn soft_thresholds_carry_their_grace_and_min_reclaim() {
    let c = config(
        "evictionSoft:\n  memory.available: 1Gi\nevictionSoftGracePeriod:\n  memory.available: 1m30s\n\
         evictionMinimumReclaim:\n  memory.available: 500Mi\n",
    );
    let t = Thresholds::from_config(&c).unwrap();
    let soft = t.0.iter().find(|t| !t.is_hard()).unwrap();
    assert_eq!(soft.grace_period, Duration::from_secs(90));
    assert_eq!(soft.min_reclaim, Some(Value::Quantity(500 * MI)));
    assert_eq!(
        t.hard(Signal::MemoryAvailable).unwrap().min_reclaim,
        Some(Value::Quantity(500 * MI))
    );
}

fn obs(signal: Signal, available: u64, capacity: u64) -> Observations {
    Observations::from([(
        signal,
        Observed {
            available,
            capacity,
        },
    )])
}

#[test]
fn a_threshold_is_met_when_less_is_available_and_holds_until_its_reclaim_is_free() {
    let t = Threshold {
        signal: Signal::MemoryAvailable,
        value: Value::Quantity(100 * MI),
        grace_period: Duration::ZERO,
        min_reclaim: Some(Value::Quantity(100 * MI)),
    };
    let cap = 1000 * MI;
    assert_eq!(
        met([&t], &obs(Signal::MemoryAvailable, 50 * MI, cap), false).len(),
        1
    );
    assert!(met([&t], &obs(Signal::MemoryAvailable, 100 * MI, cap), false).is_empty());
    assert_eq!(
        met([&t], &obs(Signal::MemoryAvailable, 150 * MI, cap), true).len(),
        1
    );
    assert!(met([&t], &obs(Signal::MemoryAvailable, 250 * MI, cap), true).is_empty());
    // Not observed: not met.
    assert!(met([&t], &obs(Signal::PidAvailable, 0, 10), false).is_empty());
    let pct = Threshold {
        signal: Signal::NodeFsAvailable,
        value: Value::Percentage(0.10),
        grace_period: Duration::ZERO,
        min_reclaim: None,
    };
    assert_eq!(
        met([&pct], &obs(Signal::NodeFsAvailable, 99, 1000), false).len(),
        1
    );
    assert!(met([&pct], &obs(Signal::NodeFsAvailable, 100, 1000), false).is_empty());
}

#[test]
fn a_condition_holds_for_the_transition_period_and_across_a_restart() {
    let c = config(
        "evictionHard:\n  nodefs.available: 10%\n  pid.available: \"100\"\n\
         evictionMinimumReclaim:\n  nodefs.available: 5%\n",
    );
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    let at = |s: u64| t0 + Duration::from_secs(s);
    let period = Duration::from_secs(30);
    let mut p = Pressure::new(
        Thresholds::from_config(&c).unwrap(),
        period,
        PressureState::default(),
    );
    let low = obs(Signal::NodeFsAvailable, 50, 1000);
    let r = p.observe(&low, at(0));
    assert_eq!(r.conditions, BTreeSet::from([Condition::DiskPressure]));
    assert_eq!(r.met.len(), 1);
    assert_eq!(r.met[0].1.available, 50);
    // 120 free: above the threshold but not above it plus the minimum reclaim: still met.
    let r = p.observe(&obs(Signal::NodeFsAvailable, 120, 1000), at(5));
    assert_eq!(r.met.len(), 1, "held by the minimum reclaim");
    // Plenty free: no threshold met, but the condition holds through the period.
    let plenty = obs(Signal::NodeFsAvailable, 900, 1000);
    let r = p.observe(&plenty, at(20));
    assert!(r.met.is_empty());
    assert_eq!(r.conditions, BTreeSet::from([Condition::DiskPressure]));
    // A restart in the period (the state written and read back) keeps it held.
    let saved = serde_json::to_string(&p.state).unwrap();
    let mut again = Pressure::new(
        p.thresholds.clone(),
        period,
        serde_json::from_str(&saved).unwrap(),
    );
    assert_eq!(
        again.observe(&plenty, at(30)).conditions,
        BTreeSet::from([Condition::DiskPressure])
    );
    assert!(again.observe(&plenty, at(36)).conditions.is_empty());
    // PID pressure is its own condition.
    let r = again.observe(&obs(Signal::PidAvailable, 10, 4_000_000), at(40));
    assert_eq!(r.conditions, BTreeSet::from([Condition::PIDPressure]));
}

#[test]
fn allocatable_is_capacity_less_reserved_and_hard_eviction() {
    let c = config(
        "kubeReserved:\n  cpu: 100m\n  memory: 1Gi\nsystemReserved:\n  memory: 500Mi\n  ephemeral-storage: 1Gi\n",
    );
    let t = Thresholds::from_config(&c).unwrap();
    let cap = BTreeMap::from([
        ("cpu".to_string(), 2000),
        ("memory".to_string(), 8 << 30),
        ("ephemeral-storage".to_string(), 100 << 30),
        ("pods".to_string(), 110),
    ]);
    let a = allocatable(&cap, &c, &t);
    assert_eq!(a["cpu"], 1900);
    assert_eq!(a["memory"], (8 << 30) - (1 << 30) - 500 * MI - 100 * MI);
    assert_eq!(
        a["ephemeral-storage"],
        (100u64 << 30) - (1 << 30) - (10u64 << 30)
    );
    assert_eq!(a["pods"], 110);
    // Never below zero.
    let tiny = BTreeMap::from([("memory".to_string(), 50 * MI)]);
    assert_eq!(allocatable(&tiny, &c, &t)["memory"], 0);
}

/// node_container_manager_linux_test.go `TestNodeAllocatableInputValidation`, its rows:
/// kubeReserved, systemReserved and the hard `memory.available` threshold together up to
/// capacity are valid, beyond it not (upstream's table asserts only that its valid rows
/// pass; its one invalid row is checked here as well). A row without a threshold has none
/// for memory (`imagefs.available` only, since an empty evictionHard means the defaults).
#[test]
fn a_reservation_beyond_capacity_is_refused_in_upstreams_words() {
    let cap = |cpu: u64, memory: Option<u64>| {
        let mut c = BTreeMap::from([("cpu".to_string(), cpu)]);
        if let Some(m) = memory {
            c.insert("memory".to_string(), m);
        }
        c
    };
    let gi = 1u64 << 30;
    let rows = [
        // (kubeReserved, systemReserved, memory.available, capacity, valid)
        (
            "{cpu: 100m, memory: 100Mi}",
            "{cpu: 50m, memory: 50Mi}",
            None,
            cap(10_000, Some(10 * gi)),
            true,
        ),
        (
            "{cpu: 100m, memory: 100Mi}",
            "{cpu: 50m, memory: 50Mi}",
            Some("100Mi"),
            cap(10_000, Some(10 * gi)),
            true,
        ),
        (
            "{cpu: 100m, memory: 100Mi}",
            "{cpu: 50m, memory: 50Mi}",
            Some("5%"),
            cap(10_000, Some(10 * gi)),
            true,
        ),
        ("{}", "{}", None, cap(10_000, Some(10 * gi)), true),
        (
            "{memory: 100Mi}",
            "{cpu: 50m, memory: 50Mi}",
            None,
            cap(10_000, Some(10 * gi)),
            true,
        ),
        (
            "{cpu: 50m, memory: 100Mi}",
            "{memory: 50Mi}",
            None,
            cap(10_000, Some(10 * gi)),
            true,
        ),
        (
            "{memory: 100Mi}",
            "{memory: 50Mi}",
            None,
            cap(10_000, None),
            true,
        ),
        (
            "{cpu: \"5\", memory: 10Gi}",
            "{cpu: \"5\", memory: 10Gi}",
            Some("2Gi"),
            cap(10_000, Some(11 * gi)),
            false,
        ),
    ];
    for (kube, system, hard, capacity, valid) in rows {
        let hard = hard.map_or("imagefs.available: 15%".to_string(), |h| {
            format!("memory.available: {h}")
        });
        let c = config(&format!(
            "kubeReserved: {kube}\nsystemReserved: {system}\nevictionHard:\n  {hard}\n"
        ));
        let t = Thresholds::from_config(&c).unwrap();
        let got = validate_reservation(&capacity, &c, &t);
        assert_eq!(got.is_ok(), valid, "{kube} {system} {hard}: {got:?}");
    }
    // The words, one sentence per resource (upstream's are joined by a space).
    let c = config("kubeReserved: {cpu: \"20\", memory: 5Gi}\nsystemReserved: {memory: 5Gi}\n");
    let t = Thresholds::from_config(&c).unwrap();
    assert_eq!(
        validate_reservation(&cap(10_000, Some(10 * gi)), &c, &t).unwrap_err(),
        format!(
            "invalid Node Allocatable configuration. Resource \"cpu\" has a reservation of 20000m but capacity of 10000m. Expected capacity >= reservation. Resource \"memory\" has a reservation of {} but capacity of {}. Expected capacity >= reservation.",
            10 * gi + 100 * MI,
            10 * gi
        )
    );
}

#[test]
fn observes_this_machine() {
    let o = observe(&Cgroups::detect(), Path::new("/"), None);
    for s in [
        Signal::MemoryAvailable,
        Signal::NodeFsAvailable,
        Signal::PidAvailable,
    ] {
        let v = o
            .get(&s)
            .unwrap_or_else(|| panic!("{} not observed: {o:?}", s.name()));
        assert!(
            v.capacity > 0 && v.available <= v.capacity,
            "{}: {v:?}",
            s.name()
        );
    }
    assert!(!o.contains_key(&Signal::ImageFsAvailable));
}

#[test]
fn quantities_print_as_kubernetes_does() {
    assert_eq!(format_quantity(100 * MI), "100Mi");
    assert_eq!(format_quantity(1536 * 1024), "1536Ki");
    assert_eq!(format_quantity(12345), "12345");
    assert_eq!(format_quantity(3 << 30), "3Gi");
}
