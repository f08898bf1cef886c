//! Lifecycle hooks and the graceful stop of a container (upstream `killContainer`): the
//! preStop hook runs first, within the grace period, and StopContainer gets what is left
//! of it (never less than 2 s).

use crate::PodSync;
use k8s_openapi::api::core::v1::{Container, LifecycleHandler, Pod};
use nodeagent_cri::actions;
use nodeagent_proto::k8s;
use std::time::{Duration, Instant};

/// Upstream `minimumGracePeriodInSeconds`.
const MINIMUM_GRACE: i64 = 2;

impl PodSync {
    /// Runs one lifecycle handler (exec, httpGet, sleep, tcpSocket) for a container.
    pub(crate) async fn run_hook(
        &self,
        pod: &Pod,
        c: &Container,
        container_id: &str,
        handler: &LifecycleHandler,
        timeout: Duration,
    ) -> Result<(), String> {
        let pod_ip = self
            .lock()
            .runtime
            .get(k8s::pod_uid(pod))
            .and_then(|r| {
                r.sandboxes
                    .iter()
                    .find(|s| s.state == 0)
                    .map(|s| s.ip.clone())
            })
            .unwrap_or_default();
        let named = actions::named_ports(c);
        let target = actions::Target {
            container_id,
            pod_ip: &pod_ip,
            named_ports: &named,
        };
        let (exec, http, tcp) = (
            handler.exec.as_ref(),
            handler.http_get.as_ref(),
            handler.tcp_socket.as_ref(),
        );
        if let Some(result) =
            actions::run_handler(&self.cri, &target, exec, http, tcp, timeout).await
        {
            // A hook counts an exec the runtime could not run as failed, as upstream.
            return result.map_err(String::from);
        }
        if let Some(sleep) = &handler.sleep {
            tokio::time::sleep(Duration::from_secs(sleep.seconds.max(0) as u64).min(timeout)).await;
            return Ok(());
        }
        Err("the hook has no handler".into())
    }

    /// Stops one container gracefully: preStop (if the spec has one), then StopContainer
    /// with the rest of `grace_seconds`.
    pub(crate) async fn kill_container(
        &self,
        pod: Option<&Pod>,
        name: &str,
        container_id: &str,
        grace_seconds: i64,
        reason: &str,
    ) {
        let started = Instant::now();
        let spec = pod.and_then(|p| p.spec.as_ref());
        let container = spec.and_then(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
                .find(|c| c.name == name)
        });
        let pre_stop = container.and_then(|c| c.lifecycle.as_ref()?.pre_stop.as_ref());
        tracing::info!(k8s.container.name = %name, container.id = %container_id, grace_seconds, %reason, "killing container");
        if let Some(pod) = pod {
            // Upstream's Killing message: the reason where it is one of upstream's own
            // ("Container c failed liveness probe, will be restarted"), else "Stopping
            // container c".
            let message = if reason.starts_with("Container ") {
                reason.to_string()
            } else {
                format!("Stopping container {name}")
            };
            self.events.container(
                pod,
                name,
                nodeagent_config::events::EventType::Normal,
                "Killing",
                &message,
            );
        }
        if let (Some(pod), Some(c), Some(hook)) = (pod, container, pre_stop) {
            let timeout = Duration::from_secs(grace_seconds.max(0) as u64);
            match self.run_hook(pod, c, container_id, hook, timeout).await {
                Ok(()) => {
                    tracing::info!(k8s.container.name = %name, took = ?started.elapsed(), "preStop hook completed")
                }
                Err(e) => {
                    tracing::warn!(k8s.container.name = %name, error = %e, "preStop hook failed");
                    self.events.container(
                        pod,
                        name,
                        nodeagent_config::events::EventType::Warning,
                        "FailedPreStopHook",
                        &format!("PreStopHook failed: {e}"),
                    );
                }
            }
        }
        let left = (grace_seconds - started.elapsed().as_secs() as i64).max(MINIMUM_GRACE);
        self.stop_container(container_id, left).await;
    }
}
