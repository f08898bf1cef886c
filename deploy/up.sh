#!/usr/bin/env bash
# Brings the node agent up in standalone mode on this machine: the real containerd (set up
# by deploy/runtime/setup.sh), the seven services in the background, and an example static
# pod (busybox httpd). Run as root on Debian 12. Stop with deploy/down.sh.
#
# --cluster: a one-node cluster instead. The test API server (nodeagent-test-apiserver,
# from tests/: in memory, plain HTTP on 127.0.0.1:${NODEAGENT_API_PORT:-8080}, no
# authentication, a scheduler and the node lifecycle controller) runs beside the node,
# and the services that talk to an API server get --kubeconfig for it; kubectl drives the
# node (the line to use is printed at the end).
set -euo pipefail
cd "$(dirname "$0")/.."

cluster=false
case "${1:-}" in
  --cluster) cluster=true ;;
  "") ;;
  *) echo "usage: deploy/up.sh [--cluster]" >&2; exit 2 ;;
esac
API_PORT=${NODEAGENT_API_PORT:-8080}

CONFIG_DIR=/etc/nodeagent
MANIFESTS=/etc/kubernetes/manifests
LOGS=/var/log/nodeagent
SOCKETS=/run/nodeagent
# shellcheck source=deploy/lib/bin-dir.sh
. deploy/lib/bin-dir.sh

bash deploy/runtime/setup.sh
echo "== building the node agent (release; the first build takes several minutes)"
cargo build --release -p nodeagent
if $cluster; then
  echo "== building the test API server (release)"
  cargo build --release -p nodeagent-tests --bin nodeagent-test-apiserver
fi
# Where cargo put it (target/, or CARGO_TARGET_DIR's). The seven services run from links
# to the one multi-call binary (they share its code).
TARGET=$(nodeagent_target_dir)
BIN=$TARGET/release/services
mkdir -p "$BIN"
nodeagent_link_services "$BIN"
ln -sfn ../nodeagent "$BIN/nodeagent"
mkdir -p "$CONFIG_DIR" "$MANIFESTS"
# The services' logs name pods, secrets' paths and tokens' audiences: root's alone.
install -d -m 0700 "$LOGS"
chmod 0700 "$LOGS"
install -m 0644 deploy/config/kubelet-config.yaml "$CONFIG_DIR/kubelet-config.yaml"
install -m 0644 deploy/examples/web.yaml "$MANIFESTS/web.yaml"
bash deploy/lib/admin-pki.sh "$CONFIG_DIR/pki"

bash deploy/down.sh --keep-pods >/dev/null 2>&1 || true
node=$(hostname | tr '[:upper:]' '[:lower:]')
# What the services create (their logs here, anything a umask decides) is root's alone, as
# the systemd units' UMask=0077 makes it.
umask 077

# The services that talk to an API server (as compose/cluster/run.sh gives them).
api_clients=" config-source volume pod-sync node-status http-server "
cluster_args=()
if $cluster; then
  cdir=$CONFIG_DIR/cluster
  install -d -m 0700 "$cdir"
  if ss -Hltn "sport = :$API_PORT" | grep -q .; then
    echo "port $API_PORT is taken: set NODEAGENT_API_PORT" >&2; exit 1
  fi
  # Its kubelet client certificate and CA are made in $cdir/pki on first start; it dials
  # this node's kubelet API on loopback.
  setsid nohup "$TARGET/release/nodeagent-test-apiserver" --port "$API_PORT" \
    --kubelet-client-pki "$cdir/pki" --kubelet-host "$node=127.0.0.1" \
    >>"$LOGS/apiserver.log" 2>&1 </dev/null &
  echo $! >"$LOGS/apiserver.pid"
  for _ in $(seq 1 100); do
    [ -s "$cdir/pki/ca.crt" ] && curl -sf -o /dev/null "http://127.0.0.1:$API_PORT/version" && break
    sleep 0.1
  done
  curl -sf -o /dev/null "http://127.0.0.1:$API_PORT/version" || { echo "the test API server did not start; see $LOGS/apiserver.log" >&2; exit 1; }
  # The kubelet API accepts both the admin certificate and the API server's.
  cat "$CONFIG_DIR/pki/ca.crt" "$cdir/pki/ca.crt" >"$cdir/client-ca.crt"
  cat >"$cdir/kubeconfig" <<KUBECONFIG
apiVersion: v1
kind: Config
clusters:
- {name: local, cluster: {server: "http://127.0.0.1:$API_PORT"}}
users:
- {name: node, user: {}}
contexts:
- {name: local, context: {cluster: local, user: node}}
current-context: local
KUBECONFIG
  cluster_args=(--kubeconfig "$cdir/kubeconfig" --client-ca-file "$cdir/client-ca.crt")
fi
for s in "${NODEAGENT_SERVICES[@]}"; do
  extra=()
  case "$api_clients" in *" $s "*) extra=("${cluster_args[@]}") ;; esac
  setsid nohup "$BIN/nodeagent-$s" --config "$CONFIG_DIR/kubelet-config.yaml" \
    --socket-dir "$SOCKETS" "${extra[@]}" >>"$LOGS/$s.log" 2>&1 </dev/null &
  echo $! >"$LOGS/$s.pid"
done

echo "== waiting for the example pod"
# The kubelet API with the admin certificate (the read-only port is off, as upstream).
pods() {
  curl -sf --cacert /var/lib/kubelet/pki/kubelet.crt --cert "$CONFIG_DIR/pki/admin.crt" \
    --key "$CONFIG_DIR/pki/admin.key" https://127.0.0.1:10250/pods
}
for _ in $(seq 1 60); do
  if pods | grep -q '"phase":"Running"'; then
    ip=$(pods | grep -o '"podIP":"[0-9.]*"' | head -1 | cut -d'"' -f4)
    cat <<MSG

The node agent is up; the example pod web-$node runs with IP $ip.
  pods (kubelet API):    curl -s --cacert /var/lib/kubelet/pki/kubelet.crt \\
                           --cert $CONFIG_DIR/pki/admin.crt --key $CONFIG_DIR/pki/admin.key \\
                           https://127.0.0.1:10250/pods
  health:                curl -s 'http://127.0.0.1:10248/healthz?verbose'
  the pod's web page:    curl -s http://$ip:8080/
  service logs:          $LOGS/<service>.log
  container logs:        /var/log/pods/default_web-${node}_*/
  static pods:           drop manifests into $MANIFESTS
  stop:                  deploy/down.sh
MSG
    if $cluster; then
      for _ in $(seq 1 60); do
        kubectl --server "http://127.0.0.1:$API_PORT" get node "$node" >/dev/null 2>&1 && break
        sleep 1
      done
      cat <<MSG
  the cluster:           kubectl --server http://127.0.0.1:$API_PORT get nodes,pods
                         (pods without spec.nodeName are scheduled here:
                         kubectl apply -f pod.yaml)
  API server log:        $LOGS/apiserver.log (its objects live in memory only)
MSG
    fi
    exit 0
  fi
  sleep 1
done
echo "the example pod did not reach Running within 60 s; see $LOGS/*.log" >&2
exit 1
