#!/usr/bin/env bash
# The docker-compose node for real (compose/docker-compose.yml, project nodeagent-test):
#   - `docker-compose up -d` brings up a node where the example static pod runs
#   - for each of the seven services: `docker-compose restart <svc>`, then
#     `docker-compose kill <svc>` (and `up -d` when docker leaves it stopped) leave the
#     pod untouched (same containers, same PIDs in that containerd) and the service
#     catches up (its gRPC socket answers SERVING, /healthz ok, the pod Running)
#   - a crash (SIGKILL of the service's process) is restarted by docker by itself
#   - `docker-compose down` leaves nothing behind: no containers, networks, volumes, no
#     mounts under the shared directories, no veths or bridge, no pod cgroups
# Prints PASS/FAIL per check, exits non-zero on any failure, always runs `down` at the end
# (and then removes the shared directories and their shared bind mount).
#
# Usage: compose/test.sh [BIN_DIR]   (run as root; needs docker and docker-compose 1.29+)
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=deploy/lib/bin-dir.sh
. deploy/lib/bin-dir.sh
# shellcheck source=deploy/lib/checks.sh
. deploy/lib/checks.sh

PROJECT=nodeagent-test
# shellcheck source=compose/lib.sh
. compose/lib.sh
compose_prepare "${1:-}"
RO=$NODEAGENT_COMPOSE_READONLY_PORT
HZ=$NODEAGENT_COMPOSE_HEALTHZ_PORT

echo "== binaries: $bin_dir; ports: read-only 127.0.0.1:$RO, healthz 127.0.0.1:$HZ"
compose_build_and_up

pods_json() { curl -sf "http://127.0.0.1:$RO/pods"; }
pod_running() { pods_json | grep -q '"phase":"Running"'; }
healthz_ok() { [ "$(curl -sf "http://127.0.0.1:$HZ/healthz")" = ok ]; }
socket_serves() { bash -c "$GRPC_HEALTH_SCRIPT" _ "$SOCKETS/$1.sock"; }
cid() { dc ps -q "$1"; }

t=$SECONDS
if wait_until 120 pod_running; then
  pass "the example static pod runs ($((SECONDS - t)) s after up)"
else
  fail "the example static pod runs"
  pods_json | head -c 2000; echo
  dc logs --tail=40 pod-sync containerd
  exit 1
fi
pod_serves() {
  local ip
  ip=$(pods_json | grep -o '"podIP":"[0-9.]*"' | head -n1 | cut -d'"' -f4)
  [ -n "$ip" ] && docker exec "$(cid probe)" curl -sf "http://$ip:8080/" | grep -q 'hello from web'
}
check "the pod's web page answers on its pod IP (from the probe container)" wait_until 30 pod_serves
check "/healthz on 127.0.0.1:$HZ is ok" wait_until 30 healthz_ok
all_healthy() {
  local s h
  for s in containerd "${NODEAGENT_SERVICES[@]}"; do
    h=$(docker inspect -f '{{.State.Health.Status}}' "$(cid "$s")")
    [ "$h" = healthy ] || { echo "$s: $h"; return 1; }
  done
}
check "every container reports healthy (docker health checks)" wait_until 60 all_healthy
sockets_serve() {
  local s
  for s in "${NODEAGENT_SERVICES[@]}"; do socket_serves "$s" || { echo "$s.sock"; return 1; }; done
}
check "every service's gRPC socket answers SERVING from the host ($SOCKETS)" sockets_serve
volume_propagation() {
  # The volume service's mounts reach containerd: a tmpfs mounted in the volume container
  # under the root directory shows up in containerd's container (rshared both ways).
  local d=/var/lib/nodeagent-compose/kubelet/propagation-check rc=0
  docker exec "$(cid volume)" sh -c "mkdir -p $d && mount -t tmpfs propagation-check $d && touch $d/seen" || return 1
  docker exec "$(cid containerd)" test -f "$d/seen" || { echo "containerd does not see the volume container's mount"; rc=1; }
  docker exec "$(cid pod-sync)" test -f "$d/seen" || { echo "pod-sync does not see the volume container's mount"; rc=1; }
  docker exec "$(cid volume)" sh -c "umount $d && rmdir $d" || rc=1
  return $rc
}
check "mount propagation: a mount made by the volume container reaches containerd and pod-sync" volume_propagation

snapshot() { docker exec "$(cid containerd)" sh -c "$CTR containers ls -q | sort; $CTR tasks ls | tail -n +2 | sort"; }
before=$(snapshot)
info "runtime state in the compose containerd: $(docker exec "$(cid containerd)" sh -c "$CTR containers ls -q" | wc -l) containers, tasks:"
printf '%s\n' "$before" | sed 's/^/       /'

caught_up() { [ "$(docker inspect -f '{{.State.Running}}' "$(cid "$1")")" = true ] && socket_serves "$1" && healthz_ok && pod_running; }
untouched() {  # untouched NAME T0
  local out
  if out=$(stays_same 3 "$before" snapshot); then
    pass "$1: pod containers and PIDs untouched, service caught up ($((SECONDS - $2)) s)"
  else
    fail "$1: pod containers and PIDs untouched"; printf '%s\n' "$out" | sed 's/^/    /'
  fi
}

# ------------------------------------------------------------------ restart and kill each
for s in "${NODEAGENT_SERVICES[@]}"; do
  t=$SECONDS
  if ! out=$(dc restart "$s" 2>&1); then fail "docker-compose restart $s"; printf '%s\n' "$out"; continue; fi
  if wait_until 60 caught_up "$s"; then untouched "docker-compose restart $s" "$t"
  else fail "docker-compose restart $s: catches up (socket, /healthz, pod Running)"; dc logs --tail=20 "$s"; fi

  t=$SECONDS
  c=$(cid "$s")
  r0=$(docker inspect -f '{{.RestartCount}}' "$c")
  started0=$(docker inspect -f '{{.State.StartedAt}}' "$c")
  dc kill "$s" >/dev/null 2>&1
  stopped_or_back() {
    local st
    st=$(docker inspect -f '{{.State.Status}} {{.State.StartedAt}}' "$c")
    [ "${st%% *}" = exited ] || [ "${st#* }" != "$started0" ]
  }
  wait_until 20 stopped_or_back || true
  st=$(docker inspect -f '{{.State.Status}}' "$c")
  if [ "$st" = exited ]; then
    how="docker left it stopped (kill is a manual stop for restart: unless-stopped), up -d restarted it"
    dc up -d >/dev/null 2>&1 || { fail "docker-compose up -d after kill $s"; continue; }
  else
    how="docker restarted it by itself (RestartCount $r0 -> $(docker inspect -f '{{.RestartCount}}' "$c"))"
  fi
  if wait_until 60 caught_up "$s"; then untouched "docker-compose kill $s; $how" "$t"
  else fail "docker-compose kill $s: catches up"; dc logs --tail=20 "$s"; fi
done

# ------------------------------------------------------------------ a crash: docker restarts
c=$(cid pod-sync)
r0=$(docker inspect -f '{{.RestartCount}}' "$c")
init_pid=$(docker inspect -f '{{.State.Pid}}' "$c")
svc_pid=$(pgrep -P "$init_pid" | head -n1)   # the service, under docker's init
t=$SECONDS
kill -KILL "$svc_pid"
restarted_by_docker() {
  [ "$(docker inspect -f '{{.RestartCount}}' "$c")" -gt "$r0" ] && caught_up pod-sync
}
if wait_until 60 restarted_by_docker; then
  pass "pod-sync crashes (SIGKILL of its process): docker restarts it by itself (restart: unless-stopped; RestartCount $r0 -> $(docker inspect -f '{{.RestartCount}}' "$c"), $((SECONDS - t)) s)"
  untouched "after the pod-sync crash" "$t"
else
  fail "pod-sync crashes: docker restarts it by itself"
fi

# ------------------------------------------------------------------ down
net_id=$(docker network inspect -f '{{.Id}}' "${PROJECT}_default" 2>/dev/null | cut -c1-12)
t=$SECONDS
if out=$(dc down -t 40 2>&1); then
  pass "docker-compose down ($((SECONDS - t)) s)"
else
  fail "docker-compose down"; printf '%s\n' "$out" | tail -n 20
fi
label="label=com.docker.compose.project=$PROJECT"
check "down: no containers of the project left" bash -c "[ -z \"\$(docker ps -aq --filter $label)\" ]"
check "down: no networks of the project left" bash -c "[ -z \"\$(docker network ls -q --filter $label)\" ]"
check "down: no volumes of the project left" bash -c "[ -z \"\$(docker volume ls -q --filter $label)\" ]"
no_mounts_under() {
  local d m bad=""
  for d in "${SHARED_DIRS[@]}"; do
    # the shared bind mount of /var/lib/nodeagent-compose onto itself is host set-up, kept
    # for the next `up` (this script removes it at the very end)
    while read -r m; do
      [ -n "$m" ] && [ "$m" != "$d" ] && bad+=" $m"
    done < <(findmnt -rn -o TARGET | grep -E "^$d(/|$)" || true)
  done
  bad+=$(findmnt -rn -t nsfs -o TARGET | grep -E 'nodeagent-compose|/run/containerd' | sed 's/^/ /' || true)
  [ -z "$bad" ] || { echo "left mounted:$bad"; return 1; }
}
check "down: no mounts left under ${SHARED_DIRS[*]} (nor netns mounts)" no_mounts_under
no_links() {
  local bad="" l master
  ip link show nodeagentc0 >/dev/null 2>&1 && bad+=" nodeagentc0"
  [ -n "$net_id" ] && ip link show "br-$net_id" >/dev/null 2>&1 && bad+=" br-$net_id"
  # every veth left on the host belongs to a bridge that is not ours (docker0, the host's
  # own node agent, other projects): an orphan would have no master.
  for l in $(ip -o link show type veth | awk -F': ' '{print $2}' | cut -d@ -f1); do
    master=$(ip -o link show "$l" | grep -o 'master [^ ]*' | cut -d' ' -f2 || true)
    if [ -z "$master" ] || [ "$master" = "br-$net_id" ] || [ "$master" = nodeagentc0 ]; then bad+=" $l(master:${master:-none})"; fi
  done
  [ -z "$bad" ] || { echo "left:$bad"; return 1; }
}
check "down: no veths, no nodeagentc0 bridge, no project bridge left on the host" no_links
no_cgroups() {
  local left
  left=$(find /sys/fs/cgroup/ -maxdepth 2 -type d -name nodeagent-compose 2>/dev/null)
  [ -z "$left" ] || { echo "left: $left"; return 1; }
}
check "down: no pod cgroups left (/sys/fs/cgroup/*/nodeagent-compose)" no_cgroups
no_processes() {
  local left
  left=$(pgrep -a -f 'nodeagent-compose|containerd-shim-runc-v2 -namespace k8s.io -id .* -address /run/containerd/containerd.sock' || true)
  [ -z "$left" ] || { echo "left: $left"; return 1; }
}
check "down: no processes of the node left (services, shims, pods)" no_processes

summary
