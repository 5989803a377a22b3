#!/usr/bin/env bash
# Redis on 127.0.0.1 for the shared tier's tests and benchmarks (redis-server from apt).
#
#   redis.sh install DIR      install redis-server if missing
#   redis.sh start DIR        start it (no persistence); writes DIR/server.env (REDIS_URL, PID)
#   redis.sh stop DIR         stop it, by PID
#
# The port comes from REDIS_PORT (default 16379); REDIS_MAXMEMORY (e.g. 1mb) bounds it with
# REDIS_POLICY (default noeviction: a full Redis refuses writes).
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
extra=()
[ -n "${REDIS_MAXMEMORY:-}" ] && extra+=(--maxmemory "$REDIS_MAXMEMORY"
                                          --maxmemory-policy "${REDIS_POLICY:-noeviction}")
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
  --dir "$BASE" --logfile "$BASE/redis.log" --pidfile "$BASE/redis.pid" --daemonize yes \
  "${extra[@]}"
for _ in $(seq 100); do
  [ -s "$BASE/redis.pid" ] && kill -0 "$(cat "$BASE/redis.pid")" 2>/dev/null \
    && redis-cli -p "$REDIS_PORT" ping 2>/dev/null | grep -q PONG && break
  sleep 0.05
done
if ! { [ -s "$BASE/redis.pid" ] && kill -0 "$(cat "$BASE/redis.pid")" 2>/dev/null; }; then
  log "redis did not start (port $REDIS_PORT taken?)"; tail -5 "$BASE/redis.log" >&2; exit 1
fi
cat >"$BASE/server.env" <<ENV
REDIS_URL=redis://127.0.0.1:$REDIS_PORT/0
REDIS_PORT=$REDIS_PORT
PID=$(cat "$BASE/redis.pid")
ENV
log "redis on 127.0.0.1:$REDIS_PORT"
