//! Cgroup names as upstream's cgroup managers spell them (pkg/kubelet/cm/cgroup_manager_linux.go):
//! a name is a list of components from the root; the `cgroupfs` driver joins them with
//! `/`, the `systemd` driver makes each prefix a slice (`/kubepods.slice/
//! kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice`, a component's `-` escaped
//! to `_`). Every service that looks a pod's cgroup up uses these names.

/// `cgroupDriver`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CgroupDriver {
    #[default]
    Cgroupfs,
    Systemd,
}

impl CgroupDriver {
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "cgroupfs" => Some(Self::Cgroupfs),
            "systemd" => Some(Self::Systemd),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cgroupfs => "cgroupfs",
            Self::Systemd => "systemd",
        }
    }
}

/// Upstream's `CgroupName`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CgroupName(pub Vec<String>);

/// The QoS parts of a pod's cgroup (none for Guaranteed pods, upstream's lower-case names).
pub const QOS_PARTS: [&str; 3] = ["", "burstable", "besteffort"];

impl CgroupName {
    /// Upstream's `ParseCgroupfsToCgroupName`: `cgroupRoot` is always given in this form,
    /// whatever the driver (container_manager_linux.go).
    pub fn parse_cgroupfs(name: &str) -> Self {
        let rest = name.strip_prefix('/').unwrap_or(name);
        if rest.is_empty() {
            return Self::default();
        }
        Self(rest.split('/').map(String::from).collect())
    }

    /// Upstream's `NewCgroupName`: this name with more components.
    pub fn child(&self, parts: &[&str]) -> Self {
        let mut all = self.0.clone();
        all.extend(parts.iter().map(|p| p.to_string()));
        Self(all)
    }

    /// Upstream's `ToCgroupfs`.
    pub fn to_cgroupfs(&self) -> String {
        format!("/{}", self.0.join("/"))
    }

    /// Upstream's `ToSystemd`: every prefix a slice, empty components skipped, `-` in a
    /// component escaped to `_`.
    pub fn to_systemd(&self) -> String {
        let parts: Vec<String> = self
            .0
            .iter()
            .filter(|p| !p.is_empty())
            .map(|p| p.replace('-', "_"))
            .collect();
        if parts.is_empty() {
            return "/".into();
        }
        (1..=parts.len())
            .map(|n| format!("/{}.slice", parts[..n].join("-")))
            .collect()
    }

    /// The cgroup's path under a hierarchy's mount, as the driver names it.
    pub fn path(&self, driver: CgroupDriver) -> String {
        match driver {
            CgroupDriver::Cgroupfs => self.to_cgroupfs(),
            CgroupDriver::Systemd => self.to_systemd(),
        }
    }

    /// The systemd unit of a slice path ([`Self::to_systemd`]'s last component).
    pub fn systemd_unit(&self) -> String {
        let path = self.to_systemd();
        path.rsplit('/').next().unwrap_or_default().to_string()
    }
}

/// A pod's cgroup: `<cgroupRoot>/kubepods[/<qos>]/pod<uid>` (`qos` one of [`QOS_PARTS`]).
/// Guaranteed pods sit right under `kubepods` (no empty component: upstream's
/// `GetPodContainerName` names them under the Guaranteed QoS cgroup, which is `kubepods`).
pub fn pod_cgroup_name(cgroup_root: &str, qos: &str, uid: &str) -> CgroupName {
    let pod = format!("pod{uid}");
    let parts: Vec<&str> = ["kubepods", qos, &pod]
        .into_iter()
        .filter(|p| !p.is_empty())
        .collect();
    CgroupName::parse_cgroupfs(cgroup_root).child(&parts)
}

/// The cgroup of all pods: `<cgroupRoot>/kubepods`.
pub fn pods_cgroup_name(cgroup_root: &str) -> CgroupName {
    CgroupName::parse_cgroupfs(cgroup_root).child(&["kubepods"])
}

/// A container's cgroup under its pod's, as the runtime names it: the container's ID under
/// the cgroupfs driver, containerd's `cri-containerd-<id>.scope` under systemd's.
pub fn container_cgroup(pod_path: &str, driver: CgroupDriver, id: &str) -> String {
    match driver {
        CgroupDriver::Cgroupfs => format!("{pod_path}/{id}"),
        CgroupDriver::Systemd => format!("{pod_path}/cri-containerd-{id}.scope"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(parts: &[&str]) -> CgroupName {
        CgroupName::default().child(parts)
    }

    /// Rows of upstream's TestCgroupNameToSystemd, TestCgroupNameToSystemdBasename,
    /// TestCgroupNameWithEmptyPartToSystemd and TestCgroupNameToCgroupfs
    /// (pkg/kubelet/cm/cgroup_manager_linux_test.go).
    #[test]
    fn names_as_upstreams_cgroup_manager_spells_them() {
        let systemd = [
            (name(&[]), "/"),
            (name(&["Burstable"]), "/Burstable.slice"),
            (
                name(&["Burstable", "pod-123"]),
                "/Burstable.slice/Burstable-pod_123.slice",
            ),
            (
                name(&["BestEffort", "pod-6c1a4e95-6bb6-11e6-bc26-28d2444e470d"]),
                "/BestEffort.slice/BestEffort-pod_6c1a4e95_6bb6_11e6_bc26_28d2444e470d.slice",
            ),
            (name(&["kubepods"]), "/kubepods.slice"),
            (name(&["Burstable", ""]), "/Burstable.slice"),
            (
                name(&["", "Burstable", "pod-123"]),
                "/Burstable.slice/Burstable-pod_123.slice",
            ),
            (name(&["kubepods", ""]), "/kubepods.slice"),
        ];
        for (n, want) in systemd {
            assert_eq!(n.to_systemd(), want, "{n:?}");
        }
        let basenames = [
            (name(&["system"]), "system.slice"),
            (name(&["system", "Burstable"]), "system-Burstable.slice"),
            (
                name(&["test", "a", "b", "Burstable"]),
                "test-a-b-Burstable.slice",
            ),
        ];
        for (n, want) in basenames {
            assert_eq!(n.systemd_unit(), want, "{n:?}");
        }
        assert_eq!(name(&[]).to_cgroupfs(), "/");
        assert_eq!(name(&["Burstable"]).to_cgroupfs(), "/Burstable");
        // TestNewCgroupName (#68416): "/a/" keeps its empty component.
        assert_eq!(
            CgroupName::parse_cgroupfs("/a/").child(&["b"]),
            name(&["a", "", "b"])
        );
    }

    #[test]
    fn a_pods_cgroup_under_each_driver() {
        let uid = "6c1a4e95-6bb6-11e6-bc26-28d2444e470d";
        let be = pod_cgroup_name("/", "besteffort", uid);
        assert_eq!(
            be.path(CgroupDriver::Cgroupfs),
            format!("/kubepods/besteffort/pod{uid}")
        );
        assert_eq!(
            be.path(CgroupDriver::Systemd),
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod6c1a4e95_6bb6_11e6_bc26_28d2444e470d.slice"
        );
        // Guaranteed pods sit right under kubepods.
        let g = pod_cgroup_name("/", "", "u1");
        assert_eq!(g.path(CgroupDriver::Cgroupfs), "/kubepods/podu1");
        assert_eq!(
            g.path(CgroupDriver::Systemd),
            "/kubepods.slice/kubepods-podu1.slice"
        );
        assert_eq!(g.systemd_unit(), "kubepods-podu1.slice");
        assert_eq!(
            pods_cgroup_name("/").path(CgroupDriver::Systemd),
            "/kubepods.slice"
        );
        assert_eq!(
            container_cgroup(
                "/kubepods.slice/kubepods-podu1.slice",
                CgroupDriver::Systemd,
                "abc"
            ),
            "/kubepods.slice/kubepods-podu1.slice/cri-containerd-abc.scope"
        );
    }
}
