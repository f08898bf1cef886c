//! What the node writes into the status of a pod it ended or refused on its own: upstream's
//! eviction manager's `Evicted` (pkg/kubelet/eviction/eviction_manager.go `Reason`) and the
//! node shutdown manager's `Terminated` and `NodeShutdown`
//! (pkg/kubelet/nodeshutdown/nodeshutdown_manager.go). A leaf: the status computation, the
//! worker's sync, eviction and shutdown all read them, so none of those reaches up into
//! another for a string.

/// Upstream's pod status and `Preempting` event for a pod preempted to admit a critical
/// one (pkg/kubelet/preemption: `events.PreemptContainer`, its `message`, and the
/// DisruptionTarget condition's message).
pub const PREEMPTED_REASON: &str = "Preempting";
pub const PREEMPTED_MESSAGE: &str = "Preempted in order to admit critical pod";
pub const PREEMPTED_DISRUPTION_MESSAGE: &str =
    "Pod was preempted by Kubelet to accommodate a critical pod.";
/// Upstream's `Reason` for evicted pods.
pub const EVICTED: &str = "Evicted";
/// Upstream's pod status for a pod stopped by a node shutdown.
pub const SHUTDOWN_REASON: &str = "Terminated";
pub const SHUTDOWN_MESSAGE: &str = "Pod was terminated in response to imminent node shutdown.";
/// Upstream's admission refusal while the node shuts down.
pub const SHUTDOWN_REFUSAL_REASON: &str = "NodeShutdown";
pub const SHUTDOWN_REFUSAL_MESSAGE: &str = "Pod was rejected as the node is shutting down.";
