"""Async write-back (``--write-back async``) through real mounts on versitygw and the iRODS
fake: what a returned ``close``, ``mkdir``, ``unlink`` and ``rmdir`` promise holds after
``kill -9`` of the daemon, with the server stopped meanwhile, and in the order given.

The promise: once ``close`` returned 0, the content is on the server byte-identical after the
queue has drained, in this mount or in the next one of the same URL and staging directory
(``kill -9``); a name removed or made through the mount is removed or made there too, in
order; nothing else appears. Until then the mount shows the promised state.
"""

from __future__ import annotations

import errno
import os
import random
import shutil
import signal
import subprocess
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import RUCIO_FS, journal_records, run_cli, wait_for
from fault_proxy import fault_proxy
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rucio_fs.observe import control

ASYNC = ("--write-back", "async")
#: Fail fast while the server is down (the uploads are retried in the background anyway).
SHORT = ("--option", "timeout=1s", "--timeout", "3")


class Catalog:
    """One writable catalog location of a test: its URL and mount options."""

    def __init__(self, url: str, options: tuple[str, ...], server) -> None:
        self.url, self.options, self.server = url, options, server


@pytest.fixture(params=["s3", "irods"])
def catalog(request) -> Catalog:
    if request.param == "s3":
        server = request.getfixturevalue("s3_server")
        return Catalog(f"s3://test/async-{uuid.uuid4().hex[:8]}",
                       ("-o", f"endpoint_url={server.endpoint}"), server)
    server = request.getfixturevalue("irods_server")
    return Catalog(server.url(server.collection("async")), (), server)


@pytest.fixture
def s3_catalog(s3_server) -> Catalog:
    return Catalog(f"s3://test/async-{uuid.uuid4().hex[:8]}",
                   ("-o", f"endpoint_url={s3_server.endpoint}"), s3_server)


def small_tree(root: Path, files: int, seed: int = 7) -> None:
    """``files`` files of 0-200 KB in two levels of directories, plus an empty directory."""
    rng = random.Random(seed)
    for i in range(files):
        path = root / f"d{i % 3}" / f"e{i % 2}" / f"f{i:03d}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(rng.choice([0, 1, 700, 30_000, 200_000])))
    (root / "empty").mkdir()


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every directory (None) and file (its bytes) below ``root``, by relative path."""
    found: dict[str, bytes | None] = {}
    for directory, dirs, files in os.walk(root):
        rel = os.path.relpath(directory, root)
        for name in dirs:
            found[os.path.normpath(os.path.join(rel, name))] = None
        for name in files:
            found[os.path.normpath(os.path.join(rel, name))] = (Path(directory) / name
                                                                ).read_bytes()
    return found


def on_server(mount_fs, catalog: Catalog, tmp_path: Path) -> dict[str, bytes | None]:
    """What the server holds, seen through a fresh mount with every cache off."""
    fresh = mount_fs(catalog.url, *catalog.options, "--cold", "--staging-dir",
                     str(tmp_path / f"fresh-{uuid.uuid4().hex[:6]}"))
    try:
        return snapshot(fresh.path)
    finally:
        fresh.unmount()


def drained(mnt) -> None:
    result = run_cli("uploads", "--wait", str(mnt.path))
    assert result.returncode == 0 and "no pending uploads" in result.stdout, result.stdout


def kill(mnt) -> None:
    """kill -9 of the daemon; the kernel mount goes too."""
    pid = mnt.stats()["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not os.path.exists(f"/proc/{pid}"))
    subprocess.run(["fusermount3", "-u", "-z", str(mnt.path)], capture_output=True)


def test_a_copied_and_removed_tree_matches_the_server(catalog, mount_fs, tmp_path):
    source = tmp_path / "source"
    small_tree(source, 60)
    mnt = mount_fs(catalog.url, *catalog.options, *ASYNC, "--staging-dir",
                   str(tmp_path / "staging"))
    subprocess.run(["cp", "-r", str(source), str(mnt.path / "tree")], check=True)
    # Read-your-writes: the mount shows the copy whatever the queue has done.
    assert snapshot(mnt.path / "tree") == snapshot(source)
    drained(mnt)
    assert snapshot(mnt.path / "tree") == snapshot(source)
    held = on_server(mount_fs, catalog, tmp_path)
    assert {k[5:]: v for k, v in held.items() if k.startswith("tree/")} == snapshot(source)
    subprocess.run(["rm", "-r", str(mnt.path / "tree")], check=True)
    assert not (mnt.path / "tree").exists()
    drained(mnt)
    assert on_server(mount_fs, catalog, tmp_path) == {}
    assert journal_records(tmp_path / "staging") == []


def test_removals_queued_meanwhile_go_in_one_request_with_their_directory(
        s3_catalog, mount_fs, tmp_path):
    """``rm -r`` of a directory of 300 files while the server is down: however the removals
    were split while ``rm -r`` ran, once they have failed they are tried again together, in
    one DeleteObjects request each time their backoff ends (they fail and back off together),
    the directory's removal with them (on S3 a key a failed removal leaves keeps the
    directory anyway). Once the server is back that is one request that succeeds, whenever
    the retries come."""
    prefix = s3_catalog.url.split("/", 3)[3]
    s3_catalog.server.seed(prefix, {f"many/f{i:03d}": b"x" for i in range(300)})
    mnt = mount_fs(s3_catalog.url, *s3_catalog.options, *ASYNC, *SHORT,
                   "--staging-dir", str(tmp_path / "staging"))
    assert len(os.listdir(mnt.path / "many")) == 300

    def queued() -> dict[str, dict]:
        return {q["path"]: q for q in control.request(str(mnt.path), "uploads")["queued"]}

    with s3_catalog.server.gateway_down():
        subprocess.run(["rm", "-r", str(mnt.path / "many")], check=True)
        assert not (mnt.path / "many").exists()
        down = control.request(str(mnt.path), "uploads", wait=True, timeout=120)
        assert down["failed"]  # tried now: the server is down
        wait_for(lambda: all(q["attempts"] >= 1 for q in queued().values()))
        # The retries come by themselves (first backoff: 2 s), all removals at once.
        wait_for(lambda: all(q["attempts"] >= 2 and not q["running"]
                             for q in queued().values()), timeout=30)
        tried = queued()
        assert len(tried) == 301 and tried["/many"]["attempts"] >= 2  # with its files
        assert {q["error"] for q in tried.values()} == {tried["/many/f000"]["error"]}
        assert "DeleteObjects of 301 keys" in tried["/many/f000"]["error"]
        mnt.stats(reset=True)
        sent = delete_requests(s3_catalog.server)
    drained(mnt)
    calls = mnt.stats()["backend"]["remove_many"]
    succeeded = calls["latency"]["count"] - sum(calls["errors"].values())
    assert succeeded == 1, calls  # the files and their directory together
    wait_for(lambda: delete_requests(s3_catalog.server) - sent >= 1)
    assert delete_requests(s3_catalog.server) - sent == 1  # as the server counts them
    assert on_server(mount_fs, s3_catalog, tmp_path) == {}


def delete_requests(server) -> int:
    """DeleteObjects requests versitygw has answered (its access log)."""
    return Path(server.env["VGW_ACCESS_LOG"]).read_text().count(" s3_DeleteObjects ")


def test_a_directory_made_and_removed_before_its_mkdir_ran_never_reaches_the_server(
        s3_catalog, mount_fs, tmp_path):
    """Its emptiness is known locally (the server holds nothing below a directory whose mkdir
    was never tried), even with every cache dropped: no listing per rmdir, and neither change
    goes to the server. One with a file or a directory queued in it is not empty."""
    mnt = mount_fs(s3_catalog.url, *s3_catalog.options, *ASYNC,
                   "--write-back-parallelism", "1", "--staging-dir", str(tmp_path / "staging"))
    for i in range(200):
        os.mkdir(mnt.path / f"d{i}")
    mnt.drop()  # as mdtest does between its phases: the empty listings are gone too
    listed_before = mnt.backend_calls("list")
    for i in range(200):
        os.rmdir(mnt.path / f"d{i}")
    drained(mnt)
    # Never a listing per rmdir: only a directory whose mkdir was tried is listed (counted from
    # the mount's start, as the queue may try one while the caches are dropped), and the root.
    # Up to two listings per tried mkdir are allowed: loaded CI machines saw more than one.
    listings = mnt.backend_calls("list") - listed_before
    tried = mnt.backend_calls("mkdir")
    assert listings <= 2 * (tried + 1) and tried < 150, (listings, tried)
    mnt.stats(reset=True)
    os.mkdir(mnt.path / "full")
    (mnt.path / "full" / "f").write_bytes(b"f")
    os.mkdir(mnt.path / "deep")
    os.mkdir(mnt.path / "deep" / "e")
    for directory in ("full", "deep"):
        with pytest.raises(OSError) as raised:
            os.rmdir(mnt.path / directory)
        assert raised.value.errno == errno.ENOTEMPTY
    drained(mnt)
    # deep/e gets a marker, which keeps deep; full is kept by its file's key.
    assert mnt.backend_calls("mkdir") == 1
    assert mnt.stats()["events"]["markers_not_written"] == 2
    assert on_server(mount_fs, s3_catalog, tmp_path) == {
        "full": None, "full/f": b"f", "deep": None, "deep/e": None}


def test_names_in_a_directory_whose_mkdir_never_ran_are_not_asked_of_the_server(
        s3_catalog, mount_fs, tmp_path):
    """mdtest's file creation after a cache drop: a lookup in a directory made here and never
    sent is answered locally (the server holds nothing there), not with a listing or a stat
    apiece; the files still end up on the server, and only there. The server answers late,
    so that most directories are still queued when their files are written."""
    with fault_proxy(s3_catalog.server.endpoint) as proxy:
        proxy.inject("late", method="PUT", times=12)  # the first 12 mkdirs: 3.6 s
        mnt = mount_fs(s3_catalog.url, "-o", f"endpoint_url={proxy.url}", *ASYNC,
                       "--write-back-parallelism", "1",
                       "--staging-dir", str(tmp_path / "staging"))
        for i in range(200):
            os.mkdir(mnt.path / f"d{i}")
        mnt.drop()
        mnt.stats(reset=True)
        for i in range(200):
            (mnt.path / f"d{i}" / "f").write_bytes(b"%d" % i)
        asked = mnt.backend_calls("list") + mnt.backend_calls("stat")
        tried = mnt.backend_calls("mkdir")
        # At most a listing and a stat for a directory whose mkdir was tried meanwhile.
        assert asked <= 2 * tried + 2 and tried < 150, (asked, tried)
        drained(mnt)
    assert on_server(mount_fs, s3_catalog, tmp_path) == {
        **{f"d{i}": None for i in range(200)}, **{f"d{i}/f": b"%d" % i for i in range(200)}}


@contextmanager
def daemon_stopped(mnt):
    """The mount's daemon stopped (SIGSTOP) for the block; running again after it, also
    when it fails."""
    pid = mnt.stats()["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        yield pid
    finally:
        os.kill(pid, signal.SIGCONT)


def written_open(directory: Path, count: int) -> dict[str, tuple[int, bytes]]:
    """``count`` new files written in ``directory`` and left open: name -> (fd, bytes)."""
    directory.mkdir()
    opened = {}
    for i in range(count):
        data = f"file {i}\n".encode() * (i % 50 + 1)
        fd = os.open(directory / f"f{i:03d}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, data)
        opened[f"f{i:03d}"] = (fd, data)
    return opened


def close_while_stopped(opened: dict[str, tuple[int, bytes]]) -> None:
    """Close every file (the daemon is stopped): with no FLUSH to answer, each ``close``
    returns at once; the kernel queues their RELEASEs for when the daemon runs again."""
    done = threading.Event()

    def close_all() -> None:
        for fd, _data in opened.values():
            os.close(fd)
        done.set()

    closer = threading.Thread(target=close_all, daemon=True)
    closer.start()
    assert done.wait(10), "a close waited for the stopped daemon: it sent a FLUSH"


def test_files_closed_without_a_flush_are_all_there_when_uploads_wait_returns(
        s3_catalog, mount_fs, tmp_path):
    """Promise: once ``close`` returned, ``rucio-fs uploads --wait`` returns only with the
    file on the server. A new file's close sends no FLUSH with async write-back: the daemon
    learns of it from the RELEASE the kernel sends afterwards. Here 300 closes return while
    the daemon is stopped, so their RELEASEs are all still queued in the kernel when
    ``uploads --wait`` asks."""
    mnt = mount_fs(s3_catalog.url, *s3_catalog.options, *ASYNC, "--staging-dir",
                   str(tmp_path / "staging"))
    opened = written_open(mnt.path / "d", 300)
    with daemon_stopped(mnt):
        close_while_stopped(opened)
        waiting = subprocess.Popen([*RUCIO_FS, "uploads", "--wait", str(mnt.path)],
                                   stdout=subprocess.PIPE, text=True)
        time.sleep(0.5)  # (connected, its request waits for the daemon)
    out, _ = waiting.communicate(timeout=120)
    assert waiting.returncode == 0 and "no pending uploads" in out, out
    assert mnt.fuse_calls("flush") == 0, "the closes were flushed: nothing was tested"
    held = on_server(mount_fs, s3_catalog, tmp_path)
    assert {k: v for k, v in held.items() if k.startswith("d/")} == {
        f"d/{name}": data for name, (_fd, data) in opened.items()}


def test_files_closed_without_a_flush_are_on_the_server_when_fsync_of_their_directory_returns(
        s3_catalog, mount_fs, tmp_path):
    """Promise: an ``fsync`` of a directory returns once everything closed in it before is
    on the server, also files whose RELEASE the kernel still held when it was called."""
    mnt = mount_fs(s3_catalog.url, *s3_catalog.options, *ASYNC, "--staging-dir",
                   str(tmp_path / "staging"))
    opened = written_open(mnt.path / "d", 200)
    directory = os.open(mnt.path / "d", os.O_RDONLY | os.O_DIRECTORY)
    try:
        with daemon_stopped(mnt):
            close_while_stopped(opened)
        os.fsync(directory)
    finally:
        os.close(directory)
    stored = Path(s3_catalog.server.env["VGW_DATA"]) / "test" / s3_catalog.url.split("/")[3] / "d"
    assert {p.name: p.read_bytes() for p in stored.iterdir()} == {
        name: data for name, (_fd, data) in opened.items()}


def test_files_closed_without_a_flush_are_uploaded_by_an_unmount_right_after(
        s3_catalog, mount_fs, tmp_path):
    """Promise: after unmount, the server holds every file closed before it. The kernel may
    end the session with the RELEASEs of files closed without a FLUSH still unsent: the
    daemon's shutdown uploads what is still open too."""
    mnt = mount_fs(s3_catalog.url, *s3_catalog.options, *ASYNC, "--staging-dir",
                   str(tmp_path / "staging"))
    opened = written_open(mnt.path / "d", 200)
    with daemon_stopped(mnt) as pid:
        close_while_stopped(opened)
        subprocess.run(["fusermount3", "-u", str(mnt.path)], check=True, timeout=30)
    wait_for(lambda: not os.path.exists(f"/proc/{pid}"), timeout=120)
    held = on_server(mount_fs, s3_catalog, tmp_path)
    assert {k: v for k, v in held.items() if k.startswith("d/")} == {
        f"d/{name}": data for name, (_fd, data) in opened.items()}
    assert journal_records(tmp_path / "staging") == []


def test_kill_9_right_after_cp_loses_nothing(catalog, mount_fs, tmp_path):
    source = tmp_path / "source"
    small_tree(source, 40, seed=8)
    staging = str(tmp_path / "staging")
    mnt = mount_fs(catalog.url, *catalog.options, *ASYNC, "--staging-dir", staging)
    subprocess.run(["cp", "-r", str(source), str(mnt.path / "tree")], check=True)
    kill(mnt)
    again = mount_fs(catalog.url, *catalog.options, *ASYNC, "--staging-dir", staging)
    drained(again)
    held = on_server(mount_fs, catalog, tmp_path)
    assert {k[5:]: v for k, v in held.items() if k.startswith("tree/")} == snapshot(source)
    assert set(held) == {"tree"} | {f"tree/{k}" for k in snapshot(source)}
    assert journal_records(Path(staging)) == []


@pytest.mark.parametrize("where", ["staging-dir", "cache-dir"])
def test_the_server_down_during_the_copy_then_a_kill_loses_nothing(s3_catalog, mount_fs,
                                                                    tmp_path, where):
    """Also with the staging directory where ``--cache-dir`` puts it (``staging/`` in it):
    the disk layer, loading the blocks a previous mount left, leaves it alone."""
    source = tmp_path / "source"
    small_tree(source, 30, seed=9)
    if where == "staging-dir":
        staging = str(tmp_path / "staging")
        place = ("--staging-dir", staging)
    else:
        staging = str(tmp_path / "cache" / "staging")
        place = ("--cache-dir", str(tmp_path / "cache"))
    mnt = mount_fs(s3_catalog.url, *s3_catalog.options, *ASYNC, *SHORT, *place)
    os.listdir(mnt.path)  # the root's listing answers lookups while the server is down
    with s3_catalog.server.gateway_down():
        subprocess.run(["cp", "-r", str(source), str(mnt.path / "tree")], check=True)
        assert snapshot(mnt.path / "tree") == snapshot(source)
        kill(mnt)
        assert journal_records(Path(staging)), "nothing journaled"
    again = mount_fs(s3_catalog.url, *s3_catalog.options, *ASYNC, *place)
    drained(again)
    held = on_server(mount_fs, s3_catalog, tmp_path)
    assert {k[5:]: v for k, v in held.items() if k.startswith("tree/")} == snapshot(source)
    assert journal_records(Path(staging)) == []


def test_what_a_durable_close_promised_needs_only_the_synced_journal(s3_catalog, mount_fs,
                                                                     tmp_path):
    """A power cut keeps only what was synced. With ``--durable close`` an async close of a
    small file syncs its content into the journal and nothing else, so losing every staging
    and arena file (all unsynced) after ``kill -9`` must lose nothing whose close
    returned."""
    source = tmp_path / "source"
    small_tree(source, 30, seed=10)
    (source / "zero-length").write_bytes(b"")
    staging = tmp_path / "staging"
    mnt = mount_fs(s3_catalog.url, *s3_catalog.options, *ASYNC, *SHORT, "--durable", "close",
                   "--staging-dir", str(staging))
    os.listdir(mnt.path)
    with s3_catalog.server.gateway_down():
        subprocess.run(["cp", "-r", str(source), str(mnt.path / "tree")], check=True)
        kill(mnt)
        lost = [p for p in staging.iterdir() if p.suffix == ".data"]
        assert lost, "no staging or arena file to lose"
        for path in lost:
            path.unlink()
    again = mount_fs(s3_catalog.url, *s3_catalog.options, *ASYNC, "--staging-dir",
                     str(staging))
    drained(again)
    held = on_server(mount_fs, s3_catalog, tmp_path)
    assert {k[5:]: v for k, v in held.items() if k.startswith("tree/")} == snapshot(source)
    assert journal_records(staging) == []


def test_a_close_syncs_nothing_unless_asked_and_fsync_is_the_power_cut_promise(
        s3_catalog, mount_fs, tmp_path):
    """As on a local disk, an async ``close`` syncs nothing (a crash of the daemon loses
    nothing of it: ``test_kill_9_right_after_cp_loses_nothing``), and an ``fsync`` is what
    survives a power cut: a power cut after it, modelled as the loss of everything the
    staging directory holds (nothing there was synced), loses no file an ``fsync`` covered.
    ``--durable close`` syncs at every close."""
    source = tmp_path / "source"
    small_tree(source, 20, seed=11)
    staging = tmp_path / "staging"
    mnt = mount_fs(s3_catalog.url, *s3_catalog.options, *ASYNC, *SHORT,
                   "--staging-dir", str(staging))
    os.listdir(mnt.path)
    with s3_catalog.server.gateway_down():
        subprocess.run(["cp", "-r", str(source), str(mnt.path / "tree")], check=True)
        assert "close_syncs" not in mnt.stats()["events"]
    with open(mnt.path / "covered", "wb") as f:
        f.write(b"fsync covered this")
        f.flush()  # (Python's buffer, not the file, held the bytes until now)
        os.fsync(f.fileno())
    with s3_catalog.server.gateway_down():
        (mnt.path / "uncovered").write_bytes(b"no fsync")
        kill(mnt)
        for path in staging.iterdir():  # the power cut
            path.unlink()
    held = on_server(mount_fs, s3_catalog, tmp_path)
    assert held.get("covered") == b"fsync covered this"
    durable = mount_fs(s3_catalog.url, *s3_catalog.options, *ASYNC, "--durable", "close",
                       "--staging-dir", str(tmp_path / "durable"))
    subprocess.run(["cp", "-r", str(source), str(durable.path / "tree2")], check=True)
    assert durable.stats()["events"]["close_syncs"] == len(
        [p for p in source.rglob("*") if p.is_file()])


def test_a_pending_file_renamed_onto_a_removed_name_keeps_its_content(s3_catalog, mount_fs,
                                                                       tmp_path):
    """``rm b; mv a b`` while ``a``'s upload is queued: the removal of ``b`` was queued after
    that upload, and must not run after it (the server would lose ``a``'s content)."""
    prefix = s3_catalog.url.split("/", 3)[3]
    s3_catalog.server.seed(prefix, {"b": b"old b"})
    mnt = mount_fs(s3_catalog.url, *s3_catalog.options, *ASYNC, *SHORT, "--staging-dir",
                   str(tmp_path / "staging"))
    root = mnt.path
    os.listdir(root)
    with s3_catalog.server.gateway_down():
        (root / "a").write_bytes(b"new content")
        os.unlink(root / "b")
        os.rename(root / "a", root / "b")
        assert (root / "b").read_bytes() == b"new content"
    drained(mnt)
    assert on_server(mount_fs, s3_catalog, tmp_path) == {"b": b"new content"}


def test_write_rename_unlink_and_mkdir_are_replayed_in_order(s3_catalog, mount_fs, tmp_path):
    s3_catalog.server.seed(s3_catalog.url.split("/", 3)[3], {"old": b"on the server",
                                                              "kept": b"stays"})
    staging = str(tmp_path / "staging")
    mnt = mount_fs(s3_catalog.url, *s3_catalog.options, *ASYNC, *SHORT,
                   "--staging-dir", staging)
    root = mnt.path
    assert sorted(os.listdir(root)) == ["kept", "old"]
    with s3_catalog.server.gateway_down():
        (root / "a").write_bytes(b"first")
        os.rename(root / "a", root / "b")
        (root / "c").write_bytes(b"never stored")
        os.unlink(root / "c")
        os.unlink(root / "old")
        os.mkdir(root / "d")
        (root / "d" / "e").write_bytes(b"in d")
        fd = os.open(root / "b", os.O_WRONLY | os.O_TRUNC)
        os.write(fd, b"second")
        try:
            os.close(fd)
        except OSError as exc:  # the failed upload of "first", if it was tried already
            assert exc.errno == errno.EIO
        os.mkdir(root / "gone")
        os.rmdir(root / "gone")
        # The mount shows what was promised, although the server has none of it.
        assert sorted(os.listdir(root)) == ["b", "d", "kept"]
        assert snapshot(root / "d") == {"e": b"in d"}
        assert (root / "b").read_bytes() == b"second"
        kill(mnt)
    again = mount_fs(s3_catalog.url, *s3_catalog.options, *ASYNC, "--staging-dir", staging)
    drained(again)
    assert on_server(mount_fs, s3_catalog, tmp_path) == {
        "b": b"second", "d": None, "d/e": b"in d", "kept": b"stays"}


def test_an_upload_error_after_close_is_kept_and_returned_by_fsync(s3_catalog, mount_fs,
                                                                   tmp_path):
    mnt = mount_fs(s3_catalog.url, *s3_catalog.options, *ASYNC, *SHORT,
                   "--staging-dir", str(tmp_path / "staging"))
    os.listdir(mnt.path)
    with s3_catalog.server.gateway_down():
        (mnt.path / "x").write_bytes(b"queued")  # close returns: staged durably
        fd = os.open(mnt.path / "x", os.O_RDONLY)
        try:
            with pytest.raises(OSError) as raised:
                os.fsync(fd)
            assert raised.value.errno == errno.EIO
        finally:
            os.close(fd)
        listed = run_cli("uploads", str(mnt.path))
        assert listed.returncode == 1 and "queued put /x" in listed.stdout, listed.stdout
        assert (mnt.path / "x").read_bytes() == b"queued"
        # The next close of the path returns the error too (its new content is queued).
        with pytest.raises(OSError) as raised, open(mnt.path / "x", "wb") as f:
            f.write(b"again")
        assert raised.value.errno == errno.EIO
        assert mnt.stats()["events"].get("write_back_errors", 0) >= 1
    drained(mnt)
    assert on_server(mount_fs, s3_catalog, tmp_path) == {"x": b"again"}


def test_a_directory_that_gets_files_needs_no_marker_and_keeps_one_when_it_loses_them(
        s3_catalog, mount_fs, tmp_path):
    """S3 keeps a directory while a key lies below it. The promise: every directory made
    through the mount exists on the server after the drain, also once its files are gone
    (removed or renamed away, before or after their upload), and on a new mount; a new
    directory that received files before its ``mkdir`` went out has no marker of its own
    (one request less per directory), unless it was given a mode or attributes."""
    prefix = s3_catalog.url.split("/", 3)[3]
    source = tmp_path / "source"
    small_tree(source, 24)
    mnt = mount_fs(s3_catalog.url, *s3_catalog.options, *ASYNC, *SHORT,
                   "--staging-dir", str(tmp_path / "staging"))
    root = mnt.path
    os.listdir(root)
    with s3_catalog.server.gateway_down():  # every mkdir is still queued when files land
        subprocess.run(["cp", "-r", str(source), str(root / "tree")], check=True)
        os.mkdir(root / "moded", 0o700)
        (root / "moded" / "f").write_bytes(b"m")
        for name in ("gone-before", "moved-before"):
            os.mkdir(root / name)
            (root / name / "f").write_bytes(b"pending")
        os.unlink(root / "gone-before" / "f")
        os.rename(root / "moved-before" / "f", root / "moved-before-f")
    drained(mnt)
    keys = {item["Key"][len(prefix) + 1:] for page in s3_catalog.server.client()
            .get_paginator("list_objects_v2").paginate(Bucket="test", Prefix=prefix + "/")
            for item in page.get("Contents", [])}
    with_files = {"tree/d0/e0", "tree/d0/e1", "tree/d1/e0", "tree/d1/e1", "tree/d2/e0",
                  "tree/d2/e1"}
    holding_directories = {"tree", "tree/d0", "tree/d1", "tree/d2"}
    assert not {d + "/" for d in with_files | holding_directories} & keys, sorted(keys)
    assert mnt.stats()["events"]["markers_not_written"] == 10
    assert {"tree/empty/", "moded/", "gone-before/", "moved-before/"} <= keys
    # rm -r of a tree of such directories writes no marker (to delete it right after), nor
    # does tree need one: it keeps d0 and d1.
    markers = mnt.backend_calls("mkdir")
    subprocess.run(["rm", "-r", str(root / "tree" / "d2")], check=True)
    drained(mnt)
    assert mnt.backend_calls("mkdir") == markers
    # Their files go after their upload: each directory stays.
    for name in os.listdir(root / "tree" / "d0" / "e0"):
        os.unlink(root / "tree" / "d0" / "e0" / name)
    for name in os.listdir(root / "tree" / "d1" / "e1"):
        os.rename(root / "tree" / "d1" / "e1" / name, root / f"moved-{name}")
    drained(mnt)
    # The knowledge of which markers were not written survives the daemon's kill -9.
    kill(mnt)
    mnt = mount_fs(s3_catalog.url, *s3_catalog.options, *ASYNC, *SHORT,
                   "--staging-dir", str(tmp_path / "staging"))
    root = mnt.path
    for name in os.listdir(root / "tree" / "d0" / "e1"):
        os.unlink(root / "tree" / "d0" / "e1" / name)
    drained(mnt)
    held = on_server(mount_fs, s3_catalog, tmp_path)
    for directory in ("tree/d0/e0", "tree/d0/e1", "tree/d1/e1", "gone-before",
                      "moved-before"):
        assert held.get(directory, b"missing") is None, directory
        assert not any(k.startswith(directory + "/") for k in held), directory
    assert held == snapshot(root)


def test_a_directory_without_its_marker_shows_until_the_server_shows_it(
        s3_catalog, mount_fs, tmp_path):
    """A new directory whose mkdir went without a marker (its subdirectory's mkdir is
    queued) is on the server only once something below it is stored. Until then the mount
    shows it from its queue: also after every cache is dropped, with the server down (so
    nothing below it can be stored), and it can be listed and written into."""
    mnt = mount_fs(s3_catalog.url, *s3_catalog.options, *ASYNC, *SHORT,
                   "--staging-dir", str(tmp_path / "staging"))
    root = mnt.path
    os.listdir(root)
    with s3_catalog.server.gateway_down():
        os.makedirs(root / "d" / "e")
        # d's mkdir ran without a marker; e's cannot be carried out.
        wait_for(lambda: mnt.stats()["events"].get("markers_not_written", 0) >= 1)
        mnt.drop()
        assert os.path.isdir(root / "d") and os.listdir(root / "d") == ["e"]
        (root / "d" / "f").write_bytes(b"f")
        assert sorted(os.listdir(root / "d")) == ["e", "f"]
    drained(mnt)
    assert on_server(mount_fs, s3_catalog, tmp_path) == {"d": None, "d/e": None,
                                                         "d/f": b"f"}


class AsyncMachine(RuleBasedStateMachine):
    """Random files, directories, renames and removals through an async mount, with the
    daemon killed at random points; the server must end up as the model says (what every
    returned ``close``/``mkdir``/``unlink``/``rename`` promised)."""

    names = st.sampled_from(["f1", "f2", "d1/f3", "d1/f4", "d2/f5"])

    def __init__(self) -> None:
        super().__init__()
        ctx = self.context
        self.catalog = Catalog(f"s3://test/machine-{uuid.uuid4().hex[:8]}",
                               ("-o", f"endpoint_url={ctx['server'].endpoint}"),
                               ctx["server"])
        self.staging = ctx["tmp"] / f"staging-{uuid.uuid4().hex[:6]}"
        self.model: dict[str, bytes | None] = {}
        self.mnt = self._mount()

    def _mount(self):
        return self.context["mount_fs"](self.catalog.url, *self.catalog.options, *ASYNC,
                                        "--staging-dir", str(self.staging))

    def _ensure_parent(self, name: str) -> None:
        if "/" in name:
            directory = name.split("/")[0]
            if directory not in self.model:
                os.mkdir(self.mnt.path / directory)
                self.model[directory] = None

    @rule(name=names, size=st.sampled_from([0, 1, 5000, 70_000]), seed=st.integers(0, 99))
    def write(self, name, size, seed):
        self._ensure_parent(name)
        data = random.Random(seed).randbytes(size)
        (self.mnt.path / name).write_bytes(data)
        self.model[name] = data

    @precondition(lambda self: any(v is not None for v in self.model.values()))
    @rule(data=st.data())
    def unlink(self, data):
        name = data.draw(st.sampled_from(sorted(k for k, v in self.model.items()
                                                if v is not None)))
        os.unlink(self.mnt.path / name)
        del self.model[name]

    @precondition(lambda self: any(v is not None for v in self.model.values()))
    @rule(data=st.data(), to=names)
    def rename(self, data, to):
        name = data.draw(st.sampled_from(sorted(k for k, v in self.model.items()
                                                if v is not None)))
        if name == to:
            return
        self._ensure_parent(to)
        os.rename(self.mnt.path / name, self.mnt.path / to)
        self.model[to] = self.model.pop(name)

    @rule(directory=st.sampled_from(["d1", "d2"]))
    def remove_directory_if_empty(self, directory):
        if directory in self.model and not any(k.startswith(directory + "/")
                                               for k in self.model):
            os.rmdir(self.mnt.path / directory)
            del self.model[directory]

    @rule()
    def crash(self):
        kill(self.mnt)
        self.mnt = self._mount()

    @invariant()
    def the_mount_shows_the_model(self):
        assert snapshot(self.mnt.path) == self.model

    def teardown(self):
        drained(self.mnt)
        held = on_server(self.context["mount_fs"], self.catalog, self.context["tmp"])
        self.mnt.unmount()
        assert held == self.model
        assert journal_records(self.staging) == []
        shutil.rmtree(self.staging, ignore_errors=True)


def test_crashes_at_random_points_keep_every_promise(s3_server, mount_fs, tmp_path):
    AsyncMachine.context = {"server": s3_server, "mount_fs": mount_fs, "tmp": tmp_path}
    runner = AsyncMachine.TestCase
    runner.settings = settings(max_examples=6, stateful_step_count=10, deadline=None,
                               suppress_health_check=list(HealthCheck))
    runner().runTest()


def test_attributes_and_modes_queued_while_the_server_is_down_survive_a_kill(
        s3_catalog, mount_fs, tmp_path):
    """Promise: a `chmod`/`touch` of a stored file or a directory, and the mode of a `mkdir`,
    returned with async write-back, are shown at once and reach the server, also when the
    daemon is killed before it could send them (the next mount replays them)."""
    prefix = s3_catalog.url.split("/", 3)[3]
    s3_catalog.server.seed(prefix, {"f": b"stored"})
    staging = str(tmp_path / "staging")
    mnt = mount_fs(s3_catalog.url, *s3_catalog.options, *ASYNC, *SHORT,
                   "--staging-dir", staging)
    root = mnt.path
    os.listdir(root)
    when = 1_300_000_000 * 10**9 + 7
    with s3_catalog.server.gateway_down():
        os.chmod(root / "f", 0o640)
        os.utime(root / "f", ns=(when, when))
        os.mkdir(root / "d", 0o700)
        os.utime(root / "d", ns=(when, when))
        for path, mode in ((root / "f", 0o640), (root / "d", 0o700)):
            info = os.stat(path)
            assert (stat_mode(info), info.st_mtime_ns) == (mode, when), path
        kill(mnt)
    again = mount_fs(s3_catalog.url, *s3_catalog.options, *ASYNC, "--staging-dir", staging)
    drained(again)
    client = s3_catalog.server.client()
    file_meta = client.head_object(Bucket="test", Key=f"{prefix}/f")["Metadata"]
    marker_meta = client.head_object(Bucket="test", Key=f"{prefix}/d/")["Metadata"]
    assert int(file_meta["mode"]) & 0o7777 == 0o640
    assert int(marker_meta["mode"]) & 0o7777 == 0o700
    assert file_meta["mtime"] == marker_meta["mtime"] == "1300000000.000000007"


def stat_mode(info: os.stat_result) -> int:
    return info.st_mode & 0o7777
