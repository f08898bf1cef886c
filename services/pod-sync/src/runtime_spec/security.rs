//! The pod's and its containers' security context, as upstream applies it: honoured
//! (seccomp, AppArmor, safe sysctls, fsGroup, runAsNonRoot) or refused with upstream's
//! reason, so that a pod never runs weaker than its spec asks.

use k8s_openapi::api::core::v1::{
    AppArmorProfile, Container, Pod, PodSecurityContext, SeccompProfile, SecurityContext,
};
use nodeagent_proto::cri::{SeLinuxOption, SecurityProfile, security_profile::ProfileType};
use nodeagent_proto::k8s;
use std::collections::HashMap;
use std::path::Path;

/// Upstream's safe sysctls (`pkg/kubelet/sysctl/safe_sysctls.go`): namespaced and
/// isolated between pods, so any pod may set them.
const SAFE_SYSCTLS: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
];

/// The legacy per-container AppArmor annotation (upstream `v1.DeprecatedAppArmorBeta...`).
const APPARMOR_ANNOTATION_PREFIX: &str = "container.apparmor.security.beta.kubernetes.io/";

/// What the host offers, decided once at start.
#[derive(Debug, Clone, Default)]
pub struct HostSecurity {
    /// `allowedUnsafeSysctls` (names, or prefixes ending in `*`).
    pub allowed_unsafe_sysctls: Vec<String>,
    /// `/sys/module/apparmor/parameters/enabled` reads `Y`.
    pub apparmor_enabled: bool,
    /// The runtime's CRI `Status` says it supports `supplementalGroupsPolicy` (its
    /// `features`); false until the runtime has said so, as upstream's runtime state.
    pub supplemental_groups_policy: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl HostSecurity {
    pub fn detect(allowed_unsafe_sysctls: Vec<String>) -> Self {
        let enabled = std::fs::read_to_string("/sys/module/apparmor/parameters/enabled")
            .is_ok_and(|s| s.trim() == "Y");
        Self {
            allowed_unsafe_sysctls,
            apparmor_enabled: enabled,
            supplemental_groups_policy: Default::default(),
        }
    }
}

/// Why a whole pod is not admitted (its status gets phase Failed with these).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub reason: &'static str,
    pub message: String,
}

fn refuse(reason: &'static str, message: String) -> Result<(), Refusal> {
    Err(Refusal { reason, message })
}

fn pod_sc(pod: &Pod) -> PodSecurityContext {
    pod.spec
        .as_ref()
        .and_then(|s| s.security_context.clone())
        .unwrap_or_default()
}

fn all_containers(pod: &Pod) -> impl Iterator<Item = &Container> {
    pod.spec.iter().flat_map(|s| {
        s.init_containers
            .iter()
            .flatten()
            .chain(s.containers.iter())
    })
}

/// Upstream's pod admission for what this node can or cannot enforce: sysctls, AppArmor,
/// user namespaces, procMount, and the seccomp profile's path.
pub fn admit(pod: &Pod, host: &HostSecurity) -> Result<(), Refusal> {
    admit_sysctls(pod, host)?;
    admit_apparmor(pod, host)?;
    admit_user_namespaces(pod)?;
    admit_supplemental_groups_policy(pod, host)?;
    admit_seccomp_paths(pod)
}

/// upstream's `supplementalGroupsPolicy` admission (since 1.33): a pod asking for `Strict`
/// on a node whose runtime cannot ensure it is refused, never run as `Merge` silently.
fn admit_supplemental_groups_policy(pod: &Pod, host: &HostSecurity) -> Result<(), Refusal> {
    let strict = pod_sc(pod).supplemental_groups_policy.as_deref() == Some("Strict");
    if strict
        && !host
            .supplemental_groups_policy
            .load(std::sync::atomic::Ordering::Relaxed)
    {
        return refuse(
            "SupplementalGroupsPolicyNotSupported",
            "SupplementalGroupsPolicy=Strict is not supported in this node".into(),
        );
    }
    Ok(())
}

/// The CRI `SupplementalGroupsPolicy` of the pod (Merge 0, Strict 1; admission refused
/// Strict where the runtime cannot do it).
pub fn supplemental_groups_policy(pod: &Pod) -> i32 {
    match pod_sc(pod).supplemental_groups_policy.as_deref() {
        Some("Strict") => nodeagent_proto::cri::SupplementalGroupsPolicy::Strict as i32,
        _ => nodeagent_proto::cri::SupplementalGroupsPolicy::Merge as i32,
    }
}

/// The SELinux labels for CRI, the container's over the pod's, as upstream passes them
/// (`None` for the sandbox's own: `c` unset). The runtime applies them where SELinux is on.
pub fn selinux_options(pod: &Pod, c: Option<&Container>) -> Option<SeLinuxOption> {
    let own = c
        .and_then(|c| c.security_context.as_ref())
        .and_then(|s| s.se_linux_options.clone());
    let o = own.or(pod_sc(pod).se_linux_options)?;
    Some(SeLinuxOption {
        user: o.user.unwrap_or_default(),
        role: o.role.unwrap_or_default(),
        r#type: o.type_.unwrap_or_default(),
        level: o.level.unwrap_or_default(),
    })
}

fn sysctl_allowed(name: &str, allowed: &[String]) -> bool {
    SAFE_SYSCTLS.contains(&name)
        || allowed.iter().any(|a| match a.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => a == name,
        })
}

/// Sysctls in the IPC namespace (upstream `pkg/proxy/ipvs/sysctl` namespace groups).
fn ipc_sysctl(name: &str) -> bool {
    name.starts_with("kernel.shm")
        || name.starts_with("kernel.msg")
        || name == "kernel.sem"
        || name.starts_with("fs.mqueue.")
}

fn admit_sysctls(pod: &Pod, host: &HostSecurity) -> Result<(), Refusal> {
    let spec = pod.spec.clone().unwrap_or_default();
    for s in pod_sc(pod).sysctls.unwrap_or_default() {
        // Upstream accepts `/` as the separator too.
        let name = s.name.replace('/', ".");
        let why = if !sysctl_allowed(&name, &host.allowed_unsafe_sysctls) {
            "not allowlisted"
        } else if spec.host_network == Some(true) && name.starts_with("net.") {
            "not allowed with host net enabled"
        } else if spec.host_ipc == Some(true) && ipc_sysctl(&name) {
            "not allowed with host ipc enabled"
        } else {
            continue;
        };
        return refuse(
            "SysctlForbidden",
            format!("forbidden sysctl: \"{}\" {why}", s.name),
        );
    }
    Ok(())
}

/// The AppArmor profile a container asks for: its own field, the pod's, or the legacy
/// annotation (as upstream `getAppArmorProfile`).
fn apparmor_profile(pod: &Pod, c: &Container) -> Option<AppArmorProfile> {
    let field = c
        .security_context
        .as_ref()
        .and_then(|s| s.app_armor_profile.clone())
        .or_else(|| pod_sc(pod).app_armor_profile);
    if field.is_some() {
        return field;
    }
    let key = format!("{APPARMOR_ANNOTATION_PREFIX}{}", c.name);
    let value = pod.metadata.annotations.as_ref()?.get(&key)?;
    Some(match value.as_str() {
        "runtime/default" => AppArmorProfile {
            type_: "RuntimeDefault".into(),
            localhost_profile: None,
        },
        "unconfined" => AppArmorProfile {
            type_: "Unconfined".into(),
            localhost_profile: None,
        },
        other => AppArmorProfile {
            type_: "Localhost".into(),
            localhost_profile: Some(other.strip_prefix("localhost/").unwrap_or(other).into()),
        },
    })
}

fn admit_apparmor(pod: &Pod, host: &HostSecurity) -> Result<(), Refusal> {
    let required = all_containers(pod)
        .filter_map(|c| apparmor_profile(pod, c))
        .any(|p| p.type_ != "Unconfined");
    if required && !host.apparmor_enabled {
        return refuse(
            "AppArmor",
            "Cannot enforce AppArmor: AppArmor is not enabled on the host".into(),
        );
    }
    Ok(())
}

/// `hostUsers: false` needs CRI `userns_options`, which containerd 1.6 (Debian 12's)
/// ignores: running the pod would silently give it the host's users. `procMount:
/// Unmasked` is only valid inside a user namespace (upstream validation).
fn admit_user_namespaces(pod: &Pod) -> Result<(), Refusal> {
    if pod.spec.as_ref().and_then(|s| s.host_users) == Some(false) {
        return refuse(
            "UserNamespacesUnsupported",
            "hostUsers: false needs user namespaces, which this node's container runtime does not support".into(),
        );
    }
    if let Some(c) = all_containers(pod).find(|c| {
        c.security_context
            .as_ref()
            .and_then(|s| s.proc_mount.as_deref())
            == Some("Unmasked")
    }) {
        return refuse(
            "ProcMountUnsupported",
            format!(
                "container {:?}: procMount Unmasked needs hostUsers: false, which this node does not support",
                c.name
            ),
        );
    }
    Ok(())
}

fn admit_seccomp_paths(pod: &Pod) -> Result<(), Refusal> {
    let pod_profile = pod_sc(pod).seccomp_profile;
    let container_profiles = all_containers(pod).map(|c| {
        c.security_context
            .as_ref()
            .and_then(|s| s.seccomp_profile.clone())
    });
    for p in std::iter::once(pod_profile)
        .chain(container_profiles)
        .flatten()
    {
        if let Err(message) = seccomp(Some(&p), Path::new("/"), false) {
            return refuse("InvalidSeccompProfile", message);
        }
    }
    Ok(())
}

/// A seccomp profile for CRI. Unset is Unconfined, or RuntimeDefault with `seccompDefault`
/// (upstream `getSeccompProfile`'s `fallbackToRuntimeDefault`). Localhost profiles live
/// under `<root-dir>/seccomp/` and may not leave it.
pub fn seccomp(
    p: Option<&SeccompProfile>,
    root_dir: &Path,
    seccomp_default: bool,
) -> Result<SecurityProfile, String> {
    let profile = |t: ProfileType, localhost_ref: String| SecurityProfile {
        profile_type: t as i32,
        localhost_ref,
    };
    let Some(p) = p else {
        let t = if seccomp_default {
            ProfileType::RuntimeDefault
        } else {
            ProfileType::Unconfined
        };
        return Ok(profile(t, String::new()));
    };
    match p.type_.as_str() {
        "RuntimeDefault" => Ok(profile(ProfileType::RuntimeDefault, String::new())),
        "Unconfined" => Ok(profile(ProfileType::Unconfined, String::new())),
        "Localhost" => {
            let rel = p.localhost_profile.as_deref().unwrap_or_default();
            let path = Path::new(rel);
            let escapes = rel.is_empty()
                || path.is_absolute()
                || path
                    .components()
                    .any(|c| !matches!(c, std::path::Component::Normal(_)));
            if escapes {
                return Err(format!(
                    "seccompProfile: localhostProfile {rel:?} must be a relative path under the seccomp directory, without \"..\""
                ));
            }
            let full = root_dir.join("seccomp").join(path);
            Ok(profile(
                ProfileType::Localhost,
                full.to_string_lossy().into_owned(),
            ))
        }
        other => Err(format!("seccompProfile: unknown type {other:?}")),
    }
}

/// The pod-level seccomp profile, for the sandbox.
pub fn pod_seccomp(pod: &Pod, root_dir: &Path, seccomp_default: bool) -> Option<SecurityProfile> {
    seccomp(
        pod_sc(pod).seccomp_profile.as_ref(),
        root_dir,
        seccomp_default,
    )
    .ok()
}

/// The container's seccomp profile: its own, else the pod's.
pub fn container_seccomp(
    pod: &Pod,
    c: &Container,
    root_dir: &Path,
    seccomp_default: bool,
) -> Result<SecurityProfile, String> {
    let own = c
        .security_context
        .as_ref()
        .and_then(|s| s.seccomp_profile.clone());
    seccomp(
        own.or(pod_sc(pod).seccomp_profile).as_ref(),
        root_dir,
        seccomp_default,
    )
}

/// The container's AppArmor profile for CRI; `None` leaves the runtime's default.
pub fn container_apparmor(pod: &Pod, c: &Container) -> Option<SecurityProfile> {
    let p = apparmor_profile(pod, c)?;
    let (t, localhost_ref) = match p.type_.as_str() {
        "RuntimeDefault" => (ProfileType::RuntimeDefault, String::new()),
        "Localhost" => (
            ProfileType::Localhost,
            p.localhost_profile.unwrap_or_default(),
        ),
        _ => (ProfileType::Unconfined, String::new()),
    };
    Some(SecurityProfile {
        profile_type: t as i32,
        localhost_ref,
    })
}

/// The sandbox's sysctls (admission has refused any the pod may not set).
pub fn sandbox_sysctls(pod: &Pod) -> HashMap<String, String> {
    pod_sc(pod)
        .sysctls
        .unwrap_or_default()
        .into_iter()
        .map(|s| (s.name.replace('/', "."), s.value))
        .collect()
}

/// Supplemental groups: the pod's, plus its fsGroup (upstream adds it so that the
/// container can use volumes owned by that group).
pub fn supplemental_groups(pod: &Pod) -> Vec<i64> {
    let sc = pod_sc(pod);
    let mut groups = sc.supplemental_groups.unwrap_or_default();
    if let Some(g) = sc.fs_group
        && !groups.contains(&g)
    {
        groups.push(g);
    }
    groups
}

/// The container's effective security context fields that runAsNonRoot depends on.
fn effective(pod: &Pod, c: &Container) -> (Option<bool>, Option<i64>) {
    let sc: SecurityContext = c.security_context.clone().unwrap_or_default();
    let psc = pod_sc(pod);
    (
        sc.run_as_non_root.or(psc.run_as_non_root),
        sc.run_as_user.or(psc.run_as_user),
    )
}

/// Whether creating the container needs the image's user (runAsNonRoot without runAsUser).
pub fn needs_image_user(pod: &Pod, c: &Container) -> bool {
    matches!(effective(pod, c), (Some(true), None))
}

/// Upstream `verifyRunAsNonRoot`: `image_uid`/`image_user` are the image's user from CRI
/// ImageStatus (no user at all is root).
pub fn verify_run_as_non_root(
    pod: &Pod,
    c: &Container,
    image_uid: Option<i64>,
    image_user: &str,
) -> Result<(), String> {
    let (non_root, user) = effective(pod, c);
    if non_root != Some(true) {
        return Ok(());
    }
    let who = format!(
        "pod: \"{}_{}({})\", container: {}",
        k8s::pod_name(pod),
        k8s::pod_namespace(pod),
        k8s::pod_uid(pod),
        c.name
    );
    match (user, image_uid) {
        (Some(0), _) => Err(format!(
            "container's runAsUser breaks non-root policy ({who})"
        )),
        (Some(_), _) => Ok(()),
        (None, Some(0)) => Err(format!(
            "container has runAsNonRoot and image will run as root ({who})"
        )),
        (None, None) if !image_user.is_empty() => Err(format!(
            "container has runAsNonRoot and image has non-numeric user ({image_user}), cannot verify user is non-root ({who})"
        )),
        (None, None) => Err(format!(
            "container has runAsNonRoot and image will run as root ({who})"
        )),
        (None, Some(_)) => Ok(()),
    }
}

#[cfg(test)]
mod tests;
