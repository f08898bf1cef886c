//! The sandbox's CRI config: its labels, namespaces, DNS (the node's resolv.conf, the
//! cluster's DNS, the pod's own `dnsConfig`) and the rest of RunPodSandbox's request.

use super::*;

pub(crate) fn pod_labels(pod: &Pod) -> HashMap<String, String> {
    let mut l: HashMap<String, String> = pod
        .metadata
        .labels
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    l.insert(labels::POD_NAME.into(), k8s::pod_name(pod).into());
    l.insert(labels::POD_NAMESPACE.into(), k8s::pod_namespace(pod).into());
    l.insert(labels::POD_UID.into(), k8s::pod_uid(pod).into());
    l
}

pub(crate) fn namespace_options(pod: &Pod) -> NamespaceOption {
    let spec = pod.spec.clone().unwrap_or_default();
    let mode = |host: Option<bool>, shared: NamespaceMode| {
        if host.unwrap_or(false) {
            NamespaceMode::Node as i32
        } else {
            shared as i32
        }
    };
    let pid_shared = if spec.share_process_namespace.unwrap_or(false) {
        NamespaceMode::Pod
    } else {
        NamespaceMode::Container
    };
    NamespaceOption {
        network: mode(spec.host_network, NamespaceMode::Pod),
        pid: mode(spec.host_pid, pid_shared),
        ipc: mode(spec.host_ipc, NamespaceMode::Pod),
        ..Default::default()
    }
}

pub fn sandbox_config(pod: &Pod, attempt: u32, node: &NodeContext) -> PodSandboxConfig {
    let spec = pod.spec.clone().unwrap_or_default();
    let host_network = spec.host_network.unwrap_or(false);
    let hostname = if host_network {
        String::new()
    } else {
        let mut h = spec
            .hostname
            .clone()
            .unwrap_or_else(|| k8s::pod_name(pod).to_string());
        h.truncate(63);
        h.trim_end_matches(['-', '.']).to_string()
    };
    let port_mappings = spec
        .containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .filter(|p| p.host_port.unwrap_or(0) > 0)
        .map(|p| PortMapping {
            protocol: match p.protocol.as_deref() {
                Some("UDP") => Protocol::Udp as i32,
                Some("SCTP") => Protocol::Sctp as i32,
                _ => Protocol::Tcp as i32,
            },
            container_port: p.container_port,
            host_port: p.host_port.unwrap_or(0),
            host_ip: p.host_ip.clone().unwrap_or_default(),
        })
        .collect();
    let cgroup_parent = crate::container_manager::cgroups::pod_cgroup_parent(
        pod,
        node.cgroups_per_qos,
        &node.cgroup_root,
        node.cgroup_driver,
    )
    .unwrap_or_default();
    PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: k8s::pod_name(pod).into(),
            uid: k8s::pod_uid(pod).into(),
            namespace: k8s::pod_namespace(pod).into(),
            attempt,
        }),
        hostname,
        // check_pod_paths refused a pod without a safe log dir before any sandbox.
        log_directory: pod_log_dir(&node.pod_logs_dir, pod)
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default(),
        dns_config: Some(dns_config(pod, node)),
        port_mappings,
        labels: pod_labels(pod),
        annotations: pod
            .metadata
            .annotations
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect(),
        linux: Some(LinuxPodSandboxConfig {
            cgroup_parent,
            security_context: Some(LinuxSandboxSecurityContext {
                namespace_options: Some(namespace_options(pod)),
                privileged: spec.containers.iter().any(|c| {
                    c.security_context
                        .as_ref()
                        .and_then(|s| s.privileged)
                        .unwrap_or(false)
                }),
                seccomp: security::pod_seccomp(pod, &node.root_dir, node.seccomp_default),
                supplemental_groups: security::supplemental_groups(pod),
                supplemental_groups_policy: security::supplemental_groups_policy(pod),
                selinux_options: security::selinux_options(pod, None),
                ..Default::default()
            }),
            sysctls: security::sandbox_sysctls(pod),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// DNS as upstream `dns.GetPodDNS`: ClusterFirst (falls back to the host's resolv.conf
/// when no clusterDNS is configured), Default, None, plus `dnsConfig`.
pub(crate) fn dns_config(pod: &Pod, node: &NodeContext) -> DnsConfig {
    let spec = pod.spec.clone().unwrap_or_default();
    let host = read_resolv_conf(&node.resolv_conf);
    let mut policy = spec
        .dns_policy
        .clone()
        .unwrap_or_else(|| "ClusterFirst".into());
    if policy == "ClusterFirstWithHostNet" {
        policy = "ClusterFirst".into();
    } else if policy == "ClusterFirst" && spec.host_network.unwrap_or(false) {
        policy = "Default".into();
    }
    let mut cfg = match policy.as_str() {
        "None" => DnsConfig::default(),
        "ClusterFirst" if !node.cluster_dns.is_empty() => {
            let ns = k8s::pod_namespace(pod);
            let d = &node.cluster_domain;
            let mut searches = vec![format!("{ns}.svc.{d}"), format!("svc.{d}"), d.clone()];
            searches.extend(host.searches.clone());
            DnsConfig {
                servers: node.cluster_dns.clone(),
                searches,
                options: vec!["ndots:5".into()],
            }
        }
        _ => host,
    };
    if let Some(extra) = &spec.dns_config {
        cfg.servers
            .extend(extra.nameservers.clone().unwrap_or_default());
        cfg.searches
            .extend(extra.searches.clone().unwrap_or_default());
        for o in extra.options.clone().unwrap_or_default() {
            let opt = match o.value {
                Some(v) => format!("{}:{v}", o.name.unwrap_or_default()),
                None => o.name.unwrap_or_default(),
            };
            cfg.options
                .retain(|x| x.split(':').next() != opt.split(':').next());
            cfg.options.push(opt);
        }
    }
    cfg
}

pub(crate) fn read_resolv_conf(path: &Path) -> DnsConfig {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut cfg = DnsConfig::default();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        match words.next() {
            Some("nameserver") => cfg.servers.extend(words.next().map(String::from)),
            Some("search") | Some("domain") => cfg.searches.extend(words.map(String::from)),
            Some("options") => cfg.options.extend(words.map(String::from)),
            _ => {}
        }
    }
    cfg
}
