//! nodeagent-volume: sets up and tears down pod volumes.

fn main() -> std::process::ExitCode {
    volume::cli::main(std::env::args_os())
}
