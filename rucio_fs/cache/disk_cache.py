"""The on-disk block cache: data blocks kept across reads and remounts, under a hard size limit.

One file per block, named by a digest of its key ``(namespace, path, version, block index,
block size)`` where the namespace is the mount's URL: a block can only ever be found for the
same bytes of the same file. Each file starts with a header holding that key digest and the
CRC-32 of the block; both are checked on every read, so a corrupted or foreign file is
detected, deleted and refetched, never served.

Limits: the total size of the blocks never exceeds ``max_bytes`` (least recently used blocks
are evicted before each insert), and an insert that would leave the file system with less than
``free_floor`` bytes free evicts more or is skipped. At mount the directory is scanned: files
with a bad header or size are deleted, the rest are the cache's starting content, oldest
access first. All file I/O runs in worker threads.

A file whose every block is here can be *sealed* into one whole file
(:mod:`rucio_fs.cache.whole_files`), which then stands for its blocks: the daemon reads them
from it (CRC checked), and the kernel may read it itself (:meth:`DiskCache.backing_file`).
A whole file counts against the limits, and is evicted, as one entry.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import struct
import threading
import zlib
from collections import OrderedDict
from collections.abc import Hashable
from pathlib import Path

import trio

from rucio_fs.observe.stats import Stats

from . import whole_files
from .whole_files import Digest, WholeFile

log = logging.getLogger(__name__)

MAGIC = b"RFSB1\0\0\0"
#: magic, key digest (32 bytes), CRC-32 of the data, data length
HEADER = struct.Struct("<8s32sIQ")


class DiskCache:
    def __init__(self, directory: str, max_bytes: int, namespace: str, stats: Stats,
                 free_floor: int = 1 << 30, block_size: int = 1 << 20) -> None:
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.free_floor = free_floor
        self.namespace = namespace
        self.block_size = block_size
        self.enabled = True
        self._counters = stats.cache_layer("disk")
        self._counters["enabled"] = 1
        self._events = stats.events
        self._index: OrderedDict[bytes, int] = OrderedDict()  # digest -> file size, LRU first
        self._bytes = 0
        self._lock = threading.Lock()  # index and byte count: touched from worker threads
        self._limiter = trio.CapacityLimiter(8)
        self._whole_dir = self.directory / "whole"
        #: Whole files by digest (each also in ``_index``, with its bytes on disk).
        self._wholes: dict[bytes, WholeFile] = {}

    # -- keys and files ----------------------------------------------------------------------

    def digest(self, key: Hashable) -> bytes:
        path, version, index = key  # type: ignore[misc]
        text = f"{self.namespace}\0{path}\0{version}\0{index}\0{self.block_size}"
        return hashlib.sha256(text.encode("utf-8", "surrogateescape")).digest()

    def _file(self, digest: bytes) -> Path:
        name = digest.hex()
        return self.directory / name[:2] / name

    def whole_digest(self, path: str, version: str) -> bytes:
        text = f"{self.namespace}\0{path}\0{version}\0whole\0{self.block_size}"
        return hashlib.sha256(text.encode("utf-8", "surrogateescape")).digest()

    def whole(self, path: str, version: str) -> WholeFile | None:
        """The whole file of this content, if it was sealed."""
        return self._wholes.get(self.whole_digest(path, version)) if self._wholes else None

    def _in_whole(self, key: Hashable) -> WholeFile | None:
        path, version, index = key  # type: ignore[misc]
        record = self.whole(path, version)
        return record if record is not None and index < record.blocks else None

    def has(self, key: Hashable) -> bool:
        return self.digest(key) in self._index or self._in_whole(key) is not None

    @property
    def currsize(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._index)

    # -- mount-time scan -----------------------------------------------------------------------

    def load(self) -> None:
        """Adopt the blocks a previous mount left, deleting damaged files (blocking)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        found = []
        for sub in self.directory.iterdir():
            # Only the layer's own directories (two hex digits): the cache directory also
            # holds the default staging directory and backends' kept state.
            if not (len(sub.name) == 2 and _is_hex(sub.name) and sub.is_dir()):
                continue
            for file in sub.iterdir():
                if file.name.endswith(".tmp"):
                    file.unlink(missing_ok=True)
                    continue
                size = self._check_header(file)
                if size is None:
                    self._events["disk_cache_damaged"] += 1
                    file.unlink(missing_ok=True)
                    continue
                found.append((file.stat().st_atime_ns, bytes.fromhex(file.name), size))
        self._whole_dir.mkdir(exist_ok=True)
        for atime, record, size in whole_files.load(self._whole_dir):
            self._wholes[record.digest] = record
            found.append((atime, record.digest, size))
        for _, digest, size in sorted(found):
            self._index[digest] = size
            self._bytes += size
        self._evict(0)  # a smaller --cache-size than last time: shed the oldest blocks now
        log.info("disk cache %s: %d blocks, %d bytes", self.directory, len(self._index),
                 self._bytes)

    @staticmethod
    def _check_header(file: Path) -> int | None:
        """The file's size if its header is sound for its name and length, else None."""
        try:
            with open(file, "rb") as f:
                header = f.read(HEADER.size)
            size = file.stat().st_size
        except OSError:
            return None
        if len(header) != HEADER.size:
            return None
        magic, digest, _crc, length = HEADER.unpack(header)
        if magic != MAGIC or digest.hex() != file.name or length + HEADER.size != size:
            return None
        return size

    # -- the layer ---------------------------------------------------------------------------

    async def get(self, key: Hashable) -> bytes | None:
        digest = self.digest(key)
        if digest in self._index:
            data = await trio.to_thread.run_sync(self._read, digest, limiter=self._limiter)
        elif (record := self._in_whole(key)) is not None:
            data = await trio.to_thread.run_sync(self._read_whole_block, record, key[2],
                                                 limiter=self._limiter)
        else:
            self._counters["misses"] += 1
            return None
        if data is None:
            self._counters["misses"] += 1
        else:
            self._counters["hits"] += 1
        return data

    async def put(self, key: Hashable, data: bytes | memoryview) -> None:
        digest = self.digest(key)
        if digest in self._index:
            return
        await trio.to_thread.run_sync(self._write, digest, data, limiter=self._limiter)

    def discard(self, key: Hashable) -> None:
        """Forget a block (and the whole file holding it)."""
        self._forget(self.digest(key), unlink=True)
        record = self._in_whole(key)
        if record is not None:
            self._forget(record.digest, unlink=True)

    def drop(self) -> None:
        with self._lock:  # unlinked before the bytes count as free (see _evict)
            for digest in self._index:
                self._unlink(digest)
            self._bytes -= sum(self._index.values())
            self._index.clear()
        self._counters["drops"] += 1

    # -- blocking parts (worker threads) ------------------------------------------------------

    def _read(self, digest: bytes) -> bytes | None:
        file = self._file(digest)
        try:
            with open(file, "rb") as f:
                raw = f.read()
        except OSError:
            self._forget(digest)
            return None
        ok = len(raw) >= HEADER.size
        if ok:
            magic, stored, crc, length = HEADER.unpack_from(raw)
            data = raw[HEADER.size:]
            ok = (magic == MAGIC and stored == digest and length == len(data)
                  and zlib.crc32(data) == crc)
        if not ok:
            self._events["disk_cache_corrupt"] += 1
            log.warning("disk cache: block %s is damaged: deleted, fetching it again",
                        file.name[:16])
            self._forget(digest, unlink=True)
            return None
        self._touch(digest)
        return data

    def _read_whole_block(self, record: WholeFile, index: int) -> bytes | None:
        data = whole_files.read_block(self._whole_dir, record, index)
        if data is None:
            self._damaged(record)
            return None
        self._touch(record.digest)
        return data

    def _damaged(self, record: WholeFile) -> None:
        """A whole file failed its check: counted, logged and deleted (read again from the
        catalog)."""
        self._events["disk_cache_corrupt"] += 1
        log.warning("disk cache: whole file %s is damaged: deleted, fetching it again",
                    record.digest.hex()[:16])
        self._forget(record.digest, unlink=True)

    def _touch(self, digest: bytes) -> None:
        with self._lock:
            if digest in self._index:
                self._index.move_to_end(digest)

    # -- whole files (blocking: worker threads) -----------------------------------------------

    def seal(self, path: str, version: str, size: int,
             verify: tuple[str, str, Digest] | None = None) -> bool:
        """Make the blocks of this content, all here and each CRC checked, one whole file
        that stands for them from now on. ``verify``: ``(algorithm, expected value, a fresh
        hash of it)``: the copy must match the catalog's checksum, which its record then
        holds; a copy that does not is never sealed, and its blocks are deleted. False,
        with nothing sealed, when a block is missing or damaged, the copy does not match,
        or the limits leave no room for it."""
        digest = self.whole_digest(path, version)
        if digest in self._wholes:
            return True
        count = -(-size // self.block_size)
        keys = [self.digest((path, version, index)) for index in range(count)]
        if size <= 0 or not all(key in self._index for key in keys):
            return False
        reserved = size + 64 + 12 * count  # the record's size is about this
        if not self._evict(reserved):
            self._events["disk_cache_full"] += 1
            return False
        target = whole_files.data_file(self._whole_dir, digest)
        tmp = target.with_name(f"{target.name}.{threading.get_ident()}.tmp")
        crcs = []
        try:
            with open(tmp, "wb") as f:
                for key in keys:
                    data = self._read(key)
                    if data is None or len(data) != min(self.block_size,
                                                        size - len(crcs) * self.block_size):
                        raise OSError(0, "a block is gone")
                    crcs.append(zlib.crc32(data))
                    if verify is not None:
                        verify[2].update(data)
                    f.write(data)
            checksums = {} if verify is None else whole_files.normal_checksums(
                {verify[0]: verify[1]})
            if checksums and verify[2].hexdigest() != checksums[verify[0]]:  # type: ignore[index]
                self._events["disk_cache_seal_mismatch"] += 1
                log.warning("disk cache: blocks of %s do not match its %s: deleted", path,
                            verify[0])  # type: ignore[index]
                for key in keys:
                    self._forget(key, unlink=True)
                raise OSError(0, "mismatch")
            os.replace(tmp, target)
            record = WholeFile(digest, size, self.block_size, crcs, checksums,
                               whole_files.identity_of(target))
            stored = size + whole_files.write_record(self._whole_dir, record)
        except OSError as exc:
            if exc.errno:
                log.warning("disk cache: cannot seal a whole file: %s", exc.strerror)
            with contextlib.suppress(OSError):
                tmp.unlink()
            with contextlib.suppress(OSError):
                target.unlink()
            self._release(reserved)
            return False
        with self._lock:
            self._bytes += stored - reserved
            self._index[digest] = stored
            self._wholes[digest] = record
        for key in keys:  # the whole file stands for them now
            self._forget(key, unlink=True)
        self._events["disk_cache_sealed"] += 1
        return True

    def vouch(self, path: str, version: str, checksums: dict[str, str]) -> None:
        """This content passed ``checksums`` (in a mount after the one that sealed it
        without them, e.g. with ``--no-verify``): its whole file's record says so."""
        record = self.whole(path, version)
        if record is None or not checksums or record.checksums:
            return
        record.checksums = whole_files.normal_checksums(checksums)
        with contextlib.suppress(OSError):
            whole_files.write_record(self._whole_dir, record)

    def backing_file(self, path: str, version: str, checksums: dict[str, str]) -> int | None:
        """A read-only descriptor of this content's whole file for the kernel to read
        itself, if it was sealed, verified against ``checksums`` (the catalog's now), and
        passes :func:`~rucio_fs.cache.whole_files.check`; else None (a file that fails the
        check is deleted)."""
        record = self.whole(path, version)
        if record is None or not record.covers(checksums):
            return None
        if not whole_files.check(self._whole_dir, record):
            self._damaged(record)
            return None
        try:
            fd = os.open(whole_files.data_file(self._whole_dir, record.digest), os.O_RDONLY)
        except OSError:
            self._forget(record.digest, unlink=True)
            return None
        self._touch(record.digest)
        return fd

    def _write(self, digest: bytes, data: bytes | memoryview) -> None:
        size = HEADER.size + len(data)
        if size > self.max_bytes:
            self._counters["too_large"] += 1
            return
        if not self._evict(size):
            self._events["disk_cache_full"] += 1
            return
        file = self._file(digest)
        tmp = file.with_name(file.name + f".{threading.get_ident()}.tmp")
        try:
            file.parent.mkdir(exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(HEADER.pack(MAGIC, digest, zlib.crc32(data), len(data)))
                f.write(data)
            os.replace(tmp, file)
        except OSError as exc:
            log.warning("disk cache: cannot store a block: %s", exc.strerror)
            with contextlib.suppress(OSError):
                tmp.unlink()
            self._release(size)
            return
        with self._lock:
            if digest in self._index:  # a concurrent put of the same block: one file, counted once
                self._bytes -= size
            else:
                self._index[digest] = size
        self._counters["stores"] += 1

    def _evict(self, incoming: int) -> bool:
        """Make room for ``incoming`` bytes (reserved on success) within both limits.

        Victims are unlinked under the lock: space counted as free must already be free on
        disk, or a concurrent writer could fill it while a victim's file still exists.
        """
        try:
            st = os.statvfs(self.directory)
            free = st.f_bavail * st.f_frsize
        except OSError:
            free = 0
        evicted = 0
        with self._lock:
            def fits() -> bool:
                return (self._bytes + incoming <= self.max_bytes
                        and free - incoming >= self.free_floor)

            while self._index and not fits():
                digest, size = self._index.popitem(last=False)
                self._unlink(digest)
                self._bytes -= size
                free += size
                evicted += 1
            ok = fits()
            if ok:
                self._bytes += incoming
        if evicted:
            self._events["disk_cache_evicted"] += evicted
        return ok

    def _release(self, size: int) -> None:
        with self._lock:
            self._bytes -= size

    def _forget(self, digest: bytes, unlink: bool = False) -> None:
        with self._lock:
            size = self._index.pop(digest, None)
            if unlink:  # before the bytes count as free (see _evict)
                self._unlink(digest)
            if size is not None:
                self._bytes -= size

    def _unlink(self, digest: bytes) -> None:
        """Delete the files of an entry (call with the lock held)."""
        if self._wholes.pop(digest, None) is not None:
            whole_files.record_file(self._whole_dir, digest).unlink(missing_ok=True)
            whole_files.data_file(self._whole_dir, digest).unlink(missing_ok=True)
        else:
            self._file(digest).unlink(missing_ok=True)


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)
