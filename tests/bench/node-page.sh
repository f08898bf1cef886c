#!/usr/bin/env bash
# The node's web page (/ui/) at 100 pods in headless Chromium: the first paint and the
# time until the data is on screen (node page, pod list, a pod's page; 10 loads each),
# and what the open page costs the node: the seven services' CPU over 60 s with the node
# page open (it refreshes every 5 s) against 60 s with no page open.
# Needs root, the test containerd (bash deploy/runtime/setup.sh) and chromium.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# PROFILE=release measures what operators run (deploy/up.sh's build); the debug build's
# CPU is pessimistic.
profile=${PROFILE:-dev}
cargo build --bins --profile "$profile"
if [ "$profile" != dev ]; then
    export NODEAGENT_TEST_BIN_DIR="${CARGO_TARGET_DIR:-$PWD/target}/$profile"
fi
cargo nextest run -p nodeagent-tests --test suite --run-ignored only -E "test(/^node_page_bench::/)" --no-capture
