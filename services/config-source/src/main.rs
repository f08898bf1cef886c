//! nodeagent-config-source: serves the desired set of pods merged from every source.

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "nodeagent-config-source",
    version,
    about = "Pod sources of the node agent"
)]
struct Cli {
    #[command(flatten)]
    flags: nodeagent_config::KubeletFlags,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    nodeagent_transport::run_main("config-source", &cli.flags, config_source::run)
}
