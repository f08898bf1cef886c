//! RuntimeClass (upstream `pkg/kubelet/runtimeclass`): a pod's `spec.runtimeClassName`
//! names a `node.k8s.io/v1` RuntimeClass, whose `handler` is the CRI `runtime_handler` its
//! sandbox runs with. The classes come from a watch of the API server (an informer, as
//! upstream's), so a pod start never waits on the API server and an outage changes nothing.
//!
//! Lookup, as upstream's `LookupRuntimeHandler`: no name (or "") is the runtime's default
//! handler; a class the API server does not have fails the sandbox with upstream's error
//! (`runtimeclass.node.k8s.io "<name>" not found`, in the `FailedCreatePodSandBox` event),
//! and the pod worker retries, so creating the class later starts the pod. The pod's
//! `overhead` (which the API server's RuntimeClass admission copies from the class's
//! `overhead.podFixed`) is counted in the pod cgroup by `aggregate.rs`.
//!
//! Unlike upstream, which with no API server ignores `runtimeClassName` and runs the pod
//! under the default handler, a standalone node refuses such a pod's sandbox: a pod that
//! asked for a stronger sandbox (gVisor, Kata) must not quietly run under runc. And before
//! the first list has arrived, a lookup says so (and is retried) instead of taking a class
//! for missing.

use futures::StreamExt;
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event as WatchEvent};
use nodeagent_transport::Shutdown;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

#[derive(Default)]
struct Known {
    /// Class name -> handler, once listed.
    handlers: Option<BTreeMap<String, String>>,
}

/// The RuntimeClasses the node knows.
#[derive(Clone)]
pub struct RuntimeClasses {
    /// None: the node has no API server.
    known: Option<Arc<Mutex<Known>>>,
}

impl RuntimeClasses {
    /// With an API server, the classes it has (once `run` has listed them).
    pub fn new(connected: bool) -> Self {
        Self {
            known: connected.then(|| Arc::new(Mutex::new(Known::default()))),
        }
    }

    /// The CRI runtime handler for a pod's `runtimeClassName`.
    pub fn handler(&self, class: Option<&str>) -> Result<String, String> {
        let Some(name) = class.filter(|n| !n.is_empty()) else {
            return Ok(String::new());
        };
        let Some(known) = &self.known else {
            return Err(format!(
                "RuntimeClass {name:?} cannot be looked up: the node has no API server"
            ));
        };
        let known = known.lock().unwrap_or_else(|e| e.into_inner());
        match &known.handlers {
            None => Err(format!(
                "failed to lookup RuntimeClass {name}: RuntimeClasses not yet listed from the API server"
            )),
            Some(h) => h
                .get(name)
                .cloned()
                .ok_or_else(|| format!("runtimeclass.node.k8s.io {name:?} not found")),
        }
    }

    /// Watches the API server's RuntimeClasses until `shutdown`.
    pub async fn run(self, client: kube::Client, shutdown: Shutdown) {
        let Some(known) = self.known else { return };
        let api: Api<RuntimeClass> = Api::all(client);
        let mut stream = watcher::watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed();
        let mut listing = BTreeMap::new();
        let mut last_error = String::new();
        let entry = |rc: &RuntimeClass| {
            (
                rc.metadata.name.clone().unwrap_or_default(),
                rc.handler.clone(),
            )
        };
        loop {
            let event = tokio::select! {
                _ = shutdown.wait() => return,
                e = stream.next() => match e {
                    Some(e) => e,
                    None => return,
                },
            };
            let mut known = known.lock().unwrap_or_else(|e| e.into_inner());
            match event {
                Ok(WatchEvent::Init) => listing.clear(),
                Ok(WatchEvent::InitApply(rc)) => {
                    let (name, handler) = entry(&rc);
                    listing.insert(name, handler);
                }
                Ok(WatchEvent::InitDone) => {
                    tracing::info!(classes = listing.len(), "RuntimeClasses listed");
                    known.handlers = Some(std::mem::take(&mut listing));
                    last_error.clear();
                }
                Ok(WatchEvent::Apply(rc)) => {
                    let (name, handler) = entry(&rc);
                    known.handlers.get_or_insert_default().insert(name, handler);
                }
                Ok(WatchEvent::Delete(rc)) => {
                    let (name, _) = entry(&rc);
                    if let Some(h) = known.handlers.as_mut() {
                        h.remove(&name);
                    }
                }
                Err(e) => {
                    let text = e.to_string();
                    if text != last_error {
                        tracing::warn!(error = %text, "RuntimeClass watch failed; retrying with back-off");
                        last_error = text;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_follows_upstream() {
        let connected = RuntimeClasses::new(true);
        assert_eq!(connected.handler(None), Ok(String::new()));
        assert_eq!(connected.handler(Some("")), Ok(String::new()));
        assert!(
            connected
                .handler(Some("gvisor"))
                .unwrap_err()
                .contains("not yet listed")
        );
        connected.known.as_ref().unwrap().lock().unwrap().handlers = Some(BTreeMap::from([(
            "gvisor".to_string(),
            "runsc".to_string(),
        )]));
        assert_eq!(connected.handler(Some("gvisor")), Ok("runsc".to_string()));
        assert_eq!(
            connected.handler(Some("kata")),
            Err("runtimeclass.node.k8s.io \"kata\" not found".to_string())
        );
        let standalone = RuntimeClasses::new(false);
        assert_eq!(standalone.handler(None), Ok(String::new()));
        assert!(
            standalone
                .handler(Some("gvisor"))
                .unwrap_err()
                .contains("no API server")
        );
    }
}
