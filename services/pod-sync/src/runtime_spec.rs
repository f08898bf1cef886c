//! Builds the CRI sandbox and container configs from a Pod, with the labels and
//! annotations upstream puts on them so that a restarted pod-sync (or crictl) recognises
//! every object.

pub(crate) mod expansion;
pub(crate) mod runtime_class;
pub(crate) mod security;

use crate::container_manager::quantity;
use crate::runtime_spec::expansion::Budget;
use k8s_openapi::api::core::v1::{Container, EnvVar, Pod, VolumeMount};
use nodeagent_hostpath::{HostPath, PathError};
use nodeagent_proto::api::SubPathMount;
use nodeagent_proto::cri::{
    Capability, ContainerConfig, ContainerMetadata, DnsConfig, ImageSpec, KeyValue,
    LinuxContainerConfig, LinuxContainerResources, LinuxContainerSecurityContext,
    LinuxPodSandboxConfig, LinuxSandboxSecurityContext, Mount, MountPropagation, NamespaceMode,
    NamespaceOption, PodSandboxConfig, PodSandboxMetadata, PortMapping, Protocol,
};
use nodeagent_proto::k8s::{self, labels};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// Node facts the specs need.
#[derive(Debug, Clone)]
pub struct NodeContext {
    pub node_name: String,
    pub pod_logs_dir: PathBuf,
    pub cgroups_per_qos: bool,
    pub cgroup_root: String,
    /// `cgroupDriver`: how the pod cgroups (the sandboxes' cgroup parents) are named.
    pub cgroup_driver: nodeagent_config::cgroup_name::CgroupDriver,
    pub cluster_dns: Vec<String>,
    pub cluster_domain: String,
    pub resolv_conf: PathBuf,
    /// The node's IPs (`status.hostIPs`, a host-network pod's IPs).
    pub ips: crate::status::ips::NodeIps,
    /// The node agent's root directory (`--root-dir`).
    pub root_dir: PathBuf,
    /// `podPidsLimit` (-1: unlimited).
    pub pod_pids_limit: i64,
    /// The machine's memory (`MemTotal`), which Burstable containers' OOM scores are
    /// relative to.
    pub memory_capacity: u64,
    /// `seccompDefault`: RuntimeDefault where a pod sets no seccomp profile.
    pub seccomp_default: bool,
    /// What pods are admitted against: `maxPods` and allocatable cpu and memory.
    pub allocatable: crate::node::admission::NodeResources,
    /// What the `kubepods` cgroup is limited to (`enforceNodeAllocatable`).
    pub pods_limits: crate::container_manager::cgroups::PodsLimits,
    /// Memory QoS, where the `MemoryQoS` gate is on and the node runs cgroup v2.
    pub memory_qos: Option<crate::container_manager::memory_qos::MemoryQos>,
}

#[cfg(test)]
impl NodeContext {
    /// The node of the kill and security unit tests: node `n`, no QoS cgroups, and its
    /// root dir `root` under the temp dir.
    pub(crate) fn for_unit_tests(root: &str) -> Self {
        NodeContext {
            node_name: "n".into(),
            pod_logs_dir: "/tmp/nodeagent-unit-logs".into(),
            cgroups_per_qos: false,
            cgroup_root: "/".into(),
            cgroup_driver: Default::default(),
            cluster_dns: Vec::new(),
            cluster_domain: String::new(),
            resolv_conf: "/nonexistent".into(),
            ips: crate::status::ips::NodeIps {
                host_ips: vec!["10.0.0.1".into()],
                ipv6_primary: false,
            },
            root_dir: std::env::temp_dir().join(root),
            pod_pids_limit: -1,
            memory_capacity: 8 << 30,
            seccomp_default: false,
            allocatable: crate::node::admission::NodeResources {
                pods: 110,
                cpu_millis: 2000,
                memory: 4 << 30,
                ephemeral_storage: 100 << 30,
            },
            pods_limits: crate::container_manager::cgroups::PodsLimits {
                cpu_millis: 2000,
                memory: 4 << 30,
                pids: 4 << 20,
            },
            memory_qos: None,
        }
    }
}

/// The host file mounted at a container's terminationMessagePath (upstream:
/// `<root>/pods/<uid>/containers/<name>/<id>`; we name it by attempt so that the file of
/// any container instance can be found again from its CRI metadata alone).
pub fn termination_message_file(
    root: &Path,
    uid: &str,
    name: &str,
    attempt: u32,
) -> Result<PathBuf, PathError> {
    let uid = nodeagent_hostpath::uid(uid)?;
    HostPath::new(
        root,
        &["pods", uid, "containers", name, &attempt.to_string()],
    )
    .map(HostPath::into_path_buf)
}

/// `/var/log/pods/<namespace>_<name>_<uid>`.
pub fn pod_log_dir(logs_dir: &Path, pod: &Pod) -> Result<PathBuf, PathError> {
    let uid = nodeagent_hostpath::uid(k8s::pod_uid(pod))?;
    let name = format!(
        "{}_{}_{uid}",
        nodeagent_hostpath::component(k8s::pod_namespace(pod))?,
        nodeagent_hostpath::component(k8s::pod_name(pod))?,
    );
    HostPath::new(logs_dir, &[name]).map(HostPath::into_path_buf)
}

/// Refuses a pod whose identity cannot name host paths safely (its log dir, its cgroup,
/// its container log and termination message files), whatever config-source let through.
pub fn check_pod_paths(pod: &Pod, node: &NodeContext) -> Result<(), String> {
    let err = |e: PathError| format!("refusing pod {}: {e}", k8s::pod_full_name(pod));
    pod_log_dir(&node.pod_logs_dir, pod).map_err(err)?;
    let spec = pod.spec.clone().unwrap_or_default();
    for c in spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
    {
        termination_message_file(&node.root_dir, k8s::pod_uid(pod), &c.name, 0).map_err(err)?;
    }
    Ok(())
}

/// Hash of a container's whole spec, as builds before the upstream hash compared it (and
/// as they still do, so a downgraded pod-sync restarts nothing either).
pub fn container_hash(c: &Container) -> String {
    short_sha(&serde_json::to_vec(c).unwrap_or_default())
}

/// Hash of what upstream's HashContainer covers, the name and the image: nothing else of a
/// container can change without a new pod, so an agent upgrade (a new serialization of the
/// spec) or an in-place resize restarts nothing.
pub fn upstream_hash(c: &Container) -> String {
    let fields = serde_json::json!({"name": c.name, "image": c.image});
    short_sha(&serde_json::to_vec(&fields).unwrap_or_default())
}

fn short_sha(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether a running container no longer matches its spec (upstream `containerChanged`).
/// A container made by an older build has no upstream hash: its whole-spec hash decides.
pub fn container_changed(c: &Container, running: &nodeagent_proto::api::RuntimeContainer) -> bool {
    if !running.upstream_hash.is_empty() {
        return running.upstream_hash != upstream_hash(c);
    }
    !running.spec_hash.is_empty() && running.spec_hash != container_hash(c)
}

/// Everything `CreateContainer` needs besides the sandbox.
pub struct ContainerInputs<'a> {
    pub pod: &'a Pod,
    pub container: &'a Container,
    pub attempt: u32,
    /// Restart count at the last crash-loop back-off reset.
    pub backoff_base: u32,
    pub volumes: &'a HashMap<String, String>,
    pub pod_ip: &'a str,
    pub node: &'a NodeContext,
    pub env_refs: &'a EnvRefs,
}

/// configMap, secret, downwardAPI and projected volumes are always mounted read-only
/// (upstream: their mounters' `ReadOnly` attribute), whatever the volumeMount says.
fn read_only_volume(pod: &Pod, name: &str) -> bool {
    let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
    volumes.into_iter().flatten().any(|v| {
        v.name == name
            && (v.config_map.is_some()
                || v.secret.is_some()
                || v.downward_api.is_some()
                || v.projected.is_some())
    })
}

/// The CRI propagation of a volume mount (upstream's `translateMountPropagation`), and
/// upstream's validation again: `Bidirectional` only for a privileged container, since
/// its mounts reach the host (config-source refuses such a pod first, for every source).
fn mount_propagation(c: &Container, m: &VolumeMount) -> Result<MountPropagation, String> {
    let privileged = c
        .security_context
        .as_ref()
        .and_then(|s| s.privileged)
        .unwrap_or(false);
    match m.mount_propagation.as_deref() {
        None | Some("None") => Ok(MountPropagation::PropagationPrivate),
        Some("HostToContainer") => Ok(MountPropagation::PropagationHostToContainer),
        Some("Bidirectional") if privileged => Ok(MountPropagation::PropagationBidirectional),
        Some("Bidirectional") => Err(format!(
            "volumeMount {:?}: Bidirectional mount propagation is available only to privileged containers",
            m.name
        )),
        Some(other) => Err(format!("invalid MountPropagation mode: {other:?}")),
    }
}

pub fn container_config(i: ContainerInputs<'_>) -> Result<ContainerConfig, String> {
    let c = i.container;
    let env = container_env(i.pod, c, i.node, i.pod_ip, i.env_refs)?;
    let vars: HashMap<String, String> = env.iter().cloned().collect();
    // argv gets a budget of its own: the point is bounded work here; exec itself enforces
    // the combined ARG_MAX.
    let mut budget = Budget::default();
    let mut argv = |what: &str, list: &Option<Vec<String>>| -> Result<Vec<String>, String> {
        let list = list.iter().flatten().enumerate();
        list.map(|(n, s)| budget.expand(&format!("{what}[{n}]"), s, &vars))
            .collect()
    };
    let command = argv("command", &c.command)?;
    let args = argv("args", &c.args)?;
    let mut mounts = Vec::new();
    for m in c.volume_mounts.clone().unwrap_or_default() {
        let host = i.volumes.get(&m.name).ok_or_else(|| {
            format!(
                "volumeMount {:?}: the pod has no volume of that name",
                m.name
            )
        })?;
        // A subPath is never joined here: the volume service resolves it without following
        // symlinks out of the volume, and set_sub_path_mounts fills in its bind mount.
        let host_path = if has_sub_path(&m) {
            String::new()
        } else {
            host.clone()
        };
        mounts.push(Mount {
            container_path: m.mount_path.clone(),
            host_path,
            readonly: m.read_only.unwrap_or(false) || read_only_volume(i.pod, &m.name),
            propagation: mount_propagation(c, &m)? as i32,
            ..Default::default()
        });
    }
    let devices = block_devices(i.pod, c, i.volumes)?;
    if let Some(path) = c
        .termination_message_path
        .as_deref()
        .filter(|p| !p.is_empty())
    {
        let file =
            termination_message_file(&i.node.root_dir, k8s::pod_uid(i.pod), &c.name, i.attempt)
                .map_err(|e| format!("termination message file: {e}"))?;
        create_world_writable(&file)
            .map_err(|e| format!("termination message file {}: {e}", file.display()))?;
        mounts.push(Mount {
            container_path: path.to_string(),
            host_path: file.to_string_lossy().into_owned(),
            ..Default::default()
        });
    }
    let mut labels_map = HashMap::from([
        (
            labels::POD_NAME.to_string(),
            k8s::pod_name(i.pod).to_string(),
        ),
        (
            labels::POD_NAMESPACE.to_string(),
            k8s::pod_namespace(i.pod).to_string(),
        ),
        (labels::POD_UID.to_string(), k8s::pod_uid(i.pod).to_string()),
        (labels::CONTAINER_NAME.to_string(), c.name.clone()),
    ]);
    labels_map.insert(labels::KUBERNETES_MANAGED.into(), "nodeagent".into());
    let spec = i.pod.spec.clone().unwrap_or_default();
    let mut annotations = HashMap::from([
        (labels::CONTAINER_HASH.to_string(), container_hash(c)),
        (
            labels::CONTAINER_UPSTREAM_HASH.to_string(),
            upstream_hash(c),
        ),
        (
            labels::CONTAINER_RESTART_COUNT.to_string(),
            i.attempt.to_string(),
        ),
        (
            labels::CONTAINER_BACKOFF_BASE.to_string(),
            i.backoff_base.to_string(),
        ),
        (
            labels::CONTAINER_TERMINATION_MESSAGE_PATH.to_string(),
            c.termination_message_path.clone().unwrap_or_default(),
        ),
        (
            labels::CONTAINER_TERMINATION_MESSAGE_POLICY.to_string(),
            c.termination_message_policy.clone().unwrap_or_default(),
        ),
        (
            labels::POD_TERMINATION_GRACE_PERIOD.to_string(),
            spec.termination_grace_period_seconds
                .unwrap_or(30)
                .to_string(),
        ),
    ]);
    annotations.extend(restorable_annotations(c));
    Ok(ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: c.name.clone(),
            attempt: i.attempt,
        }),
        image: Some(ImageSpec {
            image: c.image.clone().unwrap_or_default(),
            ..Default::default()
        }),
        command,
        args,
        working_dir: c.working_dir.clone().unwrap_or_default(),
        envs: env
            .into_iter()
            .map(|(key, value)| KeyValue { key, value })
            .collect(),
        mounts,
        devices,
        labels: labels_map,
        annotations,
        log_path: HostPath::new(Path::new(""), &[&c.name, &format!("{}.log", i.attempt)])
            .map_err(|e| format!("container log path: {e}"))?
            .to_string_lossy(),
        stdin: c.stdin.unwrap_or(false),
        stdin_once: c.stdin_once.unwrap_or(false),
        tty: c.tty.unwrap_or(false),
        linux: Some(LinuxContainerConfig {
            resources: Some(linux_resources(i.pod, c, i.node)),
            security_context: Some(security_context(i.pod, c, i.node)?),
        }),
        ..Default::default()
    })
}

/// The container's block volumes as CRI devices (upstream's `makeBlockVolumes`): the
/// volume's host path (the pod's link to the published device) at the `devicePath` (which
/// must be absolute), `mrw`, or `r` when the claim is `readOnly`.
fn block_devices(
    pod: &Pod,
    c: &Container,
    volumes: &HashMap<String, String>,
) -> Result<Vec<nodeagent_proto::cri::Device>, String> {
    let specs = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
    c.volume_devices
        .iter()
        .flatten()
        .map(|d| {
            if !d.device_path.starts_with('/') {
                return Err(format!(
                    "error DevicePath `{}` must be an absolute path",
                    d.device_path
                ));
            }
            let host = volumes.get(&d.name).ok_or_else(|| {
                format!(
                    "cannot find volume {:?} to pass into container {:?}",
                    d.name, c.name
                )
            })?;
            let read_only = specs.into_iter().flatten().any(|v| {
                v.name == d.name
                    && v.persistent_volume_claim
                        .as_ref()
                        .is_some_and(|p| p.read_only == Some(true))
            });
            Ok(nodeagent_proto::cri::Device {
                container_path: d.device_path.clone(),
                host_path: host.clone(),
                permissions: if read_only { "r" } else { "mrw" }.to_string(),
            })
        })
        .collect()
}

fn has_sub_path(m: &VolumeMount) -> bool {
    m.sub_path.as_deref().is_some_and(|s| !s.is_empty())
        || m.sub_path_expr.as_deref().is_some_and(|s| !s.is_empty())
}

/// The container's subPath mounts, expanded (subPathExpr from the container's env, as
/// upstream `ExpandContainerVolumeMounts`) and checked (upstream `makeMounts`); the volume
/// service resolves and mounts them.
pub fn sub_path_mounts(
    c: &Container,
    env: &[(String, String)],
) -> Result<Vec<SubPathMount>, String> {
    let vars: HashMap<String, String> = env.iter().cloned().collect();
    let mut out = Vec::new();
    for (i, m) in c.volume_mounts.iter().flatten().enumerate() {
        let sub = match (
            m.sub_path.as_deref().filter(|s| !s.is_empty()),
            m.sub_path_expr.as_deref().filter(|s| !s.is_empty()),
        ) {
            (Some(sub), _) => sub.to_string(),
            (None, Some(expr)) => Budget::default().expand("subPathExpr", expr, &vars)?,
            (None, None) => continue,
        };
        if sub.starts_with('/') {
            return Err(format!(
                "error SubPath `{sub}` must not be an absolute path"
            ));
        }
        if let Err(e) = nodeagent_hostpath::relative_components(&sub) {
            return Err(format!("unable to provision SubPath `{sub}`: {e}"));
        }
        out.push(SubPathMount {
            volume_name: m.name.clone(),
            sub_path: sub,
            mount_index: i as u32,
        });
    }
    Ok(out)
}

/// Points each subPath mount of `config` at the bind mount the volume service prepared
/// (mount index -> host path); a subPath mount without one is an error, never the volume.
pub fn set_sub_path_mounts(
    config: &mut ContainerConfig,
    c: &Container,
    prepared: &HashMap<u32, String>,
) -> Result<(), String> {
    for (i, m) in c.volume_mounts.iter().flatten().enumerate() {
        if !has_sub_path(m) {
            continue;
        }
        let host = prepared
            .get(&(i as u32))
            .ok_or_else(|| format!("volumeMount {:?}: subPath was not prepared", m.name))?;
        for mount in config.mounts.iter_mut() {
            if mount.container_path == m.mount_path {
                mount.host_path = host.clone();
            }
        }
    }
    Ok(())
}

/// An empty file any container user can write its termination message into.
fn create_world_writable(file: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    // `<root>/pods/<uid>/containers/<name>/<attempt>`: the pod's directory is private, so
    // the file is writable by the container's user and by no other user of the node.
    if let Some(pod_dir) = file.ancestors().nth(4) {
        nodeagent_config::state::private_dir(pod_dir)?;
    }
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::File::create(file)?;
    std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o666))
}

/// CPU shares from the request, CFS quota from the limit, memory limit (upstream
/// `generateLinuxContainerResources` with the cgroupfs driver), the OOM score by QoS, and
/// with memory QoS the `memory.min` and `memory.high` of cgroup v2 (`unified`).
/// A container without a limit of its own in a pod with pod-level resources gets the
/// pod's limit (`getCPULimit`, `getMemoryLimit`), and without a CPU request the shares of
/// that limit, as upstream's `calculateLinuxResources` takes them.
pub fn linux_resources(pod: &Pod, c: &Container, node: &NodeContext) -> LinuxContainerResources {
    use nodeagent_config::pod_level::{Resource, effective_container_limit};
    let cpu_limit = effective_container_limit(pod, c, Resource::Cpu);
    let cpu_request = quantity::ContainerResources::of(c)
        .cpu_request
        .or(cpu_limit);
    let memory_limit = effective_container_limit(pod, c, Resource::Memory).unwrap_or(0);
    const PERIOD: i64 = 100_000;
    LinuxContainerResources {
        cpu_shares: cpu_request.map(|m| (m * 1024 / 1000).max(2)).unwrap_or(2),
        cpu_period: if cpu_limit.is_some() { PERIOD } else { 0 },
        cpu_quota: cpu_limit
            .map(|m| (m * PERIOD / 1000).max(1000))
            .unwrap_or(0),
        memory_limit_in_bytes: memory_limit,
        oom_score_adj: crate::container_manager::oom::container_oom_score_adj(
            pod,
            c,
            node.memory_capacity,
        ),
        unified: node
            .memory_qos
            .map(|q| q.container_unified(c))
            .unwrap_or_default(),
        ..Default::default()
    }
}

/// An ephemeral container's view of its target's processes (upstream's
/// `generateLinuxContainerConfig`): where the pod gives each container its own PID
/// namespace, the target container's is used (`NamespaceMode_TARGET`); where the pod
/// shares one (`shareProcessNamespace`, `hostPID`) the container is in it already.
pub fn target_pid_namespace(config: &mut ContainerConfig, target_id: &str) {
    let options = config
        .linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
        .and_then(|s| s.namespace_options.as_mut());
    if let Some(ns) = options.filter(|ns| ns.pid == NamespaceMode::Container as i32) {
        ns.pid = NamespaceMode::Target as i32;
        ns.target_id = target_id.to_string();
    }
}

/// The container's security context (upstream `determineEffectiveSecurityContext`): the
/// container's fields over the pod's. procMount Default leaves the runtime's masked and
/// read-only paths; what this node cannot enforce was refused at admission.
fn security_context(
    pod: &Pod,
    c: &Container,
    node: &NodeContext,
) -> Result<LinuxContainerSecurityContext, String> {
    let pod_sc = pod
        .spec
        .as_ref()
        .and_then(|s| s.security_context.clone())
        .unwrap_or_default();
    let sc = c.security_context.clone().unwrap_or_default();
    let caps = sc.capabilities.clone().unwrap_or_default();
    Ok(LinuxContainerSecurityContext {
        capabilities: Some(Capability {
            add_capabilities: caps.add.unwrap_or_default(),
            drop_capabilities: caps.drop.unwrap_or_default(),
            ..Default::default()
        }),
        privileged: sc.privileged.unwrap_or(false),
        namespace_options: Some(namespace_options(pod)),
        run_as_user: sc
            .run_as_user
            .or(pod_sc.run_as_user)
            .map(|value| nodeagent_proto::cri::Int64Value { value }),
        run_as_group: sc
            .run_as_group
            .or(pod_sc.run_as_group)
            .map(|value| nodeagent_proto::cri::Int64Value { value }),
        readonly_rootfs: sc.read_only_root_filesystem.unwrap_or(false),
        supplemental_groups: security::supplemental_groups(pod),
        supplemental_groups_policy: security::supplemental_groups_policy(pod),
        selinux_options: security::selinux_options(pod, Some(c)),
        no_new_privs: sc.allow_privilege_escalation == Some(false),
        seccomp: Some(security::container_seccomp(
            pod,
            c,
            &node.root_dir,
            node.seccomp_default,
        )?),
        apparmor: security::container_apparmor(pod, c),
        ..Default::default()
    })
}

/// What a restarted pod-sync needs to stop a container whose pod is gone (upstream
/// `newContainerAnnotations`): the preStop handler and the ports it may name, as JSON.
fn restorable_annotations(c: &Container) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if let Some(hook) = c.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref())
        && let Ok(json) = serde_json::to_string(hook)
    {
        out.push((labels::CONTAINER_PRE_STOP_HANDLER.to_string(), json));
    }
    if let Some(ports) = c.ports.as_ref().filter(|p| !p.is_empty())
        && let Ok(json) = serde_json::to_string(ports)
    {
        out.push((labels::CONTAINER_PORTS.to_string(), json));
    }
    out
}

mod env;
mod sandbox;
pub use env::*;
pub use sandbox::*;

#[cfg(test)]
mod tests;
