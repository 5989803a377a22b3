"""The one door to the backend: the namespace caches and every backend call of a mount.

Every backend call goes through :class:`Catalog` — reads, listings, namespace changes,
uploads and their confirmation, ``statfs``, xattrs — bounded, counted and timed by
:mod:`rucio_fs.cache.accounting`, and followed by the same cache bookkeeping for all backends
(``tests/test_layering.py`` checks that no other core module reaches the backend). The
metadata, listing and xattr layers live here; file data lives in :attr:`Catalog.data_path`
(:mod:`rucio_fs.data.datapath`), whose backend reads come through :meth:`Catalog._read_exact`.
Files whose content this mount holds and the backend may not (written, not yet uploaded) are
overlaid on what the backend says: their owner, the write-back, is the catalog's
:class:`Overlay`. Paths are catalog paths (see :mod:`rucio_fs.backend`).

Why one module of this size: it is the one door to the backend, and the door is the point:
every backend call and its cache bookkeeping are in one class, so no call can go around it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import trio

from rucio_fs.backend import (
    NO_ATTRIBUTES,
    Attributes,
    Backend,
    Capability,
    Entry,
    FsUsage,
    Kind,
    Upload,
    content_version,
)
from rucio_fs.background import start_guarded
from rucio_fs.cache.accounting import BackendCalls
from rucio_fs.cache.caches import CacheLayer, EqualEntries, Listing, TimedLayer, ttl_cache
from rucio_fs.cache.disk_cache import DiskCache
from rucio_fs.config import MountConfig
from rucio_fs.data.datapath import DataPath
from rucio_fs.errors import (
    IntegrityError,
    InvalidInput,
    NotADirectory,
    NotFound,
    NotSupported,
    RucioFsError,
    Unavailable,
)
from rucio_fs.observe.stats import Stats
from rucio_fs.redis_client import Redis, RedisAddress

from .shared import SharedTier, Sink

log = logging.getLogger(__name__)


#: The most entries a directory may have for a lookup to list it (see :meth:`Catalog.stat`).
LOOKUP_LISTING_MAX = 5000

#: Seconds listed names are answered from their listing alone after the server could not be
#: asked for one's stored attributes (see :meth:`Catalog.stat`).
UNREACHABLE_SECONDS = 10.0

#: Cached in the metadata layer for a path that does not exist (a negative entry).
_MISSING = Entry(name="", kind=Kind.FILE)
#: In :attr:`Catalog._looked_up_in`: the directory was listed for a walk.
_WALKED = object()
#: Listed names completed ahead of a walk's lookups (see ``Catalog._complete_ahead``).
COMPLETE_AHEAD = 8


class Overlay(Protocol):
    """What this mount changed and the server does not show yet (files with pending content,
    queued namespace changes): it wins over what the backend or the caches say, in ``stat``
    and in every listing."""

    def entry(self, path: str) -> Entry | None:
        """The local entry of ``path``, if it has one."""

    def hides(self, path: str) -> bool:
        """Whether ``path`` is removed locally (whatever the server still shows)."""

    def children(self, directory: str) -> Iterable[Entry]:
        """The local entries directly in ``directory``."""

    def hidden_children(self, directory: str) -> Iterable[str]:
        """The names directly in ``directory`` that are removed locally."""

    def holds_all_of(self, directory: str) -> bool:
        """Whether everything in ``directory`` is local: it was made here and its creation
        never sent, so the server holds nothing in it and no other client can name it."""

    def queued_attributes(self, path: str) -> Attributes:
        """The attributes of ``path`` that a change queued and not yet being stored sets."""


class _NoOverlay:
    def entry(self, path: str) -> Entry | None:
        return None

    def hides(self, path: str) -> bool:
        return False

    def children(self, directory: str) -> Iterable[Entry]:
        return ()

    def hidden_children(self, directory: str) -> Iterable[str]:
        return ()

    def holds_all_of(self, directory: str) -> bool:
        return False

    def queued_attributes(self, path: str) -> Attributes:
        return NO_ATTRIBUTES


@dataclass(eq=False, slots=True)
class _Fill:
    """A listing being fetched from the backend, and what this mount did meanwhile in its
    directory: those changes win over the backend's entries, whenever it listed them."""

    #: The listing readers already hold, patched in place as changes come (None: none is
    #: handed out before it completes, or the shared tier publishes what the backend sent).
    listing: Listing | None
    #: name -> its entry now (None: gone), for each name changed here meanwhile.
    changes: dict[str, Entry | None] = field(default_factory=dict)
    #: Whether the directory's listing was forgotten meanwhile: this one is not cached.
    forgotten: bool = False


def _apply(listing: Listing, name: str, entry: Entry | None) -> None:
    """``name`` in ``listing`` now is ``entry`` (None: gone)."""
    if entry is None:
        listing.remove(name)
    else:
        listing.upsert(entry)


def child_path(parent: str, name: str) -> str:
    return "/" + name if parent == "/" else f"{parent}/{name}"


def split_path(path: str) -> tuple[str, str]:
    parent, _, name = path.rpartition("/")
    return parent or "/", name


@dataclass(frozen=True, slots=True)
class Prepared:
    """What :func:`prepare_backend` set up for the catalog of a backend."""

    #: The shared tier (``--shared-cache``), else None.
    shared: SharedTier | None


def prepare_backend(backend: Backend, config: MountConfig, stats: Stats) -> Prepared:
    """Before the backend's ``start``: hand it what the mount's configuration gives it — the
    shared tier's values, a state directory in ``--cache-dir``, the data proxy, whether it may
    keep caches — so that what it does at start may use them."""
    shared = None
    if config.shared:
        identity = backend.shared_identity()
        if identity is None:
            raise InvalidInput(f"{backend.scheme}://: this backend names no identity to "
                               "share listings under (no --shared-cache)")
        redis = Redis(RedisAddress.parse(config.shared_cache), config.shared_timeout)
        shared = SharedTier(redis, identity, stats)
        backend.use_shared_values(shared)
    if config.disk_dir:
        backend.keep_state_in(Path(config.disk_dir) / "state" / backend.scheme)
    if config.data_proxy:
        try:
            backend.use_data_proxy(config.data_proxy)
        except NotSupported as exc:
            raise InvalidInput(f"--data-proxy: {exc}") from None
    backend.use_caches(config.metadata)
    return Prepared(shared)


class Catalog:
    """Cached, coalesced, measured access to a backend's namespace and data."""

    def __init__(self, backend: Backend, config: MountConfig, stats: Stats,
                 disk: DiskCache | None = None, prepared: Prepared | None = None) -> None:
        self.backend = backend
        self.config = config
        self.stats = stats
        #: Per-user mounts: where this user's listed entries meet the other users' equal
        #: ones (see :class:`~rucio_fs.cache.caches.EqualEntries`); None elsewhere.
        self.equal_entries: EqualEntries | None = None

        def metadata_ttl(entry: Entry) -> float:
            if entry is _MISSING:
                return config.negative_ttl
            return config.immutable_ttl if entry.immutable else config.metadata_ttl

        self._metadata_ttl = metadata_ttl
        self.metadata: TimedLayer[Entry] = TimedLayer(
            "metadata", config.metadata, config.metadata_max_entries, metadata_ttl, stats)
        #: path -> (content version, extended attributes).
        self.xattr_cache: CacheLayer[tuple[str, dict[str, bytes]]] = CacheLayer(
            "xattrs", config.metadata,
            ttl_cache(config.metadata_max_entries // 10 or 1, lambda _x: config.metadata_ttl),
            stats)
        self.listing: TimedLayer[Listing] = TimedLayer(
            "listing", config.listing, config.listing_max_entries,
            lambda _l: config.listing_ttl, stats, getsizeof=lambda listing: len(listing) + 1)
        self.calls = BackendCalls(stats, config.backend_timeout, config.coalescing)
        #: Blocks of file data: the data and disk layers and the reads that fill them.
        self.data_path = DataPath(config, stats, self.calls, self._read_exact, disk)
        #: Files with local content (set by the write-back of a writable mount).
        self.overlay: Overlay = _NoOverlay()
        #: Whether names are created through this mount (set with the write-back): then a
        #: lookup miss makes the next uncached lookups list their directory (see :meth:`stat`).
        self.makes_names = False
        #: Listings being fetched, shared by everyone who opens the directory meanwhile.
        self._filling: dict[str, Listing] = {}
        #: Every listing being fetched, by directory (see :class:`_Fill`).
        self._fills: dict[str, list[_Fill]] = {}
        #: Until when (monotonic) names count as being made on this mount (a lookup lately
        #: found nothing on the server): meanwhile an uncached lookup lists its directory.
        self._making_names_until = 0.0
        #: Attributes set through the mount that the backend could not store, kept for the
        #: mount's life and shown over what the backend says: directory -> name -> them.
        self._kept: dict[str, dict[str, Attributes]] = {}
        #: Until when (monotonic) listed names are answered from their listing without asking
        #: for their stored attributes: a completion just failed (the server is unreachable).
        self._unreachable_until = 0.0
        #: Directories too big to list for a lookup, or whose listing failed: lookups there
        #: stat (remembered for the listing TTL).
        self._unlistable = ttl_cache(1024, lambda _x: config.listing_ttl)
        #: Directories where a lookup lately found no cached answer, and the name: the next
        #: such lookup of another name there lists the directory (a walk, `rsync`, `git
        #: status` stat name after name) instead of a stat apiece.
        self._looked_up_in = ttl_cache(4096, lambda _x: config.listing_ttl)
        #: Where listings are fetched and the shared tier is told of changes in the
        #: background; set by the daemon (None: in line).
        self.nursery: trio.Nursery | None = None
        #: Listings and stats shared with other mounts (``--shared-cache``), else None.
        self.shared: SharedTier | None = (prepared or prepare_backend(backend, config,
                                                                      stats)).shared

    async def stat(self, path: str, complete: bool = True) -> Entry:
        """Attributes of ``path``: metadata cache, then the parent's cached listing, then stat.
        ``complete`` False: its existence and kind are all the caller needs, which an
        incomplete listed entry (:attr:`Entry.complete`) shows as well.

        On a mount that creates names, an uncached lookup lists its directory instead of a
        stat where another name was looked up uncached within the listing TTL (`rsync` and
        `git status` stat name after name; resolving a path looks up one name per
        directory), and everywhere once a lookup lately found nothing (``cp -r``, untar,
        mdtest): each later name there is answered from that listing rather than with a
        stat apiece. (A read-only mount keeps a stat per name: `cat` of a few files of a big
        Rucio dataset must not wait for its listing.) A directory of more than
        :data:`LOOKUP_LISTING_MAX` entries is not listed for it (nor tried again while
        remembered). A listed name whose listing could not carry its stored attributes is
        completed by :meth:`Backend.complete`; during a walk, a directory completed so is
        listed at the same time (see :meth:`_list_ahead`). In a directory made here whose
        creation was never sent (async write-back), a name the overlay does not have does
        not exist: nothing is asked."""
        entry = self.overlay.entry(path)
        listed: Entry | None = None
        if entry is None:
            if self.overlay.hides(path):
                raise NotFound(path)
            entry = self.metadata.get(path)
        if entry is None and path != "/":
            parent, name = split_path(path)
            if self.overlay.holds_all_of(parent):
                raise NotFound(path)
            listing = self.listing.get(parent)
            if listing is None and self._walks(parent, name):
                listing = await self._small_listing(parent)
            if listing is not None:
                entry = listing.by_name.get(name)
                if entry is None and self.backend.lists_everything(parent):
                    entry = _MISSING
                elif (entry is not None and not entry.complete and complete
                      and time.monotonic() >= self._unreachable_until):
                    # A name looked up on its own (`stat`, `git status`, `rsync`) shows what
                    # is stored with it, which this listing could not carry.
                    listed, entry = entry, None
        if entry is None and self.shared is not None:
            found, shared = await self.shared.get_entry(path)
            if found:
                entry = shared or _MISSING
                self.metadata.put(path, entry)
        if entry is None:
            if listed is not None and listed.is_dir:
                self._list_ahead(path)
            if listed is not None and listing is not None:
                self._complete_ahead(parent, name, listing)
            try:
                entry = await self.calls.shared(
                    "stat", path, lambda: self.backend.stat(path) if listed is None
                    else self.backend.complete(path, listed))
            except Unavailable:
                if listed is None:
                    raise
                # The server cannot be asked now: the name is as its listing shows it, and so
                # are the other listed names for a while (`rm -r` during an outage must not
                # wait for every name's retries).
                self._unreachable_until = time.monotonic() + UNREACHABLE_SECONDS
                return self._with_kept(path, listed)
            except NotFound:
                self.metadata.put(path, _MISSING)
                if self.makes_names:
                    self._making_names_until = time.monotonic() + self.config.listing_ttl
                await self._share_entry(path, _MISSING)
                raise
            await self._learned(path, entry)
        if entry is _MISSING:
            raise NotFound(path)
        return self._with_kept(path, entry)

    def kept_until(self, path: str) -> float:
        """Until when (``time.monotonic()``) :meth:`stat` of ``path`` answers from what this
        catalog holds, asking nothing: while its content is pending here and for the metadata
        TTL after (its upload's answer is cached then), until its cached stat result expires,
        or while a cached listing holds it with its stored attributes. 0.0: the next
        :meth:`stat` may ask the server."""
        if self.overlay.entry(path) is not None:
            return time.monotonic() + self.config.metadata_ttl
        if self.metadata.peek(path) is _MISSING:
            return 0.0
        until = self.metadata.expires(path)
        if path != "/":
            parent, name = split_path(path)
            listed_until = self.listing.expires(parent)
            if listed_until > until:
                listing = self.listing.peek(parent)
                entry = listing.by_name.get(name) if listing is not None else None
                if entry is not None and entry.complete:
                    until = listed_until
        return until

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
                start_guarded(self.nursery, self.stats.events, f"listing {path}",
                              self._fill, path, listing)
        await listing.wait_beyond(0)
        if not listing.entries and listing.error is not None:
            raise listing.error
        return listing

    def _walks(self, parent: str, name: str) -> bool:
        """Whether an uncached lookup of ``name`` in ``parent`` lists it (see
        :meth:`stat`); counts this lookup."""
        if (not self.makes_names or self._unlistable.get(parent) or not self.listing.enabled
                or not self.backend.lists_everything(parent)):
            return False
        if self._making_names_until > time.monotonic():
            return True
        earlier = self._looked_up_in.get(parent)
        if earlier is not None and earlier != name:
            self._looked_up_in[parent] = _WALKED
            return True
        if parent != "/" and self._looked_up_in.get(split_path(parent)[0]) is _WALKED:
            # A walk goes on below a directory listed for it: its subdirectories are
            # listed at their first lookup, not at their second.
            self._looked_up_in[parent] = _WALKED
            return True
        self._looked_up_in[parent] = name
        return False

    def _list_ahead(self, directory: str) -> None:
        """Where a walk goes on (the parent of ``directory`` was listed for one), start
        listing ``directory`` for its own lookups while its attributes are asked: `rsync`
        and `find` look up its names next, and the two requests overlap."""
        if directory == "/":
            return
        parent = split_path(directory)[0]
        if (self.nursery is None or not self.config.coalescing
                or self._looked_up_in.get(parent) is not _WALKED
                or self._looked_up_in.get(directory) is _WALKED  # listed (or about to be)
                or self.listing.peek(directory) is not None
                or self._unlistable.get(directory)
                or not self.backend.lists_everything(directory)
                or self.calls.flight.in_flight(("walk listing", directory))):
            return
        self._looked_up_in[directory] = _WALKED
        start_guarded(self.nursery, self.stats.events, f"listing {directory} ahead",
                      self._small_listing, directory)

    def _complete_ahead(self, directory: str, name: str, listing: Listing) -> None:
        """Where a walk goes through ``directory`` (listed for its lookups), the next
        :data:`COMPLETE_AHEAD` names after ``name`` in ``listing`` whose stored attributes it
        could not carry are completed in the background while this one is: `rsync` and
        `git status` look names up one at a time, in order, and then find them done."""
        if (self.nursery is None or not self.config.coalescing
                or self._looked_up_in.get(directory) is not _WALKED):
            return
        at = listing.position(name)
        if at is None:
            return
        for listed in listing.entries[at + 1:at + 1 + COMPLETE_AHEAD]:
            if listed is None or listed.complete:
                continue
            path = child_path(directory, listed.name)
            if (self.metadata.peek(path) is not None
                    or self.calls.flight.in_flight(("stat", path))):
                continue
            start_guarded(self.nursery, self.stats.events, f"completing {path} ahead",
                          self._complete_in_background, path, listed)

    async def _complete_in_background(self, path: str, listed: Entry) -> None:
        """:meth:`stat` of a listed ``path`` ahead of its lookup (a directory: listed at the
        same time, as its lookup would); a failure is left for the lookup to meet."""
        if listed.is_dir:
            self._list_ahead(path)
        try:
            entry = await self.calls.shared("stat", path,
                                            lambda: self.backend.complete(path, listed))
        except RucioFsError:
            return
        parent, name = split_path(path)
        listing = self.listing.peek(parent)
        if (self.metadata.peek(path) is not None or self.overlay.entry(path) is not None
                or listing is None or listing.by_name.get(name) is not listed):
            return  # changed through the mount (or learned) meanwhile: that wins
        await self._learned(path, entry)

    async def _learned(self, path: str, entry: Entry) -> None:
        """A stat of ``path`` found ``entry``: cached, shared, and shown by its listing."""
        self.metadata.put(path, entry)
        await self._share_entry(path, entry)
        self._complete_listed(path, entry)

    async def _small_listing(self, path: str) -> Listing | None:
        """The complete listing of directory ``path`` if it has at most
        :data:`LOOKUP_LISTING_MAX` entries (then cached like any listing). Else (more, or the
        listing failed) None: the caller asks ``stat``, and ``path`` is not listed for
        lookups again while remembered. Callers meanwhile share one listing."""
        try:
            return await self.calls.flight.run(("walk listing", path),
                                               lambda: self._fetch_small_listing(path))
        except RucioFsError:  # the sharing caller was cancelled
            return None

    async def _fetch_small_listing(self, path: str) -> Listing | None:
        entries: list[Entry] = []

        async def fetch() -> bool:
            with self._unless_made_here(path):
                async with contextlib.aclosing(self.backend.list(path)) as listed:
                    async for entry in listed:
                        entries.append(entry)
                        if len(entries) > LOOKUP_LISTING_MAX:
                            return False
            return True

        with self._fetching(path, None) as fill:
            try:
                small = await self.calls.timed("list", fetch)
            except RucioFsError:
                small = False
            if not small:
                self._unlistable[path] = True
                return None
            listing = Listing(entries)
            self._finish_listing(path, listing, fill)
        return listing

    @contextlib.contextmanager
    def _unless_made_here(self, path: str) -> Iterator[None]:
        """A directory this mount made and the server does not hold yet (its ``mkdir`` is
        queued, or was tried and failed) lists as what the server holds below it: nothing,
        not NotFound."""
        try:
            yield
        except NotFound:
            made = self.overlay.entry(path)
            if made is None or not made.is_dir:
                raise

    @contextlib.contextmanager
    def _fetching(self, path: str, listing: Listing | None) -> Iterator[_Fill]:
        """While the listing of ``path`` is fetched: what this mount changes in ``path``
        meanwhile is collected for it (see :meth:`note_entry`)."""
        fill = _Fill(listing)
        fills = self._fills.setdefault(path, [])
        fills.append(fill)
        try:
            yield fill
        finally:
            fills.remove(fill)
            if not fills:
                del self._fills[path]

    async def _share_entry(self, path: str, entry: Entry) -> None:
        """Tell the shared tier what ``stat`` found, in the background."""
        if self.shared is not None:
            found = None if entry is _MISSING else entry
            await self._background(self.shared.put_entry, path, found, self._metadata_ttl(entry))

    async def _background(self, fn: Any, *args: Any) -> None:
        if self.nursery is not None:
            start_guarded(self.nursery, self.stats.events, getattr(fn, "__name__", "a task"),
                          fn, *args)
        else:
            await fn(*args)

    async def _fill(self, path: str, listing: Listing) -> None:
        """Fetch the listing of ``path`` into ``listing`` (through the shared tier, if any);
        cache it once complete."""
        with self._fetching(path, listing if self.shared is None else None) as fill:
            await self._fill_from(path, listing, fill)

    async def _fill_from(self, path: str, listing: Listing, fill: _Fill) -> None:
        async def from_backend(sink: Sink) -> None:
            async def fetch() -> None:
                equal = self.equal_entries
                kept = self._kept.get(path)
                with self._unless_made_here(path):
                    async for entry in self.backend.list(path):
                        if fill.listing is not None and entry.name in fill.changes:
                            continue  # changed here meanwhile: the listing has it already
                        if kept is not None and entry.name in kept:
                            entry = kept[entry.name].applied_to(entry)
                        sink(entry if equal is None else equal(path, entry))

            await self.calls.timed("list", fetch)

        try:
            if self.overlay.holds_all_of(path):
                pass  # made here, nothing of it on the server yet: the overlay is all of it
            elif self.shared is not None:
                await self.shared.fill(path, listing, from_backend, self.config.listing_ttl,
                                       self.calls.timeout, self.nursery)
            else:
                await from_backend(listing.add)
        except RucioFsError as exc:
            listing.finish(exc)
            return
        except Exception as exc:  # a bug here must cost this listing, not the mount
            log.error("listing %s failed unexpectedly: %r", path, exc, exc_info=True)
            listing.finish(Unavailable(f"listing {path} failed unexpectedly: {exc!r}"))
            return
        except BaseException:
            listing.finish(Unavailable(f"listing {path} was cancelled"))
            raise
        finally:
            if self._filling.get(path) is listing:
                del self._filling[path]
        self._finish_listing(path, listing, fill)

    def _finish_listing(self, path: str, listing: Listing, fill: _Fill) -> None:
        """What this mount changed laid over a listing the backend gave (what it changed
        while the listing was fetched, then the overlay); then cached, unless the listing of
        ``path`` was forgotten meanwhile."""
        for name, entry in fill.changes.items():
            _apply(listing, name, entry)
        for name in self.overlay.hidden_children(path):
            listing.remove(name)
        for entry in self.overlay.children(path):
            listing.upsert(entry)
        for name, kept in self._kept.get(path, {}).items():
            entry = listing.by_name.get(name)
            if entry is not None:
                listing.upsert(kept.applied_to(entry))
        if listing.rejected:
            self.stats.events["listing_names_rejected"] += listing.rejected
            log.warning("%s: %d entries with unusable or duplicate names left out",
                        path, listing.rejected)
        self.stats.events["listed_entries"] += len(listing)
        listing.finish()
        if not fill.forgotten:
            self.listing.put(path, listing)

    async def open(self, path: str, entry: Entry) -> Any:
        if entry.is_dir:
            raise NotADirectory(path)
        return await self.calls.timed("open", lambda: self.backend.open(path, entry))

    async def close(self, handle: Any) -> None:
        await self.calls.timed("close", lambda: self.backend.close(handle))

    def distrust(self, handle: Any) -> None:
        """What was read through ``handle`` failed verification (:meth:`Backend.distrust`)."""
        self.backend.distrust(handle)

    async def xattrs(self, path: str, entry: Entry) -> dict[str, bytes]:
        """The extended attributes of ``path`` as ``entry``: asked once per version and kept
        in the metadata layer (``getfattr -d`` asks for every name in turn)."""
        version = "" if entry.is_dir else content_version(entry)
        cached = self.xattr_cache.get(path)
        if cached is not None and cached[0] == version:
            return cached[1]
        attrs = dict(await self.calls.shared("xattrs", path,
                                             lambda: self.backend.xattrs(path, entry)))
        self.xattr_cache.put(path, (version, attrs))
        return attrs

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

    @property
    def write_back_parallelism(self) -> int:
        """How many queued changes to carry out at once unless the mount says
        (:attr:`Backend.write_back_parallelism`)."""
        return self.backend.write_back_parallelism

    @property
    def write_once(self) -> bool:
        """Whether a file's content is stored only once (:attr:`Backend.write_once`)."""
        return self.backend.write_once

    @property
    def implied_directories(self) -> bool:
        """Whether a key below a directory keeps it (:attr:`Backend.implied_directories`)."""
        return self.backend.implied_directories

    def holds_unlisted(self, path: str) -> bool:
        """Whether directory ``path`` holds what its listing cannot show
        (:meth:`Backend.holds_unlisted`): it is not empty, though it lists so."""
        return bool(self.backend.holds_unlisted(path))

    @property
    def stores_write_times(self) -> bool:
        """Whether uploads carry the time of the last write (:attr:`Backend.stores_write_times`)."""
        return self.backend.stores_write_times

    def check_new(self, path: str, kind: Kind, parent: Entry) -> None:
        """Raise what making ``kind`` at ``path`` in ``parent`` would meet on the server
        (:meth:`Backend.check_new`), before anything is staged or queued."""
        self.backend.check_new(path, kind, parent)

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

    def identity(self) -> str | None:
        """Who this mount is to the catalog (no secret), if the backend says."""
        return self.backend.shared_identity()

    @property
    def remove_batch_max(self) -> int:
        return self.backend.remove_batch_max

    @property
    def removals_run_ahead(self) -> bool:
        return self.backend.removals_run_ahead

    def backend_counters(self) -> dict[str, int]:
        return dict(self.backend.counters())

    async def usage(self) -> FsUsage:
        return await self.calls.timed("usage", self.backend.usage)

    # -- changes: each one backend call, timed and counted, then the caches learn it -----------

    async def mkdir(self, path: str, attributes: Attributes = NO_ATTRIBUTES) -> Entry:
        entry = await self.calls.timed("mkdir", lambda: self.backend.mkdir(path, attributes))
        self.stored_attributes(path, attributes, entry)
        self.new_directory(path, entry)
        return self._with_kept(path, entry)

    async def make_directory(self, path: str, attributes: Attributes = NO_ATTRIBUTES) -> None:
        """Make ``path`` on the server only (the caches know already: queued write-back);
        what the backend does not store of ``attributes`` is kept (:meth:`keep`)."""
        entry = await self.calls.timed("mkdir", lambda: self.backend.mkdir(path, attributes))
        self.stored_attributes(path, attributes, entry)

    async def remove_many(self, items: Sequence[tuple[str, Kind]]) -> dict[str, RucioFsError]:
        """Remove files and empty directories on the server only (the caches know already:
        queued write-back), in as few calls as the backend can; the failures by path."""
        return dict(await self.calls.timed("remove_many",
                                           lambda: self.backend.remove_many(items)))

    async def unlink(self, path: str, on_server: bool = True) -> None:
        """``path`` goes (``on_server`` False: it was only ever local to this mount)."""
        if on_server:
            await self.calls.timed("unlink", lambda: self.backend.unlink(path))
        self.note_entry(path, None)

    async def rmdir(self, path: str) -> None:
        """Remove directory ``path``. One that this mount lists empty (``rm -r`` removed
        what it listed there) and whose listing showed all it holds is removed as
        :meth:`Backend.remove_many` removes a directory seen empty: S3 deletes its marker
        without listing its keys first."""
        listing = self.listing.peek(path)
        if (listing is not None and not len(listing)
                and self.backend.holds_unlisted(path) is False):
            failures = await self.remove_many([(path, Kind.DIR)])
            if path in failures:
                raise failures[path]
        else:
            await self.calls.timed("rmdir", lambda: self.backend.rmdir(path))
        self.forget_listing(path)  # it was empty: nothing below to forget
        self.note_entry(path, None)

    async def rename(self, old: str, new: str, entry: Entry,
                     attributes: Attributes = NO_ATTRIBUTES) -> Entry:
        """Move ``old`` to ``new``; the moved path also stores the set ``attributes`` (a
        change held back for the move, see ``WriteBack.carrying``)."""
        moved = await self.calls.timed(
            "rename", lambda: self.backend.rename_with(old, new, entry, attributes))
        self.moved(old, new)
        self.note_entry(old, None)
        if entry.is_dir:
            self.forget_tree(old)
            self.forget_tree(new)
        if attributes:
            self.stored_attributes(new, attributes, moved)
        self.note_entry(new, moved)
        return self._with_kept(new, moved) if attributes else moved

    async def truncate(self, path: str, size: int) -> Entry:
        entry = await self.calls.timed("truncate", lambda: self.backend.truncate(path, size))
        self.note_entry(path, entry)
        return entry

    async def set_attributes(self, path: str, entry: Entry, attributes: Attributes) -> Entry:
        """Store ``attributes`` of ``path`` (currently ``entry``); those the backend cannot
        store are kept for the mount's life (:meth:`keep`). Returns the new entry."""
        new = await self.calls.timed(
            "set_attributes", lambda: self.backend.set_attributes(path, entry, attributes))
        self.stored_attributes(path, attributes, new)
        self.note_entry(path, new, content=False)
        return self._with_kept(path, new)

    def stored_attributes(self, path: str, wanted: Attributes, entry: Entry) -> None:
        """The backend was asked to store ``wanted`` and now shows ``entry``: what it stored
        is its own again, what it could not is kept here (:meth:`keep`). A change of the
        same attribute queued since (async write-back) is what the mount shows meanwhile: a
        queued ``mkdir``'s mode never hides a ``chmod`` made after it."""
        wanted = wanted.besides(self.overlay.queued_attributes(path))
        self.unkeep(path, wanted)
        self.keep(path, wanted.missing_from(entry))

    def keep(self, path: str, attributes: Attributes) -> None:
        """Show ``attributes`` of ``path`` over what the backend says for the mount's life
        (or until ``path`` is removed): attributes set here that the backend cannot store."""
        if not attributes:
            return
        parent, name = split_path(path)
        names = self._kept.setdefault(parent, {})
        names[name] = names.get(name, NO_ATTRIBUTES).then(attributes)
        self._change_cached(path, attributes.applied_to)

    def _change_cached(self, path: str, change: Callable[[Entry], Entry]) -> None:
        """The cached entries of ``path`` (its stat result, its entry in the parent's
        listing) become what ``change`` makes of them."""
        cached = self.metadata.peek(path)
        if cached is not None and cached is not _MISSING:
            self.metadata.put(path, change(cached))
        if path != "/":
            parent, name = split_path(path)
            listing = self.listing.peek(parent)
            if listing is not None and name in listing.by_name:
                listing.upsert(change(listing.by_name[name]))

    def unkeep(self, path: str, attributes: Attributes) -> None:
        """Keep none of the attributes ``attributes`` sets for ``path`` any more (those set
        to another value since are still kept)."""
        parent, name = split_path(path)
        kept = self._kept.get(parent, {}).get(name)
        if kept is None:
            return
        left = kept.unlike(attributes)
        if left:
            self._kept[parent][name] = left
        else:
            self._drop_kept(path)

    def _complete_listed(self, path: str, entry: Entry) -> None:
        """``stat`` found ``entry``: the parent's cached listing, where it shows the name
        without its stored attributes, shows them from now on."""
        parent, name = split_path(path)
        listing = self.listing.peek(parent)
        listed = listing.by_name.get(name) if listing is not None else None
        if listed is not None and not listed.complete:
            listing.upsert(self._with_kept(path, replace(entry, name=name)))

    def kept(self, path: str) -> Attributes:
        """The attributes kept for ``path`` by :meth:`keep` (none: ``NO_ATTRIBUTES``)."""
        parent, name = split_path(path)
        return self._kept.get(parent, {}).get(name, NO_ATTRIBUTES)

    def _with_kept(self, path: str, entry: Entry) -> Entry:
        if not self._kept:
            return entry
        return self.kept(path).applied_to(entry)

    def moved(self, old: str, new: str) -> None:
        """``old`` was renamed to ``new`` through this mount: the attributes kept for it
        (and, for a directory, below it) follow."""
        if not self._kept:
            return
        old_parent, old_name = split_path(old)
        moved = self._kept.get(old_parent, {}).pop(old_name, None)
        below = old + "/"
        for directory in [d for d in self._kept if d == old or d.startswith(below)]:
            self._kept[new + directory[len(old):]] = self._kept.pop(directory)
        self._drop_kept(new)
        if moved is not None:
            new_parent, new_name = split_path(new)
            self._kept.setdefault(new_parent, {})[new_name] = moved

    def _drop_kept(self, path: str) -> None:
        parent, name = split_path(path)
        names = self._kept.get(parent)
        if names is not None:
            names.pop(name, None)
            if not names:
                del self._kept[parent]

    async def symlink(self, path: str, target: str) -> Entry:
        entry = await self.calls.timed("symlink", lambda: self.backend.symlink(path, target))
        self.note_entry(path, entry)
        return entry

    async def readlink(self, path: str, entry: Entry) -> str:
        return await self.calls.timed("readlink", lambda: self.backend.readlink(path, entry))

    async def set_xattr(self, path: str, entry: Entry, name: str, value: bytes | None) -> Entry:
        new = await self.calls.timed(
            "setxattr", lambda: self.backend.set_xattr(path, entry, name, value))
        self.note_entry(path, new, content=False)
        return new

    # -- uploads ----------------------------------------------------------------------------

    async def put(self, path: str, data: bytes, attributes: Attributes = NO_ATTRIBUTES
                  ) -> Entry:
        return await self.calls.timed("put", lambda: self.backend.put(path, data, attributes))

    async def begin_upload(self, path: str, attributes: Attributes = NO_ATTRIBUTES) -> Upload:
        return await self.calls.timed("begin_upload",
                                      lambda: self.backend.begin_upload(path, attributes))

    async def write_part(self, upload: Upload, number: int, offset: int, data: bytes) -> None:
        await self.calls.timed("write_part", lambda: upload.write_part(number, offset, data))

    async def commit_upload(self, upload: Upload, size: int) -> Entry:
        return await self.calls.timed("commit_upload", lambda: upload.commit(size),
                                      extra_seconds=upload.commit_seconds())

    async def confirm(self, path: str, sent: Entry) -> Entry:
        """What the server holds at ``path`` after an upload that returned ``sent``
        (Unconfirmed unless it is that)."""
        return await self.calls.timed("confirm", lambda: self.backend.confirm(path, sent))

    # -- changes made through this mount --------------------------------------------------------

    def directory_changed(self, path: str, mtime_ns: int) -> None:
        """Names in directory ``path`` changed through this mount: its cached entries show
        time ``mtime_ns`` (what the server shows comes with the next fetch of them)."""
        self._change_cached(path, lambda entry: entry.at_time(mtime_ns))

    def note_entry(self, path: str, entry: Entry | None, content: bool = True) -> None:
        """``path`` now is ``entry`` (None: gone) after a change made through this mount: the
        metadata layer and the parent's listing, cached or being fetched, learn it without
        asking the backend (with the attributes kept for it); unless only attributes changed
        (``content`` False), nothing cached of the path's content before is served for it."""
        if content and (entry is None or not entry.is_dir):
            old = self.metadata.peek(path)
            self.data_path.changed(path, None if old is _MISSING else old)
        if entry is None:
            if self._kept:
                self._drop_kept(path)
        else:
            entry = self._with_kept(path, entry)
        parent, name = split_path(path)
        listing = self.listing.peek(parent)
        for fill in self._fills.get(parent, ()):
            fill.changes[name] = entry
            if fill.listing is not None and fill.listing is not listing:
                _apply(fill.listing, name, entry)
        self.xattr_cache.discard(path)
        self._unshare(path, parent)
        self.metadata.put(path, _MISSING if entry is None else entry)
        if listing is not None:
            _apply(listing, name, entry)

    def _unshare(self, *paths: str) -> None:
        """Other mounts must ask the backend, not the shared tier, for ``paths`` (stats and
        listings) after a change made here (told in the daemon's background)."""
        if self.shared is not None and self.nursery is not None:
            start_guarded(self.nursery, self.stats.events, "telling the shared tier",
                          functools.partial(self.shared.forget, *paths, listings=paths))

    def new_directory(self, path: str, entry: Entry) -> None:
        self.note_entry(path, entry)
        self.listing.put(path, Listing([]))

    def forget_listing(self, path: str) -> None:
        """Forget the listing of directory ``path``, cached or being fetched."""
        self.listing.discard(path)
        self._forget_fills(lambda directory: directory == path)

    def _forget_fills(self, forgets: Callable[[str], bool]) -> None:
        """Listings being fetched of the directories ``forgets`` selects are neither handed
        to new readers nor cached when they complete."""
        for directory in [d for d in self._filling if forgets(d)]:
            del self._filling[directory]
        for directory, fills in self._fills.items():
            if forgets(directory):
                for fill in fills:
                    fill.forgotten = True

    def forget_tree(self, path: str) -> None:
        """Forget cached metadata and listings of ``path`` and everything below it (listings
        being fetched there are not cached when they complete)."""
        below = path.rstrip("/") + "/"
        self._unshare(path)
        self._forget_fills(lambda directory: directory == path or directory.startswith(below))
        for layer in (self.metadata, self.listing):
            for key in layer.cached_keys():
                if key == path or key.startswith(below):
                    layer.discard(key)

    async def aclose(self) -> None:
        """Release the backend's and the shared tier's connections (at unmount)."""
        if self.shared is not None:
            await self.shared.aclose()
        await self.backend.aclose()

    def drop(self, layers: Iterable[str]) -> None:
        """Empty the named user-space layers (the kernel layer is the FUSE layer's job)."""
        layers = list(layers)
        for layer in layers:
            if layer in ("metadata", "listing"):
                getattr(self, layer).drop()
                self._unlistable.clear()
                self._looked_up_in.clear()
                self._making_names_until = 0.0
                if layer == "metadata":
                    self.xattr_cache.drop()
                    self.backend.drop_caches()
        self.data_path.drop(layers)
