//! nodeagent-http-server: serves the kubelet HTTP API.

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "nodeagent-http-server",
    version,
    about = "Kubelet HTTP API of the node agent"
)]
struct Cli {
    #[command(flatten)]
    flags: nodeagent_config::KubeletFlags,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    nodeagent_transport::run_main("http-server", &cli.flags, http_server::run)
}
