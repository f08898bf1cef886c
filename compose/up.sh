#!/usr/bin/env bash
# One command for the docker-compose node: builds the release binary (and, with --cluster,
# the test API server), the images (compose/build-images.sh), brings the project
# `nodeagent` up and waits until it serves, then prints what to type.
#
#   compose/up.sh              the node, standalone, with the example static pod
#   compose/up.sh --cluster    plus the test API server: a one-node cluster for kubectl
#
# Stop with: docker-compose -p nodeagent -f compose/docker-compose.yml --profile cluster down
# Run as root (docker, docker-compose 1.29+; kubectl for the cluster).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=deploy/lib/bin-dir.sh
. deploy/lib/bin-dir.sh
# shellcheck source=deploy/lib/checks.sh
. deploy/lib/checks.sh

args=()
cluster=false
case "${1:-}" in
  --cluster) cluster=true; args=(--profile cluster) ;;
  "") ;;
  *) echo "usage: compose/up.sh [--cluster]" >&2; exit 2 ;;
esac
[ "$(id -u)" -eq 0 ] || { echo "must run as root" >&2; exit 1; }
RO=${NODEAGENT_COMPOSE_READONLY_PORT:-10255}
API=http://127.0.0.1:${NODEAGENT_COMPOSE_APISERVER_PORT:-8080}

echo "== building the node agent (release; the first build takes several minutes)"
cargo build --release -p nodeagent
if $cluster; then cargo build --release -p nodeagent-tests --bin nodeagent-test-apiserver; fi
target=$(nodeagent_target_dir)
bash compose/build-images.sh "$target/release"
docker-compose -p nodeagent -f compose/docker-compose.yml "${args[@]}" up -d

echo "== waiting for the example pod"
pod_running() { curl -sf "http://127.0.0.1:$RO/pods" | grep -q '"phase":"Running"'; }
wait_until 180 pod_running || { echo "the example pod did not run within 180 s: docker-compose -p nodeagent -f compose/docker-compose.yml logs" >&2; exit 1; }
cat <<MSG

The compose node is up; the example pod runs.
  pods (read-only port):  curl -s http://127.0.0.1:$RO/pods
  health:                 curl -s 'http://127.0.0.1:${NODEAGENT_COMPOSE_HEALTHZ_PORT:-10248}/healthz?verbose'
  logs:                   docker-compose -p nodeagent -f compose/docker-compose.yml logs pod-sync
  stop:                   docker-compose -p nodeagent -f compose/docker-compose.yml ${args[*]} down
MSG
if $cluster; then
  node_ready() { kubectl --server "$API" get node nodeagent-compose 2>/dev/null | grep -qw Ready; }
  wait_until 120 node_ready || { echo "the node did not become Ready in the API server within 120 s" >&2; exit 1; }
  cat <<MSG
  the cluster:            kubectl --server $API get nodes,pods
                          (pods without spec.nodeName are scheduled to the node:
                          kubectl apply -f pod.yaml)
MSG
fi
