//! Events about a pod or one of its containers, posted as the kubelet posts them
//! (`source.component` "kubelet", `source.host` the node, a container's `fieldPath`), so
//! `kubectl describe pod` and `kubectl get events` show them.
//!
//! [`EventRecorder`] is upstream's event broadcaster in small: recording never waits on the
//! API server (a bounded queue, drained by one task), a repeat of an event already posted
//! raises that event's `count` and `lastTimestamp` instead of creating another (upstream's
//! EventCorrelator), and each object may burst 25 events, then one per 5 minutes (upstream's
//! spam filter). Every event is counted in `nodeagent_events_total`.

use k8s_openapi::api::core::v1::{Container, Event, EventSource, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams, PostParams};
use nodeagent_telemetry::metrics::{CounterFamily, register};
use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

pub mod recent;

/// `Normal` or `Warning`, upstream's two event types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// The core/v1 Event about `pod` (not yet posted).
pub fn pod_event(pod: &Pod, ty: EventType, reason: &str, message: &str, node: &str) -> Event {
    let object = pod_reference(pod);
    let ns = object.namespace.clone().unwrap_or_default();
    let name = object.name.clone().unwrap_or_default();
    event(object, &ns, &name, ty, reason, message, node)
}

/// The reference to `pod` an event carries (namespace `default` when it has none).
fn pod_reference(pod: &Pod) -> ObjectReference {
    ObjectReference {
        kind: Some("Pod".into()),
        api_version: Some("v1".into()),
        name: Some(pod.metadata.name.clone().unwrap_or_default()),
        namespace: Some(
            pod.metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".into()),
        ),
        uid: pod.metadata.uid.clone(),
        ..Default::default()
    }
}

/// An Event about `object` in `namespace`, named after `name`, from the kubelet on `node`.
fn event(
    object: ObjectReference,
    namespace: &str,
    name: &str,
    ty: EventType,
    reason: &str,
    message: &str,
    node: &str,
) -> Event {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    Event {
        metadata: kube::api::ObjectMeta {
            generate_name: Some(format!("{name}.")),
            namespace: Some(namespace.into()),
            ..Default::default()
        },
        involved_object: object,
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

/// Posts an event about `object` (in its namespace, `default` when it has none); a failure
/// is logged, never returned.
pub async fn post_about(
    client: &kube::Client,
    object: ObjectReference,
    ty: EventType,
    reason: &str,
    message: &str,
    node: &str,
) {
    let ns = object.namespace.clone().unwrap_or_else(|| "default".into());
    let name = object.name.clone().unwrap_or_default();
    let event = event(object, &ns, &name, ty, reason, message, node);
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    if let Err(e) = events.create(&PostParams::default(), &event).await {
        tracing::warn!(error = %e, %reason, "cannot record the event");
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
    post_about(client, pod_reference(pod), ty, reason, message, node).await;
}

/// `spec.containers{name}` or `spec.initContainers{name}`: upstream's field path of a
/// container event.
pub fn container_field_path(pod: &Pod, container: &str) -> String {
    let is_init = pod
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.as_ref())
        .is_some_and(|cs| cs.iter().any(|c: &Container| c.name == container));
    if is_init {
        format!("spec.initContainers{{{container}}}")
    } else {
        format!("spec.containers{{{container}}}")
    }
}

/// `nodeagent_events_total{type, reason, outcome}`: outcome is `posted` (a new Event),
/// `counted` (an earlier Event's count raised), `dropped` (spam filter or full queue) or
/// `failed` (the API server refused it), or `logged` on a node without an API server.
static EVENTS: LazyLock<CounterFamily> = LazyLock::new(|| {
    register(
        "nodeagent_events",
        "Events the node agent recorded about pods, by type, reason and what became of them.",
        CounterFamily::default(),
    )
});

fn count(event: &Event, outcome: &str) {
    EVENTS
        .get_or_create(&vec![
            ("type", event.type_.clone().unwrap_or_default()),
            ("reason", event.reason.clone().unwrap_or_default()),
            ("outcome", outcome.to_string()),
        ])
        .inc();
}

/// How many events wait for the API server before new ones are dropped.
const QUEUE: usize = 1000;

/// Records events without waiting: see the module docs. Cheap to clone.
#[derive(Clone)]
pub struct EventRecorder {
    tx: Option<mpsc::Sender<Event>>,
    node: String,
}

impl EventRecorder {
    /// A recorder posting to `client`'s API server; with none (a standalone node), events
    /// are logged only. Spawns its task on the current runtime.
    pub fn new(client: Option<kube::Client>, node: &str) -> Self {
        let tx = client.map(|client| {
            let (tx, rx) = mpsc::channel(QUEUE);
            tokio::spawn(post_events(client, rx));
            tx
        });
        Self {
            tx,
            node: node.to_string(),
        }
    }

    /// An event about the pod.
    pub fn pod(&self, pod: &Pod, ty: EventType, reason: &str, message: &str) {
        self.send(pod_event(pod, ty, reason, message, &self.node));
    }

    /// An event about the pod that carries `annotations` (upstream's Evicted event names
    /// the offending containers so).
    pub fn pod_annotated(
        &self,
        pod: &Pod,
        ty: EventType,
        reason: &str,
        message: &str,
        annotations: std::collections::BTreeMap<String, String>,
    ) {
        let mut event = pod_event(pod, ty, reason, message, &self.node);
        event.metadata.annotations = Some(annotations);
        self.send(event);
    }

    /// An event about one of the pod's containers.
    pub fn container(
        &self,
        pod: &Pod,
        container: &str,
        ty: EventType,
        reason: &str,
        message: &str,
    ) {
        let mut event = pod_event(pod, ty, reason, message, &self.node);
        event.involved_object.field_path = Some(container_field_path(pod, container));
        self.send(event);
    }

    /// An event about the Node itself (upstream: in namespace `default`, the node's name
    /// as its uid).
    pub fn node(&self, ty: EventType, reason: &str, message: &str) {
        let object = ObjectReference {
            kind: Some("Node".into()),
            name: Some(self.node.clone()),
            uid: Some(self.node.clone()),
            ..Default::default()
        };
        let e = event(
            object, "default", &self.node, ty, reason, message, &self.node,
        );
        self.send(e);
    }

    fn send(&self, event: Event) {
        let object = &event.involved_object;
        if event.type_.as_deref() == Some(EventType::Warning.as_str()) {
            let name = object.name.clone().unwrap_or_default();
            recent::record(recent::Recent {
                last_unix_nanos: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as i64),
                object: match object.namespace.as_deref() {
                    Some(ns) => format!("{ns}/{name}"),
                    None => name,
                },
                field_path: object.field_path.clone().unwrap_or_default(),
                reason: event.reason.clone().unwrap_or_default(),
                message: event.message.clone().unwrap_or_default(),
                count: 1,
            });
        }
        tracing::info!(
            k8s.pod.name = object.name.as_deref().unwrap_or_default(),
            k8s.namespace.name = object.namespace.as_deref().unwrap_or_default(),
            field_path = object.field_path.as_deref().unwrap_or_default(),
            r#type = event.type_.as_deref().unwrap_or_default(),
            reason = event.reason.as_deref().unwrap_or_default(),
            message = event.message.as_deref().unwrap_or_default(),
            "event"
        );
        let Some(tx) = &self.tx else {
            count(&event, "logged");
            return;
        };
        if let Err(e) = tx.try_send(event) {
            let event = match e {
                mpsc::error::TrySendError::Full(e) | mpsc::error::TrySendError::Closed(e) => e,
            };
            count(&event, "dropped");
        }
    }
}

/// What the correlator makes of an event.
#[derive(Debug, PartialEq)]
enum Action {
    /// Post it as a new Event.
    Create,
    /// Raise the count of the Event posted earlier under this name.
    Count { name: String, count: i32 },
    /// The object is over its rate: drop it.
    Drop,
}

/// Upstream's spam filter: a token bucket per object, 25 deep, one token per 5 minutes.
const BURST: f64 = 25.0;
const REFILL: Duration = Duration::from_secs(300);
/// Upstream's correlator cache size.
const MAX_KEYS: usize = 4096;

struct Bucket {
    tokens: f64,
    at: Instant,
}

#[derive(Default)]
struct Correlator {
    /// Event key → (name of the posted Event, its count).
    seen: HashMap<String, (String, i32)>,
    buckets: HashMap<String, Bucket>,
}

fn object_key(e: &Event) -> String {
    let o = &e.involved_object;
    format!(
        "{}/{}/{}/{}",
        o.kind.as_deref().unwrap_or_default(),
        o.namespace.as_deref().unwrap_or_default(),
        o.name.as_deref().unwrap_or_default(),
        o.uid.as_deref().unwrap_or_default()
    )
}

fn event_key(e: &Event) -> String {
    format!(
        "{}/{}/{}/{}/{}",
        object_key(e),
        e.involved_object.field_path.as_deref().unwrap_or_default(),
        e.type_.as_deref().unwrap_or_default(),
        e.reason.as_deref().unwrap_or_default(),
        e.message.as_deref().unwrap_or_default()
    )
}

impl Correlator {
    fn observe(&mut self, e: &Event, now: Instant) -> Action {
        let bucket = self.buckets.entry(object_key(e)).or_insert(Bucket {
            tokens: BURST,
            at: now,
        });
        let refilled = now.duration_since(bucket.at).as_secs_f64() / REFILL.as_secs_f64();
        bucket.tokens = (bucket.tokens + refilled).min(BURST);
        bucket.at = now;
        if bucket.tokens < 1.0 {
            return Action::Drop;
        }
        bucket.tokens -= 1.0;
        match self.seen.get_mut(&event_key(e)) {
            Some((name, count)) => {
                *count += 1;
                Action::Count {
                    name: name.clone(),
                    count: *count,
                }
            }
            None => Action::Create,
        }
    }

    fn posted(&mut self, e: &Event, name: String) {
        if self.seen.len() >= MAX_KEYS {
            // Not an LRU, but bounded: forgetting only costs a new Event instead of a count.
            self.seen.clear();
            self.buckets.retain(|_, b| b.tokens < BURST);
        }
        self.seen.insert(event_key(e), (name, 1));
    }
}

async fn post_events(client: kube::Client, mut rx: mpsc::Receiver<Event>) {
    let mut correlator = Correlator::default();
    while let Some(event) = rx.recv().await {
        let ns = event.metadata.namespace.clone().unwrap_or_default();
        let api: Api<Event> = Api::namespaced(client.clone(), &ns);
        let action = correlator.observe(&event, Instant::now());
        if let Action::Count { name, count: n } = &action {
            let patch = serde_json::json!({
                "count": n,
                "lastTimestamp": event.last_timestamp,
            });
            match api
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    count(&event, "counted");
                    continue;
                }
                // Gone (expired, deleted): post it anew below.
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => {
                    tracing::warn!(error = %e, reason = ?event.reason, "cannot update the event");
                    count(&event, "failed");
                    continue;
                }
            }
        }
        if action == Action::Drop {
            count(&event, "dropped");
            continue;
        }
        match api.create(&PostParams::default(), &event).await {
            Ok(created) => {
                count(&event, "posted");
                if let Some(name) = created.metadata.name {
                    correlator.posted(&event, name);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, reason = ?event.reason, "cannot record the event");
                count(&event, "failed");
            }
        }
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

    #[test]
    fn repeats_are_counted_and_an_object_is_rate_limited_as_upstream() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "u1"},
            "spec": {"initContainers": [{"name": "init"}], "containers": [{"name": "c"}]}
        }))
        .unwrap();
        assert_eq!(
            container_field_path(&pod, "init"),
            "spec.initContainers{init}"
        );
        assert_eq!(container_field_path(&pod, "c"), "spec.containers{c}");
        let mut c = Correlator::default();
        let t0 = Instant::now();
        let a = pod_event(&pod, EventType::Warning, "BackOff", "x", "n");
        let b = pod_event(&pod, EventType::Normal, "Pulled", "y", "n");
        assert_eq!(c.observe(&a, t0), Action::Create);
        c.posted(&a, "web.1".into());
        assert_eq!(
            c.observe(&a, t0),
            Action::Count {
                name: "web.1".into(),
                count: 2
            }
        );
        assert_eq!(c.observe(&b, t0), Action::Create);
        // 25 in all for this object, then nothing until a token comes back.
        for _ in 4..=25 {
            assert_ne!(c.observe(&b, t0), Action::Drop);
        }
        assert_eq!(c.observe(&a, t0), Action::Drop);
        assert_eq!(c.observe(&a, t0 + REFILL / 2), Action::Drop);
        assert!(matches!(c.observe(&a, t0 + REFILL), Action::Count { .. }));
        // Another pod has its own bucket.
        let mut other = a.clone();
        other.involved_object.uid = Some("u2".into());
        assert_eq!(c.observe(&other, t0 + REFILL), Action::Create);
    }
}
