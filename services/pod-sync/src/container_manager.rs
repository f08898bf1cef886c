//! The container manager (upstream's `pkg/kubelet/cm`): pod and QoS cgroups under either
//! driver, node allocatable, a pod's requests and limits as upstream sums them, each
//! container's `oom_score_adj`, memory QoS (`memory.min` and `memory.high`, cgroup v2), the
//! CPU manager's exclusive CPUs, and the device manager's devices from device plugins.

pub(crate) mod cgroups;
pub(crate) mod checksum;
pub(crate) mod cpu_manager;
pub(crate) mod device_manager;
pub(crate) mod memory_qos;
pub(crate) mod oom;
pub(crate) mod quantity;
pub(crate) mod reserved;
