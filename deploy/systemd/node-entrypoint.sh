#!/bin/sh
# PID 1 of the systemd node container (deploy/systemd/test-in-container.sh), before systemd.
# Docker mounts the cgroup hierarchies read-only in a container that is not --privileged,
# and --privileged cannot be used where the host's bounding set lacks a capability
# (CAP_SYS_RESOURCE here: runc then fails with "unable to apply caps"). With a private
# cgroup namespace the container's own cgroup is the root of every hierarchy, so making
# those mounts writable lets systemd and containerd manage cgroups below it, and nothing
# outside it.
# (cgroup v2: /sys/fs/cgroup is the only mount; its subdirectories are cgroups, not mounts.)
set -e
for m in /sys/fs/cgroup /sys/fs/cgroup/*/; do
  m=${m%/}
  if mountpoint -q "$m"; then
    mount -o remount,bind,rw "$m"
  fi
done
exec /sbin/init "$@"
