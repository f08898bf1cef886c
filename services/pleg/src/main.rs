//! nodeagent-pleg: relists the container runtime and serves pod lifecycle events.

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "nodeagent-pleg",
    version,
    about = "Pod lifecycle event generator of the node agent"
)]
struct Cli {
    #[command(flatten)]
    flags: nodeagent_config::KubeletFlags,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    nodeagent_transport::run_main("pleg", &cli.flags, pleg::run)
}
