#!/usr/bin/env bash
# Builds every fuzz target and runs each for a fixed time with a fixed seed, starting from
# the committed corpus (tests/fuzz/corpus/<target>/). Exits non-zero if any target found a
# crash, a hang or an out-of-memory; the input is left in tests/fuzz/artifacts/<target>/.
#
#   tests/fuzz/run.sh [seconds-per-target]     (default 60)
#   tests/fuzz/run.sh --unit-tests             the fuzz crate's own unit tests (each target
#                                              replays the committed corpus), stable toolchain
#
# Needs the nightly toolchain (libFuzzer's coverage instrumentation) and cargo-fuzz, which
# it installs from crates.io when missing, at a pinned version. The nightly cannot be
# fetched here (only crates.io, PyPI and Debian are reachable): the one rustup has is used,
# and a nightly other than the one this was last checked with is named in a warning.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
cd "$here/../.."
toolchain="${FUZZ_TOOLCHAIN:-nightly}"
CARGO_FUZZ_VERSION=0.13.2
CHECKED_NIGHTLY=2026-05-19

# Build with the versions the product is built with: the fuzz crate is its own workspace
# (so that the main build never compiles libFuzzer), seeded from the main lock file each
# time; cargo adds only libFuzzer's own crates to it.
cp Cargo.lock tests/fuzz/Cargo.lock

if [ "${1:-}" = --unit-tests ]; then
    exec cargo test --manifest-path tests/fuzz/Cargo.toml --lib
fi
secs="${1:-60}"

if ! cargo fuzz --version 2>/dev/null | grep -qF "$CARGO_FUZZ_VERSION"; then
    cargo install --locked "cargo-fuzz@$CARGO_FUZZ_VERSION"
fi
nightly=$(rustc "+$toolchain" -V) || { echo "fuzz: no $toolchain toolchain (rustup toolchain list)" >&2; exit 1; }
case "$nightly" in
    *"$CHECKED_NIGHTLY"*) echo "fuzz: $nightly" ;;
    *) echo "fuzz: WARNING: $nightly is not the nightly of $CHECKED_NIGHTLY this was checked with" ;;
esac
# Safe Rust needs no sanitizer to show a panic, an overflow, a hang or a huge allocation;
# without one the targets build faster and run about twice as fast.
flags=(--fuzz-dir tests/fuzz -O --debug-assertions --sanitizer none --codegen-units 16)
cargo "+$toolchain" fuzz build "${flags[@]}"

failed=()
for target in $(cargo "+$toolchain" fuzz list --fuzz-dir tests/fuzz); do
    # New inputs go to a scratch directory, so the committed corpus stays as it is.
    scratch="$here/target/corpus/$target"
    mkdir -p "$scratch"
    extra=()
    if [ -f "$here/dict/$target.dict" ]; then
        extra+=("-dict=$here/dict/$target.dict")
    fi
    echo "fuzz: $target for ${secs}s"
    if ! cargo "+$toolchain" fuzz run "${flags[@]}" "$target" "$scratch" "$here/corpus/$target" -- \
        -seed=1 -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
        -print_final_stats=1 "${extra[@]}"; then
        failed+=("$target")
    fi
done

if [ "${#failed[@]}" -gt 0 ]; then
    echo "fuzz: FAILED: ${failed[*]} (inputs in tests/fuzz/artifacts/)" >&2
    exit 1
fi
echo "fuzz: every target ran ${secs}s without a finding"
