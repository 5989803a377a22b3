"""A rucio-fs mount driven through its command line, for tests and benchmarks alike."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from rucio_fs.observe import control

RUCIO_FS = [sys.executable, "-m", "rucio_fs"]


class Mount:
    """A mount of ``url`` on directory ``path`` (made by :meth:`start`). Its statistics and
    cache drops go through the control channel, as ``rucio-fs stats``/``cache drop`` do."""

    def __init__(self, path: Path, log: Path | None = None) -> None:
        self.path = path
        self.log = log

    @classmethod
    def start(cls, url: str, path: Path, *options: str, log: Path | None = None,
              env: dict[str, str] | None = None) -> Mount:
        """Mount (returns once the mount is ready); CalledProcessError with the one-line
        error when it fails."""
        args = [*RUCIO_FS, "mount", url, str(path), *(["--log-file", str(log)] if log else []),
                *options]
        result = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
        if result.returncode != 0:
            raise subprocess.CalledProcessError(result.returncode, args, result.stdout,
                                                result.stderr)
        return cls(path, log)

    def stats(self, reset: bool = False) -> dict:
        return control.request(str(self.path), "stats", reset=reset)

    def backend_calls(self, call: str) -> int:
        return self.stats()["backend"].get(call, {"latency": {"count": 0}})["latency"]["count"]

    def fuse_calls(self, op: str, snap: dict | None = None) -> int:
        snap = snap or self.stats()
        return snap["fuse"].get(op, {"latency": {"count": 0}})["latency"]["count"]

    def drop(self, *layers: str) -> dict:
        """Empty the named cache layers (all of them when none is named)."""
        return control.request(str(self.path), "drop", layers=list(layers) or None)

    def log_text(self) -> str:
        return self.log.read_text() if self.log is not None else ""

    def unmount(self, check: bool = False) -> None:
        """Unmount; a mount that will not go is detached lazily and reported (never left
        behind silently). ``check``: and raise."""
        result = subprocess.run([*RUCIO_FS, "unmount", str(self.path)], capture_output=True,
                                text=True, timeout=300)
        if result.returncode == 0:
            return
        subprocess.run(["fusermount3", "-u", "-z", str(self.path)], capture_output=True)
        message = f"unmount of {self.path} failed: {result.stderr.strip()}"
        print(f"warning: {message} (detached lazily)", file=sys.stderr)
        if check:
            raise RuntimeError(message)
