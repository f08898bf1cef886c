//! nodeagent-pod-sync: drives the container runtime to the desired pods.

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "nodeagent-pod-sync",
    version,
    about = "Pod sync loop of the node agent"
)]
struct Cli {
    #[command(flatten)]
    flags: nodeagent_config::KubeletFlags,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    nodeagent_transport::run_main("pod-sync", &cli.flags, pod_sync::run)
}
