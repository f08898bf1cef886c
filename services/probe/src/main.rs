//! nodeagent-probe: runs liveness, readiness and startup probes.

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "nodeagent-probe",
    version,
    about = "Probe workers of the node agent"
)]
struct Cli {
    #[command(flatten)]
    flags: nodeagent_config::KubeletFlags,
    /// Run as one of several probe instances: serve on `<socket-dir>/probe-<ID>.sock`,
    /// register with pod-sync and probe only this instance's share of the pods. `auto`
    /// draws a random id (replicas of a compose service share their flags). Without it, the
    /// single default instance probes every pod.
    #[arg(long, value_name = "ID")]
    probe_instance: Option<String>,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let instance = cli.probe_instance;
    nodeagent_transport::run_main("probe", &cli.flags, move |config, shutdown| {
        probe::run(config, instance, shutdown)
    })
}
