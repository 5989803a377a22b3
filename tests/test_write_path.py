"""The write path under the conditions that break it: small memory limits, files parked
while their upload waits, changes by path of a removed file, background errors, and error
paths between two steps. Each test states the promise it holds the mount to.

Through real mounts (versitygw through the fault proxy, memory://) where the kernel's part
matters; in-process (:class:`~rucio_fs.fuse.fs.RucioFs` over the memory backend) where the step
to break is inside the daemon.
"""

from __future__ import annotations

import errno
import os
import re
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pyfuse3
import pytest
import trio
from conftest import journal_records, run_cli, staged_bytes, wait_for
from fault_proxy import fault_proxy
from test_s3 import mount_s3, unique
from test_write_faults import _stored

from rucio_fs.catalog.catalog import Catalog
from rucio_fs.config import MountConfig
from rucio_fs.errors import Unavailable
from rucio_fs.fuse.fs import RucioFs
from rucio_fs.fuse.inodes import ROOT_INO
from rucio_fs.observe.stats import Stats
from rucio_fs.registry import open_backend
from rucio_fs.write import writeback as writeback_module
from rucio_fs.write.writeback import WriteBack

MiB = 1 << 20
ASYNC = ("--write-back", "async")
SHORT = ("--option", "timeout=1s", "--timeout", "5")


def _content(size: int, seed: str = "") -> bytes:
    block = uuid.uuid5(uuid.NAMESPACE_OID, f"{seed}{size}").bytes * 4096
    return (block * (size // len(block) + 1))[:size]


def _uploads(mnt) -> str:
    return run_cli("uploads", str(mnt.path)).stdout


def _tried_and_failed(mnt, path: str) -> bool:
    """Whether the queued upload of ``path`` failed at least once (it waits for its retry)."""
    return re.search(rf"queued put {re.escape(path)} \((try [2-9]|try \d\d|running)\): ",
                     _uploads(mnt)) is not None


def _staging_files(staging: Path) -> list[Path]:
    """The staging files of single files (not the arena, not the journal)."""
    return [p for p in staging.glob("*.data") if not p.name.startswith("arena")]


# -- a commit never waits for bytes it holds itself ----------------------------------------


def test_a_queued_multipart_upload_within_a_small_memory_limit_completes(mount_fs, s3_server):
    """Promise: with any ``--memory-limit`` the daemon accepts, what async close queued is
    uploaded (``uploads --wait`` returns 0, the object is byte-identical). The uploads' share
    of 16M is 4M: below one 5M part, which is let through alone, so a commit must hold no
    bytes while its parts take theirs."""
    prefix = unique("budget")
    data = _content(12 * MiB)
    mnt = mount_s3(mount_fs, s3_server.endpoint, prefix, "-o", "part_size=5M",
                   "--memory-limit", "16M", *ASYNC)
    (mnt.path / "big").write_bytes(data)
    try:
        waited = run_cli("uploads", "--wait", str(mnt.path), timeout=90)
    except subprocess.TimeoutExpired:
        pytest.fail("uploads --wait hung: the queued upload never finished")
    assert waited.returncode == 0, waited.stdout + waited.stderr
    assert _stored(s3_server, f"{prefix}/big") == data


# -- a parked file is opened again for a change by path -------------------------------------


def test_truncate_by_path_of_a_file_whose_upload_waits(mount_fs, s3_server):
    """Promise: ``truncate(path)`` of a file async-closed and queued (its staging file
    parked) is a change like any other: it succeeds, and the server gets the truncated
    content once it takes uploads."""
    prefix = unique("parked-truncate")
    data = _content(3 * MiB)
    with fault_proxy(s3_server.endpoint) as proxy:
        proxy.inject("error", f"/{prefix}/f", method="PUT")
        mnt = mount_s3(mount_fs, proxy.url, prefix, *SHORT, *ASYNC)
        (mnt.path / "f").write_bytes(data)
        wait_for(lambda: _tried_and_failed(mnt, "/f"), timeout=30, interval=0.2)
        os.truncate(mnt.path / "f", 1000)
        assert (mnt.path / "f").read_bytes() == data[:1000]
        proxy.clear()
        waited = run_cli("uploads", "--wait", str(mnt.path), timeout=90)
        assert waited.returncode == 0, waited.stdout + waited.stderr
        assert _stored(s3_server, f"{prefix}/f") == data[:1000]


# -- background errors of any kind are survived --------------------------------------------


def test_a_queued_upload_whose_staging_file_is_gone_does_not_take_the_mount_down(
        mount_fs, s3_server, tmp_path):
    """Promise: a background error of any type (here the OSError of a staging file removed
    behind the daemon's back, met when its queued upload is tried again) is logged, counted
    and survived: the mount keeps serving, the file stays listed as not uploaded."""
    prefix = unique("gone-async")
    staging = tmp_path / "staging"
    with fault_proxy(s3_server.endpoint) as proxy:
        proxy.inject("error", f"/{prefix}/f", method="PUT")
        mnt = mount_s3(mount_fs, proxy.url, prefix, *SHORT, *ASYNC,
                       "--staging-dir", str(staging))
        (mnt.path / "f").write_bytes(_content(2 * MiB))
        wait_for(lambda: _tried_and_failed(mnt, "/f"), timeout=30, interval=0.2)
        for staged in _staging_files(staging):
            staged.unlink()
        proxy.clear()
        wait_for(lambda: mnt.stats()["events"].get("background_errors", 0) >= 1,
                 timeout=30, interval=0.2)
        (mnt.path / "other").write_bytes(b"still serving")
        waited = run_cli("uploads", "--wait", str(mnt.path), timeout=60)
        assert waited.returncode != 0 and "/f" in waited.stdout + waited.stderr
        assert _stored(s3_server, f"{prefix}/other") == b"still serving"


# -- sync close of a new empty file ----------------------------------------------------------


def test_sync_close_of_a_new_empty_file_returns_zero_only_once_it_is_stored(mount_fs,
                                                                           s3_server):
    """Promise (sync write-back): a ``close`` that returned 0 means the object is on the
    server, also for a new empty file (``touch``); a refused upload fails the close."""
    prefix = unique("empty")
    with fault_proxy(s3_server.endpoint) as proxy:
        mnt = mount_s3(mount_fs, proxy.url, prefix, *SHORT)
        proxy.inject("error", f"/{prefix}/refused", method="PUT")
        touched = subprocess.run(["touch", str(mnt.path / "refused")], capture_output=True,
                                 text=True)
        assert touched.returncode != 0, "touch returned 0 but the server refused the object"
        assert _stored(s3_server, f"{prefix}/refused") is None
        assert subprocess.run(["touch", str(mnt.path / "taken")]).returncode == 0
        assert _stored(s3_server, f"{prefix}/taken") == b""
        proxy.clear()
        wait_for(lambda: _stored(s3_server, f"{prefix}/refused") == b"", timeout=40,
                 interval=0.5)


def test_a_shell_redirect_into_a_new_file_stores_what_was_written(mount_fs, s3_server):
    """``echo x > f`` closes a duplicate of the new, empty file before writing: the object
    ends byte-identical to what was written, whatever was stored in between."""
    prefix = unique("redirect")
    mnt = mount_s3(mount_fs, s3_server.endpoint, prefix)
    done = subprocess.run(["sh", "-c", f"echo hello > '{mnt.path / 'f'}'"])
    assert done.returncode == 0
    assert _stored(s3_server, f"{prefix}/f") == b"hello\n"


# -- a removed file's handle never reaches the file that took its name ------------------------


def test_ftruncate_of_a_removed_file_leaves_the_new_file_of_its_name_alone(mount_fs):
    """Promise: an open descriptor keeps naming the file it opened. A holds ``f`` open, B
    removes ``f`` and writes a new ``f``; A's ``ftruncate`` and ``fstat`` concern A's file
    only, and B's ``f`` stays as B wrote it."""
    mnt = mount_fs(f"memory://detached-{uuid.uuid4().hex[:8]}")
    path = mnt.path / "f"
    path.write_bytes(b"the old content")
    held = os.open(path, os.O_RDWR)
    try:
        os.unlink(path)
        path.write_bytes(b"B's file")
        os.ftruncate(held, 3)
        assert os.fstat(held).st_size == 3
        assert os.pread(held, 100, 0) == b"the"
        assert path.read_bytes() == b"B's file"
    finally:
        os.close(held)
    assert path.read_bytes() == b"B's file"
    assert os.listdir(mnt.path) == ["f"]


# -- in-process: steps inside the daemon ---------------------------------------------------


class _Harness:
    """One writable mount of a memory catalog in this process: the FUSE operations of
    :class:`RucioFs` over a :class:`WriteBack` staging in ``staging``."""

    def __init__(self, staging: Path, nursery: trio.Nursery, asynchronous: bool,
                 backend: Any = None, **config: Any) -> None:
        self.backend = backend or open_backend(f"memory://wp-{uuid.uuid4().hex[:8]}")
        self.catalog = Catalog(self.backend, MountConfig(**config), Stats())
        self.writes = WriteBack(self.catalog, str(staging), "memory://test",
                                asynchronous=asynchronous)
        self.writes.nursery = self.catalog.nursery = nursery
        if asynchronous:
            nursery.start_soon(self.writes.queue.run)
        self.fs: RucioFs | None = None
        self.nursery = nursery

    async def mount(self) -> RucioFs:
        root = await self.catalog.stat("/")
        self.fs = RucioFs(self.catalog, root, self.catalog.config, self.catalog.stats,
                          writeback=self.writes)
        self.fs.nursery = self.nursery
        return self.fs


async def _with_stored_file(tmp_path: Path, nursery: trio.Nursery
                            ) -> tuple[_Harness, RucioFs, Any]:
    """A sync mount of a memory catalog holding ``/d/f`` (``stored content``); returns the
    harness, the file system and ``d``'s attributes (looked up)."""
    backend = open_backend(f"memory://wp-{uuid.uuid4().hex[:8]}")
    await backend.mkdir("/d")
    await backend.put("/d/f", b"stored content")
    harness = _Harness(tmp_path, nursery, asynchronous=False, backend=backend)
    fs = await harness.mount()
    return harness, fs, await fs.lookup(ROOT_INO, b"d", _ctx())


def _ctx() -> Any:
    class Ctx:
        uid, gid, pid, umask = os.getuid(), os.getgid(), os.getpid(), 0o022

    return Ctx()


def test_a_write_during_the_sync_of_an_async_close_is_synced_by_the_next_close(tmp_path,
                                                                               monkeypatch):
    """Promise (async write-back, ``--durable close``): once a ``close`` returned, what was
    written before it is durable. A write landing (through another descriptor) while an
    earlier close syncs the staging file is newer than that sync: the next close must sync
    again."""
    syncs: list[int] = []
    in_sync, go_on = threading.Event(), threading.Event()

    def slow_sync(data_fd: int, journal_fd: int) -> None:
        syncs.append(data_fd)
        if len(syncs) == 1:
            in_sync.set()
            go_on.wait(10)

    monkeypatch.setattr(writeback_module, "_sync_both", slow_sync)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            harness = _Harness(tmp_path, nursery, asynchronous=True, durable="close")
            writes = harness.writes
            dirty = writes.open("/f", None)
            await dirty.write(0, _content(2 * MiB))  # beyond a slot: a staging file's sync

            async def second_writer() -> None:
                await trio.to_thread.run_sync(in_sync.wait, 10)
                await dirty.write(0, b"newer")
                go_on.set()

            nursery.start_soon(second_writer)
            await writes.close(dirty)
            await writes.close(dirty)  # the close after the newer write
            assert len(syncs) == 2, "the write made during the first sync was never synced"
            nursery.cancel_scope.cancel()

    trio.run(main)


@pytest.mark.parametrize("durable", ["fsync", "close"])
def test_an_async_close_of_a_small_file_accounts_for_it_once_and_its_upload_frees_its_slot(
        tmp_path, durable):
    """Promise (async write-back): once a ``close`` returned, the journal accounts for the
    content, so a next mount would upload it. With ``--durable fsync`` (the default) the
    record made with the file does, naming the arena slot that holds the content: the close
    copies nothing (a read and a write per file). With ``--durable close`` the content is
    copied into the journal with its record, which is synced. Either way the upload frees
    what held the content."""
    content = b"a small file"

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            harness = _Harness(tmp_path, nursery, asynchronous=True, durable=durable)
            writes = harness.writes
            appended = []
            append = writes.journal.append
            writes.journal.append = lambda record, inline=None: (  # type: ignore[method-assign]
                appended.append(record["op"]) or append(record, inline))
            dirty = writes.open("/f", None)
            await dirty.write(0, content)
            await writes.close(dirty)
            # (No checkpoint since: the queued upload has not started.)
            [record] = journal_records(tmp_path)
            assert record["path"] == "/f" and staged_bytes(tmp_path, record) == content
            if durable == "fsync":
                assert "slot" in record and "inline" not in record
                assert appended == ["stage"], "the close journaled the file again"
            else:
                assert "inline" in record and writes.journal.syncs == 1
            await writes.release(dirty)
            await writes.queue.wait(lambda op: True)
            stored = await harness.backend.stat("/f")
            handle = await harness.backend.open("/f", stored)
            assert bytes(await harness.backend.read(handle, 0, 100)) == content
            assert writes.arena.in_use == 0 and journal_records(tmp_path) == []
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_parking_a_file_waits_for_its_parts_in_flight(tmp_path, monkeypatch):
    """Promise: the bytes uploaded are the bytes written. A part read from the staging file
    in a worker thread while the last writer leaves (and the file is parked, its descriptor
    closed) must not read through a closed descriptor, nor through its number reused by
    another file."""
    real_read = writeback_module.read_exactly
    reading, go_on = threading.Event(), threading.Event()

    def slow_read(fd: int, offset: int, size: int) -> bytes:
        if offset == 0 and not reading.is_set():
            reading.set()
            go_on.wait(10)
        return real_read(fd, offset, size)

    monkeypatch.setattr(writeback_module, "read_exactly", slow_read)
    data = _content(3 * MiB + 5)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            harness = _Harness(tmp_path, nursery, asynchronous=True)
            writes = harness.writes
            dirty = writes.open("/f", None)
            for offset in range(0, len(data), 128 << 10):
                await dirty.write(offset, data[offset:offset + (128 << 10)])
            await trio.to_thread.run_sync(reading.wait, 10)  # part 1 read under way
            await writes.release(dirty)  # the last writer: async close, then parked
            decoy = os.open(tmp_path / "decoy", os.O_RDWR | os.O_CREAT)
            os.pwrite(decoy, b"\xff" * (2 * MiB), 0)
            go_on.set()
            try:
                await writes.settle("/f")
            finally:
                os.close(decoy)
            stored = harness.backend._file("/f").data
            assert bytes(stored) == data
            nursery.cancel_scope.cancel()

    trio.run(main)


class _CloseFails:
    """The memory backend whose read handles fail to close (a network error at close)."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    async def close(self, handle: Any) -> None:
        raise Unavailable("injected: the handle could not be closed")


def test_a_release_that_fails_still_lets_the_writer_go(tmp_path):
    """Promise: a failed ``release`` leaves no writer behind: the file's pending content is
    uploaded (or pending) as after any last close, and its directory can be removed once
    the file is gone."""

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            harness, fs, d = await _with_stored_file(tmp_path, nursery)
            backend = harness.backend
            f = await fs.lookup(d.st_ino, b"f", _ctx())
            info = await fs.open(f.st_ino, os.O_RDWR, _ctx())
            assert await fs.read(info.fh, 0, 6) == b"stored"  # opens a read handle
            await fs.write(info.fh, 0, b"STORED")
            backend.close = _CloseFails(backend).close  # type: ignore[method-assign]
            with pytest.raises(pyfuse3.FUSEError):
                await fs.release(info.fh)
            await _no_writer_left(harness, fs, d, b"STORED content", "release")
            nursery.cancel_scope.cancel()

    trio.run(main)



async def _no_writer_left(harness, fs, d, stored: bytes, what: str) -> None:
    """After a failed ``what``: no writer holds ``/d/f``, the server keeps ``stored``, and
    the file and its directory can be removed."""
    assert not harness.writes.files, f"the failed {what} left its writer behind"
    assert bytes(harness.backend._file("/d/f").data) == stored
    await fs.unlink(d.st_ino, b"f", _ctx())
    await fs.rmdir(ROOT_INO, b"d", _ctx())


def test_the_retry_loop_survives_an_error_of_any_type(tmp_path, monkeypatch):
    """Promise: pending files (sync write-back) are retried on their own until the server
    takes them; a retry that fails with an unexpected error (an OSError of the staging
    disk) is logged and counted, and the loop goes on."""
    monkeypatch.setattr(writeback_module, "RETRY_FIRST", 0.01)
    real_commit = writeback_module.DirtyFile.commit
    failures: list[Exception] = [OSError(errno.EIO, "injected: the staging disk failed"),
                                 Unavailable("injected: the server is down")]

    async def commit(self):  # type: ignore[no-untyped-def]
        if failures:
            raise failures.pop()
        return await real_commit(self)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            harness = _Harness(tmp_path, nursery, asynchronous=False)
            writes = harness.writes
            dirty = writes.open("/f", None)
            await dirty.write(0, b"pending content")
            monkeypatch.setattr(writeback_module.DirtyFile, "commit", commit)
            await writes.release(dirty)  # its upload failed: pending
            assert [d.path for d in writes.pending()] == ["/f"]
            nursery.start_soon(writes.run_retries)
            with trio.fail_after(10):
                while writes.pending():
                    await trio.sleep(0.01)
            assert bytes(harness.backend._file("/f").data) == b"pending content"
            assert harness.catalog.stats.events["background_errors"] == 1
            assert not failures, "an injected failure never happened"
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_a_create_that_fails_after_opening_lets_the_writer_go(tmp_path, monkeypatch):
    """Promise: a failed ``create`` (here its truncation of an existing file, on a staging
    disk that is full) leaves no writer behind: the file is not held open for ever, and its
    directory can be removed once the file is gone."""
    real_truncate = writeback_module.DirtyFile.truncate

    async def full_disk(self, size):  # type: ignore[no-untyped-def]
        raise OSError(errno.ENOSPC, "injected: the staging disk is full")

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            harness, fs, d = await _with_stored_file(tmp_path, nursery)
            monkeypatch.setattr(writeback_module.DirtyFile, "truncate", full_disk)
            with pytest.raises(pyfuse3.FUSEError):
                await fs.create(d.st_ino, b"f", 0o100644, os.O_WRONLY | os.O_TRUNC, _ctx())
            monkeypatch.setattr(writeback_module.DirtyFile, "truncate", real_truncate)
            await _no_writer_left(harness, fs, d, b"stored content", "create")
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_a_directory_whose_mkdir_failed_lists_empty_and_can_be_removed(mount_fs, s3_server):
    """Promise (async write-back): a directory made through the mount is there until it is
    removed through it, whatever the server answered its ``mkdir`` meanwhile: after the
    caches are dropped it lists empty (the server says no such directory), and ``rmdir``
    removes it."""
    prefix = unique("mkdir-failed")
    with fault_proxy(s3_server.endpoint) as proxy:
        proxy.inject("error", f"/{prefix}/d/", method="PUT")
        mnt = mount_s3(mount_fs, proxy.url, prefix, *SHORT, *ASYNC)
        (mnt.path / "d").mkdir()
        wait_for(lambda: re.search(r"queued mkdir /d \(try [2-9]", _uploads(mnt)),
                 timeout=30, interval=0.2)
        mnt.drop()
        assert os.listdir(mnt.path / "d") == []
        (mnt.path / "d").rmdir()
        assert not (mnt.path / "d").exists()
        proxy.clear()  # the mkdir may have reached the server: it goes, then the rmdir
        waited = run_cli("uploads", "--wait", str(mnt.path), timeout=60)
        assert waited.returncode == 0, waited.stdout + waited.stderr
        assert _stored(s3_server, f"{prefix}/d/") is None


def test_an_upload_finishing_during_the_sync_of_a_later_close_is_not_queued_again(
        tmp_path, monkeypatch):
    """Promise (async write-back, ``--durable close``): a close returns once what was written
    is durable and queued or uploaded. When the upload queued by an earlier close finishes
    while a later close syncs the staging file, and it took the later write with it, the
    later close has nothing left to queue (it raised an AssertionError: its record was gone
    with the upload)."""
    syncs: list[int] = []
    state: dict[str, Any] = {}

    def sync_after_upload(data_fd: int, journal_fd: int) -> None:
        syncs.append(data_fd)
        if len(syncs) == 2:  # the later close: the earlier upload finishes meanwhile
            dirty = state["dirty"]
            deadline = time.monotonic() + 10
            while (dirty.op is not None or dirty.dirty) and time.monotonic() < deadline:
                time.sleep(0.01)
            state["uploaded_during_sync"] = not dirty.dirty

    monkeypatch.setattr(writeback_module, "_sync_both", sync_after_upload)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            harness = _Harness(tmp_path, nursery, asynchronous=True, durable="close")
            writes = harness.writes
            dirty = state["dirty"] = writes.open("/f", None)
            await dirty.write(0, _content(2 * MiB))  # beyond a slot: a staging file's sync
            await writes.close(dirty)
            await dirty.write(0, b"newer")
            await writes.close(dirty)
            assert state["uploaded_during_sync"], "the upload never finished during the sync"
            await writes.release(dirty)
            await writes.settle("/f")
            backend = harness.backend
            entry = await backend.stat("/f")
            stored = await backend.read(await backend.open("/f", entry), 0, entry.size)
            assert bytes(stored[:5]) == b"newer" and entry.size == 2 * MiB
            nursery.cancel_scope.cancel()

    trio.run(main)


# -- what the mount wrote is what it reads ---------------------------------------------------


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_rewrite_under_the_coarse_version_of_the_content_it_replaces_reads_as_written(
        mount_fs, irods_server, tmp_path, mode):
    """iRODS versions a file by its modification second and size: content written through
    the mount with the size and second of content read before it (git's ``index.lock``
    renamed onto ``index``, a file rewritten in place) gets that content's version. The
    promise: a read after the change returns what was written, on this mount and on the
    next one sharing its disk cache. The shared second is set with ``utime``, so that the
    versions collide on every run."""
    url = irods_server.url(irods_server.collection(unique("coarse")))
    options = ("--write-back", mode, "--cache-dir", str(tmp_path / "cache"))
    second = 1_700_000_000 * 10**9
    old, renamed, rewritten = b"A" * 436, b"B" * 436, b"C" * 436
    mnt = mount_fs(url, *options)
    index, lock = mnt.path / "index", mnt.path / "index.lock"
    index.write_bytes(old)
    os.utime(index, ns=(second, second))
    run_cli("uploads", "--wait", str(mnt.path))
    assert index.read_bytes() == old  # cached in memory and on disk, under its version
    lock.write_bytes(renamed)
    os.utime(lock, ns=(second, second))
    os.rename(lock, index)
    run_cli("uploads", "--wait", str(mnt.path))
    assert os.stat(index).st_mtime_ns == second and index.read_bytes() == renamed
    with open(index, "r+b") as f:
        f.write(rewritten)
    os.utime(index, ns=(second, second))
    run_cli("uploads", "--wait", str(mnt.path))
    assert os.stat(index).st_mtime_ns == second and index.read_bytes() == rewritten
    mnt.unmount()
    again = mount_fs(url, *options)
    assert (again.path / "index").read_bytes() == rewritten


# -- permissions on a mount only root enters ----------------------------------------------------


def _super_options(mountpoint: Path) -> list[str]:
    """The super-block options of the mount at ``mountpoint`` (mountinfo's last field)."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == str(mountpoint):
            return fields[-1].split(",")
    raise AssertionError(f"{mountpoint} is not mounted")


def test_a_mount_only_root_enters_answers_permissions_as_a_local_disk_answers_root(
        mount_fs, s3_server, tmp_path):
    """Without allow_other, only root enters a mount of root's, and root may read, write and
    search whatever the bits say: the kernel checks no permission bits there (which would
    cost a GETATTR of a directory after each name made or removed in it), and every answer
    is still a local disk's: ``access`` for each mode, executing with and without an x bit,
    reading a file and listing and writing in a directory that allow nobody."""
    mnt = mount_s3(mount_fs, s3_server.endpoint, unique("perm"))
    assert "default_permissions" not in _super_options(mnt.path)
    local = tmp_path / "local"
    local.mkdir()

    def answers(root: Path) -> list:
        script = b"#!/bin/sh\nexit 3\n"
        for name, mode in (("plain", 0o644), ("tool", 0o755), ("locked", 0o000)):
            (root / name).write_bytes(script)
            os.chmod(root / name, mode)
        os.mkdir(root / "closed")
        os.chmod(root / "closed", 0o000)
        found: list = [os.access(root / name, how) for name in ("plain", "tool", "locked",
                                                               "closed")
                       for how in (os.R_OK, os.W_OK, os.X_OK, os.R_OK | os.X_OK)]
        for name in ("plain", "tool"):
            try:
                found.append(subprocess.run([str(root / name)]).returncode)
            except PermissionError as exc:
                found.append(exc.errno)
        found.append((root / "locked").read_bytes())
        (root / "closed" / "made").write_bytes(b"m")
        found.append(os.listdir(root / "closed"))
        os.chdir(root / "closed")
        os.chdir(tmp_path)
        return found

    assert answers(mnt.path) == answers(local)
    made = mnt.path / "many"
    made.mkdir()
    before = mnt.fuse_calls("getattr")
    for i in range(200):
        (made / f"f{i}").write_bytes(b"x")
    for i in range(200):
        os.unlink(made / f"f{i}")
    assert mnt.fuse_calls("getattr") - before < 20
