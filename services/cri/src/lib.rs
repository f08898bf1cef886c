//! The CRI client every service that talks to the container runtime uses: the runtime and
//! image services on one channel, a span per call (from the transport's client layer,
//! named `runtime.v1.RuntimeService/<Method>`), and the `runtimeRequestTimeout`.

pub mod actions;
pub mod http_probe;
mod inspect;

pub use inspect::{inspect_pod, now_nanos};

use nodeagent_proto::cri::image_service_client::ImageServiceClient;
use nodeagent_proto::cri::runtime_service_client::RuntimeServiceClient;
use nodeagent_proto::cri::{
    ContainerFilter, ContainerStatusRequest, ContainerStatusResponse, ListContainersRequest,
    ListPodSandboxRequest, PodSandboxFilter, VersionRequest, VersionResponse,
};
use nodeagent_transport::{Address, Channel};
use std::collections::HashMap;
use std::time::Duration;

pub use nodeagent_proto::cri as api;
pub use tonic::{Code, Request, Status};

/// A cheap-to-clone CRI client.
#[derive(Clone)]
pub struct Cri {
    pub runtime: RuntimeServiceClient<Channel>,
    pub image: ImageServiceClient<Channel>,
    timeout: Duration,
}

impl Cri {
    /// A lazily connecting client for `endpoint`. `timeout` bounds every call made
    /// through [`Cri::request`].
    pub fn connect(endpoint: &Address, timeout: Duration) -> Self {
        Self::on(nodeagent_transport::connect(endpoint), timeout)
    }

    /// [`Cri::connect`], with a bound on the runtime's expensive calls ([`is_expensive`])
    /// under way at once: `concurrent` of them, or with 0 a bound that follows the
    /// runtime's throughput (`nodeagent_transport::CallLimit::adaptive`), starting at two
    /// per CPU and moving between one and [`MAX_EXPENSIVE_CALLS`]. The rest (stops that
    /// wait out a grace period, exec, pulls, lists and statuses) are not held back.
    pub fn connect_limited(endpoint: &Address, timeout: Duration, concurrent: usize) -> Self {
        let limit = match concurrent {
            0 => {
                let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
                nodeagent_transport::CallLimit::adaptive(
                    nodeagent_transport::Adaptive {
                        initial: 2 * cpus,
                        min: 1,
                        max: MAX_EXPENSIVE_CALLS,
                    },
                    is_expensive,
                )
            }
            n => nodeagent_transport::CallLimit::new(n, is_expensive),
        };
        Self::on(
            nodeagent_transport::connect(endpoint).with_call_limit(limit),
            timeout,
        )
    }

    fn on(channel: Channel, timeout: Duration) -> Self {
        Self {
            runtime: RuntimeServiceClient::new(channel.clone()).max_decoding_message_size(16 << 20),
            image: ImageServiceClient::new(channel).max_decoding_message_size(16 << 20),
            timeout,
        }
    }

    /// Wraps a CRI message with the call timeout.
    pub fn request<T>(&self, message: T) -> Request<T> {
        let mut request = Request::new(message);
        request.set_timeout(self.timeout);
        request
    }

    pub async fn version(&self) -> Result<VersionResponse, Status> {
        let mut runtime = self.runtime.clone();
        let req = self.request(VersionRequest {
            version: "v1".into(),
        });
        Ok(runtime.version(req).await?.into_inner())
    }

    /// Polls `Version` until the runtime answers or `deadline` passes.
    pub async fn wait_ready(&self, deadline: Duration) -> Result<VersionResponse, Status> {
        let until = tokio::time::Instant::now() + deadline;
        loop {
            match self.version().await {
                Ok(v) => return Ok(v),
                Err(e) if tokio::time::Instant::now() >= until => return Err(e),
                Err(e) => {
                    tracing::debug!(error = %e, "container runtime not answering yet");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }

    /// Sandboxes, optionally only those labelled with one pod UID.
    pub async fn list_sandboxes(
        &self,
        pod_uid: Option<&str>,
    ) -> Result<Vec<api::PodSandbox>, Status> {
        let filter = pod_uid.map(|uid| PodSandboxFilter {
            label_selector: uid_selector(uid),
            ..Default::default()
        });
        let mut runtime = self.runtime.clone();
        let req = self.request(ListPodSandboxRequest { filter });
        Ok(runtime.list_pod_sandbox(req).await?.into_inner().items)
    }

    /// Containers, optionally only those labelled with one pod UID.
    pub async fn list_containers(
        &self,
        pod_uid: Option<&str>,
    ) -> Result<Vec<api::Container>, Status> {
        let filter = pod_uid.map(|uid| ContainerFilter {
            label_selector: uid_selector(uid),
            ..Default::default()
        });
        let mut runtime = self.runtime.clone();
        let req = self.request(ListContainersRequest { filter });
        Ok(runtime.list_containers(req).await?.into_inner().containers)
    }

    /// Where the runtime keeps its images: the mountpoint CRI `ImageFsInfo` names first.
    /// None when the runtime does not answer or names none.
    pub async fn image_fs_mount(&self) -> Option<std::path::PathBuf> {
        let mut image = self.image.clone();
        let resp = image
            .image_fs_info(self.request(api::ImageFsInfoRequest {}))
            .await
            .ok()?
            .into_inner();
        let id = resp.image_filesystems.first()?.fs_id.as_ref()?;
        (!id.mountpoint.is_empty()).then(|| std::path::PathBuf::from(&id.mountpoint))
    }

    pub async fn container_status(&self, id: &str) -> Result<ContainerStatusResponse, Status> {
        let mut runtime = self.runtime.clone();
        let req = self.request(ContainerStatusRequest {
            container_id: id.into(),
            verbose: false,
        });
        Ok(runtime.container_status(req).await?.into_inner())
    }

    pub async fn sandbox_status(&self, id: &str) -> Result<api::PodSandboxStatus, Status> {
        let mut runtime = self.runtime.clone();
        let req = self.request(api::PodSandboxStatusRequest {
            pod_sandbox_id: id.into(),
            verbose: false,
        });
        runtime
            .pod_sandbox_status(req)
            .await?
            .into_inner()
            .status
            .ok_or_else(|| Status::not_found(format!("sandbox {id} has no status")))
    }
}

fn uid_selector(uid: &str) -> HashMap<String, String> {
    HashMap::from([(
        nodeagent_proto::k8s::labels::POD_UID.to_string(),
        uid.to_string(),
    )])
}

/// The runtime calls that cost the node real work (namespaces, the network set-up, the OCI
/// runtime's fork and exec, mounts) and finish in bounded time: the ones worth bounding
/// when many pods change at once. StopContainer is not one: it waits out a grace period.
pub fn is_expensive(path: &str) -> bool {
    matches!(
        path.strip_prefix("/runtime.v1.RuntimeService/"),
        Some(
            "RunPodSandbox"
                | "StopPodSandbox"
                | "RemovePodSandbox"
                | "CreateContainer"
                | "StartContainer"
                | "RemoveContainer"
        )
    )
}

/// The most expensive calls the adaptive bound lets through at once: a guard against a
/// runaway climb, far above where this machine's runtime stops gaining (issue 29's
/// benchmark), not an operating point.
pub const MAX_EXPENSIVE_CALLS: usize = 64;

/// True when a CRI error means the object is already gone (so a removal succeeded).
pub fn is_not_found(status: &Status) -> bool {
    status.code() == Code::NotFound || status.message().contains("not found")
}
