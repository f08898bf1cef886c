//! Pod cgroups with `cgroupsPerQOS`: `kubepods[/burstable|/besteffort]/pod<uid>` under
//! `cgroupRoot`, passed to CRI as the cgroup parent (cgroupfs driver). The runtime never
//! removes them, so we do once the pod is gone, on cgroup v1 and v2 alike.

use crate::quantity;
use k8s_openapi::api::core::v1::Pod;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QosClass {
    Guaranteed,
    Burstable,
    BestEffort,
}

impl QosClass {
    pub fn as_str(self) -> &'static str {
        match self {
            QosClass::Guaranteed => "Guaranteed",
            QosClass::Burstable => "Burstable",
            QosClass::BestEffort => "BestEffort",
        }
    }
}

/// Upstream `qos.GetPodQOS`: Guaranteed when every container limits CPU and memory with
/// requests equal to limits; BestEffort when nothing is requested or limited.
pub fn qos_class(pod: &Pod) -> QosClass {
    let Some(spec) = &pod.spec else {
        return QosClass::BestEffort;
    };
    let containers = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten());
    let mut any = false;
    let mut guaranteed = true;
    for c in containers {
        let res = c.resources.clone().unwrap_or_default();
        let limits = res.limits.unwrap_or_default();
        let requests = res.requests.unwrap_or_default();
        for name in ["cpu", "memory"] {
            let limit = limits.get(name).map(|q| q.0.clone());
            let request = requests.get(name).map(|q| q.0.clone()).or(limit.clone());
            if limit.is_some() || request.is_some() {
                any = true;
            }
            let equal = match (&limit, &request) {
                (Some(l), Some(r)) if name == "cpu" => {
                    quantity::cpu_millis(l) == quantity::cpu_millis(r)
                }
                (Some(l), Some(r)) => quantity::bytes(l) == quantity::bytes(r),
                _ => false,
            };
            guaranteed &= equal;
        }
    }
    match (any, guaranteed) {
        (false, _) => QosClass::BestEffort,
        (true, true) => QosClass::Guaranteed,
        (true, false) => QosClass::Burstable,
    }
}

/// The pod's cgroup parent as the cgroupfs driver names it, or None without cgroupsPerQOS.
pub fn pod_cgroup_parent(pod: &Pod, cgroups_per_qos: bool, cgroup_root: &str) -> Option<String> {
    if !cgroups_per_qos {
        return None;
    }
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let qos = match qos_class(pod) {
        QosClass::Guaranteed => String::new(),
        QosClass::Burstable => "/burstable".into(),
        QosClass::BestEffort => "/besteffort".into(),
    };
    let root = cgroup_root.trim_end_matches('/');
    Some(format!("{root}/kubepods{qos}/pod{uid}"))
}

/// Removes a pod cgroup in every hierarchy it exists in (v1: each controller; v2: the
/// unified tree). Children (the containers' cgroups) go first. Missing is fine.
pub fn remove_pod_cgroup(cgroup_fs: &Path, parent: &str) -> Result<(), String> {
    let rel = parent.trim_start_matches('/');
    let mut errors = Vec::new();
    for dir in hierarchies(cgroup_fs) {
        let path = dir.join(rel);
        if path.is_dir()
            && let Err(e) = remove_tree(&path)
        {
            errors.push(format!("{}: {e}", path.display()));
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

/// The cgroup hierarchies mounted under `cgroup_fs` (`/sys/fs/cgroup`).
fn hierarchies(cgroup_fs: &Path) -> Vec<PathBuf> {
    if cgroup_fs.join("cgroup.controllers").exists() {
        return vec![cgroup_fs.to_path_buf()]; // cgroup v2
    }
    let Ok(entries) = std::fs::read_dir(cgroup_fs) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false)) // skip "cpu -> cpu,cpuacct" links
        .map(|e| e.path())
        .collect()
}

/// cgroup directories are removed with rmdir, deepest first (their files are virtual).
fn remove_tree(path: &Path) -> std::io::Result<()> {
    if let Ok(entries) = std::fs::read_dir(path) {
        for e in entries.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                remove_tree(&e.path())?;
            }
        }
    }
    match std::fs::remove_dir(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(resources: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": "u1"},
            "spec": {"containers": [{"name": "c", "image": "i", "resources": resources}]}
        }))
        .unwrap()
    }

    #[test]
    fn qos_classes_follow_upstream() {
        assert_eq!(qos_class(&pod(serde_json::json!({}))), QosClass::BestEffort);
        assert_eq!(
            qos_class(&pod(
                serde_json::json!({"limits": {"cpu": "1", "memory": "1Gi"}})
            )),
            QosClass::Guaranteed
        );
        assert_eq!(
            qos_class(&pod(
                serde_json::json!({"limits": {"cpu": "1", "memory": "1Gi"}, "requests": {"cpu": "1000m", "memory": "1Gi"}})
            )),
            QosClass::Guaranteed
        );
        assert_eq!(
            qos_class(&pod(serde_json::json!({"requests": {"cpu": "100m"}}))),
            QosClass::Burstable
        );
    }

    #[test]
    fn cgroup_parent_by_qos() {
        let p = pod(serde_json::json!({}));
        assert_eq!(
            pod_cgroup_parent(&p, true, "/").as_deref(),
            Some("/kubepods/besteffort/podu1")
        );
        assert_eq!(pod_cgroup_parent(&p, false, "/"), None);
    }

    #[test]
    fn removal_walks_every_hierarchy() {
        let fs = tempfile::tempdir().unwrap();
        for ctl in ["memory", "pids"] {
            std::fs::create_dir_all(fs.path().join(ctl).join("kubepods/besteffort/podu1/ctr"))
                .unwrap();
        }
        remove_pod_cgroup(fs.path(), "/kubepods/besteffort/podu1").unwrap();
        assert!(!fs.path().join("memory/kubepods/besteffort/podu1").exists());
        assert!(fs.path().join("memory/kubepods/besteffort").exists());
        remove_pod_cgroup(fs.path(), "/kubepods/besteffort/podu1").unwrap();
    }
}
