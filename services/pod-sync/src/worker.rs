//! The pod worker and what it carries out (upstream's `pod_workers.go` and the runtime
//! manager, `pkg/kubelet/kuberuntime`): one task per pod (`workers`), its sync, decided by
//! pure planners (`sync::plan`, `init_plan`) and carried out by `sync`; the kill path with
//! its ordering and grace (`kill`, `kill_order`, `hooks`), termination messages, and the
//! garbage collection of a live pod's dead containers (`gc`).

pub(crate) mod gc;
pub(crate) mod hooks;
pub(crate) mod init_plan;
pub(crate) mod kill;
pub(crate) mod kill_order;
pub(crate) mod sync;
pub(crate) mod termination;
pub(crate) mod workers;
