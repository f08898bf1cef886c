# nodeagent-compose-services: the multi-call binary and its seven links in one image, on the
# debootstrapped base (deploy/image/build-base.sh); docker-compose.yml picks one link per
# service. One image
# because the seven are always built, shipped and upgraded together (one shared schema),
# and it shares every base layer with the containerd image. The base also brings curl
# (the gRPC health check below) and a shell to look around with `docker-compose exec`.
# Built by compose/build-images.sh; the build context is a temporary directory.
FROM nodeagent-base
COPY grpc-health.sh /usr/local/bin/nodeagent-grpc-health
COPY bin/ /usr/local/bin/
