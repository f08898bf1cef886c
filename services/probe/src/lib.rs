//! probe: one worker per probed container. It learns which containers run from
//! pod-sync's status stream, runs their probes (exec through CRI, httpGet, tcpSocket, gRPC),
//! and serves the results as a snapshot followed by changes. A restarted probe starts
//! fresh counters, as upstream does after a kubelet restart. Several instances may run at
//! once (`--probe-instance`), each probing its share of the pods (see `shard`).

pub mod cli;

mod check;
mod grpc;
mod manager;
mod metrics;
pub mod shard;
mod worker;

pub use check::{Checked, ProbeCheck, run_check};

use anyhow::Context;
use nodeagent_config::{Address, Config, Service};
use nodeagent_cri::Cri;
use nodeagent_proto::api::prober_server::ProberServer;
use nodeagent_transport::{Server, Shutdown, WithLimits};
use shard::Ownership;
use std::sync::Arc;

/// Runs the probe service until `shutdown`: the default instance when `instance` is
/// `None`, else the instance of that id (`auto`: a random one).
pub async fn run(
    config: Config,
    instance: Option<String>,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    let instance = instance
        .map(|flag| shard::resolve_instance_id(&flag, "/proc/sys/kernel/random/uuid".as_ref()))
        .transpose()?;
    let endpoint = match &instance {
        None => config.endpoint(Service::Probe).clone(),
        Some(id) => instance_endpoint(config.endpoint(Service::Probe), id)?,
    };
    let ownership = match &instance {
        None => Ownership::All,
        Some(id) => Ownership::Pending { me: id.clone() },
    };
    let cri = Cri::connect(
        &config.runtime_endpoint,
        config.kubelet.runtime_request_timeout,
    );
    let api = config.api_client().await?;
    let events = nodeagent_config::events::EventRecorder::new(api, &config.node_name);
    let manager = Arc::new(manager::ProbeManager::new(
        cri,
        events,
        shutdown.clone(),
        ownership,
    ));
    let pod_sync = nodeagent_transport::connect(config.endpoint(Service::PodSync));
    let follow = tokio::spawn(manager.clone().follow_pod_sync(pod_sync.clone()));
    let server = Server::new(
        endpoint.clone(),
        tonic::service::Routes::new(
            ProberServer::new(manager::ProberService(manager.clone())).with_limits(),
        ),
        &[<ProberServer<manager::ProberService> as tonic::server::NamedService>::NAME],
    );
    // `serve` runs until shutdown, so registration starts first; pod-sync's follower of
    // our endpoint retries (with back-off) until the socket below is bound.
    let register = instance.map(|id| {
        tracing::info!(probe.instance = %id, %endpoint, "probe instance");
        tokio::spawn(manager.clone().register(pod_sync, id, endpoint.to_string()))
    });
    let served = server.serve(shutdown.clone()).await;
    shutdown.wait().await;
    follow.abort();
    if let Some(register) = register {
        register.abort();
    }
    manager.stop_all();
    served?;
    Ok(())
}

/// Where instance `id` serves: `probe-<id>.sock` next to the default probe socket.
fn instance_endpoint(default: &Address, id: &str) -> anyhow::Result<Address> {
    default
        .probe_instance(id)
        .ok_or_else(|| {
            anyhow::anyhow!(
                "--probe-instance needs a unix probe endpoint (each instance serves its own socket)"
            )
        })
        .context("probe instance endpoint")
}
