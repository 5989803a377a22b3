"""FUSE passthrough (``--passthrough``) through real mounts: the kernel writes a file open for
writing straight into its staging file, and the daemon still owes the server exactly what
was written.

The promise: whatever the kernel wrote before a ``close`` returned is what the server ends up
holding, byte for byte, also after the daemon's ``kill -9`` (the next mount replays it), and
also when a write comes after a ``touch -d`` or an earlier close; a file open through a
backing file reads back what was written, and so does any other open of it meanwhile. Where
the kernel refuses a backing file, the mount works as without the option.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import random
import subprocess
from pathlib import Path

import pytest
from conftest import overlayfs, run_cli
from test_s3 import mount_s3, unique
from test_write_back_async import drained, kill
from test_write_faults import _stored

from rucio_fs.fuse.passthrough import refusal

ASYNC = ("--write-back", "async")
PASSTHROUGH = (*ASYNC, "--passthrough")


def _events(mnt) -> dict[str, int]:
    return mnt.stats()["events"]


def test_the_kernel_writes_the_staging_file_and_the_server_gets_every_byte(
        mount_fs, s3_server, tmp_path):
    prefix = unique("pt")
    mnt = mount_s3(mount_fs, s3_server.endpoint, prefix, *PASSTHROUGH,
                   "--staging-dir", str(tmp_path / "staging"))
    assert mnt.stats()["kernel"]["passthrough"] is True
    data = random.Random(1).randbytes(9 << 20)
    target = mnt.path / "big.bin"
    with open(target, "wb") as f:  # several writes, a seek back, a rewrite in place
        f.write(data[:5 << 20])
        f.write(data[5 << 20:])
        f.seek(4096)
        f.write(b"X" * 100)
        f.flush()
        assert os.fstat(f.fileno()).st_size == len(data)
        # Another open of the file meanwhile reads what the kernel wrote.
        assert (mnt.path / "big.bin").read_bytes()[4096:4196] == b"X" * 100
    expected = data[:4096] + b"X" * 100 + data[4196:]
    with open(target, "ab") as f:  # a second writer appends
        f.write(b"tail")
    expected += b"tail"
    assert os.stat(target).st_size == len(expected)
    assert target.read_bytes() == expected
    # A small file: the journal keeps no copy of what the kernel may still change.
    (mnt.path / "small").write_bytes(b"small")
    subprocess.run(["cp", str(target), str(mnt.path / "copy.bin")], check=True)
    assert mnt.fuse_calls("write") == 0, "writes reached the daemon"
    assert _events(mnt)["opened_passthrough"] >= 5
    drained(mnt)
    assert _stored(s3_server, f"{prefix}/big.bin") == expected
    assert _stored(s3_server, f"{prefix}/copy.bin") == expected
    assert _stored(s3_server, f"{prefix}/small") == b"small"


def test_a_write_after_a_set_time_and_a_rewrite_of_the_same_size_are_uploaded(
        mount_fs, s3_server, tmp_path):
    """The daemon sees no write: it learns of one from the staging file's size and times.
    A rewrite of the same bytes' length right after a close, and a write after ``touch -d``,
    must both reach the server (``cp -p`` sets the time after its writes: that time stays)."""
    prefix = unique("pt-times")
    mnt = mount_s3(mount_fs, s3_server.endpoint, prefix, *PASSTHROUGH,
                   "--staging-dir", str(tmp_path / "staging"))
    path = mnt.path / "f"
    for i in range(20):
        path.write_bytes(b"%04d" % i)
        assert path.read_bytes() == b"%04d" % i
    os.utime(path, ns=(1_500_000_000_000_000_000, 1_500_000_000_000_000_000))
    with open(path, "r+b") as f:
        f.write(b"late")
    assert os.stat(path).st_mtime_ns != 1_500_000_000_000_000_000
    assert mnt.fuse_calls("write") == 0
    source = tmp_path / "kept"
    source.write_bytes(b"kept time")
    os.utime(source, ns=(1_400_000_000_123_456_789, 1_400_000_000_123_456_789))
    subprocess.run(["cp", "-p", str(source), str(mnt.path / "kept")], check=True)
    assert os.stat(mnt.path / "kept").st_mtime_ns == 1_400_000_000_123_456_789
    drained(mnt)
    assert _stored(s3_server, f"{prefix}/f") == b"late"
    fresh = mount_s3(mount_fs, s3_server.endpoint, prefix, "--cold")
    assert (fresh.path / "kept").read_bytes() == b"kept time"
    assert os.stat(fresh.path / "kept").st_mtime_ns == 1_400_000_000_123_456_789


@pytest.mark.parametrize("closed", [True, False], ids=["closed", "still-open"])
def test_a_write_through_passthrough_survives_kill_9(mount_fs, s3_server, tmp_path, closed):
    """kill -9 right after the writes: the next mount replays the staging file the kernel
    wrote, byte-identical (a file still open is uploaded with what it held, as a local
    file system would keep it)."""
    prefix = unique("pt-kill")
    staging = str(tmp_path / "staging")
    mnt = mount_s3(mount_fs, s3_server.endpoint, prefix, *PASSTHROUGH, "--staging-dir", staging)
    data = random.Random(2).randbytes(3 << 20)
    f = open(mnt.path / "f.bin", "wb")  # noqa: SIM115 (closed or not, as the case says)
    f.write(data)
    f.flush()
    if closed:
        f.close()
    assert _events(mnt)["opened_passthrough"] == 1 and mnt.fuse_calls("write") == 0
    try:
        kill(mnt)
    finally:
        if not closed:
            with contextlib.suppress(OSError):  # the mount is gone
                f.close()
    again = mount_s3(mount_fs, s3_server.endpoint, prefix, *ASYNC, "--staging-dir", staging)
    drained(again)
    assert hashlib.md5(_stored(s3_server, f"{prefix}/f.bin") or b"").digest() == \
        hashlib.md5(data).digest()


def test_a_shared_mapping_writes_through_the_backing_file(mount_fs, s3_server, tmp_path):
    prefix = unique("pt-mmap")
    mnt = mount_s3(mount_fs, s3_server.endpoint, prefix, *PASSTHROUGH,
                   "--staging-dir", str(tmp_path / "staging"))
    path = mnt.path / "mapped"
    with open(path, "w+b") as f:
        f.truncate(8192)
        with mmap.mmap(f.fileno(), 8192) as mapped:
            mapped[100:105] = b"hello"
            mapped.flush()
    assert path.read_bytes()[100:105] == b"hello"
    drained(mnt)
    assert _stored(s3_server, f"{prefix}/mapped") == bytes(100) + b"hello" + bytes(8087)


def test_a_staging_file_the_kernel_refuses_to_back_is_written_through_the_daemon(
        mount_fs, s3_server, tmp_path):
    """Staging on overlayfs (a container's root file system): the kernel refuses it as a
    backing file (stacking too deep), and the mount works as without --passthrough."""
    with overlayfs(tmp_path) as merged:
        prefix = unique("pt-refused")
        mnt = mount_s3(mount_fs, s3_server.endpoint, prefix, *PASSTHROUGH,
                       "--staging-dir", str(merged / "staging"))
        try:
            (mnt.path / "f").write_bytes(b"through the daemon")
            assert (mnt.path / "f").read_bytes() == b"through the daemon"
            assert _events(mnt)["passthrough_refused"] >= 1
            assert _events(mnt).get("opened_passthrough", 0) == 0
            assert mnt.fuse_calls("write") == 1
            drained(mnt)
            assert _stored(s3_server, f"{prefix}/f") == b"through the daemon"
        finally:
            mnt.unmount()


def test_passthrough_where_it_cannot_work_is_a_one_line_notice_and_a_plain_mount(
        mount_fs, s3_server, tmp_path):
    """With sync write-back, --passthrough is refused in one line on stderr, and the mount
    goes on without it."""
    prefix = unique("pt-sync")
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    result = run_cli("mount", f"s3://test/{prefix}", str(mountpoint), "-o",
                     f"endpoint_url={s3_server.endpoint}", "--passthrough")
    try:
        assert result.returncode == 0, result.stderr
        assert result.stderr.strip().splitlines() == [
            "rucio-fs: --passthrough works with --write-back async or --cache-dir: "
            "mounting without it"]
        (mountpoint / "f").write_bytes(b"sync")
        assert _stored(s3_server, f"{prefix}/f") == b"sync"
    finally:
        run_cli("unmount", str(mountpoint))


def test_other_opens_of_a_file_open_through_passthrough_never_fail(mount_fs, s3_server,
                                                                   tmp_path):
    """The kernel refuses to mix opens through a backing file and through the page cache on
    one inode: every open of it meanwhile, for reading or writing, must still work."""
    prefix = unique("pt-mixed")
    mnt = mount_s3(mount_fs, s3_server.endpoint, prefix, *PASSTHROUGH,
                   "--staging-dir", str(tmp_path / "staging"))
    path = mnt.path / "f"
    path.write_bytes(b"stored first")
    drained(mnt)  # uploaded: the next open for reading goes through the page cache
    reader = open(path, "rb")  # noqa: SIM115
    try:
        with open(path, "r+b") as writer:  # not through a backing file: a cached open holds it
            writer.write(b"STORED")
        assert reader.read() in (b"stored first", b"STORED first")  # (no error)
    finally:
        reader.close()
    passed = _events(mnt).get("opened_passthrough", 0)
    with open(path, "r+b") as writer:  # through a backing file now
        assert _events(mnt)["opened_passthrough"] == passed + 1
        writer.write(b"again!")
        writer.flush()
        with open(path, "rb") as other:
            assert other.read() == b"again! first"
    drained(mnt)
    assert _stored(s3_server, f"{prefix}/f") == b"again! first"
    assert Path(path).read_bytes() == b"again! first"


@pytest.mark.parametrize(("arguments", "reason"), [
    (("async", "mount", 0, "6.18.44-fc"), ""),
    (("sync", "mount", 0, "6.18.44-fc"), "--passthrough works with --write-back async or "
                                         "--cache-dir"),
    (("sync", "mount", 0, "6.18.44-fc", True), ""),
    (("async", "per-user", 0, "6.18.44"), "--passthrough works with --identity mount"),
    (("async", "mount", 1000, "6.18.44"), "--passthrough needs root (the kernel lets only "
                                         "CAP_SYS_ADMIN open backing files)"),
    (("async", "mount", 0, "6.8.0-49-generic"), "--passthrough needs Linux >= 6.9 (this is "
                                                "6.8.0-49-generic)"),
    (("async", "mount", 0, "odd"), "--passthrough needs Linux >= 6.9 (this is odd)"),
])
def test_where_passthrough_cannot_work_the_reason_is_one_line(arguments, reason):
    assert refusal(*arguments) == reason
