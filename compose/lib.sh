# shellcheck shell=bash disable=SC2034
# Sourced by compose/test.sh and compose/cluster-test.sh (after deploy/lib/bin-dir.sh and
# deploy/lib/checks.sh, with PROJECT set): what both need to run the compose node for real
# and leave nothing behind.
#
# compose_prepare [BIN_DIR]: checks root and docker, installs docker-compose and curl when
# missing, sets bin_dir, takes the one-run-at-a-time lock (the host paths and ports are
# fixed), picks free published ports and installs the EXIT trap that runs `down` and
# removes the shared directories.
COMPOSE_FILE=compose/docker-compose.yml
SOCKETS=/run/nodeagent-compose/sockets
SHARED_DIRS=(/run/nodeagent-compose /var/lib/nodeagent-compose /var/log/nodeagent-compose)
CTR="ctr --address /run/nodeagent-compose/containerd/containerd.sock -n k8s.io"
# Extra arguments of every docker-compose call (e.g. --profile cluster).
COMPOSE_ARGS=()
T_START=$SECONDS
# How many nodes (NODES=3: a three-node cluster). Node 1 is project $PROJECT, as ever;
# node i > 1 is project $PROJECT-$i with NODEAGENT_COMPOSE_NODE=nodeagent-compose-$i (its
# own host paths, cgroup root and published ports) and no API server of its own. With more
# than one, every project joins the network $CLUSTER_NETWORK (compose/cluster/network.yml),
# where the nodes reach the API server and it reaches each node by name.
NODES=${NODES:-1}
CLUSTER_NETWORK=nodeagent-cluster
NODE_RO_PORTS=() NODE_HZ_PORTS=()

compose_files() {
  printf '%s\n' -f "$COMPOSE_FILE"
  [ "$NODES" -le 1 ] || printf '%s\n' -f compose/cluster/network.yml
}
dc() {
  local files
  mapfile -t files < <(compose_files)
  docker-compose -p "$PROJECT" "${files[@]}" "${COMPOSE_ARGS[@]}" "$@"
}
# node_name I: the Node's name of node I.
node_name() { if [ "$1" -eq 1 ]; then echo nodeagent-compose; else echo "nodeagent-compose-$1"; fi; }
# dcn I ARGS...: docker-compose for node I (dc for node 1).
dcn() {
  local i=$1 files
  shift
  if [ "$i" -eq 1 ]; then dc "$@"; return; fi
  mapfile -t files < <(compose_files)
  NODEAGENT_COMPOSE_NODE=$(node_name "$i") \
    NODEAGENT_COMPOSE_READONLY_PORT=${NODE_RO_PORTS[$i]} NODEAGENT_COMPOSE_HEALTHZ_PORT=${NODE_HZ_PORTS[$i]} \
    docker-compose -p "$PROJECT-$i" "${files[@]}" "$@"
}

port_free() { ! ss -Hltn "sport = :$1" | grep -q .; }
free_port() { local p=$1; while ! port_free "$p"; do p=$((p + 1)); done; echo "$p"; }

teardown_host() {
  # What the compose project keeps on the host between runs (and `down` does not remove,
  # by design): the shared directories' files and the shared bind mount host-mounts made.
  local d i
  for i in $(seq 2 "$NODES"); do
    SHARED_DIRS+=("/run/$(node_name "$i")" "/var/lib/$(node_name "$i")" "/var/log/$(node_name "$i")")
  done
  for d in "${SHARED_DIRS[@]}"; do
    if mountpoint -q "$d"; then umount "$d" 2>/dev/null || umount -l "$d" || true; fi
    rm -rf --one-file-system "$d"
  done
}

compose_cleanup() {
  local rc=$? i
  for i in $(seq "$NODES" -1 1); do dcn "$i" down --remove-orphans -t 40 >/dev/null 2>&1 || true; done
  [ "$NODES" -le 1 ] || docker network rm "$CLUSTER_NETWORK" >/dev/null 2>&1 || true
  teardown_host
  echo "== whole test: $((SECONDS - T_START)) s"
  exit $rc
}

# compose_build_and_up: removes a previous run's leftovers, builds the images from
# $bin_dir and brings node 1's project up (PASS, or FAIL and exit); UP_STARTED is when
# `up` began. compose_up_node I brings node I > 1 up.
compose_build_and_up() {
  local t=$SECONDS out i
  for i in $(seq "$NODES" -1 1); do dcn "$i" down --remove-orphans -t 40 >/dev/null 2>&1 || true; done
  if [ "$NODES" -gt 1 ]; then
    docker network inspect "$CLUSTER_NETWORK" >/dev/null 2>&1 || docker network create "$CLUSTER_NETWORK" >/dev/null
  fi
  bash compose/build-images.sh "$bin_dir"
  echo "== images ready in $((SECONDS - t)) s"
  UP_STARTED=$SECONDS
  if out=$(dc up -d 2>&1); then
    pass "docker-compose ${COMPOSE_ARGS[*]}${COMPOSE_ARGS[*]:+ }up -d ($((SECONDS - UP_STARTED)) s)"
  else
    fail "docker-compose ${COMPOSE_ARGS[*]}${COMPOSE_ARGS[*]:+ }up -d"; printf '%s\n' "$out" | tail -n 20; exit 1
  fi
}

compose_prepare() {
  [ "$(id -u)" -eq 0 ] || { echo "must run as root" >&2; exit 1; }
  command -v docker >/dev/null || { echo "docker is required" >&2; exit 1; }
  if ! command -v docker-compose >/dev/null || ! command -v curl >/dev/null; then
    echo "== installing docker-compose and curl"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null && apt-get install -y -qq docker-compose curl >/dev/null
  fi
  bin_dir=$(nodeagent_bin_dir "${1:-}")

  # One run at a time: the project name, the ports and the host paths are fixed.
  mkdir -p /var/lock
  exec 9>/var/lock/nodeagent-compose-test.lock
  flock 9

  # The published ports, unless the host already uses them (its own node agent).
  export NODEAGENT_COMPOSE_READONLY_PORT=${NODEAGENT_COMPOSE_READONLY_PORT:-$(free_port 10255)}
  export NODEAGENT_COMPOSE_HEALTHZ_PORT=${NODEAGENT_COMPOSE_HEALTHZ_PORT:-$(free_port 10248)}
  export NODEAGENT_COMPOSE_APISERVER_PORT=${NODEAGENT_COMPOSE_APISERVER_PORT:-$(free_port 8080)}
  local i
  for i in $(seq 2 "$NODES"); do
    NODE_RO_PORTS[i]=$(free_port $((NODEAGENT_COMPOSE_READONLY_PORT + 100 * (i - 1))))
    NODE_HZ_PORTS[i]=$(free_port $((NODEAGENT_COMPOSE_HEALTHZ_PORT + 100 * (i - 1))))
  done

  trap compose_cleanup EXIT
  trap 'exit 130' INT TERM
}

compose_up_node() {
  local i=$1 t=$SECONDS out
  if out=$(dcn "$i" up -d 2>&1); then
    pass "node $i ($(node_name "$i")): docker-compose -p $PROJECT-$i up -d ($((SECONDS - t)) s)"
  else
    fail "node $i: docker-compose -p $PROJECT-$i up -d"; printf '%s\n' "$out" | tail -n 20; exit 1
  fi
}
