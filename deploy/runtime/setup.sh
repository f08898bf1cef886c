#!/usr/bin/env bash
# Prepare a real container runtime for the node agent on Debian 12 (root).
#
# - installs containerd, runc, CNI plugins, umoci, busybox-static, ... from apt
# - writes a containerd config (own root/state/socket, CRI plugin enabled) and a
#   CNI bridge conflist under /etc/nodeagent
# - starts that containerd instance in the background (no systemd needed), next
#   to (and independent of) docker's own containerd; where systemd runs and
#   nodeagent-containerd.service is enabled (deploy/install.sh --runtime), through systemd
# - builds registry.k8s.io/pause:3.9 and docker.io/library/busybox:1.36 locally
#   with umoci (no registry is reachable) and imports them into namespace k8s.io
#
# - with NODEAGENT_TEST_RUNTIMES=N (deploy/test.sh sets it), N more instances for the test
#   suite, each with its own config, root, state, socket, CNI bridge and subnet and the
#   images imported: /run/nodeagent-containerd-test<i>/containerd.sock, bridge
#   nodeagent<i>, 10.<88+i>.0.0/16. The harness (tests/src/runtime.rs) hands each test a
#   free instance, so tests that start a node run side by side. They are always started
#   by this script (never by systemd): they exist for the tests only.
#
# Idempotent: re-running it only checks that everything is in place.
# Environment overrides: NODEAGENT_FORCE_IMAGES=1 rebuilds/re-imports the images;
# NODEAGENT_SYSTEMD_CGROUP=true configures the main instance's runc for the systemd cgroup
# driver (cgroupDriver: systemd), false (the default) for cgroupfs.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

CNI_BIN_DIR=/usr/lib/cni
# The images are built once, into the main instance's root, and imported into every instance.
BUILD_DIR=/var/lib/nodeagent-containerd/image-build
NS=k8s.io
PAUSE_IMAGE=registry.k8s.io/pause:3.9
BUSYBOX_IMAGE=docker.io/library/busybox:1.36
START_TIMEOUT=${NODEAGENT_CONTAINERD_START_TIMEOUT:-30}
TEST_RUNTIMES=${NODEAGENT_TEST_RUNTIMES:-0}
# A second runtime handler, `runc-audited` (for RuntimeClass): runc through a wrapper that
# records every call it gets, so that a pod's handler can be seen at work.
AUDITED_HANDLER=runc-audited

# instance_vars N: the paths of instance N (0: the main one, which up.sh and operators use;
# 1..: the test suite's), as the globals every step below reads.
instance_vars() {
  INSTANCE=$1
  local sfx=""
  [ "$INSTANCE" -eq 0 ] || sfx="-test$INSTANCE"
  CONF_DIR=/etc/nodeagent/containerd$sfx
  CONFIG="$CONF_DIR/config.toml"
  CNI_CONF_DIR=/etc/nodeagent/cni$sfx/net.d
  CNI_CONFLIST="$CNI_CONF_DIR/10-nodeagent.conflist"
  ROOT_DIR=/var/lib/nodeagent-containerd$sfx
  RUN_DIR=/run/nodeagent-containerd$sfx
  STATE_DIR="$RUN_DIR/state"
  SOCK="$RUN_DIR/containerd.sock"
  PIDFILE="$RUN_DIR/containerd.pid"
  LOG=/var/log/nodeagent-containerd$sfx.log
  AUDITED_RUNC=/usr/local/libexec/nodeagent/runc-audited$sfx
  AUDIT_LOG="$RUN_DIR/runc-audited.log"
  if [ "$INSTANCE" -eq 0 ]; then BRIDGE=nodeagent0; else BRIDGE=nodeagent$INSTANCE; fi
  SUBNET=10.$((88 + INSTANCE)).0.0/16
}

PACKAGES=(containerd runc containernetworking-plugins umoci busybox-static
  protobuf-compiler iptables gcc libc6-dev)
# kubectl for tests/tests/suite/kubectl.rs: Debian's kubernetes-client, unless one is on PATH.
command -v kubectl >/dev/null || PACKAGES+=(kubernetes-client)

log() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "must run as root"
command -v dpkg-query >/dev/null || die "this script expects a Debian system (dpkg/apt)"

ctr_() { ctr --address "$SOCK" "$@"; }
# ctr retries dialing for 10s by default when nothing listens: check the socket
# file first and bound the dial.
containerd_answers() { [ -S "$SOCK" ] && ctr --connect-timeout 2s --address "$SOCK" version >/dev/null 2>&1; }

# Pid of *our* containerd: the process whose command line names our config.
find_our_pid() {
  local p cmd d
  if [ -s "$PIDFILE" ]; then
    p=$(cat "$PIDFILE")
    cmd=$(tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline") || cmd=
    case "$cmd" in *"containerd --config $CONFIG"*) echo "$p"; return 0 ;; esac
  fi
  for d in /proc/[0-9]*; do
    cmd=$(tr '\0' ' ' 2>/dev/null <"$d/cmdline") || continue
    case "$cmd" in
      containerd\ --config\ "$CONFIG"*|*/containerd\ --config\ "$CONFIG"*) echo "${d#/proc/}"; return 0 ;;
    esac
  done
  return 1
}

# Write $2 (content) to $1 only if it differs; returns 0 if the file changed.
write_if_changed() {
  local dest=$1 content=$2 tmp
  tmp=$(mktemp "$dest.XXXXXX")
  printf '%s\n' "$content" >"$tmp"
  if [ -f "$dest" ] && cmp -s "$tmp" "$dest"; then
    rm -f "$tmp"; return 1
  fi
  chmod 0644 "$tmp"
  mv -f "$tmp" "$dest"
  return 0
}

# ---------------------------------------------------------------- 1. packages
missing=()
for p in "${PACKAGES[@]}"; do
  if [ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)" != installed ]; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt_log=$(mktemp /tmp/nodeagent-apt.XXXXXX)
  apt-get update -qq >"$apt_log" 2>&1 \
    || { tail -n 20 "$apt_log" >&2; die "apt-get update failed"; }
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >>"$apt_log" 2>&1 \
    || { tail -n 20 "$apt_log" >&2; die "apt-get install ${missing[*]} failed"; }
  rm -f "$apt_log"
else
  log "packages already installed"
fi
for b in containerd ctr runc umoci gcc iptables; do
  command -v "$b" >/dev/null || die "$b not found after package installation"
done
[ -x /bin/busybox ] || die "/bin/busybox (busybox-static) not found"
for p in bridge host-local portmap firewall loopback; do
  [ -x "$CNI_BIN_DIR/$p" ] || die "CNI plugin $CNI_BIN_DIR/$p missing"
done

# ---------------------------------------------------------------- 2. containerd config
# AppArmor: only usable if the kernel has it enabled and the parser exists.
if [ "$(cat /sys/module/apparmor/parameters/enabled 2>/dev/null || true)" = Y ] \
   && command -v apparmor_parser >/dev/null; then
  disable_apparmor=false
else
  disable_apparmor=true
fi
# Negative oom_score_adj values (upstream's -997 for Guaranteed pods, -998 for the pause
# container) reach containers only if containerd is not told to clamp them at its own
# value, and only where this machine lets root lower a process's score.
if (echo -998 >/proc/self/oom_score_adj) 2>/dev/null; then
  restrict_oom_score_adj=false
else
  restrict_oom_score_adj=true
fi

# Pick the newest CNI spec version that all used plugins support.
cni_version=0.4.0
supports_100=true
for p in bridge host-local portmap firewall; do
  out=$(echo '{"cniVersion":"0.4.0"}' | CNI_COMMAND=VERSION "$CNI_BIN_DIR/$p" 2>/dev/null || true)
  case "$out" in *'"1.0.0"'*) ;; *) supports_100=false ;; esac
done
$supports_100 && cni_version=1.0.0

# configure_instance: writes the current instance's runc wrapper, containerd config and CNI
# conflist; sets config_changed.
configure_instance() {
mkdir -p "$CONF_DIR" "$CNI_CONF_DIR" "$ROOT_DIR" "$STATE_DIR" "$RUN_DIR"

# The second handler's wrapper.
mkdir -p "$(dirname "$AUDITED_RUNC")"
wrapper_content=$(cat <<EOF
#!/bin/sh
# The $AUDITED_HANDLER runtime handler (written by deploy/runtime/setup.sh): runc, with each
# call recorded in $AUDIT_LOG.
echo "\$*" >> $AUDIT_LOG
exec $(command -v runc) "\$@"
EOF
)
if write_if_changed "$AUDITED_RUNC" "$wrapper_content"; then
  log "wrote $AUDITED_RUNC"
fi
chmod 0755 "$AUDITED_RUNC"

# The runc handlers' cgroup driver: with NODEAGENT_SYSTEMD_CGROUP=true runc makes the
# containers systemd scopes inside the pods' slices (SystemdCgroup = true), as a node with
# cgroupDriver: systemd needs; the main instance only (the test instances stay cgroupfs).
systemd_cgroup=false
if [ "$INSTANCE" -eq 0 ] && [ "${NODEAGENT_SYSTEMD_CGROUP:-false}" = true ]; then
  systemd_cgroup=true
fi
config_content=$(cat <<EOF
# Generated by deploy/runtime/setup.sh -- do not edit by hand.
# A containerd instance for the node agent, separate from docker's containerd.
version = 2
root = "$ROOT_DIR"
state = "$STATE_DIR"
oom_score = 0

[grpc]
  address = "$SOCK"
  uid = 0
  gid = 0

[ttrpc]
  address = "$SOCK.ttrpc"
  uid = 0
  gid = 0

[debug]
  address = "$RUN_DIR/debug.sock"
  level = "info"

[metrics]
  address = ""

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "$PAUSE_IMAGE"
    restrict_oom_score_adj = $restrict_oom_score_adj
    netns_mounts_under_state_dir = true
    disable_apparmor = $disable_apparmor
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    enable_selinux = false
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = $systemd_cgroup
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.$AUDITED_HANDLER]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.$AUDITED_HANDLER.options]
          SystemdCgroup = $systemd_cgroup
          BinaryName = "$AUDITED_RUNC"
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "$CNI_BIN_DIR"
      conf_dir = "$CNI_CONF_DIR"
      max_conf_num = 1
EOF
)
config_changed=false
if write_if_changed "$CONFIG" "$config_content"; then
  config_changed=true
  log "wrote $CONFIG (disable_apparmor=$disable_apparmor, SystemdCgroup=$systemd_cgroup)"
else
  log "containerd config up to date"
fi

# The CNI conflist: one bridge and subnet per instance.
cni_content=$(cat <<EOF
{
  "cniVersion": "$cni_version",
  "name": "nodeagent",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{ "subnet": "$SUBNET" }]],
        "routes": [{ "dst": "0.0.0.0/0" }]
      }
    },
    {
      "type": "portmap",
      "capabilities": { "portMappings": true }
    },
    {
      "type": "firewall"
    }
  ]
}
EOF
)
if write_if_changed "$CNI_CONFLIST" "$cni_content"; then
  log "wrote $CNI_CONFLIST (cniVersion $cni_version)"
else
  log "CNI conflist up to date"
fi
}

# ---------------------------------------------------------------- 5. start containerd
# Where systemd runs and `deploy/install.sh --runtime` enabled the runtime unit, systemd
# starts and supervises containerd; otherwise this script starts it in the background.
UNIT=nodeagent-containerd.service
systemd_manages_containerd() {
  [ -d /run/systemd/system ] && systemctl is-enabled --quiet "$UNIT" 2>/dev/null
}

start_containerd_unit() {
  log "starting containerd through systemd ($UNIT)"
  systemctl start "$UNIT" || { systemctl status --no-pager "$UNIT" >&2 || true; die "systemctl start $UNIT failed"; }
  local deadline=$((SECONDS + START_TIMEOUT))
  until containerd_answers; do
    if [ $SECONDS -ge $deadline ] || systemctl is-failed --quiet "$UNIT"; then
      journalctl -u "$UNIT" -n 40 --no-pager >&2 || true
      die "containerd ($UNIT) did not answer on $SOCK within ${START_TIMEOUT}s"
    fi
    sleep 0.3
  done
  local pid
  pid=$(find_our_pid) && echo "$pid" >"$PIDFILE"
  log "containerd is up under systemd (pid $(cat "$PIDFILE"))"
}

start_containerd() {
  if [ "$INSTANCE" -eq 0 ] && systemd_manages_containerd; then
    start_containerd_unit
    return
  fi
  log "starting containerd (log: $LOG)"
  # setsid: own session, so it outlives this shell; systemd is not PID 1 here.
  setsid nohup containerd --config "$CONFIG" >>"$LOG" 2>&1 </dev/null &
  echo $! >"$PIDFILE"
  local deadline=$((SECONDS + START_TIMEOUT))
  until containerd_answers; do
    if [ $SECONDS -ge $deadline ]; then
      echo "---- last lines of $LOG ----" >&2
      tail -n 40 "$LOG" >&2 || true
      die "containerd did not answer on $SOCK within ${START_TIMEOUT}s"
    fi
    if ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null && ! find_our_pid >/dev/null; then
      echo "---- last lines of $LOG ----" >&2
      tail -n 40 "$LOG" >&2 || true
      die "containerd exited during startup"
    fi
    sleep 0.3
  done
  local pid
  pid=$(find_our_pid) && echo "$pid" >"$PIDFILE"
  log "containerd is up (pid $(cat "$PIDFILE"))"
}

# start_instance: starts the current instance unless it already answers with its config.
start_instance() {
if containerd_answers; then
  if $config_changed; then
    log "config changed: restarting containerd (containers keep running)"
    "$SCRIPT_DIR/stop.sh" "$INSTANCE"
    start_containerd
  else
    log "containerd already answering on $SOCK"
    if pid=$(find_our_pid); then echo "$pid" >"$PIDFILE"; fi
  fi
else
  # A dead instance may have left a stale socket behind.
  if pid=$(find_our_pid); then
    die "containerd (pid $pid) runs with $CONFIG but does not answer on $SOCK; see $LOG or run stop.sh"
  fi
  rm -f "$SOCK" "$SOCK.ttrpc" "$RUN_DIR/debug.sock"
  start_containerd
fi

local plugins
plugins=$(ctr_ plugins ls 2>&1) || die "ctr plugins ls failed: $plugins"
grep -qE '^io\.containerd\.grpc\.v1[[:space:]]+cri[[:space:]].*[[:space:]]ok[[:space:]]*$' <<<"$plugins" \
  || { grep -i cri <<<"$plugins" >&2 || true; die "CRI plugin is not loaded (see $LOG)"; }
log "CRI plugin loaded"
}

# ---------------------------------------------------------------- 4. images
# (no "ctr ... | grep -q" under pipefail: grep exiting early makes ctr die of SIGPIPE)
have_image() {
  local list
  list=$(ctr_ -n "$NS" images ls -q 2>/dev/null) || return 1
  grep -qxF -- "$1" <<<"$list"
}

# build_image NAME TAG SETUP_FN: umoci layout in $BUILD_DIR/NAME, tag TAG
umoci_image() {
  local name=$1 tag=$2 populate=$3 layout="$BUILD_DIR/$1" bundle="$BUILD_DIR/$1-bundle"
  rm -rf "$layout" "$bundle" "$BUILD_DIR/$name.tar"
  umoci init --layout "$layout"
  umoci new --image "$layout:$tag"
  umoci unpack --image "$layout:$tag" "$bundle" >/dev/null
  "$populate" "$bundle/rootfs"
  umoci repack --image "$layout:$tag" --history.created_by "nodeagent setup.sh" "$bundle"
  shift 3
  umoci config --image "$layout:$tag" --os linux --architecture amd64 "$@"
  umoci gc --layout "$layout"
  tar -C "$layout" -cf "$BUILD_DIR/$name.tar" .
  rm -rf "$bundle"
}

populate_pause() {
  local rootfs=$1
  gcc -static -Os -s -o "$rootfs/pause" "$SCRIPT_DIR/pause.c" || die "compiling pause.c failed"
  chmod 0755 "$rootfs/pause"
}

populate_busybox() {
  local rootfs=$1
  mkdir -p "$rootfs/bin" "$rootfs/sbin" "$rootfs/usr/bin" "$rootfs/usr/sbin" \
    "$rootfs/etc" "$rootfs/root" "$rootfs/home" "$rootfs/var" "$rootfs/proc" "$rootfs/sys" "$rootfs/dev"
  mkdir -p -m 1777 "$rootfs/tmp"
  cp /bin/busybox "$rootfs/bin/busybox"
  chmod 0755 "$rootfs/bin/busybox"
  # Applet symlinks, as "busybox --install -s" would create them inside the image.
  local applet
  for applet in $(/bin/busybox --list-full); do
    mkdir -p "$rootfs/$(dirname "$applet")"
    [ -e "$rootfs/$applet" ] || ln -s /bin/busybox "$rootfs/$applet"
  done
  [ -L "$rootfs/bin/sh" ] || die "busybox image has no /bin/sh"
  printf '%s\n' 'root:x:0:0:root:/root:/bin/sh' 'nobody:x:65534:65534:nobody:/home:/bin/false' >"$rootfs/etc/passwd"
  printf '%s\n' 'root:x:0:' 'nobody:x:65534:' >"$rootfs/etc/group"
}

# build_images: the two image tars in $BUILD_DIR, built once (or again when forced).
IMAGES_BUILT=false
build_images() {
  if $IMAGES_BUILT || { [ "${NODEAGENT_FORCE_IMAGES:-0}" != 1 ] && [ -s "$BUILD_DIR/pause.tar" ] && [ -s "$BUILD_DIR/busybox.tar" ]; }; then
    return
  fi
  IMAGES_BUILT=true
  mkdir -p "$BUILD_DIR"
  local arch
  arch=$(dpkg --print-architecture)
  [ "$arch" = amd64 ] || die "only amd64 is supported (got $arch)"
  PATH_ENV=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

  log "building $PAUSE_IMAGE"
  umoci_image pause 3.9 populate_pause \
    --config.entrypoint /pause --config.env "$PATH_ENV" --clear=config.cmd
  log "building $BUSYBOX_IMAGE"
  umoci_image busybox 1.36 populate_busybox \
    --config.cmd sh --config.env "$PATH_ENV"
}

# import_images: the images into the current instance, unless it has them.
import_images() {
  if [ "${NODEAGENT_FORCE_IMAGES:-0}" != 1 ] && have_image "$PAUSE_IMAGE" && have_image "$BUSYBOX_IMAGE"; then
    log "images already imported"
    return
  fi
  build_images
  log "importing images into namespace $NS"
  ctr_ -n "$NS" images import --base-name registry.k8s.io/pause "$BUILD_DIR/pause.tar" >/dev/null \
    || die "importing pause image failed"
  ctr_ -n "$NS" images import --base-name docker.io/library/busybox "$BUILD_DIR/busybox.tar" >/dev/null \
    || die "importing busybox image failed"
  for img in "$PAUSE_IMAGE" "$BUSYBOX_IMAGE"; do
    have_image "$img" || die "image $img not found in containerd namespace $NS"
  done
}

# ---------------------------------------------------------------- 6. every instance
for ((n = 0; n <= TEST_RUNTIMES; n++)); do
  instance_vars "$n"
  [ "$n" -eq 0 ] || log "test runtime $n: $SOCK (bridge $BRIDGE, $SUBNET)"
  configure_instance
  start_instance
  import_images
  log "images present in $NS: $PAUSE_IMAGE $BUSYBOX_IMAGE"
  log "ready: CRI endpoint unix://$SOCK"
done
# Test instances beyond the number asked for (an earlier run asked for more) are stopped,
# when a number was asked for: a run without it (up.sh, a test repairing the images) leaves
# them alone.
[ -n "${NODEAGENT_TEST_RUNTIMES:-}" ] || exit 0
for dir in /run/nodeagent-containerd-test*; do
  [ -d "$dir" ] || continue
  n=${dir##*-test}
  if [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -gt "$TEST_RUNTIMES" ]; then
    "$SCRIPT_DIR/stop.sh" "$n"
    rm -rf "$dir"
  fi
done
