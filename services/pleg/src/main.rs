//! nodeagent-pleg: relists the container runtime and serves pod lifecycle events.

fn main() -> std::process::ExitCode {
    pleg::cli::main(std::env::args_os())
}
