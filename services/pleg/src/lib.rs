//! pleg: relists the container runtime every period, turns the differences into pod
//! lifecycle events, and keeps a timestamped status cache that pod-sync reads.

mod metrics;
mod relist;
mod server;

pub use relist::{RelistCache, diff_events};

use nodeagent_config::{Config, Service};
use nodeagent_cri::Cri;
use nodeagent_proto::api::metrics_server::MetricsServer;
use nodeagent_proto::api::pleg_server::PlegServer;
use nodeagent_transport::{Server, Shutdown, WithLimits};
use std::sync::{Arc, Mutex};

/// Runs pleg until `shutdown`.
pub async fn run(config: Config, shutdown: Shutdown) -> anyhow::Result<()> {
    let cri = Cri::connect(
        &config.runtime_endpoint,
        config.kubelet.runtime_request_timeout,
    );
    let cache = Arc::new(Mutex::new(RelistCache::default()));
    let (events, _) = tokio::sync::broadcast::channel(4096);
    let relister = relist::Relister::new(cri.clone(), cache.clone(), events.clone());
    let relist_task = tokio::spawn(relister.run(config.pleg_relist_period, shutdown.clone()));

    let service = server::PlegService::new(cri, cache.clone(), events, shutdown.clone());
    let routes = tonic::service::Routes::new(PlegServer::new(service).with_limits())
        .add_service(MetricsServer::new(metrics::PlegMetrics(cache.clone())).with_limits());
    // The systemd watchdog follows the relist loop: a loop stuck for this long (a relist
    // normally takes milliseconds) gets pleg restarted, which disturbs no pod.
    let stall = (config.pleg_relist_period * 5).max(std::time::Duration::from_secs(25));
    let liveness_cache = cache.clone();
    let started = std::time::Instant::now();
    let liveness: nodeagent_transport::LivenessCheck = Arc::new(move || {
        let cache = liveness_cache.lock().unwrap_or_else(|e| e.into_inner());
        // A first relist that never returns (a hung runtime) is as stuck as a later one.
        let since = cache.last_loop.unwrap_or(started);
        if since.elapsed() > stall {
            return Err(format!("no relist finished for {:?}", since.elapsed()));
        }
        Ok(())
    });
    let server = Server::new(
        config.endpoint(Service::Pleg).clone(),
        routes,
        &[<PlegServer<server::PlegService> as tonic::server::NamedService>::NAME],
    );
    let served = server.with_liveness(liveness).serve(shutdown.clone()).await;
    shutdown.wait().await;
    let _ = relist_task.await;
    served?;
    Ok(())
}
