#!/usr/bin/env bash
# The containerd container of the docker-compose node (under docker's init, which forwards
# SIGTERM here and reaps orphans). Starts containerd, imports the locally built pause and
# busybox images (baked into this image: no registry is reachable), and waits.
#
# The pods' processes live in this container's PID namespace, so they end with it. On
# SIGTERM (docker-compose stop/restart/down) this script therefore shuts the node down the
# way a machine does: containerd first, then every remaining process (shims and pods), then
# the pods' cgroups under the node's cgroup root, which would otherwise stay behind on the
# host (/sys/fs/cgroup/*/nodeagent-compose). The same cleanup runs at start, after a kill.
set -uo pipefail

SOCK=/run/nodeagent-compose/containerd/containerd.sock
CONFIG=/etc/containerd/config.toml
CGROUP_ROOT=${NODEAGENT_CGROUP_ROOT:-/nodeagent-compose}
IMAGES=/opt/nodeagent/images
NS=k8s.io

log() { printf '[containerd-entrypoint] %s\n' "$*"; }
ctr_() { ctr --address "$SOCK" "$@"; }

# rmdir every cgroup under CGROUP_ROOT, deepest first, in every hierarchy (v1 and v2).
remove_cgroups() {
  local h dir left=0
  for h in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
    dir="${h%/}$CGROUP_ROOT"
    [ -d "$dir" ] || continue
    find "$dir" -depth -type d -exec rmdir {} + 2>/dev/null || true
    [ -d "$dir" ] && left=1
  done
  return $left
}

# Kills everything in this PID namespace but init (PID 1) and this script, and waits until
# only zombies (init reaps them) are left.
kill_the_rest() {
  local deadline=$((SECONDS + 10)) d p st left
  while :; do
    kill -KILL -1 2>/dev/null
    left=0
    for d in /proc/[0-9]*; do
      p=${d#/proc/}
      if [ "$p" = 1 ] || [ "$p" = "$$" ]; then continue; fi
      read -r st <"$d/stat" 2>/dev/null || continue
      st=${st##*) }
      [ "${st%% *}" = Z ] || left=$((left + 1))
    done
    [ "$left" -eq 0 ] && return 0
    [ $SECONDS -lt $deadline ] || { log "$left processes would not die"; return 1; }
    sleep 0.2
  done
}

shutdown_node() {
  log "stopping containerd (pid $cpid)"
  kill -TERM "$cpid" 2>/dev/null
  local deadline=$((SECONDS + 15))
  while kill -0 "$cpid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.2; done
  log "stopping the pods (shims and containers), then removing their cgroups under $CGROUP_ROOT"
  kill_the_rest
  for _ in $(seq 1 50); do remove_cgroups && break; sleep 0.2; done
  remove_cgroups || log "some cgroups under $CGROUP_ROOT could not be removed"
  log "node down"
  exit 0
}

# Docker mounts /proc/sys read-only in a container that is not --privileged; the CNI
# plugins write sysctls (ip_forward, per-interface settings) in the node's network
# namespace and the pods'.
if ! touch /proc/sys/net/ipv4/ip_forward 2>/dev/null; then
  mount -o remount,bind,rw /proc/sys || log "cannot make /proc/sys writable"
fi

# Left over by a node that was killed rather than stopped (no process can be left in them).
remove_cgroups || log "stale cgroups under $CGROUP_ROOT still busy"
mkdir -p "$(dirname "$SOCK")" /run/containerd
rm -f "$SOCK"

containerd --config "$CONFIG" &
cpid=$!
trap shutdown_node TERM INT

deadline=$((SECONDS + 30))
until [ -S "$SOCK" ] && ctr_ --connect-timeout 2s version >/dev/null 2>&1; do
  if ! kill -0 "$cpid" 2>/dev/null; then log "containerd exited during start-up"; exit 1; fi
  if [ $SECONDS -ge $deadline ]; then log "containerd does not answer on $SOCK"; exit 1; fi
  sleep 0.2
done
log "containerd answers on $SOCK"

images=$(ctr_ -n "$NS" images ls -q 2>/dev/null)
import() {
  local tar=$1 base=$2 ref=$3
  if grep -qxF "$ref" <<<"$images"; then return 0; fi
  ctr_ -n "$NS" images import --base-name "$base" "$tar" >/dev/null || { log "importing $tar failed"; return 1; }
  log "imported $ref"
}
import "$IMAGES/pause.tar" registry.k8s.io/pause registry.k8s.io/pause:3.9 || exit 1
import "$IMAGES/busybox.tar" docker.io/library/busybox docker.io/library/busybox:1.36 || exit 1
touch /run/containerd/images-imported
log "ready"

# Wait for containerd. A trapped signal interrupts `wait`, and shutdown_node exits.
wait "$cpid"
rc=$?
log "containerd exited by itself (status $rc)"
exit "$rc"
