#!/usr/bin/env bash
# Makes a test certificate authority and node certificates for gRPC TLS
# (docs/ARCHITECTURE.md, "Authentication"), with openssl only.
#
#   bash tools/make_test_certs.sh DIR [NAME ...]
#
# Creates DIR/ca.pem and DIR/ca.key (a new CA, unless DIR/ca.pem exists
# already) and, for each NAME (default: "node"), DIR/NAME.pem and
# DIR/NAME.key: an ECDSA P-256 key and a certificate signed by that CA, valid
# as both a TLS server and a TLS client certificate (one per node serves its
# gRPC service and, under mutual TLS, identifies it to the others).
#
# The names the certificates are valid for come from $CERT_SAN (default
# "DNS:localhost,IP:127.0.0.1", what local clusters and tests use); for a
# real cluster list the hosts the nodes reach each other by, or one shared
# name given to every node as --tls_server_name. Validity: $CERT_DAYS days
# (default 30). Keys are written with mode 0600.
#
# For tests and trials: a production CA's key does not sit next to its
# certificates, and node certificates name their own hosts.
set -euo pipefail

if (($# < 1)); then
  echo "usage: $0 DIR [NAME ...]" >&2
  exit 2
fi
dir=$1
shift
names=("$@")
((${#names[@]})) || names=(node)
san=${CERT_SAN:-DNS:localhost,IP:127.0.0.1}
days=${CERT_DAYS:-30}

command -v openssl >/dev/null || {
  echo "$0: openssl not found (Debian package openssl)" >&2
  exit 1
}
mkdir -p "$dir"
umask 077

if [[ ! -f "$dir/ca.pem" ]]; then
  openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 \
    -nodes -keyout "$dir/ca.key" -out "$dir/ca.pem" -days "$days" \
    -subj "/O=Downpour test/CN=Downpour test CA $(date +%s%N)" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign"
fi

ext=$(mktemp)
trap 'rm -f "$ext" "$dir"/*.csr "$dir/.x509.log"' EXIT
cat >"$ext" <<EOF
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=$san
EOF

for name in "${names[@]}"; do
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$dir/$name.key" -out "$dir/$name.csr" \
    -subj "/O=Downpour test/CN=$name"
  # "Certificate request self-signature ok" and the subject go to stderr.
  openssl x509 -req -in "$dir/$name.csr" -CA "$dir/ca.pem" \
    -CAkey "$dir/ca.key" -CAcreateserial -out "$dir/$name.pem" \
    -days "$days" -extfile "$ext" 2>"$dir/.x509.log" || {
    cat "$dir/.x509.log" >&2
    exit 1
  }
done
chmod 0644 "$dir"/*.pem
echo "certificates in $dir: ca.pem$(printf ', %s.pem' "${names[@]}") (SAN $san)"
