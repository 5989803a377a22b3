"""Adaptive sequential read-ahead of one open file into the data layer.

While reads stay sequential the window of blocks fetched ahead, in parallel and in the
background, doubles with each block read from one block up to ``max_blocks``; a random
read resets it to nothing.
All read-ahead of the mount shares one budget of in-flight blocks: when it is spent,
read-ahead shrinks (fetches are skipped, the foreground read fetches what it needs), so the
daemon never holds more than the data cache plus that budget.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import trio

from rucio_fs.backend import Entry
from rucio_fs.background import start_guarded
from rucio_fs.config import MountConfig
from rucio_fs.errors import RucioFsError
from rucio_fs.observe.stats import Stats

log = logging.getLogger(__name__)

#: The longest read-ahead request, in blocks (8 MiB with the default 1 MiB blocks).
MAX_BLOCKS_PER_REQUEST = 8


class BlockSource(Protocol):
    """Where read-ahead puts blocks (:class:`~rucio_fs.data.datapath.DataPath`)."""

    config: MountConfig
    stats: Stats

    def version_of(self, path: str, entry: Entry) -> str:
        """What keys ``entry``'s content of ``path`` in the layers."""

    def block_state(self, path: str, version: str, index: int) -> str:
        """``"memory"``, ``"coming"``, ``"disk"`` or ``"missing"``."""

    async def load_from_disk(self, path: str, version: str, entry: Entry, handle: Any,
                             index: int) -> bytes:
        """Block ``index`` from the disk layer into the data layer."""

    async def prefetch_blocks(self, path: str, version: str, entry: Entry, handle: Any,
                              first: int, count: int) -> None:
        """Blocks ``first .. first+count-1`` into the data layer with one ranged read."""


class Prefetcher:
    def __init__(self, data_path: BlockSource, path: str, entry: Entry, handle: Any,
                 nursery: trio.Nursery, budget: trio.Semaphore, max_blocks: int) -> None:
        self.data_path = data_path
        self.path = path
        self.entry = entry
        self.handle = handle
        self.nursery = nursery
        self.budget = budget
        self.max_blocks = max_blocks
        self.version = data_path.version_of(path, entry)
        self.window = 0
        self._next = 0  # first block index not yet asked for
        self._block = -1  # the block the last sequential read ended in
        self._in_flight = 0
        self._idle = trio.Event()
        self._idle.set()

    def on_read(self, offset: int, size: int, sequential: bool) -> None:
        """Adapt the window to this read and start fetching what it now covers."""
        if not sequential:
            self.window, self._next, self._block = 0, 0, -1
            return
        block_size = self.data_path.config.block_size
        current = (offset + size - 1) // block_size
        last_block = (self.entry.size - 1) // block_size
        if current != self._block or not self.window:
            # Doubles per block read, not per read: the kernel's reads may be 4 KiB or 1 MiB.
            self.window = min(max(1, 2 * self.window), self.max_blocks)
            self._block = current
        end = min(current + self.window, last_block)
        # Longer windows fetch in longer requests (fewer round trips, less per-request work).
        run_max = min(max(1, self.window // 4), MAX_BLOCKS_PER_REQUEST)
        first = max(self._next, current + 1)
        if end - first + 1 < run_max and end < last_block:
            return  # wait until a whole request's worth of blocks is due
        run: list[int] = []
        for index in range(first, end + 1):
            state = self.data_path.block_state(self.path, self.version, index)
            if state in ("memory", "coming"):
                self._start(run)
                run = []
                continue
            try:
                self.budget.acquire_nowait()
            except trio.WouldBlock:
                self.data_path.stats.events["prefetch_budget_full"] += 1
                end = index - 1
                break
            if state == "disk":  # read ahead from the disk layer, a block at a time
                self._start(run)
                run = []
                self._start([index], from_disk=True)
                continue
            run.append(index)
            if len(run) == run_max:
                self._start(run)
                run = []
        self._start(run)
        self._next = max(self._next, end + 1)

    def _start(self, run: list[int], from_disk: bool = False) -> None:
        if not run:
            return
        self._in_flight += 1
        if self._idle.is_set():
            self._idle = trio.Event()
        start_guarded(self.nursery, self.data_path.stats.events,
                      f"read-ahead of {self.path}", self._fetch, run[0], len(run), from_disk)

    async def _fetch(self, first: int, count: int, from_disk: bool) -> None:
        try:
            if from_disk:
                await self.data_path.load_from_disk(self.path, self.version, self.entry,
                                                  self.handle, first)
            else:
                await self.data_path.prefetch_blocks(self.path, self.version, self.entry,
                                                   self.handle, first, count)
        except RucioFsError as exc:  # the foreground read will fetch (and report) it
            log.debug("prefetch of %s blocks %d+%d failed: %s", self.path, first, count, exc)
        finally:
            for _ in range(count):
                self.budget.release()
            self._in_flight -= 1
            if not self._in_flight:
                self._idle.set()

    async def drain(self) -> None:
        """Wait for the fetches in flight (before the backend handle is closed)."""
        self._next = 1 << 62  # nothing new
        await self._idle.wait()
