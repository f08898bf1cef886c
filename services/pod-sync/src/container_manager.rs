//! The container manager (upstream's `pkg/kubelet/cm`): pod and QoS cgroups under either
//! driver, node allocatable, a pod's requests and limits as upstream sums them, and each
//! container's `oom_score_adj`.

pub(crate) mod aggregate;
pub(crate) mod cgroups;
pub(crate) mod oom;
pub(crate) mod quantity;
