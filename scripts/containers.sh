#!/usr/bin/env bash
# Container images without a registry: podman, a Debian base image made from the apt mirror,
# and the client image built from containers/client/Dockerfile unchanged.
#
#   containers.sh install       podman, runc, debootstrap (apt) and podman's configuration
#   containers.sh base          the base image debian:bookworm-slim, made once from the mirror
#   containers.sh build [TAG]   the client image (default tag rucio-fs), the base made first
#   containers.sh servers [s3]  the dev stacks' servers image, as their compose files name it:
#                               rucio-fs-dev-servers (Rucio and S3), or rucio-fs-dev-servers-s3
#                               (the S3 stack's), from golang:1.26-bookworm, which is made first
#                               from the base and this machine's Go
#   containers.sh env           the environment every podman command needs (eval it)
#
# podman keeps its configuration, images and run state in RUCIO_FS_CONTAINERS (default
# ~/.cache/rucio-fs/containers), so nothing of the machine's own container setup is touched.
# Its defaults do not run here (Debian 12, cgroups v1 hybrid, no systemd, a hard open-files
# limit below podman's): runc, no default ulimits and the cgroupfs manager do. Builds use the
# host's network and trust the host's CA bundle (an intercepting HTTPS proxy is common on
# build hosts), given to the build's RUN steps only, never stored in the image.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
cmd=${1:?usage: containers.sh install|base|build [TAG]|servers [s3]|env}
STATE=${RUCIO_FS_CONTAINERS:-$HOME/.cache/rucio-fs/containers}
log() { printf 'containers.sh: %s\n' "$*" >&2; }
# shellcheck source=servers/common.sh
. "$here/servers/common.sh"

environment() {
  printf 'export CONTAINERS_CONF=%s CONTAINERS_STORAGE_CONF=%s TMPDIR=%s\n' \
    "$STATE/containers.conf" "$STATE/storage.conf" "$STATE/tmp"
}

install() {
  need=()
  for pkg in podman runc debootstrap; do dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg"); done
  if ((${#need[@]})); then apt_install "${need[@]}"; fi
  mkdir -p "$STATE"/{storage,run,tmp,netconf}
  cat >"$STATE/containers.conf" <<CFG
[containers]
default_ulimits = []
[network]
network_config_dir = "$STATE/netconf"
[engine]
cgroup_manager = "cgroupfs"
runtime = "runc"
tmp_dir = "$STATE/run/libpod"
events_logger = "file"
events_logfile_path = "$STATE/run/events.log"
image_copy_tmp_dir = "$STATE/tmp"
CFG
  cat >"$STATE/storage.conf" <<CFG
[storage]
driver = "overlay"
runroot = "$STATE/run"
graphroot = "$STATE/storage"
CFG
  printf '[global]\ncert = /etc/host-ca.crt\n' >"$STATE/pip.conf"
}

mirror() {  # the Debian mirror apt uses here
  local url
  url=$(grep -hoE '^(deb|URIs:) +https?://[^ ]+' /etc/apt/sources.list /etc/apt/sources.list.d/* \
        2>/dev/null | grep -v security | head -1 | awk '{print $2}')
  echo "${url:-http://deb.debian.org/debian}"
}

base() {
  eval "$(environment)"
  if podman image exists debian:bookworm-slim; then return 0; fi
  local root="$STATE/rootfs" url
  url=$(mirror)
  log "making debian:bookworm-slim from $url"
  rm -rf "$root"
  debootstrap --variant=minbase bookworm "$root" "$url" >"$STATE/debootstrap.log" 2>&1 \
    || { tail -20 "$STATE/debootstrap.log" >&2; exit 1; }
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  printf 'deb %s bookworm main\ndeb %s bookworm-updates main\n' "$url" "$url" \
    >"$root/etc/apt/sources.list"
  tar -C "$root" -c . | podman import --change 'CMD ["bash"]' - debian:bookworm-slim >/dev/null
  rm -rf "$root"
}

golang() {  # golang:1.26-bookworm as the registry's is made: the base, Go in /usr/local/go
  local goroot version
  base
  eval "$(environment)"
  if podman image exists golang:1.26-bookworm; then return 0; fi
  command -v go >/dev/null || { log "Go 1.26 is needed to make golang:1.26-bookworm"; exit 1; }
  goroot=$(go env GOROOT)
  version=$(go env GOVERSION)
  case $version in go1.26*) ;; *) log "Go 1.26 is needed, not $version"; exit 1 ;; esac
  log "making golang:1.26-bookworm from debian:bookworm-slim and $goroot ($version)"
  mkdir -p "$STATE/golang"
  cat >"$STATE/golang/Containerfile" <<'FILE'
FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates git gcc \
      libc6-dev make pkg-config && rm -rf /var/lib/apt/lists/* \
 && cp -a /host-go /usr/local/go && mkdir -p /go/bin /go/src && chmod -R 1777 /go
ENV GOTOOLCHAIN=local GOPATH=/go PATH=/go/bin:/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
WORKDIR /go
FILE
  podman build --network host -v "$goroot:/host-go:ro" -t golang:1.26-bookworm "$STATE/golang"
}

image() {  # podman build of Dockerfile $1 as $2, with the host's network and CA bundle
  local file=$1 tag=$2
  shift 2
  eval "$(environment)"
  # (Go reads every file in /etc/ssl/certs: the bundle there is its own way in)
  podman build --network host \
    -v /etc/ssl/certs/ca-certificates.crt:/etc/host-ca.crt:ro \
    -v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/host-ca.pem:ro \
    -v "$STATE/pip.conf:/etc/pip.conf:ro" "$@" \
    -f "$repo/$file" -t "$tag" "$repo"
}

build() {
  base
  image containers/client/Dockerfile "${1:-rucio-fs}"
}

servers() {
  case ${1:-} in
    ""|s3) ;;
    *) log "servers: the images are the Rucio and S3 stacks' (no argument) or the S3 stack's (s3), not $1"; exit 2 ;;
  esac
  golang
  image containers/dev/servers/Dockerfile "rucio-fs-dev-servers${1:+-$1}" \
    --build-arg "STACKS=${1:-rucio s3}"
}

case $cmd in
  install) install ;;
  base) install; base ;;
  build) install; build "${2:-}" ;;
  servers) install; servers "${2:-}" ;;
  env) environment ;;
  *) log "unknown command $cmd"; exit 2 ;;
esac
