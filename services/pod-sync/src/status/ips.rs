//! A pod's `podIPs` and the node's `hostIPs`, as upstream's kubelet picks them
//! (`kubelet_pods.go` sortPodIPs and generateAPIPodStatus, `pkg/util/node` GetNodeHostIPs).
//! Driven by upstream's own tables (`ips/tests.rs`).

use std::net::IpAddr;

/// The node's IPs as pods see them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeIps {
    /// `status.hostIPs`: the primary, and on a dual-stack node the other family's
    /// ([`node_host_ips`]).
    pub host_ips: Vec<String>,
    /// The first `--node-ip` is IPv6: pods' IPv6 address comes first ([`sort_pod_ips`]).
    pub ipv6_primary: bool,
}

impl NodeIps {
    /// From `--node-ip` (`configured`) or, without it, the address found on the machine
    /// (`detected`), each taken as one of the Node's InternalIPs.
    pub fn new(configured: &[IpAddr], addresses: &[String]) -> Self {
        let addresses: Vec<(&str, &str)> = addresses
            .iter()
            .map(|a| ("InternalIP", a.as_str()))
            .collect();
        Self {
            host_ips: node_host_ips(&addresses),
            ipv6_primary: configured.first().is_some_and(|ip| ip.is_ipv6()),
        }
    }

    /// A node with one IPv4 address (or none, given "").
    #[cfg(test)]
    pub fn single(ip: &str) -> Self {
        Self {
            host_ips: (!ip.is_empty())
                .then(|| ip.to_string())
                .into_iter()
                .collect(),
            ipv6_primary: false,
        }
    }

    /// `status.hostIP`: the primary one (empty when the node has none).
    pub fn host_ip(&self) -> &str {
        self.host_ips.first().map_or("", String::as_str)
    }
}

fn is_v6(ip: &str) -> Option<bool> {
    ip.parse::<IpAddr>().ok().map(|ip| ip.is_ipv6())
}

/// Upstream's `GetNodeHostIPs`: the node's primary IP (its first InternalIP, else its first
/// ExternalIP) and, on a dual-stack node, the first address of the other family.
/// `addresses` are (type, address) pairs as a Node's `status.addresses`.
pub fn node_host_ips(addresses: &[(&str, &str)]) -> Vec<String> {
    let all: Vec<&str> = ["InternalIP", "ExternalIP"]
        .iter()
        .flat_map(|t| {
            addresses
                .iter()
                .filter(move |(kind, _)| kind == t)
                .map(|(_, a)| *a)
        })
        .filter(|a| is_v6(a).is_some())
        .collect();
    let Some(first) = all.first() else {
        return Vec::new();
    };
    let mut ips = vec![first.to_string()];
    if let Some(other) = all.iter().find(|a| is_v6(a) != is_v6(first)) {
        ips.push(other.to_string());
    }
    ips
}

/// Upstream's `sortPodIPs`: of the runtime's IPs, in whatever number and order, the first
/// of the node's family (IPv4 unless the first `--node-ip` is IPv6), then the first of the
/// other family.
pub fn sort_pod_ips(ipv6_primary: bool, ips: &[String]) -> Vec<String> {
    let first_of = |v6: bool| ips.iter().find(|ip| is_v6(ip) == Some(v6)).cloned();
    first_of(ipv6_primary)
        .into_iter()
        .chain(first_of(!ipv6_primary))
        .collect()
}

/// A pod's `podIPs` (upstream's generateAPIPodStatus): the runtime's IPs sorted; a
/// host-network pod the runtime gave no IP has the node's, and one with a single IP gets
/// the node's IP of the other family too (kubernetes #105320).
pub fn pod_ips(
    ipv6_primary: bool,
    host_ips: &[String],
    runtime_ips: &[String],
    host_network: bool,
) -> Vec<String> {
    let mut ips = sort_pod_ips(ipv6_primary, runtime_ips);
    if host_network {
        if ips.is_empty()
            && let Some(primary) = host_ips.first()
        {
            ips.push(primary.clone());
        }
        if let ([one], [_, secondary]) = (ips.as_slice(), host_ips)
            && is_v6(one) != is_v6(secondary)
        {
            ips.push(secondary.clone());
        }
    }
    ips
}

#[cfg(test)]
mod tests;
