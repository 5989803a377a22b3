"""``memory://[NAME]`` — a writable catalog held in the daemon's memory: the reference backend.

It is the smallest backend that implements the whole contract of :mod:`rucio_fs.backend`
(listing with attributes, ranged reads, every write capability), with nothing else in the
way, which makes it the one to copy when writing a plugin and the one the core's tests use
when they need a writable catalog without a server. Everything is gone at unmount.

Backends of one process built with the same ``NAME`` share one tree (the conformance suite
and the core's tests use that to look at what a mount wrote); an empty name is a tree of its
own. File versions are the content's MD5, also given as its ``md5`` checksum, so reads
through the core are verified like those of a real catalog. ``user.memory.<key>`` extended
attributes are stored with the file.
"""

from __future__ import annotations

import hashlib
import itertools
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import ClassVar
from urllib.parse import urlsplit

import trio

from rucio_fs.backend import NO_ATTRIBUTES, Attributes, Backend, Capability, Entry, Kind, Upload
from rucio_fs.errors import (
    AlreadyExists,
    InvalidInput,
    IsADirectory,
    NotADirectory,
    NotEmpty,
    NotFound,
    NotSupported,
    Unavailable,
)
from rucio_fs.options import url_options

#: The ``user.`` extended attributes stored with a file: ``user.memory.<key>``.
XATTR_PREFIX = "memory."


@dataclass
class _File:
    data: bytes = b""
    mtime_ns: int = field(default_factory=time.time_ns)
    metadata: dict[str, str] = field(default_factory=dict)
    #: A symbolic link, whose target is ``data``.
    link: bool = False
    mode: int | None = None
    uid: int | None = None
    gid: int | None = None


@dataclass
class _Dir:
    children: dict[str, _File | _Dir] = field(default_factory=dict)
    mtime_ns: int = field(default_factory=time.time_ns)
    mode: int | None = None
    uid: int | None = None
    gid: int | None = None


def _entry(name: str, node: _File | _Dir) -> Entry:
    if isinstance(node, _Dir):
        return Entry(name=name, kind=Kind.DIR, mtime_ns=node.mtime_ns, mode=node.mode,
                     uid=node.uid, gid=node.gid)
    if node.link:
        return Entry(name=name, kind=Kind.SYMLINK, size=len(node.data),
                     mtime_ns=node.mtime_ns, uid=node.uid, gid=node.gid)
    digest = hashlib.md5(node.data).hexdigest()
    return Entry(name=name, kind=Kind.FILE, size=len(node.data), mtime_ns=node.mtime_ns,
                 checksums={"md5": digest}, version=digest, metadata=dict(node.metadata),
                 mode=node.mode, uid=node.uid, gid=node.gid)


def _set(node: _File | _Dir, attributes: Attributes) -> None:
    """Store the set ``attributes`` on ``node`` (every one: this catalog keeps them all)."""
    if attributes.mtime_ns is not None:
        node.mtime_ns = attributes.mtime_ns
    if attributes.mode is not None and not (isinstance(node, _File) and node.link):
        node.mode = attributes.mode
    if attributes.uid is not None:
        node.uid = attributes.uid
    if attributes.gid is not None:
        node.gid = attributes.gid


def _parts(path: str) -> list[str]:
    return [part for part in path.split("/") if part]


class MemoryBackend(Backend):
    scheme = "memory"
    description = "a writable catalog in memory (the reference backend; gone at unmount)"
    capabilities = (Capability.WRITE | Capability.MKDIR | Capability.UNLINK | Capability.RENAME
                    | Capability.SETXATTR | Capability.TRUNCATE | Capability.SYMLINK)
    single_put_max = 1 << 20
    upload_part_size = 1 << 20

    #: The trees of this process by name (see the module docstring).
    _trees: ClassVar[dict[str, _Dir]] = {}
    _anonymous = itertools.count()

    def __init__(self, root: _Dir) -> None:
        self.root = root
        self.requests = 0

    @classmethod
    def from_url(cls, url: str) -> MemoryBackend:
        parts = urlsplit(url)
        url_options(parts.query, (), cls.scheme)
        if parts.path not in ("", "/"):
            raise InvalidInput(f"{url}: memory:// takes a name, not a path (memory://NAME)")
        name = parts.netloc or f"anonymous-{next(cls._anonymous)}"
        return cls(cls._trees.setdefault(name, _Dir()))

    # -- finding nodes --------------------------------------------------------------------------

    def _node(self, path: str) -> _File | _Dir:
        node: _File | _Dir = self.root
        for part in _parts(path):
            if not isinstance(node, _Dir):
                raise NotADirectory(path)
            try:
                node = node.children[part]
            except KeyError:
                raise NotFound(path) from None
        return node

    def _dir(self, path: str) -> _Dir:
        node = self._node(path)
        if not isinstance(node, _Dir):
            raise NotADirectory(path)
        return node

    def _file(self, path: str) -> _File:
        node = self._node(path)
        if isinstance(node, _Dir):
            raise IsADirectory(path)
        return node

    def _parent(self, path: str) -> tuple[_Dir, str]:
        parent, _, name = path.rpartition("/")
        return self._dir(parent or "/"), name

    async def _request(self) -> None:
        """Every call is a checkpoint, as a network request would be."""
        self.requests += 1
        await trio.lowlevel.checkpoint()

    # -- reading ----------------------------------------------------------------------------------

    async def stat(self, path: str) -> Entry:
        await self._request()
        return _entry(_parts(path)[-1] if path != "/" else "", self._node(path))

    async def list(self, path: str) -> AsyncIterator[Entry]:
        await self._request()
        for name, node in list(self._dir(path).children.items()):
            yield _entry(name, node)

    async def open(self, path: str, entry: Entry) -> bytes:
        await self._request()
        data = self._file(path).data
        if hashlib.md5(data).hexdigest() != entry.version:
            # Blocks are cached by version: content of another version must not be served.
            raise Unavailable(f"{path}: changed since it was looked up")
        return data  # the handle is the content itself: a later write never changes it

    async def read(self, handle: bytes, offset: int, size: int) -> memoryview:
        await self._request()
        return memoryview(handle)[offset:offset + size]

    # -- writing ----------------------------------------------------------------------------------

    async def put(self, path: str, data: bytes, attributes: Attributes = NO_ATTRIBUTES
                  ) -> Entry:
        await self._request()
        parent, name = self._parent(path)
        existing = parent.children.get(name)
        if isinstance(existing, _Dir):
            raise IsADirectory(path)
        node = _File(bytes(data))
        if existing is not None and not existing.link:  # (a file keeps what it had)
            node.metadata, node.mode = existing.metadata, existing.mode
            node.uid, node.gid = existing.uid, existing.gid
        _set(node, attributes)
        parent.children[name] = node
        return _entry(name, node)

    async def begin_upload(self, path: str, attributes: Attributes = NO_ATTRIBUTES) -> Upload:
        await self._request()
        self._parent(path)
        return _MemoryUpload(self, path, attributes)

    async def mkdir(self, path: str, attributes: Attributes = NO_ATTRIBUTES) -> Entry:
        await self._request()
        parent, name = self._parent(path)
        if name in parent.children:
            raise AlreadyExists(path)
        parent.children[name] = node = _Dir()
        _set(node, attributes)
        return _entry(name, node)

    async def unlink(self, path: str) -> None:
        await self._request()
        parent, name = self._parent(path)
        self._file(path)
        del parent.children[name]

    async def rmdir(self, path: str) -> None:
        await self._request()
        parent, name = self._parent(path)
        if self._dir(path).children:
            raise NotEmpty(path)
        del parent.children[name]

    async def rename(self, old: str, new: str, entry: Entry) -> Entry:
        await self._request()
        old_parent, old_name = self._parent(old)
        new_parent, new_name = self._parent(new)
        node = self._node(old)
        target = new_parent.children.get(new_name)
        if isinstance(target, _Dir) and (target.children or isinstance(node, _File)):
            raise NotEmpty(new) if isinstance(node, _Dir) else IsADirectory(new)
        if isinstance(target, _File) and isinstance(node, _Dir):
            raise NotADirectory(new)
        del old_parent.children[old_name]
        new_parent.children[new_name] = node
        return _entry(new_name, node)

    async def truncate(self, path: str, size: int) -> Entry:
        await self._request()
        node = self._file(path)
        node.data = node.data[:size].ljust(size, b"\0")
        node.mtime_ns = time.time_ns()
        return _entry(path.rpartition("/")[2], node)

    async def set_attributes(self, path: str, entry: Entry, attributes: Attributes) -> Entry:
        await self._request()
        node = self._node(path)
        _set(node, attributes)
        return _entry(path.rpartition("/")[2], node)

    async def symlink(self, path: str, target: str) -> Entry:
        await self._request()
        parent, name = self._parent(path)
        if name in parent.children:
            raise AlreadyExists(path)
        parent.children[name] = node = _File(target.encode("utf-8", "surrogateescape"),
                                             link=True)
        return _entry(name, node)

    async def readlink(self, path: str, entry: Entry) -> str:
        await self._request()
        node = self._file(path)
        if not node.link:
            raise InvalidInput(f"{path}: not a symbolic link")
        return node.data.decode("utf-8", "surrogateescape")

    async def set_xattr(self, path: str, entry: Entry, name: str, value: bytes | None) -> Entry:
        await self._request()
        node = self._file(path)
        if not name.startswith(XATTR_PREFIX):
            raise NotSupported(f"{path}: only user.{XATTR_PREFIX}* attributes can be set")
        key = name[len(XATTR_PREFIX):]
        if value is None:
            node.metadata.pop(key, None)
        else:
            node.metadata[key] = value.decode("utf-8", "surrogateescape")
        return _entry(path.rpartition("/")[2], node)

    def counters(self) -> Mapping[str, int]:
        return {"requests": self.requests}


class _MemoryUpload(Upload):
    """Parts kept until ``commit`` joins them; the file keeps its content until then."""

    def __init__(self, backend: MemoryBackend, path: str, attributes: Attributes) -> None:
        self.backend = backend
        self.path = path
        self.attributes = attributes
        self.parts: dict[int, tuple[int, bytes]] = {}

    async def write_part(self, number: int, offset: int, data: bytes) -> None:
        await self.backend._request()
        self.parts[number] = (offset, bytes(data))

    async def commit(self, size: int) -> Entry:
        content = b"".join(data for _offset, data in (self.parts[n] for n in sorted(self.parts)))
        if len(content) != size:
            raise InvalidInput(f"{self.path}: the parts hold {len(content)} of {size} bytes")
        return await self.backend.put(self.path, content, self.attributes)

    async def abort(self) -> None:
        self.parts.clear()
