"""Files being written: staged on local disk, handed to the backend at flush.

Contract:

* A :class:`DirtyFile` holds one file's new content in a staging file, which is the truth
  until the backend has committed it; reads of the file are served from it meanwhile.
* A file written from empty by appends streams to the backend as parts while the writer is
  still writing. The parts of all files on their way share the uploads' share of the memory
  limit (:mod:`rucio_fs.budget`); a writer waits when it is spent. A write or truncate
  below what was already streamed abandons the streamed parts; the staged file is then
  uploaded whole at commit.
* ``commit`` (flush, fsync, close) uploads, then has the backend confirm that the server holds
  the object with the size and version sent (:meth:`Backend.confirm`), and raises on any
  failure or unknown outcome, so ``close`` reports it. The staged data stays and the next
  commit tries again. A file still dirty at its last close
  stays *pending* (``rucio-fs uploads`` lists it) until a commit succeeds or it is discarded.
  Pending files are retried on their own, with backoff, until the server takes them.
* A staging file's *record* (a ``.json`` sidecar naming the mount URL, the path and what the
  content replaces) exists from the moment the file holds data the server does not have, so
  a daemon killed at any point leaves nothing unaccounted for: a new mount of the same URL
  with the same staging directory adopts the recorded files as pending and uploads them. A
  staging file is locked (``flock``) by the daemon that writes it; an unlocked one without a
  record holds nothing pending and is removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING

import trio

from .backend import Entry, Kind, Upload
from .budget import ByteBudget, Shares
from .errors import RucioFsError, Unavailable

if TYPE_CHECKING:
    from .catalog import Catalog

log = logging.getLogger(__name__)

#: The most parts an upload may have (S3's limit); larger files get larger parts.
MAX_PARTS = 10_000
#: Bytes copied per step when a file's old content is staged before modifying it.
COPY_CHUNK = 8 << 20
#: Seconds between retries of pending uploads: the first, and the most (doubling between).
RETRY_FIRST, RETRY_MAX = 2.0, 120.0
#: An unlocked staging file without a record is removed once it is this old (seconds): a
#: daemon of an older version neither locks nor records its files while it writes them.
UNRECORDED_GRACE = 60.0


def _pread_exact(fd: int, offset: int, size: int) -> bytes:
    data = os.pread(fd, size, offset)
    if len(data) != size:  # the staging file is ours alone: this is a local disk failure
        raise Unavailable(f"staging file: read {len(data)} of {size} bytes at {offset}")
    return data


class DirtyFile:
    """One file's pending content. Every method runs on the trio loop; mutations hold
    ``lock``, so a commit uploads a consistent snapshot."""

    def __init__(self, writeback: WriteBack, path: str, base: Entry | None,
                 staged: tuple[str, int] | None = None) -> None:
        self.wb = writeback
        self.path = path
        #: The committed entry this content replaces (None: the file is new).
        self.base = base
        self.staging_path, self.fd = staged or writeback.new_staging_file()
        #: Whether the record (sidecar) of pending content is written.
        self.recorded = False
        self.size = 0
        #: Whether the staging file holds the whole content (else: the base's, unread).
        self.materialized = base is None or base.size == 0
        self.dirty = base is None
        self.writers = 0
        self.unlinked = False
        self.mtime_ns = time.time_ns()
        self.error: str = ""
        self.lock = trio.Lock()
        self._generation = next(writeback.generations)
        # Streaming upload state: parts [0, frontier) are on their way or stored.
        self.streaming = self.materialized
        self.frontier = 0
        self._upload: Upload | None = None
        #: The upload whose commit returned, until the server confirms it.
        self._committed: Upload | None = None
        self._next_part = 1
        self._in_flight = 0
        self._parts_done = trio.Event()
        self._part_error: BaseException | None = None
        self._file_slots = trio.Semaphore(max(1, writeback.catalog.upload_parallelism))

    # -- what the FUSE layer sees ---------------------------------------------------------

    def entry(self) -> Entry:
        """The file's attributes as they are locally."""
        name = self.path.rpartition("/")[2]
        size = self.size if self.materialized else (self.base.size if self.base else 0)
        base = self.base or Entry(name=name, kind=Kind.FILE)
        return replace(base, name=name, size=size, mtime_ns=self.mtime_ns, immutable=False,
                       version=f"local:{self._generation}:{self.mtime_ns}:{size}",
                       checksums={})

    def read(self, offset: int, size: int) -> bytes | None:
        """Bytes of the local content, or None while it is still the base's (read that)."""
        if not self.materialized:
            return None
        size = min(size, self.size - offset)
        return os.pread(self.fd, size, offset) if size > 0 else b""

    # -- changes --------------------------------------------------------------------------

    async def write(self, offset: int, data: bytes | memoryview) -> int:
        async with self.lock:
            await self._materialize()
            self.record()
            written = os.pwrite(self.fd, data, offset)
            if offset < self.frontier:
                await self.stop_streaming("a write below the streamed part")
            self.size = max(self.size, offset + written)
            self._touch()
            await self._stream_parts(final=False)
            return written

    async def truncate(self, size: int) -> None:
        async with self.lock:
            if size == 0:
                await self.stop_streaming("")
                self.materialized = self.streaming = True
            else:
                await self._materialize()
                if size < self.frontier:
                    await self.stop_streaming("a truncate below the streamed part")
            self.record()
            os.ftruncate(self.fd, size)
            self.size = size
            self._touch()

    def set_mtime(self, mtime_ns: int) -> None:
        self.mtime_ns = mtime_ns

    # -- the record of pending content ---------------------------------------------------

    def record(self, again: bool = False) -> None:
        """Write the record of this pending content (before the data it accounts for);
        ``again``: also when it is written already (it changed)."""
        if (self.recorded and not again) or self.fd < 0:
            return
        base = self.base
        fields = {"url": self.wb.url, "path": self.path, "size": self.size,
                  "error": self.error,
                  "base": None if base is None else {"size": base.size, "version": base.version,
                                                     "mtime_ns": base.mtime_ns}}
        temporary = self.staging_path + ".json.tmp"
        with open(temporary, "w") as sidecar:
            json.dump(fields, sidecar)
        os.replace(temporary, self.staging_path + ".json")
        self.recorded = True

    def rerecord(self) -> None:
        """The record changes (the path moved, an error to note): write it again."""
        if self.recorded:
            self.record(again=True)

    def unrecord(self) -> None:
        """Nothing pending any more: the record goes (the staging file may stay)."""
        if self.recorded:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.staging_path + ".json")
            self.recorded = False

    def _touch(self) -> None:
        self.dirty = True
        self.error = ""
        self.mtime_ns = time.time_ns()
        self._generation = next(self.wb.generations)

    async def _materialize(self) -> None:
        """Copy the base's content into the staging file before it is modified."""
        if self.materialized:
            return
        assert self.base is not None
        catalog, base = self.wb.catalog, self.base
        handle = await catalog.open(self.path, base)
        try:
            for offset in range(0, base.size, COPY_CHUNK):
                data = await catalog.data_path.read(self.path, base, handle, offset,
                                                    min(COPY_CHUNK, base.size - offset))
                os.pwrite(self.fd, data, offset)
        finally:
            await catalog.close(handle)
        self.size = base.size
        self.materialized = True
        self.streaming = False

    # -- uploading ------------------------------------------------------------------------

    async def commit(self) -> Entry | None:
        """Upload the content if it changed; returns the new entry (None: nothing to do).
        Raises the upload's error; the content stays staged for the next try."""
        async with self.lock:
            if not self.dirty or self.unlinked:
                return None
            try:
                sent = await self._upload_content()
                committed, self._committed = self._committed, None
                # Retried or not, the staged copy goes only once the server proves it holds
                # what was sent.
                try:
                    entry = await self.wb.catalog.confirm(self.path, sent)
                except RucioFsError:
                    if committed is not None:
                        await _best_effort(committed.release_unconfirmed, self.path,
                                           "releasing an unconfirmed upload")
                    raise
            except RucioFsError as exc:
                self.error = str(exc)
                self.rerecord()
                raise
            except trio.Cancelled:
                await self.stop_streaming("")
                raise
            # The new content is stored: further writes start over from the staged file.
            self.base = replace(entry, name=self.path.rpartition("/")[2])
            self.dirty = self.streaming = False
            self.unrecord()
            self.wb.catalog.note_entry(self.path, self.base)
            return self.base

    async def _upload_content(self) -> Entry:
        catalog = self.wb.catalog
        if self._upload is not None and self.streaming:
            try:
                return await self._finish_parts()
            except RucioFsError as exc:
                log.info("%s: streamed upload failed (%s); uploading the staged file whole",
                         self.path, exc)
        await self.stop_streaming("")
        if self.size <= catalog.single_put_max:
            data = await trio.to_thread.run_sync(_pread_exact, self.fd, 0, self.size)
            return await catalog.put(self.path, data)
        return await self._finish_parts()

    def _part_size(self, number: int) -> int:
        """Parts grow with the file so that any size fits in :data:`MAX_PARTS`."""
        base = self.wb.catalog.upload_part_size
        return base << min((number - 1) // (MAX_PARTS // 10), 20)

    async def _stream_parts(self, final: bool) -> None:
        """Send every complete part past the frontier (and, if ``final``, the rest)."""
        if not self.streaming:
            return
        if self._part_error is not None and not final:
            await self.stop_streaming(f"a part failed: {self._part_error}")
            return
        while True:
            remaining = self.size - self.frontier
            part = self._part_size(self._next_part)
            if remaining < part and not (final and (remaining > 0 or self._next_part == 1)):
                return
            if self._upload is None:
                if not final and self.size <= self.wb.catalog.single_put_max:
                    return
                try:
                    self._upload = await self.wb.catalog.begin_upload(self.path)
                except RucioFsError as exc:
                    await self.stop_streaming(f"begin failed: {exc}")
                    if final:
                        raise
                    return
            length = min(part, remaining)
            await self._file_slots.acquire()
            await self.wb.part_bytes.acquire(length)
            self._in_flight += 1
            self.wb.spawn(self._send_part, self._upload, self._next_part, self.frontier, length)
            self._next_part += 1
            self.frontier += length
            if final and self.frontier >= self.size:
                return

    async def _send_part(self, upload: Upload, number: int, offset: int, length: int) -> None:
        try:
            data = await trio.to_thread.run_sync(_pread_exact, self.fd, offset, length)
            await self.wb.catalog.write_part(upload, number, offset, data)
        except Exception as exc:  # reported by the commit that waits for this part
            if self._part_error is None:
                self._part_error = exc
        finally:
            self.wb.part_bytes.release(length)
            self._file_slots.release()
            self._in_flight -= 1
            done, self._parts_done = self._parts_done, trio.Event()
            done.set()

    async def _wait_parts(self) -> None:
        while self._in_flight:
            await self._parts_done.wait()

    async def _finish_parts(self) -> Entry:
        if self._upload is None:  # a whole upload of the staged file
            self.frontier, self._next_part = 0, 1
        self.streaming = True
        await self._stream_parts(final=True)
        await self._wait_parts()
        upload, self._upload = self._upload, None
        assert upload is not None
        error, self._part_error = self._part_error, None
        if error is not None:
            await _abort(upload, self.path)
            self.streaming = False
            if isinstance(error, RucioFsError):
                raise error
            raise Unavailable(f"{self.path}: part upload failed: {error!r}") from error
        try:
            entry = await self.wb.catalog.commit_upload(upload, self.size)
            self._committed = upload
            return entry
        except BaseException:
            await _abort(upload, self.path)
            self.streaming = False
            raise

    async def stop_streaming(self, why: str) -> None:
        """Abandon streamed parts; the next commit uploads the staged file whole."""
        if why and self._upload is not None:
            log.debug("%s: streaming stopped (%s)", self.path, why)
        await self._wait_parts()
        upload, self._upload = self._upload, None
        self._part_error = None
        if upload is not None:
            await _abort(upload, self.path)
        self.frontier, self._next_part, self.streaming = 0, 1, False

    def close_staging(self, keep: bool) -> None:
        """Close the staging file; delete it and its record unless ``keep`` (then its record
        says what it holds, for the next mount to adopt)."""
        if keep:
            self.record(again=True)
        else:
            self.unrecord()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if not keep:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.staging_path)


async def _best_effort(step: Callable[[], Awaitable[None]], path: str, what: str) -> None:
    """Run a clean-up ``step`` of an upload of ``path`` for at most 30 s; it never raises
    (it runs on error paths), a failure is logged as ``what`` failed."""
    with trio.move_on_after(30) as scope:
        try:
            await step()
        except Exception as exc:
            log.warning("%s: %s failed: %s", path, what, exc)
    if scope.cancelled_caught:
        log.warning("%s: %s timed out", path, what)


async def _abort(upload: Upload, path: str) -> None:
    await _best_effort(upload.abort, path, "aborting an upload")


class WriteBack:
    """The files of one mount that are being written or wait for a successful upload,
    by catalog path (renames re-key them)."""

    def __init__(self, catalog: Catalog, staging_dir: str, url: str) -> None:
        self.catalog = catalog
        self.url = url
        self.staging_dir = staging_dir
        #: Files with content local to this mount, by path; the catalog overlays them.
        self.files: dict[str, DirtyFile] = {}
        catalog.overlay = self
        #: Bytes of parts on their way, all files together.
        self.part_bytes = ByteBudget(Shares(catalog.config.memory_limit).uploads)
        self.generations = itertools.count(1)
        #: Where part uploads run; set by the daemon.
        self.nursery: trio.Nursery | None = None
        self._names = itertools.count(1)

    def spawn(self, fn, *args) -> None:  # type: ignore[no-untyped-def]
        assert self.nursery is not None, "WriteBack.nursery is not set"
        self.nursery.start_soon(fn, *args)

    def new_staging_file(self) -> tuple[str, int]:
        """A new, empty staging file, locked by this daemon: (path, fd)."""
        os.makedirs(self.staging_dir, mode=0o700, exist_ok=True)
        while True:
            path = os.path.join(self.staging_dir, f"{os.getpid()}-{next(self._names)}.data")
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                continue
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return path, fd

    def adopt(self) -> list[DirtyFile]:
        """Take over the recorded staging files of this URL that no live daemon holds (left by
        a daemon that was killed, or kept at an unmount whose uploads failed): they become
        pending files of this mount. Unlocked staging files without a record are removed."""
        try:
            names = sorted(os.listdir(self.staging_dir))
        except FileNotFoundError:
            return []
        adopted = []
        for name in names:
            if not name.endswith(".data"):
                continue
            path = os.path.join(self.staging_dir, name)
            try:
                fd = os.open(path, os.O_RDWR)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # a live daemon's file
                os.close(fd)
                continue
            dirty = self._adopt_one(path, fd)
            if dirty is None:
                os.close(fd)
            else:
                adopted.append(dirty)
        return adopted

    def _adopt_one(self, path: str, fd: int) -> DirtyFile | None:
        try:
            with open(path + ".json") as sidecar:
                record = json.load(sidecar)
        except FileNotFoundError:
            if os.path.getmtime(path) < time.time() - UNRECORDED_GRACE:
                # Nothing pending (a crash after its upload, or before it held data).
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            return None
        except (OSError, ValueError) as exc:
            log.error("%s: unreadable record of a staged file (%s): left as it is", path, exc)
            return None
        if record.get("url") != self.url or record.get("path") in self.files:
            return None
        base_fields = record.get("base")
        name = str(record["path"]).rpartition("/")[2]
        base = None if not base_fields else Entry(
            name=name, kind=Kind.FILE, size=int(base_fields.get("size", 0)),
            version=str(base_fields.get("version", "")),
            mtime_ns=int(base_fields.get("mtime_ns", 0)))
        dirty = DirtyFile(self, str(record["path"]), base, staged=(path, fd))
        dirty.size = os.fstat(fd).st_size
        dirty.materialized, dirty.dirty, dirty.recorded = True, True, True
        dirty.streaming = False
        dirty.error = str(record.get("error") or "adopted from an earlier mount")
        self.files[dirty.path] = dirty
        if base is None:
            self.catalog.note_entry(dirty.path, dirty.entry())
        log.warning("%s: pending upload of %d bytes adopted from %s", dirty.path, dirty.size,
                    path)
        return dirty

    async def run_retries(self) -> None:
        """Retry pending uploads on their own, backing off while they keep failing (a task
        of the daemon's nursery)."""
        delay = RETRY_FIRST
        while True:
            await trio.sleep(delay)
            if not self.pending():
                delay = RETRY_FIRST
                continue
            failed = await self.retry()
            if failed:
                delay = min(delay * 2, RETRY_MAX)
                log.info("%d pending upload(s) failed again; next try in %.0f s",
                         len(failed), delay)
            else:
                delay = RETRY_FIRST

    def open(self, path: str, base: Entry | None) -> DirtyFile:
        """The dirty file of ``path`` (new if none), with one more writer."""
        dirty = self.files.get(path)
        if dirty is None:
            dirty = self.files[path] = DirtyFile(self, path, base)
            if base is None:  # a new name the server does not have yet
                dirty.record()
        dirty.writers += 1
        return dirty

    async def release(self, dirty: DirtyFile, raise_errors: bool = False) -> None:
        """One writer is gone; after the last, upload what is left and forget the file
        (or keep it pending when the upload fails; ``raise_errors``: and raise)."""
        dirty.writers -= 1
        if dirty.writers > 0:
            return
        if dirty.unlinked:
            dirty.close_staging(keep=False)
            return
        try:
            await dirty.commit()
        except RucioFsError as exc:
            log.error("%s: upload failed: %s; the data stays staged in %s and is retried at "
                      "the next close or fsync, or by `rucio-fs uploads --retry`",
                      dirty.path, exc, dirty.staging_path)
            if raise_errors:
                raise
            return
        self._forget(dirty)

    def _forget(self, dirty: DirtyFile) -> None:
        """Done with ``dirty`` (uploaded or discarded), unless a writer opened it again while
        its upload was on its way: then it stays, with its staging file."""
        if dirty.writers > 0:
            return
        if self.files.get(dirty.path) is dirty:
            del self.files[dirty.path]
        dirty.close_staging(keep=False)

    async def unlinked(self, path: str) -> DirtyFile | None:
        """``path`` was removed: its pending content must never be uploaded."""
        dirty = self.files.pop(path, None)
        if dirty is not None:
            dirty.unlinked = True
            async with dirty.lock:
                await dirty.stop_streaming("")
            if dirty.writers == 0:
                dirty.close_staging(keep=False)
        return dirty

    async def renamed(self, old: str, new: str) -> None:
        """Pending files at ``old`` (or below it, for a directory) move to ``new``."""
        below = old + "/"
        for path in [p for p in self.files if p == old or p.startswith(below)]:
            target = new + path[len(old):]
            await self.unlinked(target)
            dirty = self.files.pop(path)
            dirty.path = target
            dirty.rerecord()
            self.files[target] = dirty

    # -- the catalog's overlay: what only this mount holds wins -----------------------------

    def entry(self, path: str) -> Entry | None:
        dirty = self.files.get(path)
        return dirty.entry() if dirty is not None else None

    def children(self, directory: str) -> Iterable[Entry]:
        prefix = directory.rstrip("/") + "/"
        return [dirty.entry() for path, dirty in self.files.items()
                if path.startswith(prefix) and "/" not in path[len(prefix):]]

    def has_below(self, directory: str) -> bool:
        """Whether a file with local content lies below ``directory``."""
        prefix = directory.rstrip("/") + "/"
        return any(path.startswith(prefix) for path in self.files)

    def pending(self) -> list[DirtyFile]:
        """Files with no writer left whose upload failed."""
        return [d for d in self.files.values() if d.writers == 0 and d.dirty]

    async def retry(self) -> list[tuple[str, str]]:
        """Commit every pending file; returns (path, error) of those that failed again."""
        failed = []
        for dirty in self.pending():
            try:
                await dirty.commit()
            except RucioFsError as exc:
                failed.append((dirty.path, str(exc)))
            else:
                self._forget(dirty)
        return failed

    async def discard(self, path: str) -> DirtyFile | None:
        """Drop the pending content of ``path`` (its catalog content stays as it was); the
        discarded file, or None when there is nothing pending to discard (no such file, a
        writer still has it open, or an upload on its way succeeded first)."""
        dirty = self.files.get(path)
        if dirty is None or dirty.writers:
            return None
        dirty.unlinked = True  # no upload may start from now on
        async with dirty.lock:  # and one on its way has finished
            if not dirty.dirty:
                self._forget(dirty)
                return None
        self._forget(dirty)
        self.catalog.note_entry(path, dirty.base)
        return dirty

    async def shutdown(self) -> None:
        """At unmount: one last try for everything dirty; keep (with a sidecar) what fails."""
        for dirty in list(self.files.values()):
            if dirty.fd < 0:
                continue
            try:
                await dirty.commit()
            except RucioFsError as exc:
                dirty.close_staging(keep=True)
                log.error("%s: not uploaded (%s); its data is kept in %s", dirty.path, exc,
                          dirty.staging_path)
            else:
                dirty.close_staging(keep=False)
        self.files.clear()
