//! A pod's status as /pods shows it (JSON), and waits on its containers.

use crate::{Node, eventually};
use serde_json::Value;
use std::time::Duration;

/// The status of container `name` of `pod`, a regular or an init container (a pod's
/// container names are unique across both).
pub fn container_status<'a>(pod: &'a Value, name: &str) -> Option<&'a Value> {
    ["containerStatuses", "initContainerStatuses"]
        .iter()
        .filter_map(|k| pod["status"][k].as_array())
        .flatten()
        .find(|c| c["name"] == name)
}

/// Whether container `name` of `pod` is running.
pub fn is_running(pod: &Value, name: &str) -> bool {
    container_status(pod, name).is_some_and(|c| c["state"]["running"].is_object())
}

impl Node {
    /// Waits up to `deadline` for /pods to show container `c` of pod `pod` (the name before
    /// the node suffix) running and returns its CRI id.
    pub async fn running_container(&self, pod: &str, c: &str, deadline: Duration) -> String {
        eventually(&format!("{pod}/{c} running"), deadline, || async {
            let p = self.pod(pod).await?;
            if !is_running(&p, c) {
                return Err(p["status"].to_string());
            }
            self.container_id(pod, c)
                .await
                .ok_or_else(|| "no CRI container".to_string())
        })
        .await
    }

    /// Waits up to `deadline` for /pods to show pod `pod` in `phase`, and returns it.
    pub async fn pod_in_phase(&self, pod: &str, phase: &str, deadline: Duration) -> Value {
        eventually(&format!("{pod} {phase}"), deadline, || async {
            let p = self.pod(pod).await?;
            (p["status"]["phase"] == phase)
                .then(|| p.clone())
                .ok_or_else(|| p["status"].to_string())
        })
        .await
    }

    /// What a user watches of pod `pod` in /pods: its phase, its Ready condition, and its
    /// first container's id and restart count (`null` where missing).
    pub async fn watched(&self, pod: &str) -> [Value; 4] {
        let p = self.pod(pod).await.unwrap_or(Value::Null);
        let ready = p["status"]["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
            .map(|c| c["status"].clone())
            .unwrap_or(Value::Null);
        let c = &p["status"]["containerStatuses"][0];
        [
            p["status"]["phase"].clone(),
            ready,
            c["containerID"].clone(),
            c["restartCount"].clone(),
        ]
    }

    /// The Node as node-status serves it (GetNode), as JSON.
    pub async fn node_object(&self) -> Result<Value, String> {
        let mut client = nodeagent_proto::api::node_status_client::NodeStatusClient::new(
            nodeagent_transport::connect(&self.socket(nodeagent_config::Service::NodeStatus)),
        );
        let resp = client
            .get_node(nodeagent_proto::api::GetNodeRequest {})
            .await
            .map_err(|e| e.message().to_string())?
            .into_inner();
        serde_json::from_slice(&resp.node_json).map_err(|e| e.to_string())
    }

    /// Waits up to `deadline` for /pods to show container `c` of pod `pod` waiting with
    /// `reason` and returns the waiting message.
    pub async fn waiting_message(
        &self,
        pod: &str,
        c: &str,
        reason: &str,
        deadline: Duration,
    ) -> String {
        let what = format!("{pod}/{c} waiting with {reason}");
        eventually(&what, deadline, || async {
            let p = self.pod(pod).await?;
            let w = &container_status(&p, c).ok_or("no status")?["state"]["waiting"];
            if w["reason"] == reason {
                Ok(w["message"].as_str().unwrap_or_default().to_string())
            } else {
                Err(p["status"].to_string())
            }
        })
        .await
    }
}

/// The successful readiness results in the snapshot of the probe instance serving at
/// `socket` (what it has proved ready).
pub async fn ready_results(
    socket: &nodeagent_config::Address,
) -> Result<Vec<nodeagent_proto::api::ProbeResult>, String> {
    use nodeagent_proto::api::probe_result::{Kind, Outcome};
    let mut client = nodeagent_proto::api::prober_client::ProberClient::new(
        nodeagent_transport::connect(socket),
    )
    .max_decoding_message_size(usize::MAX);
    let mut stream = client
        .watch(nodeagent_proto::api::WatchProbeResultsRequest::default())
        .await
        .map_err(|e| e.to_string())?
        .into_inner();
    let snapshot = stream
        .message()
        .await
        .map_err(|e| e.to_string())?
        .ok_or("no snapshot")?;
    Ok(snapshot
        .results
        .into_iter()
        .filter(|r| r.kind() == Kind::Readiness && r.outcome() == Outcome::Success)
        .collect())
}
