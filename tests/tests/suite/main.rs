//! The cross-service tests, one module per topic, in one test binary: the seven real
//! binaries against the real containerd (`nodeagent_tests`, the harness). One binary
//! links kube, tonic, axum and rustls once instead of once per file; nextest still runs
//! each test in its own process. Which tests hold the host alone, and why, is said in
//! `.config/nextest.toml` (the `host-global` group).

mod admission;
mod api_bench;
mod api_restart;
mod apiserver_tokens;
mod bind;
mod certificates;
mod chaos;
mod cluster;
mod config_errors;
mod container_gc;
mod container_logs;
mod cpu_manager;
mod csi;
mod density_bench;
mod device_plugins;
mod events;
mod file_modes;
mod grpc_probes;
mod hostile;
mod image_gc;
mod image_pull;
mod kill_restart;
mod kubectl;
mod kubelet_abuse;
mod kubelet_api;
mod kubelet_auth;
mod lifecycle;
mod limits;
mod loop_health;
mod manifests;
mod mount_propagation;
mod node_bench;
mod node_registration;
mod oom;
mod operations;
mod parallel;
mod pleg_reinspect;
mod pod_status;
mod pressure;
mod probe_bench;
mod probe_scale;
mod probe_worker;
mod prom;
mod readiness;
mod resources;
mod restart_rules;
mod runtime_class;
mod security;
mod security_fields;
mod services;
mod sidecars;
mod skeleton;
mod sources;
mod stats;
mod stats_bench;
mod streaming;
mod tracing;
mod upgrade;
mod volumes;
mod vsock;
mod watchdog;
