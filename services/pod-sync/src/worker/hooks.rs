//! Lifecycle hooks and the graceful stop of a container (upstream `killContainer`): the
//! preStop hook runs first, within the grace period, and StopContainer gets what is left
//! of it (never less than 2 s).

use crate::PodSync;
use crate::worker::kill_order::{GraceClock, TerminationOrder};
use k8s_openapi::api::core::v1::{Container, LifecycleHandler, Pod};
use nodeagent_cri::actions;
use nodeagent_proto::k8s;
use std::time::Duration;

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
    /// with the rest of `grace_seconds`. `message` is the Killing event's (upstream's
    /// "Stopping container <name>" when None).
    pub(crate) async fn kill_container(
        &self,
        pod: Option<&Pod>,
        name: &str,
        container_id: &str,
        grace_seconds: i64,
        message: Option<&str>,
    ) {
        let clock = GraceClock::fixed(grace_seconds);
        self.kill_container_ordered(pod, name, container_id, &clock, message, None)
            .await
    }

    /// [`Self::kill_container`] within a grace period that may shrink meanwhile (a second,
    /// shorter deletion), and after the containers `order` says must stop first (upstream
    /// `killContainer` with a `terminationOrdering`).
    pub(crate) async fn kill_container_ordered(
        &self,
        pod: Option<&Pod>,
        name: &str,
        container_id: &str,
        clock: &GraceClock,
        message: Option<&str>,
        order: Option<&TerminationOrder>,
    ) {
        let spec = pod.and_then(|p| p.spec.as_ref());
        let container = spec.and_then(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
                .find(|c| c.name == name)
        });
        let pre_stop = container.and_then(|c| c.lifecycle.as_ref()?.pre_stop.as_ref());
        let message = message
            .map(String::from)
            .unwrap_or_else(|| format!("Stopping container {name}"));
        tracing::info!(k8s.container.name = %name, container.id = %container_id, grace_seconds = clock.grace_seconds(), %message, "killing container");
        if let Some(pod) = pod {
            self.events.container(
                pod,
                name,
                nodeagent_config::events::EventType::Normal,
                "Killing",
                &message,
            );
        }
        if let (Some(pod), Some(c), Some(hook)) = (pod, container, pre_stop) {
            let timeout = Duration::from_secs(clock.grace_seconds() as u64);
            let hook = self.run_hook(pod, c, container_id, hook, timeout);
            let ran = tokio::select! {
                r = hook => Some(r),
                _ = clock.expired() => None,
            };
            match ran {
                Some(Ok(())) => {
                    tracing::info!(k8s.container.name = %name, "preStop hook completed")
                }
                Some(Err(e)) => {
                    tracing::warn!(k8s.container.name = %name, error = %e, "preStop hook failed");
                    self.events.container(
                        pod,
                        name,
                        nodeagent_config::events::EventType::Warning,
                        "FailedPreStopHook",
                        crate::worker::sync::PRE_STOP_HOOK_FAILED,
                    );
                }
                None => {
                    tracing::warn!(k8s.container.name = %name, "the grace period ended during the preStop hook")
                }
            }
        }
        if let Some(order) = order {
            tokio::select! {
                _ = order.wait_for_turn(name) => {}
                _ = clock.expired() => {}
            }
        }
        self.stop_within(container_id, clock).await;
        if let Some(order) = order {
            order.stopped(name);
        }
    }

    /// StopContainer with what is left of the grace period; if the period shrinks while
    /// the runtime waits, a second StopContainer with the shorter rest goes alongside
    /// (containerd then kills at the earlier deadline).
    async fn stop_within(&self, container_id: &str, clock: &GraceClock) {
        let first = self.stop_container(container_id, clock.seconds_left(MINIMUM_GRACE));
        tokio::pin!(first);
        let mut watch = clock.clone();
        let mut sooner = tokio::task::JoinSet::new();
        loop {
            tokio::select! {
                _ = &mut first => return,
                Some(_) = sooner.join_next(), if !sooner.is_empty() => return,
                _ = watch.shortened() => {
                    let left = watch.seconds_left(MINIMUM_GRACE);
                    tracing::info!(container.id = %container_id, seconds_left = left, "the grace period was shortened");
                    let mut runtime = self.cri.runtime.clone();
                    let req = crate::worker::sync::stop_request(container_id, left);
                    sooner.spawn(async move {
                        let _ = runtime.stop_container(req).await;
                    });
                }
            }
        }
    }
}
