//! What the tests read of a pod's cgroups, on either hierarchy: cgroup v1 (one tree per
//! controller under /sys/fs/cgroup) or v2 (one unified tree), so each check runs on both
//! (`tests/cgroup2/suite.sh` runs them on a v2 guest).

use std::path::{Path, PathBuf};

const ROOT: &str = "/sys/fs/cgroup";

/// Whether this host runs the unified (v2) hierarchy.
pub fn is_v2() -> bool {
    Path::new(ROOT).join("cgroup.controllers").exists()
}

/// A cgroup's file: `v1` under the controller's tree (`("memory", "memory.limit_in_bytes")`)
/// or `v2` in the unified tree, whichever this host has.
pub fn file(cgroup: &str, v1: (&str, &str), v2: &str) -> PathBuf {
    if is_v2() {
        Path::new(ROOT).join(cgroup).join(v2)
    } else {
        Path::new(ROOT).join(v1.0).join(cgroup).join(v1.1)
    }
}

/// The text of a cgroup file, trimmed.
pub fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path)
        .map(|t| t.trim().to_string())
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// A cgroup's memory limit in bytes (v2 `memory.max`, v1 `memory.limit_in_bytes`);
/// `None` for unlimited.
pub fn memory_limit(cgroup: &str) -> Result<Option<i64>, String> {
    let text = read(&file(
        cgroup,
        ("memory", "memory.limit_in_bytes"),
        "memory.max",
    ))?;
    match text.as_str() {
        "max" => Ok(None),
        // v1's "unlimited" is the largest page-aligned i64.
        n => n
            .parse::<i64>()
            .map(|n| (n < i64::MAX / 2).then_some(n))
            .map_err(|e| format!("{n:?}: {e}")),
    }
}

/// A cgroup's CFS quota per 100 ms period in microseconds (v2 `cpu.max`, v1
/// `cpu.cfs_quota_us`); `None` for unlimited.
pub fn cpu_quota(cgroup: &str) -> Result<Option<i64>, String> {
    let text = read(&file(cgroup, ("cpu", "cpu.cfs_quota_us"), "cpu.max"))?;
    let quota = text.split_whitespace().next().unwrap_or_default();
    match quota {
        "max" | "-1" => Ok(None),
        n => n.parse().map(Some).map_err(|e| format!("{text:?}: {e}")),
    }
}

/// A cgroup's CPU weight as v1 shares: v1 `cpu.shares` as is, v2 `cpu.weight` as the
/// weight that upstream's CpuSharesToCpuWeight gives for `shares` (so callers compare
/// shares on both hierarchies).
pub fn cpu_weight_matches_shares(cgroup: &str, shares: u64) -> Result<bool, String> {
    if is_v2() {
        let weight: u64 = read(&file(cgroup, ("", ""), "cpu.weight"))?
            .parse()
            .map_err(|e| format!("cpu.weight: {e}"))?;
        Ok(weight == 1 + (shares.saturating_sub(2) * 9999) / 262142)
    } else {
        let seen: u64 = read(&file(cgroup, ("cpu", "cpu.shares"), ""))?
            .parse()
            .map_err(|e| format!("cpu.shares: {e}"))?;
        Ok(seen == shares)
    }
}

/// The directories of a cgroup and every cgroup below it (parents first), in the memory
/// tree on v1.
pub fn tree(cgroup: &str) -> Vec<PathBuf> {
    if is_v2() {
        tree_under(Path::new(ROOT), Path::new(cgroup))
    } else {
        tree_under(&Path::new(ROOT).join("memory"), Path::new(cgroup))
    }
}

fn tree_under(hierarchy: &Path, cgroup: &Path) -> Vec<PathBuf> {
    let root = hierarchy.join(cgroup);
    if !root.is_dir() {
        return Vec::new();
    }
    let mut found = Vec::new();
    let mut dirs = vec![root];
    while let Some(dir) = dirs.pop() {
        if let Ok(children) = std::fs::read_dir(&dir) {
            dirs.extend(
                children
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
        found.push(dir);
    }
    found
}

/// Removes what is left of a pod's cgroups (every QoS place, every v1 hierarchy), deepest
/// first: a test that removes its pods through the runtime, behind pod-sync's back, leaves
/// the pod cgroups pod-sync would have removed.
pub fn remove_pod(uid: &str) {
    for root in hierarchies() {
        for qos in ["", "burstable/", "besteffort/"] {
            remove_under(&root, &format!("kubepods/{qos}pod{uid}"));
        }
    }
}

/// Removes a cgroup and every cgroup below it, deepest first, in every hierarchy (a test
/// node's own `cgroupRoot`).
pub fn remove(cgroup: &str) {
    for root in hierarchies() {
        remove_under(&root, cgroup.trim_start_matches('/'));
    }
}

fn remove_under(root: &Path, cgroup: &str) {
    let Ok(relative) = root.join(cgroup).strip_prefix(ROOT).map(Path::to_path_buf) else {
        return;
    };
    let mut dirs = tree_under(Path::new(ROOT), &relative);
    dirs.reverse();
    for dir in dirs {
        let _ = std::fs::remove_dir(dir);
    }
}

/// The hierarchies' roots: the unified tree, or each v1 controller's.
fn hierarchies() -> Vec<PathBuf> {
    if is_v2() {
        vec![PathBuf::from(ROOT)]
    } else {
        std::fs::read_dir(ROOT)
            .map(|d| {
                d.flatten()
                    // The real trees only, not the "cpu -> cpu,cpuacct" links.
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path())
                    .collect()
            })
            .unwrap_or_default()
    }
}
