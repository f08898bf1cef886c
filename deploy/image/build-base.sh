#!/usr/bin/env bash
# Builds the local Docker image `nodeagent-base` from a debootstrapped Debian bookworm root
# filesystem (no image registry is reachable: `debootstrap` from Debian's mirror, then
# `tar | docker import`). It holds systemd, containerd, runc, the CNI plugins, umoci,
# busybox-static, iptables, curl and everything deploy/runtime/setup.sh installs, so that
# setup.sh finds its packages in place and never needs apt inside a container.
#
# Used by deploy/systemd/test-in-container.sh (the systemd node image, as kind runs its
# nodes) and by compose/build-images.sh (containerd and the seven services).
#
# Idempotent: the image carries a label with a hash of the suite, the package list and
# BASE_REVISION; it is rebuilt only when missing, when the hash differs, or with
# NODEAGENT_REBUILD_BASE=1.
# Environment: NODEAGENT_DEBIAN_MIRROR (default: the mirror apt uses on this machine).
# Run as root on Debian 12.
set -euo pipefail

IMAGE=nodeagent-base
SUITE=bookworm
# Bump when the way the tree is made changes (not needed for PACKAGES: they are hashed).
BASE_REVISION=1
PACKAGES=(
  # systemd as PID 1 inside a container
  systemd systemd-sysv dbus
  # the container runtime (same set as deploy/runtime/setup.sh)
  containerd runc containernetworking-plugins umoci busybox-static iptables
  protobuf-compiler gcc libc6-dev
  # tools the tests and operators use inside the node
  curl ca-certificates openssl iproute2 procps kmod util-linux
)

log() { printf '[base-image] %s\n' "$*"; }
die() { printf '[base-image] ERROR: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "must run as root"
command -v docker >/dev/null || die "docker is not installed"

# One build at a time (the systemd and compose tests may start together).
mkdir -p /var/lock
exec 9>/var/lock/nodeagent-base-image.lock
flock 9

self_hash=$(printf '%s\n' "$SUITE" "$BASE_REVISION" "${PACKAGES[@]}" | sha256sum | cut -c1-16)
have_hash=$(docker image inspect -f '{{ index .Config.Labels "nodeagent.base.hash" }}' "$IMAGE" 2>/dev/null || true)
if [ "${NODEAGENT_REBUILD_BASE:-0}" != 1 ] && [ "$have_hash" = "$self_hash" ]; then
  log "$IMAGE is up to date (hash $self_hash)"
  exit 0
fi

# The mirror apt uses here (deb822 "URIs:" or one-line "deb URI suite"), unless overridden.
mirror=${NODEAGENT_DEBIAN_MIRROR:-}
if [ -z "$mirror" ]; then
  mirror=$(grep -hsE '^URIs:' /etc/apt/sources.list.d/debian.sources | awk '{print $2}' | grep -v security | head -n1 || true)
fi
if [ -z "$mirror" ]; then
  mirror=$(grep -hsE '^deb[[:space:]]' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
    | awk '{print $2}' | grep -E '/debian/?$' | head -n1 || true)
fi
mirror=${mirror:-http://deb.debian.org/debian}

if ! command -v debootstrap >/dev/null; then
  log "installing debootstrap"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
fi

start=$SECONDS
work=$(mktemp -d /var/tmp/nodeagent-rootfs.XXXXXX)
trap 'rm -rf --one-file-system "$work"' EXIT
rootfs="$work/rootfs"
log "debootstrap $SUITE from $mirror into $rootfs (a few minutes)"
include=$(IFS=,; echo "${PACKAGES[*]}")
if ! debootstrap --variant=minbase --include="$include" "$SUITE" "$rootfs" "$mirror" >"$work/debootstrap.log" 2>&1; then
  tail -n 30 "$work/debootstrap.log" >&2
  [ -f "$rootfs/debootstrap/debootstrap.log" ] && tail -n 30 "$rootfs/debootstrap/debootstrap.log" >&2
  die "debootstrap failed"
fi
log "debootstrap took $((SECONDS - start)) s"

# Make the tree a container image: apt sources like this machine's, no caches, no
# machine-id (systemd makes one at boot), no services that only make sense on a real host.
cat >"$rootfs/etc/apt/sources.list" <<EOF
deb $mirror $SUITE main
deb $mirror $SUITE-updates main
EOF
printf 'nodeagent-node\n' >"$rootfs/etc/hostname"
: >"$rootfs/etc/machine-id"
rm -f "$rootfs/var/lib/dbus/machine-id"
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb \
  "$rootfs"/var/log/*.log "$rootfs"/var/log/apt/* "$rootfs"/tmp/* "$rootfs/debootstrap"
# Debian's containerd unit would start a second containerd on /run/containerd: the node
# agent's runtime has its own unit (deploy/systemd/nodeagent-containerd.service).
rm -f "$rootfs/etc/systemd/system/multi-user.target.wants/containerd.service"
# Units that fail or make no sense in a container.
for u in systemd-timesyncd.service getty@tty1.service console-getty.service \
  systemd-firstboot.service systemd-modules-load.service sys-kernel-config.mount \
  sys-kernel-debug.mount sys-kernel-tracing.mount systemd-udevd.service \
  systemd-udev-trigger.service apt-daily.timer apt-daily-upgrade.timer; do
  ln -sf /dev/null "$rootfs/etc/systemd/system/$u"
done

log "importing into docker as $IMAGE"
tar -C "$rootfs" --numeric-owner -c . \
  | docker import \
      --change "LABEL nodeagent.base.hash=$self_hash" \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --change 'CMD ["/bin/bash"]' \
      - "$IMAGE:latest" >/dev/null
log "built $IMAGE in $((SECONDS - start)) s ($(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%d MB", $1/1e6}'))"
