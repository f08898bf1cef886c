#!/usr/bin/env bash
# `systemd-analyze verify` on every unit in deploy/systemd, on any machine (systemd need not
# be running): the units and the binaries they name are laid out in a throw-away root
# (--root=), next to this machine's own system units, so that ExecStart= paths resolve.
# Any message at all counts as a failure (verify exits 0 on "Unknown key ..., ignoring").
# With --security, also prints `systemd-analyze security` (exposure) for each service.
#
# Usage: deploy/systemd/verify.sh [--security] [BIN_DIR]   (BIN_DIR: as deploy/install.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."

security=false
if [ "${1:-}" = --security ]; then security=true; shift; fi

command -v systemd-analyze >/dev/null || {
  apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd >/dev/null
}

# shellcheck source=deploy/lib/bin-dir.sh
. deploy/lib/bin-dir.sh
bin_dir=$(nodeagent_bin_dir "${1:-}")

root=$(mktemp -d /var/tmp/nodeagent-verify.XXXXXX)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/usr/lib/systemd" "$root/etc/systemd/system" "$root/usr/local/bin" "$root/usr/bin" "$root/sbin"
sysunits=/usr/lib/systemd/system
[ -d "$sysunits" ] || sysunits=/lib/systemd/system
cp -a "$sysunits" "$root/usr/lib/systemd/system"
cp "$bin_dir/nodeagent" "$root/usr/local/bin/"
nodeagent_link_services "$root/usr/local/bin"
ln -s nodeagent "$root/usr/local/bin/kubelet"
# The runtime unit names containerd and modprobe: the real ones if here, else stand-ins
# (what is verified is our unit file).
for b in /usr/bin/containerd /sbin/modprobe /usr/bin/systemctl; do
  if [ -x "$b" ]; then cp "$(readlink -f "$b")" "$root$b"; else printf '#!/bin/sh\n' >"$root$b"; chmod 0755 "$root$b"; fi
done
cp deploy/systemd/*.service deploy/systemd/*.target "$root/etc/systemd/system/"

units=()
# A template (nodeagent-probe@.service) is verified as one of its instances.
for f in deploy/systemd/*.service deploy/systemd/*.target; do
  u=$(basename "$f"); units+=("${u/@./@verify.}")
done
out=$(systemd-analyze verify --root="$root" "${units[@]}" 2>&1) && rc=0 || rc=$?
if [ "$rc" -ne 0 ] || [ -n "$out" ]; then
  printf '%s\n' "$out" >&2
  echo "FAIL: systemd-analyze verify (exit $rc) on ${units[*]}"
  exit 1
fi
echo "PASS: systemd-analyze verify: ${units[*]}"

if $security; then
  for s in "${NODEAGENT_SERVICES[@]}" containerd; do
    line=$(systemd-analyze security --offline=true --root="$root" "nodeagent-$s.service" 2>/dev/null | tail -n 1)
    printf '  nodeagent-%-14s exposure %s\n' "$s" "${line##*: }"
  done
fi
