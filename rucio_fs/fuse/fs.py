"""The FUSE glue: pyfuse3 operations on top of :class:`~rucio_fs.catalog.catalog.Catalog`.

This is the only module that speaks pyfuse3's request API. It owns the inode table, the open
file and directory handles, the kernel cache layer (entry/attr/negative timeouts and
``keep_cache``) and the per-operation statistics.

Why one module of this size: pyfuse3 dispatches to the methods of one Operations class, and
each FUSE request's translation (errno, kernel-cache policy, inode bookkeeping) reads best
whole in one place; what is not translation lives in the packages below.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import functools
import logging
import os
import select
import stat
import time
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import pyfuse3
import trio
from cachetools import LRUCache

from rucio_fs.backend import (
    DEFAULT_DIRECTORY_MODE,
    NAME_MAX,
    Attributes,
    Capability,
    Entry,
    FsUsage,
    Kind,
    same_attributes,
)
from rucio_fs.background import start_guarded
from rucio_fs.cache.budget import Shares
from rucio_fs.cache.caches import Listing
from rucio_fs.catalog.catalog import Catalog, child_path
from rucio_fs.config import MountConfig
from rucio_fs.data.datapath import ReadStream
from rucio_fs.data.integrity import StreamVerifier, Verification
from rucio_fs.errors import (
    AlreadyExists,
    IntegrityError,
    InvalidInput,
    IsADirectory,
    NoCredentials,
    NotADirectory,
    NotEmpty,
    NotFound,
    NotPermitted,
    NotSupported,
    PermissionDenied,
    RucioFsError,
)
from rucio_fs.identity import Caller
from rucio_fs.observe.stats import Stats, errno_name
from rucio_fs.observe.tracing import RequestRecorder
from rucio_fs.users.identities import Identities
from rucio_fs.write.writeback import DirtyFile, WriteBack, is_local

from . import passthrough
from .inodes import ROOT_INO, Inode, InodeTable
from .passthrough import BackingFiles

log = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


#: ``RUCIO_FS_STATS=0`` turns the per-operation latency histograms off. It exists only so that
#: benchmarks/ can measure what they cost; errors are still counted.
TIMING = os.environ.get("RUCIO_FS_STATS", "1") != "0"
#: Seconds a change of attributes waits, with synchronous write-back, for a rename or a
#: later change to carry it (see :meth:`RucioFs._set_attributes`).
ATTRIBUTES_HELD = 1.0
#: Whether a handle can tell the kernel to send no FLUSH when its file is closed (a pyfuse3
#: built with ``scripts/pyfuse3-kernel-io.patch``; see :meth:`RucioFs.create`).
NO_FLUSH = hasattr(pyfuse3.FileInfo(), "noflush")
#: Seconds between looks while :meth:`RucioFs.closes_arrived` waits, and how many looks
#: find requests arriving all the time before it stops waiting for a quiet moment.
CLOSES_POLL, CLOSES_LOOKS = 0.001, 1000


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
        self.requests_running += 1
        op.begin()
        try:
            if self.identities is not None and not (
                    name == "statfs" or (name == "getattr" and args[0] == ROOT_INO)):
                _serving.set(await self._caller_catalog(args))
            return await fn(self, *args)
        except pyfuse3.FUSEError as exc:
            code = exc.errno
            raise
        except RucioFsError as exc:
            code = exc.errno
            if code != errno.ENOENT and not isinstance(exc, NoCredentials):
                log.warning("%s failed: %s", name, exc)
            raise pyfuse3.FUSEError(code) from None
        except OSError as exc:
            if exc.errno not in LOCAL_ERRNOS:
                code = errno.EIO
                log.exception("%s failed unexpectedly", name)
                raise pyfuse3.FUSEError(errno.EIO) from None
            code = exc.errno
            log.warning("%s failed: the staging directory: %s", name, exc)
            raise pyfuse3.FUSEError(code) from None
        except Exception:
            code = errno.EIO
            log.exception("%s failed unexpectedly", name)
            raise pyfuse3.FUSEError(errno.EIO) from None
        finally:
            self.requests_running -= 1
            op.end()
            self.last_request_end = time.monotonic()
            if code:
                op.errors[errno_name(code)] += 1
            if TIMING:
                op.latency.add(time.perf_counter_ns() - start)
            if recorder is not None:
                recorder.add(name, start, time.perf_counter_ns(), code)

    return wrapper  # type: ignore[return-value]


#: The catalog serving the request this task answers (per-user mounts; see ``RucioFs.catalog``).
_serving: contextvars.ContextVar[Catalog | None] = contextvars.ContextVar("serving",
                                                                          default=None)

#: Whether pyfuse3 can ask the kernel to cache directory listings (FOPEN_CACHE_DIR): a
#: build with scripts/pyfuse3-cache-readdir.patch (scripts/install.sh); stock pyfuse3 cannot,
#: and every readdir then comes to the daemon.
KERNEL_LISTINGS = hasattr(pyfuse3.FileInfo(), "cache_readdir")

#: ``Inode.cached_version`` of a file whose pages must be dropped at the next open.
INVALID = "\0invalid"

#: The ``st_blksize`` of a stored file: a page, as local disks say.
READ_BLKSIZE = 4096


@dataclass(slots=True)
class _DirHandle:
    inode: Inode
    listing: Listing
    fetched_at: float
    catalog: Catalog | None = None


@dataclass(slots=True)
class _FileHandle:
    inode: Inode
    entry: Entry
    backend_handle: Any
    verifier: StreamVerifier | None
    stream: ReadStream | None
    #: The file's pending content, when it has any; ``writer``: this handle may write.
    dirty: DirtyFile | None = None
    writer: bool = False
    #: The catalog that opened it (per-user mounts: its caller's).
    catalog: Catalog | None = None
    #: How the kernel serves it: reads and writes go to a backing file (``passthrough``),
    #: or through its page cache (``cached``), or neither (direct I/O).
    passthrough: bool = False
    cached: bool = False
    #: What its backing id is held under (:class:`BackingFiles`), when it passes through.
    backing_key: Hashable = None


def _writeback_of(catalog: Catalog) -> WriteBack | None:
    """The write-back serving ``catalog`` (it is the catalog's overlay), if any."""
    return catalog.overlay if isinstance(catalog.overlay, WriteBack) else None


def _removed(node: Inode) -> bool:
    """Whether ``node``'s name was removed (or replaced) through the mount while the kernel
    still holds the inode (an open file): its path names no longer this file."""
    return node.parent == 0 and node.ino != ROOT_INO


def _invalidate_entry(parent_ino: int, name: str) -> None:
    with contextlib.suppress(OSError):  # already forgotten by the kernel
        pyfuse3.invalidate_entry(parent_ino, os.fsencode(name))


def _forget_in_kernel(parent_ino: int, name: str, ino: int) -> None:
    """The kernel forgets the name and the attributes (and pages) of an inode."""
    _invalidate_entry(parent_ino, name)
    _invalidate_inode(ino)


def _invalidate_inode(ino: int) -> None:
    with contextlib.suppress(OSError):  # already forgotten by the kernel
        pyfuse3.invalidate_inode(ino)


async def _not_implemented(*_args: Any) -> None:
    raise pyfuse3.FUSEError(errno.ENOSYS)


#: Errors of the local staging disk that reach the caller as they are: a full disk is
#: ENOSPC, so that the user can tell what to fix (anything else there is EIO).
LOCAL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


class RucioFs(pyfuse3.Operations):
    """One catalog as a file system (writable when the backend declares ``WRITE`` and a
    :class:`WriteBack` is given). Construct, then ``pyfuse3.init`` and ``pyfuse3.main``."""

    def __init__(self, catalog: Catalog, root_entry: Entry, config: MountConfig, stats: Stats,
                 uid: int | None = None, gid: int | None = None, xattrs: bool = False,
                 writeback: WriteBack | None = None,
                 identities: Identities | None = None, writable: bool = False) -> None:
        super().__init__()
        self._catalog = catalog
        #: Per-user mounts: every request is served by its caller's catalog.
        self.identities = identities
        self.xattrs = xattrs
        self.config = config
        self.stats = stats
        self.inodes = InodeTable(root_entry)
        self.uid = os.getuid() if uid is None else uid
        self.gid = os.getgid() if gid is None else gid
        #: Whether names and contents may change through the mount (a per-user mount: each
        #: user's catalog has its own write-back, attached as it is made).
        self.writable = writeback is not None or writable
        self._writes = writeback
        if not self.writable:
            # ENOSYS once makes the kernel stop sending FLUSH: no round trip per close.
            self.flush = self.fsync = _not_implemented  # type: ignore[method-assign,assignment]
        if writeback is not None:
            self.attach(writeback)
        #: FUSE requests being answered, and when the last one ended (time.monotonic).
        self.requests_running = 0
        self.last_request_end = 0.0
        #: One token per RELEASE being answered.
        self._releasing: set[object] = set()
        self._channel: select.poll | None = None
        #: Where background work (read-ahead, checksum hashing) runs; set by the daemon.
        self.nursery: trio.Nursery | None = None
        #: Checksums of whole reads (one verifier per open version, fed by every handle).
        self.verification = Verification(config.verify, Shares(config.memory_limit).verification,
                                         stats.events)
        #: Set while `rucio-fs trace` runs: every request's op, start, end and errno.
        self.recorder: RequestRecorder | None = None
        self._dirs: dict[int, _DirHandle] = {}
        #: Per-user mounts: (serial, serial) -> whether two catalogs' listings are the same.
        self._same_listings: LRUCache[tuple[int, int], bool] = LRUCache(4096)
        #: Per-user mounts: listing serial -> the serial of a listing found equal to it.
        self._listing_classes: LRUCache[int, int] = LRUCache(4096)
        self._files: dict[int, _FileHandle] = {}
        self._next_fh = 1
        if config.kernel:
            self._entry_ttl, self._attr_ttl = config.kernel_ttl, config.kernel_ttl
            self._immutable_ttl, self._negative_ttl = config.immutable_ttl, config.negative_ttl
            if identities is not None:
                # The kernel's entries serve every user: none outlives the ordinary TTL.
                self._immutable_ttl = min(self._immutable_ttl, config.kernel_ttl)
        else:
            self._entry_ttl = self._attr_ttl = self._immutable_ttl = self._negative_ttl = 0.0
        #: Whether the kernel keeps mutable entries as long as the catalog's caches do (not
        #: on a per-user mount: one user's entries must not answer another's lookups).
        self._follows_catalog = config.kernel and identities is None
        #: Passthrough: asked for (None until the kernel's answer to FUSE_INIT is known),
        #: and the backing files of the staged files open through it.
        self._passthrough: bool | None = None if config.passthrough else False
        self._backing = BackingFiles(stats.events)

    # -- helpers ---------------------------------------------------------------------------

    @property
    def writes(self) -> WriteBack | None:
        """The write-back serving this request: the mount's, or on a per-user mount the
        caller's own (pending files of one user are never another's)."""
        return self._writes if self.identities is None else _writeback_of(self.catalog)

    def attach(self, writeback: WriteBack) -> None:
        """Have ``writeback`` tell this mount when its uploads land and when it is busy."""
        writeback.on_uploaded = functools.partial(self._uploaded, writeback)
        writeback.on_dropped = self._dropped
        writeback.queue.quiet_for = self._quiet_for

    def writebacks(self) -> list[WriteBack]:
        """Every write-back of the mount (a per-user mount: one per user)."""
        if self.identities is None:
            return [self._writes] if self._writes is not None else []
        found = (_writeback_of(c) for c in self.identities.catalogs())
        return list({id(w): w for w in found if w is not None}.values())

    @property
    def catalog(self) -> Catalog:
        """The catalog serving this request: the mount's, or on a per-user mount the
        caller's (set by ``fuse_op``); never the mounting user's on a per-user mount."""
        if self.identities is None:
            return self._catalog
        catalog = _serving.get()
        if catalog is None:
            raise PermissionDenied("a request of no known caller")
        return catalog

    async def _caller_catalog(self, args: tuple[Any, ...]) -> Catalog | None:
        """The catalog of a per-user mount's request: its caller's (a request with a
        context), else the one that opened the handle it names, else none (``forget``)."""
        assert self.identities is not None
        ctx = args[-1] if args else None
        if isinstance(ctx, pyfuse3.RequestContext):
            return await self.identities.catalog_for(Caller(ctx.uid, ctx.gid, ctx.pid))
        handle = (self._files.get(args[0]) or self._dirs.get(args[0])
                  if args and isinstance(args[0], int) else None)
        return handle.catalog if handle is not None else None

    def _inode(self, ino: int) -> Inode:
        try:
            return self.inodes[ino]
        except KeyError:
            raise pyfuse3.FUSEError(errno.ESTALE) from None

    def _attrs(self, inode: Inode, until: float | None = None) -> pyfuse3.EntryAttributes:
        """The reply attributes of ``inode``, built once per entry it has had, with the
        kernel's timeouts (see :meth:`_time_out`; ``until``: when the catalog stops
        answering it from its caches, where the caller knows)."""
        attrs = inode.attrs
        if attrs is None:
            entry = inode.entry
            attrs = pyfuse3.EntryAttributes()
            attrs.st_ino = inode.ino
            attrs.entry_timeout = self._entry_ttl
            attrs.attr_timeout = self._immutable_ttl if entry.immutable else self._attr_ttl
            if entry.is_dir:
                perm = DEFAULT_DIRECTORY_MODE if entry.mode is None else entry.mode
                attrs.st_mode = stat.S_IFDIR | self._shown_mode(perm, 0o777)
                attrs.st_nlink = 2
            elif entry.is_symlink:
                attrs.st_mode = stat.S_IFLNK | 0o777
                attrs.st_nlink = 1
            else:
                perm = 0o644 if entry.mode is None else entry.mode
                attrs.st_mode = stat.S_IFREG | self._shown_mode(perm, 0o666)
                attrs.st_nlink = 1
            attrs.st_uid = self.uid if entry.uid is None else entry.uid
            attrs.st_gid = self.gid if entry.gid is None else entry.gid
            attrs.st_size = entry.size
            # Readers buffer by st_blksize (Python, stdio): a stored file says one page,
            # so a small read is not rounded up to a block; content being written says a
            # block, so writers send it in block-sized writes.
            attrs.st_blksize = self.config.block_size if is_local(entry) else READ_BLKSIZE
            attrs.st_blocks = (entry.size + 511) // 512
            attrs.st_atime_ns = attrs.st_mtime_ns = attrs.st_ctime_ns = entry.mtime_ns
            inode.attrs = attrs
        if self._follows_catalog and not inode.entry.immutable:
            self._time_out(attrs, self.catalog.kept_until(inode.path) if until is None
                           else until)
        return attrs

    def _time_out(self, attrs: pyfuse3.EntryAttributes, until: float) -> None:
        """The kernel keeps a name and its attributes for ``--kernel-ttl``, or for as long
        as the catalog would answer them from its caches (until ``until``) if longer: a
        lookup it sends meanwhile would be answered with the same entry, so other clients'
        changes show no later than they do without the kernel's cache. Whatever makes the
        catalog forget an entry sooner (a dropped change, ``cache drop``) makes the kernel
        forget it too."""
        attrs.entry_timeout = attrs.attr_timeout = max(self._entry_ttl,
                                                       until - time.monotonic())

    def _shown_mode(self, perm: int, everyone: int) -> int:
        """The permission bits the kernel checks (``default_permissions``): no write bits
        on a read-only mount; on a writable per-user mount ``everyone`` may try, and the
        caller's own catalog decides."""
        if not self.writable:
            return perm & ~0o222
        return perm | everyone if self.identities is not None else perm

    def _fresh(self, inode: Inode, now: float) -> bool:
        """Whether attributes just received answer without a call: for ``attr_window`` after
        they arrived, and while the directory handle whose listing delivered them is open
        (``ls -l`` stats entries between readdir calls, however long that takes)."""
        if self.identities is not None:
            return False  # attributes fetched for one user never answer another's lookup
        if now - inode.fetched_at < self.config.attr_window:
            return True
        parent = self.inodes.get(inode.parent)
        return (parent is not None and parent.listed_at == inode.fetched_at
                and (parent.open_dirs > 0 or now < parent.listing_fresh_until))

    async def _revalidate(self, inode: Inode) -> Entry:
        """The inode's current entry: its own if fresh, else through the catalog's layers
        (a file with pending content: its local attributes; a removed file: what it was)."""
        dirty = self._dirty_of(inode)
        if dirty is not None:
            entry = dirty.entry()
            if entry.version != inode.entry.version:
                inode.entry, inode.attrs = entry, None
            return inode.entry
        if _removed(inode):  # its path may name another file now
            if any(h.inode is inode for h in self._files.values()):
                return inode.entry  # what an open descriptor of it shows
            raise NotFound(f"{inode.path}: removed")
        now = time.monotonic()
        if not self._fresh(inode, now):
            entry = await self.catalog.stat(inode.path)
            if entry.kind is not inode.entry.kind:
                raise pyfuse3.FUSEError(errno.ESTALE)
            inode.take(entry)
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
        dirty = self._dirty(child_path(parent.path, text))
        if dirty is not None:
            entry = dirty.entry()
        elif known is not None and self._fresh(known, now):
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
        if self.identities is not None and inode == ROOT_INO:
            return self._attrs(node)  # the mount's root is there for every caller
        await self._revalidate(node)
        return self._attrs(node)

    @fuse_op
    async def access(self, inode: int, mode: int, ctx: Any) -> bool:
        """``access()`` and ``chdir``: asked only where the kernel does not check the
        permission bits itself, a mount of root's that only root can enter. Root may read,
        write and search anything and execute a file with an x bit, as on a local disk (a
        read-only mount refuses writes before asking)."""
        if not mode & os.X_OK:
            return True
        node = self._inode(inode)
        await self._revalidate(node)
        st_mode = self._attrs(node).st_mode
        return stat.S_ISDIR(st_mode) or bool(st_mode & 0o111)

    @fuse_op
    async def opendir(self, inode: int, ctx: Any) -> int | pyfuse3.FileInfo:
        node = self._inode(inode)
        if not node.entry.is_dir:
            raise NotADirectory(node.path)
        listing = await self.catalog.list(node.path)
        fh = self._new_fh()
        self._dirs[fh] = handle = _DirHandle(node, listing, time.monotonic(), self.catalog)
        node.open_dirs += 1
        node.listed_at = handle.fetched_at
        if KERNEL_LISTINGS and self.config.kernel:
            # The kernel may keep this listing (answering later readdirs itself) and keeps
            # what it holds only while it is still these very contents: a new listing (the
            # TTL ended, a drop) or a change makes the kernel read it again. Serials are
            # unique to one listing of one catalog, so on a per-user mount the kernel's copy
            # is kept only for a caller whose own catalog's listing is that one, or holds
            # the very same entries (then it is the caller's own answer); for another user
            # the kernel drops it and reads that user's listing. And only while half the
            # time the dentries and attributes of its last reading are valid is left (for
            # whoever stats the entries next): past their end, `ls -l` served from the
            # kernel's copy cost a LOOKUP per entry (10 users at once, 10,000 entries: 2.7 s
            # instead of 0.3 s), where reading the listing again renews them all at once.
            keep = (listing.complete and node.kernel_listing != 0
                    and handle.fetched_at - node.kernel_listed_at
                    < min(self._entry_ttl, self._attr_ttl) / 2
                    and (node.kernel_listing == listing.serial
                         or self._same_as_kernel_copy(node, listing)))
            if not keep:
                node.kernel_listed_at = handle.fetched_at
            node.kernel_listing = listing.serial if listing.complete else 0
            node.kernel_listing_of = listing if listing.complete else None
            return pyfuse3.FileInfo(fh=fh, keep_cache=keep, cache_readdir=listing.complete)
        return fh

    def _same_as_kernel_copy(self, node: Inode, listing: Listing) -> bool:
        """Per-user mounts: whether the kernel's copy of ``node``'s listing (read from
        another catalog's listing, unchanged since) has exactly ``listing``'s entries, in
        order, with the same attributes (each pair of listings compared once)."""
        held = node.kernel_listing_of
        if self.identities is None or held is None or held.serial != node.kernel_listing:
            return False
        classes = self._listing_classes
        known = classes.get(held.serial)
        if known is not None and known == classes.get(listing.serial):
            return True  # both found equal to the same listing before
        key = (held.serial, listing.serial)
        same = self._same_listings.get(key)
        if same is None:
            same = (held.names == listing.names and len(held.entries) == len(listing.entries)
                    and all(a is b or (a is not None and b is not None
                                       and same_attributes(a, b))
                            for a, b in zip(held.entries, listing.entries, strict=True)))
            self._same_listings[key] = same
            if same:  # ten users' equal listings: compared once each, not once per pair
                classes[held.serial] = classes[listing.serial] = known or held.serial
        return same

    @fuse_op
    async def readdir(self, fh: int, start_id: int, token: Any) -> None:
        handle = self._dirs[fh]
        parent, listing, now = handle.inode, handle.listing, handle.fetched_at
        if not listing.complete and start_id >= len(listing.entries):
            # Still arriving: wait for more, or for the error that cut the listing short.
            await listing.wait_beyond(start_id)
            if listing.error is not None and start_id >= len(listing.entries):
                raise listing.error
        entries, names, children = listing.entries, listing.names, parent.children
        lookup, attrs_of, reply = self.inodes.lookup, self._attrs, pyfuse3.readdir_reply
        follows, time_out = self._follows_catalog, self._time_out
        # Entries the listing holds with their stored attributes are answered from it.
        listed_until = self.catalog.listing.expires(parent.path) if follows else 0.0
        writes = self.writes
        dirty_files = writes.files if writes is not None else {}
        for index in range(start_id, len(entries)):
            entry = entries[index]
            if entry is None:  # removed through the mount while listed
                continue
            if dirty_files:
                dirty = dirty_files.get(child_path(parent.path, entry.name))
                if dirty is not None:
                    entry = dirty.entry()
            child = children.get(entry.name)
            if child is not None and child.attrs is not None and (
                    child.entry is entry or same_attributes(child.entry, entry)):
                # Warm path: the kernel already knows this file and its attributes.
                child.take(entry)
                child.lookups += 1
                child.fetched_at = now
                attrs = child.attrs
                if follows and not entry.immutable:
                    time_out(attrs, listed_until if entry.complete else 0.0)
            else:
                child = lookup(parent, entry.name, entry, now)
                attrs = attrs_of(child, listed_until if entry.complete else 0.0)
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
        if flags & os.O_ACCMODE != os.O_RDONLY:
            return await self._open_for_writing(node, flags)
        dirty = self._dirty_of(node)
        if dirty is not None:
            self._give_way(node, dirty)
            return await self._dirty_handle(node, dirty, writer=False)
        if _removed(node):
            raise NotFound(f"{node.path}: removed")
        entry = await self._revalidate(node)
        version = self.catalog.data_path.version_of(node.path, entry)
        self._give_way(node, ("whole", node.path, version))
        if self._reads_pass:
            info = await self._whole_handle(node, entry, version)
            if info is not None:
                return info
        backend_handle = await self.catalog.open(node.path, entry)
        verifier = self.verification.join(node, entry.checksums, entry.size, version,
                                          self.nursery)
        # Keep the kernel's page cache only when it can hold nothing but this very content,
        # checked: pages of this version, or none yet of an immutable file, and never pages
        # of a version no complete pass has verified yet (a checksum to verify and no
        # verdict). A failed verification leaves INVALID, so the next open drops the pages.
        seen = node.cached_version
        # Per-user mounts never keep pages: what one user read is not another's to see.
        keep = (self.config.kernel and verifier is None and self.identities is None
                and (seen == version or (seen is None and entry.immutable)))
        node.cached_version = version if self.config.kernel else None
        data_path = self.catalog.data_path
        # A file read sparsely a moment ago is read direct: the kernel then asks for what
        # the reader reads, not its read-ahead around each piece.
        direct = self.config.direct_sparse and data_path.read_sparsely(node.path, entry)
        stream = data_path.stream(node.path, entry, backend_handle, self.nursery, direct,
                                  reader=getattr(ctx, "pid", None))
        fh = self._new_fh()
        self._files[fh] = _FileHandle(node, entry, backend_handle, verifier, stream,
                                      catalog=self.catalog, cached=not direct)
        node.cached_opens += not direct
        if direct:
            self.stats.events["opened_direct"] += 1
        return pyfuse3.FileInfo(fh=fh, keep_cache=keep, direct_io=direct)

    @fuse_op
    async def read(self, fh: int, off: int, size: int) -> bytes:
        handle = self._files[fh]
        if handle.dirty is not None:
            return await self._read_dirty(handle, off, size)
        assert handle.stream is not None
        verifier = handle.verifier
        if verifier is not None:
            verifier.check()  # a failed pass: nothing more is read for it
        data = await handle.stream.read(off, size)
        self.stats.fuse_op("read").bytes += len(data)
        if verifier is not None:
            def read_again(offset: int, size: int) -> Awaitable[bytes | memoryview]:
                return self.catalog.data_path.read(handle.inode.path, handle.entry,
                                                   handle.backend_handle, offset, size)

            try:
                await self.verification.feed(handle.inode, verifier, off, data, read_again)
            except IntegrityError:
                # Neither our blocks nor the kernel's pages of this file may be served again,
                # and the next reads come from another copy where there is one (this read's
                # bytes completed the pass, or its copy was read in it).
                (handle.catalog or self.catalog).distrust(handle.backend_handle)
                self.catalog.data_path.discard(handle.inode.path, handle.entry)
                handle.inode.cached_version = INVALID
                self._forget_pages(handle.inode)
                raise
        return data

    def _forget_pages(self, node: Inode) -> None:
        """Make the kernel drop its cached pages of ``node`` (in the background: invalidating
        may wait for a read this loop has to answer)."""
        if self.nursery is not None and self.config.kernel:
            start_guarded(self.nursery, self.stats.events, "invalidating pages",
                          trio.to_thread.run_sync, _invalidate_inode, node.ino)

    @fuse_op
    async def release(self, fh: int) -> None:
        answering = object()  # (a handle number may be given again before this ends)
        self._releasing.add(answering)
        try:
            await self._release(fh)
        finally:
            self._releasing.discard(answering)

    async def _release(self, fh: int) -> None:
        handle = self._files.pop(fh)
        node = handle.inode
        node.cached_opens -= handle.cached
        if handle.passthrough:
            node.passthrough_opens -= 1
            if not node.passthrough_opens:
                node.backing_key = None
            self._backing.give_back(handle.backing_key)
            if handle.dirty is None:
                # What went through at most: the file's size at the close of a reader.
                self.stats.events["passthrough_read_bytes"] += handle.entry.size
                return
            if handle.writer:
                handle.dirty.kernel_writer_gone()
                # What went through: the file's size at the close of a handle that wrote.
                self.stats.events["passthrough_written_bytes"] += handle.dirty.size
        try:
            await self._close_reading(handle)
        finally:  # whatever failed above, this writer is gone
            if handle.writer and handle.dirty is not None:
                await self._release_writer(handle)

    async def _close_reading(self, handle: _FileHandle) -> None:
        """What a handle holds for reading: its stream, verifier and backend handle."""
        if handle.stream is not None:
            await handle.stream.close()
        if handle.verifier is not None:
            await self.verification.leave(handle.inode, handle.verifier)
        if handle.dirty is None and self._reads_pass:
            await self._offer_whole(handle)
        if handle.backend_handle is not None or handle.dirty is None:
            # Pieces fetched ahead with this backend handle may still be on their way.
            backend_handle = handle.backend_handle
            await self.catalog.data_path.handle_users.close(
                backend_handle, lambda: self.catalog.close(backend_handle))

    async def _offer_whole(self, handle: _FileHandle) -> None:
        """A reader that read the file whole (its checksum matched, or, without one, the
        reader was asked for most of it) is done: the disk layer may seal the file for
        later opens to pass through."""
        node, entry = handle.inode, handle.entry
        version = self.catalog.data_path.version_of(node.path, entry)
        verified = node.verified_version == version
        stream = handle.stream
        if not verified and (stream is None or stream.bytes_read * 2 < entry.size):
            return
        checksums = dict(entry.checksums) if self.verification.enabled else {}
        await self.catalog.data_path.offer_whole(node.path, entry, checksums, verified,
                                                 handle.backend_handle, self.nursery)

    async def _release_writer(self, handle: _FileHandle) -> None:
        """The handle's writer is gone: its file is uploaded (sync) or left queued."""
        dirty = handle.dirty
        assert dirty is not None
        await dirty.wb.release(dirty)  # the write-back the file is pending in
        if self._dirty(dirty.path) is not dirty and dirty.base is not None:
            node = handle.inode
            node.entry, node.attrs, node.fetched_at = dirty.base, None, time.monotonic()

    @fuse_op
    async def statfs(self, ctx: Any) -> pyfuse3.StatvfsData:
        # A per-user mount's capacity would be one user's view: unknown (zeros) for all.
        usage = FsUsage() if self.identities is not None else await self.catalog.usage()
        data = pyfuse3.StatvfsData()
        data.f_bsize = data.f_frsize = self.config.block_size
        data.f_blocks = usage.total_bytes // self.config.block_size
        data.f_bfree = data.f_bavail = usage.free_bytes // self.config.block_size
        data.f_files = usage.files
        data.f_namemax = NAME_MAX
        return data

    # -- writing ---------------------------------------------------------------------------

    def _dirty(self, path: str) -> DirtyFile | None:
        if not self.writable:  # (asked per lookup: a read-only mount answers at once)
            return None
        writes = self.writes
        return writes.files.get(path) if writes is not None else None

    def _dirty_of(self, node: Inode) -> DirtyFile | None:
        """The pending content of the file ``node`` is: by its path, unless it was removed
        (its path may name another file now), then the content its open handles write."""
        if not _removed(node):
            return self._dirty(node.path)
        return next((h.dirty for h in self._files.values()
                     if h.inode is node and h.dirty is not None), None)

    def _writeback(self) -> WriteBack:
        if self.writes is None:
            raise pyfuse3.FUSEError(errno.EROFS)
        return self.writes

    def _need(self, capability: Capability, what: str) -> None:
        self._writeback()
        if not self.catalog.can(capability):
            raise NotSupported(f"{self.catalog.scheme} cannot {what}")

    def _child(self, parent_inode: int, name: bytes) -> tuple[Inode, str, str]:
        """The parent inode, the child's name and its catalog path."""
        parent = self._inode(parent_inode)
        text = os.fsdecode(name)
        return parent, text, child_path(parent.path, text)

    async def _entry_of(self, path: str) -> Entry:
        """What ``path`` is (a namespace change needs its existence and kind)."""
        dirty = self._dirty(path)
        return (dirty.entry() if dirty is not None
                else await self.catalog.stat(path, complete=False))

    async def _refuse_existing(self, path: str) -> None:
        """AlreadyExists when ``path`` names anything (here or on the server)."""
        try:
            await self._entry_of(path)
        except NotFound:
            return
        raise AlreadyExists(path)

    async def _open_for_writing(self, node: Inode, flags: int) -> pyfuse3.FileInfo:
        writes = self._writeback()
        if _removed(node):
            raise NotFound(f"{node.path}: removed")
        entry = await self._revalidate(node)
        if entry.is_dir:
            raise IsADirectory(node.path)
        self._give_way(node, writes.files.get(node.path) if writes.asynchronous else None)
        dirty = writes.open(node.path, entry)
        try:
            if flags & os.O_TRUNC:
                await dirty.truncate(0)
        except BaseException:
            await writes.release(dirty)
            raise
        node.cached_version = INVALID  # the kernel's pages must not outlive this writer
        return await self._dirty_handle(node, dirty, writer=True)

    async def _dirty_handle(self, node: Inode, dirty: DirtyFile, writer: bool,
                            no_flush: bool = False) -> pyfuse3.FileInfo:
        """A handle on a file with pending content (its pages are never kept); ``no_flush``:
        its close sends no FLUSH. With passthrough, the kernel reads and writes its staging
        file itself when no open of the inode uses the page cache: a writer's file is
        fetched whole first (as its first write through the daemon would), a reader's only
        if it is local already."""
        flags = {"noflush": True} if no_flush else {}
        fh = self._new_fh()
        handle = self._files[fh] = _FileHandle(node, dirty.entry(), None, None, None,
                                               dirty=dirty, writer=writer, catalog=self.catalog)
        backing_id = 0
        writes = dirty.wb
        if self._passing and writes.asynchronous and not node.cached_opens and (
                dirty.materialized or writer):
            fd = await dirty.hand_to_kernel(writer)
            backing_id = self._backing.take(dirty, fd) or 0
            if not backing_id and writer:
                dirty.kernel_writer_gone()
        if backing_id:
            handle.passthrough, handle.backing_key = True, dirty
            node.passthrough_opens += 1
            node.backing_key = dirty
            self.stats.events["opened_passthrough"] += 1
            return pyfuse3.FileInfo(fh=fh, keep_cache=False, backing_id=backing_id, **flags)
        handle.cached = True
        node.cached_opens += 1
        return pyfuse3.FileInfo(fh=fh, keep_cache=False, **flags)

    def _give_way(self, node: Inode, key: Hashable) -> None:
        """Before an open of ``node`` that would not pass through to ``key``'s backing
        file: the kernel lets an inode open through a backing file be opened only through
        that same file (any other open fails with EIO). While such opens last, the name gets
        a new inode: this open fails with ESTALE, which has the kernel look the name up
        again and open what it finds, as after the file was replaced by a rename. The
        handles open meanwhile go on reading the file they opened."""
        if not node.passthrough_opens or node.backing_key == key:
            return
        parent = self.inodes.get(node.parent)
        if parent is not None:
            self.inodes.detach(parent, node.name)
        self.stats.events["passthrough_gave_way"] += 1
        raise pyfuse3.FUSEError(errno.ESTALE)

    async def _whole_handle(self, node: Inode, entry: Entry, version: str
                            ) -> pyfuse3.FileInfo | None:
        """A handle the kernel reads itself, from the disk layer's whole file of this
        content (checked, and verified against the catalog's checksums), or None. Not while
        an open of the inode uses the page cache (the kernel refuses to mix them)."""
        if node.cached_opens:
            return None
        key = ("whole", node.path, version)
        backing_id = self._backing.share(key)
        if backing_id is None:
            checksums = dict(entry.checksums) if self.verification.enabled else {}
            fd = await self.catalog.data_path.backing_file(node.path, entry, checksums)
            if fd is None:
                return None
            try:
                backing_id = self._backing.take(key, fd)
            finally:
                os.close(fd)  # the kernel holds the file from here
            if backing_id is None or node.cached_opens:
                if backing_id is not None:
                    self._backing.give_back(key)
                return None
        fh = self._new_fh()
        self._files[fh] = _FileHandle(node, entry, None, None, None, catalog=self.catalog,
                                      passthrough=True, backing_key=key)
        node.passthrough_opens += 1
        node.backing_key = key
        # The whole file was verified against the checksums the catalog gives now.
        node.verified_version = version
        self.stats.events["opened_passthrough"] += 1
        return pyfuse3.FileInfo(fh=fh, keep_cache=False, backing_id=backing_id)

    @property
    def _reads_pass(self) -> bool:
        """Whether reads of files in the disk layer may pass through to its whole files
        (one identity: a per-user mount reads each user's files through the daemon)."""
        return (self.identities is None and self.catalog.data_path.disk is not None
                and self._passing)

    @property
    def _passing(self) -> bool:
        """Whether opens may pass through to backing files (asked for, and the kernel
        agreed at FUSE_INIT)."""
        if self._passthrough is None:
            answer = passthrough.answer()
            if answer is not None:
                self._passthrough = answer
                if not answer:
                    log.warning("the kernel did not agree to passthrough: files open "
                                "through the daemon")
        return bool(self._passthrough)

    async def _read_dirty(self, handle: _FileHandle, off: int, size: int) -> bytes:
        dirty = handle.dirty
        assert dirty is not None
        data = dirty.read(off, size) if dirty.is_open else None
        if data is None:  # not modified yet: the committed content
            base = dirty.base
            if base is None:
                return b""
            if handle.backend_handle is None or handle.entry is not base:
                if handle.backend_handle is not None:
                    await self.catalog.close(handle.backend_handle)
                handle.backend_handle = await self.catalog.open(dirty.path, base)
                handle.entry = base
            data = await self.catalog.data_path.read(dirty.path, base, handle.backend_handle,
                                                     off, size)
        self.stats.fuse_op("read").bytes += len(data)
        return data

    @fuse_op
    async def create(self, parent_inode: int, name: bytes, mode: int, flags: int,
                     ctx: Any) -> tuple[pyfuse3.FileInfo, Any]:
        parent, text, path = self._child(parent_inode, name)
        writes = self._writeback()
        if not stat.S_ISREG(mode):
            raise NotSupported("only regular files can be created here")
        self.catalog.check_new(path, Kind.FILE, parent.entry)
        try:
            existing: Entry | None = await self._entry_of(path)
        except NotFound:
            existing = None
        if existing is not None:
            if flags & os.O_EXCL:
                raise AlreadyExists(path)
            if existing.is_dir:
                raise IsADirectory(path)
        elif writes.asynchronous:
            # A full queue refuses the new file here: its close may send no FLUSH to refuse.
            await writes.queue.room()
        dirty = writes.open(path, existing)
        try:
            if existing is None:
                dirty.attributes = Attributes(mode=stat.S_IMODE(mode))
                self.catalog.note_entry(path, dirty.entry())
            elif flags & os.O_TRUNC:
                await dirty.truncate(0)
        except BaseException:
            await writes.release(dirty)  # no handle holds it: this writer is gone
            raise
        node = self.inodes.lookup(parent, text, dirty.entry(), time.monotonic())
        node.cached_version = INVALID
        self._names_changed(parent)
        # A new file's close needs no FLUSH with async write-back: its record was journaled
        # here and each write lands in its slot, so a crash loses nothing at any point; the
        # RELEASE after the last close queues its upload, as a FLUSH would have. There is
        # no earlier failed upload of it to report at its close. (A round trip per file
        # less: `cp -r`, untar. `--durable close` needs the FLUSH: it syncs before close
        # returns.)
        no_flush = (NO_FLUSH and writes.asynchronous and self.config.durable != "close"
                    and dirty.writers == 1 and dirty.base is None and dirty.op is None
                    and not dirty.unreported)
        return (await self._dirty_handle(node, dirty, writer=True, no_flush=no_flush),
                self._attrs(node))

    @fuse_op
    async def write(self, fh: int, off: int, buf: bytes) -> int:
        handle = self._files[fh]
        if handle.dirty is None or not handle.writer:
            raise pyfuse3.FUSEError(errno.EBADF)
        written = await handle.dirty.write(off, buf)
        self.stats.fuse_op("write").bytes += written
        return written

    @fuse_op
    async def flush(self, fh: int) -> None:
        handle = self._files.get(fh)
        if handle is not None and handle.writer and handle.dirty is not None:
            # Also a new, still empty file: `touch f` returns once it is stored. (`echo x > f`
            # closes a dup of the new file before writing: the empty object goes first, then
            # the written one, as with any file closed twice.)
            await self._writeback().close(handle.dirty)

    @fuse_op
    async def fsync(self, fh: int, datasync: bool) -> None:
        handle = self._files.get(fh)
        if handle is not None and handle.dirty is not None:
            writes = self._writeback()
            if writes.asynchronous:
                await writes.stage(handle.dirty)
                await writes.settle(handle.dirty.path)
            else:
                await handle.dirty.commit()
        if handle is not None and self.writes is not None and not datasync:
            # A time or mode held back for a rename to carry (synchronous write-back).
            await self.writes.settle_attributes(handle.inode.path)

    @fuse_op
    async def fsyncdir(self, fh: int, datasync: bool) -> None:
        """Everything queued below the directory is on the server (async write-back), also
        the files closed before without a FLUSH (see :meth:`create`)."""
        handle = self._dirs.get(fh)
        if handle is not None:
            await self.closes_arrived()
            await self._settled(handle.inode.path)

    def watch_channel(self) -> None:
        """Find this mount's ``/dev/fuse`` descriptor (after ``pyfuse3.init``; pyfuse3 does not
        expose it), so that :meth:`_quiet_for` sees requests the kernel holds unread."""
        for name in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/self/fd/{name}") == "/dev/fuse":
                    self._channel = select.poll()
                    self._channel.register(int(name), select.POLLIN)
                    return

    async def closes_arrived(self) -> None:
        """Returns once the daemon has heard of every close made before: the RELEASE of a
        file closed without a FLUSH (:meth:`create`) is how it learns of the close, and the
        kernel sends it after ``close`` returned, possibly after requests made later (it
        holds background requests such as RELEASE back while ``max_background`` of them
        are unanswered). So: the kernel holds no request unread, and no RELEASE read before
        is still being answered; while requests keep arriving, for at most
        :data:`CLOSES_LOOKS` looks."""
        if not NO_FLUSH:
            return
        for _look in range(CLOSES_LOOKS):
            if self._requests_unread():
                await trio.sleep(CLOSES_POLL)
                continue
            read = set(self._releasing)
            while read & self._releasing:
                await trio.sleep(CLOSES_POLL)
            if not self._requests_unread():
                return

    def _requests_unread(self) -> bool:
        """Whether the kernel holds a request this daemon has not read yet."""
        return self._channel is not None and bool(self._channel.poll(0))

    def _quiet_for(self) -> float:
        """Seconds since the last FUSE request ended; 0 while one is being answered or the
        kernel holds one unread (the daemon busy elsewhere must not look quiet)."""
        if self.requests_running or self._requests_unread():
            return 0.0
        return time.monotonic() - self.last_request_end

    def _uploaded(self, writes: WriteBack, path: str, entry: Entry) -> None:
        """A queued upload of ``path`` is on the server as ``entry`` and nothing is pending
        any more: the inode reads it from there (its local version is gone)."""
        node = self.inodes.find(path)
        if node is not None and writes.files.get(path) is None:
            self._changed(node, entry)

    def _dropped(self, path: str) -> None:
        """A queued change of ``path`` was given up: the catalog asks the server again, and
        so must the kernel, which may have been told to keep the name for longer."""
        node = self.inodes.find(path)
        if node is None or self.nursery is None or not self.config.kernel:
            return
        start_guarded(self.nursery, self.stats.events, f"forgetting {path}",
                      trio.to_thread.run_sync, _forget_in_kernel, node.parent, node.name,
                      node.ino)

    async def _settled(self, *paths: str) -> None:
        """Before a change that goes to the server at once: what is queued on ``paths`` (or
        above or below them) goes first (async write-back; with sync write-back only
        attribute changes held back are queued)."""
        writes = self.writes
        if writes is not None and (writes.asynchronous or writes.queue.ops):
            await writes.settle(*paths)

    @fuse_op
    async def setattr(self, inode: int, attr: Any, fields: Any, fh: int | None,
                      ctx: Any) -> Any:
        node = self._inode(inode)
        entry = await self._revalidate(node)
        if fields.update_size:
            await self._truncate(node, entry, attr.st_size)
        change = Attributes(
            mtime_ns=attr.st_mtime_ns if fields.update_mtime else None,
            mode=stat.S_IMODE(attr.st_mode) if fields.update_mode else None,
            uid=attr.st_uid if fields.update_uid else None,
            gid=attr.st_gid if fields.update_gid else None)
        # (atime is not kept: it shows the mtime, and setting it alone changes nothing)
        if change:
            await self._set_attributes(node, change)
        await self._revalidate(node)
        return self._attrs(node)

    async def _set_attributes(self, node: Inode, change: Attributes) -> None:
        """Store ``change`` (pending content: with its upload; else on the server, or kept
        for the mount's life where the backend cannot store it)."""
        self._writeback()
        dirty = self._dirty_of(node)
        if dirty is not None:
            async with dirty.lock:  # not while its upload is on its way
                if dirty.dirty and not dirty.unlinked:
                    dirty.set_attributes(change)
                    return
        if _removed(node):
            raise NotFound(f"{node.path}: removed")
        writes = self.writes
        if writes is not None:
            # Stored after what is queued on the path, above it and below it (a catalog may
            # change a directory's time as names change in it; `rsync -a` sets it last).
            # With sync write-back it is held back for a moment: `rsync`, `cp -a` and `tar`
            # set a file's time and mode just before they rename it or set them again, and
            # the rename or the later change carries it (one request instead of three).
            await writes.queue.room()
            writes.queue_attributes(node.path, change,
                                    hold=0.0 if writes.asynchronous else ATTRIBUTES_HELD)
            if dirty is not None and not dirty.dirty and dirty.base is not None:
                dirty.base = change.applied_to(dirty.base)  # open, unchanged: shown so
            node.entry, node.attrs = change.applied_to(node.entry), None
            return
        entry = await self._revalidate(node)
        new = await self.catalog.set_attributes(node.path, entry, change)
        if dirty is not None and not dirty.dirty:  # open, unchanged: it is the stored file
            dirty.base = new
        self._changed(node, new)

    async def _truncate(self, node: Inode, entry: Entry, size: int) -> None:
        if entry.is_dir:
            raise IsADirectory(node.path)
        writes = self._writeback()
        dirty = self._dirty_of(node)
        if dirty is not None:
            await dirty.truncate(size)
            return
        if _removed(node):
            raise NotFound(f"{node.path}: removed")
        if entry.size == size:
            return
        if self.catalog.can(Capability.TRUNCATE):
            await self._settled(node.path)
            self._changed(node, await self.catalog.truncate(node.path, size))
            return
        dirty = writes.open(node.path, entry)
        try:
            await dirty.truncate(size)
        finally:
            await writes.release(dirty, raise_errors=True)
        if dirty.base is not None:
            self._changed(node, dirty.base)

    def _names_changed(self, directory: Inode) -> None:
        """Names in ``directory`` changed through the mount: its time is now, as on a local
        disk (``rsync -a`` sets a directory's time last only when it sees it changed; a
        catalog may have moved it too)."""
        now = time.time_ns()
        directory.entry, directory.attrs = directory.entry.at_time(now), None
        self.catalog.directory_changed(directory.path, now)

    def _changed(self, node: Inode, entry: Entry) -> None:
        """``node`` now is ``entry`` after a change made through the mount (the catalog's
        caches know already)."""
        node.entry, node.attrs, node.fetched_at = entry, None, time.monotonic()
        node.cached_version = INVALID

    @fuse_op
    async def mkdir(self, parent_inode: int, name: bytes, mode: int, ctx: Any) -> Any:
        parent, text, path = self._child(parent_inode, name)
        self._need(Capability.MKDIR, "create directories")
        self.catalog.check_new(path, Kind.DIR, parent.entry)
        writes = self._writeback()
        if writes.asynchronous:
            await self._refuse_existing(path)
            entry = Entry(name=text, kind=Kind.DIR, mtime_ns=time.time_ns(),
                          mode=stat.S_IMODE(mode))
            await writes.queue.room()
            writes.queue_mkdir(path, entry)
        else:
            await writes.removals_first(path)
            entry = await self.catalog.mkdir(path, Attributes(mode=stat.S_IMODE(mode)))
        self._names_changed(parent)
        return self._attrs(self.inodes.lookup(parent, text, entry, time.monotonic()))

    @fuse_op
    async def symlink(self, parent_inode: int, name: bytes, target: bytes, ctx: Any) -> Any:
        parent, text, path = self._child(parent_inode, name)
        self._need(Capability.SYMLINK, "make symbolic links")
        self.catalog.check_new(path, Kind.SYMLINK, parent.entry)
        await self._refuse_existing(path)
        writes = self.writes
        if writes is not None and writes.asynchronous:
            await writes.settle_up_to(path)  # a queued removal of the name, its parents' mkdir
        elif writes is not None:
            await writes.removals_first(path)
        entry = await self.catalog.symlink(path, os.fsdecode(target))
        self._names_changed(parent)
        return self._attrs(self.inodes.lookup(parent, text, entry, time.monotonic()))

    @fuse_op
    async def readlink(self, inode: int, ctx: Any) -> bytes:
        node = self._inode(inode)
        entry = await self._revalidate(node)
        if not entry.is_symlink:
            raise InvalidInput(f"{node.path}: not a symbolic link")
        return os.fsencode(await self.catalog.readlink(node.path, entry))

    @fuse_op
    async def link(self, inode: int, new_parent_inode: int, new_name: bytes, ctx: Any) -> Any:
        raise NotPermitted("hard links cannot be made here")

    @fuse_op
    async def unlink(self, parent_inode: int, name: bytes, ctx: Any) -> None:
        parent, text, path = self._child(parent_inode, name)
        self._need(Capability.UNLINK, "remove files")
        entry = await self._entry_of(path)
        if entry.is_dir:
            raise IsADirectory(path)
        writes = self._writeback()
        if writes.asynchronous:
            await writes.queue.room()
        dirty = await writes.unlinked(path)
        on_server = dirty is None or dirty.base is not None
        if writes.asynchronous and on_server:
            writes.queue_removal("unlink", path)
        elif not (dirty is None and await writes.remove_ahead(path)):
            async with writes.carrying(path):  # a held change of it is moot
                await self.catalog.unlink(path, on_server=on_server)
            writes.removal_succeeded |= on_server
        self.inodes.detach(parent, text)
        self._names_changed(parent)

    @fuse_op
    async def rmdir(self, parent_inode: int, name: bytes, ctx: Any) -> None:
        parent, text, path = self._child(parent_inode, name)
        self._need(Capability.UNLINK, "remove directories")
        entry = await self._entry_of(path)
        if not entry.is_dir:
            raise NotADirectory(path)
        writes = self._writeback()
        if writes.has_below(path):
            raise NotEmpty(path)
        queued = writes.asynchronous or writes.runs_removals_ahead()
        if queued:
            empty = writes.never_sent(path)
            if empty is None:
                listing = await self.catalog.list(path)
                while not listing.done:
                    await listing.wait_beyond(len(listing.entries))
                if listing.error is not None:
                    raise listing.error
                empty = not len(listing) and not self.catalog.holds_unlisted(path)
            if not empty:
                raise NotEmpty(path)
            await writes.queue.room()
            writes.queue_removal("rmdir", path)
            if not writes.asynchronous:  # on the server with what was removed in it
                await writes.settle(path)
        else:
            async with writes.carrying(path):
                await self.catalog.rmdir(path)
        self.inodes.detach(parent, text)
        self._names_changed(parent)

    @fuse_op
    async def rename(self, parent_inode_old: int, name_old: bytes, parent_inode_new: int,
                     name_new: bytes, flags: int, ctx: Any) -> None:
        self._need(Capability.RENAME, "rename")
        if flags & pyfuse3.RENAME_EXCHANGE:
            raise NotSupported("rename with RENAME_EXCHANGE is not supported")
        old_parent, new_parent = self._inode(parent_inode_old), self._inode(parent_inode_new)
        old_name, new_name = os.fsdecode(name_old), os.fsdecode(name_new)
        old, new = child_path(old_parent.path, old_name), child_path(new_parent.path, new_name)
        if old == new:
            return
        if new.startswith(old + "/"):
            raise pyfuse3.FUSEError(errno.EINVAL)
        entry = await self._entry_of(old)
        self.catalog.check_new(new, entry.kind, new_parent.entry)
        try:
            target: Entry | None = await self._entry_of(new)
        except NotFound:
            target = None
        if target is not None:
            if flags & pyfuse3.RENAME_NOREPLACE:
                raise AlreadyExists(new)
            if entry.is_dir and not target.is_dir:
                raise NotADirectory(new)
            if not entry.is_dir and target.is_dir:
                raise IsADirectory(new)
        writes = self._writeback()
        dirty = self._dirty(old)
        local_only = False
        if dirty is not None:
            async with dirty.lock:  # not while its upload is on its way
                local_only = dirty.base is None
                if local_only:
                    # Never uploaded: the move is the mount's own business until the upload.
                    await writes.renamed(old, new)
                    new_entry = dirty.entry()
                    self.catalog.moved(old, new)
                    self.catalog.note_entry(old, None)
                    self.catalog.note_entry(new, new_entry)
        if not local_only:
            # A time or mode set on the file and not stored yet goes with its rename; one of
            # the file it replaces goes nowhere.
            writes.losing(old)  # (its directory keeps a marker if it has none)
            async with writes.carrying(old, *([new] if target is not None else [])) as held:
                if writes.asynchronous or entry.is_dir:
                    await self._settled(old, new)
                else:
                    await writes.removals_first(new)
                if dirty is not None:
                    entry = await writes.commit_now(dirty) or dirty.base or entry
                new_entry = await self.catalog.rename(old, new, entry, held)
            await writes.renamed(old, new)
        self.inodes.move(old_parent, old_name, new_parent, new_name)
        self._names_changed(old_parent)
        self._names_changed(new_parent)
        node = new_parent.children.get(new_name)
        if node is not None and self._dirty(new) is None:
            node.entry, node.attrs, node.fetched_at = new_entry, None, time.monotonic()

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

    @fuse_op
    async def setxattr(self, inode: int, name: bytes, value: bytes, ctx: Any) -> None:
        await self._change_xattr(inode, name, bytes(value))

    @fuse_op
    async def removexattr(self, inode: int, name: bytes, ctx: Any) -> None:
        await self._change_xattr(inode, name, None)

    async def _change_xattr(self, inode: int, name: bytes, value: bytes | None) -> None:
        if not self.xattrs:
            raise NotSupported("extended attributes are off (mount with --xattrs)")
        self._need(Capability.SETXATTR, "store extended attributes")
        key = os.fsdecode(name)
        if not key.startswith("user."):
            raise NotSupported(f"only user.* extended attributes can be set, not {key}")
        node = self._inode(inode)
        if _removed(node):
            raise NotFound(f"{node.path}: removed")
        dirty = self._dirty(node.path)
        await self._settled(node.path)
        entry = (await self._writeback().commit_now(dirty) or dirty.base
                 if dirty is not None else None)
        entry = entry or await self._revalidate(node)
        new = await self.catalog.set_xattr(node.path, entry, key[5:], value)
        if dirty is not None:
            dirty.base = new
        self._changed(node, new)

    async def discard_pending(self, path: str) -> bool:
        """Throw away the pending content of ``path`` (see ``rucio-fs uploads --discard``);
        the kernel forgets what it was shown, so the file is again what the catalog holds."""
        dirty = await self._writeback().discard(path)
        if dirty is None:
            return False
        node = self.inodes.find(path)
        if node is None:
            return True
        if dirty.base is None:  # never uploaded: the name goes away
            parent = self.inodes.get(node.parent)
            if parent is not None:
                self.inodes.detach(parent, node.name)
                # From a worker thread: the kernel may need this loop while invalidating.
                await trio.to_thread.run_sync(_invalidate_entry, parent.ino, node.name)
        else:
            node.entry, node.attrs, node.fetched_at = dirty.base, None, 0.0
            node.cached_version = INVALID
            await trio.to_thread.run_sync(_invalidate_inode, node.ino)
        return True

    # -- cache control ---------------------------------------------------------------------

    def catalogs(self) -> list[Catalog]:
        """Every catalog of the mount (a per-user mount: one per user and credential)."""
        return [self._catalog] if self.identities is None else self.identities.catalogs()

    def drop_caches(self, layers: Sequence[str]) -> None:
        """Drop user-space layers now; the kernel layer needs :meth:`drop_kernel_cache`."""
        for catalog in self.catalogs():
            catalog.drop(layers)
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
            node.cached_version = node.verified_version = None

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
