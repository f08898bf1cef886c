//! probe: one worker per probed container. It learns which containers run from
//! pod-sync's status stream, runs their probes (exec through CRI, httpGet, tcpSocket, gRPC),
//! and serves the results as a snapshot followed by changes. A restarted probe starts
//! fresh counters, as upstream does after a kubelet restart.

mod check;
mod grpc;
mod manager;
mod metrics;

pub use check::{Checked, ProbeCheck, run_check};

use nodeagent_config::{Config, Service};
use nodeagent_cri::Cri;
use nodeagent_proto::api::prober_server::ProberServer;
use nodeagent_transport::{Server, Shutdown, WithLimits};
use std::sync::Arc;

/// Runs the probe service until `shutdown`.
pub async fn run(config: Config, shutdown: Shutdown) -> anyhow::Result<()> {
    let cri = Cri::connect(
        &config.runtime_endpoint,
        config.kubelet.runtime_request_timeout,
    );
    let api = config.api_client().await?;
    let events = nodeagent_config::events::EventRecorder::new(api, &config.node_name);
    let manager = Arc::new(manager::ProbeManager::new(cri, events, shutdown.clone()));
    let follow = tokio::spawn(
        manager
            .clone()
            .follow_pod_sync(nodeagent_transport::connect(
                config.endpoint(Service::PodSync),
            )),
    );
    let server = Server::new(
        config.endpoint(Service::Probe).clone(),
        tonic::service::Routes::new(
            ProberServer::new(manager::ProberService(manager.clone())).with_limits(),
        ),
        &[<ProberServer<manager::ProberService> as tonic::server::NamedService>::NAME],
    );
    let served = server.serve(shutdown.clone()).await;
    shutdown.wait().await;
    follow.abort();
    manager.stop_all();
    served?;
    Ok(())
}
