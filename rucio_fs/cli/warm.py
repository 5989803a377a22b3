"""Filling a mount's caches for a tree before a job reads it (``rucio-fs warm``).

A warm-up runs inside the daemon, so the caches it fills are the ones the mount serves from:
each directory is listed through the catalog (the listing layer, and the metadata of every
entry with it), recursively on request; with ``data`` every file's blocks are read through
the data path too (the data layer, and the disk layer when the mount has one). At most
``jobs`` directories or files are worked on at once, each file one block at a time, so the
memory it holds stays within ``jobs`` blocks beside the mount's own budget. A failure on
one path is counted and the walk goes on.

The walk lives on its client's control connection (:meth:`Warmer.converse`): the client
follows its progress there and may cancel it, and when the client hangs up — exits however
it does, ``kill -9`` too — the walk is cancelled, so nothing goes on reading for nobody.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import trio

from rucio_fs.backend import Entry
from rucio_fs.cache.caches import Listing
from rucio_fs.catalog.catalog import Catalog, child_path
from rucio_fs.errors import RucioFsError
from rucio_fs.observe.control import Peer

log = logging.getLogger(__name__)

#: Error messages kept for the summary (the rest are counted).
MAX_ERRORS_KEPT = 20


@dataclass
class Warmer:
    """One warm-up of ``roots`` (catalog paths) on ``catalog``."""

    catalog: Catalog
    roots: list[str]
    recursive: bool = False
    data: bool = False
    jobs: int = 8
    directories: int = 0
    files: int = 0
    bytes_listed: int = 0
    bytes_read: int = 0
    errors: int = 0
    messages: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    finished: float | None = None
    cancelled: bool = False
    #: The client hung up before the walk's end (which cancelled it).
    abandoned: bool = False
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    #: Set when the walk has ended (done or cancelled).
    ended: trio.Event = field(default_factory=trio.Event)

    async def run(self) -> None:
        """Walk every root; returns when done or cancelled."""
        send, receive = trio.open_memory_channel[tuple[str, Entry | None]](float("inf"))
        pending = len(self.roots)
        idle = trio.Event()
        if not pending:
            idle.set()

        async def worker() -> None:
            nonlocal pending
            async for path, entry in receive:
                try:
                    for child in await self._visit(path, entry):
                        pending += 1
                        send.send_nowait(child)
                except RucioFsError as exc:
                    self._failed(path, exc)
                pending -= 1
                if not pending:
                    idle.set()

        with self.scope:
            for root in self.roots:
                send.send_nowait((root, None))
            async with trio.open_nursery() as nursery:
                for _ in range(self.jobs):
                    nursery.start_soon(worker)
                await idle.wait()
                nursery.cancel_scope.cancel()
        self.cancelled = self.scope.cancelled_caught
        self.finished = time.monotonic()
        self.ended.set()

    def cancel(self) -> None:
        """Stop the walk (before it starts, too); :meth:`run` returns soon after."""
        self.scope.cancel()

    async def converse(self, peer: Peer, every: float) -> dict[str, Any]:
        """Run the walk for the client on ``peer``: its progress sent every ``every``
        seconds, the walk cancelled when the client sends ``{"op": "cancel"}`` or hangs up
        (then :attr:`abandoned`). Returns the last progress, for the final reply, once the
        walk has ended."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._listen, peer)
            async with trio.open_nursery() as walk:
                walk.start_soon(self.run)
                walk.start_soon(self._report, peer, every)
            nursery.cancel_scope.cancel()
        return self.progress()

    async def _listen(self, peer: Peer) -> None:
        while (message := await peer.receive()) is not None:
            if message.get("op") == "cancel":
                self.cancel()
        self._hung_up()

    async def _report(self, peer: Peer, every: float) -> None:
        # A send is never cancelled half-way (a client stopped by Ctrl-Z and continued would
        # read a torn line): this loop ends itself, after its send, once the walk is over.
        while True:
            with trio.move_on_after(every):
                await self.ended.wait()
            if self.ended.is_set():
                return
            if not await peer.send(self.progress()):
                self._hung_up()
                return

    def _hung_up(self) -> None:
        if not self.ended.is_set() and not self.abandoned:
            self.abandoned = True
            log.info("warm of %s: its client hung up; the walk is cancelled",
                     ", ".join(self.roots))
            self.cancel()

    async def _visit(self, path: str, entry: Entry | None) -> list[tuple[str, Entry | None]]:
        """Warm one path; the subdirectories (and, for data, files) still to visit."""
        if entry is None:
            entry = await self.catalog.stat(path)
        if not entry.is_dir:
            self.files += 1
            self.bytes_listed += entry.size
            if self.data:
                await self._read(path, entry)
            return []
        listing = await self.catalog.list(path)
        await _complete(listing)
        self.directories += 1
        children: list[tuple[str, Entry | None]] = []
        for child in listing.entries:
            if child is None:
                continue
            if child.is_dir:
                if self.recursive:
                    children.append((child_path(path, child.name), child))
            elif self.data:
                children.append((child_path(path, child.name), child))
            else:
                self.files += 1
                self.bytes_listed += child.size
        return children

    async def _read(self, path: str, entry: Entry) -> None:
        handle = await self.catalog.open(path, entry)
        try:
            block = self.catalog.config.block_size
            for offset in range(0, entry.size, block):
                size = min(block, entry.size - offset)
                await self.catalog.data_path.read(path, entry, handle, offset, size)
                self.bytes_read += size
        finally:
            await self.catalog.close(handle)

    def _failed(self, path: str, exc: RucioFsError) -> None:
        self.errors += 1
        if len(self.messages) < MAX_ERRORS_KEPT:
            self.messages.append(f"{path}: {exc}")
        log.warning("warm: %s: %s", path, exc)

    def progress(self) -> dict[str, Any]:
        """What the client shows: counts, bytes, seconds, and whether it is over."""
        end = self.finished if self.finished is not None else time.monotonic()
        return {"directories": self.directories, "files": self.files,
                "bytes_listed": self.bytes_listed, "bytes_read": self.bytes_read,
                "errors": self.errors, "messages": list(self.messages),
                "seconds": end - self.started, "done": self.finished is not None,
                "cancelled": self.cancelled, "data": self.data}


async def _complete(listing: Listing) -> None:
    """Until ``listing`` is whole; its error if it could not be completed."""
    while not listing.done:
        await listing.wait_beyond(len(listing.entries))
    if listing.error is not None:
        raise listing.error
