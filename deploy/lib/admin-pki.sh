#!/usr/bin/env bash
# Makes, once, a client CA for the kubelet API's x509 authentication and an admin client
# certificate signed by it, for a standalone node (with an API server, use the cluster's
# client CA instead). Usage: admin-pki.sh DIR. Writes DIR/ca.crt (the node's
# authentication.x509.clientCAFile), DIR/ca.key, DIR/admin.crt and DIR/admin.key
# (CN admin, O system:masters). Existing files are kept.
set -euo pipefail
dir=${1:?usage: admin-pki.sh DIR}
mkdir -p "$dir"
chmod 0700 "$dir"
cd "$dir"
if [ ! -f ca.crt ] || [ ! -f ca.key ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout ca.key -out ca.crt -days 3650 -subj "/CN=nodeagent-client-ca" 2>/dev/null
fi
if [ ! -f admin.crt ] || [ ! -f admin.key ]; then
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout admin.key -out admin.csr -subj "/O=system:masters/CN=admin" 2>/dev/null
  printf 'extendedKeyUsage=clientAuth\nkeyUsage=digitalSignature\n' >admin.ext
  openssl x509 -req -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
    -out admin.crt -days 365 -extfile admin.ext 2>/dev/null
  rm -f admin.csr admin.ext
fi
chmod 0600 ca.key admin.key
