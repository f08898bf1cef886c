//! The kubelet's pod-resources API, v1 (upstream's `pkg/kubelet/apis/podresources`,
//! `server_v1.go`), on `<root-dir>/pod-resources/kubelet.sock`: what monitoring agents
//! read to attribute node resources to pods. `List` and `Get` give each active pod's
//! regular containers and sidecars with the CPUs the CPU manager gave them of their own
//! and the devices the device manager did; `GetAllocatableResources` the CPUs the static
//! policy may give and the healthy devices. Memory (no memory manager) and dynamic
//! resources (no DRA) are empty lists.

use crate::PodSync;
use k8s_openapi::api::core::v1::{Container, Pod};
use nodeagent_proto::k8s;
use nodeagent_proto::podresources::pod_resources_lister_server::PodResourcesLister;
use nodeagent_proto::podresources::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, ContainerResources,
    GetPodResourcesRequest, GetPodResourcesResponse, ListPodResourcesRequest,
    ListPodResourcesResponse, PodResources,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// upstream's `pod-resources/kubelet.sock` under the root directory.
pub fn socket(root_dir: &Path) -> PathBuf {
    root_dir.join("pod-resources").join("kubelet.sock")
}

pub struct Service {
    pub sync: Arc<PodSync>,
}

impl Service {
    /// upstream's `getContainerResources` for each sidecar (a restartable init container)
    /// and regular container of the pod, in the spec's order.
    fn resources(&self, pod: &Pod) -> PodResources {
        let uid = k8s::pod_uid(pod);
        let spec = pod.spec.as_ref();
        let sidecars = spec
            .and_then(|s| s.init_containers.as_ref())
            .into_iter()
            .flatten()
            .filter(|c| c.restart_policy.as_deref() == Some("Always"));
        let regular = spec.map(|s| s.containers.iter()).into_iter().flatten();
        let container = |c: &Container| ContainerResources {
            name: c.name.clone(),
            cpu_ids: self.sync.cpu_manager.exclusive_cpus(uid, &c.name),
            devices: self.sync.device_manager.container_devices(uid, &c.name),
            ..Default::default()
        };
        PodResources {
            name: k8s::pod_name(pod).to_string(),
            namespace: k8s::pod_namespace(pod).to_string(),
            containers: sidecars.chain(regular).map(container).collect(),
        }
    }

    /// The active pods, by namespace and name, once the pod sources have told pod-sync
    /// the node's pods: a pod-sync that has just restarted waits for them (up to
    /// [`SOURCES_WAIT`]) rather than answer an empty list a monitoring agent would act on
    /// (the cgroup v2 guest's run of `cpu_manager.rs` caught one); still without them, the
    /// call fails `Unavailable` and the client retries.
    async fn active(&self) -> Result<Vec<Pod>, Status> {
        let deadline = tokio::time::Instant::now() + SOURCES_WAIT;
        let mut pods: Vec<Pod> = loop {
            {
                let st = self.sync.lock();
                if st.sources_served {
                    break st.active_pods().map(|(_, p)| p.clone()).collect();
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Status::unavailable(
                    "the node's pods are not known yet (pod-sync is starting); retry",
                ));
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        };
        pods.sort_by(|a, b| {
            (k8s::pod_namespace(a), k8s::pod_name(a))
                .cmp(&(k8s::pod_namespace(b), k8s::pod_name(b)))
        });
        Ok(pods)
    }
}

/// How long a call waits for the pod sources after pod-sync's start.
const SOURCES_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

#[tonic::async_trait]
impl PodResourcesLister for Service {
    async fn list(
        &self,
        _: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        let pod_resources = self
            .active()
            .await?
            .iter()
            .map(|p| self.resources(p))
            .collect();
        Ok(Response::new(ListPodResourcesResponse { pod_resources }))
    }

    async fn get_allocatable_resources(
        &self,
        _: Request<AllocatableResourcesRequest>,
    ) -> Result<Response<AllocatableResourcesResponse>, Status> {
        Ok(Response::new(AllocatableResourcesResponse {
            cpu_ids: self.sync.cpu_manager.allocatable_cpus(),
            devices: self.sync.device_manager.allocatable_devices(),
            ..Default::default()
        }))
    }

    async fn get(
        &self,
        request: Request<GetPodResourcesRequest>,
    ) -> Result<Response<GetPodResourcesResponse>, Status> {
        let r = request.into_inner();
        let pod =
            self.active().await?.into_iter().find(|p| {
                k8s::pod_name(p) == r.pod_name && k8s::pod_namespace(p) == r.pod_namespace
            });
        match pod {
            Some(pod) => Ok(Response::new(GetPodResourcesResponse {
                pod_resources: Some(self.resources(&pod)),
            })),
            // upstream's words (a plain Go error: gRPC's Unknown).
            None => Err(Status::unknown(format!(
                "pod {} in namespace {} not found",
                r.pod_name, r.pod_namespace
            ))),
        }
    }
}
