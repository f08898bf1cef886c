//! upstream's `cpu_manager_state` file (`CPUManagerCheckpointV2`), byte for byte: JSON with
//! `policyName`, `defaultCpuSet`, `entries` (pod UID -> container -> cpuset; left out when
//! empty) and `checksum`, the FNV-1a (32 bit) of the struct as Go's spew library prints it
//! (`pkg/util/hash.DeepHashObject`), so that a file written by upstream's kubelet is read
//! here and the other way round.

use super::policy::Assignments;
use nodeagent_config::cpuset::CpuSet;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Pod UID -> container name -> cpuset text.
pub type Entries = BTreeMap<String, BTreeMap<String, String>>;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    // Go's decoder matches keys whatever their case; upstream's own tests write
    // `defaultCPUSet`.
    #[serde(rename = "policyName", alias = "PolicyName", alias = "policyname")]
    pub policy_name: String,
    #[serde(
        rename = "defaultCpuSet",
        alias = "defaultCPUSet",
        alias = "DefaultCPUSet",
        alias = "defaultcpuset"
    )]
    pub default_cpu_set: String,
    /// `None` where the file says `"entries": null` (Go's nil map, which spew prints as
    /// `<nil>`); a missing field is an empty map, as upstream's decoder leaves it.
    #[serde(
        default = "empty_entries",
        skip_serializing_if = "is_empty",
        deserialize_with = "nullable"
    )]
    pub entries: Option<Entries>,
    pub checksum: u64,
}

fn empty_entries() -> Option<Entries> {
    Some(BTreeMap::new())
}

fn is_empty(e: &Option<Entries>) -> bool {
    e.as_ref().is_none_or(|m| m.is_empty())
}

fn nullable<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Entries>, D::Error> {
    Option::deserialize(d)
}

impl Checkpoint {
    /// The file for this state, its checksum computed.
    pub fn of(policy_name: &str, s: &Assignments) -> Self {
        let entries = s
            .entries
            .iter()
            .map(|(uid, containers)| {
                let containers = containers
                    .iter()
                    .map(|(name, set)| (name.clone(), set.to_string()))
                    .collect();
                (uid.clone(), containers)
            })
            .collect();
        let mut cp = Self {
            policy_name: policy_name.to_string(),
            default_cpu_set: s.default.to_string(),
            entries: Some(entries),
            checksum: 0,
        };
        cp.checksum = cp.compute_checksum();
        cp
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a checkpoint always serializes")
    }

    /// upstream's `GetCheckpoint`: the JSON, and its checksum when it has one (0 is
    /// accepted, for files of old kubelets).
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let cp: Self = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        let v1 = is_empty(&cp.entries) && cp.checksum == cp.printed_checksum("map[string]string");
        if cp.checksum != 0 && cp.checksum != cp.compute_checksum() && !v1 {
            return Err("checkpoint is corrupted".into());
        }
        Ok(cp)
    }

    /// What spew's `%#v` prints of the struct with its checksum at 0 (go-spew's
    /// `formatState`: the pointer's and each field's type in parentheses, map keys sorted
    /// and their types left out, strings bare), hashed with FNV-1a.
    pub fn compute_checksum(&self) -> u64 {
        self.printed_checksum("map[string]map[string]string")
    }

    /// The checksum with the entries' Go type as given: `CPUManagerCheckpointV1`'s
    /// (`map[string]string`, container ID -> cpuset) is accepted for a file with no
    /// entries, as upstream's fallback reads one; V1 entries (by container ID) are not.
    fn printed_checksum(&self, entries_type: &str) -> u64 {
        let entries = match &self.entries {
            None => "<nil>".to_string(),
            Some(m) => {
                let pods: Vec<String> = m
                    .iter()
                    .map(|(uid, containers)| {
                        let cs: Vec<String> = containers
                            .iter()
                            .map(|(name, set)| format!("{name}:{set}"))
                            .collect();
                        format!("{uid}:map[{}]", cs.join(" "))
                    })
                    .collect();
                format!("map[{}]", pods.join(" "))
            }
        };
        let printed = format!(
            "(*state.CPUManagerCheckpoint){{PolicyName:(string){} DefaultCPUSet:(string){} Entries:({entries_type}){entries} Checksum:(checksum.Checksum)0}}",
            self.policy_name, self.default_cpu_set
        );
        crate::container_manager::checksum::fnv1a_32(printed.as_bytes()) as u64
    }

    /// upstream's `restoreState`: the policy must be the configured one, and every cpuset
    /// must parse.
    pub fn into_assignments(self, policy_name: &str) -> Result<Assignments, String> {
        if self.policy_name != policy_name {
            return Err(format!(
                "configured policy {policy_name:?} differs from state checkpoint policy {:?}",
                self.policy_name
            ));
        }
        let default = CpuSet::parse(&self.default_cpu_set).map_err(|e| {
            format!(
                "could not parse default cpu set {:?}: {e}",
                self.default_cpu_set
            )
        })?;
        let mut entries = BTreeMap::new();
        for (pod, containers) in self.entries.unwrap_or_default() {
            let mut sets = BTreeMap::new();
            for (container, text) in containers {
                let set = CpuSet::parse(&text).map_err(|e| {
                    format!(
                        "could not parse cpuset {text:?} for container {container:?} in pod {pod:?}: {e}"
                    )
                })?;
                sets.insert(container, set);
            }
            entries.insert(pod, sets);
        }
        Ok(Assignments { default, entries })
    }
}
