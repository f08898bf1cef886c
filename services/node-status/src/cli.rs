//! The command line of nodeagent-node-status: the shared flags, parsed from the arguments given,
//! then the service run until SIGTERM (`nodeagent-node-status` and the multi-call `nodeagent`
//! binary both start here).

pub fn main<I, T>(args: I) -> std::process::ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    nodeagent_transport::shared_flags_main(
        "nodeagent-node-status",
        "Node status of the node agent",
        args,
        crate::run,
    )
}
