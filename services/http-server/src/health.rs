//! `/healthz`: every service's gRPC health plus pleg's relist health, in upstream's
//! `[+]name ok` / `[-]name failed: reason` format.

use nodeagent_config::Address;
use nodeagent_config::Service;
use nodeagent_proto::api::PlegHealthRequest;
use nodeagent_proto::api::pleg_client::PlegClient;
use nodeagent_transport::WithLimits;
use nodeagent_transport::{Channel, check_health};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

pub struct HealthReport {
    pub checks: Vec<(String, Result<(), String>)>,
}

impl HealthReport {
    pub fn healthy(&self) -> bool {
        self.checks.iter().all(|(_, r)| r.is_ok())
    }

    pub fn render(&self, verbose: bool) -> String {
        if self.healthy() && !verbose {
            return "ok".into();
        }
        let mut out = String::new();
        for (name, r) in &self.checks {
            match r {
                Ok(()) => out.push_str(&format!("[+]{name} ok\n")),
                Err(e) => out.push_str(&format!("[-]{name} failed: {e}\n")),
            }
        }
        out.push_str(if self.healthy() {
            "healthz check passed\n"
        } else {
            "healthz check failed\n"
        });
        out
    }
}

pub async fn check_all(peers: &BTreeMap<Service, Channel>) -> HealthReport {
    let mut set = tokio::task::JoinSet::new();
    for (service, channel) in peers {
        let name = service.name().to_string();
        let channel = channel.clone();
        set.spawn(async move { (name, check_health(channel, "", CHECK_TIMEOUT).await) });
    }
    if let Some(pleg) = peers.get(&Service::Pleg) {
        let mut client = PlegClient::new(pleg.clone()).with_limits();
        set.spawn(async move {
            let r = match tokio::time::timeout(CHECK_TIMEOUT, client.health(PlegHealthRequest {}))
                .await
            {
                Ok(Ok(h)) if h.get_ref().healthy => Ok(()),
                Ok(Ok(h)) => Err(h.into_inner().message),
                Ok(Err(e)) => Err(e.message().to_string()),
                Err(_) => Err("no answer".into()),
            };
            ("pleg-relist".to_string(), r)
        });
    }
    let mut checks = Vec::new();
    while let Some(Ok(c)) = set.join_next().await {
        checks.push(c);
    }
    checks.sort_by(|a, b| a.0.cmp(&b.0));
    HealthReport { checks }
}

/// `/healthz`'s checks, made on a thread and runtime of their own with channels of their
/// own, so that load on the kubelet API (a burst of TLS handshakes, requests queued on
/// the services' channels) cannot delay them past their timeout and make a busy node
/// look unhealthy. Concurrent asks share one round of checks.
pub struct HealthChecks {
    asks: mpsc::UnboundedSender<oneshot::Sender<Arc<HealthReport>>>,
}

impl HealthChecks {
    /// Starts the checker for the services at `endpoints`; it stops when this is dropped.
    pub fn spawn(endpoints: BTreeMap<Service, Address>) -> std::io::Result<HealthChecks> {
        let (asks, mut rx) = mpsc::unbounded_channel::<oneshot::Sender<Arc<HealthReport>>>();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        std::thread::Builder::new()
            .name("healthz".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let peers: BTreeMap<Service, Channel> = endpoints
                        .iter()
                        .map(|(s, a)| (*s, nodeagent_transport::connect(a)))
                        .collect();
                    while let Some(first) = rx.recv().await {
                        let mut waiting = vec![first];
                        while let Ok(more) = rx.try_recv() {
                            waiting.push(more);
                        }
                        let report = Arc::new(check_all(&peers).await);
                        for w in waiting {
                            let _ = w.send(report.clone());
                        }
                    }
                })
            })?;
        Ok(HealthChecks { asks })
    }

    /// The report of the next round of checks.
    pub async fn check(&self) -> Arc<HealthReport> {
        let (tx, rx) = oneshot::channel();
        if self.asks.send(tx).is_ok()
            && let Ok(report) = rx.await
        {
            return report;
        }
        Arc::new(HealthReport {
            checks: vec![("healthz".into(), Err("the health checker stopped".into()))],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_like_upstream() {
        let ok = HealthReport {
            checks: vec![("pleg".into(), Ok(()))],
        };
        assert_eq!(ok.render(false), "ok");
        assert_eq!(ok.render(true), "[+]pleg ok\nhealthz check passed\n");
        let bad = HealthReport {
            checks: vec![
                ("pleg".into(), Ok(())),
                ("volume".into(), Err("down".into())),
            ],
        };
        assert_eq!(
            bad.render(false),
            "[+]pleg ok\n[-]volume failed: down\nhealthz check failed\n"
        );
    }
}
