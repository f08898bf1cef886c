#!/usr/bin/env bash
# Undoes deploy/install.sh: stops and disables kubelet.target (which stops all seven
# services), removes the units, the binary and its links. Keeps /etc/nodeagent/kubelet-config.yaml,
# /etc/nodeagent/nodeagent.env and /etc/kubernetes/manifests unless --purge is given.
# The pods' containers are not touched (as when upstream's kubelet stops).
#
# Usage: deploy/uninstall.sh [--runtime] [--purge]
#   --runtime  also stop, disable and remove nodeagent-containerd.service (its containers
#              keep running until the machine stops; deploy/runtime/setup.sh can start
#              containerd again without systemd)
#   --purge    also remove the configuration and the static pod directory
set -euo pipefail

BIN=/usr/local/bin
UNITS=/etc/systemd/system
SERVICES=(config-source pleg volume pod-sync probe node-status http-server)
RUNTIME_UNIT=nodeagent-containerd.service

log() { printf '[uninstall] %s\n' "$*"; }
[ "$(id -u)" -eq 0 ] || { echo "must run as root" >&2; exit 1; }

runtime=false purge=false
for a in "$@"; do
  case "$a" in
    --runtime) runtime=true ;;
    --purge) purge=true ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "unknown argument $a" >&2; exit 2 ;;
  esac
done

systemd=false
[ -d /run/systemd/system ] && systemd=true
if $systemd; then
  systemctl disable --now kubelet.service 2>/dev/null || true
  systemctl reset-failed kubelet.service 2>/dev/null || true
  systemctl disable --now kubelet.target 2>/dev/null || true
  for s in "${SERVICES[@]}"; do
    systemctl stop "nodeagent-$s.service" 2>/dev/null || true
    systemctl reset-failed "nodeagent-$s.service" 2>/dev/null || true
  done
  if $runtime; then systemctl disable --now "$RUNTIME_UNIT" 2>/dev/null || true; fi
fi

for s in "${SERVICES[@]}"; do
  rm -f "$UNITS/nodeagent-$s.service" "$BIN/nodeagent-$s"
  rm -rf "$UNITS/nodeagent-$s.service.d"
done
rm -f "$UNITS/kubelet.target" "$UNITS/kubelet.service" "$BIN/kubelet" "$BIN/nodeagent"
# The link install.sh --kubeadm made (kubeadm's own drop-in, kubelet.service.d, is the
# kubeadm package's and stays).
if [ "$(readlink /usr/bin/kubelet 2>/dev/null)" = "$BIN/nodeagent" ]; then rm -f /usr/bin/kubelet; fi
# The running value of net.ipv4.tcp_migrate_req stays until the next boot.
rm -f /etc/sysctl.d/60-nodeagent.conf
rm -rf "$UNITS/kubelet.target.d" /usr/local/share/doc/nodeagent
if $runtime; then rm -f "$UNITS/$RUNTIME_UNIT"; rm -rf "$UNITS/$RUNTIME_UNIT.d"; fi
# The services' shared socket directory (RuntimeDirectoryPreserve=yes keeps it otherwise).
rm -rf /run/nodeagent
if $purge; then
  rm -f /etc/nodeagent/kubelet-config.yaml /etc/nodeagent/nodeagent.env
  rm -rf /etc/kubernetes/manifests
  rmdir /etc/nodeagent /etc/kubernetes 2>/dev/null || true
  log "removed the configuration and the static pod directory"
fi
if $systemd; then systemctl daemon-reload; fi
log "done"
