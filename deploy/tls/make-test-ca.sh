#!/usr/bin/env bash
# Makes a test CA and certificates for Ballast's TLS (server/tls.h) with
# openssl, into OUT_DIR:
#   ca.pem, ca.key                the cluster CA (ca_file of every daemon)
#   scheduler.pem, scheduler.key  the scheduler (server and client use), URI
#                                 SAN ballast://scheduler (its role)
#   node.pem, node.key            the nodes (server and client use), URI SAN
#                                 ballast://node/* (any node id: a trial's)
#   node-ID.pem, node-ID.key      with NODES="a b ...": one per node, URI SAN
#                                 ballast://node/ID (production's way)
#   client.pem, client.key        a public client (BALLAST_TLS_CERT/KEY)
# Server certificates name localhost and 127.0.0.1 plus every SAN given
# (host names or IPv4 addresses the daemons are dialled by).
# Usage: deploy/tls/make-test-ca.sh OUT_DIR [SAN...]
# Run again on the same OUT_DIR, it keeps the CA and issues new leaf
# certificates and keys (a rotation; the daemons pick them up within
# reload_interval_s). For tests and trials only: keys are unencrypted and
# valid for 30 days.
set -euo pipefail
OUT=${1:?usage: make-test-ca.sh OUT_DIR [SAN...]}
shift
SANS="DNS:localhost,IP:127.0.0.1"
for n in "$@"; do
  if [[ $n =~ ^[0-9.]+$ ]]; then SANS+=",IP:$n"; else SANS+=",DNS:$n"; fi
done
mkdir -p "$OUT"
cd "$OUT"
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:prime256v1 -out "$1" 2> /dev/null; }
if [ ! -f ca.key ] || [ ! -f ca.pem ]; then  # an existing CA is kept: re-running rotates the leaves
  key ca.key
  openssl req -x509 -new -key ca.key -out ca.pem -days 30 -subj "/CN=ballast test CA $$" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
fi
issue() {  # issue NAME EXTENDED_KEY_USAGE [ROLE_URI]
  key "$1.key.new"
  openssl req -new -key "$1.key.new" -out "$1.csr" -subj "/CN=ballast $1"
  printf 'subjectAltName=%s%s\nextendedKeyUsage=%s\nbasicConstraints=CA:FALSE\n' "$SANS" \
    "${3:+,URI:$3}" "$2" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -out "$1.pem.new" \
    -days 30 -extfile "$1.ext" 2> /dev/null
  rm -f "$1.csr" "$1.ext"
  chmod 600 "$1.key.new"
  mv "$1.key.new" "$1.key"  # key, then certificate: a reader may see a new key with the
  mv "$1.pem.new" "$1.pem"  # old certificate for a moment; gRPC keeps the old pair then
}
issue scheduler serverAuth,clientAuth ballast://scheduler
issue node serverAuth,clientAuth 'ballast://node/*'  # any node id: a trial's shared node certificate
for id in ${NODES:-}; do                                 # one per node, naming its id
  issue "node-$id" serverAuth,clientAuth "ballast://node/$id"
done
issue client clientAuth                                  # a public client: no ballast:// role
chmod 600 ca.key
echo "wrote $OUT: ca.pem, scheduler.pem/.key, node.pem/.key, client.pem/.key (SANs $SANS)"
