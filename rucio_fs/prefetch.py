"""Adaptive sequential read-ahead of one open file into the data layer.

While reads stay sequential the window of blocks fetched ahead, in parallel and in the
background, doubles from one block up to ``max_blocks``; a random read resets it to nothing.
All read-ahead of the mount shares one budget of in-flight blocks: when it is spent,
read-ahead shrinks (fetches are skipped, the foreground read fetches what it needs), so the
daemon never holds more than the data cache plus that budget.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from .backend import Entry
from .catalog import Catalog, content_version
from .errors import RucioFsError

log = logging.getLogger(__name__)


class Prefetcher:
    def __init__(self, catalog: Catalog, path: str, entry: Entry, handle: Any,
                 nursery: trio.Nursery, budget: trio.Semaphore, max_blocks: int) -> None:
        self.catalog = catalog
        self.path = path
        self.entry = entry
        self.handle = handle
        self.nursery = nursery
        self.budget = budget
        self.max_blocks = max_blocks
        self.version = content_version(entry)
        self.window = 0
        self._next = 0  # first block index not yet asked for
        self._in_flight = 0
        self._idle = trio.Event()
        self._idle.set()

    def on_read(self, offset: int, size: int, sequential: bool) -> None:
        """Adapt the window to this read and start fetching what it now covers."""
        if not sequential:
            self.window, self._next = 0, 0
            return
        block_size = self.catalog.config.block_size
        current = (offset + size - 1) // block_size
        last_block = (self.entry.size - 1) // block_size
        self.window = min(max(1, 2 * self.window), self.max_blocks)
        end = min(current + self.window, last_block)
        data, stats = self.catalog.data, self.catalog.stats
        for index in range(max(self._next, current + 1), end + 1):
            if data.peek((self.path, self.version, index)) is not None:
                continue
            try:
                self.budget.acquire_nowait()
            except trio.WouldBlock:
                stats.events["prefetch_budget_full"] += 1
                end = index - 1
                break
            self._in_flight += 1
            if self._idle.is_set():
                self._idle = trio.Event()
            self.nursery.start_soon(self._fetch, index)
        self._next = max(self._next, end + 1)

    async def _fetch(self, index: int) -> None:
        try:
            await self.catalog.prefetch_block(self.path, self.version, self.entry, self.handle,
                                              index)
        except RucioFsError as exc:  # the foreground read will fetch (and report) it
            log.debug("prefetch of %s block %d failed: %s", self.path, index, exc)
        finally:
            self.budget.release()
            self._in_flight -= 1
            if not self._in_flight:
                self._idle.set()

    async def drain(self) -> None:
        """Wait for the fetches in flight (before the backend handle is closed)."""
        self._next = 1 << 62  # nothing new
        await self._idle.wait()
