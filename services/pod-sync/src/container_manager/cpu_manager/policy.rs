//! The static policy of upstream's CPU manager (`pkg/kubelet/cm/cpumanager/policy_static.go`)
//! as pure functions over the assignments: which containers get CPUs of their own, which
//! CPUs they get, and what is left to everyone else (the shared, "default" set).

use k8s_openapi::api::core::v1::{Container, Pod};
use nodeagent_config::cpuset::CpuSet;
use std::collections::BTreeMap;

/// Where each logical CPU sits (socket, core), as `/sys/devices/system/cpu` tells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// (cpu, socket, core), sorted by cpu.
    cpus: Vec<(u32, u32, u32)>,
}

impl Topology {
    pub fn new(mut cpus: Vec<(u32, u32, u32)>) -> Self {
        cpus.sort();
        Self { cpus }
    }

    /// The online CPUs of this machine and their sockets and cores.
    pub fn detect() -> Result<Self, String> {
        let base = std::path::Path::new("/sys/devices/system/cpu");
        let online = std::fs::read_to_string(base.join("online"))
            .map_err(|e| format!("reading {}/online: {e}", base.display()))?;
        let online = CpuSet::parse(online.trim())?;
        let read = |cpu: u32, what: &str| -> u32 {
            std::fs::read_to_string(base.join(format!("cpu{cpu}/topology/{what}")))
                .ok()
                .and_then(|s| s.trim().parse::<i64>().ok())
                // A CPU the kernel gives no topology for is its own core on socket 0.
                .map_or(if what == "core_id" { cpu } else { 0 }, |v| v.max(0) as u32)
        };
        Ok(Self::new(
            online
                .iter()
                .map(|cpu| (cpu, read(cpu, "physical_package_id"), read(cpu, "core_id")))
                .collect(),
        ))
    }

    pub fn all(&self) -> CpuSet {
        self.cpus.iter().map(|(cpu, _, _)| *cpu).collect()
    }

    /// upstream's `CPUsPerCore`: the logical CPUs over the physical cores (the SMT level).
    pub fn cpus_per_core(&self) -> usize {
        let cores: std::collections::BTreeSet<(u32, u32)> =
            self.cpus.iter().map(|c| (c.1, c.2)).collect();
        if cores.is_empty() {
            return 0;
        }
        self.cpus.len() / cores.len()
    }

    /// The CPUs of every core that holds one of `set` (the set with its core siblings).
    pub fn with_siblings(&self, set: &CpuSet) -> CpuSet {
        let cores: Vec<(u32, u32)> = set.iter().filter_map(|cpu| self.core_of(cpu)).collect();
        self.cpus_where(|c| cores.contains(&(c.1, c.2)))
    }

    fn socket_of(&self, cpu: u32) -> Option<u32> {
        self.cpus.iter().find(|c| c.0 == cpu).map(|c| c.1)
    }

    fn core_of(&self, cpu: u32) -> Option<(u32, u32)> {
        self.cpus.iter().find(|c| c.0 == cpu).map(|c| (c.1, c.2))
    }

    fn cpus_where(&self, f: impl Fn(&(u32, u32, u32)) -> bool) -> CpuSet {
        self.cpus.iter().filter(|c| f(c)).map(|c| c.0).collect()
    }

    /// upstream's `takeByTopology` (the packed accumulator): whole free sockets first when
    /// the request covers one, then whole free cores, then single CPUs, preferring the
    /// cores and sockets already partly taken so that whole ones stay free; lowest ids
    /// first among equals. `None`: not enough CPUs.
    pub fn take(&self, available: &CpuSet, n: usize) -> Option<CpuSet> {
        if n > available.size() {
            return None;
        }
        let mut taken = CpuSet::new();
        let mut free = available.clone();
        let left = |taken: &CpuSet| n - taken.size();
        // Whole sockets.
        let mut sockets: Vec<u32> = free.iter().filter_map(|c| self.socket_of(c)).collect();
        sockets.sort();
        sockets.dedup();
        for socket in &sockets {
            let cpus = self.cpus_where(|c| c.1 == *socket);
            if cpus.is_subset_of(&free) && cpus.size() <= left(&taken) {
                taken = taken.union(&cpus);
                free = free.difference(&cpus);
            }
        }
        // Whole cores.
        let mut cores: Vec<(u32, u32)> = free.iter().filter_map(|c| self.core_of(c)).collect();
        cores.sort();
        cores.dedup();
        for (socket, core) in &cores {
            let cpus = self.cpus_where(|c| c.1 == *socket && c.2 == *core);
            if cpus.size() > 1 && cpus.is_subset_of(&free) && cpus.size() <= left(&taken) {
                taken = taken.union(&cpus);
                free = free.difference(&cpus);
            }
        }
        // Single CPUs: from the fullest cores first (their siblings are already taken),
        // then the lowest id.
        let mut singles: Vec<(usize, u32)> = free
            .iter()
            .map(|cpu| {
                let (socket, core) = self.core_of(cpu).unwrap_or((0, cpu));
                let free_in_core = self
                    .cpus_where(|c| c.1 == socket && c.2 == core)
                    .intersection(&free)
                    .size();
                (free_in_core, cpu)
            })
            .collect();
        singles.sort();
        for (_, cpu) in singles.into_iter().take(left(&taken)) {
            taken = taken.union(&std::iter::once(cpu).collect());
        }
        (taken.size() == n).then_some(taken)
    }
}

/// The state the policy works on (upstream's `state.State`): the shared set and each
/// container's exclusive CPUs, by pod UID and container name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Assignments {
    pub default: CpuSet,
    pub entries: BTreeMap<String, BTreeMap<String, CpuSet>>,
}

impl Assignments {
    pub(super) fn assigned(&self) -> CpuSet {
        self.entries
            .values()
            .flat_map(|containers| containers.values())
            .fold(CpuSet::new(), |all, set| all.union(set))
    }
}

/// The static policy's options (upstream's `StaticPolicyOptions`), of those this node
/// implements.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Options {
    /// `full-pcpus-only`: a container gets whole physical cores or is refused.
    pub full_pcpus_only: bool,
    /// `strict-cpu-reservation`: the reserved CPUs are not in the shared pool either, so
    /// that no BestEffort or Burstable container runs on them.
    pub strict_cpu_reservation: bool,
}

impl Options {
    pub fn of(kubelet: &nodeagent_config::KubeletConfiguration) -> Self {
        Self {
            full_pcpus_only: kubelet.cpu_manager_full_pcpus_only(),
            strict_cpu_reservation: kubelet.cpu_manager_strict_cpu_reservation(),
        }
    }
}

/// Why a pod's CPUs cannot be had, as upstream's admission tells them apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllocError {
    /// A plain error: upstream's `UnexpectedAdmissionError`, "Allocate failed due to
    /// ..., which is unexpected".
    Unexpected(String),
    /// upstream's `SMTAlignmentError`: its own reason, its message as it is.
    SmtAlignment(String),
}

impl std::fmt::Display for AllocError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unexpected(m) | Self::SmtAlignment(m) => f.write_str(m),
        }
    }
}

impl PartialEq<&str> for AllocError {
    fn eq(&self, other: &&str) -> bool {
        match self {
            Self::Unexpected(m) | Self::SmtAlignment(m) => m == other,
        }
    }
}

/// The static policy: the CPUs kept for the system and the machine's topology.
#[derive(Debug, Clone)]
pub struct StaticPolicy {
    pub topology: Topology,
    pub reserved: CpuSet,
    pub options: Options,
}

impl StaticPolicy {
    /// upstream's `NewManager` and `NewStaticPolicy`: `reservedSystemCPUs` when set, else
    /// the ceiling of the reserved CPU (kubeReserved + systemReserved) taken from the
    /// lowest cores.
    pub fn new(
        topology: Topology,
        reserved_system_cpus: &CpuSet,
        reserved_cpu_millis: i64,
    ) -> Result<Self, String> {
        let all = topology.all();
        let wanted = if reserved_system_cpus.is_empty() {
            if reserved_cpu_millis <= 0 {
                return Err("[cpumanager] the static policy requires systemreserved.cpu + kubereserved.cpu to be greater than zero".into());
            }
            ((reserved_cpu_millis + 999) / 1000) as usize
        } else {
            reserved_system_cpus.size()
        };
        let reserved = if reserved_system_cpus.is_empty() {
            topology.take(&all, wanted).unwrap_or_default()
        } else {
            reserved_system_cpus.clone()
        };
        if reserved.size() != wanted || !reserved.is_subset_of(&all) {
            return Err(format!(
                "[cpumanager] unable to reserve the required amount of CPUs (size of {reserved} did not equal {wanted})"
            ));
        }
        Ok(Self {
            topology,
            reserved,
            options: Options::default(),
        })
    }

    pub fn with_options(mut self, options: Options) -> Self {
        self.options = options;
        self
    }

    /// upstream's `enforceSMTAlignment` under `full-pcpus-only`: a request of whole cores
    /// only, and no more than the free CPUs of cores that hold no reserved CPU
    /// (`GetAvailablePhysicalCPUs`), so that no container is given a lone thread.
    fn enforce_smt_alignment(&self, s: &Assignments, n: usize) -> Result<(), AllocError> {
        if !self.options.full_pcpus_only {
            return Ok(());
        }
        let per_core = self.topology.cpus_per_core().max(1);
        if !n.is_multiple_of(per_core) {
            return Err(AllocError::SmtAlignment(format!(
                "SMT Alignment Error: requested {n} cpus not multiple cpus per core = {per_core}"
            )));
        }
        let physical = s
            .default
            .difference(&self.topology.with_siblings(&self.reserved))
            .size();
        if n > physical {
            return Err(AllocError::SmtAlignment(format!(
                "SMT Alignment Error: not enough free physical CPUs: available physical CPUs = {physical}, requested CPUs = {n}, CPUs per core = {per_core}"
            )));
        }
        Ok(())
    }

    /// upstream's `validateState`: a new state gets every CPU as the shared set; a restored
    /// one must keep the reserved CPUs shared, no exclusive CPU shared, and cover exactly
    /// this machine's CPUs.
    pub fn start(&self, s: &mut Assignments) -> Result<(), String> {
        let all = self.pooled();
        if s.default.is_empty() {
            if !s.entries.is_empty() {
                return Err("default cpuset cannot be empty".into());
            }
            s.default = all;
            return Ok(());
        }
        let reserved_shared = self.reserved.intersection(&s.default);
        if self.options.strict_cpu_reservation {
            if !reserved_shared.is_empty() {
                return Err(format!(
                    "some of strictly reserved cpus: \"{reserved_shared}\" are present in defaultCpuSet: \"{}\"",
                    s.default
                ));
            }
        } else if reserved_shared != self.reserved {
            return Err(format!(
                "not all reserved cpus: \"{}\" are present in defaultCpuSet: \"{}\"",
                self.reserved, s.default
            ));
        }
        for (pod, containers) in &s.entries {
            for (container, set) in containers {
                if !s.default.intersection(set).is_empty() {
                    return Err(format!(
                        "pod: {pod}, container: {container} cpuset: \"{set}\" overlaps with default cpuset \"{}\"",
                        s.default
                    ));
                }
            }
        }
        let known = s.default.union(&s.assigned());
        if known != all {
            return Err(format!(
                "current set of available CPUs \"{all}\" doesn't match with CPUs in state \"{known}\""
            ));
        }
        Ok(())
    }

    /// The CPUs the shared pool and the exclusive assignments divide between them: every
    /// CPU, or under `strict-cpu-reservation` every CPU but the reserved ones (upstream's
    /// `validateState` `allCPUs`).
    fn pooled(&self) -> CpuSet {
        match self.options.strict_cpu_reservation {
            true => self.topology.all().difference(&self.reserved),
            false => self.topology.all(),
        }
    }

    /// upstream's `GetAvailableCPUs`: the shared CPUs that may still be given away.
    pub fn available(&self, s: &Assignments) -> CpuSet {
        s.default.difference(&self.reserved)
    }

    /// upstream's `Allocate` for every container of a pod, init containers first, as its
    /// admission does: exclusive CPUs for each container that asks for whole CPUs in a
    /// Guaranteed pod; an init container's CPUs go again to the containers after it. On
    /// an error nothing of the pod stays assigned (upstream leaves the containers before
    /// the failing one assigned until its reconcile loop finds the pod inactive).
    pub fn allocate_pod(&self, s: &mut Assignments, pod: &Pod) -> Result<(), AllocError> {
        let before = s.clone();
        let result = self.allocate_containers(s, pod);
        if result.is_err() {
            *s = before;
        }
        result
    }

    fn allocate_containers(&self, s: &mut Assignments, pod: &Pod) -> Result<(), AllocError> {
        let uid = nodeagent_proto::k8s::pod_uid(pod).to_string();
        let Some(spec) = &pod.spec else {
            return Ok(());
        };
        // upstream's cpusToReuse: the CPUs of the pod's init containers that ran to
        // completion before the next container starts.
        let mut reusable = CpuSet::new();
        let init = spec.init_containers.iter().flatten().map(|c| (c, true));
        for (c, is_init) in init.chain(spec.containers.iter().map(|c| (c, false))) {
            let sidecar = is_init && c.restart_policy.as_deref() == Some("Always");
            let n = guaranteed_cpus(pod, c);
            if n == 0 {
                continue;
            }
            self.enforce_smt_alignment(s, n)?;
            let set = match s.entries.get(&uid).and_then(|e| e.get(&c.name)) {
                Some(set) => set.clone(),
                None => {
                    let from = self.available(s).union(&reusable);
                    let set = self.topology.take(&from, n).ok_or_else(|| {
                        AllocError::Unexpected(format!(
                            "not enough cpus available to satisfy request: requested={n}, available={}",
                            from.size()
                        ))
                    })?;
                    s.entries
                        .entry(uid.clone())
                        .or_default()
                        .insert(c.name.clone(), set.clone());
                    s.default = s.default.difference(&set);
                    set
                }
            };
            // upstream's updateCPUsToReuse: an init container's CPUs may serve the next
            // containers; a sidecar's or an app container's are theirs for the pod's life.
            if is_init && !sidecar {
                reusable = reusable.union(&set);
            } else {
                reusable = reusable.difference(&set);
            }
        }
        Ok(())
    }

    /// upstream's `RemoveContainer` for every container of the pod: their CPUs go back to
    /// the shared set.
    pub fn remove_pod(&self, s: &mut Assignments, uid: &str) {
        let names: Vec<String> = s
            .entries
            .get(uid)
            .into_iter()
            .flatten()
            .map(|(n, _)| n.clone())
            .collect();
        for name in names {
            self.remove_container(s, uid, &name);
        }
    }

    /// upstream's `RemoveContainer`: the container's CPUs go back to the shared set, but
    /// for those a sibling of the same pod still holds (an init container's, reused).
    pub fn remove_container(&self, s: &mut Assignments, uid: &str, name: &str) {
        let Some(containers) = s.entries.get_mut(uid) else {
            return;
        };
        let Some(freed) = containers.remove(name) else {
            return;
        };
        let siblings = containers
            .values()
            .fold(CpuSet::new(), |all, set| all.union(set));
        if containers.is_empty() {
            s.entries.remove(uid);
        }
        s.default = s.default.union(&freed.difference(&siblings));
    }

    /// upstream's `GetCPUSetOrDefault`: a container's own CPUs, else the shared set.
    pub fn cpus_of(&self, s: &Assignments, uid: &str, container: &str) -> CpuSet {
        s.entries
            .get(uid)
            .and_then(|e| e.get(container))
            .cloned()
            .unwrap_or_else(|| s.default.clone())
    }
}

/// upstream's `guaranteedCPUs`: whole CPUs requested by a container of a Guaranteed pod,
/// else 0 (the container runs on the shared set). A pod with pod-level resources gets no
/// exclusive CPUs: upstream's static policy skips it ("pod is using pod-level resources
/// which are not supported by the static CPU manager policy") unless the alpha
/// PodLevelResourceManagers gate is on.
pub fn guaranteed_cpus(pod: &Pod, c: &Container) -> usize {
    use crate::container_manager::cgroups::{QosClass, qos_class};
    if qos_class(pod) != QosClass::Guaranteed || nodeagent_config::pod_level::set(pod).is_some() {
        return 0;
    }
    match crate::container_manager::quantity::ContainerResources::of(c).cpu_request {
        Some(m) if m > 0 && m % 1000 == 0 => (m / 1000) as usize,
        _ => 0,
    }
}
