//! node-status: the Node object of this node, built from /proc, the container runtime
//! (CRI Version and Status) and pleg's health. It is served locally; with an API server
//! the Node is also registered there, its status kept current, and its Lease renewed.

pub mod cli;

mod api;
mod machine;

pub use machine::{MachineInfo, read_machine_info};

use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeStatus,
    NodeSystemInfo,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use nodeagent_config::{Config, Service};
use nodeagent_cri::Cri;
use nodeagent_proto::api::node_status_server::{NodeStatus as NodeStatusApi, NodeStatusServer};
use nodeagent_proto::api::pleg_client::PlegClient;
use nodeagent_proto::api::{GetNodeRequest, GetNodeResponse, PlegHealthRequest};
use nodeagent_transport::{Channel, Server, Shutdown, WithLimits};
use std::collections::BTreeMap;
use std::sync::Arc;
use tonic::{Request, Response, Status};

pub struct NodeStatusService {
    cri: Cri,
    pleg: PlegClient<Channel>,
    node_name: String,
    port: u16,
    max_pods: u32,
    root_dir: std::path::PathBuf,
}

/// Runs node-status until `shutdown`.
pub async fn run(config: Config, shutdown: Shutdown) -> anyhow::Result<()> {
    let service = Arc::new(NodeStatusService {
        cri: Cri::connect(
            &config.runtime_endpoint,
            config.kubelet.runtime_request_timeout,
        ),
        pleg: PlegClient::new(nodeagent_transport::connect(config.endpoint(Service::Pleg)))
            .with_limits(),
        node_name: config.node_name.clone(),
        port: config.kubelet.port,
        max_pods: config.kubelet.max_pods,
        root_dir: config.root_dir.clone(),
    });
    let reporter = match &config.kubeconfig {
        Some(path) => {
            let reporter = api::NodeReporter {
                service: service.clone(),
                client: nodeagent_config::kube_client(path).await?,
                status_every: config.kubelet.node_status_update_frequency,
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
    served?;
    Ok(())
}

fn condition(kind: &str, ok: bool, reason: &str, message: &str) -> NodeCondition {
    NodeCondition {
        type_: kind.into(),
        status: if ok { "True".into() } else { "False".into() },
        reason: Some(reason.into()),
        message: Some(message.into()),
        ..Default::default()
    }
}

impl NodeStatusService {
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
        match &pleg_health {
            Ok(h) if !h.healthy => problems.push(format!("PLEG is not healthy: {}", h.message)),
            Err(e) => problems.push(format!("PLEG is not reachable: {}", e.message())),
            _ => {}
        }
        let ready = if problems.is_empty() {
            condition(
                "Ready",
                true,
                "KubeletReady",
                "kubelet is posting ready status",
            )
        } else {
            condition("Ready", false, "KubeletNotReady", &problems.join("; "))
        };
        let capacity: BTreeMap<String, Quantity> = [
            ("cpu", machine.cpus.to_string()),
            ("memory", format!("{}Ki", machine.memory_bytes / 1024)),
            ("pods", self.max_pods.to_string()),
            (
                "ephemeral-storage",
                format!("{}Ki", machine.root_fs_bytes / 1024),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), Quantity(v)))
        .collect();
        let runtime_version = version
            .map(|v| format!("{}://{}", v.runtime_name, v.runtime_version))
            .unwrap_or_default();
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
                allocatable: Some(capacity.clone()),
                capacity: Some(capacity),
                conditions: Some(vec![
                    condition(
                        "MemoryPressure",
                        false,
                        "KubeletHasSufficientMemory",
                        "kubelet has sufficient memory available",
                    ),
                    condition(
                        "DiskPressure",
                        false,
                        "KubeletHasNoDiskPressure",
                        "kubelet has no disk pressure",
                    ),
                    condition(
                        "PIDPressure",
                        false,
                        "KubeletHasSufficientPID",
                        "kubelet has sufficient PID available",
                    ),
                    ready,
                ]),
                addresses: Some(vec![NodeAddress {
                    type_: "Hostname".into(),
                    address: self.node_name.clone(),
                }]),
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
                ..Default::default()
            }),
        }
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
        for c in status.conditions {
            if !c.status && (c.r#type == "RuntimeReady" || c.r#type == "NetworkReady") {
                return Err(format!(
                    "container runtime {} is false: {}: {}",
                    c.r#type, c.reason, c.message
                ));
            }
        }
        Ok(())
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
