//! nodeagent-node-status: serves the Node object: capacity, conditions, node info.

fn main() -> std::process::ExitCode {
    node_status::cli::main(std::env::args_os())
}
