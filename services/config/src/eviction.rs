//! Eviction signals and thresholds as upstream's eviction manager names and evaluates them
//! (`pkg/kubelet/eviction/helpers.go`, `eviction_manager.go`): `evictionHard` and
//! `evictionSoft` parsed with upstream's rules and messages, what the node's signals are
//! now ([`observe`]), which thresholds that meets, and the node conditions that follow,
//! held for `evictionPressureTransitionPeriod` ([`Pressure`]).

use crate::KubeletConfiguration;
use crate::cgroupfs::Cgroups;
use crate::machine;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, SystemTime};

/// A signal the node is measured by (upstream's `evictionapi.Signal`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Signal {
    MemoryAvailable,
    NodeFsAvailable,
    NodeFsInodesFree,
    ImageFsAvailable,
    ImageFsInodesFree,
    ContainerFsAvailable,
    ContainerFsInodesFree,
    PidAvailable,
}

impl Signal {
    pub const ALL: [Signal; 8] = [
        Signal::MemoryAvailable,
        Signal::NodeFsAvailable,
        Signal::NodeFsInodesFree,
        Signal::ImageFsAvailable,
        Signal::ImageFsInodesFree,
        Signal::ContainerFsAvailable,
        Signal::ContainerFsInodesFree,
        Signal::PidAvailable,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Signal::MemoryAvailable => "memory.available",
            Signal::NodeFsAvailable => "nodefs.available",
            Signal::NodeFsInodesFree => "nodefs.inodesFree",
            Signal::ImageFsAvailable => "imagefs.available",
            Signal::ImageFsInodesFree => "imagefs.inodesFree",
            Signal::ContainerFsAvailable => "containerfs.available",
            Signal::ContainerFsInodesFree => "containerfs.inodesFree",
            Signal::PidAvailable => "pid.available",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The node condition this signal's pressure raises.
    pub fn condition(self) -> Condition {
        match self {
            Signal::MemoryAvailable => Condition::MemoryPressure,
            Signal::PidAvailable => Condition::PIDPressure,
            _ => Condition::DiskPressure,
        }
    }

    /// The resource named in eviction messages ("The node was low on resource: memory.").
    pub fn resource(self) -> &'static str {
        match self {
            Signal::MemoryAvailable => "memory",
            Signal::PidAvailable => "pids",
            Signal::NodeFsInodesFree
            | Signal::ImageFsInodesFree
            | Signal::ContainerFsInodesFree => "inodes",
            _ => "ephemeral-storage",
        }
    }
}

/// A pressure condition of the Node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Condition {
    MemoryPressure,
    DiskPressure,
    PIDPressure,
}

/// A condition's reason and message, and the node event on its transition, as upstream's
/// node status setters write them.
pub struct ConditionText {
    pub reason: &'static str,
    pub message: &'static str,
    pub event: &'static str,
}

impl Condition {
    pub const ALL: [Condition; 3] = [
        Condition::MemoryPressure,
        Condition::DiskPressure,
        Condition::PIDPressure,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Condition::MemoryPressure => "MemoryPressure",
            Condition::DiskPressure => "DiskPressure",
            Condition::PIDPressure => "PIDPressure",
        }
    }

    /// The texts for the condition being True (`pressure`) or False.
    pub fn text(self, pressure: bool) -> ConditionText {
        let (reason, message, event) = match (self, pressure) {
            (Condition::MemoryPressure, true) => (
                "KubeletHasInsufficientMemory",
                "kubelet has insufficient memory available",
                "NodeHasInsufficientMemory",
            ),
            (Condition::MemoryPressure, false) => (
                "KubeletHasSufficientMemory",
                "kubelet has sufficient memory available",
                "NodeHasSufficientMemory",
            ),
            (Condition::DiskPressure, true) => (
                "KubeletHasDiskPressure",
                "kubelet has disk pressure",
                "NodeHasDiskPressure",
            ),
            (Condition::DiskPressure, false) => (
                "KubeletHasNoDiskPressure",
                "kubelet has no disk pressure",
                "NodeHasNoDiskPressure",
            ),
            (Condition::PIDPressure, true) => (
                "KubeletHasInsufficientPID",
                "kubelet has insufficient PID available",
                "NodeHasInsufficientPID",
            ),
            (Condition::PIDPressure, false) => (
                "KubeletHasSufficientPID",
                "kubelet has sufficient PID available",
                "NodeHasSufficientPID",
            ),
        };
        ConditionText {
            reason,
            message,
            event,
        }
    }
}

/// A threshold's value: an absolute quantity or a share of the signal's capacity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    Quantity(u64),
    /// A fraction in (0, 1).
    Percentage(f64),
}

impl Value {
    /// Upstream's `parseThresholdStatement` value rules. "0%" and "100%" mean no threshold
    /// (None), as upstream.
    fn parse(signal: &str, text: &str) -> Result<Option<Value>, String> {
        let text = text.trim();
        if let Some(pct) = text.strip_suffix('%') {
            if text == "0%" || text == "100%" {
                return Ok(None);
            }
            let p: f64 = pct.parse().map_err(|_| {
                format!("eviction threshold {signal}: {text:?} is not a percentage")
            })?;
            if p < 0.0 {
                return Err(format!(
                    "eviction percentage threshold {signal} must be >= 0%: {text}"
                ));
            }
            if p > 100.0 {
                return Err(format!(
                    "eviction percentage threshold {signal} must be <= 100%: {text}"
                ));
            }
            return Ok(Some(Value::Percentage(p / 100.0)));
        }
        match crate::quantity::bytes(text) {
            Some(q) if q > 0 => Ok(Some(Value::Quantity(q as u64))),
            Some(_) => Err(format!(
                "eviction threshold {signal} must be positive: {text}"
            )),
            None => Err(format!(
                "eviction threshold {signal}: {text:?} is not a quantity or a percentage"
            )),
        }
    }

    /// The value in the signal's unit, for a signal of `capacity`.
    pub fn of(self, capacity: u64) -> u64 {
        match self {
            Value::Quantity(q) => q,
            Value::Percentage(p) => (capacity as f64 * p) as u64,
        }
    }
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::Quantity(q) => f.write_str(&format_quantity(*q)),
            Value::Percentage(p) => write!(f, "{}%", p * 100.0),
        }
    }
}

/// A byte count in the largest binary unit that divides it, as Kubernetes prints
/// quantities (`100Mi`, `1536Ki`, `12345`).
pub fn format_quantity(n: u64) -> String {
    for (suffix, unit) in [
        ("Ti", 1u64 << 40),
        ("Gi", 1 << 30),
        ("Mi", 1 << 20),
        ("Ki", 1 << 10),
    ] {
        if n >= unit && n.is_multiple_of(unit) {
            return format!("{}{suffix}", n / unit);
        }
    }
    n.to_string()
}

/// One threshold: the signal is under pressure when less than `value` is available.
#[derive(Debug, Clone, PartialEq)]
pub struct Threshold {
    pub signal: Signal,
    pub value: Value,
    /// Zero for a hard threshold; how long a soft one must hold before pods are evicted.
    pub grace_period: Duration,
    /// Once met, the threshold holds until this much more than `value` is available.
    pub min_reclaim: Option<Value>,
}

impl Threshold {
    pub fn is_hard(&self) -> bool {
        self.grace_period.is_zero()
    }
}

/// upstream's v1beta1 `DefaultEvictionHard` on Linux.
pub const DEFAULT_EVICTION_HARD: [(&str, &str); 5] = [
    ("memory.available", "100Mi"),
    ("nodefs.available", "10%"),
    ("nodefs.inodesFree", "5%"),
    ("imagefs.available", "15%"),
    ("imagefs.inodesFree", "5%"),
];

/// The thresholds a `KubeletConfiguration` sets.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Thresholds(pub Vec<Threshold>);

impl Thresholds {
    /// upstream's `ParseThresholdConfig`: every hard and soft threshold, each soft one with
    /// its grace period, each with its minimum reclaim.
    pub fn from_config(c: &KubeletConfiguration) -> Result<Self, String> {
        let mut hard: BTreeMap<String, String> = match &c.eviction_hard {
            None => BTreeMap::new(),
            Some(h) => h.clone(),
        };
        if c.eviction_hard.is_none() || c.merge_default_eviction_settings {
            for (k, v) in DEFAULT_EVICTION_HARD {
                hard.entry(k.to_string()).or_insert_with(|| v.to_string());
            }
        }
        let signal = |name: &str| {
            Signal::from_name(name).ok_or_else(|| format!("unsupported eviction signal {name}"))
        };
        let mut min_reclaim = BTreeMap::new();
        for (name, text) in &c.eviction_minimum_reclaim {
            let s = signal(name)?;
            if let Some(v) = Value::parse(name, text)? {
                min_reclaim.insert(s, v);
            }
        }
        let mut out = Vec::new();
        for (name, text) in &hard {
            let s = signal(name)?;
            if let Some(value) = Value::parse(name, text)? {
                out.push(Threshold {
                    signal: s,
                    value,
                    grace_period: Duration::ZERO,
                    min_reclaim: min_reclaim.get(&s).copied(),
                });
            }
        }
        for (name, text) in &c.eviction_soft {
            let s = signal(name)?;
            let grace = c.eviction_soft_grace_period.get(name).ok_or_else(|| {
                format!("grace period must be specified for the soft eviction threshold {name}")
            })?;
            let grace = crate::duration::parse_go_duration(grace)
                .map_err(|e| format!("evictionSoftGracePeriod[{name}]: {e}"))?;
            if grace.is_zero() {
                return Err(format!(
                    "evictionSoftGracePeriod[{name}] must be greater than zero"
                ));
            }
            if let Some(value) = Value::parse(name, text)? {
                out.push(Threshold {
                    signal: s,
                    value,
                    grace_period: grace,
                    min_reclaim: min_reclaim.get(&s).copied(),
                });
            }
        }
        for name in c.eviction_soft_grace_period.keys() {
            if !c.eviction_soft.contains_key(name) {
                signal(name)?;
            }
        }
        Ok(Self(out))
    }

    /// The hard threshold of `signal`, if one is set.
    pub fn hard(&self, signal: Signal) -> Option<&Threshold> {
        self.0.iter().find(|t| t.signal == signal && t.is_hard())
    }
}

/// What a signal measures now.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Observed {
    pub available: u64,
    pub capacity: u64,
}

pub type Observations = BTreeMap<Signal, Observed>;

/// The node's signals now, as upstream's `makeSignalObservations` derives them from the
/// summary: memory from the root cgroup's working set (cAdvisor's), nodefs from the
/// filesystem of `root_dir`, imagefs (and containerfs, which shares it) from the filesystem
/// of the runtime's image store, pids from `min(pid_max, threads-max)` less the tasks now.
pub fn observe(cgroups: &Cgroups, root_dir: &Path, image_fs: Option<&Path>) -> Observations {
    let mut out = Observations::new();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    if let Some((memory, total)) = machine::node_memory(cgroups, &meminfo) {
        out.insert(
            Signal::MemoryAvailable,
            Observed {
                available: total.saturating_sub(memory.working_set),
                capacity: total,
            },
        );
    }
    let mut fs = |path: &Path, bytes: Signal, inodes: Signal| {
        if let Some(v) = machine::statvfs(path) {
            out.insert(
                bytes,
                Observed {
                    available: v.available,
                    capacity: v.capacity,
                },
            );
            if v.inodes > 0 {
                out.insert(
                    inodes,
                    Observed {
                        available: v.inodes_free,
                        capacity: v.inodes,
                    },
                );
            }
        }
    };
    fs(root_dir, Signal::NodeFsAvailable, Signal::NodeFsInodesFree);
    if let Some(image_fs) = image_fs {
        fs(
            image_fs,
            Signal::ImageFsAvailable,
            Signal::ImageFsInodesFree,
        );
        fs(
            image_fs,
            Signal::ContainerFsAvailable,
            Signal::ContainerFsInodesFree,
        );
    }
    if let (Some(max), Some(now)) = machine::rlimit() {
        out.insert(
            Signal::PidAvailable,
            Observed {
                available: (max - now).max(0) as u64,
                capacity: max.max(0) as u64,
            },
        );
    }
    out
}

/// The thresholds among `thresholds` that `observations` meet: less is available than the
/// threshold (plus its minimum reclaim with `with_min_reclaim`), as upstream's
/// `thresholdsMet`. A signal not observed meets nothing.
pub fn met<'a>(
    thresholds: impl IntoIterator<Item = &'a Threshold>,
    observations: &Observations,
    with_min_reclaim: bool,
) -> Vec<&'a Threshold> {
    thresholds
        .into_iter()
        .filter(|t| {
            let Some(o) = observations.get(&t.signal) else {
                return false;
            };
            let mut quantity = t.value.of(o.capacity);
            if with_min_reclaim && let Some(r) = t.min_reclaim {
                quantity = quantity.saturating_add(r.of(o.capacity));
            }
            quantity > o.available
        })
        .collect()
}

/// The node's pressure over time: the thresholds met at the last observation (held until
/// their minimum reclaim is free) and when each condition was last observed. Serializable so
/// that a restart keeps a condition held through its transition period.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PressureState {
    /// Condition → when it was last observed, in seconds since the epoch.
    pub last_observed: BTreeMap<Condition, u64>,
    /// `signal name` → when its threshold was first met, in seconds since the epoch (the
    /// soft thresholds' grace periods count from here).
    #[serde(default)]
    pub first_met: BTreeMap<String, u64>,
    /// The signals whose thresholds were met at the last observation.
    #[serde(default)]
    pub met: BTreeSet<String>,
}

/// One observation's outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// The conditions that are True now (met now, or within the transition period).
    pub conditions: BTreeSet<Condition>,
    /// The thresholds met now, with what was observed, for logs and messages.
    pub met: Vec<(Threshold, Observed)>,
}

/// Evaluates observations against thresholds, as the eviction manager's `synchronize`.
#[derive(Debug, Clone)]
pub struct Pressure {
    pub thresholds: Thresholds,
    pub transition_period: Duration,
    pub state: PressureState,
}

fn secs(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Pressure {
    pub fn new(thresholds: Thresholds, transition_period: Duration, state: PressureState) -> Self {
        Self {
            thresholds,
            transition_period,
            state,
        }
    }

    pub fn observe(&mut self, observations: &Observations, now: SystemTime) -> Report {
        let now_s = secs(now);
        let all = &self.thresholds.0;
        let mut met: Vec<&Threshold> = met(all, observations, false);
        // A threshold met before holds until its minimum reclaim is free again.
        let before = all
            .iter()
            .filter(|t| self.state.met.contains(t.signal.name()));
        for t in self::met(before, observations, true) {
            if !met.contains(&t) {
                met.push(t);
            }
        }
        let names: BTreeSet<String> = met.iter().map(|t| t.signal.name().to_string()).collect();
        self.state.first_met.retain(|k, _| names.contains(k));
        for n in &names {
            self.state.first_met.entry(n.clone()).or_insert(now_s);
        }
        for t in &met {
            self.state.last_observed.insert(t.signal.condition(), now_s);
        }
        let hold = self.transition_period.as_secs();
        self.state
            .last_observed
            .retain(|_, at| now_s.saturating_sub(*at) < hold.max(1) || *at > now_s);
        let conditions = self.state.last_observed.keys().copied().collect();
        self.state.met = names;
        Report {
            conditions,
            met: met
                .into_iter()
                .filter_map(|t| Some((t.clone(), *observations.get(&t.signal)?)))
                .collect(),
        }
    }
}

/// What upstream's container manager reserves of each resource the node has
/// (`GetNodeAllocatableReservation`): kubeReserved, systemReserved and, for memory and
/// ephemeral-storage, the hard eviction threshold. `capacity` is in whole units (cpu in
/// millicores); a resource reserved nothing of is left out, as upstream's.
pub fn reservation(
    capacity: &BTreeMap<String, u64>,
    c: &KubeletConfiguration,
    thresholds: &Thresholds,
) -> BTreeMap<String, u64> {
    let reserved = |resource: &str| -> u64 {
        [&c.kube_reserved, &c.system_reserved]
            .iter()
            .filter_map(|m| m.get(resource))
            .filter_map(|q| {
                if resource == "cpu" {
                    crate::quantity::cpu_millis(q).map(|m| m.max(0) as u64)
                } else {
                    crate::quantity::bytes(q).map(|b| b.max(0) as u64)
                }
            })
            .sum()
    };
    capacity
        .iter()
        .filter_map(|(resource, cap)| {
            let eviction = match resource.as_str() {
                "memory" => thresholds.hard(Signal::MemoryAvailable),
                "ephemeral-storage" => thresholds.hard(Signal::NodeFsAvailable),
                _ => None,
            }
            .map(|t| t.value.of(*cap))
            .unwrap_or(0);
            let less = reserved(resource).saturating_add(eviction);
            (less > 0).then(|| (resource.clone(), less))
        })
        .collect()
}

/// Allocatable as upstream's container manager computes it: capacity less the
/// [`reservation`], never below zero.
pub fn allocatable(
    capacity: &BTreeMap<String, u64>,
    c: &KubeletConfiguration,
    thresholds: &Thresholds,
) -> BTreeMap<String, u64> {
    let reserved = reservation(capacity, c, thresholds);
    capacity
        .iter()
        .map(|(resource, cap)| {
            let less = reserved.get(resource).copied().unwrap_or(0);
            (resource.clone(), cap.saturating_sub(less))
        })
        .collect()
}

/// Upstream's `validateNodeAllocatable`: a node that reserves more of a resource than it
/// has does not start ("Failed to start ContainerManager"), in upstream's words. (Upstream
/// prints its quantities as Go structs, `{{2609905664 0} {<nil>}  BinarySI}`; here they are
/// the numbers inside: bytes, millicores with `m`, tasks.)
pub fn validate_reservation(
    capacity: &BTreeMap<String, u64>,
    c: &KubeletConfiguration,
    thresholds: &Thresholds,
) -> Result<(), String> {
    let show = |resource: &str, n: u64| match resource {
        "cpu" => format!("{n}m"),
        _ => n.to_string(),
    };
    let errors: Vec<String> = reservation(capacity, c, thresholds)
        .into_iter()
        .filter_map(|(resource, reserved)| {
            let cap = capacity.get(&resource).copied().unwrap_or(0);
            (reserved > cap).then(|| {
                format!(
                    "Resource {resource:?} has a reservation of {} but capacity of {}. Expected capacity >= reservation.",
                    show(&resource, reserved),
                    show(&resource, cap)
                )
            })
        })
        .collect();
    match errors.is_empty() {
        true => Ok(()),
        false => Err(format!(
            "invalid Node Allocatable configuration. {}",
            errors.join(" ")
        )),
    }
}

#[cfg(test)]
mod tests;
