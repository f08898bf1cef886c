//! Graceful node shutdown, as upstream's `nodeshutdown` manager: with `shutdownGracePeriod`
//! set, pod-sync holds a systemd-logind *delay* inhibitor lock for shutdown. When logind
//! announces a shutdown (`PrepareForShutdown(true)`) the pods are stopped in two groups:
//! regular pods first, each with `min(its grace, shutdownGracePeriod −
//! shutdownGracePeriodCriticalPods)`, then critical ones (priority ≥ 2000000000) with
//! `min(its grace, shutdownGracePeriodCriticalPods)`; then the lock is released and the
//! shutdown goes on. Stopped pods end Failed, reason `Terminated`, upstream's message and a
//! `DisruptionTarget` condition; new pods are refused (`NodeShutdown`); node-status reports
//! Ready=False "node is shutting down" (from a marker file holding this boot's id).
//!
//! When logind's `InhibitDelayMaxSec` is shorter than the grace period, it is raised as
//! upstream does: `/etc/systemd/logind.conf.d/99-kubelet.conf`, then SIGHUP to logind.

use crate::PodSync;
use crate::status::Waiting;
use crate::status::reasons::{SHUTDOWN_MESSAGE, SHUTDOWN_REASON};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use nodeagent_config::events::EventType;
use nodeagent_config::machine::set_marker;
use nodeagent_proto::k8s;
use std::sync::Arc;
use std::time::Duration;

/// upstream's `scheduling.SystemCriticalPriority`.
const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

const LOGIND_CONF: &str = "/etc/systemd/logind.conf.d/99-kubelet.conf";

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Policy {
    pub grace: Duration,
    pub critical: Duration,
}

impl Policy {
    pub fn from_config(c: &nodeagent_config::KubeletConfiguration) -> Option<Self> {
        (!c.shutdown_grace_period.is_zero()).then_some(Self {
            grace: c.shutdown_grace_period,
            critical: c.shutdown_grace_period_critical_pods,
        })
    }

    /// The groups in the order they are stopped: (critical?, how long the group has).
    pub fn groups(&self) -> [(bool, Duration); 2] {
        [
            (false, self.grace.saturating_sub(self.critical)),
            (true, self.critical),
        ]
    }
}

/// Whether the pod belongs to the critical group (upstream groups by priority).
pub fn is_critical(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.priority)
        .is_some_and(|p| p >= SYSTEM_CRITICAL_PRIORITY)
}

/// The grace a pod gets in a group of `group` length: the shorter of the two.
pub fn pod_grace(pod: &Pod, group: Duration) -> i64 {
    crate::worker::kill_order::grace_seconds(pod).min(group.as_secs() as i64)
}

async fn proxy<'a>(
    conn: &zbus::Connection,
    destination: &'static str,
    path: &'static str,
    interface: &'static str,
) -> zbus::Result<zbus::Proxy<'a>> {
    zbus::proxy::Builder::new(conn)
        .destination(destination)?
        .path(path)?
        .interface(interface)?
        .cache_properties(zbus::proxy::CacheProperties::No)
        .build()
        .await
}

async fn inhibit_delay(logind: &zbus::Proxy<'_>) -> zbus::Result<Duration> {
    let usec: u64 = logind.get_property("InhibitDelayMaxUSec").await?;
    Ok(Duration::from_micros(usec))
}

/// Makes logind wait at least `want` for delay locks (upstream's override file and
/// SIGHUP of logind through systemd's KillUnit).
async fn ensure_inhibit_delay(
    conn: &zbus::Connection,
    logind: &zbus::Proxy<'_>,
    want: Duration,
) -> anyhow::Result<()> {
    if inhibit_delay(logind).await? >= want {
        return Ok(());
    }
    let text = format!(
        "# Kubelet logind override\n[Login]\nInhibitDelayMaxSec={}\n",
        want.as_secs()
    );
    tokio::task::spawn_blocking(move || -> std::io::Result<()> {
        std::fs::create_dir_all("/etc/systemd/logind.conf.d")?;
        std::fs::write(LOGIND_CONF, text)
    })
    .await??;
    let systemd = proxy(
        conn,
        "org.freedesktop.systemd1",
        "/org/freedesktop/systemd1",
        "org.freedesktop.systemd1.Manager",
    )
    .await?;
    systemd
        .call::<_, _, ()>("KillUnit", &("systemd-logind.service", "all", 1i32))
        .await?;
    // logind reloads its configuration on SIGHUP; give it a moment.
    for _ in 0..20 {
        if inhibit_delay(logind).await.is_ok_and(|d| d >= want) {
            tracing::info!(
                inhibit_delay_max = ?want,
                "raised logind's InhibitDelayMaxSec to shutdownGracePeriod ({LOGIND_CONF})"
            );
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    anyhow::bail!(
        "node shutdown manager was unable to update logind InhibitDelayMaxSec to {want:?} (ShutdownGracePeriod), current value of InhibitDelayMaxSec ({:?}) is less than requested ShutdownGracePeriod",
        inhibit_delay(logind).await.unwrap_or_default()
    )
}

async fn take_lock(logind: &zbus::Proxy<'_>) -> zbus::Result<zbus::zvariant::OwnedFd> {
    logind
        .call(
            "Inhibit",
            &(
                "shutdown",
                "kubelet",
                "Kubelet needs time to handle node shutdown",
                "delay",
            ),
        )
        .await
}

impl PodSync {
    /// Stops every pod for a node shutdown, regular ones first, as the module says.
    pub(crate) async fn shut_down_pods(self: &Arc<Self>, policy: Policy) {
        set_marker(&self.node.root_dir, true);
        self.lock().shutting_down = true;
        self.events.node(
            EventType::Normal,
            "Shutdown",
            "Shutdown manager detected shutdown event",
        );
        tracing::warn!(grace = ?policy.grace, critical = ?policy.critical, "node shutdown: stopping pods");
        for (critical, length) in policy.groups() {
            let pods: Vec<Pod> = {
                let st = self.lock();
                st.desired
                    .iter()
                    .filter(|(uid, _)| st.runtime.contains_key(*uid))
                    .map(|(_, p)| p.clone())
                    .filter(|p| is_critical(p) == critical)
                    .collect()
            };
            let stops = pods.iter().map(|pod| {
                let this = self.clone();
                async move {
                    let uid = k8s::pod_uid(pod).to_string();
                    this.lock().pod_failed.insert(
                        uid.clone(),
                        Waiting {
                            reason: SHUTDOWN_REASON.into(),
                            message: SHUTDOWN_MESSAGE.into(),
                        },
                    );
                    // The pod says Failed (Terminated) from the start of its stop, as
                    // upstream's kill sets the status before it kills.
                    this.publish_status(&uid).await;
                    // upstream's killPodFunc: the pod's worker stops it; this waits.
                    this.kill_pod_now(pod, Some(pod_grace(pod, length))).await;
                }
            });
            let all = futures::future::join_all(stops);
            if tokio::time::timeout(length, all).await.is_err() {
                tracing::warn!(
                    critical,
                    "node shutdown: a group's time ran out before all its pods stopped"
                );
            }
        }
        tracing::warn!("node shutdown: pods stopped; releasing the inhibitor lock");
    }
}

/// Holds the inhibitor lock and handles shutdowns until pod-sync stops; a lost D-Bus
/// connection (logind or the bus restarted) is made again.
pub async fn run(sync: Arc<PodSync>, policy: Policy) {
    set_marker(&sync.node.root_dir, false);
    loop {
        let watched = tokio::select! {
            _ = sync.shutdown.wait() => return,
            r = watch(&sync, policy) => r,
        };
        if let Err(e) = watched {
            tracing::error!(error = %e, "graceful node shutdown is not armed; retrying in 5 s");
        }
        tokio::select! {
            _ = sync.shutdown.wait() => return,
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
        }
    }
}

async fn watch(sync: &Arc<PodSync>, policy: Policy) -> anyhow::Result<()> {
    let conn = zbus::Connection::system().await?;
    let logind = proxy(
        &conn,
        "org.freedesktop.login1",
        "/org/freedesktop/login1",
        "org.freedesktop.login1.Manager",
    )
    .await?;
    ensure_inhibit_delay(&conn, &logind, policy.grace).await?;
    let mut signals = logind.receive_signal("PrepareForShutdown").await?;
    let mut lock = Some(take_lock(&logind).await?);
    tracing::info!(grace = ?policy.grace, critical = ?policy.critical, "holding a delay inhibitor lock for graceful node shutdown");
    while let Some(message) = signals.next().await {
        let starting: bool = message.body().deserialize()?;
        if starting {
            sync.shut_down_pods(policy).await;
            drop(lock.take());
        } else {
            tracing::info!("node shutdown cancelled");
            set_marker(&sync.node.root_dir, false);
            sync.lock().shutting_down = false;
            if lock.is_none() {
                lock = Some(take_lock(&logind).await?);
            }
        }
    }
    anyhow::bail!("the D-Bus connection to logind closed")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(priority: Option<i32>, grace: Option<i64>) -> Pod {
        Pod {
            spec: Some(k8s_openapi::api::core::v1::PodSpec {
                priority,
                termination_grace_period_seconds: grace,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn regular_pods_go_first_with_the_rest_of_the_period() {
        let p = Policy {
            grace: Duration::from_secs(30),
            critical: Duration::from_secs(10),
        };
        assert_eq!(
            p.groups(),
            [
                (false, Duration::from_secs(20)),
                (true, Duration::from_secs(10))
            ]
        );
        assert!(!is_critical(&pod(None, None)));
        assert!(!is_critical(&pod(Some(1_999_999_999), None)));
        assert!(is_critical(&pod(Some(2_000_001_000), None)));
        // A pod's own grace when shorter, the group's when longer.
        assert_eq!(pod_grace(&pod(None, Some(5)), Duration::from_secs(20)), 5);
        assert_eq!(pod_grace(&pod(None, Some(60)), Duration::from_secs(20)), 20);
        assert_eq!(pod_grace(&pod(None, None), Duration::from_secs(20)), 20);
    }
}
