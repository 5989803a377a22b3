"""The contract between the core and a catalog backend.

A backend is one class, registered under the entry-point group ``rucio_fs.backends`` with its URL
scheme as the entry-point name. It speaks in catalog paths (``"/"``, ``"/scope/dataset/file"``,
always absolute, ``/``-separated, no trailing slash) and never touches FUSE, caches or inodes:
the core caches, coalesces, measures and maps errors for every backend the same way.

Contract for implementers:

* ``list(path)`` yields the entries of a directory **with their attributes**; the core never
  calls ``stat`` per listed entry (an entry marked incomplete, whose stored attributes the
  listing could not carry, is asked for by ``stat`` when its name is looked up on its own).
  A listing that cannot be completed raises (typically
  :class:`~rucio_fs.errors.Unavailable`); it never ends early with a shorter result.
* ``read(handle, offset, size)`` returns exactly ``size`` bytes (the core never asks past the
  end of the file; fewer bytes is an error it reports, never a short file),
  as ``bytes`` or a read-only ``memoryview`` that nobody modifies afterwards (no copy needed).
* Errors are the typed ones from :mod:`rucio_fs.errors`.
* Optional operations are declared in ``capabilities``; the core never probes for them.

Writing (``Capability.WRITE``): the core stages a file's new content on local disk and hands it
over at ``flush``/``fsync``/``close``: a file of at most ``single_put_max`` bytes in one
:meth:`Backend.put`, a larger one as an :class:`Upload` of parts (streamed while a sequential
writer is still writing). The backend never sees a partial file as committed; an upload that
fails is aborted and reported, and the core keeps the staged data.

Every ``put`` and ``commit`` is followed by :meth:`Backend.confirm`, retried or not: the core
drops its staged copy only once the server has proved it holds the object with the size (and
the version, when ``put``/``commit`` predicted one) just sent. A backend predicts the version
from the bytes when it can (S3: the ETag from the parts' MD5s), so that ``confirm`` proves
the content, not only that an object is there.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Protocol

from rucio_fs.errors import NotFound, NotSupported, RucioFsError, Unconfirmed
from rucio_fs.identity import CallerCredentials


class Kind(enum.Enum):
    FILE = "file"
    DIR = "dir"
    #: A symbolic link: its ``size`` is the length of its target in bytes (read with
    #: :meth:`Backend.readlink`).
    SYMLINK = "symlink"


class Capability(enum.Flag):
    """Optional operations a backend implements. Declared, never probed."""

    NONE = 0
    WRITE = enum.auto()
    MKDIR = enum.auto()
    UNLINK = enum.auto()
    RENAME = enum.auto()
    SETXATTR = enum.auto()
    #: ``truncate`` in place; without it the core rewrites the file.
    TRUNCATE = enum.auto()
    #: Symbolic links: :meth:`Backend.symlink` and :meth:`Backend.readlink`.
    SYMLINK = enum.auto()


@dataclass(frozen=True, slots=True)
class Attributes:
    """POSIX attributes set through the mount (``chmod``, ``chown``, ``utimens``). ``None``
    leaves one as it is (on a new file: as the backend makes it). ``mode`` is the permission
    bits only (``0o7777``); ``mtime_ns`` nanoseconds since the epoch."""

    mtime_ns: int | None = None
    mode: int | None = None
    uid: int | None = None
    gid: int | None = None

    def __bool__(self) -> bool:
        return not (self.mtime_ns is None and self.mode is None and self.uid is None
                    and self.gid is None)

    def then(self, later: Attributes) -> Attributes:
        """These attributes with ``later``'s set ones laid over them."""
        return Attributes(
            self.mtime_ns if later.mtime_ns is None else later.mtime_ns,
            self.mode if later.mode is None else later.mode,
            self.uid if later.uid is None else later.uid,
            self.gid if later.gid is None else later.gid)

    def as_record(self) -> dict[str, int]:
        """The set attributes by name (how journal records carry them)."""
        return {name: value for name, value in (
            ("mtime_ns", self.mtime_ns), ("mode", self.mode), ("uid", self.uid),
            ("gid", self.gid)) if value is not None}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Attributes:
        """The attributes :meth:`as_record` wrote into ``record`` (other keys ignored)."""
        return cls(*(None if record.get(name) is None else int(record[name])
                     for name in ("mtime_ns", "mode", "uid", "gid")))

    def unlike(self, other: Attributes) -> Attributes:
        """Those of these attributes that ``other`` does not set to the same value."""
        return Attributes(*(None if mine == theirs else mine for mine, theirs in (
            (self.mtime_ns, other.mtime_ns), (self.mode, other.mode), (self.uid, other.uid),
            (self.gid, other.gid))))

    def besides(self, other: Attributes) -> Attributes:
        """Those of these attributes that ``other`` does not set at all."""
        return Attributes(*(mine if theirs is None else None for mine, theirs in (
            (self.mtime_ns, other.mtime_ns), (self.mode, other.mode), (self.uid, other.uid),
            (self.gid, other.gid))))

    def missing_from(self, entry: Entry) -> Attributes:
        """Those of these attributes that ``entry`` does not show (what a backend could not
        store)."""
        return Attributes(
            None if self.mtime_ns is None or self.mtime_ns == entry.mtime_ns else self.mtime_ns,
            None if self.mode is None or self.mode == entry.mode else self.mode,
            None if self.uid is None or self.uid == entry.uid else self.uid,
            None if self.gid is None or self.gid == entry.gid else self.gid)

    def applied_to(self, entry: Entry) -> Entry:
        """``entry`` showing these attributes."""
        if not self:
            return entry
        return replace(entry,
                       mtime_ns=entry.mtime_ns if self.mtime_ns is None else self.mtime_ns,
                       mode=entry.mode if self.mode is None else self.mode,
                       uid=entry.uid if self.uid is None else self.uid,
                       gid=entry.gid if self.gid is None else self.gid)


#: No attribute set.
NO_ATTRIBUTES = Attributes()
#: The permission bits a directory with no stored mode shows.
DEFAULT_DIRECTORY_MODE = 0o755


@dataclass(frozen=True, slots=True)
class Entry:
    """One catalog object and its attributes, as a listing or a stat returns it.

    ``size`` is a Python int (64-bit and beyond); ``mtime_ns`` is nanoseconds since the epoch.
    ``version`` identifies the content (etag, generation, checksum): the data cache and the
    kernel page cache are keyed on it, so a changed file is never served from stale blocks.
    ``immutable`` promises the content of this path never changes (Rucio files): its
    attributes and data may be cached for the long immutable TTL. ``mode`` is the permission
    bits (``0o7777``) stored with the object or that the catalog grants the mounting user
    (``None``: the core's defaults, 0644/0755, 0777 for a symlink); a read-only mount never
    shows write bits. ``uid``/``gid`` are the owner stored with the object (``None``: the
    mount's owner).
    """

    name: str
    kind: Kind
    size: int = 0
    mtime_ns: int = 0
    checksums: Mapping[str, str] = field(default_factory=dict)
    immutable: bool = False
    version: str = ""
    metadata: Mapping[str, str] = field(default_factory=dict)
    mode: int | None = None
    uid: int | None = None
    gid: int | None = None
    #: False for a listed entry whose stored attributes (kind, time, mode, owner) the
    #: listing could not show (S3: ListObjectsV2 carries no user metadata): it shows the
    #: server's own time and the defaults, and a lookup of its name asks ``stat``.
    complete: bool = True

    @property
    def is_dir(self) -> bool:
        return self.kind is Kind.DIR

    def at_time(self, mtime_ns: int) -> Entry:
        """This entry showing time ``mtime_ns`` (``dataclasses.replace``, without its cost:
        a directory's time changes with every name made in it)."""
        return Entry(self.name, self.kind, self.size, mtime_ns, self.checksums,
                     self.immutable, self.version, self.metadata, self.mode, self.uid,
                     self.gid, self.complete)

    @property
    def is_symlink(self) -> bool:
        return self.kind is Kind.SYMLINK


def content_version(entry: Entry) -> str:
    """What identifies a file's bytes: the backend's version, else size and mtime (the data
    cache and the kernel's page cache are keyed on it)."""
    return entry.version or f"{entry.size}@{entry.mtime_ns}"


def same_attributes(a: Entry, b: Entry) -> bool:
    """Whether ``a`` and ``b`` show the same file: kind, size, time, mode and content version
    (what a reply's attributes and the caches depend on). Cheaper than ``==``."""
    return (a.size == b.size and a.mtime_ns == b.mtime_ns and a.version == b.version
            and a.kind is b.kind and a.mode == b.mode and a.immutable == b.immutable
            and a.uid == b.uid and a.gid == b.gid and a.complete == b.complete)


#: The longest file name, in bytes, Linux accepts (``statfs`` says so as ``f_namemax``).
NAME_MAX = 255


def check_confirmed(path: str, stored: Entry, expected: Entry) -> Entry:
    """``stored`` (what the server holds at ``path``) if it is the file an upload that
    returned ``expected`` made: same size, and same version when one was predicted; else
    :class:`~rucio_fs.errors.Unconfirmed`. Every backend's :meth:`Backend.confirm` ends here."""
    if stored.is_dir or stored.size != expected.size or (
            expected.version and stored.version != expected.version):
        raise Unconfirmed(f"{path}: the server holds {stored.size} bytes, version "
                          f"{stored.version!r}; the upload sent {expected.size} bytes, version "
                          f"{expected.version!r}")
    return stored


def usable_name(name: str) -> bool:
    """Whether ``name`` can be a POSIX file name: not empty, ``.`` or ``..``; no ``/`` or NUL;
    at most :data:`NAME_MAX` bytes in UTF-8 (a longer one could be listed but never opened,
    and ``cp -r`` of its directory would fail). Listings leave unusable names out, count them
    and log them."""
    return (bool(name) and name not in (".", "..") and "/" not in name and "\0" not in name
            and (len(name) <= NAME_MAX // 4
                 or len(name.encode("utf-8", "surrogateescape")) <= NAME_MAX))


@dataclass(frozen=True, slots=True)
class FsUsage:
    """What ``statfs`` reports; zeros mean "unknown" and are shown as such by ``df``."""

    total_bytes: int = 0
    free_bytes: int = 0
    files: int = 0


class SharedValues(Protocol):
    """Small values a backend shares with every mount of its identity (the shared tier,
    ``--shared-cache``): e.g. Rucio's resolved replica locations. Values are JSON-able and
    never secret; a failure of the tier is a miss, never an error."""

    async def get(self, kind: str, key: str) -> Any | None:
        """The value stored under ``(kind, key)``, or None."""

    async def put(self, kind: str, values: Mapping[str, Any], ttl: float) -> None:
        """Store ``values`` (key -> value) under ``kind`` for ``ttl`` seconds."""


class Upload(ABC):
    """One file being uploaded in parts. The core calls ``write_part`` with increasing
    ``number`` (from 1), possibly several at once; every part but the last has at least the
    backend's ``upload_part_size`` bytes. Then exactly one of ``commit`` or ``abort``."""

    @abstractmethod
    async def write_part(self, number: int, offset: int, data: bytes) -> None:
        """Store bytes ``[offset, offset+len(data))`` of the new content as part ``number``."""

    @abstractmethod
    async def commit(self, size: int) -> Entry:
        """Make the parts the file's content (``size`` bytes in all); returns its new entry
        (``version`` as predicted from the bytes, or empty when it cannot be)."""

    def commit_seconds(self) -> float:
        """How much longer than an ordinary request ``commit`` may take (servers assemble the
        parts while the request waits: the time grows with their number)."""
        return 0.0

    @abstractmethod
    async def abort(self) -> None:
        """Forget the parts; the file keeps its previous content. Must not raise for a
        server that is gone (log instead): it runs on error paths."""

    async def release_unconfirmed(self) -> None:
        """``commit`` returned but the server did not confirm the object: let go of whatever
        the upload may still hold there (parts, an open handle), best effort, never raising.
        The core uploads the staged file again later."""
        await self.abort()


class Backend(ABC):
    """Base class of every catalog backend. See the module docstring for the contract."""

    #: URL scheme, e.g. ``"demo"`` for ``demo://...``. Must equal the entry-point name.
    scheme: ClassVar[str]
    #: One line shown by ``rucio-fs backends``.
    description: ClassVar[str] = ""
    capabilities: ClassVar[Capability] = Capability.NONE

    @classmethod
    @abstractmethod
    def from_url(cls, url: str) -> Backend:
        """Build a backend from its mount URL; raise InvalidInput with a one-line reason."""

    @classmethod
    def capabilities_for(cls, url: str) -> Capability:
        """What a mount of ``url`` can do, known before any backend is built (a per-user
        mount decides from it whether it is writable): ``capabilities`` unless the URL
        changes them. A built backend's ``capabilities`` must say the same."""
        return cls.capabilities

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Open connections, authenticate. Called once inside the daemon's event loop."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release connections. Called once at unmount."""

    #: Environment variables of a calling process that name or hold its credentials (read
    #: by per-user mounts; nothing else of a caller's environment is ever kept).
    credential_env: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def for_caller(cls, url: str, credentials: CallerCredentials) -> Backend:
        """A backend for ``url`` acting as one local user (``--identity per-user``), with only
        the credentials that user's own client would use: found from ``credentials``
        (the caller's ``credential_env`` variables, its home, its files read as that user),
        never from the daemon's environment or files. MissingCredentials or
        PermissionDenied when the user has none usable. Default: not supported."""
        raise NotSupported(f"{cls.scheme}: mounts cannot serve each user as themselves")

    @abstractmethod
    async def stat(self, path: str) -> Entry:
        """Attributes of one path; NotFound when it does not exist."""

    async def complete(self, path: str, listed: Entry) -> Entry:
        """The entry of ``path`` with what its listing could not carry: ``listed`` is a
        listed entry with :attr:`Entry.complete` False, which settles the name's kind. The
        default asks :meth:`stat`; a backend that can ask for less does (S3: a HEAD)."""
        return await self.stat(path)

    @abstractmethod
    def list(self, path: str) -> AsyncIterator[Entry]:
        """The entries of directory ``path`` with their attributes (an async generator)."""

    @abstractmethod
    async def open(self, path: str, entry: Entry) -> Any:
        """Prepare reading ``path`` (e.g. resolve a replica); returns an opaque handle."""

    @abstractmethod
    async def read(self, handle: Any, offset: int, size: int) -> bytes | memoryview:
        """Exactly ``size`` bytes at ``offset``; the range lies within the file."""

    async def close(self, handle: Any) -> None:  # noqa: B027 - optional hook
        """Release what ``open`` acquired."""

    def distrust(self, handle: Any) -> None:  # noqa: B027 - optional hook
        """Bytes read through ``handle`` did not match the catalog's checksum: the read
        failed, and later reads of that file (through any handle) should come from another
        copy, where the catalog has one."""

    async def xattrs(self, path: str, entry: Entry) -> Mapping[str, bytes]:
        """Extended attributes of ``path`` without the ``user.`` prefix.

        The default exposes the entry's checksums and metadata as
        ``<scheme>.checksum.<algo>`` and ``<scheme>.<key>``; backends may add more.
        """
        attrs = {f"{self.scheme}.checksum.{k}": v.encode() for k, v in entry.checksums.items()}
        attrs.update({f"{self.scheme}.{k}": v.encode() for k, v in entry.metadata.items()})
        return attrs

    def use_caches(self, enabled: bool) -> None:  # noqa: B027 - optional hook
        """Whether the backend may keep its own metadata caches (e.g. resolved replica
        locations). Called once before ``start`` with the metadata layer's switch."""

    def drop_caches(self) -> None:  # noqa: B027 - optional hook
        """Forget the backend's own metadata caches; called when the metadata layer is
        dropped, so that "cold" means cold for every backend."""

    def shared_identity(self) -> str | None:
        """Who this mount is to the catalog, as the shared tier's keys name it: the catalog's
        address and the account or user whose view it lists — everything that can change
        what a listing shows, never a secret. Two mounts share listings and stats exactly when
        their identities are equal. None (the default): nothing is shared."""
        return None

    def use_shared_values(self, values: SharedValues) -> None:  # noqa: B027 - optional hook
        """Called once before ``start`` when the shared tier is on: where the backend may keep
        its own small shared values (never secrets)."""

    def keep_state_in(self, directory: Path) -> None:  # noqa: B027 - optional hook
        """Called once before ``start`` when the mount has a ``--cache-dir``: a directory of
        this backend's own (it may not exist yet) where it may keep, across remounts, what it
        learned of the catalog's configuration — never a secret, never catalog content, and
        nothing it serves unproven (Rucio: RSE layouts). Its files may be missing, stale or
        damaged: reading them is a hint, never an error."""

    def use_hints(self, hints: dict[str, Any]) -> None:  # noqa: B027 - optional hook
        """Called once before ``start`` on each backend of a per-user mount, with one dict
        shared by all of them: where a backend may keep what is not any user's answer —
        where to look, never what is there — so that one user's requests make another's
        faster without deciding what that user is served. Everything taken from it must be
        proven again with the user's own credentials before it reaches that user (Rucio:
        the layouts of its RSEs, whose guessed bytes are served only when they match the
        user's own catalog entry's checksums). Keys start with the backend's scheme."""

    def use_data_proxy(self, url: str) -> None:
        """Send file reads through the caching HTTP proxy at ``url`` (``--data-proxy``; see
        :func:`rucio_fs.http.through_proxy`). Called once before ``start``. The default
        refuses: only a backend whose reads are plain HTTP ranges of URLs that name the
        content (not the reader) may be cached by a proxy shared between users."""
        raise NotSupported(f"{self.scheme}: reads cannot go through a data proxy")

    def lists_everything(self, path: str) -> bool:
        """Whether ``list(path)`` names every child of directory ``path`` (the default).

        When not (a Rucio scope lists only its top-level DIDs), a name missing from a cached
        listing is looked up with ``stat`` rather than taken as absent.
        """
        return True

    # -- writing (only called when the matching capability is declared) -----------------------

    #: Files up to this size are written with one ``put``.
    single_put_max: ClassVar[int] = 8 << 20
    #: Size of every part but the last of an :class:`Upload`.
    upload_part_size: ClassVar[int] = 8 << 20
    #: Most parts of a file uploaded at once.
    upload_parallelism: ClassVar[int] = 4
    #: Whether an :class:`Upload` leaves the file's previous content in place until it
    #: commits (and after an abort). False for a backend that writes the parts into the file
    #: itself, as a local ``cp`` over an existing file does: readers may meet a partial file
    #: until the commit, and an aborted upload leaves one (the core keeps the staged copy and
    #: uploads it again).
    atomic_uploads: ClassVar[bool] = True

    #: Queued changes carried out at once with async write-back, unless the mount says
    #: (``--write-back-parallelism``): more where the backend sends concurrent changes
    #: together (Rucio's registrations).
    write_back_parallelism: ClassVar[int] = 16
    #: Whether a file's content can be stored only once (Rucio: a file is immutable). The
    #: core then stores a new file at the first close that leaves it with content, and an
    #: empty one at its last close (`echo x > f` closes a duplicate of the new, still empty
    #: file before writing); storing other content later fails (AlreadyExists).
    write_once: ClassVar[bool] = False
    #: Whether an upload stores the modification time it is given at no cost of its own (S3:
    #: a header of the same PUT). The core then gives every upload the time of the content's
    #: last write when none was set, so a file shows the same time, to the nanosecond and on
    #: the mount's clock, before and after its upload (a server's own time is another clock,
    #: often in whole seconds: a later write within that second would look older than it
    #: is, and ``git status`` would miss it).
    stores_write_times: ClassVar[bool] = False
    #: Whether a directory exists on the server as long as a key lies below it (S3: its
    #: marker only keeps an empty directory, and its attributes). With async write-back the
    #: core then writes no marker for a new directory with default attributes that receives
    #: a file before its ``mkdir`` goes out, and writes one if that directory is about to
    #: lose a name below it or to get attributes.
    implied_directories: ClassVar[bool] = False
    #: Whether removing a file the mount may write always succeeds on the server (S3: a
    #: DELETE answers 204 whether or not the key is there). With sync write-back the core
    #: then lets the removals of files run ahead of ``unlink`` (journaled, on the server
    #: before the directory's ``rmdir`` or ``fsync`` returns): ``rm -r`` does not wait for
    #: each one. A catalog that may refuse one file and not the next (Rucio: only the
    #: account's own) keeps every ``unlink`` waiting for the server.
    removals_run_ahead: ClassVar[bool] = False

    def check_new(self, path: str, kind: Kind, parent: Entry) -> None:  # noqa: B027
        """Raise the error that making ``kind`` at ``path`` in directory ``parent`` (its
        entry) would meet, before anything is staged or queued: for a catalog that keeps
        files only in some kinds of directory or refuses some names. Asks the server
        nothing. By default nothing is refused."""

    async def put(self, path: str, data: bytes, attributes: Attributes = NO_ATTRIBUTES
                  ) -> Entry:
        """Replace (or create) file ``path`` with ``data`` and the set ``attributes`` (what
        the backend stores of them: see :meth:`set_attributes`); returns its new entry."""
        raise NotSupported(f"{self.scheme}: writing is not supported")

    async def confirm(self, path: str, expected: Entry) -> Entry:
        """Prove that ``path`` holds what a ``put``/``commit`` that returned ``expected`` just
        stored: its current entry, read from the server (no cache). Raises
        :class:`~rucio_fs.errors.Unconfirmed` when it is missing or differs in kind, size or
        (when ``expected.version`` is set) version."""
        try:
            stored = await self.stat(path)
        except NotFound:
            raise Unconfirmed(f"{path}: not on the server after the upload") from None
        return check_confirmed(path, stored, expected)

    async def begin_upload(self, path: str, attributes: Attributes = NO_ATTRIBUTES) -> Upload:
        """Start replacing (or creating) file ``path`` part by part; the committed file has
        the set ``attributes`` (as :meth:`put`)."""
        raise NotSupported(f"{self.scheme}: writing is not supported")

    async def mkdir(self, path: str, attributes: Attributes = NO_ATTRIBUTES) -> Entry:
        """Make directory ``path`` with what the catalog stores of the set ``attributes``
        (as :meth:`set_attributes`: the returned entry shows what it stored)."""
        raise NotSupported(f"{self.scheme}: mkdir is not supported")

    async def unlink(self, path: str) -> None:
        raise NotSupported(f"{self.scheme}: unlink is not supported")

    async def rmdir(self, path: str) -> None:
        """Remove empty directory ``path``; NotEmpty when it has children."""
        raise NotSupported(f"{self.scheme}: rmdir is not supported")

    def holds_unlisted(self, path: str) -> bool | None:
        """Whether the last listing of directory ``path`` found what it cannot show (on S3:
        hidden keys, a ``dir/`` marker holding data): such a directory is not empty though
        it lists so, and the core refuses its removal. False: the listing showed all; None
        (the default): unknown. A directory that lists empty and showed all is removed as
        :meth:`remove_many` removes one."""
        return None

    #: The most names one :meth:`remove_many` call removes at once (1: one by one).
    remove_batch_max: ClassVar[int] = 1

    async def remove_many(self, items: Sequence[tuple[str, Kind]]
                          ) -> Mapping[str, RucioFsError]:
        """Remove each file (``Kind.FILE``) and directory (``Kind.DIR``) of ``items``, in
        as few requests as the catalog allows (at most ``remove_batch_max`` names are given);
        returns the failures by path, the others are gone. A name that is gone already
        counts as removed. The core batches the removal of a directory only after those of
        everything it held through the mount, and only while it saw it empty; a backend
        whose directories are markers (S3) may then delete the marker without looking below
        it (anything another client put there stays and keeps the directory listed).
        By default: ``unlink``/``rmdir`` one by one."""
        failures: dict[str, RucioFsError] = {}
        for path, kind in items:
            try:
                await (self.rmdir(path) if kind is Kind.DIR else self.unlink(path))
            except NotFound:
                pass
            except RucioFsError as exc:
                failures[path] = exc
        return failures

    async def rename(self, old: str, new: str, entry: Entry) -> Entry:
        """Move ``old`` (described by ``entry``) to ``new``, replacing a file there; returns
        the entry at ``new``. CrossDevice when this backend cannot move it in place."""
        raise NotSupported(f"{self.scheme}: rename is not supported")

    async def rename_with(self, old: str, new: str, entry: Entry, attributes: Attributes
                          ) -> Entry:
        """:meth:`rename`, the moved path also storing the set ``attributes`` (as
        :meth:`set_attributes` would). By default the two steps one after the other; a
        backend whose move can carry them does it in one (S3: the copy's metadata)."""
        moved = await self.rename(old, new, entry)
        return await self.set_attributes(new, moved, attributes) if attributes else moved

    async def truncate(self, path: str, size: int) -> Entry:
        """Cut or extend (with zeros) file ``path`` to ``size`` (``Capability.TRUNCATE``)."""
        raise NotSupported(f"{self.scheme}: truncate is not supported")

    async def set_attributes(self, path: str, entry: Entry, attributes: Attributes) -> Entry:
        """Store the set ``attributes`` of ``path`` (a file, directory or symlink, currently
        ``entry``); returns its new entry. An attribute the catalog cannot keep for this
        path is simply not shown by the returned entry: the core keeps it for the mount's
        life instead (docs/semantics.md), so a plain ``cp -a`` never fails on it. Never
        changes the content. By default nothing is stored."""
        return entry

    async def symlink(self, path: str, target: str) -> Entry:
        """Create symbolic link ``path`` whose target is ``target``, stored as given (never
        resolved) (``Capability.SYMLINK``); AlreadyExists when ``path`` exists."""
        raise NotSupported(f"{self.scheme}: symbolic links are not supported")

    async def readlink(self, path: str, entry: Entry) -> str:
        """The target of symbolic link ``path`` (``entry``)."""
        raise NotSupported(f"{self.scheme}: symbolic links are not supported")

    async def set_xattr(self, path: str, entry: Entry, name: str, value: bytes | None) -> Entry:
        """Set (``value`` None: remove) extended attribute ``name`` (without ``user.``).
        NotSupported for names the backend does not store."""
        raise NotSupported(f"{self.scheme}: extended attributes cannot be set")

    async def usage(self) -> FsUsage:
        """Capacity figures for ``statfs``; unknown by default."""
        return FsUsage()

    def counters(self) -> Mapping[str, int]:
        """Backend-specific counters (requests made, bytes served) shown in ``stats``."""
        return {}
