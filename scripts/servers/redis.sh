#!/usr/bin/env bash
# Redis on 127.0.0.1 for the shared tier's tests and benchmarks (redis-server from apt).
#
#   redis.sh install DIR      install redis-server if missing
#   redis.sh start DIR        start it (no persistence); writes DIR/server.env: REDIS_URL (the
#                             URL a mount takes), REDIS_CLI (redis-cli's arguments), PID
#   redis.sh stop DIR         stop it, by PID
#
# The port comes from REDIS_PORT (default 16379); REDIS_MAXMEMORY (e.g. 1mb) bounds it with
# REDIS_POLICY (default noeviction: a full Redis refuses writes); REDIS_PASSWORD requires that
# password; REDIS_TLS=1 serves TLS only, with a certificate from a CA made in DIR (ca.crt).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cmd=${1:?usage: redis.sh install|start|stop DIR}
BASE=$(mkdir -p "${2:?usage: redis.sh $cmd DIR}" && cd "$2" && pwd)
REDIS_PORT=${REDIS_PORT:-16379}
log() { printf 'redis.sh: %s\n' "$*" >&2; }
# shellcheck source=common.sh
. "$here/common.sh"

install() { command -v redis-server >/dev/null || apt_install redis-server; }

one_process_server "$cmd" "$BASE/redis.pid"
args=(--bind 127.0.0.1 --save '' --appendonly no --dir "$BASE" --logfile "$BASE/redis.log"
      --pidfile "$BASE/redis.pid" --daemonize yes)
cli=(-p "$REDIS_PORT")
scheme=redis
query=
[ -n "${REDIS_MAXMEMORY:-}" ] && args+=(--maxmemory "$REDIS_MAXMEMORY"
                                         --maxmemory-policy "${REDIS_POLICY:-noeviction}")
if [ -n "${REDIS_PASSWORD:-}" ]; then
  args+=(--requirepass "$REDIS_PASSWORD")
  cli+=(-a "$REDIS_PASSWORD" --no-auth-warning)
fi
if [ "${REDIS_TLS:-0}" = 1 ]; then
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$BASE/ca.key" -out "$BASE/ca.crt" \
    -days 7 -subj /CN=rucio-fs-test-redis-ca 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -keyout "$BASE/redis.key" -out "$BASE/redis.csr" \
    -subj /CN=127.0.0.1 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >"$BASE/san.ext"
  openssl x509 -req -in "$BASE/redis.csr" -CA "$BASE/ca.crt" -CAkey "$BASE/ca.key" \
    -CAcreateserial -out "$BASE/redis.crt" -days 7 -extfile "$BASE/san.ext" 2>/dev/null
  args+=(--port 0 --tls-port "$REDIS_PORT" --tls-cert-file "$BASE/redis.crt"
         --tls-key-file "$BASE/redis.key" --tls-ca-cert-file "$BASE/ca.crt"
         --tls-auth-clients no)
  cli+=(--tls --cacert "$BASE/ca.crt")
  scheme=rediss
  query="?ca=$BASE/ca.crt"
else
  args+=(--port "$REDIS_PORT")
fi
redis-server "${args[@]}"
for _ in $(seq 100); do
  [ -s "$BASE/redis.pid" ] && kill -0 "$(cat "$BASE/redis.pid")" 2>/dev/null \
    && redis-cli "${cli[@]}" ping 2>/dev/null | grep -q PONG && break
  sleep 0.05
done
if ! { [ -s "$BASE/redis.pid" ] && kill -0 "$(cat "$BASE/redis.pid")" 2>/dev/null; }; then
  log "redis did not start (port $REDIS_PORT taken?)"; tail -5 "$BASE/redis.log" >&2; exit 1
fi
user=
[ -n "${REDIS_PASSWORD:-}" ] && user=":$REDIS_PASSWORD@"
cat >"$BASE/server.env" <<ENV
REDIS_URL=$scheme://${user}127.0.0.1:$REDIS_PORT/0$query
REDIS_PORT=$REDIS_PORT
REDIS_CLI=${cli[*]}
PID=$(cat "$BASE/redis.pid")
ENV
log "redis on 127.0.0.1:$REDIS_PORT ($scheme)"
