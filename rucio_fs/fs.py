"""The FUSE glue: pyfuse3 operations on top of :class:`~rucio_fs.catalog.Catalog`.

This is the only module that speaks pyfuse3's request API. It owns the inode table, the open
file and directory handles, the kernel cache layer (entry/attr/negative timeouts and
``keep_cache``) and the per-operation statistics.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import stat
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import pyfuse3
import trio

from .backend import Capability, Entry
from .caches import Listing
from .catalog import Catalog, child_path, content_version
from .config import MountConfig
from .errors import IntegrityError, NotADirectory, NotFound, RucioFsError
from .inodes import ROOT_INO, Inode, InodeTable
from .integrity import StreamVerifier, verifier_for
from .prefetch import Prefetcher
from .stats import Stats, errno_name
from .tracing import RequestRecorder

log = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


#: ``RUCIO_FS_STATS=0`` turns the per-operation latency histograms off. It exists only so that
#: benchmarks/ can measure what they cost; errors are still counted.
TIMING = os.environ.get("RUCIO_FS_STATS", "1") != "0"


def fuse_op(fn: F) -> F:
    """Times the operation, counts its errors by errno, and turns every failure into a FUSEError.

    Typed backend errors become their errno with one log line (ENOENT stays quiet); anything
    unexpected is logged with its traceback and becomes EIO: the daemon never dies on a request.
    """
    name = fn.__name__

    @functools.wraps(fn)
    async def wrapper(self: RucioFs, *args: Any) -> Any:
        op = self.stats.fuse_op(name)
        recorder = self.recorder
        start = time.perf_counter_ns() if TIMING or recorder is not None else 0
        code = 0
        try:
            return await fn(self, *args)
        except pyfuse3.FUSEError as exc:
            code = exc.errno
            raise
        except RucioFsError as exc:
            code = exc.errno
            if code != errno.ENOENT:
                log.warning("%s failed: %s", name, exc)
            raise pyfuse3.FUSEError(code) from None
        except Exception:
            code = errno.EIO
            log.exception("%s failed unexpectedly", name)
            raise pyfuse3.FUSEError(errno.EIO) from None
        finally:
            if code:
                op.errors[errno_name(code)] += 1
            if TIMING:
                op.latency.add(time.perf_counter_ns() - start)
            if recorder is not None:
                recorder.add(name, start, time.perf_counter_ns(), code)

    return wrapper  # type: ignore[return-value]


#: ``Inode.cached_version`` of a file whose pages must be dropped at the next open.
INVALID = "\0invalid"


@dataclass(slots=True)
class _DirHandle:
    inode: Inode
    listing: Listing
    fetched_at: float


@dataclass(slots=True)
class _FileHandle:
    inode: Inode
    entry: Entry
    backend_handle: Any
    verifier: StreamVerifier | None
    prefetcher: Prefetcher | None
    #: Where the previous read ended, to tell sequential reads from random ones.
    last_end: int = 0


class RucioFs(pyfuse3.Operations):
    """A read-only view of one catalog. Construct, then ``pyfuse3.init`` and ``pyfuse3.main``."""

    def __init__(self, catalog: Catalog, root_entry: Entry, config: MountConfig, stats: Stats,
                 uid: int | None = None, gid: int | None = None, xattrs: bool = False) -> None:
        super().__init__()
        self.catalog = catalog
        self.xattrs = xattrs
        self.config = config
        self.stats = stats
        self.inodes = InodeTable(root_entry)
        self.uid = os.getuid() if uid is None else uid
        self.gid = os.getgid() if gid is None else gid
        self.writable = bool(catalog.backend.capabilities & Capability.WRITE)
        #: Where background work (read-ahead, checksum hashing) runs; set by the daemon.
        self.nursery: trio.Nursery | None = None
        #: Blocks all read-ahead of the mount may have in flight (its share of the data budget).
        self._prefetch_budget = trio.Semaphore(max(1, catalog.prefetch_budget_blocks))
        #: Set while `rucio-fs trace` runs: every request's op, start, end and errno.
        self.recorder: RequestRecorder | None = None
        self._dirs: dict[int, _DirHandle] = {}
        self._files: dict[int, _FileHandle] = {}
        self._next_fh = 1
        if config.kernel:
            self._entry_ttl, self._attr_ttl = config.kernel_ttl, config.kernel_ttl
            self._immutable_ttl, self._negative_ttl = config.immutable_ttl, config.negative_ttl
        else:
            self._entry_ttl = self._attr_ttl = self._immutable_ttl = self._negative_ttl = 0.0

    # -- helpers ---------------------------------------------------------------------------

    def _inode(self, ino: int) -> Inode:
        try:
            return self.inodes[ino]
        except KeyError:
            raise pyfuse3.FUSEError(errno.ESTALE) from None

    def _attrs(self, inode: Inode) -> pyfuse3.EntryAttributes:
        """The reply attributes of ``inode``, built once per entry it has had."""
        attrs = inode.attrs
        if attrs is None:
            entry = inode.entry
            attrs = pyfuse3.EntryAttributes()
            attrs.st_ino = inode.ino
            attrs.entry_timeout = self._entry_ttl
            attrs.attr_timeout = self._immutable_ttl if entry.immutable else self._attr_ttl
            if entry.is_dir:
                attrs.st_mode = stat.S_IFDIR | (0o755 if self.writable else 0o555)
                attrs.st_nlink = 2
            else:
                attrs.st_mode = stat.S_IFREG | (0o644 if self.writable else 0o444)
                attrs.st_nlink = 1
            attrs.st_uid = self.uid
            attrs.st_gid = self.gid
            attrs.st_size = entry.size
            attrs.st_blksize = self.config.block_size
            attrs.st_blocks = (entry.size + 511) // 512
            attrs.st_atime_ns = attrs.st_mtime_ns = attrs.st_ctime_ns = entry.mtime_ns
            inode.attrs = attrs
        return attrs

    def _fresh(self, inode: Inode, now: float) -> bool:
        """Whether attributes just received answer without a call: for ``attr_window`` after
        they arrived, and while the directory handle whose listing delivered them is open
        (``ls -l`` stats entries between readdir calls, however long that takes)."""
        if now - inode.fetched_at < self.config.attr_window:
            return True
        parent = self.inodes.get(inode.parent)
        return (parent is not None and parent.listed_at == inode.fetched_at
                and (parent.open_dirs > 0 or now < parent.listing_fresh_until))

    async def _revalidate(self, inode: Inode) -> Entry:
        """The inode's current entry: its own if fresh, else through the catalog's layers."""
        now = time.monotonic()
        if not self._fresh(inode, now):
            entry = await self.catalog.stat(inode.path)
            if entry.kind is not inode.entry.kind:
                raise pyfuse3.FUSEError(errno.ESTALE)
            if entry is not inode.entry:
                inode.entry = entry
                inode.attrs = None
            inode.fetched_at = now
        return inode.entry

    def _new_fh(self) -> int:
        fh = self._next_fh
        self._next_fh += 1
        return fh

    # -- namespace -------------------------------------------------------------------------

    @fuse_op
    async def lookup(self, parent_inode: int, name: bytes, ctx: Any = None) -> Any:
        parent = self._inode(parent_inode)
        if not parent.entry.is_dir:
            raise NotADirectory(parent.path)
        text = os.fsdecode(name)
        now = time.monotonic()
        known = self.inodes.child(parent, text)
        if known is not None and self._fresh(known, now):
            entry = known.entry
        else:
            try:
                entry = await self.catalog.stat(child_path(parent.path, text))
            except NotFound:
                if self._negative_ttl > 0:
                    self.stats.events["negative_entries"] += 1
                    negative = pyfuse3.EntryAttributes()
                    negative.st_ino = 0
                    negative.entry_timeout = self._negative_ttl
                    return negative
                raise
        return self._attrs(self.inodes.lookup(parent, text, entry, now))

    @fuse_op
    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        for ino, count in inode_list:
            self.inodes.forget(ino, count)

    @fuse_op
    async def getattr(self, inode: int, ctx: Any = None) -> Any:
        node = self._inode(inode)
        await self._revalidate(node)
        return self._attrs(node)

    @fuse_op
    async def opendir(self, inode: int, ctx: Any) -> int:
        node = self._inode(inode)
        if not node.entry.is_dir:
            raise NotADirectory(node.path)
        listing = await self.catalog.list(node.path)
        fh = self._new_fh()
        self._dirs[fh] = handle = _DirHandle(node, listing, time.monotonic())
        node.open_dirs += 1
        node.listed_at = handle.fetched_at
        return fh

    @fuse_op
    async def readdir(self, fh: int, start_id: int, token: Any) -> None:
        handle = self._dirs[fh]
        parent, listing, now = handle.inode, handle.listing, handle.fetched_at
        entries, names, children = listing.entries, listing.names, parent.children
        lookup, attrs_of, reply = self.inodes.lookup, self._attrs, pyfuse3.readdir_reply
        for index in range(start_id, len(entries)):
            entry = entries[index]
            child = children.get(entry.name)
            if child is not None and child.entry is entry and child.attrs is not None:
                # Warm path: the kernel already knows this very entry and its attributes.
                child.lookups += 1
                child.fetched_at = now
                attrs = child.attrs
            else:
                child = lookup(parent, entry.name, entry, now)
                attrs = attrs_of(child)
            if not reply(token, names[index], attrs, index + 1):
                self.inodes.forget(child.ino, 1)  # the kernel did not take this one
                break

    @fuse_op
    async def releasedir(self, fh: int) -> None:
        handle = self._dirs.pop(fh)
        node = handle.inode
        node.open_dirs -= 1
        if node.listed_at == handle.fetched_at:
            # The window of attributes from this listing starts when its reader is done.
            node.listing_fresh_until = time.monotonic() + self.config.attr_window

    # -- data ------------------------------------------------------------------------------

    @fuse_op
    async def open(self, inode: int, flags: int, ctx: Any) -> pyfuse3.FileInfo:
        node = self._inode(inode)
        if flags & os.O_ACCMODE != os.O_RDONLY and not self.writable:
            raise pyfuse3.FUSEError(errno.EROFS)
        entry = await self._revalidate(node)
        backend_handle = await self.catalog.open(node.path, entry)
        version = content_version(entry)
        # Keep the kernel's page cache only when it can hold nothing but this very content:
        # pages of this version, or none yet of an immutable file. A failed verification
        # leaves INVALID, so the next open drops whatever pages that read left behind.
        seen = node.cached_version
        keep = self.config.kernel and (seen == version or (seen is None and entry.immutable))
        node.cached_version = version if self.config.kernel else None
        verifier = None
        if self.config.verify and seen != version and self.nursery is not None:
            # A new version's first pass is verified.
            verifier = verifier_for(node.path, entry.size, entry.checksums)
            if verifier is not None:
                self.nursery.start_soon(verifier.run)
        prefetcher = None
        if self.config.data and self.config.prefetch_max_bytes and self.nursery is not None:
            window = max(1, self.config.prefetch_max_bytes // self.config.block_size)
            prefetcher = Prefetcher(self.catalog, node.path, entry, backend_handle, self.nursery,
                                    self._prefetch_budget, window)
        fh = self._new_fh()
        self._files[fh] = _FileHandle(node, entry, backend_handle, verifier, prefetcher)
        return pyfuse3.FileInfo(fh=fh, keep_cache=keep)

    @fuse_op
    async def read(self, fh: int, off: int, size: int) -> bytes:
        handle = self._files[fh]
        # The kernel's parallel read-ahead arrives slightly out of order: still sequential.
        sequential = abs(off - handle.last_end) <= self.config.block_size
        handle.last_end = off + size
        if handle.prefetcher is not None:
            handle.prefetcher.on_read(off, size, sequential)
        data = await self.catalog.read(handle.inode.path, handle.entry, handle.backend_handle,
                                       off, size, sequential)
        self.stats.fuse_op("read").bytes += len(data)
        if handle.verifier is not None:
            try:
                await handle.verifier.feed(off, data)
            except IntegrityError:
                # Neither our blocks nor the kernel's pages of this file may be served again.
                self.catalog.discard_data(handle.inode.path, handle.entry)
                handle.inode.cached_version = INVALID
                raise
        return data

    @fuse_op
    async def release(self, fh: int) -> None:
        handle = self._files.pop(fh)
        if handle.prefetcher is not None:
            await handle.prefetcher.drain()
        if handle.verifier is not None:
            await handle.verifier.close()
            self.stats.events[f"checksum_{handle.verifier.state}"] += 1
        await self.catalog.close(handle.backend_handle)

    @fuse_op
    async def statfs(self, ctx: Any) -> pyfuse3.StatvfsData:
        usage = await self.catalog.backend.usage()
        data = pyfuse3.StatvfsData()
        data.f_bsize = data.f_frsize = self.config.block_size
        data.f_blocks = usage.total_bytes // self.config.block_size
        data.f_bfree = data.f_bavail = usage.free_bytes // self.config.block_size
        data.f_files = usage.files
        data.f_namemax = 255
        return data

    # -- extended attributes ---------------------------------------------------------------

    async def _xattrs(self, inode: int) -> dict[str, bytes]:
        if not self.xattrs:
            # ENOSYS makes the kernel stop sending xattr requests for the rest of the mount.
            raise pyfuse3.FUSEError(errno.ENOSYS)
        node = self._inode(inode)
        entry = await self._revalidate(node)
        return await self.catalog.xattrs(node.path, entry)

    @fuse_op
    async def getxattr(self, inode: int, name: bytes, ctx: Any) -> bytes:
        key = os.fsdecode(name)
        if key.startswith("user.") or not self.xattrs:
            value = (await self._xattrs(inode)).get(key[5:])
            if value is not None:
                return value
        raise pyfuse3.FUSEError(pyfuse3.ENOATTR)

    @fuse_op
    async def listxattr(self, inode: int, ctx: Any) -> list[bytes]:
        return [os.fsencode("user." + key) for key in await self._xattrs(inode)]

    # -- cache control ---------------------------------------------------------------------

    def drop_caches(self, layers: Sequence[str]) -> None:
        """Drop user-space layers now; the kernel layer needs :meth:`drop_kernel_cache`."""
        self.catalog.drop(layers)
        if "metadata" in layers:
            for node in self.inodes:
                node.fetched_at = 0.0

    async def drop_kernel_cache(self) -> int:
        """Invalidate every dentry, attribute and cached page the kernel holds for this mount.

        Runs in a worker thread: an invalidation may wait for the kernel to finish a request
        that this very event loop has to answer. Returns how many inodes were invalidated.
        """
        nodes = sorted(self.inodes, key=lambda n: n.path.count("/"), reverse=True)
        for node in nodes:
            node.cached_version = None

        def invalidate() -> int:
            done = 0
            for node in nodes:
                try:
                    pyfuse3.invalidate_inode(node.ino)
                    done += 1
                except OSError:
                    pass  # already forgotten by the kernel
                if node.ino != ROOT_INO:
                    with contextlib.suppress(OSError):
                        pyfuse3.invalidate_entry(node.parent, os.fsencode(node.name))
            return done

        count = await trio.to_thread.run_sync(invalidate)
        self.stats.cache_layer("kernel")["drops"] += 1
        return count
