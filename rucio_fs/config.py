"""Mount configuration: every cache layer's switch, TTL and size, and the backend call timeout."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from .errors import InvalidInput

_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ns|us|ms|s|m|h)?\s*$")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def url_options(query: str, known: tuple[str, ...], scheme: str) -> dict[str, str]:
    """The ``?key=value&...`` options of a mount URL; InvalidInput naming unknown ones."""
    from urllib.parse import parse_qsl

    options = dict(parse_qsl(query, keep_blank_values=True))
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise InvalidInput(f"unknown {scheme} option(s) {', '.join(unknown)} "
                           f"(known: {', '.join(known)})")
    return options


def parse_duration(text: str) -> float:
    """``"20ms"`` → 0.02 seconds; a bare number is seconds. InvalidInput otherwise."""
    match = _DURATION.match(str(text))
    if not match:
        raise InvalidInput(f"invalid duration {text!r} (examples: 0, 1.5, 20ms, 5m)")
    return float(match.group(1)) * _DURATION_UNITS[match.group(2) or "s"]


def parse_size(text: str) -> int:
    """``"256M"``/``"256MiB"`` → bytes (binary units); a bare number is bytes."""
    match = _SIZE.match(str(text))
    if not match:
        raise InvalidInput(f"invalid size {text!r} (examples: 4096, 64K, 256M, 2G)")
    unit = (match.group(2) or "").lower().rstrip("b").rstrip("i")
    if unit not in _SIZE_UNITS:
        raise InvalidInput(f"invalid size unit in {text!r}")
    return int(float(match.group(1)) * _SIZE_UNITS[unit])


@dataclass(frozen=True)
class MountConfig:
    """Which cache layers are on, their bounds, and the backend call timeout.

    Layers: kernel (entry/attr/negative timeouts, page cache across opens), metadata (stat
    results), listing (whole directory listings), data (blocks in memory), disk (blocks on
    disk, across remounts; only with ``disk_dir``), plus coalescing of
    concurrent identical backend calls. ``attr_window`` is not a cache layer: attributes a
    listing or stat just returned answer the kernel's follow-up lookup/getattr for that long, so
    one ``ls -l`` costs one listing even with every layer off (0 reproduces per-entry stats).
    """

    kernel: bool = True
    metadata: bool = True
    listing: bool = True
    data: bool = True
    coalescing: bool = True
    kernel_ttl: float = 1.0
    immutable_ttl: float = 3600.0
    negative_ttl: float = 1.0
    metadata_ttl: float = 60.0
    metadata_max_entries: int = 500_000
    listing_ttl: float = 60.0
    listing_max_entries: int = 2_000_000
    #: File data in memory, reads and writes together (see budget.py for its shares).
    memory_limit: int = 256 << 20
    block_size: int = 1 << 20
    attr_window: float = 1.0
    #: Most data fetched ahead of one sequential reader (0: no read-ahead by the daemon).
    prefetch_max_bytes: int = 32 << 20
    #: Verify a file's catalog checksum over its first sequential whole-file read.
    verify: bool = True
    #: No backend call may take longer: past it the FUSE request fails with EIO, never hangs.
    backend_timeout: float = 120.0
    #: The on-disk block cache (off unless a directory is given), its size limit, and the
    #: free space it always leaves on its file system.
    disk_dir: str = ""
    disk_max_bytes: int = 10 << 30
    disk_free_floor: int = 1 << 30
    #: Where files being written are staged (default: ``staging/`` in the cache directory,
    #: else ``rucio-fs-<uid>/staging`` in the temporary directory).
    staging_dir: str = ""

    @property
    def disk(self) -> bool:
        return bool(self.disk_dir)

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    def check(self) -> MountConfig:
        """Reject values that cannot work; returns self so it chains."""
        for name in ("kernel_ttl", "immutable_ttl", "negative_ttl", "metadata_ttl",
                     "listing_ttl", "attr_window"):
            if getattr(self, name) < 0:
                raise InvalidInput(f"{name.replace('_', '-')} must not be negative")
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
