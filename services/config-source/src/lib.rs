//! config-source: the desired set of pods on this node, merged from every pod source,
//! served as a snapshot followed by ordered deltas.

pub mod cli;

pub mod api;
mod file;
mod http;
pub mod manifest;
mod server;
pub mod store;
pub mod validation;

use nodeagent_config::{Config, Service};
use nodeagent_proto::api::config_source_server::ConfigSourceServer;
use nodeagent_transport::{LoopHealth, Server, Shutdown, WithLimits};
use std::sync::{Arc, Mutex};

/// Runs config-source until `shutdown`.
pub async fn run(config: Config, shutdown: Shutdown) -> anyhow::Result<()> {
    let mut sources = Vec::new();
    if config.kubelet.static_pod_path.is_some() {
        sources.push("file");
    }
    if config.kubelet.static_pod_url.is_some() {
        sources.push("http");
    }
    if config.kubeconfig.is_some() {
        sources.push("api");
    }
    let store = Arc::new(Mutex::new(store::PodStore::new(sources)));
    // A source loop that stops beating makes config-source report NOT_SERVING.
    let loops = LoopHealth::default();
    let mut tasks = tokio::task::JoinSet::new();
    if let Some(path) = config.kubelet.static_pod_path.clone() {
        tracing::info!(path = %path.display(), "watching static pod path");
        let source = file::FileSource::new(
            path,
            config.node_name.clone(),
            config.kubelet.file_check_frequency,
            store.clone(),
        );
        let heartbeat = loops.register("file source", source.max_silence());
        tasks.spawn(source.run(shutdown.clone(), heartbeat));
    }
    if let Some(url) = config.kubelet.static_pod_url.clone() {
        tracing::info!(url = %http::loggable_url(&url), "fetching static pods from URL");
        let source = http::HttpSource::new(
            url,
            config.kubelet.static_pod_url_header.clone(),
            config.node_name.clone(),
            config.kubelet.http_check_frequency,
            store.clone(),
        )
        .map_err(|e| anyhow::anyhow!(e))?;
        let heartbeat = loops.register("http source", source.max_silence());
        tasks.spawn(source.run(shutdown.clone(), heartbeat));
    }
    if let (Some(path), Some(client)) = (&config.kubeconfig, config.api_client().await?) {
        tracing::info!(kubeconfig = %path.display(), "watching the API server for pods bound to this node");
        let source = api::ApiSource::new(
            client,
            config.node_name.clone(),
            store.clone(),
            &config.root_dir,
        );
        tasks.spawn(source.run(shutdown.clone()));
    }
    let service = server::ConfigSourceService {
        store,
        shutdown: shutdown.clone(),
    };
    let server = Server::new(
        config.endpoint(Service::ConfigSource).clone(),
        tonic::service::Routes::new(ConfigSourceServer::new(service).with_limits()),
        &[<ConfigSourceServer<server::ConfigSourceService> as tonic::server::NamedService>::NAME],
    );
    let served = server.with_loop_health(loops).serve(shutdown.clone()).await;
    shutdown.wait().await;
    while tasks.join_next().await.is_some() {}
    served?;
    Ok(())
}
