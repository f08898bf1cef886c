//! The command line of nodeagent-http-server: the shared flags, parsed from the arguments given,
//! then the service run until SIGTERM (`nodeagent-http-server` and the multi-call `nodeagent`
//! binary both start here).

pub fn main<I, T>(args: I) -> std::process::ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    nodeagent_transport::shared_flags_main(
        "nodeagent-http-server",
        "Kubelet HTTP API of the node agent",
        args,
        crate::run,
    )
}
