//! Conversions between the wire form of Kubernetes objects (canonical JSON) and
//! k8s-openapi types, and the label and annotation names the upstream kubelet puts on
//! CRI objects, so that our pods are recognised by upstream tools (crictl) and by a
//! restarted pod-sync.

use k8s_openapi::api::core::v1::{Node, Pod};

/// Labels and annotations on CRI sandboxes and containers (upstream `pkg/kubelet/types`).
pub mod labels {
    pub const POD_NAME: &str = "io.kubernetes.pod.name";
    pub const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
    pub const POD_UID: &str = "io.kubernetes.pod.uid";
    pub const CONTAINER_NAME: &str = "io.kubernetes.container.name";
    pub const CONTAINER_HASH: &str = "io.kubernetes.container.hash";
    pub const CONTAINER_RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
    pub const CONTAINER_TERMINATION_MESSAGE_PATH: &str =
        "io.kubernetes.container.terminationMessagePath";
    pub const CONTAINER_TERMINATION_MESSAGE_POLICY: &str =
        "io.kubernetes.container.terminationMessagePolicy";
    pub const POD_TERMINATION_GRACE_PERIOD: &str = "io.kubernetes.pod.terminationGracePeriod";
    /// The container's preStop handler as JSON, to run it when the pod spec is gone.
    pub const CONTAINER_PRE_STOP_HANDLER: &str = "io.kubernetes.container.preStopHandler";
    /// The container's ports as JSON (a preStop httpGet may name one).
    pub const CONTAINER_PORTS: &str = "io.kubernetes.container.ports";
    /// Our own: the restart count at the last crash-loop back-off reset.
    pub const CONTAINER_BACKOFF_BASE: &str = "nodeagent.io/backoff-base";
    /// The hash of what upstream's HashContainer covers (name and image): a running
    /// container is replaced only when it changes (an agent upgrade or an in-place
    /// resize changes nothing of it).
    pub const CONTAINER_UPSTREAM_HASH: &str = "nodeagent.io/container-hash";
    /// The infra ("pause") container name upstream tools expect on a sandbox.
    pub const POD_INFRA_CONTAINER_NAME: &str = "POD";
    pub const KUBERNETES_MANAGED: &str = "io.kubernetes.managed-by";

    /// Pod annotations set by the pod sources (upstream `kubetypes.Config*AnnotationKey`).
    pub const CONFIG_SOURCE: &str = "kubernetes.io/config.source";
    pub const CONFIG_HASH: &str = "kubernetes.io/config.hash";
    pub const CONFIG_SEEN: &str = "kubernetes.io/config.seen";
    pub const CONFIG_MIRROR: &str = "kubernetes.io/config.mirror";
}

/// A Kubernetes object that could not be read from the wire.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// The bytes are not the JSON of the expected kind.
    #[error("invalid {kind} JSON: {source}")]
    Json {
        kind: &'static str,
        source: serde_json::Error,
    },
}

pub fn decode_pod(bytes: &[u8]) -> Result<Pod, DecodeError> {
    serde_json::from_slice(bytes).map_err(|source| DecodeError::Json {
        kind: "Pod",
        source,
    })
}

pub fn encode_pod(pod: &Pod) -> Vec<u8> {
    // Serialising a k8s-openapi type to JSON cannot fail: every field is plain data.
    serde_json::to_vec(pod).unwrap_or_default()
}

pub fn decode_node(bytes: &[u8]) -> Result<Node, DecodeError> {
    serde_json::from_slice(bytes).map_err(|source| DecodeError::Json {
        kind: "Node",
        source,
    })
}

pub fn encode_node(node: &Node) -> Vec<u8> {
    serde_json::to_vec(node).unwrap_or_default()
}

/// The pod's UID, or "" when unset.
/// An ephemeral container as the container it runs as (upstream converts its
/// `EphemeralContainerCommon` to a `v1.Container`; `targetContainerName` is not one of
/// its fields, and the API server refuses the fields a container has that it may not).
pub fn ephemeral_as_container(
    e: &k8s_openapi::api::core::v1::EphemeralContainer,
) -> k8s_openapi::api::core::v1::Container {
    serde_json::to_value(e)
        .and_then(serde_json::from_value)
        .unwrap_or_else(|_| k8s_openapi::api::core::v1::Container {
            name: e.name.clone(),
            image: e.image.clone(),
            ..Default::default()
        })
}

pub fn pod_uid(pod: &Pod) -> &str {
    pod.metadata.uid.as_deref().unwrap_or_default()
}

pub fn pod_name(pod: &Pod) -> &str {
    pod.metadata.name.as_deref().unwrap_or_default()
}

pub fn pod_namespace(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or("default")
}

/// `name_namespace`, the form upstream logs use for a pod (`kubecontainer.GetPodFullName`).
pub fn pod_full_name(pod: &Pod) -> String {
    format!("{}_{}", pod_name(pod), pod_namespace(pod))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_round_trips_through_the_wire_form() {
        let json = br#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"web","uid":"u1"},
            "spec":{"containers":[{"name":"c","image":"busybox:1.36"}]}}"#;
        let pod = decode_pod(json).expect("decodes");
        assert_eq!(pod_uid(&pod), "u1");
        assert_eq!(pod_namespace(&pod), "default");
        assert_eq!(pod_full_name(&pod), "web_default");
        let again = decode_pod(&encode_pod(&pod)).expect("decodes again");
        assert_eq!(again, pod);
    }

    #[test]
    fn garbage_is_a_readable_error() {
        let err = decode_pod(b"<html>").unwrap_err();
        assert!(err.to_string().starts_with("invalid Pod JSON"), "{err}");
    }
}
