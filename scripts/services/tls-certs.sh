#!/usr/bin/env bash
# Throw-away certificates for the test servers: `tls-certs.sh DIR [OWNER]` writes, once, into DIR
#   ca.crt, ca.key          a test CA (10 years)
#   server.crt, server.key  signed by it, for DNS:localhost and IP:127.0.0.1
#   other-ca.crt            an unrelated CA (a client trusting it must refuse the server)
# and hands the key files to OWNER (the server's user) when given. Prints DIR.
set -euo pipefail
DIR=$1
OWNER=${2:-}
if [ ! -s "$DIR/server.crt" ] || [ ! -s "$DIR/other-ca.crt" ]; then
  if ! command -v openssl >/dev/null 2>&1; then
    echo "installing openssl (apt) for the test certificates..." >&2
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssl; } \
      >/tmp/meshql-apt-openssl.log 2>&1 || { cat /tmp/meshql-apt-openssl.log >&2; exit 1; }
  fi
  mkdir -p "$DIR"
  tmp=$(mktemp -d "$DIR/.gen.XXXXXX")
  (
    cd "$tmp"
    ca() { # name, common name
      openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
        -subj "/CN=$2" -keyout "$1.key" -out "$1.crt" \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
    }
    ca ca "meshql test CA"
    ca other-ca "meshql unrelated test CA"
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
      -subj "/CN=localhost" -keyout server.key -out server.csr
    printf '%s\n' "subjectAltName=DNS:localhost,IP:127.0.0.1" "basicConstraints=CA:FALSE" \
      "keyUsage=critical,digitalSignature" "extendedKeyUsage=serverAuth" > server.ext
    openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
      -extfile server.ext -out server.crt
    chmod 600 ./*.key
  ) >"$DIR/openssl.log" 2>&1 || { cat "$DIR/openssl.log" >&2; rm -rf "$tmp"; exit 1; }
  for f in ca.crt ca.key other-ca.crt server.crt server.key; do mv "$tmp/$f" "$DIR/$f"; done
  rm -rf "$tmp" "$DIR/other-ca.key"
fi
if [ -n "$OWNER" ] && [ "$(id -u)" = 0 ]; then
  chown "$OWNER" "$DIR" "$DIR/server.key" "$DIR/server.crt" "$DIR/ca.crt"
fi
chmod 644 "$DIR/ca.crt" "$DIR/other-ca.crt" "$DIR/server.crt"
echo "$DIR"
