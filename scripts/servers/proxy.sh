#!/usr/bin/env bash
# The data proxy (containers/data-proxy/nginx.conf, nginx with the slice module) on 127.0.0.1.
#
#   proxy.sh install DIR      install nginx-light if missing
#   proxy.sh start DIR        start it with an empty cache; writes DIR/server.env (PROXY_URL)
#   proxy.sh stop DIR         stop it, by PID
#
# PROXY_PORT (default 18090), PROXY_CA (origins' CA bundle, default the system's),
# PROXY_CACHE_SIZE (default 20g).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cmd=${1:?usage: proxy.sh install|start|stop DIR}
BASE=$(mkdir -p "${2:?usage: proxy.sh $cmd DIR}" && cd "$2" && pwd)
PROXY_PORT=${PROXY_PORT:-18090}
PROXY_CA=${PROXY_CA:-/etc/ssl/certs/ca-certificates.crt}
log() { printf 'proxy.sh: %s\n' "$*" >&2; }
# shellcheck source=common.sh
. "$here/common.sh"

install() { nginx -V 2>&1 | grep -q http_slice_module || apt_install nginx-light; }

one_process_server "$cmd" "$BASE/nginx.pid"
rm -rf "$BASE/cache"
mkdir -p "$BASE/cache"
sed -e "s|@RUN_DIR@|$BASE|g" -e "s|@CACHE_DIR@|$BASE/cache|g" \
    -e "s|@CACHE_SIZE@|${PROXY_CACHE_SIZE:-20g}|g" -e "s|@LISTEN@|127.0.0.1:$PROXY_PORT|g" \
    -e "s|@CA_FILE@|$PROXY_CA|g" "$repo/containers/data-proxy/nginx.conf" >"$BASE/nginx.conf"
: >"$BASE/access.log"
nginx -c "$BASE/nginx.conf" -g 'user root;'
for _ in $(seq 100); do [ -s "$BASE/nginx.pid" ] && break; sleep 0.05; done
[ -s "$BASE/nginx.pid" ] || { log "nginx did not start"; cat "$BASE/error.log" >&2; exit 1; }
cat >"$BASE/server.env" <<ENV
PROXY_URL=http://127.0.0.1:$PROXY_PORT
ACCESS_LOG=$BASE/access.log
PID=$(cat "$BASE/nginx.pid")
ENV
log "data proxy on 127.0.0.1:$PROXY_PORT"
