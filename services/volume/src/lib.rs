//! volume: sets up each pod's volumes under `<root-dir>/pods/<uid>/volumes/<plugin>/<name>`
//! and tears them down. It keeps no state: what exists is read back from disk, so a
//! restarted volume service knows every mount its predecessor made.

pub mod cli;

pub mod atomic_writer;
pub mod csi;
mod fetch;
mod layout;
pub mod payload;
mod server;
mod subpath;

pub use layout::{Ensured, PodVolumeLayout, VolumeError};

use nodeagent_config::{Config, Service};
use nodeagent_proto::api::volume_server::VolumeServer;
use nodeagent_transport::{Server, Shutdown, WithLimits};

/// Runs the volume service until `shutdown`.
pub async fn run(config: Config, shutdown: Shutdown) -> anyhow::Result<()> {
    // The root directory and pods/ are 0750, as upstream's: below them lie every pod's
    // volumes. Both owners of pods/ make sure of it at start.
    nodeagent_config::state::prepare_root_dir(&config.root_dir).map_err(|e| {
        anyhow::anyhow!(
            "preparing the root directory {}: {e}",
            config.root_dir.display()
        )
    })?;
    let layout = PodVolumeLayout::new(config.root_dir.clone());
    match layout.list() {
        Ok(found) => {
            tracing::info!(volumes = found.len(), root = %config.root_dir.display(), "pod volumes found on disk")
        }
        Err(e) => tracing::warn!(error = %e, "cannot read existing pod volumes"),
    }
    if let Some(path) = &config.kubeconfig {
        tracing::info!(kubeconfig = %path.display(), "config maps, secrets and tokens come from the API server");
    }
    let api = config.api_client().await?;
    let fetcher = fetch::Fetcher::new(api.clone(), config.node_name.clone());
    let csi = csi::Csi::new(&config.root_dir, api.clone(), config.node_name.clone())
        .with_tokens(fetcher.clone());
    tokio::spawn(csi.registry.clone().run(shutdown.clone()));
    tokio::spawn(csi.clone().unstage_unused_periodically(shutdown.clone()));
    let stats = csi::stats::VolumeStats::new(csi.clone(), config.kubelet.volume_stats_agg_period);
    stats.restore();
    tokio::spawn(stats.clone().run(shutdown.clone()));
    let service = server::VolumeService::new(layout, fetcher, csi, stats);
    let server = Server::new(
        config.endpoint(Service::Volume).clone(),
        tonic::service::Routes::new(VolumeServer::new(service).with_limits()),
        &[<VolumeServer<server::VolumeService> as tonic::server::NamedService>::NAME],
    );
    server.serve(shutdown).await?;
    Ok(())
}
