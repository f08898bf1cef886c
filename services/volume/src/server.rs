//! volume's gRPC API; one function maps domain errors to gRPC status codes.

use crate::layout::{PodVolumeLayout, VolumeError};
use crate::subpath::SubPathError;
use nodeagent_proto::api::{
    EnsurePodVolumesRequest, EnsurePodVolumesResponse, ListVolumesRequest, ListVolumesResponse,
    PodVolume, PrepareSubPathsRequest, PrepareSubPathsResponse, ReleasePodRequest,
    ReleasePodResponse, volume_server::Volume,
};
use tonic::{Request, Response, Status};
use tracing::Instrument;

pub struct VolumeService {
    pub layout: PodVolumeLayout,
}

fn to_status(e: VolumeError) -> Status {
    match e {
        VolumeError::Unsupported { .. } => Status::unimplemented(e.to_string()),
        VolumeError::InvalidPod(_)
        | VolumeError::HostPath { .. }
        | VolumeError::BadPath(_)
        | VolumeError::SubPath(SubPathError::Invalid { .. } | SubPathError::Escapes { .. }) => {
            Status::invalid_argument(e.to_string())
        }
        VolumeError::SubPath(SubPathError::Sys { .. } | SubPathError::Mount { .. }) => {
            Status::internal(e.to_string())
        }
        VolumeError::StillMounted(_) => Status::failed_precondition(e.to_string()),
        VolumeError::Io { .. } => Status::internal(e.to_string()),
    }
}

#[tonic::async_trait]
impl Volume for VolumeService {
    async fn ensure_pod_volumes(
        &self,
        request: Request<EnsurePodVolumesRequest>,
    ) -> Result<Response<EnsurePodVolumesResponse>, Status> {
        let req = request.into_inner();
        let pod = nodeagent_proto::k8s::decode_pod(&req.pod_json)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let span = tracing::info_span!(
            "ensure_pod_volumes",
            k8s.pod.uid = %nodeagent_proto::k8s::pod_uid(&pod),
            k8s.pod.name = %nodeagent_proto::k8s::pod_name(&pod),
            k8s.namespace.name = %nodeagent_proto::k8s::pod_namespace(&pod),
        );
        nodeagent_telemetry::set_parent_from(&span, req.trace.as_ref());
        let layout = self.layout.clone();
        let paths = async move {
            tokio::task::spawn_blocking(move || layout.ensure(&pod))
                .await
                .map_err(|e| Status::internal(e.to_string()))?
                .map_err(to_status)
        }
        .instrument(span)
        .await?;
        Ok(Response::new(EnsurePodVolumesResponse {
            host_paths: paths
                .into_iter()
                .map(|(k, v)| (k, v.to_string_lossy().into_owned()))
                .collect(),
        }))
    }

    async fn release_pod(
        &self,
        request: Request<ReleasePodRequest>,
    ) -> Result<Response<ReleasePodResponse>, Status> {
        let req = request.into_inner();
        let span = tracing::info_span!("release_pod", k8s.pod.uid = %req.pod_uid);
        nodeagent_telemetry::set_parent_from(&span, req.trace.as_ref());
        let layout = self.layout.clone();
        let uid = req.pod_uid.clone();
        async move {
            tokio::task::spawn_blocking(move || layout.release(&uid))
                .await
                .map_err(|e| Status::internal(e.to_string()))?
                .map_err(to_status)
        }
        .instrument(span)
        .await?;
        tracing::info!(pod.uid = %req.pod_uid, "released pod volumes");
        Ok(Response::new(ReleasePodResponse {}))
    }

    async fn prepare_sub_paths(
        &self,
        request: Request<PrepareSubPathsRequest>,
    ) -> Result<Response<PrepareSubPathsResponse>, Status> {
        let req = request.into_inner();
        let pod = nodeagent_proto::k8s::decode_pod(&req.pod_json)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let span = tracing::info_span!(
            "prepare_sub_paths",
            k8s.pod.uid = %nodeagent_proto::k8s::pod_uid(&pod),
            k8s.container.name = %req.container_name,
        );
        nodeagent_telemetry::set_parent_from(&span, req.trace.as_ref());
        let layout = self.layout.clone();
        let mounts: Vec<_> = req
            .mounts
            .into_iter()
            .map(|m| (m.volume_name, m.sub_path, m.mount_index))
            .collect();
        let container = req.container_name;
        let paths = async move {
            let prepared = tokio::task::spawn_blocking(move || {
                layout.prepare_sub_paths(&pod, &container, &mounts)
            })
            .await
            .map_err(|e| Status::internal(e.to_string()))?;
            if let Err(e) = &prepared {
                tracing::warn!(error = %e, "subPath refused");
            }
            prepared.map_err(to_status)
        }
        .instrument(span)
        .await?;
        Ok(Response::new(PrepareSubPathsResponse {
            host_paths: paths
                .into_iter()
                .map(|(k, v)| (k, v.to_string_lossy().into_owned()))
                .collect(),
        }))
    }

    async fn list(
        &self,
        _request: Request<ListVolumesRequest>,
    ) -> Result<Response<ListVolumesResponse>, Status> {
        let found = self.layout.list().map_err(to_status)?;
        Ok(Response::new(ListVolumesResponse {
            volumes: found
                .into_iter()
                .map(|f| PodVolume {
                    pod_uid: f.pod_uid,
                    name: f.name,
                    plugin: f.plugin,
                    host_path: f.host_path.to_string_lossy().into_owned(),
                })
                .collect(),
        }))
    }
}
