//! The body of every service's `main`: resolve the configuration, start telemetry, run
//! the service until SIGTERM, drain, and exit with a readable message on failure.

use crate::{Shutdown, shutdown_channel, termination_signal};
use nodeagent_config::{Config, KubeletFlags};
use std::future::Future;
use std::process::ExitCode;
use std::time::Duration;

/// How long `run` gets to return after SIGTERM before the process exits anyway.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

pub fn run_main<F, Fut>(service: &'static str, flags: &KubeletFlags, run: F) -> ExitCode
where
    F: FnOnce(Config, Shutdown) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let config = match Config::load(flags) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("nodeagent-{service}: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("nodeagent-{service}: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let telemetry = match nodeagent_telemetry::init(&nodeagent_telemetry::TelemetryConfig {
            service_name: format!("nodeagent-{service}"),
            format: config.logging_format.clone(),
            verbosity: config.verbosity,
            otlp_endpoint: config.otlp_endpoint.clone(),
        }) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("nodeagent-{service}: cannot start telemetry: {e:#}");
                return ExitCode::FAILURE;
            }
        };
        nodeagent_telemetry::metrics::init_process_metrics(service);
        if let Some(auth) = &config.vsock_auth {
            crate::install_vsock_auth(auth.clone());
        }
        if !config.ignored_fields.is_empty() {
            tracing::warn!(fields = ?config.ignored_fields, "KubeletConfiguration fields accepted but not acted on by this node agent");
        }
        tracing::info!(node = %config.node_name, version = env!("CARGO_PKG_VERSION"), "starting");
        let (trigger, shutdown) = shutdown_channel();
        let signalled = shutdown.clone();
        tokio::spawn(async move {
            termination_signal().await;
            trigger.trigger();
        });
        let fatal = shutdown.clone();
        let mut service_run = std::pin::pin!(run(config, shutdown));
        let result = tokio::select! {
            r = &mut service_run => r,
            // A part that cannot go on (a server that cannot bind) ends the process now:
            // waiting for SIGTERM would leave a process that runs but never serves.
            why = fatal.failed() => Err(anyhow::anyhow!(why)),
            _ = async { signalled.wait().await; tokio::time::sleep(DRAIN_TIMEOUT).await } => {
                tracing::warn!("did not stop within {DRAIN_TIMEOUT:?} of SIGTERM; exiting anyway");
                Ok(())
            }
        };
        // A run that ended on its own after a fatal error (which also ends every wait)
        // still failed.
        let result = match (result, fatal.fatal_error()) {
            (Ok(()), Some(why)) => Err(anyhow::anyhow!(why)),
            (result, _) => result,
        };
        let code = match result {
            Ok(()) => {
                tracing::info!("stopped");
                ExitCode::SUCCESS
            }
            Err(e) => {
                tracing::error!(error = format!("{e:#}"), "failed");
                eprintln!("nodeagent-{service}: {e:#}");
                ExitCode::FAILURE
            }
        };
        tokio::task::spawn_blocking(move || telemetry.shutdown(Duration::from_secs(2)))
            .await
            .ok();
        code
    })
}
