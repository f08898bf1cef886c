//! nodeagent-http-server: serves the kubelet HTTP API.

fn main() -> std::process::ExitCode {
    http_server::cli::main(std::env::args_os())
}
