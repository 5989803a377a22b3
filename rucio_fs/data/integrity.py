"""Checksum verification of whole-file reads.

Promise: when the catalog knows a file's checksum, no read of every byte of a version that
has not been verified succeeds unless the digest matched. One :class:`StreamVerifier` per file
version sees every byte the daemon hands the kernel for that file, whichever handle asked; the
hashed prefix grows as reads reach it, and the read that completes it waits for the verdict
and fails with EIO on a mismatch (so does every later read of that version while it is open).

Reads may arrive out of order (the kernel issues read-ahead in parallel, other handles read
elsewhere): chunks ahead of the prefix wait in a bounded reorder buffer. A chunk that does not
fit is *dropped* from memory but remembered as a gap: once the prefix reaches a gap, the
caller reads those bytes again itself (:meth:`StreamVerifier.next_gap`) and feeds them, so the
prefix grows over every byte the daemon handed out, whether or not the kernel asks for it
again. (Making the kernel forget its pages instead is a race: an invalidation cannot run while
the read it follows is being answered, and the reader may meet the cached pages before it.)
"""

from __future__ import annotations

import hashlib
import zlib
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

import trio

from rucio_fs.background import start_guarded
from rucio_fs.errors import IntegrityError

#: Checksum names as catalogs spell them, in order of preference (cheapest first).
ALGORITHMS = ("adler32", "md5", "sha256", "sha512", "sha1")
MAX_PENDING = 64 << 20
#: Bytes gathered before a batch is handed to the hashing thread, and batches queued at most.
BATCH = 8 << 20
QUEUE_BATCHES = 4


class _Adler32:
    def __init__(self) -> None:
        self.value = 1

    def update(self, data: Any) -> None:
        self.value = zlib.adler32(data, self.value)

    def hexdigest(self) -> str:
        return f"{self.value:08x}"


class StreamVerifier:
    """Hashes one sequential pass over a file; :meth:`feed` raises on a mismatch at the end.

    Bookkeeping is synchronous, so data is queued for hashing in file order. Batches of
    ``BATCH`` bytes are hashed by one consumer task per verifier in a worker thread (zlib and
    hashlib release the GIL) while reads go on; only the read that completes the pass waits
    for the digest. Call :meth:`run` in a nursery and :meth:`close` when the file is released.
    """

    def __init__(self, path: str, algorithm: str, expected: str, size: int,
                 version: str = "", max_pending: int | None = None) -> None:
        self.path = path
        #: The content version whose bytes this verifies.
        self.version = version
        self.algorithm = algorithm
        self.expected = expected.lower().zfill(8) if algorithm == "adler32" else expected.lower()
        self.size = size
        self.hashed = 0  # bytes queued for hashing, a prefix of the file
        self.state = "verifying"  # → "verified", "mismatch" or "abandoned"
        #: Chunks left out of the reorder buffer (read again once the prefix reaches them).
        self.dropped = 0
        #: Ranges handed out but not held: start -> end.
        self._gaps: dict[int, int] = {}
        #: Bytes the reorder buffer may hold (the verification share of the memory limit).
        self.max_pending = MAX_PENDING if max_pending is None else min(max_pending, MAX_PENDING)
        #: Open handles feeding this verifier (kept by the FUSE layer).
        self.users = 0
        self._hash: Any = new_hash(algorithm)
        self._pending: dict[int, bytes] = {}
        self._pending_bytes = 0
        self._mismatch = ""
        self._batch: list[memoryview] = []
        self._batched = 0
        self._send, self._receive = trio.open_memory_channel[list[memoryview]](QUEUE_BATCHES)
        self._done = trio.Event()
        self._closing = False

    async def run(self) -> None:
        """The consumer: hashes batches in order, then settles the verdict."""
        async with self._receive:
            async for views in self._receive:
                await trio.to_thread.run_sync(self._update, views)
        if self.state == "verifying":
            actual = self._hash.hexdigest()
            if self.hashed < self.size:
                self.state = "abandoned"  # closed before the pass was complete
            elif actual == self.expected:
                self.state = "verified"
            else:
                self.state = "mismatch"
                self._mismatch = (f"{self.path}: {self.algorithm} mismatch: the catalog says "
                                  f"{self.expected}, the data gives {actual}")
        self._done.set()

    def takes_readers(self) -> bool:
        """Whether a new reader may feed this verifier: its pass is still open, or complete
        (the verdict is coming). Not once it is closing on an incomplete pass: that reader's
        bytes would be handed out unverified; nor once it mismatched: a new open reads the
        file again, from another copy where the catalog has one, in a pass of its own (the
        handles that read the failed pass may not have been released yet)."""
        if self.state in ("abandoned", "mismatch"):
            return False
        return not self._closing or self.hashed >= self.size

    async def close(self) -> None:
        """No more reads: wait for the consumer to settle the verdict (an incomplete pass is
        "abandoned")."""
        self._closing = True
        await self._send.aclose()
        await self._done.wait()

    def check(self) -> None:
        """IntegrityError if the pass mismatched: every later read of a handle feeding it
        fails so (the kernel retries a failed read-ahead), with nothing read for it."""
        if self.state == "mismatch":
            raise IntegrityError(self._mismatch)

    async def feed(self, offset: int, data: bytes) -> None:
        """Account for ``data`` read at ``offset``; IntegrityError once the pass mismatched
        (see :meth:`check`)."""
        self.check()
        if self._closing:  # the pass is complete: re-reads wait for its verdict
            await self._done.wait()
            if self.state == "mismatch":
                raise IntegrityError(self._mismatch)
            return
        if self.state != "verifying" or not data:
            return
        views = self._advance(offset, data)
        self._batch += views
        self._batched += sum(len(v) for v in views)
        complete = self.hashed >= self.size
        if self._batched >= BATCH or (complete and self._batch):
            batch, self._batch, self._batched = self._batch, [], 0
            await self._send.send(batch)  # waits when the consumer is QUEUE_BATCHES behind
        if complete and self.state == "verifying":
            self._closing = True
            await self._send.aclose()
            await self._done.wait()
            if self.state == "mismatch":
                raise IntegrityError(self._mismatch)

    def _advance(self, offset: int, data: bytes) -> list[memoryview]:
        """Move the hashed prefix over ``data`` and any waiting chunks it reaches."""
        if offset > self.hashed:
            if self._pending_bytes + len(data) > self.max_pending:
                self.dropped += 1  # hashed later from a read of our own (next_gap)
                self._gaps[offset] = max(self._gaps.get(offset, 0), offset + len(data))
            elif offset not in self._pending:
                self._pending[offset] = data
                self._pending_bytes += len(data)
            return []
        views = self._take(offset, data)
        ready = sorted(start for start in self._pending if start <= self.hashed)
        while ready:  # waiting chunks the prefix has reached (re-reads add nothing)
            for start in ready:
                chunk = self._pending.pop(start)
                self._pending_bytes -= len(chunk)
                views += self._take(start, chunk)
            ready = sorted(start for start in self._pending if start <= self.hashed)
        return views

    def next_gap(self) -> tuple[int, int] | None:
        """(offset, size) of dropped bytes the prefix has reached, which the caller must read
        and :meth:`feed`; None when there are none."""
        if self.state != "verifying" or self._closing:
            return None
        for start, end in sorted(self._gaps.items()):
            if end <= self.hashed:
                del self._gaps[start]
            elif start <= self.hashed:
                del self._gaps[start]
                return self.hashed, min(end, self.size) - self.hashed
            else:
                break
        return None

    def _take(self, offset: int, data: bytes) -> list[memoryview]:
        skip = self.hashed - offset
        if skip >= len(data):
            return []
        self.hashed += len(data) - skip
        return [memoryview(data)[skip:]]

    def _update(self, views: list[memoryview]) -> None:
        for view in views:
            self._hash.update(view)


def new_hash(algorithm: str) -> Any:
    """A fresh hash of ``algorithm`` (``update``, ``hexdigest``)."""
    return _Adler32() if algorithm == "adler32" else hashlib.new(algorithm)


def cheapest(checksums: Mapping[str, str]) -> tuple[str, str] | None:
    """The cheapest checksum the catalog gave, as ``(algorithm, value)``, or None."""
    for algorithm in ALGORITHMS:
        expected = checksums.get(algorithm)
        if expected:
            return algorithm, expected
    return None


def verifier_for(path: str, size: int, checksums: Mapping[str, str], version: str = "",
                 max_pending: int | None = None) -> StreamVerifier | None:
    """A verifier for the cheapest checksum the catalog gave, or None if it gave none."""
    chosen = cheapest(checksums)
    if chosen is None:
        return None
    return StreamVerifier(path, chosen[0], chosen[1], size, version, max_pending)


class Verified(Protocol):
    """What verification keeps on a file's inode (:class:`~rucio_fs.fuse.inodes.Inode`)."""

    path: str
    #: The pass readers of the file feed now, if any.
    verifier: StreamVerifier | None
    #: The version a complete pass verified.
    verified_version: str | None


class Verification:
    """The verification of one mount: which reads feed which verifier, and what is verified.

    An open of a version that no complete pass has verified joins that version's verifier
    (one per inode, fed by every handle); a pass that is closing on an incomplete prefix takes
    no new readers, so such an open starts a pass of its own. ``verified_version`` and
    ``verifier`` live on the inode.
    """

    def __init__(self, enabled: bool, reorder_bytes: int, events: Counter[str]) -> None:
        self.enabled = enabled
        #: What one verifier's reorder buffer may hold (the memory limit's share).
        self.reorder_bytes = reorder_bytes
        self.events = events

    def join(self, node: Verified, checksums: Mapping[str, str], size: int, version: str,
             nursery: trio.Nursery | None) -> StreamVerifier | None:
        """The verifier a new reader of ``version`` of ``node`` feeds, hashing in
        ``nursery`` (None: nothing to verify, already verified, or nowhere to hash)."""
        if not self.enabled or node.verified_version == version or nursery is None:
            return None
        verifier = node.verifier
        if verifier is None or verifier.version != version or not verifier.takes_readers():
            verifier = verifier_for(node.path, size, checksums, version, self.reorder_bytes)
            if verifier is None:
                return None
            node.verifier = verifier
            start_guarded(nursery, self.events, f"verifying {node.path}", verifier.run)
        verifier.users += 1
        return verifier

    async def feed(self, node: Verified, verifier: StreamVerifier, offset: int,
                   data: bytes | memoryview,
                   read: Callable[[int, int], Awaitable[bytes | memoryview]]) -> None:
        """Bytes a reader got; IntegrityError when they complete a pass that did not match.
        Dropped bytes the prefix reaches are read again with ``read(offset, size)``."""
        await verifier.feed(offset, data)
        while (gap := verifier.next_gap()) is not None:
            self.events["checksum_gap_rereads"] += 1
            await verifier.feed(gap[0], await read(*gap))
        if verifier.state == "verified":
            node.verified_version = verifier.version

    async def leave(self, node: Verified, verifier: StreamVerifier) -> None:
        """A reader is gone; after the last, settle the pass and count its verdict."""
        verifier.users -= 1
        if verifier.users:
            return
        if node.verifier is verifier:  # an open meanwhile starts a pass of its own
            node.verifier = None
        await verifier.close()  # a verified pass was noted by the read completing it
        self.events[f"checksum_{verifier.state}"] += 1
