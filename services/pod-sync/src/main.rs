//! nodeagent-pod-sync: drives the container runtime to the desired pods.

fn main() -> std::process::ExitCode {
    pod_sync::cli::main(std::env::args_os())
}
