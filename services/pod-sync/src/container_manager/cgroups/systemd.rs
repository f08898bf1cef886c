//! The systemd cgroup driver: pod cgroups are transient slices that systemd creates and
//! removes (`StartTransientUnit`, `SetUnitProperties`, `StopUnit` on the manager's D-Bus
//! interface), with the pod's limits as unit properties, as upstream's cgroup manager has
//! runc's systemd manager do it. The runtime's containers are scopes inside them
//! (containerd with `SystemdCgroup = true`).

use super::PodResources;
use nodeagent_config::cgroup_name::CgroupName;
use std::path::Path;
use std::time::{Duration, Instant};
use zbus::zvariant::Value;

const UNIT_EXISTS: &str = "org.freedesktop.systemd1.UnitExists";
const NO_SUCH_UNIT: &str = "org.freedesktop.systemd1.NoSuchUnit";
/// How long a new slice may take to appear in the cgroup tree.
const APPEAR_WITHIN: Duration = Duration::from_secs(10);

/// systemd's manager over the system bus.
#[derive(Clone)]
pub struct Slices {
    conn: zbus::Connection,
}

/// One D-Bus property of a unit: name and value (`a(sv)`).
type Property = (&'static str, Value<'static>);

impl Slices {
    /// Connects to systemd; an error names what the driver needs.
    pub async fn connect() -> Result<Self, String> {
        let conn = zbus::Connection::system().await.map_err(|e| {
            format!(
                "cgroupDriver \"systemd\" needs systemd as the init system, reached over the \
                 system D-Bus: {e}"
            )
        })?;
        let slices = Self { conn };
        // The manager answers (a bus without systemd on it is refused here, not at the
        // first pod).
        slices
            .manager()
            .await
            .map_err(|e| e.to_string())?
            .get_property::<String>("Version")
            .await
            .map_err(|e| {
                format!("cgroupDriver \"systemd\": systemd's manager does not answer: {e}")
            })?;
        Ok(slices)
    }

    async fn manager(&self) -> zbus::Result<zbus::Proxy<'static>> {
        zbus::proxy::Builder::new(&self.conn)
            .destination("org.freedesktop.systemd1")?
            .path("/org/freedesktop/systemd1")?
            .interface("org.freedesktop.systemd1.Manager")?
            .cache_properties(zbus::proxy::CacheProperties::No)
            .build()
            .await
    }

    /// Creates the slice (its parents first, as upstream's QoS manager keeps `kubepods` and
    /// the QoS slices), or updates its limits where it exists (a restart of pod-sync), and
    /// waits until it is in the cgroup tree, so the runtime's scopes land under it.
    pub async fn ensure(
        &self,
        cgroup_fs: &Path,
        name: &CgroupName,
        props: Vec<Property>,
    ) -> Result<(), String> {
        for n in 1..name.0.len() {
            let parent = CgroupName(name.0[..n].to_vec());
            if parent.0.last().is_some_and(|p| !p.is_empty()) {
                self.start_or_set(&parent.systemd_unit(), accounting())
                    .await?;
            }
        }
        let mut all = accounting();
        all.extend(props);
        self.start_or_set(&name.systemd_unit(), all).await?;
        let dir = slice_dir(cgroup_fs, name);
        let deadline = Instant::now() + APPEAR_WITHIN;
        while !dir.is_dir() {
            if Instant::now() > deadline {
                return Err(format!(
                    "systemd started {} but {} did not appear within {APPEAR_WITHIN:?}",
                    name.systemd_unit(),
                    dir.display()
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    async fn start_or_set(&self, unit: &str, props: Vec<Property>) -> Result<(), String> {
        let manager = self.manager().await.map_err(|e| e.to_string())?;
        let mut start = props.clone();
        start.push((
            "Description",
            Value::from(format!("nodeagent pod cgroup {unit}")),
        ));
        // Not stopped with the system's default units at shutdown before the pods are.
        start.push(("DefaultDependencies", Value::from(false)));
        let aux: Vec<(&str, Vec<Property>)> = Vec::new();
        match manager
            .call_method("StartTransientUnit", &(unit, "replace", start, aux))
            .await
        {
            Ok(_) => Ok(()),
            Err(zbus::Error::MethodError(name, _, _)) if name.as_str() == UNIT_EXISTS => manager
                .call_method("SetUnitProperties", &(unit, true, props))
                .await
                .map(|_| ())
                .map_err(|e| format!("SetUnitProperties {unit}: {e}")),
            Err(e) => Err(format!("StartTransientUnit {unit}: {e}")),
        }
    }

    /// Stops (and so removes) the pod's slice; a slice that is not there is fine.
    pub async fn remove(&self, name: &CgroupName) -> Result<(), String> {
        let unit = name.systemd_unit();
        let manager = self.manager().await.map_err(|e| e.to_string())?;
        match manager
            .call_method("StopUnit", &(unit.as_str(), "replace"))
            .await
        {
            Ok(_) => Ok(()),
            Err(zbus::Error::MethodError(name, _, _)) if name.as_str() == NO_SUCH_UNIT => Ok(()),
            Err(e) => Err(format!("StopUnit {unit}: {e}")),
        }
    }
}

/// Where the slice shows in the cgroup tree (v1: the memory hierarchy).
fn slice_dir(cgroup_fs: &Path, name: &CgroupName) -> std::path::PathBuf {
    let rel = name.to_systemd();
    let rel = rel.trim_start_matches('/');
    if cgroup_fs.join("cgroup.controllers").exists() {
        cgroup_fs.join(rel)
    } else {
        cgroup_fs.join("memory").join(rel)
    }
}

fn accounting() -> Vec<Property> {
    vec![
        ("CPUAccounting", Value::from(true)),
        ("MemoryAccounting", Value::from(true)),
        ("TasksAccounting", Value::from(true)),
    ]
}

/// The pod's limits as unit properties, as runc's systemd managers set them: v1
/// `CPUShares`/`MemoryLimit`, v2 `CPUWeight`/`MemoryMax`; the CFS quota per second rounded
/// up to systemd's 10 ms; `TasksMax` from `podPidsLimit`.
pub fn properties(res: &PodResources, pids_limit: i64, v2: bool) -> Vec<Property> {
    let mut props = Vec::new();
    if v2 {
        props.push(("CPUWeight", Value::from(super::cpu_weight(res.cpu_shares))));
    } else {
        props.push(("CPUShares", Value::from(res.cpu_shares)));
    }
    if let Some(quota) = res.cpu_quota_us {
        props.push(("CPUQuotaPerSecUSec", Value::from(quota_per_sec(quota))));
    }
    if let Some(memory) = res.memory_limit_bytes {
        let key = if v2 { "MemoryMax" } else { "MemoryLimit" };
        props.push((key, Value::from(memory.max(0) as u64)));
    }
    if pids_limit > 0 {
        props.push(("TasksMax", Value::from(pids_limit as u64)));
    }
    // runc's systemd v2 manager turns unified `memory.min` into `MemoryMin`.
    if let (true, Some(min)) = (v2, res.memory_min) {
        props.push(("MemoryMin", Value::from(min.max(0) as u64)));
    }
    props
}

/// runc's `addCpuQuota`: quota per 100 ms period as µs per second, rounded up to 10 ms.
fn quota_per_sec(quota_us: i64) -> u64 {
    let per_sec = (quota_us.max(0) as u64) * 1_000_000 / super::CFS_PERIOD_US as u64;
    per_sec.div_ceil(10_000) * 10_000
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(props: &[Property]) -> Vec<String> {
        props
            .iter()
            .map(|(k, v)| match v {
                Value::U64(n) => format!("{k}={n}"),
                other => format!("{k}={other:?}"),
            })
            .collect()
    }

    /// The properties runc's systemd managers give a cgroup of these limits
    /// (libcontainer/cgroups/systemd/v1.go and v2.go, `addCpuQuota`).
    #[test]
    fn limits_become_runcs_unit_properties() {
        let res = PodResources {
            cpu_shares: 512,
            cpu_quota_us: Some(50_000),
            memory_limit_bytes: Some(128 << 20),
            memory_min: None,
        };
        assert_eq!(
            keys(&properties(&res, 100, false)),
            [
                "CPUShares=512",
                "CPUQuotaPerSecUSec=500000",
                "MemoryLimit=134217728",
                "TasksMax=100"
            ]
        );
        assert_eq!(
            keys(&properties(&res, -1, true)),
            [
                "CPUWeight=20",
                "CPUQuotaPerSecUSec=500000",
                "MemoryMax=134217728"
            ]
        );
        let best_effort = PodResources {
            cpu_shares: 2,
            ..Default::default()
        };
        assert_eq!(keys(&properties(&best_effort, 0, false)), ["CPUShares=2"]);
        assert_eq!(keys(&properties(&best_effort, 0, true)), ["CPUWeight=1"]);
        // 1 ms of a 100 ms period is 10 ms a second; 1.5 ms rounds up to 20 ms.
        assert_eq!(quota_per_sec(1000), 10_000);
        assert_eq!(quota_per_sec(1500), 20_000);
    }
}
