"""One memory limit for the daemon's file data, split into fixed shares.

``--memory-limit`` bounds the bytes of file data the daemon holds at once, reads and writes
together: cached blocks (the data layer), read-ahead in flight, pieces fetched ahead of a
strided reader, parts of uploads on their way and bytes waiting in checksum verification's
reorder buffer. Each gets a fixed share, so their sum never exceeds the limit whatever the
workload; the shares are in :class:`Shares`.
"""

from __future__ import annotations

from dataclasses import dataclass

import trio


@dataclass(frozen=True)
class Shares:
    """How ``limit`` bytes are split."""

    limit: int

    @property
    def data_cache(self) -> int:
        return self.limit // 2 - self.pieces

    @property
    def pieces(self) -> int:
        return self.limit // 16

    @property
    def read_ahead(self) -> int:
        return self.limit // 8

    @property
    def uploads(self) -> int:
        return self.limit // 4

    @property
    def verification(self) -> int:
        return (self.limit - self.data_cache - self.pieces - self.read_ahead
                - self.uploads)


class ByteBudget:
    """Bytes that holders take and give back; ``acquire`` waits until they fit. A request
    larger than the whole budget is let through when nothing else is held (it cannot fit
    otherwise, and refusing it would deadlock)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.used = 0
        self._released = trio.Event()

    async def acquire(self, size: int) -> None:
        while self.used and self.used + size > self.total:
            await self._released.wait()
        self.used += size

    def release(self, size: int) -> None:
        self.used -= size
        released, self._released = self._released, trio.Event()
        released.set()
