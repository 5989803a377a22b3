"""What every benchmark script needs: mounts it can query and drop, timers, baselines.

Imported by the scripts in this directory (run as ``python benchmarks/<script>.py``, which puts
this directory on ``sys.path``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

RUCIO_FS = [sys.executable, "-m", "rucio_fs"]


class Mount:
    """A rucio-fs mount in a fresh directory under ``root``."""

    def __init__(self, root: Path, url: str, *options: str, env: dict | None = None) -> None:
        self.path = Path(tempfile.mkdtemp(dir=root))
        subprocess.run([*RUCIO_FS, "mount", url, str(self.path), *options], check=True, env=env)

    def stats(self) -> dict:
        out = subprocess.run([*RUCIO_FS, "stats", str(self.path), "--format", "json"],
                             check=True, capture_output=True, text=True).stdout
        return json.loads(out)

    def backend_calls(self, call: str) -> int:
        return self.stats()["backend"].get(call, {"latency": {"count": 0}})["latency"]["count"]

    def drop(self, settle: float = 0.3) -> None:
        """Every cache layer dropped, the kernel's included; then ``settle`` seconds for the
        kernel's forgets of the dropped inodes to arrive."""
        subprocess.run([*RUCIO_FS, "cache", "drop", str(self.path)], check=True,
                       stdout=subprocess.DEVNULL)
        time.sleep(settle)

    def unmount(self, check: bool = False) -> None:
        subprocess.run([*RUCIO_FS, "unmount", str(self.path)], check=check)


def timed(cmd: list[str] | str, shell: bool = False) -> float:
    """Seconds one command takes, its output discarded."""
    start = time.perf_counter()
    subprocess.run(cmd, shell=shell, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def read_whole(path: Path) -> float:
    """Seconds to open and read a file the way cat does, without starting a process."""
    start = time.perf_counter()
    with open(path, "rb") as f:
        while f.read(131072):
            pass
    return time.perf_counter() - start


def peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return int(next(x for x in f if x.startswith("VmHWM:")).split()[1]) / 1024


def drop_page_cache() -> None:
    """Cold for every file system alike: the kernel's page cache of the machine dropped."""
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


@contextmanager
def tmpfs_twin(root: Path, names: Iterable[str]) -> Iterator[Path]:
    """The same names as 4 KiB files on a fresh tmpfs: the local baseline for ls."""
    path = Path(tempfile.mkdtemp(dir=root))
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(path)], check=True)
    try:
        for name in names:
            (path / name).write_bytes(b"\0" * 4096)
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=False)


@contextmanager
def rclone_http_mount(root: Path, storage_url: str, wait_for: str) -> Iterator[Path]:
    """``rclone mount`` of an http storage root (the peer client), ready once ``wait_for``
    (a path relative to the root) shows."""
    path = Path(tempfile.mkdtemp(dir=root))
    proc = subprocess.Popen(["rclone", "mount", "--read-only", "--http-url", storage_url,
                             ":http:", str(path)], stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if (path / wait_for).exists():
                break
            time.sleep(0.1)
        yield path
    finally:
        subprocess.run(["fusermount3", "-u", str(path)], check=False)
        proc.wait(timeout=30)
