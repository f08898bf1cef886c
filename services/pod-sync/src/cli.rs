//! The command line of nodeagent-pod-sync: its flags, parsed from the arguments given, then the
//! service run until SIGTERM (`nodeagent-pod-sync` and the multi-call `nodeagent` binary both
//! start here).

use clap::{CommandFactory, Parser};

#[derive(Parser)]
#[command(name = "nodeagent-pod-sync", about = "Pod sync loop of the node agent")]
struct Cli {
    #[command(flatten)]
    flags: nodeagent_config::KubeletFlags,
    /// Run the static pods once, wait until they run, print their status, and exit
    /// (upstream --runonce). The pods keep running.
    #[arg(long)]
    runonce: bool,
}

pub fn main<I, T>(args: I) -> std::process::ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli: Cli =
        nodeagent_transport::parse_command_line(Cli::command(), args, |c: &mut Cli| &mut c.flags);
    if cli.runonce {
        nodeagent_transport::run_main("pod-sync", &cli.flags, crate::run_once)
    } else {
        nodeagent_transport::run_main("pod-sync", &cli.flags, crate::run)
    }
}
