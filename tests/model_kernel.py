"""The core without a kernel: :class:`RucioFs` driven in-process, with a model of the part of
the kernel that matters for reads (a page cache per inode that an open without ``keep_cache``
and an ``invalidate_inode`` drop), over a scripted backend.

What only the real kernel shows stays in the mount tests; this is for invariants that need
thousands of steps (Hypothesis) and must not depend on the kernel's timing.
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pyfuse3
import trio

from rucio_fs.backend import Backend, Entry, Kind
from rucio_fs.cache.disk_cache import DiskCache
from rucio_fs.catalog.catalog import Catalog
from rucio_fs.config import MountConfig
from rucio_fs.errors import NotADirectory, NotFound
from rucio_fs.fuse import fs as fs_module
from rucio_fs.fuse.fs import RucioFs
from rucio_fs.fuse.inodes import ROOT_INO
from rucio_fs.observe.stats import Stats


@dataclass
class ScriptedFile:
    """What the catalog says (``claimed``: the bytes its checksum is of) and what the storage
    serves (``stored``)."""

    stored: bytes
    claimed: bytes | None = None

    def entry(self, name: str) -> Entry:
        claimed = self.stored if self.claimed is None else self.claimed
        adler = f"{zlib.adler32(claimed):08x}"
        return Entry(name=name, kind=Kind.FILE, size=len(self.stored), immutable=True,
                     checksums={"adler32": adler}, version=adler)


class ScriptedBackend(Backend):
    """A flat read-only catalog of :class:`ScriptedFile` under ``/``; counts reads."""

    scheme: ClassVar[str] = "scripted"

    def __init__(self, files: Mapping[str, ScriptedFile]) -> None:
        self.files = dict(files)
        self.reads = 0

    @classmethod
    def from_url(cls, url: str) -> ScriptedBackend:
        raise NotImplementedError("built in tests only")

    async def stat(self, path: str) -> Entry:
        if path == "/":
            return Entry(name="", kind=Kind.DIR)
        name = path[1:]
        if name not in self.files:
            raise NotFound(path)
        return self.files[name].entry(name)

    async def list(self, path: str) -> AsyncIterator[Entry]:
        if path != "/":
            raise NotADirectory(path)
        for name, file in self.files.items():
            yield file.entry(name)

    async def open(self, path: str, entry: Entry) -> str:
        return path[1:]

    async def read(self, handle: str, offset: int, size: int) -> bytes:
        self.reads += 1
        await trio.sleep(0)
        return self.files[handle].stored[offset:offset + size]


@dataclass
class ModelKernel:
    """One mount of ``backend`` served by :class:`RucioFs` in this process. ``page`` is the
    size of the model's pages and of its read requests."""

    fs: RucioFs
    page: int
    #: ino -> page index -> bytes the model kernel holds for that page.
    pages: dict[int, dict[int, bytes]] = field(default_factory=dict)

    def invalidate(self, ino: int, attr_only: bool = False) -> None:
        if not attr_only:
            self.pages.pop(ino, None)

    async def lookup(self, name: str) -> int:
        attrs = await self.fs.lookup(ROOT_INO, name.encode(), None)
        return attrs.st_ino

    async def open(self, ino: int) -> int:
        info = await self.fs.open(ino, 0, None)  # O_RDONLY
        if not info.keep_cache:
            self.pages.pop(ino, None)
        return info.fh

    async def read_page(self, ino: int, fh: int, index: int) -> bytes:
        """Page ``index`` as a reader sees it: from the model page cache, else a FUSE read
        (OSError with the errno the daemon answered)."""
        cached = self.pages.get(ino, {}).get(index)
        if cached is not None:
            return cached
        try:
            data = await self.fs.read(fh, index * self.page, self.page)
        except pyfuse3.FUSEError as exc:
            raise OSError(exc.errno, "read failed") from None
        self.pages.setdefault(ino, {})[index] = bytes(data)
        return bytes(data)

    async def release(self, fh: int) -> None:
        await self.fs.release(fh)


async def start_mount(nursery: trio.Nursery, backend: Backend, config: MountConfig,
                      disk_dir: str = "", page: int = 16 << 10) -> ModelKernel:
    """A mount of ``backend`` whose background tasks run in ``nursery``."""
    stats = Stats()
    disk = None
    if disk_dir:
        disk = DiskCache(disk_dir, 1 << 30, "scripted://", stats, free_floor=0,
                         block_size=config.block_size)
        disk.load()
    catalog = Catalog(backend, config, stats, disk)
    root = await backend.stat("/")
    fs = RucioFs(catalog, root, config, stats)
    fs.nursery = catalog.nursery = nursery
    if disk is not None:
        nursery.start_soon(catalog.data_path.run_disk_writer)
    kernel = ModelKernel(fs, page)
    return kernel


def patch_invalidation(monkeypatch: Any, kernels: list[ModelKernel]) -> None:
    """Route the daemon's page invalidations to the model kernels."""

    def invalidate(ino: int, attr_only: bool = False) -> None:
        for kernel in kernels:
            kernel.invalidate(ino, attr_only)

    def invalidate_entry(*_args: Any) -> None:
        return None

    monkeypatch.setattr(fs_module, "_invalidate_inode", invalidate)
    monkeypatch.setattr(fs_module.pyfuse3, "invalidate_inode", invalidate)
    monkeypatch.setattr(fs_module.pyfuse3, "invalidate_entry", invalidate_entry)

