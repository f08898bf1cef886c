#!/bin/sh
# Entry point of the node services that talk to an API server (config-source, pod-sync,
# volume, node-status, http-server) in compose/docker-compose.yml: runs `"$@"` standalone, or, once
# the `cluster` profile's test API server answers at $API_SERVER, with
#   --kubeconfig      compose/cluster/kubeconfig (http://apiserver:8080)
#   --client-ca-file  the CA of the API server's kubelet client certificate (written by
#                     the API server into the shared $PKI_DIR), so it may use port 10250
#   --authorization-mode AlwaysAllow
# A compose profile cannot change other services' flags, and the API server may come up
# after this service: so a standalone service is restarted (SIGTERM, as docker would) into
# cluster mode when the API server appears. Once in cluster mode it stays there: an API
# server outage is the node's business (it keeps its pods and catches up).
set -u
API_SERVER=${NODEAGENT_COMPOSE_API_SERVER:-http://apiserver:8080}
PKI_DIR=/run/nodeagent-compose/cluster
KUBECONFIG_FILE=/etc/nodeagent/cluster/kubeconfig

api_server_up() {
  [ -s "$PKI_DIR/ca.crt" ] && curl -sf -m 2 -o /dev/null "$API_SERVER/version"
}

child=
stop() {
  [ -n "$child" ] && kill -TERM "$child" 2>/dev/null && wait "$child"
  exit $?
}
trap stop TERM INT

if api_server_up; then
  echo "cluster mode: $API_SERVER" >&2
  "$@" --kubeconfig "$KUBECONFIG_FILE" --client-ca-file "$PKI_DIR/ca.crt" \
    --authorization-mode AlwaysAllow &
  child=$!
  wait "$child"
  exit $?
fi

echo "standalone until an API server answers at $API_SERVER" >&2
"$@" &
child=$!
while kill -0 "$child" 2>/dev/null; do
  if api_server_up; then
    echo "API server up: restarting in cluster mode" >&2
    kill -TERM "$child" && wait "$child"
    exec /bin/sh "$0" "$@"
  fi
  sleep 2
done
wait "$child"
