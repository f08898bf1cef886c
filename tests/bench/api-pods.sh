#!/usr/bin/env bash
# A pod created through the API server until Ready there (the test API server, its
# scheduler binding each pod), 30 one after another and 30 at once, beside the same pods
# made directly over CRI in the same run (tests/tests/suite/api_bench.rs). Prints a table
# of p50 and p99; asserts no timing. Needs root and the test containerd (bash
# deploy/runtime/setup.sh). Takes about two minutes; measures the release build
# (PROFILE=dev: the debug build of each service's own binary).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=deploy/lib/bin-dir.sh
. deploy/lib/bin-dir.sh
nodeagent_bench_bins
cargo nextest run -p nodeagent-tests --test suite --run-ignored only -E "test(=api_bench::api_pod_created_to_ready)" --no-capture --test-threads 1
