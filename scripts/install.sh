#!/usr/bin/env bash
# Install everything rucio-fs and its tests need on a fresh Debian machine (run as root):
# system packages, a virtualenv in .venv, and rucio-fs with its test extras. Idempotent; the
# container image and CI run this same script.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
for pkg in fuse3 libfuse3-dev pkg-config attr gcc util-linux systemd; do
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
rm -f "$log"
.venv/bin/rucio-fs --version >&2
