//! Upstream's tables from `pkg/kubelet/kubelet_pods_test.go`, row by row under their names:
//! `TestSortPodIPs`, `TestGenerateAPIPodStatusPodIPs`,
//! `TestGenerateAPIPodStatusHostNetworkPodIPs` and
//! `TestNodeAddressUpdatesGenerateAPIPodStatusHostNetworkPodIPs`. Upstream's `nodeIP` (the
//! kubelet's `--node-ip`) decides the primary family; its node addresses give the host IPs.

use super::*;

fn v(ips: &[&str]) -> Vec<String> {
    ips.iter().map(|s| s.to_string()).collect()
}

/// The `--node-ip` rows' family: IPv6 when the first is.
fn primary_v6(node_ip: &str) -> bool {
    is_v6(node_ip).unwrap_or(false)
}

/// (name, nodeIP, runtime IPs, expected): shared by `TestSortPodIPs` and
/// `TestGenerateAPIPodStatusPodIPs`, whose rows are the same.
const SORT_ROWS: [(&str, &str, &[&str], &[&str]); 11] = [
    ("Simple", "", &["10.0.0.1"], &["10.0.0.1"]),
    (
        "Dual-stack",
        "",
        &["10.0.0.1", "fd01::1234"],
        &["10.0.0.1", "fd01::1234"],
    ),
    (
        "Dual-stack with explicit node IP",
        "192.168.1.1",
        &["10.0.0.1", "fd01::1234"],
        &["10.0.0.1", "fd01::1234"],
    ),
    (
        "Dual-stack with CRI returning wrong family first",
        "",
        &["fd01::1234", "10.0.0.1"],
        &["10.0.0.1", "fd01::1234"],
    ),
    (
        "Dual-stack with explicit node IP with CRI returning wrong family first",
        "192.168.1.1",
        &["fd01::1234", "10.0.0.1"],
        &["10.0.0.1", "fd01::1234"],
    ),
    (
        "Dual-stack with IPv6 node IP",
        "fd00::5678",
        &["10.0.0.1", "fd01::1234"],
        &["fd01::1234", "10.0.0.1"],
    ),
    (
        "Dual-stack with IPv6 node IP, other CRI order",
        "fd00::5678",
        &["fd01::1234", "10.0.0.1"],
        &["fd01::1234", "10.0.0.1"],
    ),
    (
        "No Pod IP matching Node IP",
        "fd00::5678",
        &["10.0.0.1"],
        &["10.0.0.1"],
    ),
    (
        "No Pod IP matching (unspecified) Node IP",
        "",
        &["fd01::1234"],
        &["fd01::1234"],
    ),
    (
        "Multiple IPv4 IPs",
        "",
        &["10.0.0.1", "10.0.0.2", "10.0.0.3"],
        &["10.0.0.1"],
    ),
    (
        "Multiple Dual-Stack IPs",
        "",
        &[
            "10.0.0.1",
            "10.0.0.2",
            "fd01::1234",
            "10.0.0.3",
            "fd01::5678",
        ],
        &["10.0.0.1", "fd01::1234"],
    ),
];

#[test]
fn test_sort_pod_ips() {
    for (name, node_ip, ips, want) in SORT_ROWS {
        assert_eq!(
            sort_pod_ips(primary_v6(node_ip), &v(ips)),
            v(want),
            "{name}"
        );
    }
}

#[test]
fn test_generate_api_pod_status_pod_ips() {
    for (name, node_ip, ips, want) in SORT_ROWS {
        let got = pod_ips(primary_v6(node_ip), &[], &v(ips), false);
        assert_eq!(got, v(want), "{name}");
    }
}

const INTERNAL: &str = "InternalIP";
const EXTERNAL: &str = "ExternalIP";

#[test]
fn test_generate_api_pod_status_host_network_pod_ips() {
    type Row<'a> = (
        &'a str,
        &'a [(&'a str, &'a str)],
        &'a [&'a str],
        &'a [&'a str],
    );
    let rows: [Row; 8] = [
        ("Simple", &[(INTERNAL, "10.0.0.1")], &[], &["10.0.0.1"]),
        (
            "InternalIP is preferred over ExternalIP",
            &[(EXTERNAL, "192.168.0.1"), (INTERNAL, "10.0.0.1")],
            &[],
            &["10.0.0.1"],
        ),
        (
            "Single-stack addresses in dual-stack cluster",
            &[(INTERNAL, "10.0.0.1")],
            &[],
            &["10.0.0.1"],
        ),
        (
            "Multiple single-stack addresses in dual-stack cluster",
            &[
                (INTERNAL, "10.0.0.1"),
                (INTERNAL, "10.0.0.2"),
                (EXTERNAL, "192.168.0.1"),
            ],
            &[],
            &["10.0.0.1"],
        ),
        (
            "Dual-stack addresses in dual-stack cluster",
            &[(INTERNAL, "10.0.0.1"), (INTERNAL, "fd01::1234")],
            &[],
            &["10.0.0.1", "fd01::1234"],
        ),
        (
            "CRI PodIPs override NodeAddresses",
            &[(INTERNAL, "10.0.0.1"), (INTERNAL, "fd01::1234")],
            &["192.168.0.1"],
            &["192.168.0.1", "fd01::1234"],
        ),
        (
            "CRI dual-stack PodIPs override NodeAddresses",
            &[(INTERNAL, "10.0.0.1"), (INTERNAL, "fd01::1234")],
            &["192.168.0.1", "2001:db8::2"],
            &["192.168.0.1", "2001:db8::2"],
        ),
        (
            // By default the cluster prefers IPv4.
            "CRI dual-stack PodIPs override NodeAddresses prefer IPv4",
            &[(INTERNAL, "10.0.0.1"), (INTERNAL, "fd01::1234")],
            &["2001:db8::2", "192.168.0.1"],
            &["192.168.0.1", "2001:db8::2"],
        ),
    ];
    for (name, addresses, runtime, want) in rows {
        let host_ips = node_host_ips(addresses);
        let got = pod_ips(false, &host_ips, &v(runtime), true);
        assert_eq!(got, v(want), "{name}");
        if runtime.is_empty() {
            assert_eq!(host_ips[0], got[0], "{name}: hostIP is podIPs[0]");
        }
    }
}

#[test]
fn test_node_address_updates_generate_api_pod_status_host_network_pod_ips() {
    type Row<'a> = (
        &'a str,
        &'a [&'a str],
        &'a [(&'a str, &'a str)],
        &'a [&'a str],
    );
    let rows: [Row; 5] = [
        (
            "Immutable after update node addresses single-stack",
            &["10.0.0.1"],
            &[(INTERNAL, "1.1.1.1")],
            &["10.0.0.1"],
        ),
        (
            "Immutable after update node addresses dual-stack - primary address",
            &["10.0.0.1", "2001:db8::2"],
            &[(INTERNAL, "1.1.1.1"), (INTERNAL, "2001:db8::2")],
            &["10.0.0.1", "2001:db8::2"],
        ),
        (
            "Immutable after update node addresses dual-stack - secondary address",
            &["10.0.0.1", "2001:db8::2"],
            &[(INTERNAL, "10.0.0.1"), (INTERNAL, "2001:db8:1:2:3::2")],
            &["10.0.0.1", "2001:db8::2"],
        ),
        (
            "Immutable after update node addresses dual-stack - primary and secondary address",
            &["10.0.0.1", "2001:db8::2"],
            &[(INTERNAL, "1.1.1.1"), (INTERNAL, "2001:db8:1:2:3::2")],
            &["10.0.0.1", "2001:db8::2"],
        ),
        (
            "Update secondary after new secondary address dual-stack",
            &["10.0.0.1"],
            &[(INTERNAL, "10.0.0.1"), (INTERNAL, "2001:db8::2")],
            &["10.0.0.1", "2001:db8::2"],
        ),
    ];
    for (name, node_ips, addresses, want) in rows {
        // The runtime reports the node's IPs (upstream's podStatus.IPs = nodeIPs).
        let got = pod_ips(
            primary_v6(node_ips[0]),
            &node_host_ips(addresses),
            &v(node_ips),
            true,
        );
        assert_eq!(got, v(want), "{name}");
        assert_eq!(got[0], node_ips[0], "{name}: the node IP is podIPs[0]");
    }
}

#[test]
fn node_host_ips_ignore_what_is_not_an_address() {
    // Ours: a Hostname entry, or an unparsable InternalIP, is no host IP.
    assert_eq!(
        node_host_ips(&[
            ("Hostname", "n1"),
            (INTERNAL, "bogus"),
            (INTERNAL, "fd00::1")
        ]),
        v(&["fd00::1"])
    );
    assert!(node_host_ips(&[]).is_empty());
}
