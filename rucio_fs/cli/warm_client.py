"""``rucio-fs warm`` on the client's side: which mount, starting the daemon's warm-up,
showing its progress, and stopping it on SIGINT (Ctrl-C) or SIGTERM (see
:mod:`rucio_fs.cli.warm`)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from rucio_fs.errors import InvalidInput
from rucio_fs.observe import control
from rucio_fs.observe.mounts import FSTYPE, read_mounts

#: How often the daemon sends the walk's progress (the end comes at once, in its own reply).
EVERY = 0.25

#: The signals that cancel a warm-up, its summary still shown. Their handlers are installed
#: whatever was inherited: a command started with ``&`` by a non-interactive shell inherits
#: SIGINT ignored, and SIGTERM is how a batch system ends a job.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


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
    """Run a warm-up to its end, or until SIGINT or SIGTERM cancels it: its last progress,
    with the summary ``line`` and ``signal``, the number of the signal that cancelled it
    (else None). The warm-up lives on this process's control connection: if the process
    ends without a word (``kill -9``), the daemon cancels the walk when the connection
    closes."""
    talk: control.Conversation | None = None
    stopped: list[int] = []

    def stop(signum: int, _frame: object) -> None:
        # It raises nothing, so the reading of a reply it interrupts goes on unharmed, and
        # the daemon's reply to the cancel is the summary.
        if not stopped:
            stopped.append(signum)
            if talk is not None:
                _cancel(talk)

    tty = sys.stderr.isatty()
    previous = {signum: signal.signal(signum, stop) for signum in STOP_SIGNALS}
    try:
        talk = control.Conversation(mountpoint, "warm", paths=roots, recursive=recursive,
                                    data=data, jobs=jobs, every=EVERY)
        with talk:
            if stopped:  # a signal came before the warm-up had a connection
                _cancel(talk)
            while True:
                progress, more = talk.reply()
                if not more:
                    break
                if tty:
                    sys.stderr.write("\r" + _line(progress) + "\033[K")
                    sys.stderr.flush()
    finally:
        for signum, handler in previous.items():
            if handler is not None:
                signal.signal(signum, handler)
    if tty:
        sys.stderr.write("\r\033[K")
    progress["signal"] = stopped[0] if stopped and progress["cancelled"] else None
    progress["line"] = ("warm cancelled: " if progress["cancelled"] else "warmed ") + \
        _line(progress, final=True)
    return progress


def _cancel(talk: control.Conversation) -> None:
    with contextlib.suppress(OSError):  # the daemon has ended the conversation already
        talk.send({"op": "cancel"})


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
