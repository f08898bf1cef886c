#!/usr/bin/env bash
# One command for the docker-compose node: builds the release binary (and, with --cluster,
# the test API server), the images (compose/build-images.sh), brings the project
# `nodeagent` up and waits until it serves, then prints what to type.
#
#   compose/up.sh                        the node, standalone, with the example static pod
#   compose/up.sh --cluster              plus the test API server: a one-node cluster
#   compose/up.sh --cluster --nodes 3    three nodes (projects nodeagent, nodeagent-2,
#                                        nodeagent-3), each with its own containerd, on
#                                        the network nodeagent-cluster
#
# Stop with the command it prints at the end.
# Run as root (docker, docker-compose 1.29+; kubectl for the cluster).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=deploy/lib/bin-dir.sh
. deploy/lib/bin-dir.sh
# shellcheck source=deploy/lib/checks.sh
. deploy/lib/checks.sh

args=()
cluster=false
nodes=1
usage() { echo "usage: compose/up.sh [--cluster [--nodes N]]" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --cluster) cluster=true; args=(--profile cluster) ;;
    --nodes) nodes=${2:-}; shift ;;
    *) usage ;;
  esac
  shift
done
[[ "$nodes" =~ ^[1-9][0-9]?$ ]] || usage
[ "$nodes" -eq 1 ] || $cluster || usage
files=(-f compose/docker-compose.yml)
[ "$nodes" -eq 1 ] || files+=(-f compose/cluster/network.yml)
node_name() { if [ "$1" -eq 1 ]; then echo nodeagent-compose; else echo "nodeagent-compose-$1"; fi; }
project() { if [ "$1" -eq 1 ]; then echo nodeagent; else echo "nodeagent-$1"; fi; }
[ "$(id -u)" -eq 0 ] || { echo "must run as root" >&2; exit 1; }
RO=${NODEAGENT_COMPOSE_READONLY_PORT:-10255}
API=http://127.0.0.1:${NODEAGENT_COMPOSE_APISERVER_PORT:-8080}

echo "== building the node agent (release; the first build takes several minutes)"
cargo build --release -p nodeagent
if $cluster; then cargo build --release -p nodeagent-tests --bin nodeagent-test-apiserver; fi
target=$(nodeagent_target_dir)
bash compose/build-images.sh "$target/release"
[ "$nodes" -eq 1 ] || docker network inspect nodeagent-cluster >/dev/null 2>&1 \
  || docker network create nodeagent-cluster >/dev/null
docker-compose -p nodeagent "${files[@]}" "${args[@]}" up -d
for i in $(seq 2 "$nodes"); do
  # Its own host paths, cgroup root and ports (10255 + 100 per node, and so on).
  NODEAGENT_COMPOSE_NODE=$(node_name "$i") \
    NODEAGENT_COMPOSE_READONLY_PORT=$((${NODEAGENT_COMPOSE_READONLY_PORT:-10255} + 100 * (i - 1))) \
    NODEAGENT_COMPOSE_HEALTHZ_PORT=$((${NODEAGENT_COMPOSE_HEALTHZ_PORT:-10248} + 100 * (i - 1))) \
    docker-compose -p "$(project "$i")" "${files[@]}" up -d
done
stop=""
for i in $(seq "$nodes" -1 1); do
  stop+="docker-compose -p $(project "$i") ${files[*]} ${args[*]} down; "
done
[ "$nodes" -eq 1 ] || stop+="docker network rm nodeagent-cluster"

echo "== waiting for the example pod"
pod_running() { curl -sf "http://127.0.0.1:$RO/pods" | grep -q '"phase":"Running"'; }
wait_until 180 pod_running || { echo "the example pod did not run within 180 s: docker-compose -p nodeagent -f compose/docker-compose.yml logs" >&2; exit 1; }
cat <<MSG

The compose node is up; the example pod runs.
  pods (read-only port):  curl -s http://127.0.0.1:$RO/pods
  health:                 curl -s 'http://127.0.0.1:${NODEAGENT_COMPOSE_HEALTHZ_PORT:-10248}/healthz?verbose'
  logs:                   docker-compose -p nodeagent -f compose/docker-compose.yml logs pod-sync
  stop:                   $stop
MSG
if $cluster; then
  node_ready() {
    local i
    for i in $(seq 1 "$nodes"); do
      kubectl --server "$API" get node "$(node_name "$i")" 2>/dev/null | grep -qw Ready || return 1
    done
  }
  wait_until 180 node_ready || { echo "not every node became Ready in the API server within 180 s" >&2; exit 1; }
  cat <<MSG
  the cluster:            kubectl --server $API get nodes,pods
                          (pods without spec.nodeName are scheduled to a node
                          with room: kubectl apply -f pod.yaml)
MSG
fi
