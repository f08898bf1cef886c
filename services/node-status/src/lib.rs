//! node-status: the Node object of this node, built from /proc, the container runtime
//! (CRI Version and Status) and pleg's health. It is served locally; with an API server
//! the Node is also registered there, its status kept current, and its Lease renewed.

pub mod cli;

mod api;
mod machine;
pub mod oom;
pub mod pressure;

pub use machine::{MachineInfo, read_machine_info};

use k8s_openapi::api::core::v1::{
    ContainerImage, DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints,
    NodeStatus, NodeSystemInfo,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use nodeagent_config::certificate;
use nodeagent_config::eviction::Condition;
use nodeagent_config::{Config, Service};
use nodeagent_cri::Cri;
use nodeagent_proto::api::node_status_server::{NodeStatus as NodeStatusApi, NodeStatusServer};
use nodeagent_proto::api::pleg_client::PlegClient;
use nodeagent_proto::api::pod_sync_client::PodSyncClient;
use nodeagent_proto::api::volume_client::VolumeClient;
use nodeagent_proto::api::{
    DeviceResourcesRequest, DeviceResourcesResponse, GetNodeRequest, GetNodeResponse,
    PlegHealthRequest, VolumesInUseRequest,
};
use nodeagent_transport::{Channel, Server, Shutdown, WithLimits};
use std::collections::BTreeMap;
use std::sync::Arc;
use tonic::{Request, Response, Status};

pub struct NodeStatusService {
    cri: Cri,
    pleg: PlegClient<Channel>,
    /// The device plugins' resources, from pod-sync's device manager.
    pod_sync: PodSyncClient<Channel>,
    /// What pod-sync said of them last, kept while it restarts.
    devices: std::sync::Mutex<DeviceResourcesResponse>,
    /// The volume service, for the volumes in use.
    volume: VolumeClient<Channel>,
    /// What it said of them last, kept while it restarts; None before its first answer
    /// (the Node's list is then left as it is).
    volumes_in_use: std::sync::Mutex<Option<Vec<String>>>,
    node_name: String,
    port: u16,
    max_pods: u32,
    root_dir: std::path::PathBuf,
    kubelet: nodeagent_config::KubeletConfiguration,
    monitor: Arc<pressure::Monitor>,
    /// Each condition's last status and when it took it (lastTransitionTime).
    transitions: std::sync::Mutex<BTreeMap<String, (String, Time)>>,
    /// `--node-ip` (empty: detected).
    node_ips: Vec<std::net::IpAddr>,
    /// `--node-labels`, `registerWithTaints`, `providerID`, `--cloud-provider=external`:
    /// what the Node is registered with.
    node_labels: BTreeMap<String, String>,
    external_cloud_provider: bool,
}

/// Runs node-status until `shutdown`.
pub async fn run(config: Config, shutdown: Shutdown) -> anyhow::Result<()> {
    let cri = Cri::connect(
        &config.runtime_endpoint,
        config.kubelet.runtime_request_timeout,
    );
    let client = match &config.kubeconfig {
        Some(path) => {
            // node-status owns the client certificate: it bootstraps it (the other
            // services wait for the kubeconfig it writes) and rotates it.
            if let Some(bootstrap) = &config.bootstrap_kubeconfig {
                let metrics = certificate::Metrics::get(certificate::Kind::Client);
                certificate::bootstrap_client(
                    path,
                    bootstrap,
                    &config.cert_dir,
                    &config.node_name,
                    &metrics,
                )
                .await?;
            }
            Some(nodeagent_config::kube_client(path).await?)
        }
        None => None,
    };
    let rotation = match &client {
        Some(client)
            if config.kubelet.rotate_certificates && config.bootstrap_kubeconfig.is_some() =>
        {
            Some(tokio::spawn(
                certificate::Rotator {
                    kind: certificate::Kind::Client,
                    cert_dir: config.cert_dir.clone(),
                    node: config.node_name.clone(),
                    sans: Vec::new(),
                    client: client.clone(),
                    metrics: certificate::Metrics::get(certificate::Kind::Client),
                    on_new: Box::new(|_| {}),
                }
                .run(),
            ))
        }
        _ => None,
    };
    let events = nodeagent_config::events::EventRecorder::new(client.clone(), &config.node_name);
    let ooms = tokio::spawn(oom::run(
        config.root_dir.clone(),
        cri.clone(),
        events.clone(),
        shutdown.clone(),
    ));
    let monitor = Arc::new(pressure::Monitor::new(&config, cri.clone(), events)?);
    let watching = tokio::spawn(
        monitor
            .clone()
            .run(shutdown.clone(), config.eviction_monitoring_period),
    );
    let service = Arc::new(NodeStatusService {
        cri,
        pleg: PlegClient::new(nodeagent_transport::connect(config.endpoint(Service::Pleg)))
            .with_limits(),
        pod_sync: PodSyncClient::new(nodeagent_transport::connect(
            config.endpoint(Service::PodSync),
        ))
        .with_limits(),
        devices: Default::default(),
        volume: VolumeClient::new(nodeagent_transport::connect(
            config.endpoint(Service::Volume),
        ))
        .with_limits(),
        volumes_in_use: Default::default(),
        node_name: config.node_name.clone(),
        port: config.kubelet.port,
        max_pods: config.kubelet.max_pods,
        root_dir: config.root_dir.clone(),
        kubelet: config.kubelet.clone(),
        monitor,
        transitions: Default::default(),
        node_ips: config.node_ips.clone(),
        node_labels: config.node_labels.clone(),
        external_cloud_provider: config.external_cloud_provider,
    });
    let reporter = match client {
        Some(client) => {
            let reporter = api::NodeReporter {
                service: service.clone(),
                client,
                status_every: config.kubelet.node_status_update_frequency,
                report_every: config.kubelet.node_status_report_frequency,
                lease_seconds: config.kubelet.node_lease_duration_seconds,
            };
            Some(tokio::spawn(reporter.run(shutdown.clone())))
        }
        None => None,
    };
    let server = Server::new(
        config.endpoint(Service::NodeStatus).clone(),
        tonic::service::Routes::new(NodeStatusServer::from_arc(service).with_limits()),
        &[<NodeStatusServer<NodeStatusService> as tonic::server::NamedService>::NAME],
    );
    let served = server.serve(shutdown).await;
    if let Some(r) = reporter {
        r.abort();
    }
    watching.abort();
    if let Some(r) = rotation {
        r.abort();
    }
    // The OOM watcher saves its position on the way out.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), ooms).await;
    served?;
    Ok(())
}

/// upstream's `nodeStatusMaxImages` and `maxNamesPerImageInNodeStatus`.
const MAX_IMAGES: usize = 50;
const MAX_NAMES_PER_IMAGE: usize = 5;

/// The taint a node registered with `--cloud-provider=external` carries until the cloud
/// controller initialises it (upstream's `TaintExternalCloudProvider`).
const CLOUD_TAINT: &str = "node.cloudprovider.kubernetes.io/uninitialized";
/// The annotation that hands `--node-ip` to the cloud controller (upstream's
/// `AnnotationAlphaProvidedIPAddr`).
const PROVIDED_IP: &str = "alpha.kubernetes.io/provided-node-ip";
/// The annotation that hands the node's volume attach and detach to the attach/detach
/// controller (`volumeutil.ControllerManagedAttachAnnotation`). Upstream's kubelet sets it
/// under `enableControllerAttachDetach` (its default); ours never attaches itself, so it
/// always does.
pub const CONTROLLER_MANAGED_ATTACH: &str =
    "volumes.kubernetes.io/controller-managed-attach-detach";

/// The node's addresses as upstream's `NodeAddress` setter gives them without a cloud
/// provider: each `--node-ip` (or the detected one) as InternalIP, then the Hostname.
fn addresses(node_name: &str, node_ips: &[std::net::IpAddr]) -> Vec<NodeAddress> {
    nodeagent_config::machine::node_ips(node_ips)
        .into_iter()
        .map(|address| NodeAddress {
            type_: "InternalIP".into(),
            address,
        })
        .chain([NodeAddress {
            type_: "Hostname".into(),
            address: node_name.to_string(),
        }])
        .collect()
}

/// The status to write over `existing` (what the API server has): ours, except that a
/// condition type we do not set (node-problem-detector's, a CNI's) stays, in its place,
/// and so does an address of a type we do not set (a cloud controller's ExternalIP); with
/// `--cloud-provider=external`, addresses the Node already has are the cloud
/// controller's and stay whole (upstream's `NodeAddress` setter).
pub fn merged_status(
    existing: Option<&NodeStatus>,
    mut ours: NodeStatus,
    external: bool,
) -> NodeStatus {
    let Some(existing) = existing else {
        return ours;
    };
    let mine = ours.conditions.take().unwrap_or_default();
    let mut conditions = existing.conditions.clone().unwrap_or_default();
    for c in mine {
        match conditions.iter_mut().find(|e| e.type_ == c.type_) {
            Some(e) => *e = c,
            None => conditions.push(c),
        }
    }
    ours.conditions = Some(conditions);
    // The attach/detach controller's (its `nodestatusupdater` writes it; the kubelet
    // never does).
    ours.volumes_attached = existing.volumes_attached.clone();
    let theirs = existing.addresses.clone().unwrap_or_default();
    if external && !theirs.is_empty() {
        ours.addresses = Some(theirs);
    } else {
        let mine = ours.addresses.take().unwrap_or_default();
        let others = theirs
            .into_iter()
            .filter(|a| !mine.iter().any(|m| m.type_ == a.type_));
        ours.addresses = Some(mine.iter().cloned().chain(others).collect());
    }
    // An extended resource the Node has and we do not report stays: one an administrator
    // advertised by patching the Node's status (upstream's documented way for node-level
    // extended resources), or one of a device plugin retired before our restart.
    for (mine, theirs) in [
        (&mut ours.capacity, &existing.capacity),
        (&mut ours.allocatable, &existing.allocatable),
    ] {
        if let (Some(mine), Some(theirs)) = (mine.as_mut(), theirs) {
            for (name, q) in theirs {
                if nodeagent_config::names::is_extended_resource_name(name) {
                    mine.entry(name.clone()).or_insert_with(|| q.clone());
                }
            }
        }
    }
    ours
}

/// The device plugins' resources on the Node (upstream's `MachineInfo` setter): each one's
/// devices as capacity and its healthy ones as allocatable; a retired one zero in both.
pub fn extended_resources(
    capacity: &mut BTreeMap<String, u64>,
    allocatable: &mut BTreeMap<String, u64>,
    devices: &DeviceResourcesResponse,
) {
    for r in &devices.retired {
        capacity.insert(r.clone(), 0);
        allocatable.insert(r.clone(), 0);
    }
    capacity.extend(devices.capacity.iter().map(|(k, v)| (k.clone(), *v)));
    allocatable.extend(devices.allocatable.iter().map(|(k, v)| (k.clone(), *v)));
}

impl NodeStatusService {
    /// pod-sync's device resources, or what it said last while it does not answer (a
    /// restart of pod-sync changes nothing on the Node).
    async fn device_resources(&self) -> DeviceResourcesResponse {
        let mut client = self.pod_sync.clone();
        let asked = tokio::time::timeout(
            std::time::Duration::from_secs(2),
            client.device_resources(DeviceResourcesRequest {}),
        )
        .await;
        let mut last = self.devices.lock().unwrap_or_else(|e| e.into_inner());
        match asked {
            Ok(Ok(r)) => *last = r.into_inner(),
            Ok(Err(e)) => {
                tracing::debug!(error = %e.message(), "pod-sync's device resources: keeping the last known")
            }
            Err(_) => {
                tracing::debug!("pod-sync's device resources: timed out, keeping the last known")
            }
        }
        last.clone()
    }

    /// The volume service's volumes in use (upstream's `GetVolumesInUse`), or what it said
    /// last while it does not answer: a restart of the volume service must not empty the
    /// list, or the attach/detach controller could detach a volume still mounted. None
    /// before its first answer.
    async fn volumes_in_use(&self) -> Option<Vec<String>> {
        let mut client = self.volume.clone();
        let asked = tokio::time::timeout(
            std::time::Duration::from_secs(2),
            client.volumes_in_use(VolumesInUseRequest {}),
        )
        .await;
        let mut last = self
            .volumes_in_use
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match asked {
            Ok(Ok(r)) => *last = Some(r.into_inner().names),
            Ok(Err(e)) => {
                tracing::debug!(error = %e.message(), "volumes in use: keeping the last known")
            }
            Err(_) => tracing::debug!("volumes in use: timed out, keeping the last known"),
        }
        last.clone()
    }

    /// Whether the volume service has answered since the start.
    fn volumes_in_use_known(&self) -> bool {
        self.volumes_in_use
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// A condition stamped now (lastHeartbeatTime), with the time it last changed status.
    fn condition(&self, kind: &str, ok: bool, reason: &str, message: &str) -> NodeCondition {
        let status = if ok { "True" } else { "False" };
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let since = {
            let mut t = self.transitions.lock().unwrap_or_else(|e| e.into_inner());
            let entry = t
                .entry(kind.to_string())
                .or_insert_with(|| (status.to_string(), now.clone()));
            if entry.0 != status {
                *entry = (status.to_string(), now.clone());
            }
            entry.1.clone()
        };
        NodeCondition {
            type_: kind.into(),
            status: status.into(),
            reason: Some(reason.into()),
            message: Some(message.into()),
            last_heartbeat_time: Some(now),
            last_transition_time: Some(since),
        }
    }

    async fn build(&self) -> Node {
        let machine = read_machine_info(&self.root_dir);
        let version = self.cri.version().await;
        let runtime_ready = self.runtime_ready().await;
        let mut pleg = self.pleg.clone();
        let pleg_health = pleg
            .health(PlegHealthRequest {})
            .await
            .map(|r| r.into_inner());
        let mut problems = Vec::new();
        if let Err(e) = &runtime_ready {
            problems.push(e.clone());
        }
        if nodeagent_config::machine::shutting_down(&self.root_dir) {
            problems.push("node is shutting down".to_string());
        }
        match &pleg_health {
            Ok(h) if !h.healthy => problems.push(format!("PLEG is not healthy: {}", h.message)),
            Err(e) => problems.push(format!("PLEG is not reachable: {}", e.message())),
            _ => {}
        }
        let ready = if problems.is_empty() {
            self.condition(
                "Ready",
                true,
                "KubeletReady",
                "kubelet is posting ready status",
            )
        } else {
            self.condition("Ready", false, "KubeletNotReady", &problems.join("; "))
        };
        let under_pressure = self.monitor.observe().await;
        let mut conditions: Vec<NodeCondition> = Condition::ALL
            .into_iter()
            .map(|c| {
                let on = under_pressure.contains(&c);
                let text = c.text(on);
                self.condition(c.name(), on, text.reason, text.message)
            })
            .collect();
        conditions.push(ready);
        let capacity: BTreeMap<String, u64> = [
            ("cpu", machine.cpus as u64 * 1000),
            ("memory", machine.memory_bytes),
            ("pods", u64::from(self.max_pods)),
            ("ephemeral-storage", machine.root_fs_bytes),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let mut allocatable = nodeagent_config::eviction::allocatable(
            &capacity,
            &self.kubelet,
            &self.monitor.thresholds(),
        );
        let mut capacity = capacity;
        let devices = self.device_resources().await;
        extended_resources(&mut capacity, &mut allocatable, &devices);
        let runtime_version = version
            .map(|v| format!("{}://{}", v.runtime_name, v.runtime_version))
            .unwrap_or_default();
        let volumes_in_use = self.volumes_in_use().await.filter(|v| !v.is_empty());
        Node {
            metadata: ObjectMeta {
                name: Some(self.node_name.clone()),
                labels: Some(BTreeMap::from([
                    ("kubernetes.io/hostname".to_string(), self.node_name.clone()),
                    ("kubernetes.io/os".to_string(), "linux".to_string()),
                    (
                        "kubernetes.io/arch".to_string(),
                        machine.architecture.clone(),
                    ),
                ])),
                ..Default::default()
            },
            spec: None,
            status: Some(NodeStatus {
                allocatable: Some(pressure::quantities(&allocatable)),
                capacity: Some(pressure::quantities(&capacity)),
                conditions: Some(conditions),
                addresses: Some(addresses(&self.node_name, &self.node_ips)),
                images: Some(self.images().await),
                daemon_endpoints: Some(NodeDaemonEndpoints {
                    kubelet_endpoint: Some(DaemonEndpoint {
                        port: self.port as i32,
                    }),
                }),
                node_info: Some(NodeSystemInfo {
                    architecture: machine.architecture,
                    boot_id: machine.boot_id,
                    container_runtime_version: runtime_version,
                    kernel_version: machine.kernel_version,
                    kube_proxy_version: String::new(),
                    kubelet_version: concat!("v1.37.0-nodeagent.", env!("CARGO_PKG_VERSION"))
                        .into(),
                    machine_id: machine.machine_id,
                    operating_system: "linux".into(),
                    os_image: machine.os_image,
                    system_uuid: machine.system_uuid,
                    ..Default::default()
                }),
                volumes_in_use,
                ..Default::default()
            }),
        }
    }

    /// The Node to register: the one [`build`](Self::build) gives, with `--node-labels`,
    /// `registerWithTaints` (and the cloud controller's taint under
    /// `--cloud-provider=external`), `providerID`, and the provided-IP annotation, as
    /// upstream's `initialNode`. Labels and taints are set at registration only: after
    /// that they are the cluster's.
    fn registration(&self, mut node: Node) -> Node {
        let labels = node.metadata.labels.get_or_insert_default();
        labels.extend(self.node_labels.clone());
        node.metadata
            .annotations
            .get_or_insert_default()
            .insert(CONTROLLER_MANAGED_ATTACH.into(), "true".into());
        let mut taints = self.kubelet.register_with_taints.clone();
        if self.external_cloud_provider {
            taints.push(k8s_openapi::api::core::v1::Taint {
                key: CLOUD_TAINT.into(),
                value: Some("true".into()),
                effect: "NoSchedule".into(),
                ..Default::default()
            });
            if !self.node_ips.is_empty() {
                let ips: Vec<String> = self.node_ips.iter().map(|ip| ip.to_string()).collect();
                node.metadata
                    .annotations
                    .get_or_insert_default()
                    .insert(PROVIDED_IP.into(), ips.join(","));
            }
        }
        node.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
            taints: (!taints.is_empty()).then_some(taints),
            provider_id: (!self.kubelet.provider_id.is_empty())
                .then(|| self.kubelet.provider_id.clone()),
            ..Default::default()
        });
        node.status = None;
        node
    }

    /// The node's images as upstream lists them: the 50 largest, each with at most 5 names
    /// (digests first, then tags).
    async fn images(&self) -> Vec<ContainerImage> {
        let mut image = self.cri.image.clone();
        let Ok(list) = image
            .list_images(
                self.cri
                    .request(nodeagent_proto::cri::ListImagesRequest::default()),
            )
            .await
        else {
            return Vec::new();
        };
        let mut images = list.into_inner().images;
        images.sort_by_key(|i| std::cmp::Reverse(i.size));
        images
            .into_iter()
            .take(MAX_IMAGES)
            .map(|i| ContainerImage {
                names: Some(
                    i.repo_digests
                        .into_iter()
                        .chain(i.repo_tags)
                        .take(MAX_NAMES_PER_IMAGE)
                        .collect(),
                ),
                size_bytes: Some(i.size as i64),
            })
            .collect()
    }

    /// The runtime's own RuntimeReady and NetworkReady conditions.
    async fn runtime_ready(&self) -> Result<(), String> {
        let mut runtime = self.cri.runtime.clone();
        let status = runtime
            .status(
                self.cri
                    .request(nodeagent_proto::cri::StatusRequest { verbose: false }),
            )
            .await
            .map_err(|e| format!("container runtime is down: {}", e.message()))?
            .into_inner()
            .status
            .unwrap_or_default();
        // upstream's runtimeState messages: "container runtime not ready: RuntimeReady=false
        // reason:... message:...", and "container runtime network not ready: ..."
        let mut problems = Vec::new();
        for (kind, what) in [
            ("RuntimeReady", "container runtime not ready"),
            ("NetworkReady", "container runtime network not ready"),
        ] {
            match status.conditions.iter().find(|c| c.r#type == kind) {
                Some(c) if !c.status => problems.push(format!(
                    "{what}: {kind}=false reason:{} message:{}",
                    c.reason, c.message
                )),
                Some(_) => {}
                None => problems.push(format!("{what}: {kind} is not reported")),
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join(", "))
        }
    }
}

#[tonic::async_trait]
impl NodeStatusApi for NodeStatusService {
    async fn get_node(
        &self,
        _r: Request<GetNodeRequest>,
    ) -> Result<Response<GetNodeResponse>, Status> {
        let node = self.build().await;
        Ok(Response::new(GetNodeResponse {
            node_json: nodeagent_proto::k8s::encode_node(&node),
        }))
    }
}

#[cfg(test)]
mod device_resource_tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn q(s: &str) -> Quantity {
        Quantity(s.into())
    }

    /// upstream's `MachineInfo` setter: a plugin's devices are capacity, its healthy ones
    /// allocatable, a removed plugin's resource zero; an extended resource the Node has
    /// from elsewhere (an administrator's status patch, upstream's documented way) stays.
    #[test]
    fn plugin_resources_on_the_node_and_those_of_others_kept() {
        let mut capacity = BTreeMap::from([("cpu".to_string(), 2000)]);
        let mut allocatable = capacity.clone();
        let devices = DeviceResourcesResponse {
            capacity: [("example.com/dev".to_string(), 3)].into(),
            allocatable: [("example.com/dev".to_string(), 2)].into(),
            retired: vec!["example.com/old".into()],
        };
        extended_resources(&mut capacity, &mut allocatable, &devices);
        assert_eq!(capacity["example.com/dev"], 3);
        assert_eq!(allocatable["example.com/dev"], 2);
        assert_eq!(
            (capacity["example.com/old"], allocatable["example.com/old"]),
            (0, 0)
        );

        let existing = NodeStatus {
            capacity: Some(BTreeMap::from([
                ("example.com/dongle".to_string(), q("4")),
                ("example.com/dev".to_string(), q("9")),
                ("memory".to_string(), q("1Ki")),
                ("hugepages-2Mi".to_string(), q("0")),
            ])),
            ..Default::default()
        };
        let ours = NodeStatus {
            capacity: Some(pressure::quantities(&capacity)),
            allocatable: Some(pressure::quantities(&allocatable)),
            ..Default::default()
        };
        let merged = merged_status(Some(&existing), ours, false);
        let cap = merged.capacity.unwrap();
        assert_eq!(
            cap["example.com/dongle"],
            q("4"),
            "an administrator's stays"
        );
        assert_eq!(cap["example.com/dev"], q("3"), "ours wins");
        assert!(!cap.contains_key("memory") && !cap.contains_key("hugepages-2Mi"));
    }

    /// `volumesAttached` is the attach/detach controller's (pkg/controller/volume/
    /// attachdetach/statusupdater writes it): our status patch leaves it as it is, and
    /// sets `volumesInUse`, the kubelet's, to ours (removing it when none is in use).
    #[test]
    fn the_attach_detach_controllers_volumes_attached_stay_and_volumes_in_use_are_ours() {
        use k8s_openapi::api::core::v1::AttachedVolume;
        let attached = vec![AttachedVolume {
            name: "kubernetes.io/csi/d^h1".into(),
            device_path: String::new(),
        }];
        let existing = NodeStatus {
            volumes_attached: Some(attached.clone()),
            volumes_in_use: Some(vec!["kubernetes.io/csi/d^h0".into()]),
            conditions: Some(Vec::new()),
            addresses: Some(Vec::new()),
            ..Default::default()
        };
        let ours = NodeStatus {
            volumes_in_use: Some(vec!["kubernetes.io/csi/d^h1".into()]),
            ..Default::default()
        };
        let merged = merged_status(Some(&existing), ours, false);
        assert_eq!(merged.volumes_attached, Some(attached));
        let patch = nodeagent_config::status_patch::two_way(
            &serde_json::to_value(&existing).unwrap(),
            &serde_json::to_value(&merged).unwrap(),
        );
        assert_eq!(
            patch,
            serde_json::json!({"volumesInUse": ["kubernetes.io/csi/d^h1"]})
        );
        // None in use any more: the field goes.
        let merged = merged_status(Some(&existing), NodeStatus::default(), false);
        let patch = nodeagent_config::status_patch::two_way(
            &serde_json::to_value(&existing).unwrap(),
            &serde_json::to_value(&merged).unwrap(),
        );
        assert_eq!(patch, serde_json::json!({"volumesInUse": null}));
    }
}
