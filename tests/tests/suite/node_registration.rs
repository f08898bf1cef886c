//! The Node as node-status registers and updates it, judged by what upstream's kubelet
//! does: `--node-labels`, `--register-with-taints`, `--provider-id`, `--node-ip` and
//! `--cloud-provider=external` at registration (upstream's `initialNode` and its
//! `NodeAddress` setter), and a status update that leaves what other writers set alone
//! (upstream's `PatchNodeStatus`: a two-way strategic merge patch from the Node it read):
//! node-problem-detector's condition, the CNI's `NetworkUnavailable`, a cloud controller's
//! address.

use k8s_openapi::api::core::v1::Node as KubeNode;
use kube::Api;
use kube::api::{Patch, PatchParams};
use nodeagent_config::Service;
use nodeagent_tests::{Node, NodeOptions, eventually, require_runtime};
use serde_json::{Value, json};
use std::time::Duration;

/// The status fields of `node` as JSON.
async fn node_json(nodes: &Api<KubeNode>, name: &str) -> Result<Value, String> {
    let node = nodes.get(name).await.map_err(|e| e.to_string())?;
    Ok(serde_json::to_value(node).unwrap())
}

fn condition<'a>(node: &'a Value, kind: &str) -> Option<&'a Value> {
    node["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_registers_with_its_flags_and_keeps_what_others_wrote() {
    if !require_runtime("node_registration") {
        return;
    }
    let flags = [
        "--node-labels=pool=blue,node.kubernetes.io/exclude-from-external-load-balancers=",
        "--register-with-taints=dedicated=infra:NoSchedule",
        "--provider-id=test://zone-a/node-1",
        "--node-ip=127.0.0.1",
        "--cloud-provider=external",
    ];
    let (server, node) = Node::start_with_api_server(
        "noderegistration",
        NodeOptions {
            extra_config: "nodeStatusUpdateFrequency: 1s\nnodeStatusReportFrequency: 1s\n".into(),
            service_args: vec![(
                Service::NodeStatus,
                flags.iter().map(|f| f.to_string()).collect(),
            )],
            ..Default::default()
        },
    )
    .await;
    let nodes: Api<KubeNode> = Api::all(server.client());
    let name = node.name.clone();
    let registered = eventually("the Node registered Ready", Duration::from_secs(60), || {
        let nodes = nodes.clone();
        let name = name.clone();
        async move {
            let n = node_json(&nodes, &name).await?;
            match condition(&n, "Ready") {
                Some(c) if c["status"] == "True" => Ok(n),
                other => Err(format!("Ready: {other:?}")),
            }
        }
    })
    .await;

    // Registration, as upstream's initialNode.
    let labels = &registered["metadata"]["labels"];
    assert_eq!(labels["pool"], "blue", "{labels}");
    assert_eq!(
        labels["node.kubernetes.io/exclude-from-external-load-balancers"],
        ""
    );
    assert_eq!(labels["kubernetes.io/hostname"], name.as_str());
    assert_eq!(
        registered["spec"]["taints"],
        json!([
            {"key": "dedicated", "value": "infra", "effect": "NoSchedule"},
            {"key": "node.cloudprovider.kubernetes.io/uninitialized", "value": "true",
             "effect": "NoSchedule"},
        ])
    );
    assert_eq!(registered["spec"]["providerID"], "test://zone-a/node-1");
    assert_eq!(
        registered["metadata"]["annotations"]["alpha.kubernetes.io/provided-node-ip"],
        "127.0.0.1"
    );
    assert_eq!(
        registered["status"]["addresses"],
        json!([
            {"type": "InternalIP", "address": "127.0.0.1"},
            {"type": "Hostname", "address": name},
        ])
    );

    // Other writers: node-problem-detector's condition, the CNI's NetworkUnavailable, the
    // cloud controller's addresses (with --cloud-provider=external the Node's addresses
    // are the cloud controller's once it set them).
    let heartbeat = |n: &Value| condition(n, "Ready").unwrap()["lastHeartbeatTime"].clone();
    let their_addresses = json!([
        {"type": "InternalIP", "address": "10.1.2.3"},
        {"type": "ExternalIP", "address": "203.0.113.7"},
        {"type": "Hostname", "address": name},
    ]);
    let theirs = json!({"status": {
        "conditions": [
            {"type": "KernelDeadlock", "status": "False", "reason": "KernelHasNoDeadlock",
             "message": "kernel has no deadlock"},
            {"type": "NetworkUnavailable", "status": "False", "reason": "RouteCreated",
             "message": "RouteController created a route"},
        ],
        // The whole list, as the cloud controller sends it.
        "addresses": [
            their_addresses[0], their_addresses[1], their_addresses[2], {"$patch": "replace"},
        ],
    }});
    let written = nodes
        .patch_status(&name, &PatchParams::default(), &Patch::Strategic(&theirs))
        .await
        .unwrap();
    let written = serde_json::to_value(written).unwrap();
    // Three more of our status updates (a heartbeat every second).
    let mut seen = heartbeat(&written);
    for round in 0..3 {
        let before = seen.clone();
        let after = eventually(
            "node-status's next heartbeat",
            Duration::from_secs(30),
            || {
                let nodes = nodes.clone();
                let name = name.clone();
                let before = before.clone();
                async move {
                    let n = node_json(&nodes, &name).await?;
                    if heartbeat(&n) != before {
                        Ok(n)
                    } else {
                        Err(format!("heartbeat still {before}"))
                    }
                }
            },
        )
        .await;
        for kind in ["KernelDeadlock", "NetworkUnavailable"] {
            let c = condition(&after, kind)
                .unwrap_or_else(|| panic!("round {round}: {kind} went: {after}"));
            assert_eq!(c["status"], "False", "{kind}: {c}");
        }
        assert_eq!(
            after["status"]["addresses"], their_addresses,
            "round {round}: the cloud controller's addresses were overwritten"
        );
        assert_eq!(condition(&after, "Ready").unwrap()["status"], "True");
        seen = heartbeat(&after);
    }
    node.stop().await;
    drop(server);
}

/// Without a cloud provider the addresses are node-status's (upstream's `NodeAddress`
/// setter), yet an address of a type it does not set stays, as does every condition
/// another writer set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_addresses_are_ours_and_an_external_ip_stays() {
    if !require_runtime("node_registration") {
        return;
    }
    let (server, node) = Node::start_with_api_server(
        "nodeaddresses",
        NodeOptions {
            extra_config: "nodeStatusUpdateFrequency: 1s\nnodeStatusReportFrequency: 1s\n".into(),
            service_args: vec![(Service::NodeStatus, vec!["--node-ip=127.0.0.1".into()])],
            ..Default::default()
        },
    )
    .await;
    let nodes: Api<KubeNode> = Api::all(server.client());
    let name = node.name.clone();
    eventually("the Node registered", Duration::from_secs(60), || {
        let nodes = nodes.clone();
        let name = name.clone();
        async move { node_json(&nodes, &name).await.map(|_| ()) }
    })
    .await;
    nodes
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Strategic(json!({"status": {
                "conditions": [{"type": "FrequentKubeletRestart", "status": "False"}],
                "addresses": [
                    {"type": "InternalIP", "address": "10.9.9.9"},
                    {"type": "ExternalIP", "address": "203.0.113.8"},
                ],
            }})),
        )
        .await
        .unwrap();
    eventually(
        "node-status to put its InternalIP back, keeping the ExternalIP and the condition",
        Duration::from_secs(30),
        || {
            let nodes = nodes.clone();
            let name = name.clone();
            async move {
                let n = node_json(&nodes, &name).await?;
                let addresses = &n["status"]["addresses"];
                let want = json!([
                    {"type": "InternalIP", "address": "127.0.0.1"},
                    {"type": "Hostname", "address": name},
                    {"type": "ExternalIP", "address": "203.0.113.8"},
                ]);
                if *addresses != want {
                    return Err(format!("addresses {addresses}"));
                }
                match condition(&n, "FrequentKubeletRestart") {
                    Some(_) => Ok(()),
                    None => Err(format!("FrequentKubeletRestart went: {n}")),
                }
            }
        },
    )
    .await;
    node.stop().await;
    drop(server);
}
