//! The command line of nodeagent-probe: its flags, parsed from the arguments given, then the
//! service run until SIGTERM (`nodeagent-probe` and the multi-call `nodeagent` binary both
//! start here).

use clap::{CommandFactory, Parser};

#[derive(Parser)]
#[command(name = "nodeagent-probe", about = "Probe workers of the node agent")]
struct Cli {
    #[command(flatten)]
    flags: nodeagent_config::KubeletFlags,
    /// Run as one of several probe instances: serve on `<socket-dir>/probe-<ID>.sock`,
    /// register with pod-sync and probe only this instance's share of the pods. `auto`
    /// draws a random id (replicas of a compose service share their flags). Without it, the
    /// single default instance probes every pod.
    #[arg(long, value_name = "ID")]
    probe_instance: Option<String>,
}

pub fn main<I, T>(args: I) -> std::process::ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli: Cli =
        nodeagent_transport::parse_command_line(Cli::command(), args, |c: &mut Cli| &mut c.flags);
    let instance = cli.probe_instance;
    nodeagent_transport::run_main("probe", &cli.flags, move |config, shutdown| {
        crate::run(config, instance, shutdown)
    })
}
