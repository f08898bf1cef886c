//! The node-level managers, each acting over all pods as upstream's own packages do:
//! admission (`pkg/kubelet/lifecycle`), node-pressure and local-storage eviction
//! (`pkg/kubelet/eviction`), graceful node shutdown (`pkg/kubelet/nodeshutdown`) and
//! container log rotation (`pkg/kubelet/logs`).

pub(crate) mod admission;
pub(crate) mod evict;
pub(crate) mod eviction;
pub(crate) mod log_rotation;
pub(crate) mod preemption;
pub(crate) mod shutdown;
