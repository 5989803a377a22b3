"""FUSE passthrough (Linux >= 6.9): open files the kernel reads and writes itself, in a local
backing file, with no request reaching the daemon: staged files (async write-back) and whole
files of the disk layer (:mod:`rucio_fs.cache.whole_files`).

Contract:

* :func:`ask` before ``pyfuse3.init`` has FUSE_INIT ask the kernel for it (a pyfuse3 built
  with ``scripts/pyfuse3-kernel-io.patch``); :func:`answer` says afterwards whether the
  kernel agreed. :func:`refusal` is why ``--passthrough`` cannot work here, in one line, or
  "" when it may.
* :class:`BackingFiles` holds one backing id per local file (its open descriptor), shared by
  every open of that file and let go with the last: the kernel keeps a file's backing file
  for each open that was given it, and lets an inode have only one.
* A backing id that cannot be had (no CAP_SYS_ADMIN, a file system the kernel will not stack
  on) is None: the open then takes the daemon's path, and the failure is counted
  (``passthrough_refused``) and logged once.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Hashable, MutableMapping

import pyfuse3

log = logging.getLogger(__name__)

#: Linux release that brought FUSE passthrough.
SINCE = (6, 9)


def refusal(write_back: str, identity: str = "mount", euid: int | None = None,
            release: str | None = None, disk: bool = False) -> str:
    """Why ``--passthrough`` cannot work for this mount ("" when it may): it needs something
    to pass through — async write-back (files open for writing; sync uploads a file as it
    is written) or a disk layer (``disk``: files read whole before) — one identity (a
    per-user mount keeps each user's files on the daemon's path), root (CAP_SYS_ADMIN opens
    backing files), Linux >= 6.9, and a pyfuse3 that can ask for it."""
    euid = os.geteuid() if euid is None else euid
    release = os.uname().release if release is None else release
    if write_back != "async" and not disk:
        return "--passthrough works with --write-back async or --cache-dir"
    if identity != "mount":
        return "--passthrough works with --identity mount"
    if euid != 0:
        return "--passthrough needs root (the kernel lets only CAP_SYS_ADMIN open backing files)"
    numbers = release.split("-")[0].split(".")
    try:
        version = (int(numbers[0]), int(numbers[1]))
    except (IndexError, ValueError):
        version = (0, 0)
    if version < SINCE:
        return f"--passthrough needs Linux >= 6.9 (this is {release})"
    if not hasattr(pyfuse3, "set_passthrough"):
        return ("--passthrough needs pyfuse3 built with scripts/pyfuse3-kernel-io.patch "
                "(run scripts/install.sh)")
    return ""


def ask(enabled: bool) -> None:
    """Before ``pyfuse3.init``: whether FUSE_INIT asks the kernel for passthrough."""
    setter = getattr(pyfuse3, "set_passthrough", None)
    if setter is not None:
        setter(enabled)


def answer() -> bool | None:
    """After FUSE_INIT: whether the kernel agreed to passthrough (None: not known yet)."""
    state = getattr(pyfuse3, "passthrough", None)
    return state() if state is not None else False


class BackingFiles:
    """Backing ids of local files, by key, each shared by the opens of its file."""

    def __init__(self, events: MutableMapping[str, int]) -> None:
        self._events = events
        self._held: dict[Hashable, list[int]] = {}  # key -> [backing id, opens]
        self._warned = False

    def take(self, key: Hashable, fd: int) -> int | None:
        """A backing id for one more open of the file ``key`` (open as ``fd``); None when
        the kernel refuses one."""
        held = self._held.get(key)
        if held is None:
            try:
                backing_id = pyfuse3.backing_open(fd)
            except OSError as exc:
                self._events["passthrough_refused"] += 1
                if not self._warned:
                    self._warned = True
                    log.warning("passthrough refused (%s): files open through the daemon", exc)
                return None
            held = self._held[key] = [backing_id, 0]
        held[1] += 1
        return held[0]

    def share(self, key: Hashable) -> int | None:
        """The backing id of ``key`` for one more open, if one is held already."""
        held = self._held.get(key)
        if held is None:
            return None
        held[1] += 1
        return held[0]

    def give_back(self, key: Hashable) -> None:
        """One open of ``key`` given by :meth:`take` is closed; the last lets go of the id."""
        held = self._held.get(key)
        if held is None:
            return
        held[1] -= 1
        if held[1] <= 0:
            del self._held[key]
            try:
                pyfuse3.backing_close(held[0])
            except OSError as exc:  # the kernel keeps the file for the opens it gave it to
                log.info("backing id %d: %s", held[0], exc)

    def __len__(self) -> int:
        return len(self._held)
