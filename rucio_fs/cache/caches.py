"""The user-space cache layers (metadata, listing, data), each switchable and counted.

Each layer is a bounded cachetools cache behind one small class that records hits, misses
and drops in the mount's :class:`~rucio_fs.observe.stats.Stats`. A disabled layer never stores
anything and counts every lookup as a miss, so cold and warm runs report comparable numbers.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Generic, TypeVar

import trio
from cachetools import LRUCache, TLRUCache

from rucio_fs.backend import Entry, usable_name
from rucio_fs.observe.stats import Stats

V = TypeVar("V")


class CacheLayer(Generic[V]):
    """A named, switchable cache. ``get`` returns None on a miss."""

    def __init__(self, name: str, enabled: bool, cache: Any, stats: Stats) -> None:
        self.name = name
        self.enabled = enabled
        self._cache = cache
        self._counters = stats.cache_layer(name)
        self._counters["enabled"] = int(enabled)

    def get(self, key: Hashable) -> V | None:
        if self.enabled:
            value = self._cache.get(key)
            if value is not None:
                self._counters["hits"] += 1
                return value
        self._counters["misses"] += 1
        return None

    def peek(self, key: Hashable) -> V | None:
        """Like :meth:`get`, without counting a hit or a miss."""
        return self._cache.get(key) if self.enabled else None

    def put(self, key: Hashable, value: V) -> None:
        if not self.enabled:
            return
        try:
            self._cache[key] = value
        except ValueError:  # larger than the whole cache: not cacheable
            self._counters["too_large"] += 1
            return
        self._counters["stores"] += 1

    def cached_keys(self) -> list[Any]:
        return list(self._cache.keys())

    def discard(self, key: Hashable) -> None:
        self._cache.pop(key, None)

    def drop(self) -> None:
        self._cache.clear()
        self._counters["drops"] += 1

    def __len__(self) -> int:
        return len(self._cache)

    @property
    def currsize(self) -> int:
        return int(self._cache.currsize)


class TimedLayer(CacheLayer[V]):
    """A :class:`CacheLayer` whose items expire ``ttl_of(value)`` seconds after they are
    stored, bounded by ``maxsize`` (of ``getsizeof`` units), that can say when each expires:
    the kernel may keep what the mount showed it for as long as this layer answers it."""

    def __init__(self, name: str, enabled: bool, maxsize: int, ttl_of: Callable[[V], float],
                 stats: Stats, getsizeof: Callable[[V], int] | None = None) -> None:
        # Items are (value, expiry): the expiry is the cache's own, kept where it can be read.
        sized = (lambda item: getsizeof(item[0])) if getsizeof is not None else None
        super().__init__(name, enabled, TLRUCache(maxsize, lambda _k, item, _now: item[1],
                                                  getsizeof=sized), stats)
        self._ttl_of = ttl_of

    def get(self, key: Hashable) -> V | None:
        if self.enabled:
            item = self._cache.get(key)
            if item is not None:
                self._counters["hits"] += 1
                return item[0]
        self._counters["misses"] += 1
        return None

    def peek(self, key: Hashable) -> V | None:
        item = self._cache.get(key) if self.enabled else None
        return item[0] if item is not None else None

    def put(self, key: Hashable, value: V) -> None:
        super().put(key, (value, time.monotonic() + self._ttl_of(value)))  # type: ignore[arg-type]

    def expires(self, key: Hashable) -> float:
        """When (``time.monotonic()``) the item of ``key`` expires; 0.0 when there is none."""
        item = self._cache.get(key) if self.enabled else None
        return item[1] if item is not None else 0.0


def ttl_cache(maxsize: int, ttl_of: Callable[[Any], float],
              getsizeof: Callable[[Any], int] | None = None,
              timer: Callable[[], float] = time.monotonic) -> TLRUCache:
    """A cache whose items expire after ``ttl_of(value)`` seconds, bounded by ``maxsize``."""

    def ttu(_key: Any, value: Any, now: float) -> float:
        return now + ttl_of(value)

    return TLRUCache(maxsize, ttu, timer=timer, getsizeof=getsizeof)


def byte_cache(max_bytes: int) -> LRUCache:
    return LRUCache(max_bytes, getsizeof=len)


_SERIALS = itertools.count(1)


class Listing:
    """A directory listing: entries in backend order plus a name index.

    Names that cannot be POSIX file names (empty, ``.``, ``..``, containing ``/`` or NUL) are a
    backend bug and are left out here, counted in ``rejected``; duplicate names keep the first.

    A listing may still be *filling* (:meth:`filling`): the backend's entries are appended as
    they arrive, so ``ls`` gets the first page while later ones are on their way. It ends
    with :meth:`finish`, either complete or with the error that cut it short; only complete
    listings are cached, and a reader that reaches the end of a failed one gets the error,
    never a shorter listing.

    Changes made through the mount are applied in place (:meth:`upsert`, :meth:`remove`) so a
    directory being filled is not listed again for every new name. ``entries`` and ``names``
    stay index-stable for readers holding them: a new name is appended, a removed one leaves
    ``None`` behind (readers skip it) until enough pile up to build fresh lists.
    """

    __slots__ = ("_changed", "_index", "_removed", "by_name", "complete", "entries", "error",
                 "names", "rejected", "serial")

    def __init__(self, entries: Sequence[Entry]) -> None:
        by_name: dict[str, Entry] = {}
        rejected = 0
        for entry in entries:
            if usable_name(entry.name) and entry.name not in by_name:
                by_name[entry.name] = entry
            else:
                rejected += 1
        self.by_name = by_name
        self.entries: list[Entry | None] = (
            list(by_name.values()) if rejected else list(entries))
        self.rejected = rejected
        #: File-system encoded names, ready for readdir replies (None where removed).
        self.names: list[bytes | None] = [os.fsencode(e.name) for e in self.entries if e]
        self._index: dict[str, int] | None = None
        self._removed = 0
        self.complete = True
        self.error: BaseException | None = None
        self._changed: trio.Event | None = None
        #: Unique to these contents: new for every listing and every change made to it (what
        #: the kernel was shown of a directory is kept only while this is the same).
        self.serial = next(_SERIALS)

    @classmethod
    def filling(cls) -> Listing:
        listing = cls([])
        listing.complete = False
        listing._changed = trio.Event()
        return listing

    def add(self, entry: Entry) -> None:
        """Append one entry of a filling listing (same name rules as the constructor)."""
        name = entry.name
        if not usable_name(name) or name in self.by_name:
            self.rejected += 1
            return
        self.by_name[name] = entry
        if self._index is not None:
            self._index[name] = len(self.entries)
        self.entries.append(entry)
        self.names.append(os.fsencode(name))
        self._signal()

    def finish(self, error: BaseException | None = None) -> None:
        self.error = error
        self.complete = error is None
        self._signal()
        self._changed = None

    @property
    def done(self) -> bool:
        return self.complete or self.error is not None

    async def wait_beyond(self, count: int) -> None:
        """Until more than ``count`` positions exist or the listing is done."""
        while not self.done and len(self.entries) <= count:
            assert self._changed is not None
            await self._changed.wait()

    def _signal(self) -> None:
        changed = self._changed
        if changed is not None and not changed.is_set():
            changed.set()
            self._changed = trio.Event()

    def __len__(self) -> int:
        return len(self.by_name)

    def position(self, name: str) -> int | None:
        """Where ``name`` is in :attr:`entries` (None: not listed)."""
        return self._positions().get(name)

    def _positions(self) -> dict[str, int]:
        if self._index is None:
            self._index = {e.name: i for i, e in enumerate(self.entries) if e is not None}
        return self._index

    def upsert(self, entry: Entry) -> None:
        """Add ``entry`` or replace the entry of the same name."""
        self.serial = next(_SERIALS)
        index = self._positions()
        at = index.get(entry.name)
        if at is None:
            index[entry.name] = len(self.entries)
            self.entries.append(entry)
            self.names.append(os.fsencode(entry.name))
        else:
            self.entries[at] = entry
        self.by_name[entry.name] = entry

    def remove(self, name: str) -> None:
        self.serial = next(_SERIALS)
        at = self._positions().pop(name, None)
        if at is None:
            return
        del self.by_name[name]
        self.entries[at] = self.names[at] = None
        self._removed += 1
        if self._removed > 64 and self._removed > len(self.by_name):
            # New lists: readers holding the old ones keep their positions.
            self.entries = list(self.by_name.values())
            self.names = [os.fsencode(e.name) for e in self.entries if e]
            self._index = None
            self._removed = 0


class EqualEntries:
    """One object for the equal entries of different catalogs' listings of a directory (a
    per-user mount: each user's catalog lists it). An entry is replaced by one seen before
    only when it is equal in every field (``==``), so a user gets exactly the values its own
    catalog gave; and the readdir of users taking turns finds the entry its inode holds
    (``is``) instead of comparing every entry's attributes (10 users' warm ``ls -l`` of
    10,000 spent a third of the daemon's readdir time comparing). Bounded: least recently
    seen first out."""

    def __init__(self, max_entries: int) -> None:
        self._entries: LRUCache[tuple[str, str], Entry] = LRUCache(max_entries)

    def __call__(self, directory: str, entry: Entry) -> Entry:
        key = (directory, entry.name)
        known = self._entries.get(key)
        if known is not None and (known is entry or known == entry):
            return known
        self._entries[key] = entry
        return entry
