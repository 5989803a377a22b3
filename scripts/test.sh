#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite through real FUSE mounts (run as root).
# Extra arguments go to pytest, e.g. `scripts/test.sh -k caches`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
.venv/bin/ruff check .
exec .venv/bin/python -m pytest "$@"
