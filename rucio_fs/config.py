"""Mount configuration: every cache layer's switch, TTL and size, and the backend call timeout."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any
from urllib.parse import urlsplit

from rucio_fs.errors import InvalidInput
from rucio_fs.options import without_password

#: The cache layers, as ``cache drop --layer`` and ``stats`` name them.
LAYERS = ("kernel", "metadata", "listing", "data", "disk", "shared")


def _option(flag: str, help: str = "", kind: str = "", *aliases: str) -> dict[str, Any]:
    """The ``mount`` option of a field (``kind``: ``flag`` (the option turns the field off),
    ``switch`` (the option turns it on), ``duration``, ``size``, ``count``, ``path``,
    ``text``; a field of a cache layer switch is turned off by ``--cold`` too).
    ``rucio_fs.cli.commands`` makes the options from these."""
    return {"option": (flag, *aliases), "help": help, "kind": kind}


@dataclass(frozen=True)
class MountConfig:
    """Which cache layers are on, their bounds, and the backend call timeout.

    Layers: kernel (entry/attr/negative timeouts, page cache across opens), metadata (stat
    results), listing (whole directory listings), data (blocks in memory), disk (blocks on
    disk, across remounts; only with ``disk_dir``), shared (listings and stats in Redis, shared
    with other mounts; only with ``shared_cache``), plus coalescing of
    concurrent identical backend calls. ``attr_window`` is not a cache layer: attributes a
    listing or stat just returned answer the kernel's follow-up lookup/getattr for that long, so
    one ``ls -l`` costs one listing even with every layer off (0 reproduces per-entry stats).
    Every field is a ``mount`` option (its metadata says which).
    """

    kernel: bool = field(default=True, metadata=_option(
        "--no-kernel-cache", "Kernel entry/attr/negative timeouts 0, no page cache across opens.",
        "layer"))
    metadata: bool = field(default=True, metadata=_option(
        "--no-metadata-cache", "No stat-result cache.", "layer"))
    listing: bool = field(default=True, metadata=_option(
        "--no-listing-cache", "No directory-listing cache.", "layer"))
    data: bool = field(default=True, metadata=_option(
        "--no-data-cache", "No in-memory data block cache.", "layer"))
    coalescing: bool = field(default=True, metadata=_option(
        "--no-coalescing", "Every caller makes its own backend call (naive behaviour).",
        "flag"))
    kernel_ttl: float = field(default=1.0, metadata=_option(
        "--kernel-ttl", "Kernel entry/attribute timeout for mutable entries.", "duration"))
    immutable_ttl: float = field(default=3600.0, metadata=_option(
        "--immutable-ttl", "Attribute/metadata TTL of immutable files.", "duration"))
    negative_ttl: float = field(default=1.0, metadata=_option(
        "--negative-ttl", "How long a missing name is remembered (kernel and metadata layer).",
        "duration"))
    metadata_ttl: float = field(default=60.0, metadata=_option(
        "--metadata-ttl", "How long a stat result is kept.", "duration"))
    metadata_max_entries: int = field(default=500_000, metadata=_option(
        "--metadata-max-entries", "Bound on the stat results kept.", "count"))
    listing_ttl: float = field(default=60.0, metadata=_option(
        "--listing-ttl", "How long a complete listing is kept.", "duration"))
    listing_max_entries: int = field(default=2_000_000, metadata=_option(
        "--listing-max-entries", "Bound on the entries of all cached listings together.",
        "count"))
    #: File data in memory, reads and writes together (see budget.py for its shares).
    memory_limit: int = field(default=256 << 20, metadata=_option(
        "--memory-limit", "File data in memory, reads and writes together: cached blocks "
        "(7/16), strided read-ahead's pieces (1/16), read-ahead (1/8), upload parts (1/4), "
        "verification (1/8).", "size",
        "--data-cache-size"))
    block_size: int = field(default=1 << 20, metadata=_option(
        "--block-size", "Data cache block size.", "size"))
    attr_window: float = field(default=1.0, metadata=_option(
        "--attr-window", "How long just-fetched attributes answer follow-up lookups "
        "(0: re-stat).", "duration"))
    #: Most data fetched ahead of one sequential reader (0: no read-ahead by the daemon,
    #: strided read-ahead included).
    prefetch_max_bytes: int = field(default=32 << 20, metadata=_option(
        "--prefetch-max", "Most data read ahead of one sequential reader (0: no read-ahead at "
        "all, strided read-ahead of columnar readers included; needs the data cache).",
        "size"))
    #: Open a file read sparsely a moment ago with the kernel's page cache bypassed, so the
    #: kernel asks for exactly what the reader reads (see datapath.SparseFiles).
    direct_sparse: bool = field(default=True, metadata=_option(
        "--no-direct-sparse", "Keep the kernel's page cache and read-ahead for files read "
        "sparsely (columnar readers then cost more bytes; shared mmap works on every file).",
        "flag"))
    #: Verify a file's catalog checksum over its first sequential whole-file read.
    verify: bool = field(default=True, metadata=_option(
        "--no-verify", "Do not verify catalog checksums on sequential whole-file reads.",
        "flag"))
    #: No backend call may take longer: past it the FUSE request fails with EIO, never hangs.
    backend_timeout: float = field(default=120.0, metadata=_option(
        "--timeout", "Longest a backend call may take before the operation fails with EIO.",
        "duration"))
    #: The on-disk block cache (off unless a directory is given), its size limit, and the
    #: free space it always leaves on its file system.
    disk_dir: str = field(default="", metadata=_option(
        "--cache-dir", "Keep data blocks on disk here too, across remounts (the disk layer).",
        "path"))
    disk_max_bytes: int = field(default=10 << 30, metadata=_option(
        "--cache-size", "Hard size limit of the disk layer.", "size"))
    disk_free_floor: int = field(default=1 << 30, metadata=_option(
        "--cache-free-floor", "Free space the disk layer always leaves.", "size"))
    #: Where files being written are staged (default: ``staging/`` in the cache directory,
    #: else ``rucio-fs-<uid>/staging`` in the temporary directory).
    #: The shared tier (off unless given): listings, stats and negative entries in Redis,
    #: shared by every mount of the same catalog identity (see rucio_fs.catalog.shared).
    shared_cache: str = field(default="", metadata=_option(
        "--shared-cache", "Share listings and stats with other mounts through Redis: "
        "redis://[user:pass@]HOST:PORT/DB (rediss:// for TLS). Off by default.", "text"))
    shared_timeout: float = field(default=0.05, metadata=_option(
        "--shared-timeout", "Longest Redis may stay silent in a shared-cache call before the "
        "mount works without it (a call takes at most 20 times this).", "duration"))
    #: Where HTTP reads go (off unless given): a caching proxy shared by the site's mounts.
    data_proxy: str = field(default="", metadata=_option(
        "--data-proxy", "Read file data through this caching HTTP proxy (http://HOST:PORT; "
        "see containers/data-proxy). Rucio and S3 only.", "text"))
    staging_dir: str = field(default="", metadata=_option(
        "--staging-dir", "Where files being written wait for their upload (default: staging/ "
        "in --cache-dir, else in the temporary directory).", "path"))
    #: ``sync``: close returns once the server holds the file; ``async``: once it is staged
    #: durably on local disk, with the upload (and mkdir, unlink, rmdir) queued in order.
    write_back: str = field(default="sync", metadata=_option(
        "--write-back", "sync: close returns once the server holds the file; async: once the "
        "file is staged on local disk (see --durable), the upload (and mkdir/unlink/rmdir) "
        "queued in order and replayed after a crash (see docs/writing.md).", "text"))
    #: With async write-back, when a returned ``close`` survives a power cut: ``fsync`` (as
    #: on a local file system: at an fsync of the file or its directory, or at unmount; a
    #: crash of the daemon loses nothing either way) or ``close`` (every close syncs).
    durable: str = field(default="fsync", metadata=_option(
        "--durable", "With async write-back, what makes a closed file survive a power cut: "
        "fsync (an fsync of the file or its directory, or unmount, as on a local file "
        "system; a close survives a crash of the daemon) or close (every close syncs its "
        "staged bytes and the journal).", "text"))
    #: Whether the kernel reads and writes files itself in local backing files (FUSE
    #: passthrough): with async write-back a file open for writing in its staging file, with
    #: a disk layer a file read whole before in its whole file there. No READ or WRITE
    #: request of such an open reaches the daemon.
    passthrough: bool = field(default=False, metadata=_option(
        "--passthrough", "The kernel itself writes files open for writing into their staging "
        "files (async write-back) and reads files kept whole in --cache-dir (FUSE "
        "passthrough; root, Linux >= 6.9; see docs/caches.md and docs/writing.md).",
        "switch"))
    write_back_parallelism: int = field(default=0, metadata=_option(
        "--write-back-parallelism", "Most queued changes carried out at once (async "
        "write-back); 0: the catalog's own (16; Rucio 128, whose registrations go "
        "together).", "count"))

    @classmethod
    def from_options(cls, values: Mapping[str, Any], cold: bool = False,
                     no_disk_cache: bool = False) -> MountConfig:
        """The configuration from the ``mount`` options' values by field name (flags: True
        when given); ``cold`` turns every layer off, ``no_disk_cache`` the disk layer."""
        settings: dict[str, Any] = {}
        for spec in fields(cls):
            if spec.name not in values:
                continue
            value, kind = values[spec.name], spec.metadata["kind"]
            if kind in ("flag", "layer"):
                value = not (value or (cold and kind == "layer"))
            elif kind == "switch":
                value = bool(value)
            elif kind == "path":
                value = os.path.abspath(value) if value else ""
            elif kind == "text":
                value = value or spec.default
            settings[spec.name] = value
        if cold or no_disk_cache:
            settings["disk_dir"] = ""
        if cold:
            settings["shared_cache"] = ""
        return cls(**settings).check()

    @property
    def shared(self) -> bool:
        return bool(self.shared_cache)

    @property
    def disk(self) -> bool:
        return bool(self.disk_dir)

    def as_dict(self) -> dict[str, object]:
        """The settings, as ``stats`` shows them: no password of a URL."""
        settings = asdict(self)
        for name in ("shared_cache", "data_proxy"):
            settings[name] = without_password(settings[name])
        return settings

    def check(self) -> MountConfig:
        """Reject values that cannot work; returns self so it chains."""
        for name in ("kernel_ttl", "immutable_ttl", "negative_ttl", "metadata_ttl",
                     "listing_ttl", "attr_window"):
            if getattr(self, name) < 0:
                raise InvalidInput(f"{name.replace('_', '-')} must not be negative")
        if self.shared_cache:
            from rucio_fs.redis_client import RedisAddress  # trio and hiredis: only when asked

            RedisAddress.parse(self.shared_cache)
        if self.data_proxy:
            proxy = urlsplit(self.data_proxy)
            if proxy.scheme not in ("http", "https") or not proxy.hostname or proxy.query:
                raise InvalidInput(f"data proxy {self.data_proxy!r}: expected http://HOST:PORT")
        if not 0 < self.shared_timeout <= 10:
            raise InvalidInput("shared-timeout must be positive and at most 10 s")
        if self.write_back not in ("sync", "async"):
            raise InvalidInput(f"write-back {self.write_back!r}: expected sync or async")
        if self.durable not in ("fsync", "close"):
            raise InvalidInput(f"durable {self.durable!r}: expected fsync or close")
        if not 0 <= self.write_back_parallelism <= 1024:
            raise InvalidInput("write-back-parallelism must be between 0 and 1024")
        if self.backend_timeout <= 0:
            raise InvalidInput("timeout must be positive")
        if not 4096 <= self.block_size <= 64 << 20 or self.block_size & (self.block_size - 1):
            raise InvalidInput("block-size must be a power of two between 4K and 64M")
        for name in ("metadata_max_entries", "listing_max_entries", "disk_max_bytes"):
            if getattr(self, name) < 1:
                raise InvalidInput(f"{name.replace('_', '-')} must be positive")
        if self.memory_limit < 8 * self.block_size:
            raise InvalidInput(f"memory-limit must be at least 8 blocks ({8 * self.block_size} "
                               "bytes)")
        return self
