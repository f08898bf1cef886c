//! The command line of nodeagent-pleg: its flags, parsed from the arguments given, then the
//! service run until SIGTERM (`nodeagent-pleg` and the multi-call `nodeagent` binary both
//! start here).

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

pub fn main<I, T>(args: I) -> std::process::ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = Cli::parse_from(args);
    nodeagent_transport::run_main("pleg", &cli.flags, crate::run)
}
