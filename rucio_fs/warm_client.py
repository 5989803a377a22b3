"""``rucio-fs warm`` on the client's side: which mount, starting the daemon's warm-up,
showing its progress, and stopping it on Ctrl-C (see :mod:`rucio_fs.warm`)."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

from . import control
from .errors import InvalidInput
from .mounts import FSTYPE, read_mounts

#: How long one progress request waits in the daemon for the walk to end (a long poll: the
#: end is seen at once, progress every POLL seconds meanwhile).
POLL = 0.25


def catalog_paths(paths: Sequence[str]) -> tuple[str, list[str]]:
    """The rucio-fs mount holding every one of ``paths``, and their catalog paths there
    (``/`` for the mount's root); InvalidInput naming a path on no mount, or on another."""
    mounts = sorted((m.mountpoint for m in read_mounts() if m.fstype == FSTYPE),
                    key=len, reverse=True)
    found: dict[str, list[str]] = {}
    for path in paths:
        full = os.path.abspath(path)
        mount = next((m for m in mounts if full == m or full.startswith(m.rstrip("/") + "/")),
                     None)
        if mount is None:
            raise InvalidInput(f"warm: {path} is on no rucio-fs mount")
        found.setdefault(mount, []).append("/" + full[len(mount):].strip("/"))
    if len(found) > 1:
        raise InvalidInput(f"warm: the paths are on {len(found)} mounts; warm one at a time")
    (mount, roots), = found.items()
    return mount, roots


def follow(mountpoint: str, roots: list[str], recursive: bool, data: bool,
           jobs: int) -> dict[str, Any]:
    """Run a warm-up to its end (or until Ctrl-C cancels it); its last progress, with the
    summary ``line``."""
    job = control.request(mountpoint, "warm_start", paths=roots, recursive=recursive,
                          data=data, jobs=jobs)["id"]
    tty = sys.stderr.isatty()
    try:
        while True:
            progress = control.request(mountpoint, "warm_status", id=job, wait=POLL)
            if tty:
                sys.stderr.write("\r" + _line(progress) + "\033[K")
                sys.stderr.flush()
            if progress["done"]:
                break
    except KeyboardInterrupt:
        control.request(mountpoint, "warm_cancel", id=job)
        while not (progress := control.request(mountpoint, "warm_status", id=job,
                                               wait=POLL))["done"]:
            pass
    if tty:
        sys.stderr.write("\r\033[K")
    progress["line"] = ("warm cancelled: " if progress["cancelled"] else "warmed ") + \
        _line(progress, final=True)
    return progress


def _line(p: dict[str, Any], final: bool = False) -> str:
    seconds = max(p["seconds"], 1e-6)
    moved = p["bytes_read"] if p["data"] else p["bytes_listed"]
    text = (f"{p['directories']:,} directories, {p['files']:,} files, "
            f"{_size(p['bytes_listed'])} listed"
            + (f", {_size(p['bytes_read'])} read" if p["data"] else "")
            + f" in {seconds:.1f} s ({p['files'] / seconds:,.0f} files/s, "
            f"{_size(moved / seconds)}/s)")
    if p["data"] and not final and p["bytes_read"]:
        left = (p["bytes_listed"] - p["bytes_read"]) / (p["bytes_read"] / seconds)
        text += f", ETA {left:.0f} s (of what is found so far)"
    if p["errors"]:
        text += f"; {p['errors']} error(s)"
    return text


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"
