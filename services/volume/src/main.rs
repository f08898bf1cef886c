//! nodeagent-volume: sets up and tears down pod volumes.

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "nodeagent-volume",
    version,
    about = "Volume manager of the node agent"
)]
struct Cli {
    #[command(flatten)]
    flags: nodeagent_config::KubeletFlags,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    nodeagent_transport::run_main("volume", &cli.flags, volume::run)
}
