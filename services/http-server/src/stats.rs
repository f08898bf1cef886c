//! `/stats/summary` (the Summary API, `stats.k8s.io/v1alpha1`) and `/runningpods/` (the
//! pods as the runtime sees them), as upstream's `pkg/kubelet/server/stats` and
//! `handleRunningPods`.

pub use nodeagent_config::cgroupfs as cgroup;
pub mod collect;
pub mod host;
pub mod process;
mod sample;
pub mod system;
pub mod types;
pub mod volumes;

use crate::AppState;
use axum::Router;
use axum::extract::{RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use nodeagent_proto::cri::{ContainerState, PodSandboxState};
use std::collections::BTreeMap;
use std::sync::Arc;

pub fn routes() -> Router<Arc<AppState>> {
    Router::new().route("/stats/summary", get(summary))
}

pub fn running_pods_routes() -> Router<Arc<AppState>> {
    Router::new().route("/runningpods/", get(running_pods))
}

fn json(body: String) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// Upstream's `handleError`: 500 with "Internal Error: ...".
fn internal_error(what: &str, e: impl std::fmt::Display) -> Response {
    tracing::warn!(error = %e, "{what}");
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("Internal Error: {what}: {e}"),
    )
        .into_response()
}

/// `only_cpu_and_memory` as upstream reads it: given once and parsed as a Go bool; any
/// other value (or a repeated one) means false.
fn only_cpu_and_memory(query: Option<&str>) -> bool {
    let values: Vec<&str> = query
        .unwrap_or_default()
        .split('&')
        .filter_map(|kv| kv.split_once('=').or(Some((kv, ""))))
        .filter(|(k, _)| *k == "only_cpu_and_memory")
        .map(|(_, v)| v)
        .collect();
    matches!(
        values.as_slice(),
        ["1" | "t" | "T" | "true" | "TRUE" | "True"]
    )
}

async fn summary(State(state): State<Arc<AppState>>, RawQuery(query): RawQuery) -> Response {
    let only = only_cpu_and_memory(query.as_deref());
    match collect::collect(&state, only).await {
        Ok(collected) => match serde_json::to_string(&collected.summary) {
            Ok(body) => json(body),
            Err(e) => internal_error("failed to encode the summary", e),
        },
        Err(e) => internal_error("failed to get the runtime's pods", e.message()),
    }
}

/// Upstream's `kubecontainer.Pod.ToAPIPod`: name, namespace, UID and each running
/// container's name and image, for every pod with a ready sandbox.
async fn running_pods(State(state): State<Arc<AppState>>) -> Response {
    let (sandboxes, containers) = tokio::join!(
        state.cri.list_sandboxes(None),
        state.cri.list_containers(None)
    );
    let (sandboxes, containers) = match (sandboxes, containers) {
        (Ok(s), Ok(c)) => (s, c),
        (Err(e), _) | (_, Err(e)) => {
            return internal_error("failed to list the runtime's pods", e.message());
        }
    };
    let mut pods: BTreeMap<String, serde_json::Value> = BTreeMap::new();
    let mut sandbox_pod: BTreeMap<String, String> = BTreeMap::new();
    for sb in sandboxes {
        let Some(md) = sb.metadata else { continue };
        if sb.state != PodSandboxState::SandboxReady as i32 {
            continue;
        }
        sandbox_pod.insert(sb.id.clone(), md.uid.clone());
        pods.entry(md.uid.clone()).or_insert_with(|| {
            serde_json::json!({
                "metadata": {
                    "name": md.name,
                    "namespace": md.namespace,
                    "uid": md.uid,
                    "creationTimestamp": null,
                },
                "spec": {"containers": []},
                "status": {},
            })
        });
    }
    let mut running: Vec<_> = containers
        .into_iter()
        .filter(|c| c.state == ContainerState::ContainerRunning as i32)
        .collect();
    running.sort_by_key(|c| c.created_at);
    for c in running {
        let Some(pod) = sandbox_pod
            .get(&c.pod_sandbox_id)
            .and_then(|uid| pods.get_mut(uid))
        else {
            continue;
        };
        let container = serde_json::json!({
            "name": c.metadata.map(|m| m.name).unwrap_or_default(),
            "image": c.image.map(|i| i.image).unwrap_or_default(),
            "resources": {},
        });
        if let Some(list) = pod["spec"]["containers"].as_array_mut() {
            list.push(container);
        }
    }
    let list = serde_json::json!({
        "kind": "PodList",
        "apiVersion": "v1",
        "metadata": {},
        "items": pods.into_values().collect::<Vec<_>>(),
    });
    json(list.to_string())
}

#[cfg(test)]
mod tests {
    use super::only_cpu_and_memory;

    #[test]
    fn only_cpu_and_memory_reads_as_upstream() {
        assert!(only_cpu_and_memory(Some("only_cpu_and_memory=true")));
        assert!(only_cpu_and_memory(Some("a=b&only_cpu_and_memory=1")));
        assert!(!only_cpu_and_memory(Some("only_cpu_and_memory=yes")));
        assert!(!only_cpu_and_memory(Some(
            "only_cpu_and_memory=true&only_cpu_and_memory=true"
        )));
        assert!(!only_cpu_and_memory(None));
    }
}
