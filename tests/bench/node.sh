#!/usr/bin/env bash
# The node agent beside raw CRI on this machine: one pod at a time (start latency p50/p99
# from containerd's timestamps), 100 pods at once (start and teardown ratios), 100 pods
# whose PID 1 ignores SIGTERM, RSS/PSS and CPU per service, pleg's relist at 100 and 500
# pods; then where one pod start spends its time, span by span. Prints tables; asserts no
# timing. Needs root and the test containerd (bash deploy/runtime/setup.sh). Takes about
# ten minutes; measures what deploy/up.sh runs: the release multi-call binary, the seven
# services started through their links (PROFILE=dev measures the debug build of each
# service's own binary instead).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=deploy/lib/bin-dir.sh
. deploy/lib/bin-dir.sh
profile=${PROFILE:-release}
if [ "$profile" != dev ]; then
  cargo build -p nodeagent --profile "$profile"
  dir="$PWD/target/$profile"
  export NODEAGENT_TEST_BIN_DIR="$dir/bench-bin"
  nodeagent_snapshot_bins "$dir" "$NODEAGENT_TEST_BIN_DIR"
  echo "== binary size ($profile)"
  ls -l "$dir/nodeagent" | awk '{printf "nodeagent %.1f MB\n", $5/1e6}'
  size -A "$dir/nodeagent" | awk '$1 ~ /^\.(text|rodata|eh_frame)$/ {printf "  %-10s %.1f MB\n", $1, $2/1e6}'
fi
cargo nextest run -p nodeagent-tests --test node_bench --run-ignored only --no-capture --test-threads 1
