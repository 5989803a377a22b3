"""The write-back queue's promises, each held under the step that would break it.

* An upload that failed once and then succeeded is no error: ``uploads --wait``, ``fsync``
  and a rename that waits for it return 0 (the queue forgot the failure of the earlier try).
* A ``mkdir`` replayed from a killed daemon's journal may have reached the server: names the
  server holds below it are found, and ``rmdir`` removes the server's directory.
* A change made through the mount while a listing is being fetched is in that listing when it
  is cached.
* Ops in backoff leave the scheduling window: a put the server refuses for good stays queued
  (never dropped) with a long backoff, and unrelated ops run meanwhile; the queue has a bound
  where a writer waits, at most the mount's ``--timeout``.
* Any error of a background try (an OSError of a staging file) is logged, counted and
  survived: the op is tried again.

The queue's own tests drive :class:`~rucio_fs.write.write_queue.WriteQueue` in-process over a
scripted write-back (virtual time); the others mount versitygw through the fault proxy.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import trio
import trio.testing
from conftest import run_cli, wait_for
from fault_proxy import fault_proxy
from rucio_fs.backends.s3.metadata import format_mtime
from test_s3 import mount_s3, unique
from test_write_back_async import kill
from test_write_faults import _content, _stored

from rucio_fs.backend import Entry
from rucio_fs.catalog.catalog import Catalog
from rucio_fs.config import MountConfig
from rucio_fs.errors import PermissionDenied, RucioFsError, Unavailable
from rucio_fs.observe.stats import Stats
from rucio_fs.registry import open_backend
from rucio_fs.write import write_queue
from rucio_fs.write.write_queue import Op, WriteQueue

ASYNC = ("--write-back", "async")
#: A time with nanoseconds, long past.
PAST_NS = 1_500_000_000_123_456_789


# -- the queue in-process, over a scripted write-back ---------------------------------------


class ScriptedWriteBack:
    """What :class:`WriteQueue` needs of a write-back: ``carry_out`` runs ``script(op)``;
    ``op_done`` records what the queue finished (path, dropped error or None)."""

    def __init__(self, script: Callable[[Op], Awaitable[None]], timeout: float = 5.0) -> None:
        self.script = script
        self.catalog = SimpleNamespace(stats=Stats(),
                                       config=MountConfig(backend_timeout=timeout))
        self.finished: list[tuple[str, RucioFsError | None]] = []

    async def carry_out(self, op: Op) -> None:
        await self.script(op)

    def op_done(self, op: Op, dropped: RucioFsError | None) -> None:
        self.finished.append((op.path, dropped))


def queue_of(script: Callable[[Op], Awaitable[None]], parallelism: int = 4,
             timeout: float = 5.0) -> WriteQueue:
    return WriteQueue(ScriptedWriteBack(script, timeout), parallelism, 1)  # type: ignore[arg-type]


def put(path: str, size: int = 0) -> Op:
    """A queued upload (its content is the script's business)."""
    return Op(0, "put", path, dirty=None, size=size)


def mkdir(path: str) -> Op:
    return Op(0, "mkdir", path)


async def until(predicate: Callable[[], bool]) -> None:
    """Poll in virtual time (the clock jumps while every task sleeps)."""
    while not predicate():
        await trio.sleep(0.5)


async def set_after(seconds: float, event: trio.Event) -> None:
    await trio.sleep(seconds)
    event.set()


def run_virtual(main: Callable[[], Awaitable[None]]) -> None:
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_an_op_whose_try_raises_oserror_is_tried_again_and_the_queue_survives():
    tries: list[str] = []

    async def script(op: Op) -> None:
        tries.append(op.path)
        if len(tries) == 1:
            raise OSError(errno.ENOENT, "the staging file is gone")

    queue = queue_of(script)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(queue.run)
            op = mkdir("/d")
            queue.add(op)
            with trio.fail_after(60):
                await until(lambda: op.done)
            nursery.cancel_scope.cancel()

    run_virtual(main)
    assert tries == ["/d", "/d"]
    assert queue.wb.finished == [("/d", None)]
    assert queue.wb.catalog.stats.events["background_errors"] == 1


def test_wait_returns_once_a_retry_succeeded_after_a_failed_try():
    """The failure of an earlier try is not the outcome of the op."""
    failures = [Unavailable("HTTP 500")]

    async def script(op: Op) -> None:
        if failures:
            raise failures.pop()

    queue = queue_of(script)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(queue.run)
            op = put("/f")
            queue.add(op)
            await until(lambda: op.attempts == 1)
            assert op.error and not op.done
            await queue.wait(lambda _op: True)  # raised the earlier try's error
            assert op.done and not op.error
            nursery.cancel_scope.cancel()

    run_virtual(main)


def test_removals_that_failed_in_several_requests_are_tried_again_in_one():
    """``rm -r`` outpaced the queue: its removals went in two requests, and both failed.
    Their retries come together, in one request, not one per first try's batch."""
    batches: list[int] = []

    async def remove_many(names: list) -> dict:
        batches.append(len(names))
        await trio.sleep(1)
        if len(batches) <= 2:
            raise Unavailable("the server is down")
        return {}

    queue = WriteQueue(ScriptedWriteBack(lambda op: trio.sleep(0)), 4,  # type: ignore[arg-type]
                       1000)
    queue.wb.catalog.remove_many = remove_many

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(queue.run)
            ops = [Op(0, "unlink", f"/d/f{i:03d}") for i in range(200)]
            for op in ops[:100]:
                queue.add(op)
            await until(lambda: bool(batches))
            for op in ops[100:]:
                queue.add(op)
            with trio.fail_after(60):
                await until(lambda: all(op.done for op in ops))
            nursery.cancel_scope.cancel()

    run_virtual(main)
    assert batches == [100, 100, 200]
    assert all(error is None for _path, error in queue.wb.finished)


def test_an_rmdir_goes_with_the_removals_below_it_never_beside_them():
    """Where keys imply directories, a directory's removal goes in the request of the removals
    below it, after them; when those fill a batch and go on, it waits for that one (a server
    keeping directories on disk refuses the marker of one that still holds a file)."""
    batches: list[list[str]] = []

    async def remove_many(items: list) -> dict:
        batches.append([path for path, _kind in items])
        await trio.sleep(1)
        return {}

    queue = WriteQueue(ScriptedWriteBack(lambda op: trio.sleep(0)), 4,  # type: ignore[arg-type]
                       3, implied_directories=True)
    queue.wb.catalog.remove_many = remove_many

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            ops = [Op(0, "unlink", "/a/f1"), Op(0, "rmdir", "/a"), Op(0, "unlink", "/b/f1"),
                   Op(0, "unlink", "/b/f2"), Op(0, "rmdir", "/b")]
            for op in ops:
                queue.add(op)
            nursery.start_soon(queue.run)
            with trio.fail_after(60):
                await until(lambda: all(op.done for op in ops))
            nursery.cancel_scope.cancel()

    run_virtual(main)
    # (the first two went together: in either order)
    assert sorted(batches[:2]) == [["/a/f1", "/a", "/b/f1"], ["/b/f2"]]
    assert batches[2:] == [["/b"]]


def test_refused_puts_stay_queued_and_let_unrelated_ops_run(monkeypatch):
    """3,000 puts refused for good (403) ahead of ready ops on other paths, with a window of
    64: the ready ones run at once; the refused ones stay queued (never dropped), each tried
    once in the next minutes, and block a later op on their own paths."""
    monkeypatch.setattr(write_queue, "WINDOW", 64)

    async def script(op: Op) -> None:
        if op.path.startswith("/locked/"):
            raise PermissionDenied(f"{op.path}: 403 AccessDenied")

    queue = queue_of(script, parallelism=8)
    refused = [put(f"/locked/f{i}") for i in range(3000)]
    free = [put(f"/free/f{i}") for i in range(200)]
    behind = Op(0, "unlink", "/locked/f7")

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(queue.run)
            for op in [*refused, behind, *free]:
                queue.add(op)
            with trio.fail_after(60):
                await until(lambda: all(op.done for op in free))
            await trio.sleep(120)
            nursery.cancel_scope.cancel()

    run_virtual(main)
    assert all(not op.done and op.attempts == 1 and "403" in op.error for op in refused)
    assert not behind.done and behind.attempts == 0  # waits for the put of its path
    assert len(queue.ops) == 3001 and not queue.failed
    assert {path for path, _ in queue.wb.finished} == {op.path for op in free}


def test_an_op_in_backoff_keeps_the_order_of_its_paths_and_drain_stops_behind_it():
    """A mkdir that fails (server down) holds back the later upload below it, not an
    unrelated one; once it succeeds both run in order. At unmount (drain) a put refused for
    good is tried once more, and the drain returns with it and the op behind it queued."""
    tried: list[str] = []
    down = [True]

    async def script(op: Op) -> None:
        tried.append(op.path)
        if op.path == "/d" and down[0]:
            raise Unavailable("connection refused")
        if op.path == "/locked":
            raise PermissionDenied("403")

    queue = queue_of(script)
    made, below, other = mkdir("/d"), put("/d/f"), put("/x")

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(queue.run)
            for op in (made, below, other):
                queue.add(op)
            await until(lambda: other.done and made.attempts >= 2)
            assert not below.done and "/d/f" not in tried
            down[0] = False
            await until(lambda: below.done)
            assert tried[-2:] == ["/d", "/d/f"]  # after the mkdir's successful try
            refused, behind = put("/locked"), Op(0, "unlink", "/locked")
            queue.add(refused)
            queue.add(behind)
            await until(lambda: refused.attempts == 1)
            with trio.fail_after(5):
                await queue.drain()
            assert refused.attempts == 2 and not refused.done and not behind.done
            assert list(queue.ops.values()) == [refused, behind]
            nursery.cancel_scope.cancel()

    run_virtual(main)


def test_a_full_queue_makes_the_writer_wait_then_fail_with_enobufs(monkeypatch):
    """The bound: at the most ops, ``room`` waits for one to leave; while none does, it
    fails after the mount's --timeout with ENOBUFS (the caller's change is refused)."""
    monkeypatch.setattr(write_queue, "QUEUE_MAX_OPS", 10)
    release = trio.Event()

    async def script(op: Op) -> None:
        if op.path == "/slow":
            await release.wait()
            return
        raise PermissionDenied("403")

    queue = queue_of(script, timeout=30.0)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(queue.run)
            await queue.room()  # room at once
            for i in range(9):
                queue.add(put(f"/locked/f{i}"))
            queue.add(put("/slow"))
            start = trio.current_time()
            with pytest.raises(RucioFsError) as refused:
                await queue.room()
            assert refused.value.errno == errno.ENOBUFS
            assert trio.current_time() - start == pytest.approx(30.0)
            nursery.start_soon(set_after, 5, release)
            start = trio.current_time()
            await queue.room()
            assert trio.current_time() - start == pytest.approx(5.0, abs=0.5)
            nursery.cancel_scope.cancel()

    run_virtual(main)


# -- a change while a listing is fetched ------------------------------------------------------


class SlowListing:
    """Wraps a memory backend: a listing sends its first entry, then waits for ``go``."""

    def __init__(self, name: str) -> None:
        self.backend = open_backend(f"memory://{name}")
        self.go = trio.Event()
        backend = self.backend
        inner = type(backend).list

        async def slow_list(self_: object, path: str) -> AsyncIterator[Entry]:
            first = True
            async for entry in inner(self_, path):
                yield entry
                if first:
                    first = False
                    await self.go.wait()

        backend.list = slow_list.__get__(backend)  # type: ignore[method-assign]


@pytest.mark.parametrize("coalescing", [True, False])
def test_a_change_made_while_the_listing_is_fetched_is_in_the_cached_listing(coalescing):
    slow = SlowListing(unique("slow-listing"))

    async def main() -> None:
        catalog = Catalog(slow.backend, MountConfig(coalescing=coalescing), Stats())
        for name in ("a", "b", "c"):
            await slow.backend.put(f"/{name}", name.encode())
        async with trio.open_nursery() as nursery:
            catalog.nursery = nursery
            listing = await catalog.list("/")  # its first entry: the rest is on its way
            assert not listing.done
            await catalog.unlink("/c")  # the backend's listing still names it
            await catalog.mkdir("/new")  # and does not name this
            slow.go.set()
            while not listing.done:
                await listing.wait_beyond(len(listing.entries))
            cached = catalog.listing.get("/")
            assert cached is not None
            assert sorted(cached.by_name) == ["a", "b", "new"]
            assert sorted((await catalog.list("/")).by_name) == ["a", "b", "new"]

    trio.run(main)


# -- through a mount ---------------------------------------------------------------------------


def _fail_two_tries(proxy, mnt, name: str) -> None:
    """Until the queued upload of ``/name`` has failed two tries (four requests each: the
    HTTP client's own retries); its next try comes 4 s later, and succeeds."""
    proxy.inject("error", f"/{name}", times=8, method="PUT")
    wait_for(lambda: f"queued put /{name} (try 3)" in run_cli("uploads", str(mnt.path)).stdout,
             timeout=30, interval=0.05)


def test_an_upload_that_failed_before_it_succeeded_is_no_error(mount_fs, s3_server, tmp_path):
    prefix = unique("failed-then-stored")
    s3_server.seed(prefix, {"moved": b"on the server"})
    with fault_proxy(s3_server.endpoint) as proxy:
        mnt = mount_s3(mount_fs, proxy.url, prefix, "--option", "timeout=1s", "--timeout", "8",
                       *ASYNC, "--staging-dir", str(tmp_path / "staging"))
        os.listdir(mnt.path)
        # uploads --wait
        (mnt.path / "waited").write_bytes(b"waited for")
        _fail_two_tries(proxy, mnt, "waited")
        waited = run_cli("uploads", "--wait", str(mnt.path))
        assert waited.returncode == 0 and "failed" not in waited.stdout, waited.stdout
        assert _stored(s3_server, f"{prefix}/waited") == b"waited for"
        # fsync
        (mnt.path / "synced").write_bytes(b"synced")
        _fail_two_tries(proxy, mnt, "synced")
        fd = os.open(mnt.path / "synced", os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        assert _stored(s3_server, f"{prefix}/synced") == b"synced"
        # a rename, which waits for what is queued on its paths (the file is on the server:
        # the rename goes there too)
        (mnt.path / "moved").write_bytes(b"new content")
        _fail_two_tries(proxy, mnt, "moved")
        os.rename(mnt.path / "moved", mnt.path / "moved-here")
        assert _stored(s3_server, f"{prefix}/moved-here") == b"new content"
        assert _stored(s3_server, f"{prefix}/moved") is None


def tried_again(listed: str) -> str:
    """``uploads`` output in which the mkdirs of /d and /e have failed a try, else ""."""
    failed = all(re.search(rf"queued mkdir /{name} \(try [2-9]", listed) for name in "de")
    return listed if failed else ""


def test_a_replayed_mkdir_counts_as_maybe_sent(mount_fs, s3_server, tmp_path):
    """A daemon killed while its mkdirs of ``d`` and ``e`` were queued after a try the server
    carried out (its answer lost): the next mount replays them, and until they are tried
    again the server's directories are what it shows — a name the server holds below ``d``
    is found, and ``rmdir e`` removes ``e`` from the server."""
    prefix = unique("replayed-mkdir")
    staging = str(tmp_path / "staging")
    client = s3_server.client()
    with fault_proxy(s3_server.endpoint) as proxy:
        url = f"s3://test/{prefix}"
        first = mount_fs(url, "-o", f"endpoint_url={proxy.url}", "--option", "timeout=1s",
                         "-o", "part_size=5M", "--timeout", "8", *ASYNC, "--staging-dir",
                         staging)
        os.listdir(first.path)
        # Queued first, and never uploaded: the next mount's one slot stays busy with it.
        proxy.inject("error", "?uploads", method="POST")
        (first.path / "blocker").write_bytes(_content(11 << 20))
        for name in ("d", "e"):
            proxy.inject("lost-ok", f"/{prefix}/{name}/", times=1, method="PUT")
            proxy.inject("error", f"/{prefix}/{name}/", method="PUT")
            os.mkdir(first.path / name)
        listed = wait_for(lambda: tried_again(run_cli("uploads", str(first.path)).stdout),
                          timeout=30, interval=0.2)
        assert "queued put /blocker" in listed, listed
        assert _stored(s3_server, f"{prefix}/d/") == b""  # the server made them
        assert _stored(s3_server, f"{prefix}/e/") == b""
        kill(first)
        proxy.clear()
        proxy.inject("stall", "?uploads", method="POST")
        second = mount_fs(url, "-o", f"endpoint_url={proxy.url}", "--option", "timeout=10s",
                          "-o", "part_size=5M", "--timeout", "60", *ASYNC,
                          "--write-back-parallelism", "1", "--staging-dir", staging)
        queued = run_cli("uploads", str(second.path)).stdout
        assert "queued mkdir /d (try 1)" in queued and "queued mkdir /e (try 1)" in queued, \
            queued
        client.put_object(Bucket="test", Key=f"{prefix}/d/made-elsewhere", Body=b"elsewhere")
        assert os.stat(second.path / "d" / "made-elsewhere").st_size == len(b"elsewhere")
        assert os.listdir(second.path / "d") == ["made-elsewhere"]
        os.rmdir(second.path / "e")
        assert not (second.path / "e").exists()
        proxy.clear()
        wait_for(lambda: run_cli("uploads", "--wait", str(second.path)).returncode == 0,
                 timeout=120, interval=1)
        assert _stored(s3_server, f"{prefix}/e/") is None
        assert _stored(s3_server, f"{prefix}/d/") == b""
        assert _stored(s3_server, f"{prefix}/d/made-elsewhere") == b"elsewhere"
        assert _stored(s3_server, f"{prefix}/blocker") == _content(11 << 20)
        assert sorted(os.listdir(second.path)) == ["blocker", "d"]


def _marker_copies(s3_server, prefix: str, name: str) -> int:
    """CopyObject requests versitygw logged of marker ``prefix/name/``."""
    log = Path(s3_server.env["VGW_ACCESS_LOG"]).read_text(errors="replace")
    return sum(1 for line in log.splitlines()
               if " s3_CopyObject " in line and f" {prefix}/{name}/ " in line)


def _queue_dir_attributes_behind_a_failing_mkdir(proxy, mnt, name: str) -> None:
    """``mkdir name``, whose marker PUT fails its first tries (so what follows queues behind
    it), then what `rsync -a` does to a directory: time, mode, a file in it, time again."""
    proxy.inject("error", f"/{name}/", times=8, method="PUT")
    os.mkdir(mnt.path / name, 0o700)
    wait_for(lambda: f"queued mkdir /{name} (try 3)" in run_cli("uploads",
                                                                 str(mnt.path)).stdout,
             timeout=30, interval=0.05)
    os.utime(mnt.path / name, ns=(PAST_NS, PAST_NS))
    os.chmod(mnt.path / name, 0o750)
    (mnt.path / name / "f").write_bytes(b"in d")
    os.utime(mnt.path / name, ns=(PAST_NS + 10**9, PAST_NS + 10**9))


def test_attribute_changes_queued_on_one_path_are_stored_by_one_copy(mount_fs, s3_server,
                                                                      tmp_path):
    """A directory's time, mode and time again, queued before any went out, are one copy of
    its marker; the server ends with the last of each."""
    prefix = unique("merged-attrs")
    with fault_proxy(s3_server.endpoint) as proxy:
        mnt = mount_s3(mount_fs, proxy.url, prefix, "--option", "timeout=1s", "--timeout", "8",
                       *ASYNC, "--staging-dir", str(tmp_path / "staging"))
        os.listdir(mnt.path)
        _queue_dir_attributes_behind_a_failing_mkdir(proxy, mnt, "d")
        assert run_cli("uploads", "--wait", str(mnt.path)).returncode == 0
    metadata = s3_server.client().head_object(Bucket="test", Key=f"{prefix}/d/")["Metadata"]
    assert metadata == {"mtime": format_mtime(PAST_NS + 10**9),
                        "mode": str(stat.S_IFDIR | 0o750)}
    assert _marker_copies(s3_server, prefix, "d") == 1


def test_merged_attribute_changes_survive_a_kill(mount_fs, s3_server, tmp_path):
    """The op that took the earlier changes over is journaled before they are cancelled: a
    daemon killed then leaves the next mount all of them to store."""
    prefix = unique("merged-attrs-killed")
    staging = str(tmp_path / "staging")
    with fault_proxy(s3_server.endpoint) as proxy:
        first = mount_s3(mount_fs, proxy.url, prefix, "--option", "timeout=1s", "--timeout", "8",
                         *ASYNC, "--staging-dir", staging)
        os.listdir(first.path)
        _queue_dir_attributes_behind_a_failing_mkdir(proxy, first, "d")
        kill(first)
        second = mount_s3(mount_fs, proxy.url, prefix, *ASYNC, "--staging-dir", staging)
        assert run_cli("uploads", "--wait", str(second.path)).returncode == 0
        shown = os.stat(second.path / "d")
    metadata = s3_server.client().head_object(Bucket="test", Key=f"{prefix}/d/")["Metadata"]
    assert metadata == {"mtime": format_mtime(PAST_NS + 10**9),
                        "mode": str(stat.S_IFDIR | 0o750)}
    assert (shown.st_mtime_ns, stat.S_IMODE(shown.st_mode)) == (PAST_NS + 10**9, 0o750)
