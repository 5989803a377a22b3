#!/usr/bin/env bash
# The client image's entry point: mount one catalog in the foreground until SIGTERM.
#
#   RUCIO_FS_URL         the catalog (demo://, rucio:///SCOPE, s3://BUCKET, irods://...); required
#   RUCIO_FS_MOUNTPOINT  where to mount it (default /mnt/catalog; created if missing)
#   RUCIO_FS_OPTIONS     more `rucio-fs mount` options, split on spaces
#                        (e.g. "--allow-other --xattrs -o endpoint_url=http://127.0.0.1:17070")
#
# Credentials come the usual way for each backend (RUCIO_CONFIG, AWS_*, IRODS_PASSWORD, ...).
# With arguments, runs `rucio-fs ARGS...` instead (e.g. `stats /mnt/catalog`).
#
# The daemon itself handles SIGTERM: it unmounts, finishes the uploads still pending and exits
# 0, so `docker stop` never leaves a dead mount behind. A mountpoint left dead by a container
# that was killed (SIGKILL) is lazily unmounted before mounting again.
set -euo pipefail
if (($#)); then
  exec rucio-fs "$@"
fi
url=${RUCIO_FS_URL:-}
if [ -z "$url" ]; then
  echo "rucio-fs: set RUCIO_FS_URL to the catalog to mount (e.g. RUCIO_FS_URL=demo://)" >&2
  exit 2
fi
mountpoint=${RUCIO_FS_MOUNTPOINT:-/mnt/catalog}
if ! stat "$mountpoint" >/dev/null 2>&1 && grep -q " $mountpoint fuse" /proc/self/mounts; then
  umount -l "$mountpoint"
fi
mkdir -p "$mountpoint"
# shellcheck disable=SC2086
exec rucio-fs mount --foreground ${RUCIO_FS_OPTIONS:-} "$url" "$mountpoint"
