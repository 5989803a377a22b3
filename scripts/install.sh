#!/usr/bin/env bash
# Install everything rucio-fs and its tests need on a fresh Debian machine (run as root):
# system packages, a virtualenv in .venv, and rucio-fs with its test extras. Idempotent; the
# container image and CI run this same script.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
for pkg in fuse3 libfuse3-dev pkg-config attr gcc util-linux systemd patch rsync git sqlite3 s3fs; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
python3 -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3-venv)
# pyfuse3 is compiled against the Python it is installed for (a minimal Debian lacks Python.h).
python3 -c 'import os, sysconfig; assert os.path.exists(sysconfig.get_paths()["include"] + "/Python.h")' \
  2>/dev/null || need_apt+=(python3-dev)
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
# pyfuse3 is built again here from its sdist with two patches; rucio-fs works without either:
# - scripts/pyfuse3-cache-readdir.patch (15 lines): the kernel may cache directory listings
#   (docs/caches.md);
# - scripts/pyfuse3-kernel-io.patch: the session's own /dev/fuse I/O; FUSE_INIT tells the
#   kernel that lookups in one directory may run at once, which libfuse < 3.17 forgets to
#   (docs/reading.md), asks for passthrough when --passthrough wants it, and lets a new
#   file's close send no FLUSH with async write-back (docs/writing.md).
patched='import pyfuse3, sys; f = pyfuse3.FileInfo(); sys.exit(not (hasattr(f, "cache_readdir") and hasattr(f, "noflush") and hasattr(pyfuse3, "set_passthrough")))'
if ! .venv/bin/python -c "$patched"; then
  version=$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("pyfuse3").split("+")[0])')
  build=$(mktemp -d)
  quiet .venv/bin/python -m pip download -q --no-deps --no-binary :all: -d "$build" "pyfuse3==$version"
  tar -xzf "$build"/pyfuse3-*.tar.gz -C "$build"
  src=$(find "$build" -mindepth 1 -maxdepth 1 -type d -name 'pyfuse3-*')
  applied=""
  for patch_file in scripts/pyfuse3-cache-readdir.patch scripts/pyfuse3-kernel-io.patch; do
    if patch -s -p1 -d "$src" --dry-run <"$patch_file" >/dev/null; then
      patch -s -p1 -d "$src" <"$patch_file"
      name=$(basename "$patch_file" .patch)
      applied="$applied.${name#pyfuse3-}"
    else
      echo "install.sh: $patch_file does not apply to pyfuse3 $version: built without it" >&2
    fi
  done
  applied=${applied//-/}
  if [ -n "$applied" ]; then
    rm -f "$src/src/pyfuse3/__init__.c"  # made again by Cython from the patched sources
    SETUPTOOLS_SCM_PRETEND_VERSION="$version+rucio${applied}" \
      quiet .venv/bin/python -m pip install --no-deps --force-reinstall "$src"
  fi
  rm -rf "$build"
fi
rm -f "$log"
.venv/bin/rucio-fs --version >&2
