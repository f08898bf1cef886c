//! From a URL's namespace, pod name, optional UID and container name to the CRI container
//! or sandbox a stream goes to, as upstream: the pod must be one the node wants (pod-sync's
//! status snapshot, upstream's pod manager), and the container one of its running
//! containers (upstream's `findContainer` over the runtime's running pods).

use super::StreamError;
use crate::AppState;
use nodeagent_proto::cri::{ContainerState, PodSandboxState};
use nodeagent_proto::k8s::labels;
use serde::Deserialize;

/// The parts of a pod the streaming endpoints need.
#[derive(Debug, Clone)]
pub struct PodInfo {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    containers: Vec<ContainerSpec>,
}

impl PodInfo {
    /// Upstream's "full name", used in its messages: `name_namespace`.
    pub fn full_name(&self) -> String {
        format!("{}_{}", self.name, self.namespace)
    }

    /// The container's `tty` from the spec, if the spec has that container.
    pub fn tty(&self, container: &str) -> Option<bool> {
        self.containers
            .iter()
            .find(|c| c.name == container)
            .map(|c| c.tty)
    }
}

#[derive(Debug, Clone, Deserialize)]
struct ContainerSpec {
    name: String,
    #[serde(default)]
    tty: bool,
}

#[derive(Deserialize)]
struct PodDoc {
    metadata: Metadata,
    #[serde(default)]
    spec: Spec,
}

#[derive(Deserialize)]
struct Metadata {
    #[serde(default)]
    name: String,
    namespace: Option<String>,
    #[serde(default)]
    uid: String,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct Spec {
    containers: Vec<ContainerSpec>,
    init_containers: Vec<ContainerSpec>,
    ephemeral_containers: Vec<ContainerSpec>,
}

/// The pod the node wants under that name; 404 "pod does not exist" as upstream.
pub async fn find_pod(
    state: &AppState,
    namespace: &str,
    name: &str,
) -> Result<PodInfo, StreamError> {
    let pods = crate::pod_statuses(state.pod_sync.clone())
        .await
        .map_err(|e| {
            StreamError::Unavailable(format!("pod-sync is not available: {}", e.message()))
        })?;
    for json in pods {
        let Ok(doc) = serde_json::from_slice::<PodDoc>(&json) else {
            continue;
        };
        let ns = doc.metadata.namespace.as_deref().unwrap_or("default");
        if ns == namespace && doc.metadata.name == name {
            let Spec {
                mut containers,
                init_containers,
                ephemeral_containers,
            } = doc.spec;
            containers.extend(init_containers);
            containers.extend(ephemeral_containers);
            return Ok(PodInfo {
                namespace: ns.to_string(),
                name: doc.metadata.name,
                uid: doc.metadata.uid,
                containers,
            });
        }
    }
    Err(StreamError::NotFound("pod does not exist".into()))
}

/// The ID of the newest running container named `container` of the pod with `uid` (the
/// URL's, or the pod's own).
pub async fn running_container(
    state: &AppState,
    pod: &PodInfo,
    uid: Option<&str>,
    container: &str,
) -> Result<Option<String>, StreamError> {
    let uid = uid.unwrap_or(&pod.uid);
    let containers = state
        .cri
        .list_containers(Some(uid))
        .await
        .map_err(StreamError::Runtime)?;
    Ok(containers
        .into_iter()
        .filter(|c| {
            c.state == ContainerState::ContainerRunning as i32
                && c.labels.get(labels::CONTAINER_NAME).map(String::as_str) == Some(container)
                && c.labels.get(labels::POD_NAME) == Some(&pod.name)
                && c.labels.get(labels::POD_NAMESPACE) == Some(&pod.namespace)
        })
        .max_by_key(|c| c.created_at)
        .map(|c| c.id))
}

/// The ID of the pod's newest ready sandbox, for a port-forward.
pub async fn ready_sandbox(state: &AppState, pod: &PodInfo) -> Result<Option<String>, StreamError> {
    let sandboxes = state
        .cri
        .list_sandboxes(Some(&pod.uid))
        .await
        .map_err(StreamError::Runtime)?;
    Ok(sandboxes
        .into_iter()
        .filter(|s| s.state == PodSandboxState::SandboxReady as i32)
        .max_by_key(|s| s.created_at)
        .map(|s| s.id))
}
