//! upstream's enforcement of `system-reserved` and `kube-reserved`
//! (`node_container_manager_linux.go`, `enforceExistingCgroup` with `getCgroupConfig`): with
//! `enforceNodeAllocatable` naming them, the cgroups `systemReservedCgroup` and
//! `kubeReservedCgroup` name, which must exist already (the operator's, as systemd's
//! `system.slice`), get the reservation as their limits: CPU shares from the cpu, the memory
//! limit, the pids limit. Done once at pod-sync's start; a cgroup that is missing stops the
//! start in upstream's words (its kubelet fails `Start` of the container manager).

use super::cgroups::milli_cpu_to_shares;
use nodeagent_config::KubeletConfiguration;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One reserved cgroup to enforce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reserved {
    /// "System Reserved" or "Kube Reserved", as upstream's messages say.
    pub what: &'static str,
    /// The cgroup as configured (`/system.slice`).
    pub cgroup: String,
    pub cpu_shares: Option<u64>,
    pub memory: Option<i64>,
    pub pids: Option<i64>,
}

impl Reserved {
    fn of(what: &'static str, cgroup: &str, reserved: &BTreeMap<String, String>) -> Self {
        let q = |name: &str, f: fn(&str) -> Option<i64>| reserved.get(name).and_then(|v| f(v));
        Self {
            what,
            cgroup: cgroup.to_string(),
            cpu_shares: q("cpu", nodeagent_config::quantity::cpu_millis).map(milli_cpu_to_shares),
            memory: q("memory", nodeagent_config::quantity::bytes),
            pids: q("pid", nodeagent_config::quantity::bytes),
        }
    }

    /// upstream's event text on success.
    pub fn success_message(&self) -> String {
        format!(
            "Updated limits on {} cgroup {}",
            self.what.to_lowercase(),
            self.cgroup
        )
    }
}

/// The reserved cgroups `enforceNodeAllocatable` asks for, in upstream's order.
pub fn enforced(kubelet: &KubeletConfiguration) -> Vec<Reserved> {
    let has = |key: &str| kubelet.enforce_node_allocatable.iter().any(|e| e == key);
    let mut out = Vec::new();
    if has("system-reserved") {
        out.push(Reserved::of(
            "System Reserved",
            &kubelet.system_reserved_cgroup,
            &kubelet.system_reserved,
        ));
    }
    if has("kube-reserved") {
        out.push(Reserved::of(
            "Kube Reserved",
            &kubelet.kube_reserved_cgroup,
            &kubelet.kube_reserved,
        ));
    }
    out
}

/// Sets the limits on the existing cgroup (cgroup v1: the cpu, memory and pids
/// hierarchies; v2: the unified tree). `Err` with upstream's message when it is missing.
pub fn enforce(cgroup_fs: &Path, r: &Reserved) -> Result<(), String> {
    let fail = |why: String| {
        format!(
            "Failed to enforce {} Cgroup Limits on {:?}: {why}",
            r.what, r.cgroup
        )
    };
    let rel = r.cgroup.trim_matches('/');
    let name: Vec<&str> = rel.split('/').filter(|p| !p.is_empty()).collect();
    let v2 = cgroup_fs.join("cgroup.controllers").exists();
    let dirs: Vec<(PathBuf, &str)> = if v2 {
        vec![(cgroup_fs.join(rel), "")]
    } else {
        ["cpu", "memory", "pids"]
            .into_iter()
            .map(|c| (cgroup_fs.join(c).join(rel), c))
            .collect()
    };
    let missing: Vec<String> = dirs
        .iter()
        .filter(|(d, _)| !d.is_dir())
        .map(|(d, _)| d.display().to_string())
        .collect();
    if !missing.is_empty() {
        return Err(fail(format!(
            "cgroup {name:?} has some missing paths: {}",
            missing.join(", ")
        )));
    }
    let write = |path: PathBuf, value: String| {
        std::fs::write(&path, &value)
            .map_err(|e| fail(format!("write {value:?} to {}: {e}", path.display())))
    };
    if v2 {
        let dir = cgroup_fs.join(rel);
        if let Some(parent) = dir.parent() {
            // The parent delegates the controllers the limits need (best effort: where it
            // cannot, the write below says why).
            let _ = std::fs::write(parent.join("cgroup.subtree_control"), "+cpu +memory +pids");
        }
        if let Some(shares) = r.cpu_shares {
            write(
                dir.join("cpu.weight"),
                super::cgroups::cpu_weight(shares).to_string(),
            )?;
        }
        if let Some(m) = r.memory {
            write(dir.join("memory.max"), m.to_string())?;
        }
        if let Some(p) = r.pids {
            write(dir.join("pids.max"), p.to_string())?;
        }
        return Ok(());
    }
    if let Some(shares) = r.cpu_shares {
        write(
            cgroup_fs.join("cpu").join(rel).join("cpu.shares"),
            shares.to_string(),
        )?;
    }
    if let Some(m) = r.memory {
        write(
            cgroup_fs
                .join("memory")
                .join(rel)
                .join("memory.limit_in_bytes"),
            m.to_string(),
        )?;
    }
    if let Some(p) = r.pids {
        write(
            cgroup_fs.join("pids").join(rel).join("pids.max"),
            p.to_string(),
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(enforce: &[&str]) -> KubeletConfiguration {
        KubeletConfiguration {
            enforce_node_allocatable: enforce.iter().map(|s| s.to_string()).collect(),
            system_reserved: [("cpu", "500m"), ("memory", "100Mi"), ("pid", "1000")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            kube_reserved: [("memory", "1Gi")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            system_reserved_cgroup: "/system.slice".into(),
            kube_reserved_cgroup: "/kube.slice".into(),
            ..Default::default()
        }
    }

    /// upstream's `getCgroupConfig`: shares from the cpu (`MilliCPUToShares`), the memory
    /// and pids limits; only what is reserved; only what `enforceNodeAllocatable` names.
    #[test]
    fn limits_follow_the_reservation_and_the_enforcement_list() {
        assert!(enforced(&config(&["pods"])).is_empty());
        let both = enforced(&config(&["pods", "system-reserved", "kube-reserved"]));
        assert_eq!(
            both,
            vec![
                Reserved {
                    what: "System Reserved",
                    cgroup: "/system.slice".into(),
                    cpu_shares: Some(512),
                    memory: Some(100 << 20),
                    pids: Some(1000),
                },
                Reserved {
                    what: "Kube Reserved",
                    cgroup: "/kube.slice".into(),
                    cpu_shares: None,
                    memory: Some(1 << 30),
                    pids: None,
                },
            ]
        );
        assert_eq!(
            both[0].success_message(),
            "Updated limits on system reserved cgroup /system.slice"
        );
    }

    /// On a fake v1 tree: a missing cgroup is upstream's error naming every missing path;
    /// an existing one gets its files.
    #[test]
    fn a_missing_cgroup_is_refused_and_an_existing_one_limited() {
        let fs = tempfile::tempdir().unwrap();
        let r = &enforced(&config(&["system-reserved"]))[0];
        let err = enforce(fs.path(), r).unwrap_err();
        assert!(
            err.starts_with(
                "Failed to enforce System Reserved Cgroup Limits on \"/system.slice\": cgroup [\"system.slice\"] has some missing paths: "
            ),
            "{err}"
        );
        assert!(err.contains("memory/system.slice"), "{err}");
        for c in ["cpu", "memory", "pids"] {
            std::fs::create_dir_all(fs.path().join(c).join("system.slice")).unwrap();
        }
        enforce(fs.path(), r).unwrap();
        let read = |p: &str| std::fs::read_to_string(fs.path().join(p)).unwrap();
        assert_eq!(read("cpu/system.slice/cpu.shares"), "512");
        assert_eq!(
            read("memory/system.slice/memory.limit_in_bytes"),
            "104857600"
        );
        assert_eq!(read("pids/system.slice/pids.max"), "1000");
    }
}
