//! gRPC transport shared by every service: servers and clients on `unix://` and
//! `vsock://` addresses, the standard `grpc.health.v1` service, systemd readiness and
//! watchdog, W3C trace context on every call, the shutdown signal, and the resubscribing
//! watch helper that every stream consumer uses.

mod bind;
mod chunk;
mod client;
mod limit;
mod loop_health;
mod metrics;
mod server;
mod service_main;
mod shutdown;
mod stream;
mod trace;
mod vsock_auth;
mod watch;

pub use bind::BIND_WINDOW;
pub use chunk::{
    Assembler, Chunked, MAX_MESSAGE_BYTES, MAX_POD_JSON_BYTES, SNAPSHOT_CHUNK_BYTES, WithLimits,
};
pub use client::{Channel, check_health, connect, connect_with_secret};
pub use limit::{Adaptive, CallLimit};
pub use loop_health::{CHECK_GRACE, Heartbeat, LivenessCheck, LoopHealth};
pub use metrics::{MetricsService, span_message};
pub use server::{ServeError, Server};
pub use service_main::{
    KUBELET_ENV, VERSION, kubelet_main, parse_command_line, run_main, shared_flags_main,
};
pub use shutdown::{Shutdown, ShutdownTrigger, shutdown_channel, termination_signal};
pub use stream::{WatchStream, snapshot_then_deltas};
pub use trace::{ClientTrace, ServerTrace, ServerTraceLayer};
pub use vsock_auth::{VsockScope, VsockScopeLayer, install_vsock_auth};
pub use watch::{WatchEvent, watch_probe_results, watch_with_retry};

pub use nodeagent_config::Address;
pub use tonic_health::ServingStatus;
