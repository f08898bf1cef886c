#!/usr/bin/env bash
# The guest half of tests/cgroup2/run.sh: runs inside the qemu guest (started by the
# image's nodeagent-cgroup2.service once the share is mounted), never on the host.
# Checks that this really is a cgroup v2 host, prepares the runtime with
# deploy/runtime/setup.sh, runs the command from the run directory and leaves its exit
# code there. The boot script powers the guest off afterwards.
set -euo pipefail

arg() {
  local a
  for a in $(cat /proc/cmdline); do
    case "$a" in "$1="*) echo "${a#*=}" ;; esac
  done
}
REPO=$(arg nodeagent.share)
RUN_DIR=$(arg nodeagent.run)
[ -d "$RUN_DIR" ] || { echo "guest.sh: no run directory ($RUN_DIR)" >/dev/console; exit 1; }

# Everything below goes to the shared file the host streams; the console keeps only the
# boot messages.
exec >>"$RUN_DIR/output.log" 2>&1
# A failed preparation step must still reach the host as an exit code, not a timeout.
trap 'rc=$?; [ -s "$RUN_DIR/exit-code" ] || echo "$rc" >"$RUN_DIR/exit-code"' EXIT

log() { printf '[guest] %s\n' "$*"; }
fail() { printf '[guest] ERROR: %s\n' "$*"; exit 125; }

log "up $(cut -d' ' -f1 /proc/uptime)s after boot: $(uname -r), $(nproc) CPUs, $(awk '/MemTotal/ {print $2 " kB"}' /proc/meminfo)"

# ---------------------------------------------------------------- cgroup v2 only
fstype=$(stat -fc %T /sys/fs/cgroup)
[ "$fstype" = cgroup2fs ] || fail "/sys/fs/cgroup is $fstype, not cgroup2fs"
v1=$(awk '$3 == "cgroup"' /proc/mounts)
[ -z "$v1" ] || fail "a cgroup v1 hierarchy is mounted: $v1"
read -r -a controllers </sys/fs/cgroup/cgroup.controllers
for c in cpu memory pids io; do
  [[ " ${controllers[*]} " == *" $c "* ]] || fail "controller $c unavailable (cgroup.controllers: ${controllers[*]})"
done
# Informational only: which controllers systemd already delegates below the root is what
# the node agent meets on a real cgroup v2 host, so it is not adjusted here.
log "cgroup2fs; controllers: ${controllers[*]}; root subtree_control: $(cat /sys/fs/cgroup/cgroup.subtree_control)"

# ---------------------------------------------------------------- network
# qemu user-mode networking (fixed addresses); only apt in setup.sh would need it, should
# a package be missing from the image, and it gives the node a default route as a real
# node has.
ip link set lo up
nic=
for dev in /sys/class/net/*; do
  [ "${dev##*/}" = lo ] || { nic=${dev##*/}; break; }
done
if [ -n "$nic" ]; then
  ip link set "$nic" up
  ip addr add 10.0.2.15/24 dev "$nic" 2>/dev/null || true
  ip route add default via 10.0.2.2 2>/dev/null || true
fi

# ---------------------------------------------------------------- vsock loopback
# The guest's own kernel (Debian's 6.1) has vsock's loopback transport (CID 1) as a module,
# which the hosts' kernels lack: suite.sh runs the vsock tests here, real round trips over
# it. The kernel would load it on the first bind; loaded here so that its absence is said.
modprobe vsock_loopback 2>/dev/null || log "no vsock_loopback module in $(uname -r)"

# ---------------------------------------------------------------- runtime
cd "$REPO"
# shellcheck source=/dev/null
source "$RUN_DIR/command" # sets cmd, run_setup, the cwd and the forwarded environment
: "${run_setup:?}" "${cmd:?}"
if [ "$run_setup" = true ]; then
  t0=$(date +%s)
  # The image tars the host built (tests/cgroup2/suite.sh puts them in the share): setup.sh
  # imports them instead of building them again under emulation.
  if [ -s "$REPO/target/cgroup2/images/pause.tar" ] && [ -s "$REPO/target/cgroup2/images/busybox.tar" ]; then
    mkdir -p /var/lib/nodeagent-containerd/image-build
    cp "$REPO/target/cgroup2/images/"*.tar /var/lib/nodeagent-containerd/image-build/
  fi
  (cd "$REPO" && bash deploy/runtime/setup.sh) || fail "deploy/runtime/setup.sh failed"
  log "setup.sh took $(($(date +%s) - t0))s"
fi

# ---------------------------------------------------------------- the command
log "running: ${cmd[*]} (in $PWD)"
t0=$(date +%s)
rc=0
"${cmd[@]}" </dev/null || rc=$?
log "exit code $rc after $(($(date +%s) - t0))s"
echo "$rc" >"$RUN_DIR/exit-code"
