#!/usr/bin/env bash
# A real Rucio server on 127.0.0.1 for tests and benchmarks: Rucio 41.x from PyPI under gunicorn,
# SQLite, memcached, an nginx WebDAV storage element (RSE "DAV", http + https with a
# self-signed certificate) and an XRootD one (RSE "XRD", root://), populated with the test
# catalog (see rucio_populate.py).
#
#   rucio.sh install DIR           install what is missing (apt packages, the server's virtualenv)
#   rucio.sh start DIR [--bench]   install what is missing, start, populate; writes DIR/server.env
#   rucio.sh stop DIR              stop every process it started, by PID
#   rucio.sh stop-storage DIR      stop only the storage (nginx); start-storage DIR starts it again
#   rucio.sh stop-xrootd DIR       stop only the XRootD storage; start-xrootd DIR starts it again
#
# Ports come from RUCIO_PORT, DAV_HTTP, DAV_HTTPS, MC_PORT, AUTH_TLS (the REST API over https
# with X.509 client certificates, for the x509 logins), XRD_PORT. The server's virtualenv is
# cached in RUCIO_FS_SERVER_CACHE (default ~/.cache/rucio-fs) because pip install takes over a
# minute.
#
# xrootd (Debian's 5.5) listens on every address it has and cannot be told otherwise, so it
# runs in a network namespace of its own, reached over a veth pair from this host only (a
# /30 of 10.231.0.0/16 chosen by its port).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cmd=${1:?usage: rucio.sh install|start|stop|stop-storage|start-storage DIR [--bench]}
BASE=$(mkdir -p "${2:?usage: rucio.sh $cmd DIR}" && cd "$2" && pwd)
RUCIO_VERSION=41.5.1
RUCIO_PORT=${RUCIO_PORT:-18080}; DAV_HTTP=${DAV_HTTP:-18081}; DAV_HTTPS=${DAV_HTTPS:-18443}
MC_PORT=${MC_PORT:-21211}; AUTH_TLS=${AUTH_TLS:-18444}
# The other commands find the xrootd of DIR by the port its start recorded.
if [ -z "${XRD_PORT:-}" ] && [ -s "$BASE/xrootd.port" ]; then XRD_PORT=$(cat "$BASE/xrootd.port"); fi
XRD_PORT=${XRD_PORT:-18094}
xrd_net=$((XRD_PORT % 16384 * 4))
XRD_GATEWAY=10.231.$((xrd_net >> 8)).$(((xrd_net & 255) + 1))
XRD_HOST=10.231.$((xrd_net >> 8)).$(((xrd_net & 255) + 2))
XRD_NS=rucio-fs-xrd-$XRD_PORT
# Outside DIR: the xrootd user must reach it (a test's DIR lies below directories only root enters).
XRD_DIR=/tmp/rucio-fs-xrootd-$XRD_PORT
VENV=${RUCIO_FS_SERVER_CACHE:-$HOME/.cache/rucio-fs}/rucio-$RUCIO_VERSION

log() { printf 'rucio.sh: %s\n' "$*" >&2; }
# shellcheck source=common.sh
. "$here/common.sh"
start_storage() { nginx -c "$BASE/nginx.conf"; }

start_xrootd() {  # the namespace and its link are made once; the server (re)started
  if ! ip netns pids "$XRD_NS" >/dev/null 2>&1; then
    ip netns add "$XRD_NS"
    ip link add "rfx$XRD_PORT" type veth peer name "rfxp$XRD_PORT" netns "$XRD_NS"
    ip addr add "$XRD_GATEWAY/30" dev "rfx$XRD_PORT"
    ip link set "rfx$XRD_PORT" up
    ip -n "$XRD_NS" addr add "$XRD_HOST/30" dev "rfxp$XRD_PORT"
    ip -n "$XRD_NS" link set "rfxp$XRD_PORT" up
    ip -n "$XRD_NS" link set lo up
  fi
  # As root, xrootd runs only as another user (-R), who owns what it serves and writes. It
  # enters the network namespace only: `ip netns exec` would give it a mount namespace of its
  # own too, holding a copy of every FUSE mount there is, which then outlives its unmount.
  nsenter --net="/run/netns/$XRD_NS" xrootd -R xrootd -c "$XRD_DIR/xrootd.cfg" -p "$XRD_PORT" \
    -n rfs -l "$XRD_DIR/logs/xrootd.log" -I v4 >/dev/null 2>&1 &
  echo $! >"$BASE/xrootd.pid"
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/$XRD_HOST/$XRD_PORT") 2>/dev/null && return 0
    sleep 0.1
  done
  log "xrootd did not start (see $XRD_DIR/logs)"; exit 1
}

stop_xrootd() { stop_pidfile "$BASE/xrootd.pid"; }

install() {
  need_apt=()
  for pkg in nginx-light libnginx-mod-http-dav-ext memcached openssl curl python3-venv \
             xrootd-server xrootd-client iproute2; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
  done
  if ((${#need_apt[@]})); then apt_install "${need_apt[@]}"; fi
  if [ ! -x "$VENV/bin/gunicorn" ]; then
    log "installing rucio $RUCIO_VERSION into $VENV"
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q "rucio==$RUCIO_VERSION" gunicorn >"$BASE/pip.log" 2>&1 \
      || { cat "$BASE/pip.log" >&2; exit 1; }
  fi
}

case $cmd in
  install) install; exit 0 ;;
  stop)
    for name in gunicorn nginx memcached xrootd; do stop_pidfile "$BASE/$name.pid"; done
    ip netns del "$XRD_NS" 2>/dev/null || true
    rm -rf "$XRD_DIR"
    exit 0 ;;
  stop-storage) stop_pidfile "$BASE/nginx.pid"; exit 0 ;;
  start-storage) start_storage; exit 0 ;;
  stop-xrootd) stop_xrootd; exit 0 ;;
  start-xrootd) start_xrootd; exit 0 ;;
  start) ;;
  *) log "unknown command $cmd"; exit 2 ;;
esac
bench=0; [ "${3:-}" = --bench ] && bench=1
install

SITE=$("$VENV/bin/python" -c 'import os, rucio; print(os.path.dirname(rucio.__file__))')

mkdir -p "$BASE"/{etc,logs,webdav/rucio,nginx-tmp}
rm -f "$BASE/rucio.db"
cat >"$BASE/etc/rucio.cfg" <<CFG
[common]
logdir = $BASE/logs
loglevel = WARNING
[client]
rucio_host = http://127.0.0.1:$RUCIO_PORT
auth_host = http://127.0.0.1:$RUCIO_PORT
auth_type = userpass
username = ddmlab
password = secret
account = root
ca_cert = $BASE/tls.crt
request_retries = 1
[database]
default = sqlite:///$BASE/rucio.db
[bootstrap]
userpass_identity = ddmlab
userpass_pwd = secret
userpass_email = root@localhost
[alembic]
cfg = $BASE/etc/alembic.ini
[policy]
permission = generic
schema = generic
lfn2pfn_algorithm_default = hash
support = nobody@localhost
support_rucio = none
[cache]
url = 127.0.0.1:$MC_PORT
# Tokens validated by the server live in memcached, not in each worker's memory: a test can
# expire them all at once.
use_external_cache_for_auth_tokens = True
[monitor]
enable_metrics = False
CFG
# alembic needs the logging sections: migrate_repo/env.py calls fileConfig().
cat >"$BASE/etc/alembic.ini" <<CFG
[alembic]
sqlalchemy.url = sqlite:///$BASE/rucio.db
script_location = $SITE/db/sqla/migrate_repo/
[loggers]
keys = root
[handlers]
keys = console
[formatters]
keys = generic
[logger_root]
level = WARN
handlers = console
[handler_console]
class = StreamHandler
args = (sys.stderr,)
formatter = generic
[formatter_generic]
format = %(levelname)s [%(name)s] %(message)s
CFG
export RUCIO_CONFIG=$BASE/etc/rucio.cfg

# Without memcached Rucio silently disables its cache and replica listing gets ~6x slower.
memcached -u root -l 127.0.0.1 -p "$MC_PORT" -m 128 -d -P "$BASE/memcached.pid"
"$VENV/bin/python" -c 'from rucio.db.sqla.util import build_database as b, create_base_vo as v, create_root_account as r; b(); v(); r()' \
  >"$BASE/logs/bootstrap.log" 2>&1 || { cat "$BASE/logs/bootstrap.log" >&2; exit 1; }
# --timeout above the longest listing: a killed sync worker truncates a 200 response mid-stream.
"$VENV/bin/gunicorn" -D -b "127.0.0.1:$RUCIO_PORT" -w 2 --timeout 600 --pid "$BASE/gunicorn.pid" \
  --error-logfile "$BASE/logs/gunicorn.log" --access-logfile "$BASE/logs/access.log" \
  --pythonpath "$here" rucio_wsgi:application

openssl req -x509 -newkey rsa:2048 -nodes -keyout "$BASE/tls.key" -out "$BASE/tls.crt" -days 7 \
  -subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1,DNS:localhost 2>/dev/null
# Rucio's webdav protocol insists on an X.509 "proxy" file even though nginx asks for none.
cat "$BASE/tls.crt" "$BASE/tls.key" >"$BASE/x509up.pem"
# A user CA and a user certificate for the x509 logins (the proxy file is cert + key).
openssl req -x509 -newkey rsa:2048 -nodes -keyout "$BASE/userca.key" -out "$BASE/userca.crt" \
  -days 7 -subj /CN=rucio-fs-test-ca 2>/dev/null
openssl req -newkey rsa:2048 -nodes -keyout "$BASE/usercert.key" -out "$BASE/usercert.csr" \
  -subj /CN=rucio-fs-test-user 2>/dev/null
openssl x509 -req -in "$BASE/usercert.csr" -CA "$BASE/userca.crt" -CAkey "$BASE/userca.key" \
  -CAcreateserial -out "$BASE/usercert.pem" -days 7 2>/dev/null
cat "$BASE/usercert.pem" "$BASE/usercert.key" >"$BASE/userproxy.pem"
chmod 600 "$BASE"/*.key "$BASE/userproxy.pem"
cat >"$BASE/nginx.conf" <<CFG
load_module /usr/lib/nginx/modules/ngx_http_dav_ext_module.so;
user root; worker_processes 2; pid $BASE/nginx.pid; error_log $BASE/logs/nginx-error.log warn;
events { worker_connections 1024; }
http {
  access_log $BASE/logs/nginx-access.log; sendfile on; keepalive_requests 100000;
  client_body_temp_path $BASE/nginx-tmp/body; proxy_temp_path $BASE/nginx-tmp/p;
  fastcgi_temp_path $BASE/nginx-tmp/f; uwsgi_temp_path $BASE/nginx-tmp/u; scgi_temp_path $BASE/nginx-tmp/s;
  server {
    listen 127.0.0.1:$DAV_HTTP; listen 127.0.0.1:$DAV_HTTPS ssl;
    ssl_certificate $BASE/tls.crt; ssl_certificate_key $BASE/tls.key;
    root $BASE/webdav; client_max_body_size 0;
    location / { dav_methods PUT DELETE MKCOL COPY MOVE; dav_ext_methods PROPFIND OPTIONS;
                 create_full_put_path on; autoindex on; }
  }
  server {  # the REST API over https; the client certificate's subject goes to Rucio
    listen 127.0.0.1:$AUTH_TLS ssl;
    ssl_certificate $BASE/tls.crt; ssl_certificate_key $BASE/tls.key;
    ssl_client_certificate $BASE/userca.crt; ssl_verify_client optional;
    location / { proxy_pass http://127.0.0.1:$RUCIO_PORT;
                 proxy_set_header X-SSL-Client-S-DN \$ssl_client_s_dn_legacy; }
  }
}
CFG
start_storage

stop_xrootd
echo "$XRD_PORT" >"$BASE/xrootd.port"
rm -rf "$XRD_DIR"  # a fresh catalog needs fresh storage
mkdir -p "$XRD_DIR"/{data,admin,logs}
cat >"$XRD_DIR/xrootd.cfg" <<CFG
all.adminpath $XRD_DIR/admin
all.pidpath $XRD_DIR/admin
oss.localroot $XRD_DIR/data
all.export /
xrootd.chksum adler32
CFG
chown -R xrootd:xrootd "$XRD_DIR"
start_xrootd

for _ in $(seq 150); do
  curl -sf "http://127.0.0.1:$RUCIO_PORT/ping" >/dev/null && break
  sleep 0.2
done
curl -sf "http://127.0.0.1:$RUCIO_PORT/ping" >/dev/null || { log "server did not start"; exit 1; }

cat >"$BASE/server.env" <<ENV
RUCIO_CONFIG=$BASE/etc/rucio.cfg
RUCIO_HOST=http://127.0.0.1:$RUCIO_PORT
DAV_ROOT=$BASE/webdav
DAV_HTTP=$DAV_HTTP
DAV_HTTPS=$DAV_HTTPS
CA_CERT=$BASE/tls.crt
ACCESS_LOG=$BASE/logs/access.log
AUTH_TLS_URL=https://127.0.0.1:$AUTH_TLS
USER_CERT=$BASE/usercert.pem
USER_KEY=$BASE/usercert.key
USER_PROXY=$BASE/userproxy.pem
USER_DN=/CN=rucio-fs-test-user
RUCIO_CLI=$VENV/bin/rucio
CLI_X509_PROXY=$BASE/x509up.pem
XRD_ROOT=$XRD_DIR/data
XRD_URL=root://$XRD_HOST:$XRD_PORT
ENV
# A fresh catalog needs fresh storage (rucio upload skips a file it finds already there); the
# 4.2 GB file is kept, it is the same bytes every time.
find "$BASE/webdav" -type f ! -name 'frame-4509715660.gwf' -delete
X509_USER_PROXY=$BASE/x509up.pem "$VENV/bin/python" "$here/rucio_populate.py" "$BASE" \
  --dav-http "$DAV_HTTP" --dav-https "$DAV_HTTPS" --rucio "$VENV/bin/rucio" \
  --big-writer "$repo/.venv/bin/python" --xrd-host "$XRD_HOST" --xrd-port "$XRD_PORT" --xrd-root "$XRD_DIR/data" \
  $( ((bench)) && echo --bench )
chown -R xrootd:xrootd "$XRD_DIR/data"
log "ready: $BASE/server.env"
