"""The data path: how the bytes of a read are found — data layer, disk layer, backend.

Blocks are ``block_size`` pieces of one version of a file, keyed ``(path, version, index)``,
so a changed file is never served from stale blocks. A :class:`ReadStream` per open handle
tells sequential reads from random ones and drives the handle's read-ahead
(:mod:`rucio_fs.data.prefetch`); :class:`DataPath` serves the reads of every stream of the mount.
Backend reads come in through one function the catalog gives (timed, counted, shared), so
this module never sees the backend itself.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections import Counter
from collections.abc import Awaitable, Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any

import trio
from cachetools import LRUCache, TTLCache

from rucio_fs.backend import Entry, content_version
from rucio_fs.background import start_guarded, survive
from rucio_fs.cache.accounting import BackendCalls
from rucio_fs.cache.budget import Shares
from rucio_fs.cache.caches import CacheLayer, byte_cache
from rucio_fs.cache.disk_cache import DiskCache
from rucio_fs.config import MountConfig
from rucio_fs.observe.stats import Stats

from .integrity import cheapest, new_hash
from .prefetch import Prefetcher
from .strides import HandleUsers, PieceStore, StrideReader

log = logging.getLogger(__name__)

#: Blocks waiting to be written to the disk layer.
DISK_QUEUE_BLOCKS = 32

#: How long (seconds) a file read sparsely is opened direct (see DataPath.read_sparsely).
SPARSE_MEMORY = 60.0
#: The most files remembered as read sparsely.
SPARSE_FILES = 4096
#: What a small first read at offset 0 (a file's header) fetches.
HEAD_PIECE = 16 << 10
#: The most paths whose change through the mount is remembered (:meth:`DataPath.changed`):
#: far more than the blocks the data layer holds, whose keys the marks keep apart.
CHANGED_PATHS = 65536
#: A page: what a buffered reader (Python, stdio) reads after a direct read of whole pages.
PAGE = 4096
#: Blocks a file read whole may lack in the disk layer and still be completed and sealed.
SEAL_MISSING = 8

#: ``fetch(handle, offset, size)``: exactly those bytes from the backend, counted.
Fetch = Callable[[Any, int, int], Awaitable[bytes]]


@dataclass(frozen=True, slots=True)
class _Seal:
    """A request to the disk writers: seal the blocks of this content into a whole file
    (:meth:`~rucio_fs.cache.disk_cache.DiskCache.seal`), after the blocks queued before."""

    path: str
    version: str
    size: int
    checksums: dict[str, str]


class DataPath:
    """The data and disk layers of a mount, and the reads that fill them."""

    def __init__(self, config: MountConfig, stats: Stats, calls: BackendCalls, fetch: Fetch,
                 disk: DiskCache | None = None) -> None:
        self.config = config
        self.stats = stats
        self.calls = calls
        self.disk = disk
        self._fetch_exact = fetch
        shares = Shares(config.memory_limit)
        self.data: CacheLayer[bytes] = CacheLayer(
            "data", config.data, byte_cache(max(shares.data_cache, config.block_size)), stats)
        #: Blocks all read-ahead of the mount may have in flight (its share of the memory).
        self.prefetch_budget = trio.Semaphore(
            max(1, shares.read_ahead // config.block_size)
            if config.data and config.prefetch_max_bytes else 1)
        # Blocks go to the disk layer in the background, several written at once; reads wait
        # only when the disk falls a whole queue behind the network.
        # (Each with the mark its path had when the block was fetched: see :meth:`changed`.)
        self._disk_send, self._disk_recv = trio.open_memory_channel[
            tuple[Any, Any, str | None]](DISK_QUEUE_BLOCKS)
        #: Blocks of each path being written to the disk layer now.
        self._writing: Counter[str] = Counter()
        #: Paths whose content changed through this mount, each with a mark no other content
        #: of the path had in this mount (see :meth:`version_of`).
        self._marks: LRUCache[str, str] = LRUCache(CHANGED_PATHS)
        self._mark_prefix = os.urandom(4).hex()
        self._changes = itertools.count(1)
        #: Files (path, content version) read sparsely a moment ago.
        self._sparse: TTLCache[tuple[str, str], bool] = TTLCache(SPARSE_FILES, SPARSE_MEMORY)
        #: Pieces fetched ahead of strided readers, the readers (per file content and thread)
        #: and the backend handles their fetches use.
        self.pieces = PieceStore(shares.pieces, stats)
        self._strides: TTLCache[tuple[str, str, int], StrideReader] = TTLCache(
            SPARSE_FILES, SPARSE_MEMORY)
        self.handle_users = HandleUsers()

    def version_of(self, path: str, entry: Entry) -> str:
        """What keys ``entry``'s content of ``path`` in every layer: its content version,
        marked apart once this mount changed the path. A backend whose versions are coarse
        (iRODS: the modification second and the size) gives a rewrite within the same
        second, to the same size, the version of the content it replaced: blocks, pieces
        and verdicts of that content must never be taken for it."""
        version = content_version(entry)
        mark = self._marks.get(path)
        return version if mark is None else f"{version}~{mark}"

    def changed(self, path: str, old: Entry | None) -> None:
        """The content of ``path`` changed through this mount (written, truncated, replaced
        or removed); ``old`` is what it was, if known. Nothing read of it before is served
        for it again: from now on its content is keyed apart (:meth:`version_of`), and
        blocks of ``old`` leave the layers (on disk, a later mount keys content as the
        server versions it, and a later ``touch`` may give the new content the old one's
        version). A block fetched before the change and still queued for the disk is not
        written."""
        if old is not None and not old.is_dir:
            for version in {self.version_of(path, old), content_version(old)}:
                self._drop_blocks(path, version, old.size)
        self._marks[path] = f"{self._mark_prefix}.{next(self._changes)}"

    def _drop_blocks(self, path: str, version: str, size: int) -> None:
        """Forget the blocks of ``size`` bytes of content ``version`` of ``path``, in memory
        and on disk."""
        for index in range(-(-size // self.config.block_size)):
            key = (path, version, index)
            self.data.discard(key)
            if self.disk is not None and self.disk.has(key):
                self.disk.discard(key)

    def stream(self, path: str, entry: Entry, handle: Any, nursery: trio.Nursery | None,
               direct: bool = False, reader: int | None = None) -> ReadStream:
        """The reads of one open handle (with read-ahead when a nursery is given); ``direct``:
        the kernel sends the reader's own reads (no page cache); ``reader``: the thread that
        opened it, whose sparse reads through successive handles may follow a pattern."""
        prefetcher = stride = None
        if self.config.data and self.config.prefetch_max_bytes and nursery is not None:
            window = max(1, self.config.prefetch_max_bytes // self.config.block_size)
            prefetcher = Prefetcher(self, path, entry, handle, nursery, self.prefetch_budget,
                                    window)
            if reader is not None:
                version = self.version_of(path, entry)
                stride = self._strides.get((path, version, reader))
                if stride is None:
                    stride = self._strides[(path, version, reader)] = StrideReader(
                        (path, version), entry.size, self.pieces, self.stats)
        return ReadStream(self, path, entry, handle, prefetcher, direct, stride)

    async def fetch_piece(self, handle: Any, offset: int, size: int) -> bytes:
        """Exactly ``size`` bytes at ``offset`` for a piece fetched ahead (timed, counted)."""
        return await self.calls.timed("read", lambda: self._fetch_exact(handle, offset, size))

    def read_sparsely(self, path: str, entry: Entry) -> bool:
        """Whether a handle of this content of ``path`` started reading past offset 0 within
        :data:`SPARSE_MEMORY` seconds and none read a long run since: a columnar reader that
        opens the file for each basket (uproot's default, through fsspec). Such a file is
        best opened direct: the kernel's read-ahead after each basket costs more than the
        reader's buffered rest of it."""
        return (path, self.version_of(path, entry)) in self._sparse

    def note_sparse(self, path: str, entry: Entry, sparse: bool) -> None:
        key = (path, self.version_of(path, entry))
        if sparse:
            self._sparse[key] = True
        else:
            self._sparse.pop(key, None)

    async def read(self, path: str, entry: Entry, handle: Any, offset: int, size: int,
                   sequential: bool = True) -> bytes:
        """Bytes ``[offset, offset+size)`` of a file (clamped to its size) via the data layer.

        Sequential reads go through whole cached blocks. A random read is served from cached
        blocks when they are all there, else fetched as exactly the range asked for: a small
        random read never costs a block-sized fetch.
        """
        size = min(size, entry.size - offset)
        if size <= 0:
            return b""
        version = self.version_of(path, entry)
        if not self.data.enabled and self.disk is None:
            return await self._fetch(handle, (path, version, offset, size), offset, size)
        block_size = self.config.block_size
        first, last = offset // block_size, (offset + size - 1) // block_size
        if not sequential and not all(self._cached(path, version, i)
                                      for i in range(first, last + 1)):
            self.stats.events["random_reads_uncached"] += 1
            return await self._fetch(handle, (path, version, offset, size), offset, size)
        if first == last:
            block = await self._block(path, version, entry, handle, first)
            start = offset - first * block_size
            return block[start:start + size]
        parts = []
        for index in range(first, last + 1):
            block = await self._block(path, version, entry, handle, index)
            lo = max(offset - index * block_size, 0)
            hi = min(offset + size - index * block_size, len(block))
            parts.append(memoryview(block)[lo:hi])
        return b"".join(parts)

    def _cached(self, path: str, version: str, index: int) -> bool:
        key = (path, version, index)
        return self.data.peek(key) is not None or (self.disk is not None and self.disk.has(key))

    async def _block(self, path: str, version: str, entry: Entry, handle: Any,
                     index: int) -> bytes:
        key = (path, version, index)
        block = self.data.get(key)
        if block is None and self.disk is not None and self.disk.has(key):
            block = await self.load_from_disk(path, version, entry, handle, index)
        if block is None:
            block = await self._load_block(path, version, entry, handle, index)
        return block

    async def load_from_disk(self, path: str, version: str, entry: Entry, handle: Any,
                             index: int) -> bytes:
        """Block ``index`` from the disk layer into the data layer (a shared flight); from
        the backend when the disk copy turns out to be gone or damaged."""
        key = (path, version, index)

        async def load() -> bytes:
            block = await self.disk.get(key)  # type: ignore[union-attr]
            if block is None:
                return await self._load_block(path, version, entry, handle, index)
            self.data.put(key, block)
            return block

        return await self.calls.flight.run(("disk", key), load)

    def block_state(self, path: str, version: str, index: int) -> str:
        """``"memory"``, ``"coming"`` (being fetched or loaded), ``"disk"`` or ``"missing"``."""
        key = (path, version, index)
        if self.data.peek(key) is not None:
            return "memory"
        flight = self.calls.flight
        if flight.in_flight(("read", key)) or flight.in_flight(("disk", key)):
            return "coming"
        if self.disk is not None and self.disk.has(key):
            return "disk"
        return "missing"

    async def prefetch_blocks(self, path: str, version: str, entry: Entry, handle: Any,
                              first: int, count: int) -> None:
        """Fetch blocks ``first .. first+count-1`` into the data layer with one ranged read.

        Each block is a shared flight while it is on its way, so a reader arriving for any
        of them waits for this request instead of issuing its own.
        """
        block_size = self.config.block_size
        start = first * block_size
        length = min(count * block_size, entry.size - start)
        keys = [(path, version, i) for i in range(first, first + count)]

        async def fetch() -> list[bytes]:
            data = await self.calls.timed("read",
                                          lambda: self._fetch_exact(handle, start, length))
            # Blocks are views of the one buffer: no copy; it is freed with its last block.
            view = memoryview(data)
            blocks = [view[k * block_size:(k + 1) * block_size] for k in range(count)]
            for key, block in zip(keys, blocks, strict=True):
                self.data.put(key, block)
                await self._to_disk(key, block)
            return blocks

        await self.calls.flight.run_group([("read", key) for key in keys], fetch)
        self.stats.events["prefetched_blocks"] += count

    async def _load_block(self, path: str, version: str, entry: Entry, handle: Any,
                          index: int) -> bytes:
        key = (path, version, index)
        start = index * self.config.block_size
        length = min(self.config.block_size, entry.size - start)
        block = await self._fetch(handle, key, start, length)
        self.data.put(key, block)
        await self._to_disk(key, block)
        return block

    async def _fetch(self, handle: Any, key: Hashable, offset: int, size: int) -> bytes:
        return await self.calls.shared("read", key,
                                       lambda: self._fetch_exact(handle, offset, size))

    async def _to_disk(self, key: tuple[str, str, int], block: Any) -> None:
        if self.disk is not None:
            await self._disk_send.send((key, block, self._marks.get(key[0])))

    def _still_current(self, path: str, mark: str | None) -> bool:
        """Whether ``path`` has not changed since a queued block of it was fetched."""
        return self._marks.get(path) == mark

    async def offer_whole(self, path: str, entry: Entry, checksums: dict[str, str],
                          verified: bool, handle: Any, nursery: trio.Nursery | None) -> None:
        """A reader of ``entry``'s content is done: if every block of it is in the disk
        layer (or on its way there), have them sealed into a whole file the kernel may
        read itself, checked against the cheapest of ``checksums`` as they are copied (none:
        nothing to check). A few blocks missing (reads fetched as exact ranges: at most
        :data:`SEAL_MISSING` of them, or an eighth) are fetched first, in ``nursery``, with
        the backend ``handle``. ``verified``: a complete pass of this content matched
        ``checksums`` in this mount (without it, a content with checksums is not sealed; a
        whole file sealed without them then records them)."""
        disk = self.disk
        if disk is None or not 0 < entry.size <= disk.max_bytes // 2 or (
                checksums and not verified):
            return
        version = self.version_of(path, entry)
        record = disk.whole(path, version)
        if record is not None:
            chosen = cheapest(checksums)
            if verified and chosen is not None and not record.checksums:
                await trio.to_thread.run_sync(disk.vouch, path, version, dict([chosen]))
            return
        count = -(-entry.size // self.config.block_size)
        limit = max(SEAL_MISSING, count // 8)
        missing = []
        for index in range(count):
            if not self._cached(path, version, index):
                missing.append(index)
                if len(missing) > limit:
                    return
        seal = _Seal(path, version, entry.size, checksums)
        if not missing:
            await self._disk_send.send((seal, None, self._marks.get(path)))
        elif nursery is not None:
            self.handle_users.take(handle)
            start_guarded(nursery, self.stats.events, f"completing {path} on disk",
                          self._complete, seal, entry, handle, missing)

    async def _complete(self, seal: _Seal, entry: Entry, handle: Any,
                        missing: list[int]) -> None:
        """Fetch the ``missing`` blocks of a content, then have it sealed."""
        mark = self._marks.get(seal.path)
        try:
            for index in missing:
                await self._block(seal.path, seal.version, entry, handle, index)
        finally:
            await self.handle_users.give(handle)
        self.stats.events["disk_cache_completed_blocks"] += len(missing)
        await self._disk_send.send((seal, None, mark))

    async def backing_file(self, path: str, entry: Entry, checksums: dict[str, str]
                           ) -> int | None:
        """A read-only descriptor of the sealed whole file of ``entry``'s content, checked,
        for the kernel to read itself; ``checksums``: what it must have been verified
        against. None when there is none (see :meth:`DiskCache.backing_file`)."""
        if self.disk is None:
            return None
        version = self.version_of(path, entry)
        if self.disk.whole(path, version) is None:
            return None
        return await trio.to_thread.run_sync(self.disk.backing_file, path, version, checksums)

    async def _store(self, item: Any, block: Any, mark: str | None) -> None:
        disk = self.disk
        assert disk is not None
        if isinstance(item, _Seal):
            while self._writing[item.path]:  # its blocks taken by other writers
                await trio.sleep(0.01)
            if not self._still_current(item.path, mark):
                return
            chosen = cheapest(item.checksums)
            verify = None if chosen is None else (*chosen, new_hash(chosen[0]))
            if await trio.to_thread.run_sync(disk.seal, item.path, item.version, item.size,
                                             verify) and not self._still_current(
                                                 item.path, mark):
                disk.discard((item.path, item.version, 0))  # changed while it was sealed
            return
        if not self._still_current(item[0], mark):
            return
        self._writing[item[0]] += 1
        try:
            await disk.put(item, block)
        finally:
            self._writing[item[0]] -= 1
            if not self._writing[item[0]]:
                del self._writing[item[0]]

    async def run_disk_writer(self) -> None:
        """Write queued blocks to the disk layer (a task of the daemon's nursery)."""
        async for item, block, mark in self._disk_recv:
            with survive(self.stats.events, "storing a block in the disk layer"):
                await self._store(item, block, mark)

    async def flush_disk_writes(self) -> None:
        """Write what is still queued (at unmount: nothing fetched is lost to the layer)."""
        while self.disk is not None:
            try:
                item, block, mark = self._disk_recv.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                return
            await self._store(item, block, mark)

    def discard(self, path: str, entry: Entry) -> None:
        """Forget every cached block and piece of ``path`` (e.g. after it failed
        verification)."""
        self.pieces.discard(path)
        for key in [k for k in self.data.cached_keys() if k[0] == path]:
            self.data.discard(key)
        self._drop_blocks(path, self.version_of(path, entry), entry.size)

    def drop(self, layers: Iterable[str]) -> None:
        """Empty the named layers of the two this path owns (``data``, ``disk``)."""
        for layer in layers:
            if layer == "data":
                self.data.drop()
                self.pieces.drop()
            elif layer == "disk" and self.disk is not None:
                self.disk.drop()


#: After a jump, the contiguous blocks' worth a handle reads before its reads count as
#: sequential again. A columnar reader (uproot, ROOT) reads a few baskets of each cluster and
#: jumps over the other branches' baskets: each basket, with the kernel's read-around, stays
#: below this, so it is fetched as asked, never rounded to blocks nor read ahead of.
SPARSE_RUN_BLOCKS = 4

#: A handle's first read starts it sequential only when it reads this much from offset 0 (or
#: the whole file): the kernel's first read-ahead of a ``cat`` or ``cp``. A small first read
#: (a file's header, read by a columnar reader before it jumps) is fetched as asked.
SEQUENTIAL_FIRST_READ = 128 << 10


@dataclass(slots=True)
class ReadStream:
    """The reads of one open file handle: sequential or random, and the read-ahead they
    drive. ``close`` waits for the read-ahead still in flight (before the backend handle
    goes).

    A handle reads sequentially when its first read starts at offset 0 and asks for
    :data:`SEQUENTIAL_FIRST_READ` bytes or the whole file; else, and after any jump, it reads
    *sparsely* until it has read :data:`SPARSE_RUN_BLOCKS` blocks in a row. Sparse reads are
    fetched as exactly the ranges asked (unless cached) and start no read-ahead. A first read
    past offset 0 (a reader that opens the file for each piece it reads) marks the file as
    read sparsely; a long run unmarks it. Sparse reads also feed the ``stride`` reader of the
    thread that opened the handle, and are served from the pieces it fetched ahead.

    A ``direct`` handle receives the reader's own reads. A sparse read of whole pages is then
    fetched with the page after it, kept for the handle: a buffered reader reads the rest of
    its request as one page next."""

    data_path: DataPath
    path: str
    entry: Entry
    handle: Any
    prefetcher: Prefetcher | None
    direct: bool = False
    stride: StrideReader | None = None
    #: Where the previous read ended (-1: no read yet), to tell sequential reads from jumps.
    last_end: int = -1
    #: Whether the handle jumped and has not read a long run since, and that run's bytes.
    sparse: bool = False
    run: int = 0
    #: The page fetched after a direct sparse read: (offset, bytes).
    next_page: tuple[int, bytes] | None = None
    #: Bytes the handle was asked for.
    bytes_read: int = 0

    async def read(self, offset: int, size: int) -> bytes:
        block_size = self.data_path.config.block_size
        first = self.last_end < 0
        if first:
            self.run = size
            self.sparse = offset != 0 or size < min(SEQUENTIAL_FIRST_READ, self.entry.size)
            if offset != 0:
                self.data_path.note_sparse(self.path, self.entry, True)
        # The kernel's parallel read-ahead arrives slightly out of order: still in a row.
        elif abs(offset - self.last_end) <= block_size:
            self.run += size
            if self.sparse and self.run >= SPARSE_RUN_BLOCKS * block_size:
                self.sparse = False
                self.data_path.note_sparse(self.path, self.entry, False)
        else:
            self.sparse, self.run = True, size
        sequential = not self.sparse
        self.last_end = offset + size
        self.bytes_read += size
        if self.prefetcher is not None:
            self.prefetcher.on_read(offset, size, sequential)
        kept = self.next_page
        if kept is not None and kept[0] == offset and size <= len(kept[1]):
            self.next_page = None
            return kept[1][:size]
        if self.stride is not None and not sequential:
            ahead = await self._from_piece(offset, size, first)
            if ahead is not None:
                return ahead
        if (self.direct and not sequential and size % PAGE == 0
                and offset + size < self.entry.size):
            data = await self.data_path.read(self.path, self.entry, self.handle, offset,
                                             size + PAGE, sequential)
            self.next_page = (offset + size, data[size:])
            return data[:size]
        return await self.data_path.read(self.path, self.entry, self.handle, offset, size,
                                         sequential)

    async def _from_piece(self, offset: int, size: int, first: bool
                          ) -> bytes | memoryview | None:
        """The read from pieces fetched ahead of it (waiting for those on their way), or None.
        The read is noted first, so that the pieces predicted after it are on their way
        meanwhile. A handle's small first read at offset 0 (a file's header) is fetched as a
        piece of :data:`HEAD_PIECE` bytes: formats keep their first directory right after the
        header, and a reader asks for it next."""
        stride, data_path = self.stride, self.data_path
        assert stride is not None and self.prefetcher is not None
        end = min(offset + size, self.entry.size)
        pieces = stride.store.cover(stride.key, offset, end)
        if pieces is None and first and offset == 0 and end < HEAD_PIECE:
            await stride.fetch_now(data_path.fetch_piece, self.handle,
                                   min(HEAD_PIECE, self.entry.size))
            pieces = stride.store.cover(stride.key, offset, end)
        late = pieces is not None and not all(p.ready.is_set() for p in pieces)
        if stride.note(offset, end - offset, served=pieces is not None, late=late):
            stride.predict(data_path.fetch_piece, self.handle, self.prefetcher.nursery,
                           data_path.handle_users)
        if pieces is None:
            return None
        parts = []
        for piece in pieces:
            await piece.ready.wait()
            if piece.data is None:
                return None
            stride.store.took(piece)
            lo, hi = max(offset, piece.start), min(end, piece.end)
            parts.append(piece.data[lo - piece.start:hi - piece.start])
        data_path.stats.events["stride_served_reads"] += 1
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def close(self) -> None:
        if self.prefetcher is not None:
            await self.prefetcher.drain()
