#!/usr/bin/env bash
# Builds every image compose/docker-compose.yml uses, locally (no registry is reachable):
#   nodeagent-base                the debootstrapped Debian root filesystem
#                                 (deploy/image/build-base.sh; reused, rebuilt only when
#                                 that script changes)
#   nodeagent-compose-containerd  containerd + CNI + the pause and busybox images
#   nodeagent-compose-services    the seven binaries (one image, one command per service)
#                                 and the test API server of the `cluster` profile (built
#                                 here when BIN_DIR lacks it)
# The pause and busybox images are made by deploy/runtime/setup.sh itself, run once in a
# throw-away container of the base image; its OCI tars are cached in
# /var/cache/nodeagent/runtime-images and rebuilt when setup.sh or pause.c change.
#
# Usage: compose/build-images.sh [BIN_DIR]   (BIN_DIR: as deploy/install.sh; run as root)
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)

# shellcheck source=deploy/lib/bin-dir.sh
. deploy/lib/bin-dir.sh

log() { printf '[compose-images] %s\n' "$*"; }
die() { printf '[compose-images] ERROR: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "must run as root"
command -v docker >/dev/null || die "docker is not installed"
bin_dir=$(nodeagent_bin_dir "${1:-}") || die "no binaries"
T0=$SECONDS

# ------------------------------------------------------------------ base
bash deploy/image/build-base.sh

# Not --privileged: where the host's capability bounding set lacks one (CAP_SYS_RESOURCE
# on some sandboxes), runc refuses "all capabilities". Every capability the host has, then.
caps=(--cap-add ALL)
bnd=$(awk '/^CapBnd/ {print $2}' /proc/self/status)
if [ $(( 0x$bnd >> 24 & 1 )) -eq 0 ]; then caps+=(--cap-drop SYS_RESOURCE); fi

# ------------------------------------------------------------------ pause and busybox
cache=/var/cache/nodeagent/runtime-images
key=$(cat deploy/runtime/setup.sh deploy/runtime/pause.c | sha256sum | cut -c1-16)
if [ -f "$cache/key" ] && [ "$(cat "$cache/key")" = "$key" ] && [ -s "$cache/pause.tar" ] && [ -s "$cache/busybox.tar" ]; then
  log "pause and busybox image tars cached ($cache)"
else
  t=$SECONDS
  log "building the pause and busybox images with deploy/runtime/setup.sh in a throw-away container"
  work=$(mktemp -d /var/tmp/nodeagent-runtime-images.XXXXXX)
  if ! docker run --rm "${caps[@]}" --security-opt seccomp=unconfined --security-opt systempaths=unconfined \
      --tmpfs /run:rw,exec --tmpfs /tmp:rw,exec \
      -v "$REPO/deploy:/opt/nodeagent/deploy:ro" -v "$work:/var/lib/nodeagent-containerd" \
      nodeagent-base bash /opt/nodeagent/deploy/runtime/setup.sh >"$work.log" 2>&1; then
    tail -n 30 "$work.log" >&2
    rm -rf "$work" "$work.log"
    die "deploy/runtime/setup.sh failed in the build container"
  fi
  mkdir -p "$cache"
  cp "$work/image-build/pause.tar" "$work/image-build/busybox.tar" "$cache/"
  echo "$key" >"$cache/key"
  rm -rf "$work" "$work.log"
  log "image tars built in $((SECONDS - t)) s"
fi

# ------------------------------------------------------------------ the two compose images
build() {  # build IMAGE DOCKERFILE CONTEXT
  local out
  out=$(DOCKER_BUILDKIT=0 docker build -t "$1" -f "$2" "$3" 2>&1) || { printf '%s\n' "$out" >&2; die "docker build $1 failed"; }
}
ctx=$(mktemp -d /var/tmp/nodeagent-compose-ctx.XXXXXX)
trap 'rm -rf "$ctx"' EXIT

t=$SECONDS
mkdir -p "$ctx/containerd"
cp compose/containerd.Dockerfile "$ctx/containerd/Dockerfile"
cp compose/containerd/entrypoint.sh "$cache/pause.tar" "$cache/busybox.tar" "$ctx/containerd/"
build nodeagent-compose-containerd "$ctx/containerd/Dockerfile" "$ctx/containerd"
log "nodeagent-compose-containerd built in $((SECONDS - t)) s"

t=$SECONDS
mkdir -p "$ctx/services"
cp compose/services.Dockerfile "$ctx/services/Dockerfile"
cp compose/grpc-health.sh "$ctx/services/"
nodeagent_snapshot_bins "$bin_dir" "$ctx/services/bin"
# The test API server, for the `cluster` profile: built here, with the profile of BIN_DIR,
# when that build has none (deploy/up.sh's release build does not make it).
if [ ! -x "$bin_dir/nodeagent-test-apiserver" ]; then
  profile=$(basename "$bin_dir")
  case "$profile" in debug) flag=() ;; *) flag=(--profile "$profile") ;; esac
  log "building nodeagent-test-apiserver ($profile) for the cluster profile"
  built=$(cargo build "${flag[@]}" -p nodeagent-tests --bin nodeagent-test-apiserver \
    --message-format=json-render-diagnostics | sed -n 's/.*"executable":"\([^"]*nodeagent-test-apiserver\)".*/\1/p' | tail -n1)
  [ -x "$built" ] || die "building nodeagent-test-apiserver failed"
  [ "$(dirname "$built")" = "$bin_dir" ] || cp "$built" "$bin_dir/"
fi
cp "$bin_dir/nodeagent-test-apiserver" "$ctx/services/bin/"
build nodeagent-compose-services "$ctx/services/Dockerfile" "$ctx/services"
log "nodeagent-compose-services built from $bin_dir in $((SECONDS - t)) s"

# Images replaced by this build (and older base images) are left dangling: remove ours,
# found by the label every image built on nodeagent-base inherits.
docker image prune -f --filter label=nodeagent.base.hash >/dev/null || true
log "images ready in $((SECONDS - T0)) s: nodeagent-base nodeagent-compose-containerd nodeagent-compose-services"
