//! `--runonce` (upstream `kubelet --runonce`): run the static pods once, wait until they
//! run, print their status, and exit, leaving the pods running. The services pod-sync
//! needs (config-source, pleg, volume) run inside this process on private sockets, so
//! nothing else has to be up.

use nodeagent_config::{Address, Config, Service};
use nodeagent_proto::api::config_source_client::ConfigSourceClient;
use nodeagent_proto::api::pod_sync_client::PodSyncClient;
use nodeagent_proto::api::{ListPodsRequest, WatchConfigRequest};
use nodeagent_proto::k8s;
use nodeagent_transport::WithLimits;
use nodeagent_transport::{Shutdown, shutdown_channel};
use std::time::Duration;

/// Upstream gives up after 10 retries with back-off; we wait this long in all.
const RUN_ONCE_DEADLINE: Duration = Duration::from_secs(180);

pub async fn run_once(mut config: Config, outer: Shutdown) -> anyhow::Result<()> {
    if config.kubeconfig.is_some() {
        anyhow::bail!("--runonce runs static pods only; it cannot be used with --kubeconfig");
    }
    let dir = config
        .root_dir
        .join(format!("runonce-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    for s in [
        Service::ConfigSource,
        Service::Pleg,
        Service::Volume,
        Service::PodSync,
        Service::Probe,
    ] {
        config
            .endpoints
            .insert(s, Address::Unix(dir.join(format!("{}.sock", s.name()))));
    }
    let (trigger, shutdown) = shutdown_channel();
    let mut services = tokio::task::JoinSet::new();
    services.spawn(config_source::run(config.clone(), shutdown.clone()));
    services.spawn(pleg::run(config.clone(), shutdown.clone()));
    services.spawn(volume::run(config.clone(), shutdown.clone()));
    services.spawn(crate::run(config.clone(), shutdown.clone()));

    let result = tokio::select! {
        r = wait_for_pods(&config) => r,
        _ = outer.wait() => Err(anyhow::anyhow!("interrupted")),
    };
    trigger.trigger();
    while services.join_next().await.is_some() {}
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// Waits until every static pod runs (or has succeeded); prints each pod's status.
async fn wait_for_pods(config: &Config) -> anyhow::Result<()> {
    let config_source = nodeagent_transport::connect(config.endpoint(Service::ConfigSource));
    let pod_sync = PodSyncClient::new(nodeagent_transport::connect(
        config.endpoint(Service::PodSync),
    ))
    .with_limits();
    let until = tokio::time::Instant::now() + RUN_ONCE_DEADLINE;
    let wanted = loop {
        let mut client = ConfigSourceClient::new(config_source.clone()).with_limits();
        if let Ok(resp) = client.watch(WatchConfigRequest::default()).await
            && let Ok(Some(snapshot)) = resp.into_inner().message().await
            && snapshot.all_sources_ready
        {
            break snapshot.pods.len();
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < until,
            "the static pods were not read in time"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    tracing::info!(pods = wanted, "runonce: waiting for the static pods to run");
    loop {
        let mut client = pod_sync.clone();
        let pods: Vec<_> = match client.list_pods(ListPodsRequest {}).await {
            Ok(r) => r
                .into_inner()
                .pods_json
                .iter()
                .filter_map(|b| k8s::decode_pod(b).ok())
                .collect(),
            Err(_) => Vec::new(),
        };
        let done = pods.len() == wanted && pods.iter().all(ran);
        if done || tokio::time::Instant::now() >= until {
            for pod in &pods {
                println!("{}", summary(pod));
            }
            anyhow::ensure!(
                done,
                "not every static pod ran within {RUN_ONCE_DEADLINE:?}"
            );
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Upstream's test: every container running (or the pod has already succeeded).
fn ran(pod: &k8s_openapi::api::core::v1::Pod) -> bool {
    let status = pod.status.clone().unwrap_or_default();
    if status.phase.as_deref() == Some("Succeeded") {
        return true;
    }
    let statuses = status.container_statuses.unwrap_or_default();
    !statuses.is_empty()
        && statuses
            .iter()
            .all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
}

/// One JSON line per pod: name, uid, phase, and each container's state.
fn summary(pod: &k8s_openapi::api::core::v1::Pod) -> String {
    let status = pod.status.clone().unwrap_or_default();
    let containers: Vec<serde_json::Value> = status
        .container_statuses
        .unwrap_or_default()
        .into_iter()
        .map(|c| {
            let state = c.state.unwrap_or_default();
            let s = if state.running.is_some() {
                "running"
            } else if state.terminated.is_some() {
                "terminated"
            } else {
                "waiting"
            };
            serde_json::json!({"name": c.name, "state": s, "containerID": c.container_id, "restartCount": c.restart_count})
        })
        .collect();
    serde_json::json!({
        "pod": k8s::pod_name(pod),
        "namespace": k8s::pod_namespace(pod),
        "uid": k8s::pod_uid(pod),
        "phase": status.phase,
        "podIP": status.pod_ip,
        "containers": containers,
    })
    .to_string()
}
