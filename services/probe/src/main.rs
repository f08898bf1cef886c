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
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    nodeagent_transport::run_main("probe", &cli.flags, probe::run)
}
