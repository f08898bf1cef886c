//! nodeagent-config-source: serves the desired set of pods merged from every source.

fn main() -> std::process::ExitCode {
    config_source::cli::main(std::env::args_os())
}
