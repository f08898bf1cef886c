#!/usr/bin/env bash
# Stops the services started by deploy/up.sh (SIGTERM, each drains and exits). Unless
# --keep-pods is given, first removes the example manifest and waits for its pod to go.
set -euo pipefail
LOGS=/var/log/nodeagent
if [ "${1:-}" != "--keep-pods" ] && [ -f /etc/kubernetes/manifests/web.yaml ]; then
  rm -f /etc/kubernetes/manifests/web.yaml
  for _ in $(seq 1 60); do
    curl -sf --cacert /var/lib/kubelet/pki/kubelet.crt --cert /etc/nodeagent/pki/admin.crt \
      --key /etc/nodeagent/pki/admin.key https://127.0.0.1:10250/pods | grep -q '"items":\[\]' && break
    sleep 1
  done
fi
for f in "$LOGS"/*.pid; do
  [ -e "$f" ] || continue
  pid=$(cat "$f")
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  rm -f "$f"
done
echo "node agent stopped"
