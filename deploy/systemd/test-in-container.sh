#!/usr/bin/env bash
# The systemd units for real: boots systemd as PID 1 in a container built locally (a
# debootstrapped Debian bookworm with systemd, containerd, runc and the CNI plugins; the way
# kind runs its nodes), runs deploy/runtime/setup.sh and deploy/install.sh --runtime in it,
# and checks:
#   - systemd-analyze verify passes (here, with a root prefix, and inside the node)
#   - every unit is active; the example static pod runs
#   - `systemctl restart` of each unit in turn leaves the pod's containers untouched
#   - `systemctl kill -s KILL nodeagent-pod-sync` is followed by systemd restarting it
#   - the watchdog is armed and never fired; volume shares the runtime's mount namespace
#   - `systemctl stop kubelet.target` stops all seven cleanly (and leaves the pods running)
#   - deploy/uninstall.sh removes the units and the binaries
#   - kubeadm's layout (install.sh --kubeadm): kubeadm's drop-in, kubelet.service crash-loops
#     until config.yaml exists, then runs the seven with kubeadm's flags and files;
#     `systemctl restart/stop kubelet` restarts/stops the seven, the pods untouched
#   - kubeadm's cgroupDriver: systemd: refused against a cgroupfs runtime (naming both),
#     then, with runc's SystemdCgroup, pods in upstream's slices with their limits, the
#     slices stopped when the pods go
#   - an API pod (the test API server in the node): config-source's checkpoint written under
#     ProtectSystem=strict (0600); with the API server down and config-source restarted the
#     pods run on untouched; the API server back without the pod: it goes
#   - the Debian package (deploy/package/build-deb.sh): dpkg -i with the operator's flags,
#     a pod; dpkg -i of a later version with the pod running (every service restarted, the
#     pod untouched); dpkg --purge (nothing of ours left, the pod's containers run on)
#   - kubeadm join with the package: the test API server over TLS in the node, the files
#     `kubeadm join` writes (bootstrap token), systemctl restart kubelet: the token's CSR
#     approved, kubelet.conf written, the Node Ready, a pod with its service account's
#     token Running; the package upgraded under it (nothing disturbed) and purged
# Prints PASS/FAIL per check, exits non-zero on any failure, always removes the container.
#
# Usage: deploy/systemd/test-in-container.sh [BIN_DIR]   (run as root; needs docker)
# Environment: NODEAGENT_REBUILD_BASE=1 rebuilds the base image (deploy/image/build-base.sh);
#   NODEAGENT_KEEP_NODE=1 leaves the container running for a look (remove it yourself).
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$(pwd)

# shellcheck source=deploy/lib/bin-dir.sh
. deploy/lib/bin-dir.sh
# shellcheck source=deploy/lib/checks.sh
. deploy/lib/checks.sh

IMAGE=nodeagent-systemd-node
NAME=nodeagent-systemd-test-$$
CTR="ctr --address /run/nodeagent-containerd/containerd.sock -n k8s.io"
T_START=$SECONDS

[ "$(id -u)" -eq 0 ] || { echo "must run as root" >&2; exit 1; }
command -v docker >/dev/null || { echo "docker is required" >&2; exit 1; }
bin_src=$(nodeagent_bin_dir "${1:-}")
stage=$(mktemp -d /var/tmp/nodeagent-systemd-test.XXXXXX)
nodeagent_snapshot_bins "$bin_src" "$stage/bin"
# The test API server, for the API pods' section (cargo builds it with the workspace's bins).
if [ -x "$bin_src/nodeagent-test-apiserver" ]; then
  cp "$bin_src/nodeagent-test-apiserver" "$stage/bin/"
else
  echo "$bin_src/nodeagent-test-apiserver is missing: cargo build -p nodeagent-tests --bin nodeagent-test-apiserver" >&2
  exit 1
fi
mkdir -p "$stage/shutdown"
echo "== binaries: $bin_src (snapshot in $stage/bin)"

cleanup() {
  local rc=$?
  if [ "${NODEAGENT_KEEP_NODE:-0}" = 1 ]; then
    echo "== keeping container $NAME (NODEAGENT_KEEP_NODE=1): docker rm -fv $NAME"
  else
    docker rm -fv "$NAME" >/dev/null 2>&1 || true
  fi
  rm -rf "$stage"
  echo "== whole test: $((SECONDS - T_START)) s"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ------------------------------------------------------------------ verify on this machine
check "systemd-analyze verify (root prefix, this machine)" bash deploy/systemd/verify.sh "$stage/bin"

# ------------------------------------------------------------------ images
t=$SECONDS
bash deploy/image/build-base.sh
out=$(DOCKER_BUILDKIT=0 docker build -t "$IMAGE" -f deploy/systemd/node.Dockerfile deploy/systemd 2>&1) \
  || { printf '%s\n' "$out" >&2; fail "docker build $IMAGE"; exit 1; }
docker image prune -f --filter label=nodeagent.base.hash >/dev/null || true  # our dangling ones
echo "== images ready in $((SECONDS - t)) s (nodeagent-base, $IMAGE)"

# ------------------------------------------------------------------ boot the node
# Not --privileged: where the host's capability bounding set lacks one (CAP_SYS_RESOURCE
# on this kind of machine), runc cannot apply "all capabilities" and refuses to start it.
# Instead: every capability the host has, no seccomp, no masked /proc paths (the CNI bridge
# plugin writes /proc/sys/net), every device, and a private cgroup namespace whose
# hierarchies the entrypoint remounts read-write (node-entrypoint.sh).
caps=(--cap-add ALL)
bnd=$(awk '/^CapBnd/ {print $2}' /proc/self/status)
if [ $(( 0x$bnd >> 24 & 1 )) -eq 0 ]; then caps+=(--cap-drop SYS_RESOURCE); fi
# The host's kernel modules for modprobe in the node, if this machine has any (a bind of a
# missing path would create it on the host).
modules=()
if [ -d /lib/modules ]; then modules=(-v /lib/modules:/lib/modules:ro); fi
# /dev/kmsg as a real node has it: node-status's OOM watcher reads it (DeviceAllow in its
# unit), and the state check below writes a record to it.
docker run -d --name "$NAME" --hostname nodeagent-node \
  "${caps[@]}" \
  --security-opt seccomp=unconfined --security-opt systempaths=unconfined \
  --device-cgroup-rule 'a *:* rwm' --cgroupns=private \
  --device /dev/kmsg \
  --tmpfs /run:rw,nosuid,nodev,exec,mode=755 --tmpfs /tmp:rw,nosuid,nodev,exec,mode=1777 \
  "${modules[@]}" \
  -v /var/lib/nodeagent-containerd -v /var/lib/kubelet \
  -v "$stage/shutdown:/var/lib/nodeagent-shutdown-test" \
  "$IMAGE" >/dev/null
dx() { docker exec "$NAME" "$@"; }
# The kubelet API inside the node, with the admin certificate install.sh made (the shipped
# configuration keeps the read-only port off, as upstream).
KAPI="curl -sf --cacert /var/lib/kubelet/pki/kubelet.crt --cert /etc/nodeagent/pki/admin.crt --key /etc/nodeagent/pki/admin.key https://127.0.0.1:10250"
dsh() { docker exec "$NAME" bash -c "$1"; }

booted() { s=$(dx systemctl is-system-running 2>/dev/null || true); [ "$s" = running ] || [ "$s" = degraded ]; }
if wait_until 90 booted; then
  pass "systemd boots as PID 1 in the container ($(dx systemctl is-system-running 2>/dev/null || true))"
else
  fail "systemd boots as PID 1 in the container"; docker logs "$NAME" 2>&1 | tail -n 30; exit 1
fi
failed_units=$(dx systemctl --failed --no-legend --plain 2>/dev/null || true)
[ -z "$failed_units" ] || info "failed units at boot: $failed_units"

# The repository's deploy/ (and README) and the binaries, into /opt/nodeagent.
dx mkdir -p /opt/nodeagent
tar -C "$REPO" -c deploy README.md | docker exec -i "$NAME" tar -C /opt/nodeagent -x
tar -C "$stage" -c bin | docker exec -i "$NAME" tar -C /opt/nodeagent -x

# ------------------------------------------------------------------ runtime and install
t=$SECONDS
if out=$(dx bash /opt/nodeagent/deploy/runtime/setup.sh 2>&1); then
  pass "deploy/runtime/setup.sh in the node ($((SECONDS - t)) s)"
else
  fail "deploy/runtime/setup.sh in the node"; printf '%s\n' "$out" | tail -n 30; exit 1
fi
t=$SECONDS
if out=$(dx bash /opt/nodeagent/deploy/install.sh --runtime /opt/nodeagent/bin 2>&1); then
  pass "deploy/install.sh --runtime ($((SECONDS - t)) s)"
  printf '%s\n' "$out" | sed 's/^/    /'
else
  fail "deploy/install.sh --runtime"; printf '%s\n' "$out" | tail -n 40
  dsh "journalctl -u 'nodeagent-*' -n 60 --no-pager" || true
  exit 1
fi

containerd_under_systemd() {
  local main pid out
  main=$(dx systemctl show -p MainPID --value nodeagent-containerd.service)
  [ "$main" != 0 ] || return 1
  # setup.sh again: finds containerd answering, and that it is the unit's.
  out=$(dx bash /opt/nodeagent/deploy/runtime/setup.sh 2>&1) || { echo "$out"; return 1; }
  grep -q 'already answering' <<<"$out" || { echo "$out"; return 1; }
  pid=$(dx cat /run/nodeagent-containerd/containerd.pid)
  [ "$pid" = "$main" ] || { echo "setup.sh's pid file says $pid, the unit's MainPID is $main"; return 1; }
}
check "containerd runs as nodeagent-containerd.service; setup.sh re-run finds it" containerd_under_systemd

units_active() {
  local u bad=""
  for u in kubelet.target nodeagent-containerd.service "${@}"; do
    [ "$(dx systemctl is-active "$u" 2>/dev/null)" = active ] || bad+=" $u"
  done
  [ -z "$bad" ] || { echo "not active:$bad"; return 1; }
}
ALL_UNITS=()
for s in "${NODEAGENT_SERVICES[@]}"; do ALL_UNITS+=("nodeagent-$s.service"); done
check "every unit active (kubelet.target, containerd, the seven services)" units_active "${ALL_UNITS[@]}"
check "kubelet.target enabled" dx systemctl is-enabled --quiet kubelet.target

verify_inside() {
  local out
  out=$(dx bash -c 'cd /etc/systemd/system && systemd-analyze verify kubelet.target nodeagent-*.service 2>&1') || { echo "$out"; return 1; }
  [ -z "$out" ] || { echo "$out"; return 1; }
}
check "systemd-analyze verify on the installed units (inside the node)" verify_inside

sockets_serve() {
  local s
  for s in "${NODEAGENT_SERVICES[@]}"; do
    dx bash -c "$GRPC_HEALTH_SCRIPT" _ "/run/nodeagent/$s.sock" || { echo "$s.sock does not answer SERVING"; return 1; }
  done
}
check "every service's gRPC socket answers grpc.health.v1 SERVING" sockets_serve

# ------------------------------------------------------------------ the example pod
dx install -m 0644 /opt/nodeagent/deploy/examples/web.yaml /etc/kubernetes/manifests/web.yaml
pod_running() { dx $KAPI/pods | grep -q '"phase":"Running"'; }
healthz_ok() { [ "$(dx curl -sf http://127.0.0.1:10248/healthz)" = ok ]; }
t=$SECONDS
if wait_until 120 pod_running; then
  pass "the example static pod runs ($((SECONDS - t)) s)"
else
  fail "the example static pod runs"
  dx $KAPI/pods | head -c 2000; echo
  dsh "journalctl -u nodeagent-pod-sync -n 40 --no-pager" || true
  exit 1
fi
pod_serves() {
  local ip
  ip=$(dx $KAPI/pods | grep -o '"podIP":"[0-9.]*"' | head -n1 | cut -d'"' -f4)
  [ -n "$ip" ] && dx curl -sf "http://$ip:8080/" | grep -q 'hello from web'
}
check "the pod's web page answers on its pod IP" wait_until 30 pod_serves
check "/healthz is ok" wait_until 30 healthz_ok
# The state the README's restart promises rest on is written under ProtectSystem=strict:
# node-status's kernel log position (a record is written to the kernel log to move it),
# private to root; the root dir and pods/ are 0750 as upstream's.
kmsg_state_kept() {
  dx sh -c 'echo "nodeagent test-in-container: a kernel log record" > /dev/kmsg' || true
  [ "$(dx stat -c %a /var/lib/kubelet/node-status/kmsg.json 2>/dev/null)" = 600 ]
}
check "node-status keeps its kernel log position (/var/lib/kubelet/node-status/kmsg.json, 0600)" wait_until 30 kmsg_state_kept
private_dirs() {
  [ "$(dx stat -c %a /var/lib/kubelet)" = 750 ] && [ "$(dx stat -c %a /var/lib/kubelet/pods)" = 750 ] \
    && [ -z "$(dx find /var/lib/kubelet/pods -mindepth 1 -maxdepth 1 -type d ! -perm 0750)" ]
}
check "the root dir, pods/ and every pod dir are 0750" private_dirs

snapshot() {
  dx bash -c "$CTR containers ls -q | sort; $CTR tasks ls | tail -n +2 | sort"
}
before=$(snapshot)
n_containers=$(dx bash -c "$CTR containers ls -q" | wc -l)
info "runtime state: $n_containers containers (sandbox + 2), tasks with their PIDs:"
printf '%s\n' "$before" | sed 's/^/       /'

# ------------------------------------------------------------------ restart each unit
for s in "${NODEAGENT_SERVICES[@]}"; do
  u=nodeagent-$s.service
  pid0=$(dx systemctl show -p MainPID --value "$u")
  t=$SECONDS
  restarted() {
    local p
    p=$(dx systemctl show -p MainPID --value "$u")
    [ "$p" != 0 ] && [ "$p" != "$pid0" ] && [ "$(dx systemctl is-active "$u")" = active ]
  }
  caught_up() { healthz_ok && pod_running && dx bash -c "$GRPC_HEALTH_SCRIPT" _ "/run/nodeagent/$s.sock"; }
  if ! dx systemctl restart "$u"; then
    fail "systemctl restart $u"; continue
  fi
  if ! wait_until 30 restarted; then fail "systemctl restart $u: new process active"; continue; fi
  if ! wait_until 60 caught_up; then fail "systemctl restart $u: catches up (socket, /healthz, pod Running)"; continue; fi
  if out=$(stays_same 3 "$before" snapshot) && out2=$(units_active "${ALL_UNITS[@]}"); then
    pass "systemctl restart $u: pod containers and PIDs untouched, every unit active ($((SECONDS - t)) s)"
  else
    fail "systemctl restart $u: pod containers and PIDs untouched, every unit active"
    printf '%s\n%s\n' "${out:-}" "${out2:-}" | sed 's/^/    /'
  fi
done

# ------------------------------------------------------------------ the runtime restarts
# KillMode=process and Delegate=yes: restarting containerd leaves the shims, and the pods.
t=$SECONDS
dx systemctl restart nodeagent-containerd.service
runtime_back() { [ "$(dx systemctl is-active nodeagent-containerd.service)" = active ] && healthz_ok && pod_running; }
if wait_until 60 runtime_back && out=$(stays_same 3 "$before" snapshot) && out2=$(units_active "${ALL_UNITS[@]}"); then
  pass "systemctl restart nodeagent-containerd: pod containers and PIDs untouched, every unit active ($((SECONDS - t)) s)"
else
  fail "systemctl restart nodeagent-containerd: pod containers and PIDs untouched, every unit active"
  printf '%s\n%s\n' "${out:-}" "${out2:-}" | sed 's/^/    /'
fi

# ------------------------------------------------------------------ SIGKILL: systemd restarts
n0=$(dx systemctl show -p NRestarts --value nodeagent-pod-sync.service)
pid0=$(dx systemctl show -p MainPID --value nodeagent-pod-sync.service)
t=$SECONDS
dx systemctl kill -s KILL nodeagent-pod-sync.service
restarted_by_systemd() {
  local n p
  n=$(dx systemctl show -p NRestarts --value nodeagent-pod-sync.service)
  p=$(dx systemctl show -p MainPID --value nodeagent-pod-sync.service)
  [ "$n" -gt "$n0" ] && [ "$p" != 0 ] && [ "$p" != "$pid0" ] \
    && [ "$(dx systemctl is-active nodeagent-pod-sync.service)" = active ]
}
if wait_until 30 restarted_by_systemd; then
  pass "systemctl kill -s KILL nodeagent-pod-sync: systemd restarts it (NRestarts $n0 -> $(dx systemctl show -p NRestarts --value nodeagent-pod-sync.service), $((SECONDS - t)) s)"
else
  fail "systemctl kill -s KILL nodeagent-pod-sync: systemd restarts it"
fi
caught_up_all() { healthz_ok && pod_running; }
if wait_until 60 caught_up_all && out=$(stays_same 3 "$before" snapshot); then
  pass "after SIGKILL of pod-sync: pod containers and PIDs untouched"
else
  fail "after SIGKILL of pod-sync: pod containers and PIDs untouched"; printf '%s\n' "${out:-}" | sed 's/^/    /'
fi
# The node page's services card counts restarts as systemd does: each service's row says
# what `systemctl show -p NRestarts` says of its unit (the oracle: systemd itself), pod-sync's
# SIGKILL above counted, and http-server's own row too (it restarted above by hand, which
# systemd does not count).
page_restarts_are_systemds() {
  local s n row rows
  rows=$(dx $KAPI/ui/api/node) || { echo "GET /ui/api/node failed"; return 1; }
  for s in pod-sync http-server pleg; do
    n=$(dx systemctl show -p NRestarts --value "nodeagent-$s.service")
    # (One service's row: an object without nested objects, its keys in any order.)
    row=$(printf '%s' "$rows" | grep -oE "\{[^{}]*\"name\":\"$s\"[^{}]*\}")
    if ! printf '%s' "$row" | grep -qE "\"restarts\":$n[,}]" \
      || ! printf '%s' "$row" | grep -q '"restartsFrom":"systemd"'; then
      echo "nodeagent-$s: NRestarts=$n, the page's row: ${row:-none in $(printf '%s' "$rows" | head -c 600)}"
      return 1
    fi
  done
  [ "$(dx systemctl show -p NRestarts --value nodeagent-pod-sync.service)" -ge 1 ]
}
check_within "the node page's restarts are systemd's NRestarts (pod-sync's SIGKILL counted)" 30 page_restarts_are_systemds

# ------------------------------------------------------------------ watchdog, namespaces
watchdog_ok() {
  local s w n
  for s in "${NODEAGENT_SERVICES[@]}"; do
    w=$(dx systemctl show -p WatchdogUSec --value "nodeagent-$s.service")
    [ "$w" = 30s ] || { echo "nodeagent-$s: WatchdogUSec=$w"; return 1; }
    n=$(dx systemctl show -p NRestarts --value "nodeagent-$s.service")
    if [ "$s" != pod-sync ] && [ "$n" != 0 ]; then echo "nodeagent-$s restarted $n times by itself"; return 1; fi
  done
  if dsh "journalctl --no-pager -u 'nodeagent-*' | grep -i 'watchdog timeout'"; then return 1; fi
}
info "the node agent has run for $(( $(date +%s) - $(dx bash -c 'date -d "$(systemctl show -p ActiveEnterTimestamp --value kubelet.target)" +%s') )) s under a 30 s watchdog"
check "watchdog armed (WatchdogUSec=30s) on all seven and never fired" watchdog_ok

# The watchdog for real, on probe, with a short period from a runtime drop-in: a hung
# (SIGSTOPped) service stops pinging; systemd aborts it (Result=watchdog) and restarts it.
watchdog_fires() {
  local d=/run/systemd/system/nodeagent-probe.service.d n0 pid0 rc=0
  dx mkdir -p "$d"
  dx bash -c "printf '[Service]\nWatchdogSec=3s\nTimeoutAbortSec=3s\n' >$d/50-test-watchdog.conf"
  dx systemctl daemon-reload
  dx systemctl restart nodeagent-probe.service
  n0=$(dx systemctl show -p NRestarts --value nodeagent-probe.service)
  pid0=$(dx systemctl show -p MainPID --value nodeagent-probe.service)
  dx kill -STOP "$pid0"
  fired() {
    local n p
    n=$(dx systemctl show -p NRestarts --value nodeagent-probe.service)
    p=$(dx systemctl show -p MainPID --value nodeagent-probe.service)
    [ "$n" -gt "$n0" ] && [ "$p" != 0 ] && [ "$p" != "$pid0" ] \
      && [ "$(dx systemctl is-active nodeagent-probe.service)" = active ]
  }
  wait_until 40 fired || { echo "probe was not restarted by the watchdog"; rc=1; }
  dsh "journalctl --no-pager -u nodeagent-probe | grep -q 'Watchdog timeout'" \
    || { echo "no 'Watchdog timeout' in probe's journal"; rc=1; }
  dx rm -rf "$d"
  dx systemctl daemon-reload
  dx systemctl restart nodeagent-probe.service
  return $rc
}
t=$SECONDS
check "a hung service (SIGSTOP, 3 s watchdog drop-in) is aborted by the watchdog and restarted" watchdog_fires
info "watchdog check took $((SECONDS - t)) s"
check "after the watchdog restart: pod containers and PIDs untouched" stays_same 2 "$before" snapshot

mount_namespaces() {
  local init vol ps
  init=$(dx readlink /proc/1/ns/mnt)
  vol=$(dx bash -c 'readlink /proc/$(systemctl show -p MainPID --value nodeagent-volume)/ns/mnt')
  ps=$(dx bash -c 'readlink /proc/$(systemctl show -p MainPID --value nodeagent-pod-sync)/ns/mnt')
  [ "$vol" = "$init" ] || { echo "volume runs in its own mount namespace: its mounts would not reach containerd"; return 1; }
  [ "$ps" != "$init" ] || { echo "pod-sync's hardening (ProtectSystem=strict) did not take effect"; return 1; }
}
check "volume shares the runtime's mount namespace; the other services are sandboxed" mount_namespaces

# ------------------------------------------------------------------ stop the target
t=$SECONDS
dx systemctl stop kubelet.target
all_stopped_cleanly() {
  local s a r bad=""
  for s in "${NODEAGENT_SERVICES[@]}"; do
    a=$(dx systemctl show -p ActiveState --value "nodeagent-$s.service")
    r=$(dx systemctl show -p Result --value "nodeagent-$s.service")
    [ "$a" = inactive ] && [ "$r" = success ] || bad+=" nodeagent-$s:$a/$r"
  done
  [ -z "$bad" ] || { echo "not cleanly stopped:$bad"; return 1; }
}
# `systemctl stop kubelet.target` returns once the target's own stop job is done; the
# services' stop jobs (PartOf=) run in the same transaction, ordered after it, and may still
# be draining: wait for them, with a deadline.
if wait_until 45 all_stopped_cleanly; then
  pass "systemctl stop kubelet.target stops all seven cleanly (inactive, Result=success; $((SECONDS - t)) s)"
else
  fail "systemctl stop kubelet.target stops all seven cleanly"; all_stopped_cleanly | sed 's/^/    /'
fi
check "kubelet.target inactive" bash -c "[ \"\$(docker exec $NAME systemctl is-active kubelet.target)\" = inactive ]"
check "the pods keep running with the node agent stopped (containers and PIDs untouched)" stays_same 2 "$before" snapshot

# ------------------------------------------------------------------ uninstall
uninstalled() {
  dx bash /opt/nodeagent/deploy/uninstall.sh >/dev/null || return 1
  dx bash -c 'ls /etc/systemd/system/nodeagent-pod-sync.service /usr/local/bin/nodeagent-pod-sync /etc/systemd/system/kubelet.target 2>/dev/null' && return 1
  dx test -f /etc/nodeagent/kubelet-config.yaml || { echo "config removed without --purge"; return 1; }
  [ "$(dx systemctl is-active nodeagent-containerd.service)" = active ] || { echo "runtime stopped without --runtime"; return 1; }
}
check "deploy/uninstall.sh removes units and binaries, keeps config and runtime" uninstalled

# ------------------------------------------------------------------ kubeadm's layout
# A kubeadm node: the kubeadm package's drop-in (kubernetes/release 10-kubeadm.conf, DEB
# flavour, verbatim) and kubelet.service enabled before `kubeadm init` has written anything.
# Then what `kubeadm init` writes, as it writes it (kubeadm-flags.env, the config.yaml of
# its componentconfigs defaults with every duration 0s, kubelet.conf naming an API server
# that is not up yet, as on a control-plane node before its static pods run), and
# `systemctl restart kubelet` as kubeadm does.
t=$SECONDS
dx mkdir -p /etc/systemd/system/kubelet.service.d /etc/default /etc/kubernetes/pki /var/lib/kubelet/pki
dx install -m 0644 /opt/nodeagent/deploy/examples/kubeadm/10-kubeadm.conf /etc/systemd/system/kubelet.service.d/10-kubeadm.conf
if out=$(dx bash /opt/nodeagent/deploy/install.sh --kubeadm /opt/nodeagent/bin 2>&1); then
  pass "deploy/install.sh --kubeadm, with kubeadm's drop-in in place ($((SECONDS - t)) s)"
else
  fail "deploy/install.sh --kubeadm"; printf '%s\n' "$out" | tail -n 20
fi
crash_looping() {
  local n
  n=$(dx systemctl show -p NRestarts --value kubelet.service)
  [ "${n:-0}" -ge 1 ] || { echo "NRestarts=$n"; return 1; }
  [ "$(dx systemctl is-enabled kubelet.service)" = enabled ] || return 1
  dsh "journalctl --no-pager -u kubelet | grep -q 'failed to read kubelet config file \"/var/lib/kubelet/config.yaml\"'" \
    || { echo "no error naming config.yaml in the journal"; return 1; }
}
check "without config.yaml kubelet.service restarts, naming the file (upstream's crash loop, never left dead)" wait_until 40 crash_looping
# kubeadm init's files. The CA and the node's client certificate (kubeadm's
# kubelet-client-current.pem, here as two files).
dsh 'cd /etc/kubernetes/pki && openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 -subj /CN=kubernetes 2>/dev/null \
  && openssl req -newkey rsa:2048 -nodes -keyout /var/lib/kubelet/pki/node.key -out /tmp/node.csr -subj "/O=system:nodes/CN=system:node:nodeagent-node" 2>/dev/null \
  && printf "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n" >/tmp/node.ext \
  && openssl x509 -req -in /tmp/node.csr -CA ca.crt -CAkey ca.key -CAcreateserial -extfile /tmp/node.ext -out /var/lib/kubelet/pki/node.crt -days 2 2>/dev/null'
dsh 'cat >/etc/kubernetes/kubelet.conf <<KUBECONFIG
apiVersion: v1
clusters:
- cluster:
    certificate-authority-data: $(base64 -w0 /etc/kubernetes/pki/ca.crt)
    server: https://127.0.0.1:6443
  name: kubernetes
contexts:
- context:
    cluster: kubernetes
    user: system:node:nodeagent-node
  name: system:node:nodeagent-node@kubernetes
current-context: system:node:nodeagent-node@kubernetes
kind: Config
preferences: {}
users:
- name: system:node:nodeagent-node
  user:
    client-certificate: /var/lib/kubelet/pki/node.crt
    client-key: /var/lib/kubelet/pki/node.key
KUBECONFIG'
# kubeadm ≤ 1.33's kubeadm-flags.env (cmd/kubeadm/app/phases/kubelet/flags.go: the runtime
# endpoint, the sandbox image up to 1.34), and an operator's /etc/default/kubelet.
dsh 'echo "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///run/nodeagent-containerd/containerd.sock --pod-infra-container-image=registry.k8s.io/pause:3.10\"" >/var/lib/kubelet/kubeadm-flags.env'
dsh 'echo "KUBELET_EXTRA_ARGS=--max-pods=50 --node-labels=pool=blue --fail-swap-on=false -v=2 --vmodule=runtime_calls=4" >/etc/default/kubelet'
# kubeadm's config.yaml as captured from a kubeadm node, cgroupDriver: systemd included, but
# resolvConf (no systemd-resolved here).
dsh 'sed -e "/^resolvConf:/d" /opt/nodeagent/deploy/examples/kubeadm/config.yaml >/var/lib/kubelet/config.yaml'
dx systemctl restart kubelet
# The runtime still uses cgroupfs (SystemdCgroup = false): pod-sync must refuse to start,
# naming both drivers (dockershim's words), and leave the running pods alone.
driver_refused() {
  dsh "journalctl --no-pager -u nodeagent-pod-sync | grep -qE 'kubelet cgroup driver: .{1,3}systemd.{1,3} is different from the runtime.s cgroup driver: .{1,3}cgroupfs'" \
    || { dsh "journalctl --no-pager -u nodeagent-pod-sync -n 5"; return 1; }
  [ "$(dx systemctl is-active nodeagent-pod-sync.service)" != active ] || { echo "pod-sync active"; return 1; }
}
check "cgroupDriver: systemd against a cgroupfs runtime: pod-sync refuses to start, naming both drivers" wait_until 60 driver_refused
check "while pod-sync refuses: the pods that ran before run on, untouched" stays_same 2 "$before" snapshot
# containerd's runc on the systemd driver, as a kubeadm node's (containerd restarts; the
# containers keep running).
if out=$(dx env NODEAGENT_SYSTEMD_CGROUP=true bash /opt/nodeagent/deploy/runtime/setup.sh 2>&1) \
   && dx grep -q '^ *SystemdCgroup = true$' /etc/nodeagent/containerd/config.toml; then
  pass "deploy/runtime/setup.sh with NODEAGENT_SYSTEMD_CGROUP=true: runc on the systemd cgroup driver"
else
  fail "deploy/runtime/setup.sh with NODEAGENT_SYSTEMD_CGROUP=true: runc on the systemd cgroup driver"
  printf '%s\n' "$out" | tail -n 20
fi
t=$SECONDS
kubeadm_node_up() {
  [ "$(dx systemctl is-active kubelet.service)" = active ] || { echo "kubelet.service $(dx systemctl is-active kubelet.service)"; return 1; }
  units_active "${ALL_UNITS[@]}" >/dev/null || { units_active "${ALL_UNITS[@]}"; return 1; }
  healthz_ok || { echo "/healthz not ok"; return 1; }
}
if wait_until 90 kubeadm_node_up; then
  pass "kubeadm's files and systemctl restart kubelet: kubelet.service and the seven active, /healthz ok ($((SECONDS - t)) s)"
else
  fail "kubeadm's files and systemctl restart kubelet: kubelet.service and the seven active, /healthz ok"
  kubeadm_node_up | sed "s/^/    /" || true
  dsh "journalctl --no-pager -u kubelet -u 'nodeagent-*' -n 40" || true
fi
flags_reached() {
  local line
  dx grep -q -- "--config=/var/lib/kubelet/config.yaml --container-runtime-endpoint=unix:///run/nodeagent-containerd/containerd.sock" /run/nodeagent/kubelet.env \
    || { dx cat /run/nodeagent/kubelet.env; return 1; }
  line=$(dsh "journalctl --no-pager -u nodeagent-pod-sync | grep 'upstream kubelet flags accepted but not acted on' | tail -n 1")
  grep -q 'flags=\["pod-infra-container-image"\]' <<<"$line" || { echo "pod-sync: $line"; return 1; }
}
flags_name="kubeadm's and /etc/default/kubelet's flags reach the seven; the ones not acted on are named"
if wait_until 30 flags_reached; then
  pass "$flags_name"
else
  fail "$flags_name"; flags_reached 2>&1 | tail -n 5 | sed 's/^/    /'
fi
check "the pods that ran before run on, untouched (containers and PIDs), under kubeadm's layout" stays_same 3 "$before" snapshot
pids_of_seven() { local s; for s in "${NODEAGENT_SERVICES[@]}"; do dx systemctl show -p MainPID --value "nodeagent-$s.service"; done; }
seven0=$(pids_of_seven)
t=$SECONDS
dx systemctl restart kubelet
seven_restarted() {
  local now
  kubeadm_node_up >/dev/null || return 1
  now=$(pids_of_seven)
  [ -z "$(comm -12 <(sort <<<"$seven0") <(sort <<<"$now"))" ] || { echo "a service kept its PID"; return 1; }
}
if wait_until 90 seven_restarted && out=$(stays_same 3 "$before" snapshot); then
  pass "systemctl restart kubelet restarts the seven (new PIDs), pods untouched ($((SECONDS - t)) s)"
else
  fail "systemctl restart kubelet restarts the seven (new PIDs), pods untouched"; printf '%s\n' "${out:-}" | sed 's/^/    /'
fi
t=$SECONDS
dx systemctl stop kubelet
seven_stopped() {
  local s a
  for s in "${NODEAGENT_SERVICES[@]}"; do
    a=$(dx systemctl show -p ActiveState --value "nodeagent-$s.service")
    [ "$a" = inactive ] || { echo "nodeagent-$s $a"; return 1; }
  done
}
check "systemctl stop kubelet stops the seven; the pods keep running" wait_until 45 seven_stopped
check "after systemctl stop kubelet: pod containers and PIDs untouched" stays_same 2 "$before" snapshot

# The systemd cgroup driver at work (kubeadm's cgroupDriver: systemd, runc's SystemdCgroup):
# a BestEffort, a Burstable and a Guaranteed pod get upstream's slices
# (cgroup_manager_linux.go's names:
# kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid, - as _>.slice),
# created through systemd with the pod's limits, containerd's scopes inside; the QoS
# slices and kubepods.slice get what upstream's QoS and node container managers give them
# (kubeadm's config reserves nothing: kubepods.slice the machine's CPUs as shares and its
# memory as the limit; the burstable slice the shares of its one pod's 300m); their removal
# stops the slices.
t=$SECONDS
dx systemctl start kubelet
check "systemctl start kubelet: the seven active again (cgroupDriver systemd)" wait_until 90 kubeadm_node_up
sliced_pod() { # NAME [RESOURCES-LINE...]
  printf '%s\n' "apiVersion: v1" "kind: Pod" "metadata:" "  name: $1" "spec:" \
    "  terminationGracePeriodSeconds: 1" "  containers:" "  - name: main" \
    "    image: busybox:1.36" "    command: [sleep, \"3600\"]" "${@:2}"
}
sliced_pod sliced-be | docker exec -i "$NAME" tee /etc/kubernetes/manifests/sliced-be.yaml >/dev/null
sliced_pod sliced-g "    resources:" "      limits: {cpu: 200m, memory: 64Mi}" \
  | docker exec -i "$NAME" tee /etc/kubernetes/manifests/sliced-g.yaml >/dev/null
sliced_pod sliced-b "    resources:" "      requests: {cpu: 300m, memory: 32Mi}" \
  | docker exec -i "$NAME" tee /etc/kubernetes/manifests/sliced-b.yaml >/dev/null
# NAME's UID once its container has started: its log directory, as `ls /var/log/pods`
# shows it (<namespace>_<pod>_<uid>; the kubelet API here takes kubeadm's client CA only).
sliced_uid() {
  dsh "ls /var/log/pods/default_$1-*/main/0.log 2>/dev/null" | head -n 1 | cut -d/ -f5 | awk -F_ '{print $NF}'
}
sliced_running() { [ -n "$(sliced_uid sliced-be)" ] && [ -n "$(sliced_uid sliced-g)" ] && [ -n "$(sliced_uid sliced-b)" ]; }
if wait_until 120 sliced_running; then
  pass "a BestEffort, a Burstable and a Guaranteed pod start under the systemd driver ($((SECONDS - t)) s)"
else
  fail "a BestEffort, a Burstable and a Guaranteed pod start under the systemd driver"
  dsh "ls /var/log/pods; journalctl -u nodeagent-pod-sync -n 30 --no-pager" || true
fi
# /etc/default/kubelet's --vmodule=runtime_calls=4 (klog's per-file verbosity) under -v=2:
# the debug line of pod-sync's sync/runtime_calls.rs, written as the pods' QoS tiers are
# set, is in the journal (it is not at -v=2 alone).
vmodule_line() {
  dsh "journalctl --no-pager -u nodeagent-pod-sync --since '-180s' | grep -q 'runtime_calls.rs:[0-9]*] \"QoS cgroups set\"'"
}
check_within "--vmodule=runtime_calls=4: pod-sync writes that file's debug line (QoS cgroups set)" 30 vmodule_line \
  || dsh "journalctl --no-pager -u nodeagent-pod-sync --since '-180s' | grep -iE 'qos|runtime_calls' | tail -n 10" 2>&1 | sed 's/^/    /' || true
be_uid=$(sliced_uid sliced-be); g_uid=$(sliced_uid sliced-g); b_uid=$(sliced_uid sliced-b)
be_slice="kubepods-besteffort-pod${be_uid//-/_}.slice"
g_slice="kubepods-pod${g_uid//-/_}.slice"
b_slice="kubepods-burstable-pod${b_uid//-/_}.slice"
be_dir="kubepods.slice/kubepods-besteffort.slice/$be_slice"
g_dir="kubepods.slice/$g_slice"
b_dir="kubepods.slice/kubepods-burstable.slice/$b_slice"
# A cgroup file of the v1 controller CTL or of the v2 tree.
cg_file() { # CTL V1-FILE V2-FILE DIR
  if dx test -e /sys/fs/cgroup/cgroup.controllers; then dx cat "/sys/fs/cgroup/$4/$3"; else dx cat "/sys/fs/cgroup/$1/$4/$2"; fi
}
# v1 shares as v2's weight (runc's ConvertCPUSharesToCgroupV2Value) where the node is v2.
shares_as() { # SHARES
  if dx test -e /sys/fs/cgroup/cgroup.controllers; then echo $((1 + ($1 - 2) * 9999 / 262142)); else echo "$1"; fi
}
slices_as_upstream() {
  local s shares quota mem b_shares tier_shares pods_shares pods_mem want_mem cpus
  for s in "$be_slice" "$g_slice" "$b_slice"; do
    [ "$(dx systemctl is-active "$s")" = active ] || { echo "$s: $(dx systemctl is-active "$s")"; return 1; }
  done
  # The containers are containerd's scopes inside the pod slices.
  dsh "ls -d /sys/fs/cgroup/memory/$be_dir/cri-containerd-*.scope /sys/fs/cgroup/$be_dir/cri-containerd-*.scope 2>/dev/null | grep -q ." \
    || { echo "no cri-containerd scope in $be_dir"; return 1; }
  shares=$(cg_file cpu cpu.shares cpu.weight "$be_dir")
  [ "$shares" = 2 ] || [ "$shares" = 1 ] || { echo "BestEffort slice cpu shares/weight $shares, want 2 (v2: 1)"; return 1; }
  mem=$(cg_file memory memory.limit_in_bytes memory.max "$g_dir")
  [ "$mem" = 67108864 ] || { echo "Guaranteed slice memory limit $mem, want 67108864"; return 1; }
  quota=$(cg_file cpu cpu.cfs_quota_us cpu.max "$g_dir")
  [ "${quota%% *}" = 20000 ] || { echo "Guaranteed slice CPU quota $quota, want 20000 per 100000"; return 1; }
  # MilliCPUToShares(300) = 307, for the pod and for its tier, the one Burstable pod.
  b_shares=$(cg_file cpu cpu.shares cpu.weight "$b_dir")
  [ "$b_shares" = "$(shares_as 307)" ] || { echo "Burstable slice cpu shares/weight $b_shares, want $(shares_as 307)"; return 1; }
  tier_shares=$(cg_file cpu cpu.shares cpu.weight kubepods.slice/kubepods-burstable.slice)
  [ "$tier_shares" = "$(shares_as 307)" ] || { echo "kubepods-burstable.slice cpu shares/weight $tier_shares, want $(shares_as 307)"; return 1; }
  cpus=$(dx nproc)
  pods_shares=$(cg_file cpu cpu.shares cpu.weight kubepods.slice)
  [ "$pods_shares" = "$(shares_as $((cpus * 1024)))" ] || { echo "kubepods.slice cpu shares/weight $pods_shares, want $(shares_as $((cpus * 1024)))"; return 1; }
  # (in whole pages, as the kernel keeps a limit)
  want_mem=$(dx awk -v page="$(dx getconf PAGESIZE)" '/^MemTotal:/ {printf "%.0f", int($2 * 1024 / page) * page}' /proc/meminfo)
  pods_mem=$(cg_file memory memory.limit_in_bytes memory.max kubepods.slice)
  [ "$pods_mem" = "$want_mem" ] || { echo "kubepods.slice memory limit $pods_mem, want MemTotal $want_mem"; return 1; }
  info "slices: $be_dir (cpu $shares), $g_dir (memory $mem, quota ${quota%% *}), $b_dir (cpu $b_shares, tier $tier_shares), kubepods.slice (cpu $pods_shares, memory $pods_mem)"
}
slices_name="the pods' slices as upstream names them: active, containerd's scopes inside, BestEffort at the minimum CPU shares, the Guaranteed limits, the Burstable pod's and tier's shares, kubepods.slice at the machine's CPUs and memory"
if wait_until 30 slices_as_upstream; then
  pass "$slices_name"; slices_as_upstream
else
  fail "$slices_name"; slices_as_upstream 2>&1 | sed 's/^/    /' || true
  dsh "systemctl list-units --no-pager --all 'kubepods*' 'cri-containerd*'; find /sys/fs/cgroup/memory/kubepods.slice /sys/fs/cgroup/kubepods.slice -type d 2>/dev/null; for p in \$($CTR tasks ls | awk 'NR>1 {print \$2}'); do echo pid \$p; grep -E 'memory|cpu,' /proc/\$p/cgroup; done" 2>&1 | sed 's/^/    /' || true
fi
dx rm -f /etc/kubernetes/manifests/sliced-be.yaml /etc/kubernetes/manifests/sliced-g.yaml /etc/kubernetes/manifests/sliced-b.yaml
slices_gone() {
  local s
  for s in "$be_slice" "$g_slice" "$b_slice"; do
    [ "$(dx systemctl is-active "$s")" != active ] || { echo "$s still active"; return 1; }
  done
  ! dx test -e "/sys/fs/cgroup/memory/$be_dir" && ! dx test -e "/sys/fs/cgroup/$be_dir" || { echo "$be_dir left"; return 1; }
}
check "the pods removed: their slices stopped and gone from the cgroup tree" wait_until 60 slices_gone
dx systemctl stop kubelet
check "the seven stopped again" wait_until 45 seven_stopped
# Back to the cgroupfs runtime for what follows.
if out=$(dx bash /opt/nodeagent/deploy/runtime/setup.sh 2>&1); then
  pass "deploy/runtime/setup.sh: runc back on cgroupfs"
else
  fail "deploy/runtime/setup.sh: runc back on cgroupfs"; printf '%s\n' "$out" | tail -n 20
fi
kubeadm_uninstalled() {
  dx bash /opt/nodeagent/deploy/uninstall.sh >/dev/null || return 1
  dx test ! -e /usr/bin/kubelet || { echo "/usr/bin/kubelet left"; return 1; }
  dx test ! -e /etc/systemd/system/kubelet.service || { echo "kubelet.service left"; return 1; }
}
check "deploy/uninstall.sh removes kubelet.service and /usr/bin/kubelet" kubeadm_uninstalled
dx rm -rf /etc/systemd/system/kubelet.service.d /var/lib/kubelet/config.yaml /var/lib/kubelet/kubeadm-flags.env /etc/default/kubelet
dx systemctl daemon-reload

# ------------------------------------------------------------------ API pods through an outage
# config-source keeps the API server's last pod list in <root-dir>/config-source/api-pods.json
# (0600) so that a restart during an API server outage runs the same pods and shows them
# (the README's promise). Under the units' ProtectSystem=strict it must still be written:
# shown with the test API server (tests/src/bin/test-apiserver.rs) in the node, plain HTTP
# on loopback, and a pod bound to this node.
APISERVER=http://127.0.0.1:8080
start_apiserver() {
  dx systemd-run --quiet --unit nodeagent-test-apiserver /opt/nodeagent/bin/nodeagent-test-apiserver --port 8080 --no-controllers
}
start_apiserver
dsh "printf '%s\n' 'apiVersion: v1' 'kind: Config' 'clusters:' '- name: test' '  cluster:' '    server: $APISERVER' \
  'users:' '- name: node' '  user: {}' 'contexts:' '- name: test' '  context: {cluster: test, user: node}' \
  'current-context: test' >/etc/nodeagent/api.kubeconfig"
dsh 'sed -i "s|^NODEAGENT_ARGS=.*|NODEAGENT_ARGS=--kubeconfig=/etc/nodeagent/api.kubeconfig|" /etc/nodeagent/nodeagent.env'
if out=$(dx bash /opt/nodeagent/deploy/install.sh --runtime /opt/nodeagent/bin 2>&1); then
  pass "deploy/install.sh again, with --kubeconfig naming the test API server in the node"
else
  fail "deploy/install.sh again, with --kubeconfig naming the test API server in the node"; printf '%s\n' "$out" | tail -n 20
fi
node_name=$(dx hostname)
api_pod_json='{"apiVersion":"v1","kind":"Pod","metadata":{"name":"api-pod","namespace":"default"},"spec":{"nodeName":"'$node_name'","terminationGracePeriodSeconds":1,"containers":[{"name":"main","image":"busybox:1.36","command":["sleep","3600"]}]}}'
api_pod_created() {
  dx curl -sf -X POST -H 'Content-Type: application/json' -d "$api_pod_json" "$APISERVER/api/v1/namespaces/default/pods" >/dev/null \
    || dx curl -sf "$APISERVER/api/v1/namespaces/default/pods/api-pod" >/dev/null
}
check "a pod bound to the node is created at the test API server" wait_until 60 api_pod_created
api_pod_running() {
  dx curl -sf "$APISERVER/api/v1/namespaces/default/pods/api-pod" | grep -q '"phase":"Running"'
}
t=$SECONDS
if wait_until 120 api_pod_running; then
  pass "the API pod runs, its status Running at the API server ($((SECONDS - t)) s)"
else
  fail "the API pod runs, its status Running at the API server"
  dsh "journalctl -u nodeagent-config-source -u nodeagent-pod-sync -n 30 --no-pager" || true
fi
checkpoint_written() {
  local f=/var/lib/kubelet/config-source/api-pods.json
  [ "$(dx stat -c %a "$f" 2>/dev/null)" = 600 ] || { echo "$f: $(dx stat -c %a "$f" 2>&1)"; return 1; }
  dx grep -q '"api-pod"' "$f" || { echo "$f does not hold api-pod"; return 1; }
}
check "config-source wrote its checkpoint under ProtectSystem=strict (api-pods.json, 0600, holds the pod)" wait_until 30 checkpoint_written
with_api=$(snapshot)
dx systemctl stop nodeagent-test-apiserver
dx systemctl restart nodeagent-config-source.service
restored() {
  dsh "journalctl -u nodeagent-config-source --since '-60s' --no-pager | grep -q \"serving the API server's last list until it answers\""
}
check "API server down, config-source restarted: it serves the checkpointed list" wait_until 60 restored
check "API server down, config-source restarted: every pod, the API pod too, untouched (containers and PIDs)" stays_same 10 "$with_api" snapshot
# The API server back, empty (its state was in memory): the API's word is final, the pod goes.
start_apiserver
api_pod_removed() {
  local dirs
  dirs=$(dsh "ls -d /var/log/pods/default_api-pod_* 2>/dev/null" || true)
  [ -z "$dirs" ] || { echo "left: $dirs"; return 1; }
}
check "the API server back without the pod: the node removes it (its log directory gone)" wait_until 90 api_pod_removed
dx systemctl stop nodeagent-test-apiserver
dsh 'sed -i "s|^NODEAGENT_ARGS=.*|NODEAGENT_ARGS=|" /etc/nodeagent/nodeagent.env; rm -f /etc/nodeagent/api.kubeconfig'
# As the kubeadm section left it: the agent uninstalled (its configuration kept), so that
# the next install starts the units afresh with the next configuration.
dx bash /opt/nodeagent/deploy/uninstall.sh >/dev/null || fail "deploy/uninstall.sh after the API pod section"

# ------------------------------------------------------------------ the Debian package
# deploy/package/build-deb.sh's package, built on this machine twice (the second a later
# version), used on the node as an operator does: `dpkg -i` with flags they seeded in
# nodeagent.env (--force-confold keeps it), the example pod; `dpkg -i` of the later version
# with the pod running (each service restarted onto it, the pod untouched, the operator's
# conffile kept); `dpkg --purge` (binaries, units, configuration and PKI gone; the pod's
# containers run on, as upstream's kubelet package leaves them).
t=$SECONDS
mkdir -p "$stage/pkg"
pkg_new=$(bash deploy/package/build-deb.sh --out "$stage/pkg" "$stage/bin") || fail "deploy/package/build-deb.sh"
pkg_version=$(dpkg-deb -f "$pkg_new" Version)
pkg_old=$(bash deploy/package/build-deb.sh --version "$pkg_version~previous" --out "$stage/pkg" "$stage/bin") \
  || fail "deploy/package/build-deb.sh --version"
tar -C "$stage" -c pkg | docker exec -i "$NAME" tar -C /opt/nodeagent -x
info "packages built in $((SECONDS - t)) s: $(basename "$pkg_old"), $(basename "$pkg_new")"
# The configuration the sections above kept is install.sh's (put back after the purge):
# the package installs its own, but for the flags the operator seeds (this node's runtime
# is nodeagent-containerd's).
dx mkdir -p /root/install-config
dx mv /etc/nodeagent/kubelet-config.yaml /etc/nodeagent/nodeagent.env /root/install-config/
dsh 'printf "NODEAGENT_ARGS=--container-runtime-endpoint=unix:///run/nodeagent-containerd/containerd.sock\n" >/etc/nodeagent/nodeagent.env'
t=$SECONDS
if out=$(dx dpkg --force-confold -i "/opt/nodeagent/pkg/$(basename "$pkg_old")" 2>&1); then
  pass "dpkg -i: the package installs ($((SECONDS - t)) s)"
else
  fail "dpkg -i: the package installs"; printf '%s\n' "$out" | tail -n 20 | sed 's/^/    /'
fi
pkg_installed() {
  local u bad=""
  dx test -x /usr/bin/nodeagent || { echo "/usr/bin/nodeagent missing"; return 1; }
  [ "$(dx readlink /usr/bin/kubelet)" = nodeagent ] || { echo "/usr/bin/kubelet is not the link"; return 1; }
  dx grep -q '^ExecStart=/usr/bin/nodeagent-pod-sync ' /lib/systemd/system/nodeagent-pod-sync.service \
    || { echo "nodeagent-pod-sync.service does not run /usr/bin/nodeagent-pod-sync"; return 1; }
  dx grep -q '^containerRuntimeEndpoint: unix:///run/containerd/containerd.sock$' /etc/nodeagent/kubelet-config.yaml \
    || { echo "the packaged configuration lacks upstream's runtime endpoint"; return 1; }
  dx systemctl is-enabled --quiet kubelet.target || { echo "kubelet.target not enabled"; return 1; }
  for u in kubelet.target "${ALL_UNITS[@]}"; do [ "$(dx systemctl is-active "$u")" = active ] || bad+=" $u"; done
  [ -z "$bad" ] || { echo "not active:$bad"; return 1; }
}
check "the package's binary, links, units and configuration in place; kubelet.target enabled, the seven active" \
  wait_until 60 pkg_installed
web_running() {
  dx $KAPI/pods | python3 -c 'import json, sys
pods = json.load(sys.stdin)["items"]
sys.exit(0 if any(p["metadata"]["name"].startswith("web-") and p["status"].get("phase") == "Running" for p in pods) else 1)'
}
check "the example pod runs under the package's services" wait_until 120 web_running
main_pids() { local u; for u in "${ALL_UNITS[@]}"; do dx systemctl show -p MainPID --value "$u"; done; }
# dpkg -i of the later package, NAME the check's words; $pids_before and $before are taken
# just before it.
upgrade_package() {
  local t=$SECONDS out
  pids_before=$(main_pids)
  before=$(snapshot)
  if out=$(dx dpkg -i "/opt/nodeagent/pkg/$(basename "$pkg_new")" 2>&1); then
    pass "$1 ($((SECONDS - t)) s)"
  else
    fail "$1"; printf '%s\n' "$out" | tail -n 20 | sed 's/^/    /'
  fi
}
# The later version installed and each of the seven restarted (a new PID) and active.
seven_upgraded() {
  local u now bad="" i=0
  [ "$(dx dpkg-query -W -f '${Version}' nodeagent)" = "$pkg_version" ] || { echo "installed: $(dx dpkg-query -W nodeagent)"; return 1; }
  now=$(main_pids)
  for u in "${ALL_UNITS[@]}"; do
    i=$((i + 1))
    if [ "$(sed -n "${i}p" <<<"$now")" = "$(sed -n "${i}p" <<<"$pids_before")" ] \
      || [ "$(dx systemctl is-active "$u")" != active ]; then bad+=" $u"; fi
  done
  [ -z "$bad" ] || { echo "not restarted, or not active:$bad"; return 1; }
}
upgrade_package "dpkg -i of the later version: the package upgrades"
upgraded() {
  seven_upgraded || return 1
  dx grep -q container-runtime-endpoint /etc/nodeagent/nodeagent.env || { echo "the operator's nodeagent.env was replaced"; return 1; }
}
check "upgraded: the later version, each of the seven restarted and active, the operator's nodeagent.env kept" \
  wait_until 60 upgraded
check "the upgrade leaves the pod's containers and PIDs untouched" stays_same 3 "$before" snapshot
check "the pod still Running after the upgrade" wait_until 60 web_running
t=$SECONDS
if out=$(dx dpkg --purge nodeagent 2>&1); then
  pass "dpkg --purge nodeagent ($((SECONDS - t)) s)"
else
  fail "dpkg --purge nodeagent"; printf '%s\n' "$out" | tail -n 20 | sed 's/^/    /'
fi
purged() {
  local u left
  # (/etc/nodeagent itself stays: setup.sh's containerd configuration is in it.)
  left=$(dx bash -c 'ls -d /usr/bin/nodeagent /usr/bin/nodeagent-pod-sync /usr/bin/kubelet /lib/systemd/system/kubelet.target \
    /lib/systemd/system/nodeagent-pod-sync.service /etc/nodeagent/kubelet-config.yaml /etc/nodeagent/nodeagent.env \
    /etc/nodeagent/pki /etc/sysctl.d/60-nodeagent.conf /run/nodeagent 2>/dev/null' || true)
  [ -z "$left" ] || { echo "left: $left"; return 1; }
  for u in "${ALL_UNITS[@]}"; do [ "$(dx systemctl is-active "$u")" != active ] || { echo "$u active"; return 1; }; done
  ! dx dpkg-query -W nodeagent >/dev/null 2>&1 || { echo "dpkg still knows nodeagent"; return 1; }
}
check "purged: binaries, links, units, configuration, PKI and sockets gone; the seven stopped" purged
check "the pod's containers run on after the purge (containers and PIDs untouched)" stays_same 3 "$before" snapshot

# ------------------------------------------------------------------ kubeadm join, with the package
# A worker joining a cluster as kubeadm makes one: the package installed on a node with the
# kubeadm package's drop-in (kubelet.service crash-loops, no config yet), then what `kubeadm
# join` writes (cmd/kubeadm/app/cmd/phases/join/kubelet.go: /etc/kubernetes/pki/ca.crt,
# bootstrap-kubelet.conf with the bootstrap token as user tls-bootstrap-token-user,
# config.yaml, kubeadm-flags.env) and its `systemctl restart kubelet`. The API server is the
# test API server in the node over TLS (tests/src/bin/test-apiserver.rs --tls-dir): client
# certificates authenticate, the bootstrap token only as system:bootstrap:<id>, and client
# CSRs are approved as kube-controller-manager's csrapproving does for kubeadm's RBAC. Shown:
# the CSR from the token approved and signed, /etc/kubernetes/kubelet.conf written as
# upstream writes it (kubelet-client-current.pem), the Node Ready, a pod with its service
# account's token running; the package upgraded under it (the seven restarted, nothing
# disturbed, still Ready); purged (the pods run on).
JOIN_TOKEN=abcdef.0123456789abcdef
APIS=https://127.0.0.1:6443
ADMIN="curl -sf --cacert /root/apiserver/ca.crt --cert /root/apiserver/admin.crt --key /root/apiserver/admin.key"
t=$SECONDS
dx rm -rf /root/apiserver /etc/kubernetes/kubelet.conf /etc/kubernetes/bootstrap-kubelet.conf /etc/kubernetes/pki \
  /var/lib/kubelet/pki/kubelet-client-current.pem /var/lib/kubelet/pki/kubelet-client-*.pem
dx systemd-run --quiet --unit nodeagent-test-apiserver-tls /opt/nodeagent/bin/nodeagent-test-apiserver \
  --port 6443 --tls-dir /root/apiserver --bootstrap-token "$JOIN_TOKEN"
apiserver_tls_up() { dx $ADMIN "$APIS/api/v1/nodes" >/dev/null; }
check "the test API server over TLS in the node answers an administrator's client certificate" wait_until 30 apiserver_tls_up
dx mkdir -p /etc/systemd/system/kubelet.service.d /etc/kubernetes/pki /var/lib/kubelet
dx install -m 0644 /opt/nodeagent/deploy/examples/kubeadm/10-kubeadm.conf /etc/systemd/system/kubelet.service.d/10-kubeadm.conf
if out=$(dx dpkg -i "/opt/nodeagent/pkg/$(basename "$pkg_old")" 2>&1); then
  pass "dpkg -i on a node with kubeadm's drop-in ($((SECONDS - t)) s)"
else
  fail "dpkg -i on a node with kubeadm's drop-in"; printf '%s\n' "$out" | tail -n 20 | sed 's/^/    /'
fi
pkg_waits_for_join() {
  [ "$(dx systemctl is-enabled kubelet.service)" = enabled ] || { echo "kubelet.service $(dx systemctl is-enabled kubelet.service)"; return 1; }
  ! dx systemctl is-enabled --quiet kubelet.target || { echo "kubelet.target enabled on a kubeadm node"; return 1; }
  dsh "journalctl --no-pager -u kubelet --since '-120s' | grep -q 'failed to read kubelet config file \"/var/lib/kubelet/config.yaml\"'" \
    || { echo "kubelet.service is not waiting for config.yaml"; return 1; }
}
check "the package enables kubelet.service (not the target) on a kubeadm node; it waits for config.yaml" wait_until 40 pkg_waits_for_join
# What `kubeadm join` writes, then its restart of the kubelet.
dsh "cp /root/apiserver/ca.crt /etc/kubernetes/pki/ca.crt && cat >/etc/kubernetes/bootstrap-kubelet.conf <<KUBECONFIG
apiVersion: v1
clusters:
- cluster:
    certificate-authority-data: \$(base64 -w0 /etc/kubernetes/pki/ca.crt)
    server: $APIS
  name: kubernetes
contexts:
- context:
    cluster: kubernetes
    user: tls-bootstrap-token-user
  name: tls-bootstrap-token-user@kubernetes
current-context: tls-bootstrap-token-user@kubernetes
kind: Config
preferences: {}
users:
- name: tls-bootstrap-token-user
  user:
    token: $JOIN_TOKEN
KUBECONFIG"
dsh 'chmod 0600 /etc/kubernetes/bootstrap-kubelet.conf'
dsh 'echo "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///run/nodeagent-containerd/containerd.sock --pod-infra-container-image=registry.k8s.io/pause:3.10\"" >/var/lib/kubelet/kubeadm-flags.env'
# The cluster's kubelet-config as kubeadm writes it, but cgroupfs: this node's containerd is
# back on cgroupfs (the systemd driver is shown in the kubeadm section above).
dsh 'sed -e "/^resolvConf:/d" -e "s/^cgroupDriver: systemd$/cgroupDriver: cgroupfs/" /opt/nodeagent/deploy/examples/kubeadm/config.yaml >/var/lib/kubelet/config.yaml'
dx systemctl restart kubelet
node_name=$(dx hostname)
joined() {
  local csrs conf
  csrs=$(dx $ADMIN "$APIS/apis/certificates.k8s.io/v1/certificatesigningrequests") || { echo "no CSR list"; return 1; }
  python3 -c 'import json, sys
node = sys.argv[1]
csrs = [c for c in json.load(sys.stdin)["items"] if c["spec"].get("username") == "system:bootstrap:abcdef"]
ok = [c for c in csrs if c["spec"]["signerName"] == "kubernetes.io/kube-apiserver-client-kubelet"
      and any(x["type"] == "Approved" for x in c["status"].get("conditions", [])) and c["status"].get("certificate")]
if not ok:
    sys.exit("no approved and signed client CSR from system:bootstrap:abcdef: %s" % [(c["metadata"]["name"], c["status"]) for c in csrs])' "$node_name" <<<"$csrs" || return 1
  conf=$(dx cat /etc/kubernetes/kubelet.conf 2>/dev/null) || { echo "no /etc/kubernetes/kubelet.conf"; return 1; }
  grep -qE '^ *client-certificate: "?/var/lib/kubelet/pki/kubelet-client-current.pem"?$' <<<"$conf" \
    || { echo "kubelet.conf does not name kubelet-client-current.pem: $conf"; return 1; }
  dx openssl x509 -noout -subject -in /var/lib/kubelet/pki/kubelet-client-current.pem | grep -q "CN *= *system:node:$node_name" \
    || { echo "kubelet-client-current.pem: $(dx openssl x509 -noout -subject -in /var/lib/kubelet/pki/kubelet-client-current.pem 2>&1)"; return 1; }
  dx $ADMIN "$APIS/api/v1/nodes/$node_name" | python3 -c 'import json, sys
n = json.load(sys.stdin)
ready = [c for c in n["status"].get("conditions", []) if c["type"] == "Ready"]
sys.exit(0 if ready and ready[0]["status"] == "True" else "Node Ready: %s" % ready)' || return 1
}
check_within "kubeadm join's files and systemctl restart kubelet: the token's CSR approved and signed, kubelet.conf as upstream writes it, the Node Ready" \
  120 joined || dsh "journalctl --no-pager -u kubelet -u nodeagent-node-status -u nodeagent-test-apiserver-tls -n 40" || true
# A pod with its namespace's default service account (the API server's admission mounts the
# kube-api-access projected volume); restartPolicy Never and a command that exits unless
# the token is there: Running means the token was mounted.
sa_pod_json='{"apiVersion":"v1","kind":"Pod","metadata":{"name":"joined-pod","namespace":"default"},"spec":{"nodeName":"'$node_name'","restartPolicy":"Never","terminationGracePeriodSeconds":1,"containers":[{"name":"main","image":"busybox:1.36","command":["sh","-c","test -s /var/run/secrets/kubernetes.io/serviceaccount/token && test -s /var/run/secrets/kubernetes.io/serviceaccount/ca.crt && exec sleep 3600"]}]}}'
dx $ADMIN -X POST -H 'Content-Type: application/json' -d "$sa_pod_json" "$APIS/api/v1/namespaces/default/pods" >/dev/null \
  || fail "the pod is created at the API server over TLS"
sa_pod_running() {
  dx $ADMIN "$APIS/api/v1/namespaces/default/pods/joined-pod" | python3 -c 'import json, sys
p = json.load(sys.stdin)
vols = [v["name"] for v in p["spec"].get("volumes", []) if v["name"].startswith("kube-api-access-")]
ready = [c["status"] for c in p["status"].get("conditions", []) if c["type"] == "Ready"]
if not vols: sys.exit("no kube-api-access volume: %s" % p["spec"].get("volumes"))
sys.exit(0 if p["status"].get("phase") == "Running" and ready == ["True"] else "phase %s, Ready %s" % (p["status"].get("phase"), ready))'
}
check_within "a pod with its service account's token runs on the joined node, Running and Ready at the API server" \
  120 sa_pod_running || dsh "journalctl --no-pager -u nodeagent-volume -u nodeagent-pod-sync -n 30" || true
serial_before=$(dx openssl x509 -noout -serial -in /var/lib/kubelet/pki/kubelet-client-current.pem 2>&1)
upgrade_package "dpkg -i of the later version on the joined node"
joined_upgraded() {
  seven_upgraded || return 1
  [ "$(dx systemctl is-active kubelet.service)" = active ] || { echo "kubelet.service $(dx systemctl is-active kubelet.service)"; return 1; }
}
check "upgraded on the joined node: each of the seven restarted and active, kubelet.service active" wait_until 60 joined_upgraded
check "the upgrade leaves the joined node's pods untouched (containers and PIDs)" stays_same 3 "$before" snapshot
client_serial() { dx openssl x509 -noout -serial -in /var/lib/kubelet/pki/kubelet-client-current.pem; }
still_joined() {
  joined && sa_pod_running || return 1
  [ "$(client_serial)" = "$serial_before" ] || { echo "client certificate $(client_serial), was $serial_before"; return 1; }
}
check "after the upgrade: the pod still Running and Ready, the Node Ready, the same client certificate" wait_until 60 still_joined
bootstraps() {
  dx $ADMIN "$APIS/apis/certificates.k8s.io/v1/certificatesigningrequests" \
    | python3 -c 'import json, sys; print(sum(c["spec"].get("username") == "system:bootstrap:abcdef" for c in json.load(sys.stdin)["items"]))'
}
n=$(bootstraps)
[ "$n" = 1 ] && pass "one bootstrap CSR in all: the restarts and the upgrade used the issued certificate" \
  || fail "one bootstrap CSR in all: the restarts and the upgrade used the issued certificate (saw $n)"
t=$SECONDS
if out=$(dx dpkg --purge nodeagent 2>&1); then
  pass "dpkg --purge nodeagent on the joined node ($((SECONDS - t)) s)"
else
  fail "dpkg --purge nodeagent on the joined node"; printf '%s\n' "$out" | tail -n 20 | sed 's/^/    /'
fi
check "purged on the joined node: binaries, links, units, configuration, PKI and sockets gone; the seven stopped" purged
check "the joined node's pods run on after the purge (containers and PIDs untouched)" stays_same 3 "$before" snapshot
dx systemctl stop nodeagent-test-apiserver-tls
dx rm -rf /etc/systemd/system/kubelet.service.d /var/lib/kubelet/config.yaml /var/lib/kubelet/kubeadm-flags.env \
  /etc/kubernetes/kubelet.conf /etc/kubernetes/bootstrap-kubelet.conf /root/apiserver
dx systemctl daemon-reload

dx mv /root/install-config/kubelet-config.yaml /root/install-config/nodeagent.env /etc/nodeagent/

# ------------------------------------------------------------------ graceful node shutdown
# logind in the node, the agent installed again with shutdownGracePeriod 20s (8s of it for
# critical pods), a regular and a critical pod that note their SIGTERM and their exit (3 s
# later) in a directory of this machine, then `systemctl poweroff`: the regular pod must be
# stopped and gone before the critical one gets its SIGTERM, both within their grace,
# before the node powers off. /pods is captured during the shutdown.
dx systemctl unmask systemd-logind.service >/dev/null 2>&1
dx systemctl start systemd-logind.service
dsh "printf 'shutdownGracePeriod: 20s\nshutdownGracePeriodCriticalPods: 8s\n' >>/etc/nodeagent/kubelet-config.yaml"
if out=$(dx bash /opt/nodeagent/deploy/install.sh --runtime /opt/nodeagent/bin 2>&1); then
  pass "deploy/install.sh again, with shutdownGracePeriod 20s"
else
  fail "deploy/install.sh again, with shutdownGracePeriod 20s"; printf '%s\n' "$out" | tail -n 20
fi
shutdown_pod() { # NAME [EXTRA-SPEC-LINE]
  local up='$(cut -d" " -f1 /proc/uptime)'
  printf '%s\n' "apiVersion: v1" "kind: Pod" "metadata:" "  name: $1" "spec:" \
    "  terminationGracePeriodSeconds: 30" ${2:+"  $2"} \
    "  volumes:" "  - name: out" "    hostPath:" "      path: /var/lib/nodeagent-shutdown-test" \
    "      type: Directory" "  containers:" "  - name: main" "    image: busybox:1.36" \
    "    command:" "    - sh" "    - -c" "    - |" \
    "      trap 'echo $1 TERM $up >>/out/order; sleep 3; echo $1 done $up >>/out/order; exit 0' TERM" \
    "      while true; do sleep 0.2; done" \
    "    volumeMounts:" "    - name: out" "      mountPath: /out"
}
shutdown_pod regular | docker exec -i "$NAME" tee /etc/kubernetes/manifests/regular.yaml >/dev/null
shutdown_pod critical "priority: 2000001000" | docker exec -i "$NAME" tee /etc/kubernetes/manifests/critical.yaml >/dev/null
pods_running() {
  local pods
  pods=$(dx $KAPI/pods) || return 1
  python3 -c 'import json, sys
pods = json.load(sys.stdin)["items"]
phase = {p["metadata"]["name"].split("-")[0]: p["status"].get("phase") for p in pods}
sys.exit(0 if phase.get("regular") == "Running" and phase.get("critical") == "Running" else 1)' <<<"$pods"
}
check "the regular and the critical pod run" wait_until 120 pods_running
inhibitor_held() {
  local list delay
  list=$(dx systemd-inhibit --list --no-pager 2>&1)
  grep -q 'kubelet.*shutdown.*Kubelet needs time to handle node shutdown.*delay' <<<"$list" || { echo "$list"; return 1; }
  delay=$(dx busctl get-property org.freedesktop.login1 /org/freedesktop/login1 org.freedesktop.login1.Manager InhibitDelayMaxUSec)
  [ "$delay" = "t 20000000" ] || { echo "InhibitDelayMaxUSec: $delay"; return 1; }
  dx grep -q '^InhibitDelayMaxSec=20$' /etc/systemd/logind.conf.d/99-kubelet.conf
}
check "pod-sync holds logind's delay lock and raised InhibitDelayMaxSec to 20 s" wait_until 30 inhibitor_held
# /pods, every 0.3 s, into this machine's directory while the node shuts down.
docker exec -d "$NAME" bash -c "d=/var/lib/nodeagent-shutdown-test; while :; do $KAPI/pods >\$d/pods.tmp && mv \$d/pods.tmp \$d/pods.json; sleep 0.3; done"
t=$SECONDS
dx systemctl poweroff >/dev/null 2>&1 || true
powered_off() { [ "$(docker inspect -f '{{.State.Running}}' "$NAME" 2>/dev/null)" = false ]; }
if wait_until 90 powered_off; then
  pass "systemctl poweroff: the node powers off ($((SECONDS - t)) s)"
else
  fail "systemctl poweroff: the node powers off"
fi
order_ok() {
  python3 - "$stage/shutdown/order" <<'PY'
import sys
lines = [l.split() for l in open(sys.argv[1]).read().splitlines() if l.strip()]
at = {(name, what): float(t) for name, what, t in lines}
print("  order:", " | ".join(" ".join(l) for l in lines))
need = [("regular", "TERM"), ("regular", "done"), ("critical", "TERM"), ("critical", "done")]
missing = [k for k in need if k not in at]
if missing:
    sys.exit(f"missing {missing}")
if at[("critical", "TERM")] < at[("regular", "done")]:
    sys.exit("the critical pod got SIGTERM before the regular pod had stopped")
PY
}
check "regular pods stop first, critical ones after, each within its grace, before the power goes" order_ok
pods_terminated() {
  python3 - "$stage/shutdown/pods.json" <<'PY'
import json, sys
pods = json.load(open(sys.argv[1]))["items"]
want = "Pod was terminated in response to imminent node shutdown."
seen = 0
for p in pods:
    name = p["metadata"]["name"]
    if name.startswith(("regular", "critical")):
        seen += 1
        s = p["status"]
        if (s.get("phase"), s.get("reason"), s.get("message")) != ("Failed", "Terminated", want):
            sys.exit(f"{name}: {s.get('phase')} {s.get('reason')} {s.get('message')}")
        conds = {c["type"]: c for c in s.get("conditions", [])}
        if conds.get("DisruptionTarget", {}).get("reason") != "TerminationByKubelet":
            sys.exit(f"{name}: no DisruptionTarget condition")
if seen != 2:
    sys.exit(f"{seen} of the 2 pods listed")
PY
}
check "/pods during the shutdown: both Failed, reason Terminated, upstream's message, DisruptionTarget" pods_terminated

summary
