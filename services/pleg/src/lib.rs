//! pleg: relists the container runtime every period, turns the differences into pod
//! lifecycle events, and keeps a timestamped status cache that pod-sync reads.

pub mod cli;

mod metrics;
mod relist;
mod server;

pub use relist::{RelistCache, diff_events};

use nodeagent_config::{Config, Service};
use nodeagent_cri::Cri;
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
    // Its slots are allocated at once (136 B each); a watcher more than 1024 messages
    // behind is cut off and resubscribes for a fresh snapshot.
    let (events, _) = tokio::sync::broadcast::channel(1024);
    let relister = relist::Relister::new(cri.clone(), cache.clone(), events.clone());
    // The systemd watchdog and health follow the relist loop: a loop stuck for this long (a
    // relist normally takes milliseconds, and a first one that never returns counts too)
    // gets pleg restarted, which disturbs no pod.
    let stall = (config.pleg_relist_period * 5).max(std::time::Duration::from_secs(25));
    let loops = nodeagent_transport::LoopHealth::default();
    let heartbeat = loops.register("relist loop", stall);
    let relist_task =
        tokio::spawn(relister.run(config.pleg_relist_period, shutdown.clone(), heartbeat));

    let service = server::PlegService::new(cri, cache.clone(), events, shutdown.clone());
    let routes = tonic::service::Routes::new(PlegServer::new(service).with_limits());
    let server = Server::new(
        config.endpoint(Service::Pleg).clone(),
        routes,
        &[<PlegServer<server::PlegService> as tonic::server::NamedService>::NAME],
    );
    let served = server.with_loop_health(loops).serve(shutdown.clone()).await;
    shutdown.wait().await;
    let _ = relist_task.await;
    served?;
    Ok(())
}
