#!/usr/bin/env bash
# The node agent beside raw CRI on this machine: one pod at a time (start latency p50/p99
# from containerd's timestamps), 100 pods at once (start and teardown ratios), 100 pods
# whose PID 1 ignores SIGTERM, RSS/PSS and CPU per service, pleg's relist at 100 and 500
# pods. Prints a table; asserts no timing. Needs root and the test containerd
# (bash deploy/runtime/setup.sh). Takes about ten minutes; builds the release binaries
# (PROFILE=dev measures the debug build).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
profile=${PROFILE:-release}
cargo build --workspace --bins --profile "$profile"
if [ "$profile" != dev ]; then
    export NODEAGENT_TEST_BIN_DIR="$PWD/target/$profile"
    echo "== binary sizes ($profile)"
    ls -l "$NODEAGENT_TEST_BIN_DIR"/nodeagent-* | awk '$1 ~ /x/ {printf "%-28s %6.1f MB\n", $9, $5/1e6}' | sed "s|$NODEAGENT_TEST_BIN_DIR/||"
fi
cargo nextest run -p nodeagent-tests --test node_bench --run-ignored only --no-capture
