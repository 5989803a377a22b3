"""Filesystem semantics over one backend: the cache layers, coalescing and call accounting.

Every backend call of a mount goes through :class:`Catalog` — reads, listings, namespace
changes, uploads and their confirmation, ``statfs``, xattrs — so every call is bounded by the
backend timeout, counted, and followed by the same cache bookkeeping for all backends
(``tests/test_layering.py`` checks that no other core module reaches the backend). Paths are
catalog paths (see :mod:`rucio_fs.backend`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Hashable, Iterable
from typing import Any, TypeVar

import trio

from .backend import Backend, Capability, Entry, FsUsage, Kind, Upload
from .budget import Shares
from .caches import CacheLayer, Listing, byte_cache, ttl_cache
from .config import MountConfig
from .disk_cache import DiskCache
from .errors import IntegrityError, NotADirectory, NotFound, RucioFsError, Unavailable
from .singleflight import SingleFlight
from .stats import Stats, errno_name

log = logging.getLogger(__name__)
T = TypeVar("T")

LAYERS = ("kernel", "metadata", "listing", "data", "disk")

#: Blocks waiting to be written to the disk layer.
DISK_QUEUE_BLOCKS = 32

#: Cached in the metadata layer for a path that does not exist (a negative entry).
_MISSING = Entry(name="", kind=Kind.FILE)


def child_path(parent: str, name: str) -> str:
    return "/" + name if parent == "/" else f"{parent}/{name}"


def split_path(path: str) -> tuple[str, str]:
    parent, _, name = path.rpartition("/")
    return parent or "/", name


def content_version(entry: Entry) -> str:
    """What identifies a file's bytes: the backend's version, else size and mtime."""
    return entry.version or f"{entry.size}@{entry.mtime_ns}"


class Catalog:
    """Cached, coalesced, measured access to a backend's namespace and data."""

    def __init__(self, backend: Backend, config: MountConfig, stats: Stats,
                 disk: DiskCache | None = None) -> None:
        self.backend = backend
        self.disk = disk
        self.config = config
        self.stats = stats

        def metadata_ttl(entry: Entry) -> float:
            if entry is _MISSING:
                return config.negative_ttl
            return config.immutable_ttl if entry.immutable else config.metadata_ttl

        self.metadata: CacheLayer[Entry] = CacheLayer(
            "metadata", config.metadata,
            ttl_cache(config.metadata_max_entries, metadata_ttl), stats)
        #: path -> (content version, extended attributes).
        self.xattr_cache: CacheLayer[tuple[str, dict[str, bytes]]] = CacheLayer(
            "xattrs", config.metadata,
            ttl_cache(config.metadata_max_entries // 10 or 1, lambda _x: config.metadata_ttl),
            stats)
        self.listing: CacheLayer[Listing] = CacheLayer(
            "listing", config.listing,
            ttl_cache(config.listing_max_entries, lambda _l: config.listing_ttl,
                      getsizeof=lambda listing: len(listing) + 1), stats)
        # The memory limit's shares for reads: cached blocks and read-ahead in flight.
        shares = Shares(config.memory_limit)
        self.prefetch_budget_blocks = (
            max(1, shares.read_ahead // config.block_size)
            if config.data and config.prefetch_max_bytes else 0)
        self.data: CacheLayer[bytes] = CacheLayer(
            "data", config.data, byte_cache(max(shares.data_cache, config.block_size)), stats)
        self._flight = SingleFlight(config.coalescing, stats.coalesced)
        #: Files created through this mount and not yet uploaded: shown by stat and list.
        self.local: dict[str, Entry] = {}
        #: Listings being fetched, shared by everyone who opens the directory meanwhile.
        self._filling: dict[str, Listing] = {}
        #: Where listings are fetched in the background; set by the daemon (None: in line).
        self.nursery: trio.Nursery | None = None
        backend.use_caches(config.metadata)
        # Blocks go to the disk layer in the background, several written at once; reads wait
        # only when the disk falls a whole queue behind the network.
        self._disk_send, self._disk_recv = trio.open_memory_channel[tuple[Hashable, Any]](
            DISK_QUEUE_BLOCKS)

    async def _call(self, call: str, key: Hashable, fn: Callable[[], Awaitable[T]]) -> T:
        """One (possibly shared) backend call, counted and timed under ``call``."""
        return await self._flight.run((call, key), lambda: self.timed(call, fn))

    async def timed(self, call: str, fn: Callable[[], Awaitable[T]],
                    extra_seconds: float = 0.0) -> T:
        """``fn()`` bounded by the backend timeout (plus ``extra_seconds``), counted and timed
        under ``call``; any failure is a typed error."""
        op = self.stats.backend_call(call)
        start = time.perf_counter_ns()
        limit = self.config.backend_timeout + extra_seconds
        try:
            with trio.fail_after(limit):
                return await fn()
        except trio.TooSlowError:
            op.errors["ETIMEDOUT"] += 1
            raise Unavailable(f"backend {call} timed out after {limit:g} s") from None
        except RucioFsError as exc:
            op.errors[errno_name(exc.errno)] += 1
            raise
        except (trio.Cancelled, KeyboardInterrupt):
            raise
        except Exception as exc:
            # A backend bug must not take the mount down: it becomes EIO, logged once by the
            # FUSE layer; the traceback is there with --debug.
            op.errors["EIO"] += 1
            log.debug("backend %s call failed unexpectedly", call, exc_info=True)
            raise Unavailable(f"backend {call} failed unexpectedly: {exc!r}") from exc
        finally:
            op.latency.add(time.perf_counter_ns() - start)

    async def stat(self, path: str) -> Entry:
        """Attributes of ``path``: metadata cache, then the parent's cached listing, then stat."""
        entry = self.local.get(path) or self.metadata.get(path)
        if entry is None and path != "/":
            parent, name = split_path(path)
            listing = self.listing.get(parent)
            if listing is not None:
                entry = listing.by_name.get(name)
                if entry is None and self.backend.lists_everything(parent):
                    entry = _MISSING
        if entry is None:
            try:
                entry = await self._call("stat", path, lambda: self.backend.stat(path))
            except NotFound:
                self.metadata.put(path, _MISSING)
                raise
            self.metadata.put(path, entry)
        if entry is _MISSING:
            raise NotFound(path)
        return entry

    async def list(self, path: str) -> Listing:
        """The listing of directory ``path``: cached and complete, or still filling (then it
        has its first entries or is done, so a listing that fails at once fails here)."""
        listing = self.listing.get(path)
        if listing is not None:
            return listing
        if self.config.coalescing:
            listing = self._filling.get(path)
            if listing is not None:
                self.stats.coalesced["list"] += 1
        if listing is None:
            listing = Listing.filling()
            if self.config.coalescing:
                self._filling[path] = listing
            if self.nursery is None:
                await self._fill(path, listing)
            else:
                self.nursery.start_soon(self._fill, path, listing)
        await listing.wait_beyond(0)
        if not listing.entries and listing.error is not None:
            raise listing.error
        return listing

    async def _fill(self, path: str, listing: Listing) -> None:
        """Fetch the listing of ``path`` into ``listing``; cache it once complete."""

        async def fetch() -> None:
            async for entry in self.backend.list(path):
                listing.add(entry)

        try:
            await self.timed("list", fetch)
        except RucioFsError as exc:
            listing.finish(exc)
            return
        except BaseException:
            listing.finish(Unavailable(f"listing {path} was cancelled"))
            raise
        finally:
            if self._filling.get(path) is listing:
                del self._filling[path]
        for local_path, entry in self.local.items():
            if split_path(local_path)[0] == path:
                listing.upsert(entry)
        if listing.rejected:
            self.stats.events["listing_names_rejected"] += listing.rejected
            log.warning("%s: %d entries with unusable or duplicate names left out",
                        path, listing.rejected)
        self.stats.events["listed_entries"] += len(listing)
        listing.finish()
        self.listing.put(path, listing)

    async def open(self, path: str, entry: Entry) -> Any:
        if entry.is_dir:
            raise NotADirectory(path)
        return await self.timed("open", lambda: self.backend.open(path, entry))

    async def close(self, handle: Any) -> None:
        await self.timed("close", lambda: self.backend.close(handle))

    async def xattrs(self, path: str, entry: Entry) -> dict[str, bytes]:
        """The extended attributes of ``path`` as ``entry``: asked once per version and kept
        in the metadata layer (``getfattr -d`` asks for every name in turn)."""
        version = "" if entry.is_dir else content_version(entry)
        cached = self.xattr_cache.get(path)
        if cached is not None and cached[0] == version:
            return cached[1]
        attrs = dict(await self._call("xattrs", path, lambda: self.backend.xattrs(path, entry)))
        self.xattr_cache.put(path, (version, attrs))
        return attrs

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
        version = content_version(entry)
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

        return await self._flight.run(("disk", key), load)

    def block_state(self, path: str, version: str, index: int) -> str:
        """``"memory"``, ``"coming"`` (being fetched or loaded), ``"disk"`` or ``"missing"``."""
        key = (path, version, index)
        if self.data.peek(key) is not None:
            return "memory"
        if self._flight.in_flight(("read", key)) or self._flight.in_flight(("disk", key)):
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
            data = await self.timed("read", lambda: self._read_exact(handle, start, length))
            # Blocks are views of the one buffer: no copy; it is freed with its last block.
            view = memoryview(data)
            blocks = [view[k * block_size:(k + 1) * block_size] for k in range(count)]
            for key, block in zip(keys, blocks, strict=True):
                self.data.put(key, block)
                await self._to_disk(key, block)
            return blocks

        await self._flight.run_group([("read", key) for key in keys], fetch)
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

    async def _to_disk(self, key: Hashable, block: Any) -> None:
        if self.disk is not None:
            await self._disk_send.send((key, block))

    async def run_disk_writer(self) -> None:
        """Write queued blocks to the disk layer (a task of the daemon's nursery)."""
        async for key, block in self._disk_recv:
            await self.disk.put(key, block)  # type: ignore[union-attr]

    async def flush_disk_writes(self) -> None:
        """Write what is still queued (at unmount: nothing fetched is lost to the layer)."""
        while self.disk is not None:
            try:
                key, block = self._disk_recv.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                return
            await self.disk.put(key, block)

    async def _fetch(self, handle: Any, key: Hashable, offset: int, size: int) -> bytes:
        return await self._call("read", key, lambda: self._read_exact(handle, offset, size))

    async def _read_exact(self, handle: Any, offset: int, size: int) -> bytes:
        """One backend read, counted; fewer bytes than asked is an error, never a short file."""
        data = await self.backend.read(handle, offset, size)
        self.stats.backend_call("read").bytes += len(data)
        if len(data) != size:
            raise IntegrityError(f"backend returned {len(data)} of {size} bytes at {offset}")
        return data

    # -- what the backend declares -------------------------------------------------------------

    @property
    def scheme(self) -> str:
        return self.backend.scheme

    def can(self, capability: Capability) -> bool:
        """Whether the backend declared ``capability`` (never probed)."""
        return bool(self.backend.capabilities & capability)

    @property
    def single_put_max(self) -> int:
        return self.backend.single_put_max

    @property
    def upload_part_size(self) -> int:
        return self.backend.upload_part_size

    @property
    def upload_parallelism(self) -> int:
        return self.backend.upload_parallelism

    def backend_counters(self) -> dict[str, int]:
        return dict(self.backend.counters())

    async def usage(self) -> FsUsage:
        return await self.timed("usage", self.backend.usage)

    # -- changes: each one backend call, timed and counted, then the caches learn it -----------

    async def mkdir(self, path: str) -> Entry:
        entry = await self.timed("mkdir", lambda: self.backend.mkdir(path))
        self.new_directory(path, entry)
        return entry

    async def unlink(self, path: str, on_server: bool = True) -> None:
        """``path`` goes (``on_server`` False: it was only ever local to this mount)."""
        if on_server:
            await self.timed("unlink", lambda: self.backend.unlink(path))
        self.note_entry(path, None)

    async def rmdir(self, path: str) -> None:
        await self.timed("rmdir", lambda: self.backend.rmdir(path))
        self.listing.discard(path)  # it was empty: nothing below to forget
        self.note_entry(path, None)

    async def rename(self, old: str, new: str, entry: Entry) -> Entry:
        moved = await self.timed("rename", lambda: self.backend.rename(old, new, entry))
        self.note_entry(old, None)
        if entry.is_dir:
            self.forget_tree(old)
            self.forget_tree(new)
        self.note_entry(new, moved)
        return moved

    def renamed_locally(self, old: str, new: str, entry: Entry) -> None:
        """A file never uploaded moved: only this mount knows of it, under ``new`` now."""
        self.note_entry(old, None)
        self.created_locally(new, entry)

    async def truncate(self, path: str, size: int) -> Entry:
        entry = await self.timed("truncate", lambda: self.backend.truncate(path, size))
        self.note_entry(path, entry)
        return entry

    async def set_mtime(self, path: str, entry: Entry, mtime_ns: int, now: bool) -> Entry:
        new = await self.timed("set_mtime",
                               lambda: self.backend.set_mtime(path, entry, mtime_ns, now))
        self.note_entry(path, new)
        return new

    async def set_xattr(self, path: str, entry: Entry, name: str, value: bytes | None) -> Entry:
        new = await self.timed("setxattr",
                               lambda: self.backend.set_xattr(path, entry, name, value))
        self.note_entry(path, new)
        return new

    # -- uploads ----------------------------------------------------------------------------

    async def put(self, path: str, data: bytes) -> Entry:
        return await self.timed("put", lambda: self.backend.put(path, data))

    async def begin_upload(self, path: str) -> Upload:
        return await self.timed("begin_upload", lambda: self.backend.begin_upload(path))

    async def write_part(self, upload: Upload, number: int, offset: int, data: bytes) -> None:
        await self.timed("write_part", lambda: upload.write_part(number, offset, data))

    async def commit_upload(self, upload: Upload, size: int) -> Entry:
        return await self.timed("commit_upload", lambda: upload.commit(size),
                                extra_seconds=upload.commit_seconds())

    async def confirm(self, path: str, sent: Entry) -> Entry:
        """What the server holds at ``path`` after an upload that returned ``sent``
        (Unconfirmed unless it is that)."""
        return await self.timed("confirm", lambda: self.backend.confirm(path, sent))

    # -- changes made through this mount --------------------------------------------------------

    def note_entry(self, path: str, entry: Entry | None) -> None:
        """``path`` now is ``entry`` (None: gone) after a change made through this mount: the
        metadata layer and the parent's cached listing learn it without asking the backend."""
        parent, name = split_path(path)
        listing = self.listing.peek(parent)
        self.xattr_cache.discard(path)
        if entry is None:
            self.local.pop(path, None)
            self.metadata.put(path, _MISSING)
            if listing is not None:
                listing.remove(name)
        else:
            self.metadata.put(path, entry)
            if listing is not None:
                listing.upsert(entry)

    def has_local_below(self, path: str) -> bool:
        """Whether a file only this mount knows of lies below directory ``path``."""
        below = path.rstrip("/") + "/"
        return any(p.startswith(below) for p in self.local)

    def created_locally(self, path: str, entry: Entry) -> None:
        """A new file exists only in the mount until its first upload."""
        self.local[path] = entry
        self.note_entry(path, entry)

    def committed(self, path: str, entry: Entry) -> None:
        self.local.pop(path, None)
        self.note_entry(path, entry)

    def new_directory(self, path: str, entry: Entry) -> None:
        self.note_entry(path, entry)
        self.listing.put(path, Listing([]))

    def forget_tree(self, path: str) -> None:
        """Forget cached metadata and listings of ``path`` and everything below it."""
        below = path.rstrip("/") + "/"
        for layer in (self.metadata, self.listing):
            for key in layer.cached_keys():
                if key == path or key.startswith(below):
                    layer.discard(key)
        for key in [k for k in self.local if k.startswith(below)]:
            del self.local[key]

    def discard_data(self, path: str, entry: Entry) -> None:
        """Forget every cached block of ``path`` (e.g. after it failed verification)."""
        for key in [k for k in self.data.cached_keys() if k[0] == path]:
            self.data.discard(key)
        if self.disk is not None:
            version = content_version(entry)
            for index in range((entry.size + self.config.block_size - 1)
                               // self.config.block_size):
                self.disk.discard((path, version, index))

    def drop(self, layers: Iterable[str]) -> None:
        """Empty the named user-space layers (the kernel layer is the FUSE layer's job)."""
        for layer in layers:
            if layer in ("metadata", "listing", "data"):
                getattr(self, layer).drop()
                if layer == "metadata":
                    self.xattr_cache.drop()
                    self.backend.drop_caches()
            elif layer == "disk" and self.disk is not None:
                self.disk.drop()
