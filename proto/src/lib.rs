//! The node agent's wire schema: `kubelet.v1` (our services), `runtime.v1` (CRI), and the
//! conversions between wire bytes and k8s-openapi types.

pub mod kubelet {
    pub mod v1 {
        tonic::include_proto!("kubelet.v1");
    }
}

/// The Container Runtime Interface, generated from kubernetes/cri-api's `api.proto`.
pub mod cri {
    #![allow(clippy::large_enum_variant, clippy::doc_lazy_continuation)]
    tonic::include_proto!("runtime.v1");
}

/// The kubelet's pod-resources API (`v1.PodResourcesLister`), generated from upstream's
/// `podresources/v1/api.proto`.
pub mod podresources {
    tonic::include_proto!("v1");
}

/// The kubelet's device plugin API (`v1beta1.Registration`, `v1beta1.DevicePlugin`),
/// generated from upstream's `deviceplugin/v1beta1/api.proto`.
pub mod deviceplugin {
    tonic::include_proto!("v1beta1");
}

/// The kubelet's plugin registration API (`pluginregistration.Registration`), generated from
/// upstream's `pluginregistration/v1/api.proto`: how a CSI driver's registrar announces it.
pub mod pluginregistration {
    tonic::include_proto!("pluginregistration");
}

/// The Container Storage Interface (`csi.v1`), generated from the CSI spec's `csi.proto`.
pub mod csi {
    #![allow(clippy::large_enum_variant, clippy::doc_lazy_continuation)]
    tonic::include_proto!("csi.v1");
}

pub mod k8s;

pub use kubelet::v1 as api;

impl api::RuntimePodStatus {
    /// Whether any of the pod's containers runs.
    pub fn any_container_running(&self) -> bool {
        self.containers
            .iter()
            .any(|c| c.state == cri::ContainerState::ContainerRunning as i32)
    }

    /// Whether anything of the pod still runs: a container, or a ready sandbox.
    pub fn anything_runs(&self) -> bool {
        self.any_container_running()
            || self
                .sandboxes
                .iter()
                .any(|s| s.state == cri::PodSandboxState::SandboxReady as i32)
    }
}
