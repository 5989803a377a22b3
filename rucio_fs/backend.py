"""The contract between the core and a catalog backend.

A backend is one class, registered under the entry-point group ``rucio_fs.backends`` with its URL
scheme as the entry-point name. It speaks in catalog paths (``"/"``, ``"/scope/dataset/file"``,
always absolute, ``/``-separated, no trailing slash) and never touches FUSE, caches or inodes:
the core caches, coalesces, measures and maps errors for every backend the same way.

Contract for implementers:

* ``list(path)`` yields the entries of a directory **with their attributes**; the core never
  calls ``stat`` per listed entry. A listing that cannot be completed raises (typically
  :class:`~rucio_fs.errors.Unavailable`); it never ends early with a shorter result.
* ``read(handle, offset, size)`` returns exactly ``size`` bytes, fewer only at end of file,
  as ``bytes`` or a read-only ``memoryview`` that nobody modifies afterwards (no copy needed).
* Errors are the typed ones from :mod:`rucio_fs.errors`.
* Optional operations are declared in ``capabilities``; the core never probes for them.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar


class Kind(enum.Enum):
    FILE = "file"
    DIR = "dir"


class Capability(enum.Flag):
    """Optional operations a backend implements. Declared, never probed."""

    NONE = 0
    WRITE = enum.auto()
    MKDIR = enum.auto()
    UNLINK = enum.auto()
    RENAME = enum.auto()
    SETXATTR = enum.auto()


@dataclass(frozen=True, slots=True)
class Entry:
    """One catalog object and its attributes, as a listing or a stat returns it.

    ``size`` is a Python int (64-bit and beyond); ``mtime_ns`` is nanoseconds since the epoch.
    ``version`` identifies the content (etag, generation, checksum): the data cache and the
    kernel page cache are keyed on it, so a changed file is never served from stale blocks.
    ``immutable`` promises the content of this path never changes (Rucio files): its
    attributes and data may be cached for the long immutable TTL.
    """

    name: str
    kind: Kind
    size: int = 0
    mtime_ns: int = 0
    checksums: Mapping[str, str] = field(default_factory=dict)
    immutable: bool = False
    version: str = ""
    metadata: Mapping[str, str] = field(default_factory=dict)

    @property
    def is_dir(self) -> bool:
        return self.kind is Kind.DIR


@dataclass(frozen=True, slots=True)
class FsUsage:
    """What ``statfs`` reports; zeros mean "unknown" and are shown as such by ``df``."""

    total_bytes: int = 0
    free_bytes: int = 0
    files: int = 0


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

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Open connections, authenticate. Called once inside the daemon's event loop."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release connections. Called once at unmount."""

    @abstractmethod
    async def stat(self, path: str) -> Entry:
        """Attributes of one path; NotFound when it does not exist."""

    @abstractmethod
    def list(self, path: str) -> AsyncIterator[Entry]:
        """The entries of directory ``path`` with their attributes (an async generator)."""

    @abstractmethod
    async def open(self, path: str, entry: Entry) -> Any:
        """Prepare reading ``path`` (e.g. resolve a replica); returns an opaque handle."""

    @abstractmethod
    async def read(self, handle: Any, offset: int, size: int) -> bytes | memoryview:
        """Exactly ``size`` bytes at ``offset`` (fewer only at end of file)."""

    async def close(self, handle: Any) -> None:  # noqa: B027 - optional hook
        """Release what ``open`` acquired."""

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
        locations). Called once before mounting with the metadata layer's switch."""

    def drop_caches(self) -> None:  # noqa: B027 - optional hook
        """Forget the backend's own metadata caches; called when the metadata layer is
        dropped, so that "cold" means cold for every backend."""

    def lists_everything(self, path: str) -> bool:
        """Whether ``list(path)`` names every child of directory ``path`` (the default).

        When not (a Rucio scope lists only its top-level DIDs), a name missing from a cached
        listing is looked up with ``stat`` rather than taken as absent.
        """
        return True

    async def usage(self) -> FsUsage:
        """Capacity figures for ``statfs``; unknown by default."""
        return FsUsage()

    def counters(self) -> Mapping[str, int]:
        """Backend-specific counters (requests made, bytes served) shown in ``stats``."""
        return {}
