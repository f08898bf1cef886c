#!/bin/sh
# nodeagent-grpc-health SOCKET: grpc.health.v1.Health/Check (service "") over a unix socket
# with curl (HTTP/2 without TLS). The request is an empty message in a 5-byte gRPC frame;
# SERVING answers 00 00000002 0801. Exit 0 when SERVING. Used by the compose health checks.
sock=${1:?usage: nodeagent-grpc-health SOCKET}
out=$(printf '\0\0\0\0\0' | curl -s --max-time 3 --http2-prior-knowledge --unix-socket "$sock" \
  -H 'content-type: application/grpc' -H 'te: trailers' --data-binary @- \
  http://localhost/grpc.health.v1.Health/Check | od -An -tx1 | tr -d ' \n')
[ "$out" = 00000000020801 ]
