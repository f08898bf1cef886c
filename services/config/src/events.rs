//! Events about a pod, posted as the kubelet posts them (`source.component` "kubelet",
//! `source.host` the node), so `kubectl describe pod` and `kubectl get events` show them.

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, PostParams};

/// `Normal` or `Warning`, upstream's two event types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// The core/v1 Event about `pod` (not yet posted).
pub fn pod_event(pod: &Pod, ty: EventType, reason: &str, message: &str, node: &str) -> Event {
    let ns = pod
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let name = pod.metadata.name.clone().unwrap_or_default();
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    Event {
        metadata: kube::api::ObjectMeta {
            generate_name: Some(format!("{name}.")),
            namespace: Some(ns.clone()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            kind: Some("Pod".into()),
            api_version: Some("v1".into()),
            name: Some(name),
            namespace: Some(ns),
            uid: pod.metadata.uid.clone(),
            ..Default::default()
        },
        reason: Some(reason.into()),
        message: Some(message.into()),
        type_: Some(ty.as_str().into()),
        source: Some(EventSource {
            component: Some("kubelet".into()),
            host: Some(node.into()),
        }),
        first_timestamp: Some(now.clone()),
        last_timestamp: Some(now),
        count: Some(1),
        ..Default::default()
    }
}

/// Posts an event about `pod`; a failure is logged, never returned (an event is advice).
pub async fn post(
    client: &kube::Client,
    pod: &Pod,
    ty: EventType,
    reason: &str,
    message: &str,
    node: &str,
) {
    let event = pod_event(pod, ty, reason, message, node);
    let ns = event.metadata.namespace.clone().unwrap_or_default();
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    if let Err(e) = events.create(&PostParams::default(), &event).await {
        tracing::warn!(error = %e, %reason, "cannot record the event");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_names_the_pod_and_the_kubelet() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "u1"}
        }))
        .unwrap();
        let e = pod_event(&pod, EventType::Warning, "FailedMount", "no", "node-1");
        assert_eq!(e.metadata.generate_name.as_deref(), Some("web."));
        assert_eq!(e.metadata.namespace.as_deref(), Some("shop"));
        assert_eq!(e.involved_object.uid.as_deref(), Some("u1"));
        assert_eq!(e.involved_object.kind.as_deref(), Some("Pod"));
        assert_eq!(e.type_.as_deref(), Some("Warning"));
        assert_eq!(e.reason.as_deref(), Some("FailedMount"));
        let source = e.source.unwrap();
        assert_eq!(source.component.as_deref(), Some("kubelet"));
        assert_eq!(source.host.as_deref(), Some("node-1"));
    }
}
