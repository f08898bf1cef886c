#!/usr/bin/env bash
# The probe service's CPU with 100 pods × 2 probes at periodSeconds 1, beside the same
# checks made directly from one thread, and its RSS. Prints a table; asserts no timing.
# Needs root and the test containerd (bash deploy/runtime/setup.sh). Takes a few minutes.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# PROFILE=release measures what operators run; the debug build's CPU is pessimistic.
profile=${PROFILE:-dev}
cargo build --bins --profile "$profile"
if [ "$profile" != dev ]; then
    export NODEAGENT_TEST_BIN_DIR="${CARGO_TARGET_DIR:-$PWD/target}/$profile"
fi
cargo nextest run -p nodeagent-tests --test suite --run-ignored only -E "test(/^probe_bench::/)" --no-capture
