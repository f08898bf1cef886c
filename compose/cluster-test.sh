#!/usr/bin/env bash
# The README's one-node cluster as a new user tries it (issue 27): the compose `cluster`
# profile (project nodeagent-cluster-test), then kubectl only, as a user types it:
#   - the node registers and is Ready
#   - `kubectl create configmap` and `kubectl create secret generic` (kubectl sends these
#     as protobuf)
#   - a pod without spec.nodeName (the test API server's scheduler binds it) that mounts
#     both plus its service account token and has an HTTP readiness probe: Ready
#   - `kubectl logs`, `kubectl exec` (the files of all three volumes), `kubectl
#     port-forward` (its web page from the host)
#   - `kubectl describe pod` lists its own events only (Scheduled, Pulled, Created,
#     Started), none of the static pod's
#   - `kubectl patch` of the configMap: the file in the running container changes
#   - `kubectl delete pod`: gone from the API and from the node's containerd
#   - with NODES=3 (the README's three-node cluster): three nodes Ready, a pod pinned to
#     each runs in that node's containerd, and one node's services stopped leave the others
#     and their pods untouched while its Ready goes Unknown
# Every kubectl command and its output go to the transcript, printed at the end (and kept
# in $TRANSCRIPT). Prints PASS/FAIL per check, exits non-zero on any failure, always runs
# `down` and removes the shared directories.
#
# Usage: compose/cluster-test.sh [BIN_DIR]   (root; docker, docker-compose 1.29+, kubectl)
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=deploy/lib/bin-dir.sh
. deploy/lib/bin-dir.sh
# shellcheck source=deploy/lib/checks.sh
. deploy/lib/checks.sh

PROJECT=nodeagent-cluster-test
# shellcheck source=compose/lib.sh
. compose/lib.sh
COMPOSE_ARGS=(--profile cluster)
command -v kubectl >/dev/null || { echo "kubectl is required (Debian: kubernetes-client)" >&2; exit 1; }
# The API server's --node-monitor-grace-period: short, so that a silent node goes Unknown
# within the test (upstream's default, 50 s, otherwise).
export NODEAGENT_COMPOSE_NODE_MONITOR_GRACE=${NODEAGENT_COMPOSE_NODE_MONITOR_GRACE:-15s}
compose_prepare "${1:-}"
API=http://127.0.0.1:$NODEAGENT_COMPOSE_APISERVER_PORT
NODE=nodeagent-compose
TRANSCRIPT=${TRANSCRIPT:-/var/tmp/nodeagent-cluster-session.txt}
: >"$TRANSCRIPT"
KHOME=$(mktemp -d /var/tmp/nodeagent-cluster-kubectl.XXXXXX)
PF_PID=
rc_is() { return "$1"; }
on_exit() {
  local rc=$?
  [ -z "$PF_PID" ] || kill "$PF_PID" 2>/dev/null || true
  rm -rf "$KHOME"
  echo
  echo "== the user session (kubectl only), $TRANSCRIPT:"
  sed 's/^/  | /' "$TRANSCRIPT"
  rc_is "$rc"
  compose_cleanup
}
trap on_exit EXIT

# kubectl as a user runs it: its own home (no cached discovery from another server).
k() { HOME=$KHOME KUBECONFIG=/dev/null kubectl --server "$API" "$@"; }
# kt ARGS...: kubectl, with the command and its output in the transcript.
kt() {
  local out rc=0
  out=$(k "$@" 2>&1) || rc=$?
  { printf '$ kubectl %s\n' "$*"; [ -z "$out" ] || printf '%s\n' "$out"; [ $rc -eq 0 ] || printf '(exit %d)\n' "$rc"; } >>"$TRANSCRIPT"
  printf '%s\n' "$out"
  return $rc
}

echo "== binaries: $bin_dir; API server $API"
compose_build_and_up

node_ready() { k get node "$NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' | grep -qx True; }
if wait_until 180 node_ready; then
  pass "the node registers and is Ready ($((SECONDS - UP_STARTED)) s after up)"
  kt get nodes -o wide >/dev/null || true
else
  fail "the node registers and is Ready"
  dc logs --tail=30 node-status apiserver
  exit 1
fi

# ------------------------------------------------------------------ configMap and secret
check "kubectl create configmap (protobuf body)" kt create configmap cfg --from-literal=greeting=hello
check "kubectl create secret generic (protobuf body)" kt create secret generic sec --from-literal=password=s3cret

# ------------------------------------------------------------------ the user's pod
cat >"$KHOME/user1.yaml" <<'EOF'
apiVersion: v1
kind: Pod
metadata:
  name: user1
  labels: {app: user1}
spec:
  terminationGracePeriodSeconds: 5
  containers:
  - name: c
    image: busybox:1.36
    command: ["sh", "-c", "mkdir -p /www && echo hello from user1 > /www/index.html && echo serving on 8080 && exec httpd -f -p 8080 -h /www"]
    ports: [{containerPort: 8080}]
    readinessProbe:
      httpGet: {path: /, port: 8080}
      periodSeconds: 2
    volumeMounts:
    - {name: cfg, mountPath: /etc/cfg}
    - {name: sec, mountPath: /etc/sec}
  volumes:
  - name: cfg
    configMap: {name: cfg}
  - name: sec
    secret: {secretName: sec}
EOF
printf '$ cat user1.yaml\n' >>"$TRANSCRIPT"; cat "$KHOME/user1.yaml" >>"$TRANSCRIPT"
# A typo first, as users make them: kubectl's default validation is the server's
# (fieldValidation=Strict, learnt from /openapi/v3), refused in kube-apiserver's words.
# A kubectl older than 1.27 validates against /openapi/v2 itself (not served): it is told
# --validate=false and the typo is not tried.
minor=$(k version --client -o json 2>/dev/null | sed -n 's/.*"minor": *"\([0-9]*\).*/\1/p')
validate=()
if [ "${minor:-0}" -lt 27 ]; then
  validate=(--validate=false)
  printf 'kubectl 1.%s validates on the client: the typo check is left out\n' "${minor:-?}" | tee -a "$TRANSCRIPT"
else
  sed 's/^  containers:/  containerz:/' "$KHOME/user1.yaml" >"$KHOME/typo.yaml"
  if out=$(kt apply -f "$KHOME/typo.yaml"); then
    fail "kubectl apply -f typo.yaml is refused"
  elif grep -q 'Pod in version "v1" cannot be handled as a Pod: strict decoding error: unknown field "spec.containerz"' <<<"$out"; then
    pass "kubectl apply -f typo.yaml is refused: unknown field \"spec.containerz\""
  else
    fail "kubectl apply -f typo.yaml is refused with upstream's strict decoding error: $out"
  fi
fi
check "kubectl apply -f user1.yaml (no nodeName: the scheduler binds it)" kt apply "${validate[@]}" -f "$KHOME/user1.yaml"
t=$SECONDS
if kt wait --for=condition=Ready pod/user1 --timeout=180s >/dev/null; then
  pass "the pod is Ready ($((SECONDS - t)) s after create)"
else
  fail "the pod is Ready"
  kt describe pod user1 | tail -n 30
  dc logs --tail=30 pod-sync volume
fi
kt get pods -o wide >/dev/null || true
bound_here() { [ "$(k get pod user1 -o jsonpath='{.spec.nodeName}')" = "$NODE" ]; }
check "the scheduler bound it to $NODE" bound_here

logs_ok() { kt logs user1 | grep -qx 'serving on 8080'; }
check "kubectl logs user1" logs_ok
exec_file() {  # exec_file PATH EXPECTED
  local got
  got=$(kt exec user1 -- cat "$1") || return 1
  [ "$got" = "$2" ] || { echo "$1: '$got', want '$2'"; return 1; }
}
check "kubectl exec: the configMap's file" exec_file /etc/cfg/greeting hello
check "kubectl exec: the secret's file" exec_file /etc/sec/password s3cret
token_ok() {
  kt exec user1 -- sh -c 'ls /var/run/secrets/kubernetes.io/serviceaccount && test -s /var/run/secrets/kubernetes.io/serviceaccount/token' >/dev/null
}
check "kubectl exec: the service account token (kube-api-access-* projected volume)" token_ok

PF=$(free_port 18080)
HOME=$KHOME KUBECONFIG=/dev/null kubectl --server "$API" port-forward pod/user1 "$PF:8080" >"$KHOME/pf.log" 2>&1 &
PF_PID=$!
page() { curl -sf -m 3 "http://127.0.0.1:$PF/" | grep -qx 'hello from user1'; }
if wait_until 30 page; then
  pass "kubectl port-forward pod/user1 $PF:8080: the page from the host"
  { printf '$ kubectl port-forward pod/user1 %s:8080 &\n' "$PF"; cat "$KHOME/pf.log"
    printf '$ curl http://127.0.0.1:%s/\n' "$PF"; curl -s -m 3 "http://127.0.0.1:$PF/"; } >>"$TRANSCRIPT"
else
  fail "kubectl port-forward pod/user1 $PF:8080"; cat "$KHOME/pf.log"
fi
kill "$PF_PID" 2>/dev/null || true; wait "$PF_PID" 2>/dev/null || true; PF_PID=

own_events() {
  local d ev
  d=$(kt describe pod user1) || return 1
  ev=$(printf '%s\n' "$d" | sed -n '/^Events:/,$p')
  printf '%s\n' "$ev" | grep -q "Successfully assigned default/user1 to $NODE" || { echo "no Scheduled event:"; echo "$ev"; return 1; }
  printf '%s\n' "$ev" | grep -q 'Started' || { echo "no Started event:"; echo "$ev"; return 1; }
  # The static pod's containers are httpd and writer; no event of theirs belongs here.
  if printf '%s\n' "$ev" | grep -Eq 'container (httpd|writer)|web-'; then echo "another pod's events:"; echo "$ev"; return 1; fi
}
check "kubectl describe pod user1: its own events only" own_events

# ------------------------------------------------------------------ configMap update
check "kubectl patch the configMap (greeting=changed)" kt patch configmap cfg -p '{"data":{"greeting":"changed"}}'
t=$SECONDS
quiet_exec_file() {  # as exec_file, out of the transcript (a wait polls it)
  [ "$(k exec user1 -- cat "$1")" = "$2" ]
}
# The volume is refreshed at the pod's periodic sync (syncFrequency, 1m), as upstream's.
if wait_until 150 quiet_exec_file /etc/cfg/greeting changed; then
  pass "the configMap's file in the running pod changes ($((SECONDS - t)) s)"
  kt exec user1 -- cat /etc/cfg/greeting >/dev/null || true
else
  fail "the configMap's file in the running pod changes"
fi

# ------------------------------------------------------------------ delete
t=$SECONDS
check "kubectl delete pod user1 (waits for the kubelet's confirmation)" kt delete pod user1 --timeout=120s
gone() { ! k get pod user1 >/dev/null 2>&1; }
check "the pod is gone from the API ($((SECONDS - t)) s)" gone
kt get pod user1 >/dev/null 2>&1 || true
no_containers() {
  local left
  left=$(docker exec "$(dc ps -q containerd)" sh -c "$CTR containers ls -q 'labels.\"io.kubernetes.pod.name\"==user1'")
  [ -z "$left" ] || { echo "left in containerd: $left"; return 1; }
}
check "no container of the pod left in the node's containerd" wait_until 60 no_containers

# ------------------------------------------------------------------ more nodes (NODES=3)
# Nodes 2..N join the API server of node 1's project (each its own containerd, services,
# cgroup root and host paths): all Ready, a pod pinned to each runs there; then node N's
# services stop, and while the API server's node lifecycle takes its Ready to Unknown
# (NODEAGENT_COMPOSE_NODE_MONITOR_GRACE) the other nodes and their pods stay untouched.
if [ "$NODES" -gt 1 ]; then
  for i in $(seq 2 "$NODES"); do compose_up_node "$i"; done
  all_ready() {
    local i
    for i in $(seq 1 "$NODES"); do
      [ "$(k get node "$(node_name "$i")" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ] || return 1
    done
  }
  t=$SECONDS
  if wait_until 240 all_ready; then
    pass "kubectl get nodes: $NODES nodes Ready ($((SECONDS - t)) s)"
    kt get nodes >/dev/null || true
  else
    fail "kubectl get nodes: $NODES nodes Ready"; kt get nodes || true
  fi
  for i in $(seq 1 "$NODES"); do
    cat >"$KHOME/pinned$i.yaml" <<EOF2
apiVersion: v1
kind: Pod
metadata: {name: pinned$i}
spec:
  nodeName: $(node_name "$i")
  terminationGracePeriodSeconds: 1
  containers:
  - {name: c, image: busybox:1.36, command: [sh, -c, "trap 'exit 0' TERM; while true; do sleep 1; done"]}
EOF2
    check "kubectl apply -f pinned$i.yaml (nodeName $(node_name "$i"))" kt apply "${validate[@]}" -f "$KHOME/pinned$i.yaml"
  done
  all_running() {
    local i
    for i in $(seq 1 "$NODES"); do
      [ "$(k get pod "pinned$i" -o jsonpath='{.status.phase}')" = Running ] || return 1
    done
  }
  check "a pod pinned to each node runs" wait_until 180 all_running
  kt get pods -o wide >/dev/null || true
  # Each runs in its own node's containerd.
  in_own_runtime() {
    local i ids
    for i in $(seq 1 "$NODES"); do
      ids=$(docker exec "$(dcn "$i" ps -q containerd)" sh -c "$CTR containers ls -q 'labels.\"io.kubernetes.pod.name\"==pinned$i'")
      [ -n "$ids" ] || { echo "pinned$i is not in node $i's containerd"; return 1; }
    done
  }
  check "each pinned pod runs in its own node's containerd" in_own_runtime
  # The last node's services stop (its containerd and pods stay, as when a kubelet dies).
  uid_of() { k get pod "$1" -o jsonpath='{.metadata.uid}'; }
  declare -A before=()
  for i in $(seq 1 "$((NODES - 1))"); do before[$i]=$(uid_of "pinned$i"); done
  silent=$(node_name "$NODES")
  t=$SECONDS
  dcn "$NODES" stop -t 10 config-source pod-sync pleg node-status probe volume http-server >/dev/null 2>&1
  unknown() {
    [ "$(k get node "$silent" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = Unknown ]
  }
  others_untouched() {
    local i
    for i in $(seq 1 "$((NODES - 1))"); do
      [ "$(k get node "$(node_name "$i")" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ] || { echo "node $i not Ready"; return 1; }
      [ "$(k get pod "pinned$i" -o jsonpath='{.status.phase}')" = Running ] || { echo "pinned$i not Running"; return 1; }
      [ "$(uid_of "pinned$i")" = "${before[$i]}" ] || { echo "pinned$i replaced"; return 1; }
      [ "$(k get pod "pinned$i" -o jsonpath='{.status.containerStatuses[0].restartCount}')" = 0 ] || { echo "pinned$i restarted"; return 1; }
    done
  }
  if wait_until 180 unknown; then
    pass "node $silent's services stopped: its Ready goes Unknown ($((SECONDS - t)) s)"
    kt get nodes >/dev/null || true
    reason=$(k get node "$silent" -o jsonpath='{.status.conditions[?(@.type=="Ready")].reason}')
    [ "$reason" = NodeStatusUnknown ] && pass "reason NodeStatusUnknown, as upstream's node lifecycle" \
      || fail "reason NodeStatusUnknown, as upstream's node lifecycle: $reason"
  else
    fail "node $silent's services stopped: its Ready goes Unknown"
  fi
  check "the other nodes and their pods untouched" others_untouched
fi

summary
