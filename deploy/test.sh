#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run calls this): prepares the real container
# runtime, checks formatting and lints, builds the seven binaries (and the previous
# release's, for the upgrade test), runs every test, the cgroup tests again on a cgroup v2
# guest, then each fuzz target briefly.
# Run as root on Debian 12 (the runtime tests need containerd, runc and CNI).
set -euo pipefail
cd "$(dirname "$0")/.."

bash deploy/runtime/setup.sh
echo "== cargo fmt --check"
cargo fmt --all --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "== the previous release's binaries (the upgrade test runs them against the current ones)"
bash tests/upgrade/build-previous.sh
echo "== cargo build (the binaries the cross-service tests start)"
cargo build --workspace --bins
echo "== cargo nextest"
# A machine with Rust but without cargo-nextest gets the pinned version (built from
# crates.io, a few minutes, once): it runs each test in its own process, so one test's
# panic or leftover task never reaches another, and it reports every failure at the end.
NEXTEST_VERSION=0.9.143
if ! cargo nextest --version >/dev/null 2>&1; then
  echo "== installing cargo-nextest $NEXTEST_VERSION"
  cargo install --locked "cargo-nextest@$NEXTEST_VERSION"
fi
cargo nextest run --workspace --no-fail-fast
echo "== the cgroup tests again on a cgroup v2 host (a qemu guest; this machine's hierarchy is $(stat -fc %T /sys/fs/cgroup))"
bash tests/cgroup2/suite.sh
echo "== fuzzing: every target for 20 s with a fixed seed"
bash tests/fuzz/run.sh 20
