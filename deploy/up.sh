#!/usr/bin/env bash
# Brings the node agent up in standalone mode on this machine: the real containerd (set up
# by deploy/runtime/setup.sh), the seven services in the background, and an example static
# pod (busybox httpd). Run as root on Debian 12. Stop with deploy/down.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

CONFIG_DIR=/etc/nodeagent
MANIFESTS=/etc/kubernetes/manifests
LOGS=/var/log/nodeagent
SOCKETS=/run/nodeagent
# shellcheck source=deploy/lib/bin-dir.sh
. deploy/lib/bin-dir.sh

bash deploy/runtime/setup.sh
echo "== building the node agent (release; the first build takes several minutes)"
cargo build --release -p nodeagent
# The seven services run from links to the one multi-call binary (they share its code).
BIN=target/release/services
mkdir -p "$BIN"
nodeagent_link_services "$BIN"
ln -sfn ../nodeagent "$BIN/nodeagent"
mkdir -p "$CONFIG_DIR" "$MANIFESTS" "$LOGS"
install -m 0644 deploy/config/kubelet-config.yaml "$CONFIG_DIR/kubelet-config.yaml"
install -m 0644 deploy/examples/web.yaml "$MANIFESTS/web.yaml"
bash deploy/lib/admin-pki.sh "$CONFIG_DIR/pki"

bash deploy/down.sh --keep-pods >/dev/null 2>&1 || true
for s in "${NODEAGENT_SERVICES[@]}"; do
  setsid nohup "$BIN/nodeagent-$s" --config "$CONFIG_DIR/kubelet-config.yaml" \
    --socket-dir "$SOCKETS" >>"$LOGS/$s.log" 2>&1 </dev/null &
  echo $! >"$LOGS/$s.pid"
done

echo "== waiting for the example pod"
node=$(hostname | tr '[:upper:]' '[:lower:]')
for _ in $(seq 1 60); do
  if curl -sf http://127.0.0.1:10255/pods | grep -q '"phase":"Running"'; then
    ip=$(curl -sf http://127.0.0.1:10255/pods | grep -o '"podIP":"[0-9.]*"' | head -1 | cut -d'"' -f4)
    cat <<MSG

The node agent is up; the example pod web-$node runs with IP $ip.
  pods (read-only API):  curl -s http://127.0.0.1:10255/pods
  health:                curl -s 'http://127.0.0.1:10248/healthz?verbose'
  the kubelet API (TLS): curl -s --cacert /var/lib/kubelet/pki/kubelet.crt \\
                           --cert $CONFIG_DIR/pki/admin.crt --key $CONFIG_DIR/pki/admin.key \\
                           https://127.0.0.1:10250/pods
  the pod's web page:    curl -s http://$ip:8080/
  service logs:          $LOGS/<service>.log
  container logs:        /var/log/pods/default_web-${node}_*/
  static pods:           drop manifests into $MANIFESTS
  stop:                  deploy/down.sh
MSG
    exit 0
  fi
  sleep 1
done
echo "the example pod did not reach Running within 60 s; see $LOGS/*.log" >&2
exit 1
