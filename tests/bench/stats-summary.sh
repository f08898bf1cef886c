#!/usr/bin/env bash
# /stats/summary latency (p50/p99) at 100 pods and the RSS of http-server.
# Needs root and the test containerd (bash deploy/runtime/setup.sh). Takes a few minutes.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# Release builds are what operators run; the timings of a debug build are pessimistic.
cargo build --bins
cargo nextest run -p nodeagent-tests --test suite --run-ignored only -E "test(/^stats_bench::/)" --no-capture
