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
nodeagent_bench_bins
if [ -n "$bench_dir" ]; then
  echo "== binary size ($bench_profile)"
  ls -l "$bench_dir/nodeagent" | awk '{printf "nodeagent %.1f MB\n", $5/1e6}'
  size -A "$bench_dir/nodeagent" | awk '$1 ~ /^\.(text|rodata|eh_frame)$/ {printf "  %-10s %.1f MB\n", $1, $2/1e6}'
fi
# `node.sh density`: the density benchmark instead (issue 29; BENCH_PODS, default 500;
# BENCH_RAW_CONCURRENCY, default 4,8,16; BENCH_POD_SYNC_ARGS, extra pod-sync flags).
module=node_bench
[ "${1:-}" = density ] && module=density_bench
cargo nextest run -p nodeagent-tests --test suite --profile bench --run-ignored only -E "test(/^$module::/)" --no-capture
