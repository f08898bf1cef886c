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
    /// Run the static pods once, wait until they run, print their status, and exit
    /// (upstream --runonce). The pods keep running.
    #[arg(long)]
    runonce: bool,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    if cli.runonce {
        nodeagent_transport::run_main("pod-sync", &cli.flags, pod_sync::run_once)
    } else {
        nodeagent_transport::run_main("pod-sync", &cli.flags, pod_sync::run)
    }
}
