#!/usr/bin/env bash
# Installs the node agent as systemd services and starts it:
#   - the multi-call binary `nodeagent` to /usr/local/bin (atomically: a running binary is
#     replaced by rename) and the seven `nodeagent-<service>` links to it
#   - the units (deploy/systemd/nodeagent-*.service, kubelet.target) to /etc/systemd/system
#   - the default configuration to /etc/nodeagent/kubelet-config.yaml, only if absent
#   - /etc/kubernetes/manifests (the static pod directory)
# then `systemctl daemon-reload`, enables kubelet.target and starts it. Run again to upgrade:
# units whose binary or unit file changed are restarted one by one (pods keep running).
#
# Usage: deploy/install.sh [--runtime] [--no-start] [BIN_DIR]
#   BIN_DIR     where `nodeagent` is (default: target/release or target/debug, whichever
#               holds it; the newer build if both do)
#   --runtime   also install and enable nodeagent-containerd.service (the containerd that
#               deploy/runtime/setup.sh configures) and hand a containerd that setup.sh
#               started by itself over to systemd (its containers keep running)
#   --no-start  install the files only (for an image, or where systemd is not running)
#   --kubeadm   the layout of a kubeadm node instead: kubelet.service (which starts the
#               seven with the flags kubeadm's drop-in 10-kubeadm.conf gives /usr/bin/kubelet,
#               a link to nodeagent here) is enabled and started; it restarts until kubeadm
#               has written /var/lib/kubelet/config.yaml (see deploy/systemd/kubelet.service)
# Run as root. Undo with deploy/uninstall.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=/usr/local/bin
UNITS=/etc/systemd/system
CONFIG=/etc/nodeagent/kubelet-config.yaml
ENVFILE=/etc/nodeagent/nodeagent.env
MANIFESTS=/etc/kubernetes/manifests
DOC=/usr/local/share/doc/nodeagent
RUNTIME_UNIT=nodeagent-containerd.service
CONTAINERD_SOCK=/run/nodeagent-containerd/containerd.sock

log() { printf '[install] %s\n' "$*"; }
die() { printf '[install] ERROR: %s\n' "$*" >&2; exit 1; }

runtime=false start=true kubeadm=false bin_arg=
while [ $# -gt 0 ]; do
  case "$1" in
    --runtime) runtime=true ;;
    --no-start) start=false ;;
    --kubeadm) kubeadm=true ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    -*) die "unknown option $1" ;;
    *) bin_arg=$1 ;;
  esac
  shift
done

[ "$(id -u)" -eq 0 ] || die "must run as root"
# shellcheck source=deploy/lib/bin-dir.sh
. deploy/lib/bin-dir.sh
bin_dir=$(nodeagent_bin_dir "$bin_arg") || die "no binaries to install"
if $start && [ ! -d /run/systemd/system ]; then
  die "systemd is not running here (PID 1 is $(tr '\0' ' ' </proc/1/cmdline | cut -c1-40)); use --no-start to install the files only"
fi

changed=()  # units to restart if they are running
# install_file SRC DEST MODE: atomic replace; prints "changed" if DEST differs or is new.
install_file() {
  local src=$1 dest=$2 mode=$3
  if [ -f "$dest" ] && cmp -s "$src" "$dest"; then return 0; fi
  install -m "$mode" "$src" "$dest.nodeagent-new"
  mv -f "$dest.nodeagent-new" "$dest"
  echo changed
}

log "nodeagent from $bin_dir to $BIN"
mkdir -p "$BIN" "$UNITS"
# One binary serves the seven: when it changed, each service restarts (one by one, below).
binary_changed=$(install_file "$bin_dir/nodeagent" "$BIN/nodeagent" 0755)
for s in "${NODEAGENT_SERVICES[@]}"; do
  [ "$(readlink "$BIN/nodeagent-$s" 2>/dev/null)" = nodeagent ] || binary_changed=changed
done
nodeagent_link_services "$BIN"
for s in "${NODEAGENT_SERVICES[@]}"; do
  c2=$(install_file "deploy/systemd/nodeagent-$s.service" "$UNITS/nodeagent-$s.service" 0644)
  if [ -n "$binary_changed$c2" ]; then changed+=("nodeagent-$s.service"); fi
done
install_file deploy/systemd/kubelet.target "$UNITS/kubelet.target" 0644 >/dev/null
if $kubeadm; then
  # /usr/bin/kubelet is what kubeadm's drop-in runs: ours, unless a real kubelet is there.
  if [ -e /usr/bin/kubelet ] && [ "$(readlink /usr/bin/kubelet)" != "$BIN/nodeagent" ]; then
    die "/usr/bin/kubelet exists and is not nodeagent's: remove the kubelet package first"
  fi
  install_file deploy/systemd/kubelet.service "$UNITS/kubelet.service" 0644 >/dev/null
  ln -sfn nodeagent "$BIN/kubelet"
  ln -sfn "$BIN/nodeagent" /usr/bin/kubelet
fi
if $runtime; then
  install_file "deploy/systemd/$RUNTIME_UNIT" "$UNITS/$RUNTIME_UNIT" 0644 >/dev/null
fi

# pod-sync may write logind's InhibitDelayMaxSec drop-in here (graceful node shutdown);
# its unit can only write into a directory that exists.
mkdir -p "$(dirname "$CONFIG")" "$MANIFESTS" /etc/systemd/logind.conf.d
if [ -e "$CONFIG" ]; then
  log "keeping the existing $CONFIG"
else
  install -m 0644 deploy/config/kubelet-config.yaml "$CONFIG"
  log "wrote the default $CONFIG"
fi
if grep -q '^    clientCAFile: /etc/nodeagent/pki/ca.crt' "$CONFIG"; then
  # The default configuration's client CA, and an admin certificate for the kubelet API.
  bash deploy/lib/admin-pki.sh /etc/nodeagent/pki
fi
if [ ! -e "$ENVFILE" ]; then install -m 0644 deploy/config/nodeagent.env "$ENVFILE"; fi
# Several http-server instances share port 10250 (SO_REUSEPORT): with tcp_migrate_req=1 a
# stopping instance's queued connections move to another instance instead of being reset.
# The units run with ProtectKernelTunables=yes, so the setting is made here.
SYSCTL=/etc/sysctl.d/60-nodeagent.conf
if [ -e /proc/sys/net/ipv4/tcp_migrate_req ]; then
  install -m 0644 deploy/config/60-nodeagent.conf "$SYSCTL"
  sysctl -q -w net.ipv4.tcp_migrate_req=1 || log "could not set net.ipv4.tcp_migrate_req now; $SYSCTL sets it at boot"
fi
if [ -f README.md ]; then mkdir -p "$DOC" && install -m 0644 README.md "$DOC/README.md"; fi

if ! $start; then
  log "files installed (--no-start: not enabling or starting anything)"
  exit 0
fi

systemctl daemon-reload

if $runtime; then
  if ! systemctl is-active --quiet "$RUNTIME_UNIT"; then
    # A containerd that setup.sh started by itself holds the socket and the state: stop it
    # (its shims and containers keep running) and let systemd start it again.
    bash deploy/runtime/stop.sh
  fi
  [ -f /etc/nodeagent/containerd/config.toml ] \
    || die "/etc/nodeagent/containerd/config.toml is missing: run deploy/runtime/setup.sh first"
  systemctl enable --now "$RUNTIME_UNIT"
  deadline=$((SECONDS + 30))
  until [ -S "$CONTAINERD_SOCK" ] && ctr --connect-timeout 2s --address "$CONTAINERD_SOCK" version >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || die "$RUNTIME_UNIT does not answer on $CONTAINERD_SOCK"
    sleep 0.3
  done
  log "$RUNTIME_UNIT is active"
fi

# The units whose binary or file changed, restarted one by one (the pods keep running).
restart_changed() {
  local u
  for u in "${changed[@]}"; do
    log "restarting $u (changed)"
    systemctl try-restart "$u"
  done
}
if $kubeadm; then
  # kubelet.service starts kubelet.target itself once its configuration is there.
  systemctl disable kubelet.target >/dev/null 2>&1 || true
  systemctl enable kubelet.service
  if systemctl is-active --quiet kubelet.service; then
    restart_changed
  else
    systemctl start --no-block kubelet.service
  fi
  log "done: kubelet.service is enabled; it starts the seven once /var/lib/kubelet/config.yaml exists (systemctl status kubelet; journalctl -u kubelet -u 'nodeagent-*')"
  exit 0
fi
systemctl enable kubelet.target
if systemctl is-active --quiet kubelet.target; then
  restart_changed
  systemctl start kubelet.target  # anything that was stopped
else
  log "starting kubelet.target"
  systemctl start kubelet.target
fi

failed=0
for s in "${NODEAGENT_SERVICES[@]}"; do
  state=$(systemctl is-active "nodeagent-$s.service" || true)
  printf '[install]   nodeagent-%-13s %s\n' "$s" "$state"
  [ "$state" = active ] || failed=1
done
[ "$failed" -eq 0 ] || die "not every service is active: see journalctl -u 'nodeagent-*'"
log "done: the node agent runs (systemctl status kubelet.target; journalctl -u 'nodeagent-*')"
