#!/usr/bin/env bash
# Set up (if needed), mount the demo catalog and show the main job: `ls -l` of a directory of
# 10,000 files, cold then warm, and the mount's statistics. Unmount with:
#   .venv/bin/rucio-fs unmount /tmp/rucio-fs-demo
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
mnt=${1:-/tmp/rucio-fs-demo}
mkdir -p "$mnt"
if grep -q " $mnt fuse.rucio-fs " /proc/self/mountinfo; then
  .venv/bin/rucio-fs unmount "$mnt"
fi
.venv/bin/rucio-fs mount demo:// "$mnt"
echo "== mounted demo:// on $mnt"
ls -l "$mnt"
dir="$mnt/ls/files-10000"
echo "== ls -l $dir (cold):"
TIMEFORMAT='   %R s'
time (ls -l "$dir" > /tmp/rucio-fs-demo-ls.txt)
head -4 /tmp/rucio-fs-demo-ls.txt; echo "   ..."; tail -2 /tmp/rucio-fs-demo-ls.txt
echo "== ls -l $dir (warm):"
time (ls -l "$dir" > /dev/null)
echo "== head -2 $dir/file-000042.dat:"
head -2 "$dir/file-000042.dat"
echo "== ls -l $mnt/big:"
ls -l "$mnt/big"
echo "== .venv/bin/rucio-fs stats $mnt"
.venv/bin/rucio-fs stats "$mnt"
