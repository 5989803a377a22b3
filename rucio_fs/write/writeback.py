"""Files being written: staged on local disk, handed to the backend at flush.

Contract:

* A :class:`DirtyFile` holds one file's new content locally, which is the truth until the
  backend has committed it; reads of the file are served from it meanwhile. A new file starts
  in a slot of the staging arena (:mod:`rucio_fs.write.arena`); one that outgrows it, or a stored
  file being modified, has a staging file of its own; after an async close with ``--durable
  close``, a small file's content is in the journal (inline) and nowhere else.
* A file written from empty by appends streams to the backend as parts while the writer is
  still writing. The parts of all files on their way share the uploads' share of the memory
  limit (:mod:`rucio_fs.cache.budget`); a writer waits when it is spent. A write or truncate
  below what was already streamed abandons the streamed parts; the staged file is then
  uploaded whole at commit.
* ``commit`` (flush, fsync, close) uploads, then has the backend confirm that the server holds
  the object with the size and version sent (:meth:`Backend.confirm`), and raises on any
  failure or unknown outcome, so ``close`` reports it. The staged data stays and the next
  commit tries again. A file still dirty at its last close
  stays *pending* (``rucio-fs uploads`` lists it) until a commit succeeds or it is discarded.
  Pending files are retried on their own, with backoff, until the server takes them.
* A staging file's *record* (a ``stage`` record of the mount's :mod:`journal
  <rucio_fs.write.journal>` naming the path, the staging file and what the content replaces)
  exists from the moment the file holds data the server does not have, so a daemon killed at
  any point leaves nothing unaccounted for: a new mount of the same URL with the same staging
  directory replays the journal and adopts the staged files as pending. A staging file is
  locked (``flock``) by the daemon that writes it; an unlocked one that no pending record
  names is removed.
* With ``--write-back async`` (:attr:`WriteBack.asynchronous`), ``close`` returns once the
  content and its record are written (a daemon's crash loses neither) and the upload is
  queued (:mod:`rucio_fs.write.write_queue`; the close of a file the mount created may reach
  the daemon only as the RELEASE after it, which queues it: see ``RucioFs.create``); with
  ``--durable close`` also once both are durable (up to :data:`INLINE_MAX`: both in the
  journal, one ``fdatasync``; larger: the staging file and the journal). ``mkdir``,
  ``unlink`` and ``rmdir`` are journaled and queued the same way (not synced: like a local
  file system's, they are durable after an ``fsync`` of their directory), and the mount
  shows the queued state at once (the overlay). ``fsync`` of a file waits for its upload,
  of a directory for every op below it, and unmount for all.

Why one module of this size: a :class:`DirtyFile` and its :class:`WriteBack` keep one
invariant together (a staged file, its journal record and its upload change only in step),
and each reaches into the other on every commit.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import replace
from typing import Any

import trio

from rucio_fs import background
from rucio_fs.backend import (
    DEFAULT_DIRECTORY_MODE,
    NO_ATTRIBUTES,
    Attributes,
    Entry,
    Kind,
    Upload,
)
from rucio_fs.background import start_guarded, survive
from rucio_fs.cache.budget import ByteBudget, Shares
from rucio_fs.catalog.catalog import Catalog, split_path
from rucio_fs.errors import RucioFsError, Unavailable
from rucio_fs.write import journal as journals

from .arena import SLOT_BYTES, Arena, read_slot
from .journal import Journal, ancestors, read_exactly
from .write_queue import REMOVALS, Op, WriteQueue

log = logging.getLogger(__name__)

#: How the content version of a file with pending local content begins.
LOCAL_VERSION = "local:"


def is_local(entry: Entry) -> bool:
    """Whether ``entry`` describes content this mount holds and has not stored yet."""
    return entry.version.startswith(LOCAL_VERSION)


#: The most parts an upload may have (S3's limit); larger files get larger parts.
MAX_PARTS = 10_000
#: Bytes copied per step when a file's old content is staged before modifying it.
COPY_CHUNK = 8 << 20
#: Seconds between retries of pending uploads: the first, and the most (doubling between).
RETRY_FIRST, RETRY_MAX = 2.0, 120.0
#: Staged files up to this size are made durable (async close) by one copy in the journal,
#: without leaving the event loop; larger ones by syncing their staging file in a thread.
INLINE_MAX = SLOT_BYTES
#: An unlocked staging file without a record is removed once it is this old (seconds): a
#: daemon of an older version neither locks nor records its files while it writes them.
UNRECORDED_GRACE = 60.0
#: Seconds a directory's marker, queued because the directory is about to lose a name and
#: has none (:meth:`WriteBack._keep_directory`), waits for the directory's own ``rmdir``.
MARKER_HOLD = 1.0
#: A file time within this many nanoseconds of a look at the file may hide a later write in
#: the same clock tick (file systems without fine-grained times): see DirtyFile.observe.
CLOCK_SLACK_NS = 20_000_000
#: Removals of files a sync mount lets run ahead of ``unlink`` before the next one waits
#: (:attr:`~rucio_fs.backend.Backend.removals_run_ahead`).
REMOVALS_AHEAD = 128


class DirtyFile:
    """One file's pending content. Every method runs on the trio loop; mutations hold
    ``lock``, so a commit uploads a consistent snapshot."""

    # Thousands wait in an async queue: no per-instance dict.
    __slots__ = ("_committed", "_entry", "_file_slots", "_in_flight", "_next_part",
                 "_observed", "_part_error", "_parts_done", "_sent", "_upload", "attributes",
                 "base", "dirty", "error", "fd", "frontier", "generation", "in_journal",
                 "inline", "kernel_writers", "lock", "materialized", "mtime_ns", "op",
                 "parked", "path", "size", "slot", "stage_n", "staged", "staging_path",
                 "streaming", "syncing", "unlinked", "unreported", "wb", "writers")

    def __init__(self, writeback: WriteBack, path: str, base: Entry | None,
                 staged: tuple[str, int] | None = None) -> None:
        self.wb = writeback
        self.path = path
        self._entry: tuple[Any, ...] | None = None
        #: The committed entry this content replaces (None: the file is new).
        self.base = base
        #: Where the content is: a slot of the arena (a new file, until it outgrows the slot
        #: or an async close copies it into the journal), the journal (:attr:`inline`, no
        #: local copy), or else the staging file ``staging_path``.
        self.slot: int | None = None
        self.in_journal = False
        if staged is None and base is None:
            self.staging_path, self.fd = "", -1
            self.slot = writeback.arena.take()
        else:
            self.staging_path, self.fd = staged or writeback.new_staging_file()
        #: Whether the staging file is closed while its upload waits in the queue (its fd is
        #: opened again when needed): a queue of thousands of files holds no descriptors.
        self.parked = False
        #: The journal number of this content's ``stage`` record (None: none is pending).
        self.stage_n: int | None = None
        #: Whether that record carries the content itself (async close of a small file): the
        #: staging file then need not be synced, and a write must record it again first.
        self.inline = False
        #: The queued upload of this content (async write-back), until it is carried out.
        self.op: Op | None = None
        #: The error of a background upload that no close or fsync has returned yet.
        self.unreported = ""
        #: The generation of the content last made durable by :meth:`WriteBack.stage`.
        self.staged = 0
        self.size = 0
        #: Whether the staging file holds the whole content (else: the base's, unread).
        self.materialized = base is None or base.size == 0
        self.dirty = base is None
        self.writers = 0
        self.unlinked = False
        self.mtime_ns = time.time_ns()
        #: Attributes set on this content (``chmod``, ``chown``, ``utimens``; a new file's
        #: mode), which its upload carries; an explicit mtime lasts until the next write.
        self.attributes = NO_ATTRIBUTES
        #: The attributes the upload on its way was started with.
        self._sent = NO_ATTRIBUTES
        self.error: str = ""
        self.lock = trio.Lock()
        self.generation = next(writeback.generations)
        # Streaming upload state: parts [0, frontier) are on their way or stored.
        self.streaming = self.materialized
        self.frontier = 0
        self._upload: Upload | None = None
        #: The upload whose commit returned, until the server confirms it.
        self._committed: Upload | None = None
        self._next_part = 1
        self._in_flight = 0
        #: Closes syncing the staging file through ``fd`` in a worker thread right now.
        self.syncing = 0
        # Made with the first part (most files are one PUT: thousands queue without them).
        self._parts_done: trio.Event | None = None
        self._part_error: BaseException | None = None
        self._file_slots: trio.Semaphore | None = None
        #: Open handles whose writes the kernel makes to the staging file itself (FUSE
        #: passthrough), and what :meth:`observe` last saw of that file.
        self.kernel_writers = 0
        self._observed: tuple[int, int, int, int] = (0, 0, 0, 0)

    # -- what the FUSE layer sees ---------------------------------------------------------

    def entry(self) -> Entry:
        """The file's attributes as they are locally, with what the kernel wrote directly
        (built once per state: the FUSE layer and the catalog's overlay ask for it several
        times per request)."""
        if self.kernel_writers:
            self.observe()
        state = (self.path, self.size, self.mtime_ns, self.dirty, self.materialized,
                 self.generation)
        memo = self._entry
        if (memo is not None and memo[0] == state and memo[1] is self.base
                and memo[2] is self.attributes):
            return memo[3]
        base, attributes = self.base, self.attributes
        name = self.path.rpartition("/")[2]
        size = self.size if self.materialized else (base.size if base else 0)
        # (opened for writing, not written: the stored file's time)
        mtime_ns = self.mtime_ns if self.dirty or base is None else base.mtime_ns
        version = f"{LOCAL_VERSION}{self.generation}:{mtime_ns}:{size}"
        if base is None:  # (most files: no ``replace``, which costs more than the rest)
            entry = Entry(name=name, kind=Kind.FILE, size=size, mtime_ns=mtime_ns,
                          version=version, mode=attributes.mode, uid=attributes.uid,
                          gid=attributes.gid)
        else:
            entry = replace(base, name=name, size=size, mtime_ns=mtime_ns, checksums={},
                            immutable=False, version=version,
                            mode=base.mode if attributes.mode is None else attributes.mode,
                            uid=base.uid if attributes.uid is None else attributes.uid,
                            gid=base.gid if attributes.gid is None else attributes.gid)
        self._entry = (state, base, attributes, entry)
        return entry

    def read(self, offset: int, size: int) -> bytes | None:
        """Bytes of the local content, or None while it is still the base's (read that)."""
        if not self.materialized:
            return None
        size = min(size, self.size - offset)
        return self._read_range(offset, size) if size > 0 else b""

    def _read_range(self, offset: int, size: int) -> bytes:
        """``size`` bytes of the local content at ``offset`` (within :attr:`size`)."""
        if self.slot is not None:
            return self.wb.arena.read(self.slot, offset, size)
        if self.in_journal:
            assert self.stage_n is not None
            record = self.wb.journal.pending[self.stage_n]
            return read_exactly(self.wb.journal.fd, record["_at"] + offset, size)
        self.unpark()
        return read_exactly(self.fd, offset, size)

    @property
    def where(self) -> str:
        """Where the content is, for ``rucio-fs uploads`` and logs."""
        if self.slot is not None:
            return f"{self.wb.arena.path} (slot {self.slot})"
        if self.in_journal:
            return f"{self.wb.journal.path} (record {self.stage_n})"
        return self.staging_path

    @property
    def is_open(self) -> bool:
        """Whether this content is still held locally (not dropped after its upload)."""
        return self.fd >= 0 or self.parked or self.slot is not None or self.in_journal

    def park(self) -> None:
        """Free what no writer needs while the upload is queued: close the staging file (a
        queue of thousands of files holds no descriptors), give back a slot whose content
        the journal holds."""
        if self.writers or self._in_flight or self.syncing:
            return  # parts on their way (or a sync) use the staging file's descriptor
        if self.fd >= 0:
            os.close(self.fd)
            self.fd, self.parked = -1, True
        elif self.slot is not None and self.inline:
            self.wb.arena.give_back(self.slot)
            self.slot, self.in_journal = None, True

    def unpark(self) -> None:
        if self.parked:
            self.fd = os.open(self.staging_path, os.O_RDWR)
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self.parked = False

    def _write_range(self, offset: int, data: bytes | memoryview) -> int:
        if self.slot is None:
            return os.pwrite(self.fd, data, offset)
        if offset > self.size:  # a hole reads as zeros, also in a slot that held a file
            self.wb.arena.write(self.slot, self.size, bytes(offset - self.size))
        written = self.wb.arena.write(self.slot, offset, data)
        if offset + written > self.size:
            self.wb.arena.set_length(self.slot, offset + written)
        return written

    def _to_staging_file(self, sync: bool) -> None:
        """Move the content from its slot or the journal into a staging file of its own
        (it outgrows the slot, or is written again after an async close: then, ``sync``, the
        staging file is synced first, as it takes over as the durable copy of the content
        the journal holds inline)."""
        if self.slot is None and not self.in_journal:
            return
        content = self._read_range(0, self.size) if self.materialized else b""
        path, fd = self.wb.new_staging_file()
        os.pwrite(fd, content, 0)
        if sync:
            os.fdatasync(fd)
        if self.slot is not None:
            self.wb.arena.give_back(self.slot)
        self.staging_path, self.fd, self.slot, self.in_journal = path, fd, None, False
        if self.stage_n is not None:
            self.record(again=True)

    # -- changes --------------------------------------------------------------------------

    async def write(self, offset: int, data: bytes | memoryview) -> int:
        async with self.lock:
            await self._materialize()
            self._before_change(offset + len(data))
            self.record()
            written = self._write_range(offset, data)
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
            self._before_change(size)
            self.record()
            if self.slot is None:
                os.ftruncate(self.fd, size)
            elif size > self.size:  # zeros, as for a file (the slot may hold old bytes)
                self._write_range(self.size, bytes(size - self.size))
            else:
                self.wb.arena.set_length(self.slot, size)
            self.size = size
            self._touch()

    def set_attributes(self, attributes: Attributes) -> None:
        """Set attributes of the pending content; its upload carries them (and a crash
        keeps them: the record is written again). Hold :attr:`lock`."""
        self.observe()  # (a write the kernel made before this change goes first)
        self.attributes = self.attributes.then(attributes)
        if attributes.mtime_ns is not None:
            self.mtime_ns = attributes.mtime_ns
        self.generation = next(self.wb.generations)  # shown afresh, staged afresh
        if self.stage_n is not None:
            self.rerecord()

    # -- the record of pending content ---------------------------------------------------

    @property
    def recorded(self) -> bool:
        return self.stage_n is not None

    def record(self, again: bool = False, inline: bytes | None = None) -> None:
        """Journal that this staging file holds content of the path the server does not have
        (before the data it accounts for); ``again``: also when it is journaled already (the
        path changed, or the content is about to: the new record supersedes the old one);
        ``inline``: the record carries this content (see :attr:`inline`)."""
        if (self.stage_n is not None and not again) or not self.is_open or self.unlinked:
            return  # (a removed file's content is never to be uploaded, nor adopted)
        base = self.base
        old, self.stage_n = self.stage_n, self.wb.journal.append({
            "op": "stage", "path": self.path, **self._location(inline is not None),
            "base": None if base is None else {"size": base.size, "version": base.version,
                                               "mtime_ns": base.mtime_ns},
            **self.attributes.as_record()}, inline)
        self.inline = inline is not None
        if old is not None:
            self.wb.journal.done(old, carried_out=False)  # superseded by the new record
        if self.op is not None:
            self.op.n = self.stage_n

    def _before_change(self, end: int) -> None:
        """Before the content changes (up to ``end``): content copied into the journal by an
        async close, or growing past its slot, moves to a staging file (synced first when it
        takes over as the durable copy of what the journal holds inline: a write after an
        async close, rare). A staging file parked while its upload waits is opened again:
        a change may come by path (``truncate``) with no descriptor open."""
        self.unpark()
        self.observe()
        if not self.dirty:
            # Attributes held back for a rename to carry go with the new content instead
            # (stored after it, a held time would undo the write's).
            self.attributes = self.wb.fold_held_attributes(self.path).then(self.attributes)
        if self.in_journal or (self.slot is not None and (self.inline or end > SLOT_BYTES)):
            self._to_staging_file(sync=self.inline)
        elif self.inline:
            os.fdatasync(self.fd)
            self.record(again=True)

    def _location(self, inline: bool) -> dict[str, Any]:
        """What a record says of where the content is (an inline record carries it)."""
        if inline:
            return {}
        if self.slot is not None:
            return {"file": self.wb.arena.name, "slot": self.slot}
        return {"file": os.path.basename(self.staging_path)}

    def rerecord(self) -> None:
        """The path moved: journal it again."""
        if self.stage_n is not None:
            self.record(again=True, inline=(self._read_range(0, self.size)
                                            if self.inline else None))

    def unrecord(self, uploaded: bool = False) -> None:
        """Nothing pending any more (``uploaded``: the server has it; else the content was
        dropped): the record is done (the staging file may stay)."""
        if self.stage_n is not None:
            self.wb.journal.done(self.stage_n, carried_out=uploaded)
            self.stage_n = None
            self.inline = False
        if self.in_journal:  # the content went with its record
            self.in_journal = False
            if self.writers:  # reopened meanwhile: read the server's copy, write a slot
                self.slot, self.materialized = self.wb.arena.take(), False

    def _touch(self) -> None:
        self.dirty = True
        self.error = ""
        self.mtime_ns = time.time_ns()
        if self.attributes.mtime_ns is not None:  # written after `touch -d`: now, as anywhere
            self.attributes = replace(self.attributes, mtime_ns=None)
        self.generation = next(self.wb.generations)

    async def _materialize(self) -> None:
        """Copy the base's content into the staging file before it is modified."""
        if self.materialized:
            return
        assert self.base is not None
        catalog, base = self.wb.catalog, self.base
        if self.slot is not None and base.size > SLOT_BYTES:
            self._to_staging_file(sync=False)
        handle = await catalog.open(self.path, base)
        try:
            for offset in range(0, base.size, COPY_CHUNK):
                data = await catalog.data_path.read(self.path, base, handle, offset,
                                                    min(COPY_CHUNK, base.size - offset))
                self._write_range(offset, data)
        finally:
            await catalog.close(handle)
        self.size = base.size
        self.materialized = True
        self.streaming = False

    # -- passthrough: the kernel writes the staging file itself -------------------------

    async def hand_to_kernel(self, writer: bool) -> int:
        """Make the content a staging file of its own for the kernel to read and write
        directly (FUSE passthrough): out of the arena or the journal, streaming stopped, its
        record naming the file, so a crash keeps what the kernel wrote there. Returns the
        file's descriptor; ``writer``: the handle may write (:meth:`observe` then looks for
        its writes until :meth:`kernel_writer_gone`). Content still only on the server is
        fetched first."""
        async with self.lock:
            self.unpark()
            await self._materialize()
            await self.stop_streaming("")
            if self.slot is not None:
                self._to_staging_file(sync=self.inline)
            self._before_change(self.size)
            self.record()
            if writer:
                if not self.kernel_writers:
                    self._observed = self._look()
                self.kernel_writers += 1
            return self.fd

    def kernel_writer_gone(self) -> None:
        """A handle :meth:`hand_to_kernel` gave for writing is closed (after its flush)."""
        self.observe()
        self.kernel_writers -= 1

    def _look(self) -> tuple[int, int, int, int]:
        """(size, mtime, ctime, when looked) of the staging file."""
        st = os.fstat(self.fd)
        return st.st_size, st.st_mtime_ns, st.st_ctime_ns, time.time_ns()

    def observe(self) -> None:
        """Learn what the kernel wrote to the staging file since the last look, while a
        handle writes there directly: a changed size or file time is a write, made at that
        time (the time a ``touch -d`` set goes, as with any write). A look within
        :data:`CLOCK_SLACK_NS` of the file's last change cannot rule out a write in the same
        clock tick (file systems without fine-grained times): the content is then taken as
        new (staged and uploaded again), its times kept."""
        if not self.kernel_writers:
            return
        self.unpark()
        size, mtime_ns, ctime_ns, _when = looked = self._look()
        old_size, old_mtime_ns, old_ctime_ns, looked_at = self._observed
        self._observed = looked
        if (size, mtime_ns, ctime_ns) != (old_size, old_mtime_ns, old_ctime_ns):
            self.size = size
            self._touch()
            self.mtime_ns = mtime_ns
        elif old_ctime_ns + CLOCK_SLACK_NS >= looked_at:
            self.dirty = True
            self.generation = next(self.wb.generations)

    # -- uploading ------------------------------------------------------------------------

    async def commit(self) -> Entry | None:
        """Upload the content if it changed; returns the new entry (None: nothing to do).
        Raises the upload's error; the content stays staged for the next try."""
        async with self.lock:
            self.observe()
            if not self.dirty or self.unlinked:
                return None
            self.unpark()
            try:
                if not self.wb.asynchronous:  # (async: the queue orders them)
                    await self.wb.removals_first(self.path)
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
                raise
            except trio.Cancelled:
                await self.stop_streaming("")
                raise
            entry = await self._store_attributes(entry)
            # The new content is stored: further writes start over from the staged file.
            self.base = replace(entry, name=self.path.rpartition("/")[2])
            self.dirty = self.streaming = False
            self.unreported = ""
            self.unrecord(uploaded=True)
            self.wb.catalog.note_entry(self.path, self.base)
            return self.base

    def _upload_attributes(self) -> Attributes:
        """What the upload carries: the attributes set here, over the replaced file's own (a
        catalog that replaces an object's metadata with its content must not lose them), and
        the time of the last write where none was set and the catalog stores it for nothing
        (:attr:`~rucio_fs.backend.Backend.stores_write_times`)."""
        base = self.base
        carried = (self.attributes if base is None else
                   Attributes(mode=base.mode, uid=base.uid, gid=base.gid).then(self.attributes))
        if carried.mtime_ns is None and self.wb.catalog.stores_write_times:
            carried = replace(carried, mtime_ns=self.mtime_ns)
        return carried

    async def _store_attributes(self, entry: Entry) -> Entry:
        """After the content is confirmed: attributes set after its upload began are stored
        now; those the backend does not store are kept for the mount's life."""
        catalog, wanted = self.wb.catalog, self.attributes
        later = wanted.unlike(self._sent)
        if later:
            entry = await catalog.set_attributes(self.path, entry, later)
        catalog.stored_attributes(self.path, wanted, entry)
        return wanted.missing_from(entry).applied_to(entry)

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
            # Bytes held only while this one request is on its way: a commit never holds
            # any while it waits for parts (each part takes its own), or a commit waiting
            # for its last part would wait for itself.
            size = self.size
            await self.wb.part_bytes.acquire(size)
            try:
                self._sent = self._upload_attributes()
                return await catalog.put(self.path, await self._read_content(0, size),
                                         self._sent)
            finally:
                self.wb.part_bytes.release(size)
        return await self._finish_parts()

    async def _read_content(self, offset: int, size: int) -> bytes:
        """Content to upload: from a staging file in a worker thread (it may be large), else
        (at most a slot) at once."""
        if self.slot is None and not self.in_journal:
            self.unpark()
            return await trio.to_thread.run_sync(read_exactly, self.fd, offset, size)
        return self._read_range(offset, size)

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
                    self._sent = self._upload_attributes()
                    self._upload = await self.wb.catalog.begin_upload(self.path, self._sent)
                except RucioFsError as exc:
                    await self.stop_streaming(f"begin failed: {exc}")
                    if final:
                        raise
                    return
            if self._file_slots is None:
                self._file_slots = trio.Semaphore(max(1, self.wb.catalog.upload_parallelism))
                self._parts_done = trio.Event()
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
            data = await self._read_content(offset, length)
            await self.wb.catalog.write_part(upload, number, offset, data)
        except Exception as exc:  # reported by the commit that waits for this part
            if self._part_error is None:
                self._part_error = exc
        finally:
            self.wb.part_bytes.release(length)
            assert self._file_slots is not None and self._parts_done is not None
            self._file_slots.release()
            self._in_flight -= 1
            done, self._parts_done = self._parts_done, trio.Event()
            done.set()

    async def _wait_parts(self) -> None:
        while self._in_flight:
            assert self._parts_done is not None  # parts in flight were made with it
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
        """Close the staging file; delete it and end its record unless ``keep`` (then its
        record says what it holds, for the next mount to adopt)."""
        if keep:
            self.record()
        else:
            self.unrecord()
        if self.fd >= 0:
            if keep and self.slot is None:
                os.fdatasync(self.fd)  # (the arena is synced once, at unmount)
            os.close(self.fd)
        self.fd, self.parked = -1, False
        if not keep:
            if self.slot is not None:
                self.wb.arena.give_back(self.slot)
                self.slot = None
            self.in_journal = False
            if self.staging_path:
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


class FilesByPath(dict[str, DirtyFile]):
    """Path -> file, also indexed by parent directory: a listing overlays its directory's
    files without scanning every queued file (thousands during ``cp -r``)."""

    def __init__(self) -> None:
        super().__init__()
        self._by_parent: dict[str, dict[str, DirtyFile]] = {}

    def in_directory(self, directory: str) -> Iterable[DirtyFile]:
        return list(self._by_parent.get(directory, {}).values())

    def __setitem__(self, path: str, dirty: DirtyFile) -> None:
        super().__setitem__(path, dirty)
        self._by_parent.setdefault(split_path(path)[0], {})[path] = dirty

    def __delitem__(self, path: str) -> None:
        super().__delitem__(path)
        parent = split_path(path)[0]
        siblings = self._by_parent[parent]
        del siblings[path]
        if not siblings:
            del self._by_parent[parent]

    def pop(self, path: str, *default: Any) -> Any:
        if path not in self:
            return default[0] if default else super().pop(path)
        dirty = self[path]
        del self[path]
        return dirty

    def clear(self) -> None:
        super().clear()
        self._by_parent.clear()


class WriteBack:
    """The files of one mount that are being written or wait for a successful upload, by
    catalog path (renames re-key them), and, with async write-back, the queued changes."""

    def __init__(self, catalog: Catalog, staging_dir: str, url: str,
                 asynchronous: bool = False, parallelism: int = 0,
                 identity: str | None = None) -> None:
        self.catalog = catalog
        self.url = url
        #: Whose journals this mount replays: ``identity`` if given (a per-user mount: the
        #: local user's), else the backend's (host, bucket or zone, root, account; the same
        #: whatever the mount options), else the URL.
        self.identity = identity or catalog.identity() or url
        #: The local user whose files these are (a per-user mount), else None.
        self.uid: int | None = None
        self.staging_dir = staging_dir
        #: Whether ``close`` and namespace changes return before the server has them.
        self.asynchronous = asynchronous
        #: Files with content local to this mount, by path; the catalog overlays them.
        self.files = FilesByPath()
        #: Queued namespace changes the server does not show yet: parent -> name -> (journal
        #: number, the entry, or None for a removed name). The catalog overlays them.
        self.shadow: dict[str, dict[str, tuple[int, Entry | None]]] = {}
        self.serve(catalog)
        #: Bytes of parts on their way, all files together.
        self.part_bytes = ByteBudget(Shares(catalog.config.memory_limit).uploads)
        self.generations = itertools.count(1)
        #: Where part uploads run; set by the daemon.
        self.nursery: trio.Nursery | None = None
        self._names = itertools.count(1)
        self.journal = Journal(staging_dir, self.identity, preallocate=asynchronous)
        self.arena = Arena(staging_dir)
        #: Queued mkdir ops by path: an rmdir before one starts cancels both.
        self._mkdirs: dict[str, Op] = {}
        #: New directories whose marker was not written, with the number of the journal
        #: record that says so: what was queued into each keeps it on the server
        #: (:attr:`~rucio_fs.backend.Backend.implied_directories`).
        self._unmarked: dict[str, int] = {}
        #: Their markers queued by :meth:`_keep_directory`, until carried out.
        self._keeping: dict[str, Op] = {}
        #: Those the server does not show yet (nothing below them carried out yet), with the
        #: number of the mkdir op whose overlay entry keeps showing them meanwhile.
        self._awaiting_key: dict[str, int] = {}
        #: Queued unlink and rmdir ops by path: a pending file renamed onto the path goes
        #: after them (see :meth:`renamed`).
        self._removals: dict[str, Op] = {}
        #: Sync write-back: whether an ``unlink`` through this mount was carried out on the
        #: server, and whether one queued to run ahead was refused since (see
        #: :meth:`remove_ahead`).
        self.removal_succeeded = False
        self._removal_refused = False
        #: The newest queued attrs op of each path: a later change takes it over.
        self._attrs: dict[str, Op] = {}
        #: Told (path, entry) when a queued upload has left nothing pending: the FUSE layer
        #: updates what the kernel was shown.
        self.on_uploaded: Callable[[str, Entry], None] = lambda _path, _entry: None
        #: Called with the path of a queued change that was given up (set by the FUSE layer).
        self.on_dropped: Callable[[str], None] = lambda _path: None
        self.queue = WriteQueue(self, parallelism or catalog.write_back_parallelism,
                                catalog.remove_batch_max, catalog.implied_directories)

    def serve(self, catalog: Catalog) -> None:
        """Upload through ``catalog`` from now on, and have it show what is pending here.

        A per-user mount keeps one write-back per local user: when the user's credentials
        change (a renewed proxy), the catalog of the new ones takes over its pending files,
        and a catalog of earlier credentials of the same user keeps showing them.
        """
        self.catalog = catalog
        catalog.overlay = self
        catalog.makes_names = True

    def spawn(self, fn, *args) -> None:  # type: ignore[no-untyped-def]
        assert self.nursery is not None, "WriteBack.nursery is not set"
        start_guarded(self.nursery, self.catalog.stats.events, f"{fn.__name__} of a write",
                      fn, *args)

    def new_staging_file(self) -> tuple[str, int]:
        """A new, empty staging file, locked by this daemon: (path, fd)."""
        while True:
            path = os.path.join(self.staging_dir, f"{os.getpid()}-{next(self._names)}.data")
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                continue
            except FileNotFoundError:  # the staging directory went (or never was)
                os.makedirs(self.staging_dir, mode=0o700, exist_ok=True)
                continue
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return path, fd

    # -- taking over what earlier daemons left --------------------------------------------

    def adopt(self) -> list[DirtyFile]:
        """Take over what earlier daemons of this catalog (:attr:`identity`) left and no live
        daemon holds (killed, or unmounted with uploads failing): their journals are replayed
        into this mount's, in order. Staged files become pending files of this mount
        (queued, so uploaded in order); queued namespace changes are queued again. Unlocked
        staging files that no pending record names are removed."""
        records, old = journals.replay(self.staging_dir, self.identity)
        records = self._legacy_records() + records
        adopted, named, sidecars = [], set(), []
        arenas: dict[str, int | None] = {}
        for record in records:
            if record.get("op") == "stage":
                dirty = self._adopt_staged(record, arenas)
                if dirty is not None:
                    adopted.append(dirty)
                    if dirty.staging_path:
                        named.add(os.path.basename(dirty.staging_path))
                    if "sidecar" in record:
                        sidecars.append(record["sidecar"])
            elif record.get("op") == "attrs":
                self.queue_attributes(record["path"],
                                      Attributes.from_record(record)).maybe_sent = True
            elif record.get("op") in ("mkdir", "unlink", "rmdir", "unmarked"):
                # An unmarked directory gets its marker now: what was to keep it may be gone.
                kind = "mkdir" if record["op"] == "unmarked" else record["op"]
                mode = record.get("mode")
                entry = (Entry(name=record["path"].rpartition("/")[2], kind=Kind.DIR,
                               mode=None if mode is None else int(mode))
                         if kind == "mkdir" else None)
                # The dead daemon may have sent it: the server may hold the directory, and
                # names below it that others put there.
                self._queue_change(kind, record["path"], entry).maybe_sent = True
        self.journal.sync()  # taken over: only now may the old records go
        journals.remove_journals(old)
        for path, fd in arenas.items():  # their content is in this mount's journal now
            if fd is not None:
                os.unlink(path)
                os.close(fd)
        for sidecar in sidecars:
            os.unlink(sidecar)
        self._remove_unnamed(named)
        return adopted

    def _adopt_staged(self, record: dict, arenas: dict[str, int | None]
                      ) -> DirtyFile | None:
        """A pending file of ``record``: its content is in the record (inline: what a close
        promised), in a slot of a dead daemon's arena (``arenas`` caches those opened and
        locked), or in a staging file, which is taken over as it is."""
        rpath = str(record["path"])
        content, fd, where = None, -1, "the journal"
        if "inline" in record:
            content = journals.inline_content(record)
        else:
            where = path = os.path.join(self.staging_dir, str(record["file"]))
            if not os.path.exists(path):
                log.error("%s: the staged content of %s is gone", path, rpath)
                return None
            if "slot" in record:
                if path not in arenas:
                    arenas[path] = journals.lock_unheld(path)
                arena_fd = arenas[path]
                if arena_fd is None:  # a live daemon's arena
                    return None
                content = read_slot(arena_fd, int(record["slot"]))
            else:
                fd = journals.lock_unheld(path, os.O_RDWR)
                if fd is None:  # a live daemon's file
                    return None
        if rpath in self.files:
            if fd >= 0:
                os.close(fd)
            return None
        base_fields = record.get("base")
        base = None if not base_fields else Entry(
            name=rpath.rpartition("/")[2], kind=Kind.FILE,
            size=int(base_fields.get("size", 0)), version=str(base_fields.get("version", "")),
            mtime_ns=int(base_fields.get("mtime_ns", 0)))
        if content is None:
            dirty = DirtyFile(self, rpath, base, staged=(where, fd))
            dirty.size = os.fstat(fd).st_size
        else:  # journaled here with its content: durable at the sync that ends the adoption
            dirty = DirtyFile(self, rpath, base, staged=("", -1))
            dirty.size, dirty.in_journal = len(content), True
        dirty.attributes = Attributes.from_record(record)
        if dirty.attributes.mtime_ns is not None:
            dirty.mtime_ns = dirty.attributes.mtime_ns
        dirty.materialized = dirty.dirty = True
        dirty.streaming = False
        dirty.error = "adopted from an earlier mount"
        dirty.record(inline=content)
        self.files[dirty.path] = dirty
        if base is None:
            self.catalog.note_entry(dirty.path, dirty.entry())
        self._queue_put(dirty)
        dirty.park()
        log.warning("%s: pending upload of %d bytes adopted from %s", dirty.path, dirty.size,
                    where)
        return dirty

    def _legacy_records(self) -> list[dict]:
        """``stage`` records of the ``.json`` sidecars an earlier version wrote (a sidecar goes
        once its file is adopted and journaled here)."""
        try:
            names = sorted(os.listdir(self.staging_dir))
        except FileNotFoundError:
            return []
        records = []
        for name in names:
            if not name.endswith(".data.json"):
                continue
            sidecar = os.path.join(self.staging_dir, name)
            try:
                with open(sidecar) as f:
                    record = json.load(f)
            except (OSError, ValueError) as exc:
                log.error("%s: unreadable record of a staged file (%s): left as it is",
                          sidecar, exc)
                continue
            if record.get("url") == self.url:
                records.append({"op": "stage", "path": record["path"], "file": name[:-5],
                                "base": record.get("base"), "sidecar": sidecar})
        return records

    def _remove_unnamed(self, named: set[str]) -> None:
        for name in os.listdir(self.staging_dir):
            if not name.endswith(".data") or name in named:
                continue
            path = os.path.join(self.staging_dir, name)
            if os.path.exists(path + ".json"):
                continue  # another URL's file, recorded by an earlier version
            fd = journals.lock_unheld(path)
            if fd is None:
                continue  # a live daemon's file
            try:
                if os.path.getmtime(path) < time.time() - UNRECORDED_GRACE:
                    # Nothing pending (a crash after its upload, or before it held data).
                    os.unlink(path)
            except OSError:
                pass
            finally:
                os.close(fd)

    # -- uploads ----------------------------------------------------------------------------

    async def run_retries(self) -> None:
        """Retry pending uploads on their own, backing off while they keep failing (a task
        of the daemon's nursery)."""
        delay = RETRY_FIRST
        while True:
            await trio.sleep(delay)
            if not self.pending():
                delay = RETRY_FIRST
                continue
            failed: list[tuple[str, str]] = [("", "the retry pass failed")]
            with survive(self.catalog.stats.events, "retrying pending uploads"):
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
            dirty = DirtyFile(self, path, base)
            try:
                if base is None:  # a new name the server does not have yet
                    dirty.record()
            except BaseException:  # a journal that cannot grow: nothing of it stays
                dirty.close_staging(keep=False)
                raise
            self.files[path] = dirty
        dirty.unpark()
        dirty.writers += 1
        return dirty

    async def close(self, dirty: DirtyFile) -> None:
        """A ``close`` (FUSE flush) of ``dirty``: upload it (sync), or make it durable and
        queue its upload (async; raises the error of a background upload of it that no close
        has returned yet). On a catalog that stores a file once (``write_once``), a new file
        still empty waits for its last close: this may be a duplicate closed before the
        writing."""
        if dirty.base is None and dirty.size == 0 and self.catalog.write_once:
            return
        if not self.asynchronous:
            await dirty.commit()
            return
        await self.stage(dirty)
        if dirty.unreported:
            error, dirty.unreported = dirty.unreported, ""
            raise Unavailable(f"{dirty.path}: an earlier upload failed: {error} (the new "
                              "content is staged and queued)")

    async def stage(self, dirty: DirtyFile) -> None:
        """Write ``dirty``'s record (with a small file's content) to the journal, and queue
        its upload unless it is queued already (async write-back): a crash of the daemon
        loses nothing of it from now on. With ``--durable close`` the content and the
        record are also synced (a power cut loses nothing of it either); else an ``fsync``
        of the file or its directory waits for its upload, as unmount does."""
        dirty.observe()
        if not dirty.dirty or dirty.unlinked or dirty.staged == dirty.generation:
            return
        durable = self.catalog.config.durable == "close"
        if dirty.op is None:
            await self.queue.room()  # a full queue refuses the close, not the disk
            if not dirty.dirty or dirty.unlinked:
                return
        dirty.unpark()
        # What is made durable is the content as of now: a write landing during the sync
        # below is of a later generation, which the next close must sync again.
        generation = dirty.generation
        if (durable and dirty.materialized and dirty.size <= INLINE_MAX
                and not dirty.kernel_writers):
            # The content goes into the journal with its record: one fdatasync, of a
            # preallocated file (no file-system journal commit), instead of two. (Without
            # a sync, the record made before its first byte already covers the content
            # where it is: copying it would cost the close a read and a write for nothing.)
            dirty.record(again=True, inline=dirty._read_range(0, dirty.size))
            self.journal.sync()
            dirty.park()
        else:
            dirty.record()
            if durable:
                # The queued upload may finish meanwhile: its descriptor stays open.
                dirty.syncing += 1
                try:
                    await trio.to_thread.run_sync(_sync_both, dirty.fd, self.journal.fd)
                finally:
                    dirty.syncing -= 1
                self.journal.syncs += 1
        if durable:
            self.catalog.stats.events["close_syncs"] += 1
        dirty.staged = generation
        # (An upload that finished during the sync took this content: nothing is left.)
        if dirty.op is None and dirty.dirty and not dirty.unlinked:
            self._queue_put(dirty)

    def _queue_put(self, dirty: DirtyFile) -> None:
        assert dirty.stage_n is not None
        dirty.op = Op(dirty.stage_n, "put", dirty.path, dirty)
        self.queue.add(dirty.op)

    async def carry_out(self, op: Op) -> None:
        """Carry out one queued op other than a removal (the queue batches those)."""
        if op.kind == "attrs":
            assert op.attributes is not None
            # Existence and kind (and a file's version) are what storing needs: a listed
            # entry without its stored attributes does, as the backend starts from them.
            entry = await self.catalog.stat(op.path, complete=False)
            await self.catalog.set_attributes(op.path, entry, op.attributes)
            return
        if op.kind == "mkdir":
            parent, _, name = op.path.rpartition("/")
            made = self.shadow.get(parent or "/", {}).get(name, (0, None))[1]
            mode = made.mode if made is not None else None
            if self._implied(op, mode):
                # Journaled: after a crash, the next mount writes the marker (what was to
                # keep the directory may be gone).
                if op.path not in self._unmarked:
                    self._unmarked[op.path] = self.journal.append(
                        {"op": "unmarked", "path": op.path})
                self._awaiting_key[op.path] = op.n
                self.catalog.stats.events["markers_not_written"] += 1
                return
            await self.catalog.make_directory(op.path, Attributes(mode=mode))
            return
        dirty = op.dirty
        assert dirty is not None
        await dirty.commit()

    def _implied(self, op: Op, mode: int | None) -> bool:
        """Whether the new directory of ``op`` (a queued ``mkdir``) needs no marker: the
        catalog keeps a directory that holds a key, something queued after ``op`` puts one
        below it (a file's upload, or a subdirectory's ``mkdir``), and the marker would
        store nothing (a default mode, no attributes queued)."""
        if not (self.catalog.implied_directories and self._mkdirs.get(op.path) is op
                and mode in (None, DEFAULT_DIRECTORY_MODE) and op.path not in self._attrs):
            return False
        if any(f.dirty and not f.unlinked and f.op is not None
               for f in self.files.in_directory(op.path)):
            return True
        return any(made is not None and made.is_dir and child(op.path, name) in self._mkdirs
                   for name, (_n, made) in self.shadow.get(op.path, {}).items())

    def _keep_directory(self, directory: str, hold: float = MARKER_HOLD) -> None:
        """``directory`` is about to lose a name in it, or to get attributes: if its marker
        was not written, it is now (queued before the change), so that the directory
        outlives the keys in it and stores what is set on it. (A directory above it is
        kept by this one's marker.) The marker waits ``hold`` seconds, blocking the changes
        below it: the directory's own ``rmdir`` meanwhile (``rm -r``) cancels it."""
        unmarked = self._unmarked.pop(directory, None)
        if unmarked is not None:
            op = Op(self.journal.append({"op": "mkdir", "path": directory}), "mkdir", directory)
            self._keeping[directory] = op
            self.queue.add(op, trio.current_time() + hold if hold > 0 else 0.0)
            self.journal.done(unmarked, carried_out=False)  # (after: a crash replays both)

    def _losing_name(self, path: str) -> None:
        """``path`` is about to leave its directory (removed, renamed away, given up): a
        directory without its marker that this may leave empty gets one
        (:meth:`_keep_directory`). Empty as the mount shows it: its listing at hand, after
        the changes made through the mount (no listing at hand: it may be)."""
        directory, name = split_path(path)
        if directory not in self._unmarked:
            return
        listing = self.catalog.listing.peek(directory)
        if (listing is None or not listing.complete
                or len(listing) - (name in listing.by_name) <= 0):
            self._keep_directory(directory)

    def _keep_tree(self, directory: str) -> None:
        """:meth:`_keep_directory` for ``directory`` and every unmarked directory below it
        (before a rename moves them: their markers move with them)."""
        below = directory + "/"
        for path in [p for p in self._unmarked if p == directory or p.startswith(below)]:
            self._keep_directory(path)

    def op_done(self, op: Op, dropped: RucioFsError | None,
                carried_out: bool = True) -> None:
        """The queue carried ``op`` out (or ``dropped`` it; ``carried_out`` False: it was
        cancelled before it started): the journal and the overlay learn it."""
        dirty = op.dirty
        if dirty is not None:
            dirty.op = None
            dirty.park()
            if dropped is not None:  # no key of it may come to keep its directory
                self._keep_directory(split_path(dirty.path)[0], hold=0.0)
            elif self._awaiting_key and carried_out and not dirty.unlinked:
                self._key_landed(dirty.path)
            if not dirty.dirty:
                self._forget(dirty)
                if dirty.base is not None and self.files.get(dirty.path) is None:
                    self.on_uploaded(dirty.path, dirty.base)
            elif dirty.writers == 0 and not dirty.unlinked:
                self._queue_put(dirty)  # written again after the upload took its snapshot
            return
        self.journal.done(op.n)
        if self._mkdirs.get(op.path) is op:
            del self._mkdirs[op.path]
        if self._keeping.get(op.path) is op:
            del self._keeping[op.path]
        if self._removals.get(op.path) is op:
            del self._removals[op.path]
        if self._attrs.get(op.path) is op:
            del self._attrs[op.path]
        parent = op.path.rpartition("/")[0]
        if self._awaiting_key.get(op.path) != op.n:  # (a skipped marker: shown meanwhile)
            self._unshadow(op.path, op.n)
            if carried_out and dropped is None and op.kind == "mkdir" and self._awaiting_key:
                self._key_landed(op.path)
        if dropped is not None:  # the server keeps what it has: ask it again
            if op.kind == "unlink" and not self.asynchronous:
                self._removal_refused = True
                log.error("%s: the server refused its removal (%s): the file is there "
                          "again, and this mount's removals wait for the server from now on",
                          op.path, dropped)
            self.catalog.forget_tree(op.path)
            self.catalog.forget_listing(parent or "/")
            self.on_dropped(op.path)

    def _unshadow(self, path: str, n: int) -> None:
        """The overlay stops showing what op ``n`` did at ``path`` (unless a later op did
        something there since)."""
        parent, _, name = path.rpartition("/")
        names = self.shadow.get(parent or "/")
        if names is not None and names.get(name, (0,))[0] == n:
            del names[name]
            if not names:
                del self.shadow[parent or "/"]

    def _key_landed(self, path: str) -> None:
        """The server holds a key at or below ``path`` now: the directories above it whose
        marker was not written show on the server, and the overlay lets go of them."""
        for directory in (path, *ancestors(path)):
            n = self._awaiting_key.pop(directory, None)
            if n is not None:
                self._unshadow(directory, n)

    # -- namespace changes (async write-back) ----------------------------------------------

    def queue_attributes(self, path: str, attributes: Attributes, hold: float = 0.0) -> Op:
        """Queue storing ``attributes`` of ``path`` (which has no pending content), after
        what is queued on it, above it and below it; the mount shows them at once.
        ``hold``: the op waits that many seconds first (counted from the first change a
        held op carries), for a later change or a rename to carry it (synchronous
        write-back: :meth:`carrying`).

        A queued attrs op of ``path`` that has not been tried yet is taken over: the new op
        stores its change too, and it is cancelled (``rsync -a`` sets a new directory's time
        and mode, then its time again once its files are in: one request instead of three).
        Not while a :meth:`WriteQueue.wait` waits, as it may wait for exactly that op."""
        not_before = trio.current_time() + hold if hold > 0 else 0.0
        self._keep_directory(path, hold=0.0)
        earlier = self._attrs.get(path)
        if (earlier is not None and earlier.attributes is not None
                and self.queue.untried(earlier)):
            attributes = earlier.attributes.then(attributes)
            if earlier.held:  # never held longer than the first change's hold
                not_before = min(not_before, earlier.not_before)
        else:
            earlier = None
        n = self.journal.append({"op": "attrs", "path": path, **attributes.as_record()})
        if earlier is not None and self.queue.cancel(earlier):
            # After the new record: a crash between the two replays both, in order.
            self.journal.done(earlier.n, carried_out=False)
        op = Op(n, "attrs", path, attributes=attributes)
        self._attrs[path] = op
        self.queue.add(op, not_before)
        self.catalog.keep(path, attributes)
        return op

    @contextlib.asynccontextmanager
    async def carrying(self, *paths: str) -> AsyncIterator[Attributes]:
        """Around a request that carries or makes moot the queued attribute changes of
        ``paths`` (a rename: its source's, carried in its copy, and the replaced target's;
        a removal: the removed path's): they are taken out of the queue, and the body gets
        the first path's change to carry (NO_ATTRIBUTES: none). A change already tried or
        on its way is waited for first instead. When the body returns they are done; when it
        raises they are queued again, to be carried out at once. Their journal records stay
        until then: a crash meanwhile replays them."""
        taken = [await self._take_attributes(path) for path in paths]
        carried = taken[0].attributes if taken[0] is not None else None
        try:
            yield carried or NO_ATTRIBUTES
        except BaseException:
            for op in taken:
                if op is not None:
                    again = Op(op.n, "attrs", op.path, attributes=op.attributes)
                    self._attrs.setdefault(op.path, again)
                    self.queue.add(again)
            raise
        for op in taken:
            if op is not None:
                self.journal.done(op.n)

    async def _take_attributes(self, path: str) -> Op | None:
        op = self._attrs.get(path)
        if op is None:
            return None
        if not self.queue.untried(op):
            await self.queue.wait(lambda queued: queued is op)
            return None
        self.queue.cancel(op)
        del self._attrs[path]
        return op

    def fold_held_attributes(self, path: str) -> Attributes:
        """The change of attributes queued for ``path`` and not started, taken out of the
        queue for the caller (new content of the file) to carry: the caller records it
        before it next awaits. NO_ATTRIBUTES when there is none."""
        op = self._attrs.get(path)
        if op is None or op.attributes is None or not self.queue.untried(op):
            return NO_ATTRIBUTES
        self.queue.cancel(op)
        del self._attrs[path]
        self.journal.done(op.n, carried_out=False)
        self.catalog.unkeep(path, op.attributes)  # the pending content shows them now
        return op.attributes

    async def settle_attributes(self, path: str) -> None:
        """Until the queued attrs op of ``path``, if any, is carried out (``fsync``)."""
        op = self._attrs.get(path)
        if op is not None:
            await self.queue.wait(lambda queued: queued is op)

    def queued_attributes(self, path: str) -> Attributes:
        """What the newest queued attrs op of ``path`` sets, unless it is running (then it
        is the change being stored, if any): a change the user made after whatever is being
        stored now."""
        op = self._attrs.get(path)
        if op is None or op.running or op.done or op.attributes is None:
            return NO_ATTRIBUTES
        return op.attributes

    def queue_mkdir(self, path: str, entry: Entry) -> None:
        self._queue_change("mkdir", path, entry)
        self.catalog.new_directory(path, entry)

    def never_sent(self, directory: str) -> bool | None:
        """For a directory whose queued ``mkdir`` was never sent (:meth:`holds_all_of`: the
        server holds nothing below it, and nobody else could name it yet): whether it is
        empty. None when the server must be asked."""
        if not self.holds_all_of(directory):
            return None
        return not self.children(directory)

    def holds_all_of(self, directory: str) -> bool:
        """Whether the server holds nothing below ``directory``, which this mount made:
        its queued mkdir was never sent, by this daemon (never tried) nor by one before it
        (not replayed from a journal), or it went without a marker and nothing below it is
        on the server yet."""
        made = self._mkdirs.get(directory)
        if made is None:
            return directory in self._awaiting_key
        return not (made.attempts or made.running or made.done or made.maybe_sent)

    def queue_removal(self, kind: str, path: str) -> None:
        """Queue the removal of ``path``; an rmdir of a directory whose mkdir was never sent
        cancels that instead (one that may have been sent is removed on the server too)."""
        made = self._mkdirs.get(path) if kind == "rmdir" else None
        self._losing_name(path)
        if made is not None and self.holds_all_of(path) and self.queue.cancel(made):
            # Made and removed before the server saw either: neither goes there.
            self.journal.done(made.n, carried_out=False)
            self.op_done(made, None, carried_out=False)
        else:
            self._queue_change(kind, path, None)
        if kind == "rmdir":
            self.catalog.forget_listing(path)
            unmarked = self._unmarked.pop(path, None)
            if unmarked is not None:  # (going: it needs no marker)
                self.journal.done(unmarked, carried_out=False)
            self._awaiting_key.pop(path, None)  # (its rmdir's overlay entry took over)
            keeping = self._keeping.pop(path, None)
            if keeping is not None and self.queue.cancel(keeping):  # (nor the one queued)
                self.journal.done(keeping.n, carried_out=False)
                self.op_done(keeping, None, carried_out=False)
        self.catalog.note_entry(path, None)

    def runs_removals_ahead(self) -> bool:
        """Whether removals of this sync mount are queued (:meth:`remove_ahead`), and an
        ``rmdir`` then goes with the removals queued below it."""
        return (not self.asynchronous and self.catalog.removals_run_ahead
                and self.removal_succeeded and not self._removal_refused)

    async def remove_ahead(self, path: str) -> bool:
        """Sync write-back: queue the removal of stored file ``path`` and return at once,
        if its catalog's removals do not fail one by one
        (:attr:`~rucio_fs.backend.Backend.removals_run_ahead`), a removal through this
        mount succeeded before (:attr:`removal_succeeded`: the credentials may remove) and
        none queued so was refused since. Waits while :data:`REMOVALS_AHEAD` are queued.
        False: the caller removes it on the server itself (also when the queued removals
        are failing).

        The queued removal is journaled (a crash replays it), the overlay hides the name,
        and a change of the same path, an ``rmdir`` or ``fsync`` of a directory above it,
        and unmount wait for it (:meth:`removals_first`, :meth:`settle`)."""
        if not self.runs_removals_ahead():
            return False
        while len(self._removals) >= REMOVALS_AHEAD:
            oldest = next(iter(self._removals.values()))
            try:
                await self.queue.wait(lambda op, oldest=oldest: op is oldest)
            except RucioFsError:
                return False
        held = await self._take_attributes(path)
        if held is not None:  # a time or mode held back for the file: moot now
            self.journal.done(held.n)
        self.queue_removal("unlink", path)
        return True

    async def removals_first(self, *paths: str) -> None:
        """Until the removals queued on ``paths`` (or above or below them) are carried
        out: a sync change of one of them goes to the server after them, so that a removal
        queued ahead never removes what the change stores (raises the error of one that
        fails)."""
        if self._removals:
            covers = self.queue.covering(paths)
            await self.queue.wait(lambda op: op.kind in REMOVALS and covers(op))

    def _queue_change(self, kind: str, path: str, entry: Entry | None) -> Op:
        mode = {} if entry is None or entry.mode is None else {"mode": entry.mode}
        n = self.journal.append({"op": kind, "path": path, **mode})
        parent, _, name = path.rpartition("/")
        self.shadow.setdefault(parent or "/", {})[name] = (n, entry)
        op = Op(n, kind, path)
        if kind == "mkdir":
            self._mkdirs[path] = op
        elif kind in ("unlink", "rmdir"):
            self._removals[path] = op
        self.queue.add(op)
        return op

    def losing(self, path: str) -> None:
        """``path`` is about to move away (a rename): its directory keeps a marker if it
        has none (see :meth:`_losing_name`), and so do ``path`` and the directories
        below it, whose markers move with them."""
        self._losing_name(path)
        self._keep_tree(path)

    async def settle(self, *paths: str) -> None:
        """Until every queued op on a path overlapping ``paths`` is carried out (raises the
        error of one that fails)."""
        await self.queue.wait(self.queue.covering(paths))

    async def settle_up_to(self, path: str) -> None:
        """Until every queued op on ``path`` or a directory above it is carried out (its own
        and its parents' ``mkdir``), not those below it (raises the error of one that
        fails)."""
        await self.queue.wait(lambda op: op.path == path or path.startswith(
            op.path.rstrip("/") + "/"))

    async def commit_now(self, dirty: DirtyFile) -> Entry | None:
        """Upload ``dirty`` now, after what is queued before it; its new entry (None:
        nothing was pending)."""
        if self.asynchronous:
            await self.settle(dirty.path)
        return await dirty.commit()

    async def release(self, dirty: DirtyFile, raise_errors: bool = False) -> None:
        """One writer is gone; after the last, upload what is left and forget the file
        (or keep it pending when the upload fails; ``raise_errors``: and raise)."""
        dirty.writers -= 1
        if dirty.writers > 0:
            return
        if dirty.unlinked:
            dirty.close_staging(keep=False)
            return
        if self.asynchronous:
            await self.stage(dirty)
            if dirty.op is None and not dirty.dirty:
                self._forget(dirty)
            else:
                dirty.park()
            return
        try:
            await dirty.commit()
        except RucioFsError as exc:
            log.error("%s: upload failed: %s; the data stays staged in %s and is retried at "
                      "the next close or fsync, or by `rucio-fs uploads --retry`",
                      dirty.path, exc, dirty.where)
            if raise_errors:
                raise
            return
        self._forget(dirty)

    def _forget(self, dirty: DirtyFile) -> None:
        """Done with ``dirty`` (uploaded or discarded), unless a writer opened it again while
        its upload was on its way: then it stays, with its staging file."""
        if dirty.writers > 0 or dirty.op is not None or dirty.syncing:
            return  # (a close syncing its staging file forgets it when done)
        if self.files.get(dirty.path) is dirty:
            del self.files[dirty.path]
        dirty.close_staging(keep=False)

    async def unlinked(self, path: str) -> DirtyFile | None:
        """``path`` is being removed: its pending content must never be uploaded. A file
        still open for writing keeps its content (as a local file's descriptor does): what
        is still only on the server is copied into its staging file first."""
        dirty = self.files.get(path)
        if dirty is not None and dirty.writers and not dirty.materialized:
            try:
                async with dirty.lock:
                    await dirty._materialize()
            except RucioFsError as exc:
                log.warning("%s: removed while open, and its content could not be kept for "
                            "the descriptors still open (%s): they fail from now on", path, exc)
        dirty = self.files.pop(path, None)
        if dirty is not None:
            self._losing_name(path)
            dirty.unlinked = True
            async with dirty.lock:
                await dirty.stop_streaming("")
            if dirty.writers == 0:
                dirty.close_staging(keep=False)
            else:  # still open: its content stays readable, but no record may name it
                if dirty.in_journal:
                    dirty._to_staging_file(sync=False)
                dirty.unrecord()
        return dirty

    async def renamed(self, old: str, new: str) -> None:
        """Pending files at ``old`` (or below it, for a directory) move to ``new``.

        A moved file's queued upload keeps its place in the queue, so a removal of the
        target queued after it would run after it and remove the new content: such a
        removal, not tried yet, is cancelled (the upload replaces what it would remove),
        and one already tried is waited for first."""
        below = old + "/"
        self.losing(old)
        for path in [p for p in self.files if p == old or p.startswith(below)]:
            target = new + path[len(old):]
            await self.unlinked(target)
            removal = self._removals.get(target)
            if removal is not None and not self.queue.untried(removal):
                await self.settle(target)
            dirty = self.files.pop(path)
            dirty.path = target
            if dirty.op is not None:
                dirty.op.path = target
            dirty.rerecord()  # before the removal ends: a crash replays both, in order
            self.files[target] = dirty
            removal = self._removals.get(target)
            if removal is not None and self.queue.cancel(removal):
                self.journal.done(removal.n, carried_out=False)
                self.op_done(removal, None, carried_out=False)

    # -- the catalog's overlay: what only this mount holds wins -----------------------------

    def entry(self, path: str) -> Entry | None:
        dirty = self.files.get(path)
        if dirty is not None:
            return dirty.entry()
        if self.shadow:
            parent, _, name = path.rpartition("/")
            return self.shadow.get(parent or "/", {}).get(name, (0, None))[1]
        return None

    def hides(self, path: str) -> bool:
        """Whether a queued removal hides ``path`` from what the server still shows."""
        if not self.shadow or path in self.files:
            return False
        parent, _, name = path.rpartition("/")
        found = self.shadow.get(parent or "/", {}).get(name)
        return found is not None and found[1] is None

    def children(self, directory: str) -> list[Entry]:
        local = [dirty.entry() for dirty in self.files.in_directory(directory)]
        made = [entry for _n, entry in self.shadow.get(directory, {}).values()
                if entry is not None]
        return made + local

    def hidden_children(self, directory: str) -> Iterable[str]:
        """Names in ``directory`` that queued removals hide."""
        return [name for name, (_n, entry) in self.shadow.get(directory, {}).items()
                if entry is None and child(directory, name) not in self.files]

    def has_below(self, directory: str) -> bool:
        """Whether a file with local content lies below ``directory``."""
        prefix = directory.rstrip("/") + "/"
        return any(path.startswith(prefix) for path in self.files)

    def pending(self) -> list[DirtyFile]:
        """Files with no writer left whose upload failed (and is not queued)."""
        return [d for d in self.files.values() if d.writers == 0 and d.dirty and d.op is None]

    def queued(self) -> list[dict[str, object]]:
        """The queued ops, in order, as ``rucio-fs uploads`` shows them."""
        return [op.as_dict() for op in self.queue.ops.values()]

    async def retry(self) -> list[tuple[str, str]]:
        """Commit every pending file; returns (path, error) of those that failed again."""
        failed = []
        for dirty in self.pending():
            try:
                await dirty.commit()
            except RucioFsError as exc:
                failed.append((dirty.path, str(exc)))
            except Exception as exc:  # a staging file gone, a journal that cannot grow
                background.report_failure(self.catalog.stats.events,
                                          f"retrying the upload of {dirty.path}", exc)
                failed.append((dirty.path, repr(exc)))
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
        dirty.op = None  # its queued op finds it unlinked: nothing to do
        self._losing_name(path)
        self._forget(dirty)
        self.catalog.note_entry(path, dirty.base)
        return dirty

    async def shutdown(self) -> None:
        """At unmount: carry out what is queued (one try each) and one last try for
        everything dirty; keep (with its record) what fails, for the next mount. A file
        still open (the kernel may end the session with the RELEASE of a file closed without
        a FLUSH unsent) is queued first, so all go at once."""
        if self.asynchronous:
            for dirty in list(self.files.values()):
                if (dirty.op is None and dirty.dirty and not dirty.unlinked
                        and not self.queue.full):
                    with contextlib.suppress(RucioFsError):  # (left to the last try below)
                        await self.stage(dirty)
        if self.queue.ops:
            log.info("unmount: %d queued change(s) to carry out", len(self.queue.ops))
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.queue.run)
                await self.queue.drain()
                nursery.cancel_scope.cancel()
        for dirty in list(self.files.values()):
            if not dirty.is_open:
                continue
            try:
                if dirty.op is None:
                    await dirty.commit()
                else:
                    raise Unavailable(dirty.op.error or "its queued upload failed")
            except RucioFsError as exc:
                dirty.close_staging(keep=True)
                log.error("%s: not uploaded (%s); its data is kept in %s", dirty.path, exc,
                          dirty.where)
            else:
                dirty.close_staging(keep=False)
        self.files.clear()
        # What this mount knew of markers it did not write ends with it: a later mount
        # sees those directories as any other that only keys below it keep.
        for unmarked in self._unmarked.values():
            self.journal.done(unmarked, carried_out=False)
        self._unmarked.clear()
        if self.journal.pending:  # what is left for the next mount survives a power cut
            self.arena.sync()
            self.journal.sync()
        self.journal.close()
        self.arena.close()


def child(directory: str, name: str) -> str:
    return "/" + name if directory == "/" else f"{directory}/{name}"


def _sync_both(data_fd: int, journal_fd: int) -> None:
    """The staged bytes, then the journal that names them, made durable (a worker thread)."""
    os.fdatasync(data_fd)
    os.fdatasync(journal_fd)
