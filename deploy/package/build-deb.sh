#!/usr/bin/env bash
# Builds the node agent's Debian package, nodeagent_<version>_<arch>.deb:
#   /usr/bin/nodeagent (the multi-call binary), the seven /usr/bin/nodeagent-<service>
#     links and /usr/bin/kubelet (the name kubeadm's drop-in runs; the package replaces
#     upstream's kubelet package, which it conflicts with)
#   /lib/systemd/system: the seven units, nodeagent-probe@, kubelet.target, kubelet.service
#     (deploy/systemd, with /usr/bin paths)
#   conffiles: /etc/nodeagent/kubelet-config.yaml (deploy/config's, with upstream's default
#     containerRuntimeEndpoint, the socket of Debian's containerd package),
#     /etc/nodeagent/nodeagent.env, /etc/sysctl.d/60-nodeagent.conf
#   /usr/share/nodeagent/admin-pki.sh, /usr/share/doc/nodeagent/README.md and copyright
#     (the license: Apache-2.0, deploy/package/copyright)
# and the maintainer scripts beside this file: on install kubelet.target is enabled and
# started (kubelet.service instead where kubeadm's drop-in is present); on upgrade each
# running service restarts in turn (the pods keep running); remove stops them (the pods keep
# running, as when upstream's kubelet is removed); purge also removes the configuration.
#
# Usage: deploy/package/build-deb.sh [--version V] [--out DIR] [BIN_DIR]
#   BIN_DIR    where `nodeagent` is (as deploy/install.sh; build with
#              `cargo build --release -p nodeagent` for a package to ship)
#   --version  the package version (default: the workspace's, +git<commit time>.<commit>,
#              so that each later commit's package upgrades the earlier one's)
#   --out      where the .deb goes (default: the current directory)
# Prints the path of the package. Needs dpkg-deb (Debian's dpkg).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=$(pwd)
cd "$here/../.."

version= bin_arg=
while [ $# -gt 0 ]; do
  case "$1" in
    --version) version=$2; shift ;;
    --out) out=$2; shift ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) bin_arg=$1 ;;
  esac
  shift
done
command -v dpkg-deb >/dev/null || { echo "dpkg-deb is required (apt-get install dpkg)" >&2; exit 1; }
# shellcheck source=deploy/lib/bin-dir.sh
. deploy/lib/bin-dir.sh
bin_dir=$(nodeagent_bin_dir "$bin_arg")
if [ -z "$version" ]; then
  base=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
  version="$base+git$(TZ=UTC git log -1 --date=format-local:%Y%m%d%H%M%S --format=%cd).$(git rev-parse --short=12 HEAD)"
fi
arch=$(dpkg --print-architecture)

root=$(mktemp -d /var/tmp/nodeagent-deb.XXXXXX)
trap 'rm -rf "$root"' EXIT
chmod 0755 "$root"
install -d "$root/DEBIAN" "$root/usr/bin" "$root/lib/systemd/system" "$root/etc/nodeagent" \
  "$root/etc/sysctl.d" "$root/etc/kubernetes/manifests" "$root/usr/share/nodeagent" \
  "$root/usr/share/doc/nodeagent"
install -m 0755 "$bin_dir/nodeagent" "$root/usr/bin/nodeagent"
nodeagent_link_services "$root/usr/bin"
ln -s nodeagent "$root/usr/bin/kubelet"
# The units name /usr/local/bin and /usr/local/share, where deploy/install.sh puts things.
for unit in deploy/systemd/*.service deploy/systemd/kubelet.target; do
  case "$(basename "$unit")" in nodeagent-containerd.service) continue ;; esac
  sed -e 's|/usr/local/bin/|/usr/bin/|g' -e 's|/usr/local/share/|/usr/share/|g' "$unit" \
    >"$root/lib/systemd/system/$(basename "$unit")"
  chmod 0644 "$root/lib/systemd/system/$(basename "$unit")"
done
sed 's|^containerRuntimeEndpoint: .*|containerRuntimeEndpoint: unix:///run/containerd/containerd.sock|' \
  deploy/config/kubelet-config.yaml >"$root/etc/nodeagent/kubelet-config.yaml"
grep -q '^containerRuntimeEndpoint: unix:///run/containerd/containerd.sock$' "$root/etc/nodeagent/kubelet-config.yaml" \
  || { echo "deploy/config/kubelet-config.yaml has no containerRuntimeEndpoint line to set" >&2; exit 1; }
install -m 0644 deploy/config/nodeagent.env "$root/etc/nodeagent/nodeagent.env"
install -m 0644 deploy/config/60-nodeagent.conf "$root/etc/sysctl.d/60-nodeagent.conf"
install -m 0755 deploy/lib/admin-pki.sh "$root/usr/share/nodeagent/admin-pki.sh"
install -m 0644 README.md "$root/usr/share/doc/nodeagent/README.md"
install -m 0644 deploy/package/copyright "$root/usr/share/doc/nodeagent/copyright"
chmod 0644 "$root/etc/nodeagent/kubelet-config.yaml"
(cd "$root" && find etc -type f | sed 's|^|/|' | sort) >"$root/DEBIAN/conffiles"
for script in postinst prerm postrm; do
  sed "s|@SERVICES@|${NODEAGENT_SERVICES[*]}|" "$here/$script" >"$root/DEBIAN/$script"
  chmod 0755 "$root/DEBIAN/$script"
done
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
cat >"$root/DEBIAN/control" <<CONTROL
Package: nodeagent
Version: $version
Architecture: $arch
Maintainer: nodeagent developers <nodeagent@localhost>
Installed-Size: $size
Depends: systemd, openssl
Recommends: containerd | containerd.io, runc, containernetworking-plugins
Conflicts: kubelet
Replaces: kubelet
Provides: kubelet
Section: admin
Priority: optional
Homepage: file:///usr/share/doc/nodeagent/README.md
Description: Kubernetes node agent: the kubelet as seven cooperating services
 config-source, pod-sync, pleg, node-status, probe, volume and http-server, under
 systemd (kubelet.target, or kubelet.service on a kubeadm node). Each restarts or
 upgrades alone while every pod on the node keeps running.
CONTROL
mkdir -p "$out"
deb="$out/nodeagent_${version}_${arch}.deb"
# gzip -1: the debug binary is large, and dpkg reads gzip everywhere.
dpkg-deb --root-owner-group -Zgzip -z1 --build "$root" "$deb" >/dev/null
echo "$deb"
