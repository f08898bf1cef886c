#!/usr/bin/env bash
# Run a command (typically a cross-service test binary) on a cgroup v2 host: a Debian
# bookworm guest in qemu booted with the unified hierarchy only, which sees this checkout
# read-write at the same path over 9p, so binaries already built under target/ run there
# unchanged. See tests/cgroup2/README.md.
#
#   tests/cgroup2/run.sh [--rebuild] [--no-setup] [--] COMMAND [ARGS...]
#
# Exits with COMMAND's exit code in the guest; 124 when the guest timed out, 125 when it
# never reported one (it failed to boot, or a preparation step failed: see the output).
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$SCRIPT_DIR/../.." && pwd)"

# Outside the checkout: the share must not expose a 1.5 GB rootfs to the guest, and the
# image survives `cargo clean`.
STATE=${NODEAGENT_CGROUP2_DIR:-/var/tmp/nodeagent-cgroup2}
TIMEOUT=${NODEAGENT_CGROUP2_TIMEOUT:-3600}
MEM=${NODEAGENT_CGROUP2_MEM:-4G}
CPUS=${NODEAGENT_CGROUP2_CPUS:-2}
ACCEL=${NODEAGENT_CGROUP2_ACCEL:-auto} # auto | kvm | tcg
MIRROR=${NODEAGENT_CGROUP2_MIRROR:-http://deb.debian.org/debian}
DISK_SIZE=${NODEAGENT_CGROUP2_DISK:-8G}
# Bump when the guest configuration below changes, so existing images are rebuilt.
IMAGE_VERSION=1

log() { printf '[cgroup2] %s\n' "$*" >&2; }
die() { printf '[cgroup2] ERROR: %s\n' "$*" >&2; exit 125; }
usage() {
  sed -n '2,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

rebuild=false
run_setup=true
while [ $# -gt 0 ]; do
  case "$1" in
    --rebuild) rebuild=true; shift ;;
    --no-setup) run_setup=false; shift ;;
    --) shift; break ;;
    -h|--help) usage ;;
    -*) log "unknown option $1"; usage ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || usage
[ "$(id -u)" -eq 0 ] || die "must run as root (debootstrap, apt-get, 9p passthrough)"
# The paths travel on the kernel command line, which splits on whitespace.
case "$REPO$STATE" in *[[:space:]]*) die "paths with whitespace are not supported: $REPO $STATE" ;; esac

# ------------------------------------------------------------------ host packages
# apt-get update only when something is missing: it costs time on every run otherwise.
need_pkgs=()
command -v qemu-system-x86_64 >/dev/null || need_pkgs+=(qemu-system-x86)
command -v debootstrap >/dev/null || need_pkgs+=(debootstrap)
command -v mke2fs >/dev/null || need_pkgs+=(e2fsprogs)
command -v flock >/dev/null || need_pkgs+=(util-linux)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  log "installing on the host: ${need_pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
fi

# ------------------------------------------------------------------ guest image
# Everything the tests and deploy/runtime/setup.sh need is baked in, so the guest never
# depends on the network. setup.sh's own list is read too, so a package added there
# reaches the image (the key below changes and the image is rebuilt).
mapfile -t setup_pkgs < <(sed -n '/^PACKAGES=(/,/)/{s/^PACKAGES=(//;s/).*//;p}' "$REPO/deploy/runtime/setup.sh" \
  | tr -s ' \t' '\n' | grep -E '^[a-z0-9][a-z0-9.+-]+$' || true)
GUEST_PKGS=(systemd-sysv udev dbus kmod util-linux iproute2 procps linux-image-amd64
  ca-certificates containerd runc containernetworking-plugins umoci busybox-static iptables
  protobuf-compiler gcc libc6-dev kubernetes-client "${setup_pkgs[@]}")
mapfile -t GUEST_PKGS < <(printf '%s\n' "${GUEST_PKGS[@]}" | sort -u)

# Runs in the guest as PID 1's child: mounts the share and hands over to guest.sh on it,
# so changes to guest.sh need no image rebuild.
BOOT_SCRIPT=$(cat <<'EOF'
#!/bin/bash
# Installed by tests/cgroup2/run.sh: mount the host's checkout, run its guest.sh.
arg() { local a; for a in $(cat /proc/cmdline); do case "$a" in "$1="*) echo "${a#*=}";; esac; done; }
share=$(arg nodeagent.share)
mkdir -p "$share"
modprobe 9pnet_virtio 2>/dev/null
if mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=mmap work "$share"; then
  bash "$share/tests/cgroup2/guest.sh"
else
  echo "nodeagent-cgroup2: cannot mount the 9p share at $share" >/dev/console
fi
# Whatever happened, never leave the host waiting for its timeout.
sync
systemctl --force poweroff
EOF
)
UNIT=$(cat <<'EOF'
[Unit]
Description=nodeagent cgroup v2 test run (tests/cgroup2/run.sh)
After=basic.target
[Service]
Type=simple
ExecStart=/usr/local/sbin/nodeagent-cgroup2-boot
StandardOutput=journal+console
StandardError=journal+console
[Install]
WantedBy=multi-user.target
EOF
)
image_key=$(printf '%s\n' "$IMAGE_VERSION" "$MIRROR" "${GUEST_PKGS[@]}" "$BOOT_SCRIPT" "$UNIT" | sha256sum | cut -d' ' -f1)

build_image() {
  local root="$STATE/rootfs" t0=$SECONDS
  rm -rf "$root" "$STATE/rootfs.img" "$STATE/vmlinuz" "$STATE/initrd.img" "$STATE/key" "$STATE/accel"
  log "debootstrap bookworm into $root (${#GUEST_PKGS[@]} extra packages)"
  # minbase: the guest needs no standard-priority extras, only what --include names.
  local joined
  joined=$(IFS=,; echo "${GUEST_PKGS[*]}")
  debootstrap --variant=minbase --components=main --include="$joined" \
    bookworm "$root" "$MIRROR" >"$STATE/debootstrap.log" 2>&1 \
    || { tail -n 30 "$STATE/debootstrap.log" >&2; die "debootstrap failed (see $STATE/debootstrap.log)"; }
  log "debootstrap took $((SECONDS - t0))s"

  echo nodeagent-cgroup2 >"$root/etc/hostname"
  printf '%s\n' '127.0.0.1 localhost' '127.0.1.1 nodeagent-cgroup2' '::1 localhost ip6-localhost ip6-loopback' >"$root/etc/hosts"
  # The root disk is attached with snapshot=on, so nothing fscks or remounts it usefully.
  echo '/dev/vda / ext4 rw,relatime 0 0' >"$root/etc/fstab"
  # qemu user-mode networking's DNS forwarder; guest.sh configures the address statically.
  echo 'nameserver 10.0.2.3' >"$root/etc/resolv.conf"
  # Lets someone log in on the serial console when debugging a boot.
  chroot "$root" passwd -d root >/dev/null
  printf '%s\n' "$BOOT_SCRIPT" >"$root/usr/local/sbin/nodeagent-cgroup2-boot"
  chmod 0755 "$root/usr/local/sbin/nodeagent-cgroup2-boot"
  printf '%s\n' "$UNIT" >"$root/etc/systemd/system/nodeagent-cgroup2.service"
  chroot "$root" systemctl enable nodeagent-cgroup2.service >/dev/null 2>&1
  chroot "$root" systemctl set-default multi-user.target >/dev/null 2>&1
  # Debian's own containerd would run next to the one setup.sh starts (as docker's does on
  # the host); the tests never use it, so it only costs boot time and memory here.
  chroot "$root" systemctl mask containerd.service >/dev/null 2>&1
  chroot "$root" systemctl mask apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer \
    fstrim.timer >/dev/null 2>&1 || true
  rm -rf "$root/var/cache/apt/archives/"*.deb "$root/var/lib/apt/lists/"*_Packages

  local kernel initrd
  kernel=$(printf '%s\n' "$root"/boot/vmlinuz-* | sort -V | tail -n 1)
  initrd=$(printf '%s\n' "$root"/boot/initrd.img-* | sort -V | tail -n 1)
  [ -f "$kernel" ] && [ -f "$initrd" ] || die "no kernel/initrd in $root/boot"
  cp "$kernel" "$STATE/vmlinuz"
  cp "$initrd" "$STATE/initrd.img"

  # A raw ext4 image made from the directory: no loop devices or mounts on the host.
  truncate -s "$DISK_SIZE" "$STATE/rootfs.img.new"
  mke2fs -q -F -t ext4 -L nodeagent-root -d "$root" "$STATE/rootfs.img.new"
  mv "$STATE/rootfs.img.new" "$STATE/rootfs.img"
  rm -rf "$root"
  echo "$image_key" >"$STATE/key"
  log "guest image ready in $((SECONDS - t0))s: $STATE/rootfs.img ($(basename "$kernel"))"
}

mkdir -p "$STATE"
# One builder at a time; runs share the image read-only (snapshot=on) once it exists.
exec 9>"$STATE/lock"
flock 9
if $rebuild || [ ! -f "$STATE/rootfs.img" ] || [ "$(cat "$STATE/key" 2>/dev/null)" != "$image_key" ]; then
  build_image
fi
flock -u 9

# ------------------------------------------------------------------ accelerator
# /dev/kvm existing proves little inside a VM: nested virtualisation may be off, or (as on
# Firecracker hosts with kvm_pvm) KVM may create vCPUs yet run an ordinary kernel far too
# slowly to boot. So KVM counts only if a real boot of the guest kernel reaches its
# console quickly; everything else falls back to TCG.
# arch-capabilities off: nested KVMs reject qemu's write of that MSR (0x10a) and qemu aborts.
KVM_CPU=host,-arch-capabilities
kvm_works() {
  [ -c /dev/kvm ] && [ -r /dev/kvm ] && [ -w /dev/kvm ] || return 1
  local probe_log
  probe_log=$(mktemp)
  # The kernel prints its version early; no initrd or root needed for that (it panics
  # without a root and -no-reboot ends qemu).
  timeout "${NODEAGENT_CGROUP2_KVM_PROBE_TIMEOUT:-30}" qemu-system-x86_64 -machine q35 -accel kvm \
    -cpu "$KVM_CPU" -smp 1 -m 256 -kernel "$STATE/vmlinuz" \
    -append "console=ttyS0 panic=-1 root=/dev/null" -nodefaults -display none \
    -monitor none -serial "file:$probe_log" -no-reboot </dev/null >/dev/null 2>&1 || true
  local ok=1
  grep -q 'Linux version' "$probe_log" && ok=0
  rm -f "$probe_log"
  return $ok
}
case "$ACCEL" in
  auto)
    # The probe costs up to its timeout where KVM does not work: its answer is kept with
    # the image (--rebuild or deleting the file probes again).
    if [ ! -s "$STATE/accel" ]; then
      if kvm_works; then echo kvm >"$STATE/accel"; else echo tcg >"$STATE/accel"; fi
    fi
    ACCEL=$(cat "$STATE/accel") ;;
  kvm) ;; # forced: no probe, so a slow-but-working KVM can still be chosen
  tcg) ;;
  *) die "NODEAGENT_CGROUP2_ACCEL must be auto, kvm or tcg" ;;
esac
if [ "$ACCEL" = kvm ]; then
  accel_args=(-machine q35 -accel kvm -cpu "$KVM_CPU")
else
  # Multi-threaded TCG: one host thread per vCPU. Expect several times slower than KVM.
  accel_args=(-machine q35 -accel "tcg,thread=multi" -cpu max)
  log "KVM is not usable here: falling back to TCG emulation (slow)"
fi

# ------------------------------------------------------------------ the run
# The run directory is inside the share: the guest reads the command from it and writes
# its output and exit code there.
mkdir -p "$REPO/target/cgroup2"
RUN_DIR=$(mktemp -d "$REPO/target/cgroup2/run-$(date +%Y%m%d-%H%M%S)-XXXX")
# The command, quoted for the guest's bash; relative paths resolve from the same cwd when
# that is inside the checkout.
cwd=$PWD
case "$cwd/" in "$REPO/"*) ;; *) cwd=$REPO ;; esac
{
  printf 'cd %q\n' "$cwd"
  # The test harness's own knobs travel along (NODEAGENT_TEST_BIN_DIR, RUST_LOG, CI, ...).
  while IFS= read -r name; do
    case "$name" in NODEAGENT_CGROUP2_*) continue ;; esac
    printf 'export %s=%q\n' "$name" "${!name}"
  done < <(compgen -e | grep -E '^(NODEAGENT_|RUST_|CI$)' || true)
  printf 'run_setup=%s\n' "$run_setup"
  printf 'cmd=('; printf '%q ' "$@"; printf ')\n'
} >"$RUN_DIR/command"
: >"$RUN_DIR/output.log"

append="root=/dev/vda rw console=ttyS0,115200 systemd.unified_cgroup_hierarchy=1 cgroup_no_v1=all"
append+=" panic=-1 systemd.show_status=1 nodeagent.share=$REPO nodeagent.run=$RUN_DIR"
log "booting ($ACCEL, $CPUS vCPUs, $MEM, timeout ${TIMEOUT}s); console: $RUN_DIR/console.log"
t0=$SECONDS
# -no-reboot with panic=-1: a guest kernel panic ends qemu instead of looping.
# snapshot=on: every run starts from the pristine image; writes go to a temp overlay.
# -mem-prealloc: the guest's memory is taken at boot, not as the guest touches it. The
# guest runs beside the host's test phases, whose memory-pressure tests set thresholds
# from the memory available when they start; a guest growing by 2.5 GB meanwhile kept
# the host's MemoryPressure True after the eviction (stop 61's first CI, a fresh machine,
# the guest booted 10 minutes before).
timeout --kill-after=20 "$TIMEOUT" qemu-system-x86_64 -name nodeagent-cgroup2 \
  "${accel_args[@]}" -smp "$CPUS" -m "$MEM" -mem-prealloc \
  -kernel "$STATE/vmlinuz" -initrd "$STATE/initrd.img" -append "$append" \
  -drive "file=$STATE/rootfs.img,format=raw,if=virtio,snapshot=on,cache=unsafe" \
  -virtfs "local,path=$REPO,mount_tag=work,security_model=passthrough,id=work" \
  -nic user,model=virtio-net-pci \
  -nodefaults -display none -monitor none -serial "file:$RUN_DIR/console.log" -no-reboot \
  </dev/null >"$RUN_DIR/qemu.log" 2>&1 &
qemu_pid=$! # timeout's pid: signalling it reaches qemu too
# The guest's output streams live from the shared file.
tail -n +1 -F --pid=$qemu_pid "$RUN_DIR/output.log" 2>/dev/null &
tail_pid=$!
# shellcheck disable=SC2329 # invoked by the EXIT trap
cleanup() {
  kill "$qemu_pid" 2>/dev/null || true
  kill "$tail_pid" 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

qemu_rc=0
wait "$qemu_pid" || qemu_rc=$?
wait "$tail_pid" 2>/dev/null || true
trap - EXIT
log "guest ran $((SECONDS - t0))s (qemu exit $qemu_rc)"

if [ -s "$RUN_DIR/exit-code" ]; then
  rc=$(cat "$RUN_DIR/exit-code")
  log "command exit code $rc; logs in $RUN_DIR"
  exit "$rc"
fi
echo "---- last lines of $RUN_DIR/console.log ----" >&2
tail -n 40 "$RUN_DIR/console.log" >&2 || true
if [ -s "$RUN_DIR/qemu.log" ]; then
  echo "---- $RUN_DIR/qemu.log ----" >&2
  cat "$RUN_DIR/qemu.log" >&2
fi
if [ "$qemu_rc" -eq 124 ] || [ "$qemu_rc" -eq 137 ]; then
  log "timed out after ${TIMEOUT}s"
  exit 124
fi
die "the guest reported no exit code"
