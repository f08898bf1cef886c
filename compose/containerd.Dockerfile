# nodeagent-compose-containerd: containerd, runc and the CNI plugins from the debootstrapped
# base (deploy/image/build-base.sh), the pause and busybox images built by
# deploy/runtime/setup.sh (as OCI tars, imported at start), and the entrypoint.
# Built by compose/build-images.sh; the build context is a temporary directory.
FROM nodeagent-base
COPY pause.tar busybox.tar /opt/nodeagent/images/
COPY entrypoint.sh /usr/local/bin/nodeagent-containerd-entrypoint
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/nodeagent-containerd-entrypoint"]
