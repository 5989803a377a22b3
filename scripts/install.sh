#!/usr/bin/env bash
# Install everything rucio-fs and its tests need on a fresh Debian machine (run as root):
# system packages, a virtualenv in .venv, and rucio-fs with its test extras. Idempotent; the
# container image and CI run this same script.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
for pkg in fuse3 libfuse3-dev pkg-config attr gcc util-linux systemd patch; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
python3 -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3-venv)
if ((${#need_apt[@]})); then
  echo "install.sh: apt-get install ${need_apt[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi
[ -e /dev/fuse ] || modprobe fuse 2>/dev/null || true

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
log=$(mktemp)
quiet() { "$@" >"$log" 2>&1 || { cat "$log" >&2; echo "install.sh: failed: $*" >&2; exit 1; }; }
quiet .venv/bin/python -m pip install --upgrade pip
# pyfuse3 ships as an sdist only: this compiles it against libfuse3.
quiet .venv/bin/python -m pip install -e ".[test]"
# pyfuse3 cannot ask the kernel to cache directory listings: its sdist is built again here
# with scripts/pyfuse3-cache-readdir.patch (15 lines). rucio-fs works without it (docs/caches.md).
if ! .venv/bin/python -c 'import pyfuse3, sys; sys.exit(not hasattr(pyfuse3.FileInfo(), "cache_readdir"))'; then
  version=$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("pyfuse3"))')
  build=$(mktemp -d)
  quiet .venv/bin/python -m pip download -q --no-deps --no-binary :all: -d "$build" "pyfuse3==$version"
  tar -xzf "$build"/pyfuse3-*.tar.gz -C "$build"
  src=$(find "$build" -mindepth 1 -maxdepth 1 -type d -name 'pyfuse3-*')
  if patch -s -p1 -d "$src" --dry-run <scripts/pyfuse3-cache-readdir.patch >/dev/null; then
    patch -s -p1 -d "$src" <scripts/pyfuse3-cache-readdir.patch
    rm -f "$src/src/pyfuse3/__init__.c"  # made again by Cython from the patched sources
    SETUPTOOLS_SCM_PRETEND_VERSION="$version+cachereaddir" \
      quiet .venv/bin/python -m pip install --no-deps --force-reinstall "$src"
  else
    echo "install.sh: the listing-cache patch does not apply to pyfuse3 $version: kernel listing cache off" >&2
  fi
  rm -rf "$build"
fi
rm -f "$log"
.venv/bin/rucio-fs --version >&2
