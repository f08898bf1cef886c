//! gRPC transport shared by every service: servers and clients on `unix://` and
//! `vsock://` addresses, the standard `grpc.health.v1` service, systemd readiness and
//! watchdog, W3C trace context on every call, the shutdown signal, and the resubscribing
//! watch helper that every stream consumer uses.

mod client;
mod server;
mod service_main;
mod shutdown;
mod stream;
mod trace;
mod watch;

pub use client::{Channel, check_health, connect};
pub use server::{LivenessCheck, ServeError, Server};
pub use service_main::run_main;
pub use shutdown::{Shutdown, ShutdownTrigger, shutdown_channel, termination_signal};
pub use stream::{WatchStream, snapshot_then_deltas};
pub use trace::{ClientTrace, ServerTrace, ServerTraceLayer};
pub use watch::{WatchEvent, watch_with_retry};

pub use nodeagent_config::Address;
pub use tonic_health::ServingStatus;
