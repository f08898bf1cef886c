//! The commit the binaries are built from, for `--version` and the start-up log line:
//! `git rev-parse --short=12 HEAD`, or
//! `NODEAGENT_COMMIT` from the environment (an image build without `.git`), else "unknown".

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    println!("cargo:rerun-if-env-changed=NODEAGENT_COMMIT");
    // A new commit or checkout moves HEAD's log; rebuild the version then.
    for path in ["HEAD", "logs/HEAD"] {
        if let Some(p) = git(&["rev-parse", "--path-format=absolute", "--git-path", path]) {
            println!("cargo:rerun-if-changed={p}");
        }
    }
    let commit = std::env::var("NODEAGENT_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=NODEAGENT_COMMIT={commit}");
}
