#!/usr/bin/env bash
# The dev stacks' entry point: run one of the project's test servers in the foreground.
#
#   serve.sh rucio|s3 [DIR]     (DIR default /srv/rucio-fs-dev/KIND)
#
# Starts it with scripts/servers/KIND.sh, the very script the tests use (same configuration,
# same ports, same catalog or bucket), prints "ready: DIR/server.env" and creates DIR/ready
# (the stacks' health check), then watches every
# process that script started. SIGTERM or SIGINT stops them all by PID and exits 0; if one of
# them dies on its own, the rest are stopped and serve.sh exits 1. Extra start arguments come
# from RUCIO_FS_SERVE_ARGS (e.g. --bench for the 50,000-file Rucio dataset).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../../.." && pwd)
kind=${1:?usage: serve.sh rucio|s3 [DIR]}
case $kind in
  rucio|s3) ;;
  *) echo "serve.sh: unknown server $kind (rucio or s3)" >&2; exit 2 ;;
esac
dir=$(mkdir -p "${2:-/srv/rucio-fs-dev/$kind}" && cd "${2:-/srv/rucio-fs-dev/$kind}" && pwd)
script=$repo/scripts/servers/$kind.sh

sleeper=
stop() {
  rm -f "$dir/ready"
  [ -z "$sleeper" ] || kill "$sleeper" 2>/dev/null || true
  bash "$script" stop "$dir"
}
trap 'stop; exit 0' TERM INT
# shellcheck disable=SC2086
bash "$script" start "$dir" ${RUCIO_FS_SERVE_ARGS:-} || { stop; exit 1; }
touch "$dir/ready"
echo "ready: $dir/server.env"

while true; do
  for pidfile in "$dir"/*.pid; do
    if ! kill -0 "$(cat "$pidfile" 2>/dev/null)" 2>/dev/null; then
      echo "serve.sh: $(basename "$pidfile" .pid) is gone; stopping the rest" >&2
      stop
      exit 1
    fi
  done
  # sleep in the background so a signal is handled at once, not after the sleep
  sleep 2 & sleeper=$!
  wait "$sleeper" || true
done
