//! nodeagent-node-status: serves the Node object: capacity, conditions, node info.

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "nodeagent-node-status",
    version,
    about = "Node status of the node agent"
)]
struct Cli {
    #[command(flatten)]
    flags: nodeagent_config::KubeletFlags,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    nodeagent_transport::run_main("node-status", &cli.flags, node_status::run)
}
