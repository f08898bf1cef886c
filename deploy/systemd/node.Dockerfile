# The systemd node image for deploy/systemd/test-in-container.sh: the debootstrapped base
# (deploy/image/build-base.sh) booting systemd as PID 1, as kind runs its nodes.
FROM nodeagent-base
ENV container=docker
# systemd halts cleanly on SIGRTMIN+3 (what `docker stop` sends then).
STOPSIGNAL SIGRTMIN+3
RUN systemctl set-default multi-user.target \
 && systemctl mask systemd-logind.service getty.target \
 && mkdir -p /etc/systemd/system.conf.d /etc/systemd/journald.conf.d \
 && printf '[Manager]\nShowStatus=no\nDefaultTimeoutStopSec=30s\n' >/etc/systemd/system.conf.d/10-container.conf \
 && printf '[Journal]\nStorage=volatile\n' >/etc/systemd/journald.conf.d/10-container.conf
COPY node-entrypoint.sh /usr/local/sbin/nodeagent-node-entrypoint
ENTRYPOINT ["/usr/local/sbin/nodeagent-node-entrypoint"]
