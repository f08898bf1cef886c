//! The CPU manager (upstream's `pkg/kubelet/cm/cpumanager`): with the `static` policy, the
//! containers of Guaranteed pods that request whole CPUs get CPUs of their own at the
//! pod's admission, every other container runs on what is left (the shared set, which
//! keeps the reserved CPUs), and a reconcile loop keeps each running container's cpuset
//! what the state says as the shared set shrinks and grows. The state is upstream's file,
//! `<root-dir>/cpu_manager_state` (its format and checksum), written at every change and
//! read at start, so that a restart of pod-sync changes no assignment.

pub mod checkpoint;
pub mod policy;
pub mod reconcile;
#[cfg(test)]
mod tests;

use checkpoint::Checkpoint;
use k8s_openapi::api::core::v1::Pod;
use nodeagent_config::cpuset::CpuSet;
use policy::{Assignments, StaticPolicy, Topology};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// upstream's file name, in the root directory.
pub const STATE_FILE: &str = "cpu_manager_state";

pub struct CpuManager {
    /// `None`: the `none` policy (containers get no cpuset).
    policy: Option<StaticPolicy>,
    state: Mutex<Assignments>,
    path: PathBuf,
    /// container id -> the cpuset it was last given (at creation or by the reconcile
    /// loop); after a restart every running container is given its cpuset once more.
    applied: Mutex<HashMap<String, String>>,
}

impl CpuManager {
    /// upstream's `NewManager` and `Start`: the policy from the configuration, the state
    /// from its file (a file of another policy, or one that does not fit this machine, is
    /// an error: upstream asks to drain the node and remove the file).
    pub fn start(
        kubelet: &nodeagent_config::KubeletConfiguration,
        root_dir: &Path,
    ) -> Result<Self, String> {
        let topology = Topology::detect()?;
        Self::start_with(kubelet, root_dir, topology)
    }

    pub fn start_with(
        kubelet: &nodeagent_config::KubeletConfiguration,
        root_dir: &Path,
        topology: Topology,
    ) -> Result<Self, String> {
        let path = root_dir.join(STATE_FILE);
        let policy = match kubelet.cpu_manager_policy.as_str() {
            "static" => Some(
                StaticPolicy::new(
                    topology,
                    &CpuSet::parse(&kubelet.reserved_system_cpus)?,
                    kubelet.reserved_cpu_millis(),
                )?
                .with_options(policy::Options::of(kubelet)),
            ),
            _ => None,
        };
        let name = if policy.is_some() { "static" } else { "none" };
        let restore = || -> Result<Assignments, String> {
            let mut state = match std::fs::read(&path) {
                Ok(bytes) => Checkpoint::decode(&bytes)?.into_assignments(name)?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Assignments::default(),
                Err(e) => return Err(e.to_string()),
            };
            if let Some(policy) = &policy {
                policy.start(&mut state)?;
            }
            Ok(state)
        };
        let state = restore().map_err(|e| {
            format!(
                "could not restore state from checkpoint: {e}, please drain this node and delete the CPU manager checkpoint file {:?} before restarting Kubelet",
                path.display().to_string()
            )
        })?;
        let manager = Self {
            policy,
            state: Mutex::new(state),
            path,
            applied: Mutex::default(),
        };
        manager.save(&manager.lock())?;
        if let Some(policy) = &manager.policy {
            tracing::info!(
                reserved = %policy.reserved,
                shared = %manager.lock().default,
                "CPU manager: static policy"
            );
        }
        Ok(manager)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Assignments> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn is_static(&self) -> bool {
        self.policy.is_some()
    }

    fn policy_name(&self) -> &'static str {
        if self.policy.is_some() {
            "static"
        } else {
            "none"
        }
    }

    fn save(&self, state: &Assignments) -> Result<(), String> {
        let bytes = Checkpoint::of(self.policy_name(), state).encode();
        nodeagent_config::state::write_atomically(&self.path, &bytes)
            .map_err(|e| format!("writing {}: {e}", self.path.display()))
    }

    /// The pod's admission (upstream's `Allocate` of every container): `Err` with
    /// upstream's words when its exclusive CPUs cannot be had.
    pub fn admit(&self, pod: &Pod) -> Result<(), policy::AllocError> {
        let Some(policy) = &self.policy else {
            return Ok(());
        };
        let mut state = self.lock();
        let before = state.clone();
        policy.allocate_pod(&mut state, pod)?;
        if *state != before
            && let Err(e) = self.save(&state)
        {
            // Unsaved, an assignment could be given again after a restart.
            *state = before;
            return Err(policy::AllocError::Unexpected(e));
        }
        Ok(())
    }

    /// The cpuset a container of the pod runs on (upstream's `GetCPUAffinity`): `None`
    /// under the `none` policy.
    pub fn cpuset(&self, uid: &str, container: &str) -> Option<String> {
        let policy = self.policy.as_ref()?;
        Some(policy.cpus_of(&self.lock(), uid, container).to_string())
    }

    /// upstream's `GetExclusiveCPUs`: the container's CPUs of its own (none under the
    /// `none` policy or on the shared pool), for the pod-resources API.
    pub fn exclusive_cpus(&self, uid: &str, container: &str) -> Vec<i64> {
        let state = self.lock();
        let set = state.entries.get(uid).and_then(|e| e.get(container));
        set.into_iter()
            .flat_map(|s| s.iter())
            .map(i64::from)
            .collect()
    }

    /// upstream's `GetAllocatableCPUs`: every CPU but the reserved ones under `static`,
    /// none under `none`.
    pub fn allocatable_cpus(&self) -> Vec<i64> {
        let Some(policy) = &self.policy else {
            return Vec::new();
        };
        let all = policy.topology.all().difference(&policy.reserved);
        all.iter().map(i64::from).collect()
    }

    /// A container was created with `cpuset`.
    pub fn applied(&self, container_id: &str, cpuset: &str) {
        let mut applied = self.applied.lock().unwrap_or_else(|e| e.into_inner());
        applied.insert(container_id.to_string(), cpuset.to_string());
    }

    /// upstream's `removeStaleState`: the CPUs of pods that are no longer active go back
    /// to the shared set. Returns the pods released.
    pub fn release_inactive(&self, active: &BTreeSet<String>) -> Vec<String> {
        let Some(policy) = &self.policy else {
            return Vec::new();
        };
        let mut state = self.lock();
        let stale: Vec<String> = state
            .entries
            .keys()
            .filter(|uid| !active.contains(*uid))
            .cloned()
            .collect();
        if stale.is_empty() {
            return stale;
        }
        for uid in &stale {
            policy.remove_pod(&mut state, uid);
        }
        if let Err(e) = self.save(&state) {
            tracing::warn!(error = %e, "CPU manager state not saved");
        }
        stale
    }

    /// upstream's `reconcileState`: the running containers (id, pod uid, name) whose
    /// cpuset differs from what they were last given, with the cpuset they must have.
    pub fn out_of_date(&self, running: &[(String, String, String)]) -> Vec<(String, String)> {
        let Some(policy) = &self.policy else {
            return Vec::new();
        };
        let state = self.lock();
        let mut applied = self.applied.lock().unwrap_or_else(|e| e.into_inner());
        let ids: HashSet<&str> = running.iter().map(|(id, _, _)| id.as_str()).collect();
        applied.retain(|id, _| ids.contains(id.as_str()));
        running
            .iter()
            .filter_map(|(id, uid, name)| {
                let want = policy.cpus_of(&state, uid, name).to_string();
                (applied.get(id) != Some(&want)).then(|| (id.clone(), want))
            })
            .collect()
    }

    /// The state as upstream's file says it.
    #[cfg(test)]
    pub fn snapshot(&self) -> Assignments {
        self.lock().clone()
    }
}
