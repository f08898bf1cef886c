//! The API server source: a kube-rs watcher of the pods bound to this node
//! (`spec.nodeName=<node>`, all namespaces). The watcher re-lists after `410 Gone` and
//! backs off on errors; each complete list and each change becomes the "api" source's
//! full set in the store (SET semantics). Invalid pods are refused with a log line and a
//! Warning Event on the pod.

use crate::store::PodStore;
use crate::{manifest, validation};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event, ObjectReference, Pod};
use kube::api::{Api, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event as WatchEvent};
use nodeagent_proto::k8s;
use nodeagent_transport::Shutdown;
use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

pub use nodeagent_config::kube_client as client_from_kubeconfig;

pub struct ApiSource {
    client: kube::Client,
    node_name: String,
    store: Arc<Mutex<PodStore>>,
    /// uids already reported as invalid (one log line and one Event each).
    reported: HashSet<String>,
}

impl ApiSource {
    pub fn new(client: kube::Client, node_name: String, store: Arc<Mutex<PodStore>>) -> Self {
        Self {
            client,
            node_name,
            store,
            reported: HashSet::new(),
        }
    }

    pub async fn run(mut self, shutdown: Shutdown) {
        let api: Api<Pod> = Api::all(self.client.clone());
        let config =
            watcher::Config::default().fields(&format!("spec.nodeName={}", self.node_name));
        let mut stream = watcher::watcher(api, config).default_backoff().boxed();
        let mut pods: BTreeMap<String, Pod> = BTreeMap::new();
        let mut listing: BTreeMap<String, Pod> = BTreeMap::new();
        let mut last_error = String::new();
        loop {
            let event = tokio::select! {
                _ = shutdown.wait() => return,
                e = stream.next() => match e {
                    Some(e) => e,
                    None => return,
                },
            };
            match event {
                Ok(WatchEvent::Init) => listing.clear(),
                Ok(WatchEvent::InitApply(p)) => {
                    listing.insert(k8s::pod_uid(&p).to_string(), p);
                }
                Ok(WatchEvent::InitDone) => {
                    pods = std::mem::take(&mut listing);
                    tracing::info!(pods = pods.len(), "API server pods listed");
                    last_error.clear();
                    self.publish(&pods).await;
                }
                Ok(WatchEvent::Apply(p)) => {
                    pods.insert(k8s::pod_uid(&p).to_string(), p);
                    self.publish(&pods).await;
                }
                Ok(WatchEvent::Delete(p)) => {
                    pods.remove(k8s::pod_uid(&p));
                    self.publish(&pods).await;
                }
                Err(e) => {
                    let text = e.to_string();
                    if text != last_error {
                        tracing::warn!(source = "api", error = %text, "API server watch failed; retrying with back-off");
                        last_error = text;
                    }
                }
            }
        }
    }

    /// Validates every pod and hands the valid ones to the store as the "api" set.
    async fn publish(&mut self, pods: &BTreeMap<String, Pod>) {
        let mut valid = Vec::new();
        for pod in pods.values() {
            // A mirror pod is this node's own record of a static pod: never run it.
            let mirror = pod
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(k8s::labels::CONFIG_MIRROR));
            if mirror {
                continue;
            }
            let mut pod = pod.clone();
            manifest::apply_api_defaults(&mut pod);
            pod.metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(k8s::labels::CONFIG_SOURCE.into(), "api".into());
            match validation::validate_pod(&pod) {
                Ok(()) => valid.push(pod),
                Err(reason) => {
                    let uid = k8s::pod_uid(&pod).to_string();
                    if self.reported.insert(uid) {
                        tracing::error!(source = "api", pod = %k8s::pod_full_name(&pod), %reason, "invalid pod refused");
                        self.warn(
                            &pod,
                            &format!(
                                "Error validating pod {} from api, ignoring: {reason}",
                                k8s::pod_full_name(&pod)
                            ),
                        )
                        .await;
                    }
                }
            }
        }
        crate::store::publish(&self.store, "api", valid);
    }

    /// Records a Warning Event on the pod (reason FailedValidation, as upstream).
    async fn warn(&self, pod: &Pod, message: &str) {
        let ns = k8s::pod_namespace(pod).to_string();
        let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::from_second(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs() as i64)
                    .unwrap_or(0),
            )
            .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        );
        let event = Event {
            metadata: kube::api::ObjectMeta {
                generate_name: Some(format!("{}.", k8s::pod_name(pod))),
                namespace: Some(ns.clone()),
                ..Default::default()
            },
            involved_object: ObjectReference {
                kind: Some("Pod".into()),
                api_version: Some("v1".into()),
                name: pod.metadata.name.clone(),
                namespace: Some(ns.clone()),
                uid: pod.metadata.uid.clone(),
                ..Default::default()
            },
            reason: Some("FailedValidation".into()),
            message: Some(message.to_string()),
            type_: Some("Warning".into()),
            source: Some(k8s_openapi::api::core::v1::EventSource {
                component: Some("kubelet".into()),
                host: Some(self.node_name.clone()),
            }),
            first_timestamp: Some(now.clone()),
            last_timestamp: Some(now),
            count: Some(1),
            ..Default::default()
        };
        let events: Api<Event> = Api::namespaced(self.client.clone(), &ns);
        if let Err(e) = events.create(&PostParams::default(), &event).await {
            tracing::warn!(error = %e, "cannot record the event");
        }
    }
}
