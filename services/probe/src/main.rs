//! nodeagent-probe: runs liveness, readiness and startup probes.

fn main() -> std::process::ExitCode {
    probe::cli::main(std::env::args_os())
}
