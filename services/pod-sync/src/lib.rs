//! pod-sync: the sync loop. One worker per pod drives the runtime toward the desired pod
//! (sandbox, images, containers, restarts, termination) and publishes the pod's status.
//! Inputs: config-source (desired pods), pleg (runtime events and status), probe
//! (readiness), and the periodic resync and housekeeping ticks.

pub mod cli;

mod allocation;
mod container_manager;
mod images;
mod inputs;
mod node;
mod pod_resources;
mod probers;
mod restart_policy;
mod runonce;
mod runtime_spec;
mod saved;
mod server;
mod state;
mod status;
mod worker;

pub use container_manager::cgroups::{QosClass, qos_class};
pub use runonce::run_once;

use nodeagent_config::{Config, Service};
use nodeagent_cri::Cri;
use nodeagent_proto::api::PodStatusUpdate;
use nodeagent_proto::api::pleg_client::PlegClient;
use nodeagent_proto::api::pod_sync_server::PodSyncServer;
use nodeagent_proto::api::volume_client::VolumeClient;
use nodeagent_transport::{Channel, Server, Shutdown, WithLimits};
use runtime_spec::NodeContext;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{broadcast, mpsc};

/// Upstream housekeeping period.
const HOUSEKEEPING: Duration = Duration::from_secs(2);
/// Probe result updates queued from all instances' followers to the one applier.
const PROBE_RESULTS_QUEUE: usize = 256;

/// Everything a pod worker needs; shared by all of them.
pub struct PodSync {
    cri: Cri,
    volume: VolumeClient<Channel>,
    pleg: PlegClient<Channel>,
    node: NodeContext,
    state: Mutex<State>,
    workers: Mutex<HashMap<String, mpsc::Sender<()>>>,
    status_tx: broadcast::Sender<PodStatusUpdate>,
    /// Pending delayed wake-ups of pod workers, one per pod at most.
    delayed: Arc<worker::workers::DelayedTriggers>,
    /// Makes and removes the pod cgroups with the configured driver.
    cgroups: container_manager::cgroups::PodCgroups,
    /// Exclusive CPUs of Guaranteed containers (the `static` policy) and the shared set.
    cpu_manager: container_manager::cpu_manager::CpuManager,
    /// Devices from device plugins, and which container has which.
    device_manager: Arc<container_manager::device_manager::DeviceManager>,
    /// `kubepods` and the QoS tiers as last set (one update at a time).
    qos_set: tokio::sync::Mutex<Vec<container_manager::cgroups::QosTier>>,
    /// What the host can enforce of a pod's security context.
    host_security: runtime_spec::security::HostSecurity,
    /// The API server, when the node is connected to one.
    api: Option<kube::Client>,
    /// The RuntimeClasses' handlers (from the API server).
    runtime_classes: runtime_spec::runtime_class::RuntimeClasses,
    /// Upstream's container and pod events (Pulling, Created, Killing, BackOff, ...).
    events: nodeagent_config::events::EventRecorder,
    shutdown: Shutdown,
    /// When this process started (unix nanos): a pod whose sandbox is older was started
    /// by an earlier pod-sync, and its start is not counted again.
    started_unix_nanos: i64,
    /// The container GC's keep count and minimum age.
    gc: worker::gc::Policy,
    /// `syncFrequency`: each pod is synced again this long after its last sync, and up
    /// to half as long again (upstream's per-worker resync, `workerResyncIntervalJitterFactor`).
    resync: Duration,
    /// The image GC's policy and records (also used by the eviction manager's reclaim).
    image_gc: tokio::sync::Mutex<images::image_gc::ImageGc>,
    /// Where the finished pods' records are kept (`finished`), and one save at a time.
    finished_store: status::finished::Store,
    finished_saves: tokio::sync::Mutex<()>,
    /// Where the pods' allocations are kept (`allocation`), and one save at a time.
    allocation_store: allocation::Store,
    allocation_saves: tokio::sync::Mutex<()>,
}

use state::State;

impl PodSync {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Refuses to start with a cgroup driver that is not the runtime's: pods would get
/// cgroup parents the runtime cannot use (upstream asks the runtime too, KEP-4033). A
/// runtime that does not answer within a few seconds, or does not say, is not checked.
async fn check_runtime_cgroup_driver(
    cri: &Cri,
    want: nodeagent_config::cgroup_name::CgroupDriver,
) -> anyhow::Result<()> {
    let mut runtime = cri.runtime.clone();
    let request = cri.request(nodeagent_cri::api::StatusRequest { verbose: true });
    let status = match tokio::time::timeout(Duration::from_secs(5), runtime.status(request)).await {
        Ok(Ok(status)) => status.into_inner(),
        Ok(Err(e)) => {
            tracing::warn!(error = %e.message(), "cannot compare cgroupDriver with the runtime's: its status failed");
            return Ok(());
        }
        Err(_) => {
            tracing::warn!(
                "cannot compare cgroupDriver with the runtime's: its status did not come within 5 s"
            );
            return Ok(());
        }
    };
    match status
        .info
        .get("config")
        .and_then(|c| container_manager::cgroups::runtime_cgroup_driver(c))
    {
        // Upstream's words when dockershim found the same (docker_service.go).
        Some((handler, theirs)) if theirs != want => anyhow::bail!(
            "misconfiguration: kubelet cgroup driver: {:?} is different from the runtime's cgroup driver: {:?} (containerd's default handler {handler:?} has SystemdCgroup = {}); set cgroupDriver or the runtime's option so they agree (deploy/runtime/setup.sh: NODEAGENT_SYSTEMD_CGROUP=true for systemd)",
            want.as_str(),
            theirs.as_str(),
            theirs == nodeagent_config::cgroup_name::CgroupDriver::Systemd,
        ),
        Some((handler, _)) => {
            tracing::info!(cgroup_driver = want.as_str(), %handler, "cgroupDriver is the runtime's")
        }
        None => tracing::info!(
            cgroup_driver = want.as_str(),
            "the runtime does not say its cgroup driver; cgroupDriver is taken as it is"
        ),
    }
    Ok(())
}

/// Runs pod-sync until `shutdown`.
pub async fn run(config: Config, shutdown: Shutdown) -> anyhow::Result<()> {
    // The root directory and pods/ are 0750, as upstream's: below them lie every pod's
    // volumes. Both owners of pods/ make sure of it at start.
    nodeagent_config::state::prepare_root_dir(&config.root_dir).map_err(|e| {
        anyhow::anyhow!(
            "preparing the root directory {}: {e}",
            config.root_dir.display()
        )
    })?;
    // upstream's validateNodeAllocatable: a node that reserves more than it has starts
    // nothing ("Failed to start ContainerManager").
    node::admission::validate_reservation(&config.kubelet, &config.root_dir)
        .map_err(|e| anyhow::anyhow!("Failed to start ContainerManager: {e}"))?;
    let cri = Cri::connect_limited(
        &config.runtime_endpoint,
        config.kubelet.runtime_request_timeout,
        // Bounds the runtime's expensive calls (`--max-parallel-runtime-calls`, adaptive
        // by default); pod workers themselves are not bounded: each waits (grace periods,
        // hooks, pulls, back-offs) on its own.
        config.max_parallel_runtime_calls,
    );
    let cgroup_driver = config.kubelet.cgroup_driver();
    let cgroups =
        container_manager::cgroups::PodCgroups::new("/sys/fs/cgroup".into(), cgroup_driver)
            .await
            .map_err(anyhow::Error::msg)?;
    check_runtime_cgroup_driver(&cri, cgroup_driver).await?;
    let api = config.api_client().await?;
    let events = nodeagent_config::events::EventRecorder::new(api.clone(), &config.node_name);
    // upstream's system-reserved and kube-reserved enforcement: once, at start; a cgroup
    // that is missing stops the start (upstream's kubelet fails its container manager).
    for reserved in container_manager::reserved::enforced(&config.kubelet) {
        use nodeagent_config::events::EventType;
        match container_manager::reserved::enforce(
            std::path::Path::new("/sys/fs/cgroup"),
            &reserved,
        ) {
            Ok(()) => {
                tracing::info!(cgroup = %reserved.cgroup, "{}", reserved.success_message());
                events.node(
                    EventType::Normal,
                    "SuccessfulNodeAllocatableEnforcement",
                    &reserved.success_message(),
                );
            }
            Err(message) => {
                events.node(
                    EventType::Warning,
                    "FailedNodeAllocatableEnforcement",
                    &message,
                );
                anyhow::bail!("Failed to start ContainerManager: {message}");
            }
        }
    }
    // upstream's `start cpu manager error`: a state file of another policy, or one that
    // does not fit this machine, stops the start (nothing is touched).
    let cpu_manager =
        container_manager::cpu_manager::CpuManager::start(&config.kubelet, &config.root_dir)
            .map_err(|e| anyhow::anyhow!("start cpu manager error: {e}"))?;
    let device_manager = Arc::new(
        container_manager::device_manager::DeviceManager::start(&config.root_dir)
            .map_err(|e| anyhow::anyhow!("failed to start device plugin manager: {e}"))?,
    );
    // `--node-ip`'s first address, as upstream's pods' hostIP; else the detected one.
    // `--node-ip` (all of it, as upstream's nodeIPs), else the detected address.
    let ips = status::ips::NodeIps::new(
        &config.node_ips,
        &nodeagent_config::machine::node_ips(&config.node_ips),
    );
    tracing::info!(host_ips = ?ips.host_ips, "node addresses");
    // Its slots are allocated at once (136 B each); a watcher more than 1024 messages
    // behind is cut off and resubscribes for a fresh snapshot.
    let (status_tx, _) = broadcast::channel(1024);
    // What pod-sync published last of probe results, so a restart flips no readiness.
    let probe_store = status::probe_state::store(&config.root_dir);
    let saved = probe_store.load().await;
    // The pods that finished, so that none of them runs again after a restart.
    let finished_store = status::finished::store(&config.root_dir);
    let finished = finished_store.load().await;
    if !finished.is_empty() {
        tracing::info!(
            pods = finished.len(),
            "finished pods restored; they will not run again"
        );
    }
    // What each pod was allocated, so a restart neither forgets a deferred resize nor a
    // container not yet updated.
    let allocation_store = allocation::store(&config.root_dir);
    let allocations = allocation_store.load().await;
    let sync = Arc::new(PodSync {
        started_unix_nanos: nodeagent_cri::now_nanos(),
        cri,
        volume: VolumeClient::new(nodeagent_transport::connect(
            config.endpoint(Service::Volume),
        ))
        .with_limits(),
        pleg: PlegClient::new(nodeagent_transport::connect(config.endpoint(Service::Pleg)))
            .with_limits(),
        node: NodeContext {
            node_name: config.node_name.clone(),
            pod_logs_dir: config.kubelet.pod_logs_dir.clone(),
            cgroups_per_qos: config.kubelet.cgroups_per_qos,
            cgroup_root: config.kubelet.cgroup_root.clone(),
            cgroup_driver,
            cluster_dns: config.kubelet.cluster_dns.clone(),
            cluster_domain: config.kubelet.cluster_domain.clone(),
            resolv_conf: config.kubelet.resolv_conf.clone(),
            ips,
            root_dir: config.root_dir.clone(),
            pod_pids_limit: config.kubelet.pod_pids_limit,
            memory_capacity: nodeagent_config::machine::memory_bytes(),
            seccomp_default: config.kubelet.seccomp_default,
            allocatable: node::admission::NodeResources::of_this_node(
                &config.kubelet,
                &config.root_dir,
            ),
            pods_limits: container_manager::cgroups::PodsLimits::of_this_node(&config.kubelet),
            memory_qos: container_manager::memory_qos::MemoryQos::of_this_node(
                &config.kubelet,
                std::path::Path::new("/sys/fs/cgroup"),
            ),
        },
        state: Mutex::new(State {
            readiness: saved.ready,
            started: saved.started,
            finished,
            allocations,
            ..State::default()
        }),
        workers: Mutex::new(HashMap::new()),
        status_tx,
        delayed: Default::default(),
        cgroups,
        cpu_manager,
        device_manager: device_manager.clone(),
        qos_set: Default::default(),
        host_security: runtime_spec::security::HostSecurity::detect(
            config.kubelet.allowed_unsafe_sysctls.clone(),
        ),
        api: api.clone(),
        runtime_classes: runtime_spec::runtime_class::RuntimeClasses::new(api.is_some()),
        events,
        shutdown: shutdown.clone(),
        gc: worker::gc::Policy {
            max_per_container: config.maximum_dead_containers_per_container,
            min_age: config.minimum_container_ttl_duration,
        },
        resync: config.kubelet.sync_frequency,
        image_gc: tokio::sync::Mutex::new(images::image_gc::ImageGc::new(
            images::image_gc::Policy::from_config(&config),
            &config.root_dir,
        )),
        finished_store,
        finished_saves: Default::default(),
        allocation_store,
        allocation_saves: Default::default(),
    });
    // What the runtime says it supports (CRI Status `features`), for the pod admission of
    // `supplementalGroupsPolicy: Strict`; asked until the runtime answers.
    {
        let supported = sync.host_security.supplemental_groups_policy.clone();
        let mut runtime = sync.cri.runtime.clone();
        tokio::spawn(async move {
            loop {
                let request = nodeagent_proto::cri::StatusRequest { verbose: false };
                if let Ok(status) = runtime.status(request).await {
                    let features = status.into_inner().features.unwrap_or_default();
                    supported.store(
                        features.supplemental_groups_policy,
                        std::sync::atomic::Ordering::Relaxed,
                    );
                    break;
                }
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        });
    }

    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(inputs::follow_config_source(
        sync.clone(),
        nodeagent_transport::connect(config.endpoint(Service::ConfigSource)),
    ));
    tasks.spawn(inputs::follow_pleg(sync.clone()));
    // Every probe instance's results go to one applier; the default instance's socket is
    // followed always (a node without `--probe-instance` works as before), registered
    // instances from their registration on.
    let (results_tx, results_rx) = mpsc::channel(PROBE_RESULTS_QUEUE);
    tasks.spawn(inputs::apply_probe_results(
        sync.clone(),
        probe_store,
        results_rx,
    ));
    tasks.spawn(inputs::follow_probe(
        shutdown.clone(),
        String::new(),
        nodeagent_transport::connect(config.endpoint(Service::Probe)),
        results_tx.clone(),
    ));
    let follower_shutdown = shutdown.clone();
    let probers = Arc::new(probers::Probers::new(
        Box::new(move |id, address| {
            tokio::spawn(inputs::follow_probe(
                follower_shutdown.clone(),
                id,
                nodeagent_transport::connect(&address),
                results_tx.clone(),
            ))
        }),
        shutdown.clone(),
    ));
    if let Some(client) = api {
        tasks.spawn(
            sync.runtime_classes
                .clone()
                .run(client.clone(), shutdown.clone()),
        );
        tasks.spawn(status::api_status::run(sync.clone(), client));
    }
    tasks.spawn(node::log_rotation::run(
        sync.cri.clone(),
        config.kubelet.pod_logs_dir.clone(),
        node::log_rotation::Policy::from_config(&config).map_err(anyhow::Error::msg)?,
        shutdown.clone(),
    ));
    tasks.spawn(worker::gc::run(
        sync.clone(),
        sync.gc,
        config.container_gc_period,
    ));
    tasks.spawn(images::image_gc::run(sync.clone()));
    tasks.spawn(container_manager::cpu_manager::reconcile::run(
        sync.clone(),
        config.kubelet.cpu_manager_reconcile_period,
    ));
    tasks.spawn(container_manager::device_manager::release::run(
        sync.clone(),
    ));
    if let Some(policy) = node::shutdown::Policy::from_config(&config.kubelet) {
        tasks.spawn(node::shutdown::run(sync.clone(), policy));
    }
    tasks.spawn(node::eviction::run(
        sync.clone(),
        node::eviction::Manager::new(&config)?,
        config.eviction_monitoring_period,
    ));
    tasks.spawn(inputs::ticks(
        sync.clone(),
        config.kubelet.sync_frequency,
        HOUSEKEEPING,
    ));

    let service = server::PodSyncService {
        sync: sync.clone(),
        probers,
    };
    let server = Server::new(
        config.endpoint(Service::PodSync).clone(),
        tonic::service::Routes::new(PodSyncServer::new(service).with_limits()),
        &[<PodSyncServer<server::PodSyncService> as tonic::server::NamedService>::NAME],
    );
    // The systemd watchdog follows the housekeeping loop, and the state lock: a stuck
    // loop or a lock held for long stops the pings, and systemd restarts pod-sync, which
    // disturbs no pod.
    let watched = sync.clone();
    let liveness: nodeagent_transport::LivenessCheck = Arc::new(move || {
        let st = watched
            .state
            .try_lock()
            .map_err(|_| "the state lock is held".to_string())?;
        match st.heartbeat {
            Some(t) if t.elapsed() > std::time::Duration::from_secs(25) => {
                Err(format!("housekeeping has not run for {:?}", t.elapsed()))
            }
            _ => Ok(()),
        }
    });
    // upstream's pod-resources API, on a socket of its own under the root directory.
    let pod_resources = Server::new(
        nodeagent_config::Address::Unix(pod_resources::socket(&config.root_dir)),
        tonic::service::Routes::new(
            nodeagent_proto::podresources::pod_resources_lister_server::PodResourcesListerServer::new(
                pod_resources::Service { sync: sync.clone() },
            ),
        ),
        &["v1.PodResourcesLister"],
    );
    let pod_resources = tokio::spawn(pod_resources.serve(shutdown.clone()));
    // upstream's device plugin registration server, in the plugins' directory.
    let registration = Server::new(
        nodeagent_config::Address::Unix(device_manager.socket()),
        tonic::service::Routes::new(
            nodeagent_proto::deviceplugin::registration_server::RegistrationServer::new(
                container_manager::device_manager::plugins::RegistrationService {
                    manager: device_manager.clone(),
                },
            ),
        ),
        &["v1beta1.Registration"],
    );
    let registration = tokio::spawn(registration.serve(shutdown.clone()));
    let served = server.with_liveness(liveness).serve(shutdown.clone()).await;
    let _ = pod_resources.await;
    let _ = registration.await;
    shutdown.wait().await;
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    served?;
    Ok(())
}
