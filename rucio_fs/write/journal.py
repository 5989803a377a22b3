"""The journal: what a writable mount still owes the server, in the order it was promised.

Contract:

* Each daemon of a writable mount appends to its own journal, ``journal-<pid>-<k>.log`` in the
  staging directory, ``flock``-ed while the daemon lives. Its first line names the catalog
  (the backend's identity, else the mount URL).
* A record is one JSON line with a number ``n`` (increasing within the journal): ``stage``
  (a staging file holds content of ``path`` the server does not have), ``mkdir``, ``unlink``,
  ``rmdir`` (a change of the namespace queued for the server), ``unmarked`` (a directory the
  mount made went without a marker: the next mount writes it). A record is
  *pending* until a ``done`` (carried out) or ``cancelled`` record names its number.
* :meth:`Journal.append` writes at once: a daemon killed afterwards (``kill -9``, OOM) leaves
  the record behind, since the page cache outlives the process; :meth:`Journal.sync`
  (``fdatasync``) makes everything appended so far durable across a power cut (async
  write-back does it at every ``close``). ``done`` records are never synced: a lost one only
  makes the next mount do an idempotent step again (upload the same bytes, delete a deleted
  name).
* A ``stage`` record may carry its content *inline*: the JSON line names the length and
  CRC-32 of the bytes that follow it (then a newline). A frame whose bytes are short or fail
  their CRC was torn by a power cut before it was synced, so it ends the journal like a torn
  line.
* A journal made with ``preallocate`` grows in zero-filled steps of :data:`GROW_BYTES` and is
  written in place, so a sync flushes data without changing the file's size: no file-system
  journal commit, about half the cost of syncing an append on ext4 (measured in
  ``docs/writing.md``). Zeros after the last record read as a torn line.
* :func:`replay` reads the journals of a URL whose daemons are gone and returns their pending
  records in order, older journals first. A pending record that a later record on an
  overlapping path supersedes (that later one is done, and records on overlapping paths are
  carried out in order) is left out (not an ``unmarked`` record: it states a fact, not a
  step, and is only ever cancelled), and so is a ``stage`` record whose staging file a later
  ``stage`` record names (the file moved). The caller re-appends what it takes over to its own
  journal, syncs it, and only then removes the old journals (:func:`remove_journals`), so a
  crash in between replays them twice, which is idempotent.
* Once it has grown past :data:`COMPACT_BYTES`, the journal is emptied back to its first line
  when nothing is pending; past :data:`REWRITE_BYTES`, it is rewritten with only its pending
  records when those take less than half of it (so each byte is copied a bounded number of
  times, however much inline content waits).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import json
import logging
import os
import zlib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from rucio_fs.errors import Unavailable

log = logging.getLogger(__name__)

FORMAT = 1
#: Past this size a journal is emptied when nothing is pending.
COMPACT_BYTES = 1 << 20
#: Past this size a journal is rewritten with only its pending records.
REWRITE_BYTES = 64 << 20
#: A preallocated journal grows by this many zero bytes at a time.
GROW_BYTES = 16 << 20


def overlaps(a: str, b: str) -> bool:
    """Whether one of two catalog paths is the other or lies below it."""
    if a == b or a == "/" or b == "/":
        return True
    return b.startswith(a + "/") or a.startswith(b + "/")


class Journal:
    """One daemon's journal. Every method runs on the trio loop."""

    def __init__(self, staging_dir: str, url: str, preallocate: bool = False) -> None:
        self.staging_dir = staging_dir
        self.url = url
        self.preallocate = preallocate
        self.path, self.fd = create_locked(staging_dir, "journal", ".log")
        self._header = _line({"journal": FORMAT, "url": url})
        #: Where the next record goes, and the file's size (past it when preallocated).
        self._bytes = self._size = 0
        self._write(self._header)
        self._numbers = itertools.count(1)
        #: Pending records by number, in order (an inline record's bytes stay in the file:
        #: ``_at`` says where; ``_bytes`` is what the record takes in the file).
        self.pending: dict[int, dict[str, Any]] = {}
        #: Bytes of the file the pending records take.
        self._live = 0
        #: How many times the journal was made durable (fdatasync).
        self.syncs = 0

    def append(self, record: dict[str, Any], inline: bytes | None = None) -> int:
        """Write ``record`` (given a number), followed by ``inline`` bytes if given; returns
        the number."""
        n = record["n"] = next(self._numbers)
        if inline is None:
            data = _line(record)
        else:
            record.update(inline=len(inline), crc=zlib.crc32(inline))
            line = _line(record)
            record["_at"] = self._bytes + len(line)
            data = line + inline + b"\n"
        record["_bytes"] = len(data)
        self._live += len(data)
        self._write(data)
        self.pending[n] = record
        return n

    def inline_bytes(self, record: Mapping[str, Any]) -> bytes:
        """The inline content of a pending record of this journal."""
        return read_exactly(self.fd, record["_at"], record["inline"])

    def sync(self) -> None:
        """Make everything written so far durable across a power cut."""
        os.fdatasync(self.fd)
        self.syncs += 1

    def done(self, *numbers: int, carried_out: bool = True) -> None:
        """The records ``numbers`` are carried out on the server (``carried_out`` False: they
        were cancelled, e.g. a staged file removed before its upload)."""
        gone = [(n, self.pending.pop(n, None)) for n in numbers]
        numbers = tuple(n for n, record in gone if record is not None)
        if not numbers:
            return
        self._live -= sum(record["_bytes"] for _n, record in gone if record is not None)
        if self._bytes > COMPACT_BYTES and not self.pending:
            os.ftruncate(self.fd, len(self._header))  # nothing left to replay
            self._bytes = self._size = len(self._header)
            return
        self._write(_line({"done" if carried_out else "cancelled": list(numbers)}))
        if self._bytes > REWRITE_BYTES and self._live * 2 < self._bytes:
            self._rewrite()

    def _write(self, data: bytes) -> None:
        end = self._bytes + len(data)
        if end > self._size:
            self._grow(end)
        written = os.pwrite(self.fd, data, self._bytes)
        if written < len(data):  # (a full disk)
            raise OSError(errno.ENOSPC, f"{self.path}: {written} of {len(data)} bytes written")
        self._bytes = end

    def _grow(self, end: int) -> None:
        if not self.preallocate:
            self._size = end
            return
        size = self._size
        target = max(end, size + GROW_BYTES)
        zeros = bytes(min(1 << 20, target - size))
        while size < target:
            size += os.pwrite(self.fd, zeros[:target - size], size)
        self._size = size

    def _rewrite(self) -> None:
        """Replace the journal by its header and its pending records (written to a new file
        first, so a crash leaves the old or the new one whole). Record by record: the
        memory it takes is one record's, not the pending content's."""
        temporary = self.path + ".tmp"
        fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        at = os.write(fd, self._header)
        for record in self.pending.values():
            data = _line(record)
            if "inline" in record:
                content_at = at + len(data)
                data += self.inline_bytes(record) + b"\n"
                record["_at"] = content_at
            at += os.write(fd, data)
        if self.pending:
            os.fdatasync(fd)
        os.replace(temporary, self.path)
        os.close(self.fd)
        self.fd = fd
        self._bytes = self._size = at
        self._grow(at)

    def close(self) -> None:
        """At unmount: the journal goes unless records are still pending (the next mount
        replays those)."""
        if not self.pending:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        os.close(self.fd)
        self.fd = -1


#: One encoder for every record (``json.dumps`` with options makes one per call).
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def _line(record: Mapping[str, Any]) -> bytes:
    fields = {k: v for k, v in record.items() if not k.startswith("_")}
    return _ENCODER.encode(fields).encode("utf-8", "surrogateescape") + b"\n"


def read_exactly(fd: int, offset: int, size: int) -> bytes:
    """``size`` bytes at ``offset`` of a staging, arena or journal file, which this daemon
    alone writes: fewer is a local disk failure (EIO to the caller)."""
    data = os.pread(fd, size, offset)
    while len(data) < size:
        more = os.pread(fd, size - len(data), offset + len(data))
        if not more:
            raise Unavailable(f"staging: read {len(data)} of {size} bytes at {offset}")
        data += more
    return data


def create_locked(directory: str, stem: str, suffix: str) -> tuple[str, int]:
    """A new file ``<stem>-<pid>-<k><suffix>`` in ``directory`` (made if need be), open
    read-write and ``flock``-ed by this daemon: (path, fd)."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    for k in itertools.count(1):
        path = os.path.join(directory, f"{stem}-{os.getpid()}-{k}{suffix}")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            continue
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return path, fd
    raise AssertionError("unreachable")


def lock_unheld(path: str, flags: int = os.O_RDONLY) -> int | None:
    """``path`` opened and locked (``flock``), or None when it cannot be opened or a live
    daemon holds it."""
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _unlocked_journals(staging_dir: str, url: str) -> list[tuple[str, int]]:
    """(path, locked fd) of the journals of ``url`` no live daemon holds, oldest first."""
    try:
        names = os.listdir(staging_dir)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        if not (name.startswith("journal-") and name.endswith(".log")):
            continue
        path = os.path.join(staging_dir, name)
        fd = lock_unheld(path)
        if fd is None:
            continue
        try:
            with open(path, "rb") as f:
                header = json.loads(f.readline() or b"{}")
        except (OSError, ValueError):
            os.close(fd)
            continue
        if header.get("url") != url:
            os.close(fd)
            continue
        found.append((os.fstat(fd).st_mtime_ns, path, fd))
    found.sort()
    return [(path, fd) for _mtime, path, fd in found]


def replay(staging_dir: str, url: str) -> tuple[list[dict[str, Any]], list[tuple[str, int]]]:
    """The pending records of the journals of ``url`` left by daemons that are gone, in
    order (numbers are the caller's to give again), and those journals (path, locked fd)
    for :func:`remove_journals` once the caller has taken the records over."""
    journals = _unlocked_journals(staging_dir, url)
    records: list[dict[str, Any]] = []
    for path, _fd in journals:
        records += _pending_of(path)
    return _without_superseded(records), journals


def remove_journals(journals: Iterable[tuple[str, int]]) -> None:
    for path, fd in journals:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.close(fd)


def read_records(path: str) -> Iterator[dict[str, Any]]:
    """The records of the journal at ``path`` after its header, up to the first torn one (an
    inline record's bytes are not read: ``_journal`` and ``_at`` say where they are)."""
    with open(path, "rb") as f:
        f.readline()
        while True:
            raw = f.readline()
            if not raw.endswith(b"\n") or raw.startswith(b"\0"):
                return  # torn by a power cut (or the zeros past the end): never promised
            try:
                record = json.loads(raw.decode("utf-8", "surrogateescape"))
            except ValueError:
                # A preallocated journal torn by a power cut can hold a line whose end never
                # reached the disk: nothing after it was synced.
                log.error("%s: journal ends at an unreadable line: %r", path, raw[:200])
                return
            if "inline" in record:
                at = f.tell()
                data = f.read(record["inline"] + 1)
                if (len(data) != record["inline"] + 1 or data[-1:] != b"\n"
                        or zlib.crc32(data[:-1]) != record.get("crc")):
                    return  # torn: never synced, so never promised
                record.update(_journal=path, _at=at)
            yield record


def inline_content(record: Mapping[str, Any]) -> bytes:
    """The inline bytes of a record :func:`replay` returned."""
    with open(record["_journal"], "rb") as f:
        return read_exactly(f.fileno(), record["_at"], record["inline"])


def _pending_of(path: str) -> list[dict[str, Any]]:
    pending: dict[int, dict[str, Any]] = {}
    done: set[int] = set()
    cancelled: set[int] = set()
    for record in read_records(path):
        if "done" in record:
            done.update(record["done"])
        elif "cancelled" in record:
            cancelled.update(record["cancelled"])
        else:
            pending[record["n"]] = record
    # Records on overlapping paths are carried out in order, so a later record that is done
    # implies the earlier ones were too, even if a power cut lost their done records (not a
    # cancelled one: it never ran).
    done_paths: set[str] = set()
    done_above: set[str] = set()  # every ancestor of a path in done_paths
    result = []
    for n, record in sorted(pending.items(), reverse=True):
        path = str(record["path"])
        if n in cancelled:
            continue
        if n in done:
            done_paths.add(path)
            done_above.update(ancestors(path))
            continue
        if record.get("op") != "unmarked" and (
                path in done_paths or path in done_above
                or any(a in done_paths for a in ancestors(path))):
            continue
        result.append({k: v for k, v in record.items() if k != "n"})
    result.reverse()
    return result


def ancestors(path: str) -> list[str]:
    """``/a/b/c`` -> ``/a/b``, ``/a``, ``/``."""
    found = []
    while path not in ("/", ""):
        path = path.rpartition("/")[0] or "/"
        found.append(path)
    return found


def _without_superseded(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A staging file (or arena slot) named by several ``stage`` records belongs to the last
    one (a record carrying its content inline names none)."""
    last: dict[tuple[str, int], int] = {}
    for index, record in enumerate(records):
        if record.get("op") == "stage" and "file" in record:
            last[_holder(record)] = index
    return [r for i, r in enumerate(records)
            if r.get("op") != "stage" or "file" not in r or last[_holder(r)] == i]


def _holder(record: Mapping[str, Any]) -> tuple[str, int]:
    """What holds a ``stage`` record's content: a staging file, or a slot of an arena."""
    return str(record["file"]), int(record.get("slot", -1))
