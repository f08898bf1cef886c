#!/usr/bin/env bash
# Stop the node agent's containerd instance started by deploy/runtime/setup.sh.
# Leaves docker and docker's containerd alone: the process is identified by the
# pid file setup.sh writes, checked against its command line (our config path),
# with a fallback scan of /proc for exactly that command line.
# Containers (their containerd-shim-runc-v2 processes) keep running, as with any
# containerd restart; setup.sh brings the daemon back and it re-attaches.
#
#   deploy/runtime/stop.sh [N]    N: a test runtime (setup.sh's NODEAGENT_TEST_RUNTIMES), 0
#                                 (the default) the main instance
set -euo pipefail

INSTANCE=${1:-0}
sfx=""
[ "$INSTANCE" = 0 ] || sfx="-test$INSTANCE"
CONFIG=/etc/nodeagent/containerd$sfx/config.toml
RUN_DIR=/run/nodeagent-containerd$sfx
SOCK="$RUN_DIR/containerd.sock"
PIDFILE="$RUN_DIR/containerd.pid"
STOP_TIMEOUT=${NODEAGENT_CONTAINERD_STOP_TIMEOUT:-20}

log() { printf '[stop] %s\n' "$*"; }
die() { printf '[stop] ERROR: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "must run as root"

is_ours() {
  local cmd
  cmd=$(tr '\0' ' ' 2>/dev/null <"/proc/$1/cmdline") || return 1
  case "$cmd" in *"containerd --config $CONFIG"*) return 0 ;; *) return 1 ;; esac
}

find_our_pid() {
  local p cmd d
  if [ -s "$PIDFILE" ]; then
    p=$(cat "$PIDFILE")
    if is_ours "$p"; then echo "$p"; return 0; fi
  fi
  for d in /proc/[0-9]*; do
    cmd=$(tr '\0' ' ' 2>/dev/null <"$d/cmdline") || continue
    case "$cmd" in
      containerd\ --config\ "$CONFIG"*|*/containerd\ --config\ "$CONFIG"*) echo "${d#/proc/}"; return 0 ;;
    esac
  done
  return 1
}

# Under systemd (deploy/install.sh --runtime), stop the unit: killing the daemon would only
# make systemd start it again.
UNIT=nodeagent-containerd.service
if [ "$INSTANCE" = 0 ] && [ -d /run/systemd/system ] && systemctl is-active --quiet "$UNIT" 2>/dev/null; then
  log "stopping $UNIT"
  systemctl stop "$UNIT"
  rm -f "$PIDFILE"
  log "stopped"
  exit 0
fi

if ! pid=$(find_our_pid); then
  log "nodeagent containerd is not running"
  rm -f "$PIDFILE" "$SOCK" "$SOCK.ttrpc" "$RUN_DIR/debug.sock"
  exit 0
fi

log "stopping nodeagent containerd (pid $pid)"
kill -TERM "$pid" 2>/dev/null || true
deadline=$((SECONDS + STOP_TIMEOUT))
while is_ours "$pid"; do
  if [ $SECONDS -ge $deadline ]; then
    log "still running after ${STOP_TIMEOUT}s, sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    sleep 0.5
    is_ours "$pid" && die "could not stop pid $pid"
    break
  fi
  sleep 0.2
done
rm -f "$PIDFILE" "$SOCK" "$SOCK.ttrpc" "$RUN_DIR/debug.sock"
log "stopped"
