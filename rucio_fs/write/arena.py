"""The staging arena: one file of fixed-size slots that new small files are written into.

Why: creating a staging file per written file costs an inode and a directory entry, and on ext4
that creation waits behind every file-system journal commit under way: 0.1-0.5 ms per file
during ``cp -r`` (measured in ``docs/writing.md``), more than the rest of ``create``. A slot is
taken from a free list instead.

Contract:

* The arena is ``arena-<pid>-<k>.data`` in the staging directory, ``flock``-ed while its daemon
  lives, sparse, grown :data:`GROW_SLOTS` slots at a time. Slot ``i`` starts at
  ``i * SLOT_STRIDE``: an 8-byte little-endian length, then up to :data:`SLOT_BYTES` of
  content. The length is written with every change of size, so a daemon killed at any point
  (``kill -9``) leaves each slot's content and length in the page cache for the next mount.
* Nothing here is synced before unmount: with ``--durable close`` a slot's content becomes
  durable across a power cut by being copied into the journal (:mod:`rucio_fs.write.journal`,
  inline) at an async ``close``; by default an ``fsync`` waits for its upload instead, and the
  slot holds the content until then.
* A slot belongs to one file from :meth:`Arena.take` to :meth:`Arena.give_back`. Its journal
  record names the arena and the slot; :func:`read_slot` reads what a dead daemon left.
"""

from __future__ import annotations

import contextlib
import os
import struct

from .journal import create_locked, read_exactly

#: Content bytes one slot holds; a file that grows past it moves to a staging file of its own.
SLOT_BYTES = 1 << 20
#: Bytes from one slot's start to the next's (the length field, padded to a page).
SLOT_STRIDE = SLOT_BYTES + 4096
#: Slots added when none is free.
GROW_SLOTS = 16

_LENGTH = struct.Struct("<Q")


class Arena:
    """One daemon's arena. Every method runs on the trio loop."""

    def __init__(self, staging_dir: str) -> None:
        self.path, self.fd = create_locked(staging_dir, "arena", ".data")
        self.name = os.path.basename(self.path)
        self._slots = 0
        self._free: list[int] = []
        self.in_use = 0

    def take(self) -> int:
        """A free slot, its length set to 0."""
        if not self._free:
            self._free = list(range(self._slots + GROW_SLOTS - 1, self._slots - 1, -1))
            self._slots += GROW_SLOTS
            os.ftruncate(self.fd, self._slots * SLOT_STRIDE)
        slot = self._free.pop()
        self.set_length(slot, 0)
        self.in_use += 1
        return slot

    def give_back(self, slot: int) -> None:
        self._free.append(slot)
        self.in_use -= 1

    def set_length(self, slot: int, length: int) -> None:
        os.pwrite(self.fd, _LENGTH.pack(length), slot * SLOT_STRIDE)

    def write(self, slot: int, offset: int, data: bytes | memoryview) -> int:
        """Write ``data`` at ``offset`` of the slot's content (the caller keeps it within
        :data:`SLOT_BYTES` and sets the length)."""
        assert offset + len(data) <= SLOT_BYTES
        return os.pwrite(self.fd, data, slot * SLOT_STRIDE + _LENGTH.size + offset)

    def read(self, slot: int, offset: int, size: int) -> bytes:
        return read_exactly(self.fd, slot * SLOT_STRIDE + _LENGTH.size + offset, size)

    def sync(self) -> None:
        """Make the slots' content durable across a power cut."""
        if self.fd >= 0:
            os.fdatasync(self.fd)

    def close(self) -> None:
        """At unmount: the arena goes unless a slot still holds pending content."""
        if self.in_use == 0:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        os.close(self.fd)
        self.fd = -1


def read_slot(fd: int, slot: int) -> bytes:
    """The content a slot of a dead daemon's arena (open as ``fd``) holds: what a power cut
    left of it may be short (never promised: no close synced it)."""
    raw = os.pread(fd, _LENGTH.size, slot * SLOT_STRIDE)
    length = _LENGTH.unpack(raw)[0] if len(raw) == _LENGTH.size else 0
    return os.pread(fd, min(length, SLOT_BYTES), slot * SLOT_STRIDE + _LENGTH.size)
