#!/usr/bin/env bash
# Real S3 servers on 127.0.0.1 for tests and benchmarks:
#   versitygw v1.8.0 (posix backend, with HTTP keep-alive as real S3 has: off by default in
#   versitygw, which then closes every connection; internal IAM for accounts besides the
#   root one, made with `$VGW_BIN admin`) — the main server, fast and strict;
#   moto server (pip, in the project's venv) — keeps every key exactly as written (a//b, x/../y,
#   an object k beside k/child), which a posix-backed server normalises or refuses.
#
#   s3.sh install DIR   build versitygw and install moto if missing
#   s3.sh start DIR     install what is missing, start both, create bucket "test" on each;
#                       writes DIR/server.env (endpoints, credentials, versitygw's access log)
#   s3.sh stop DIR      stop both, by PID
#   s3.sh stop-gw DIR / start-gw DIR   stop or start only versitygw (server-down tests)
#
# Ports come from VGW_PORT and MOTO_PORT. The versitygw binary is cached in
# RUCIO_FS_SERVER_CACHE (default ~/.cache/rucio-fs): a cold `go install` takes about 3.5 min.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cmd=${1:?usage: s3.sh install|start|stop|stop-gw|start-gw DIR}
BASE=$(mkdir -p "${2:?usage: s3.sh $cmd DIR}" && cd "$2" && pwd)
VGW_VERSION=v1.8.0
VGW_PORT=${VGW_PORT:-17070}; MOTO_PORT=${MOTO_PORT:-17071}
CACHE=${RUCIO_FS_SERVER_CACHE:-$HOME/.cache/rucio-fs}
VGW=$CACHE/versitygw-$VGW_VERSION/bin/versitygw
PY=${PYTHON:-$repo/.venv/bin/python}
ACCESS=rucio-fs-test; SECRET=rucio-fs-test-secret

log() { printf 's3.sh: %s\n' "$*" >&2; }
# shellcheck source=common.sh
. "$here/common.sh"
wait_http() {  # wait_http URL: until anything answers (an S3 error is an answer)
  for _ in $(seq 200); do
    curl -s -o /dev/null "$1" && return 0
    sleep 0.05
  done
  log "nothing answers at $1"; return 1
}
start_gw() {
  # shellcheck disable=SC1091
  . "$BASE/server.env"
  # --iam-dir: accounts besides the root one (per-user tests make users owning a bucket).
  # --access-log: a line per request, so tests count what a client asked of the server.
  mkdir -p "$BASE/vgw-iam"
  ROOT_ACCESS_KEY_ID=$ACCESS ROOT_SECRET_ACCESS_KEY=$SECRET \
    setsid "$VGW" --port "127.0.0.1:$VGW_PORT" --quiet --keep-alive --iam-dir "$BASE/vgw-iam" \
    --access-log "$BASE/vgw-access.log" posix "$BASE/vgw-data" \
    >>"$BASE/versitygw.log" 2>&1 &
  echo $! >"$BASE/versitygw.pid"
  wait_http "http://127.0.0.1:$VGW_PORT/"
}

install() {
  command -v curl >/dev/null || apt_install curl
  if [ ! -x "$VGW" ]; then
    command -v go >/dev/null || { log "Go is needed to build versitygw (https://go.dev/dl)"; exit 1; }
    log "building versitygw $VGW_VERSION into $VGW (about 3.5 min when cold)"
    GOBIN=$(dirname "$VGW") go install "github.com/versity/versitygw/cmd/versitygw@$VGW_VERSION" \
      >"$BASE/go-install.log" 2>&1 || { tail -20 "$BASE/go-install.log" >&2; exit 1; }
  fi
  "$PY" -c 'import moto.server' 2>/dev/null || {
    log "installing moto[server] into $("$PY" -c 'import sys; print(sys.prefix)')"
    "$PY" -m pip install -q 'moto[server]>=5.0' >"$BASE/pip.log" 2>&1 || { cat "$BASE/pip.log" >&2; exit 1; }
  }
}

case $cmd in
  install) install; exit 0 ;;
  stop)
    for name in versitygw moto; do stop_pidfile "$BASE/$name.pid"; done
    exit 0 ;;
  stop-gw) stop_pidfile "$BASE/versitygw.pid"; exit 0 ;;
  start-gw) start_gw; exit 0 ;;
  start) ;;
  *) log "unknown command $cmd"; exit 2 ;;
esac

install

mkdir -p "$BASE/vgw-data"
cat >"$BASE/server.env" <<EOF
VGW_PORT=$VGW_PORT
VGW_ENDPOINT=http://127.0.0.1:$VGW_PORT
MOTO_ENDPOINT=http://127.0.0.1:$MOTO_PORT
AWS_ACCESS_KEY_ID=$ACCESS
AWS_SECRET_ACCESS_KEY=$SECRET
AWS_REGION=us-east-1
VGW_DATA=$BASE/vgw-data
VGW_ACCESS_LOG=$BASE/vgw-access.log
VGW_BIN=$VGW
EOF
start_gw
setsid "$PY" -m moto.server -H 127.0.0.1 -p "$MOTO_PORT" >>"$BASE/moto.log" 2>&1 &
echo $! >"$BASE/moto.pid"
wait_http "http://127.0.0.1:$MOTO_PORT/"

# Bucket "test" on both, created with the same signing code the backend uses (botocore).
AWS_ACCESS_KEY_ID=$ACCESS AWS_SECRET_ACCESS_KEY=$SECRET "$PY" - "$VGW_PORT" "$MOTO_PORT" <<'EOF'
import sys
import botocore.session
session = botocore.session.get_session()
for port in sys.argv[1:]:
    s3 = session.create_client("s3", endpoint_url=f"http://127.0.0.1:{port}",
                               region_name="us-east-1")
    try:
        s3.create_bucket(Bucket="test")
    except s3.exceptions.BucketAlreadyOwnedByYou:
        pass
EOF
log "versitygw on 127.0.0.1:$VGW_PORT, moto on 127.0.0.1:$MOTO_PORT (bucket test)"
