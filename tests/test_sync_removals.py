"""Removals that run ahead of ``unlink`` with sync write-back (S3).

Promise: an ``unlink`` that returned 0 hides the name at once; the object is gone from the
server once an ``rmdir`` or ``fsync`` of a directory above it, or unmount, returned; what the
mount later stores under the same name is never removed by it; a daemon killed before the
removal reached the server leaves it journaled, and the next mount carries it out. A removal
the server refuses brings the name back, is listed by ``rucio-fs uploads``, and from then on
every ``unlink`` of the mount waits for the server. At most ``REMOVALS_AHEAD`` run ahead: when
the server fails them, the next ``unlink`` fails.

Each step is broken through a fault proxy in front of versitygw, whose own view (botocore,
straight to the server) is the judge.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess

import pytest
from conftest import journal_records, run_cli, wait_for
from fault_proxy import fault_proxy
from test_s3 import fsync, mount_s3, server_keys, unique

from rucio_fs.write.writeback import REMOVALS_AHEAD


def _mount_with_a_removal_done(mount_fs, endpoint: str, prefix: str, *options: str):
    """A sync mount whose first removal (which waits for the server) is done."""
    mnt = mount_s3(mount_fs, endpoint, prefix, "--option", "timeout=1s", "--timeout", "5",
                   *options)
    (mnt.path / "first").write_bytes(b"removed first")
    os.unlink(mnt.path / "first")
    return mnt


def _make_again(root, kind: str) -> None:
    """Make ``again`` anew through the mount, as ``kind`` says."""
    if kind == "write":
        (root / "again").write_bytes(b"new content")
    elif kind == "rename":
        (root / "moved").write_bytes(b"moved content")
        os.rename(root / "moved", root / "again")
    elif kind == "mkdir":
        os.mkdir(root / "again")
    else:
        os.symlink("target", root / "again")


#: What the server holds under the name once it is made again, by how it was made.
EXPECTED = {"write": {"again": 11}, "rename": {"again": 13}, "mkdir": {"again/": 0},
            "symlink": {"again": 6}}


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_a_name_made_again_keeps_what_was_made_after_its_removal(mount_fs, s3_server, kind):
    prefix = unique(f"again-{kind}")
    with fault_proxy(s3_server.endpoint) as proxy:
        mnt = _mount_with_a_removal_done(mount_fs, proxy.url, prefix)
        (mnt.path / "again").write_bytes(b"old content that goes")
        # the removal is still on its way when the name is made again
        late = proxy.inject("late", "/again", method="DELETE")
        os.unlink(mnt.path / "again")
        assert "again" not in os.listdir(mnt.path)
        _make_again(mnt.path, kind)
        fsync(mnt.path)
        assert late.hits >= 1
        keys = server_keys(s3_server.client(), prefix)
        assert {k: v["Size"] for k, v in keys.items()} == EXPECTED[kind]
        if kind == "write":
            assert (mnt.path / "again").read_bytes() == b"new content"


def test_rm_r_is_on_the_server_when_it_returns_and_fsync_settles_a_plain_rm(
        mount_fs, s3_server):
    prefix = unique("rm-ahead")
    with fault_proxy(s3_server.endpoint) as proxy:
        mnt = _mount_with_a_removal_done(mount_fs, proxy.url, prefix)
        tree = mnt.path / "tree"
        for d in ("a", "b"):
            (tree / d).mkdir(parents=True)
            for i in range(5):
                (tree / d / f"f{i}").write_bytes(b"x" * i)
        (mnt.path / "loose").write_bytes(b"loose")
        # every removal is late: rm -r returns only once they are all there
        late = proxy.inject("late", "?delete", method="POST")
        subprocess.run(["rm", "-r", str(tree)], check=True)
        assert late.hits >= 2  # a and b: each a batch of its files and its marker
        assert sorted(server_keys(s3_server.client(), prefix)) == ["loose"]
        proxy.clear()
        slow = proxy.inject("late", "/loose", method="DELETE")
        os.unlink(mnt.path / "loose")
        fsync(mnt.path)
        assert slow.hits == 1
        assert server_keys(s3_server.client(), prefix) == {}


def test_a_killed_daemon_leaves_its_removals_to_the_next_mount(mount_fs, s3_server, tmp_path):
    prefix = unique("rm-killed")
    staging = tmp_path / "staging"
    with fault_proxy(s3_server.endpoint) as proxy:
        url = f"s3://test/{prefix}"
        options = ["-o", f"endpoint_url={proxy.url}", "--option", "timeout=1s",
                   "--timeout", "5", "--staging-dir", str(staging)]
        first = mount_fs(url, *options)
        for name in ("first", "g1", "g2", "g3"):
            (first.path / name).write_bytes(name.encode())
        os.unlink(first.path / "first")  # waits for the server
        # (a DELETE names the key in its path, a DeleteObjects in its body)
        failing = proxy.inject("error", f"{prefix}/g")
        for name in ("g1", "g2", "g3"):
            os.unlink(first.path / name)  # returns 0: queued, and failing on the server
        wait_for(lambda: failing.hits >= 1)
        pid = first.stats()["pid"]
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not os.path.exists(f"/proc/{pid}"))
        subprocess.run(["fusermount3", "-u", "-z", str(first.path)], capture_output=True)
        assert sorted(server_keys(s3_server.client(), prefix)) == ["g1", "g2", "g3"]
        assert sorted(r["path"] for r in journal_records(staging, "unlink")) == \
            ["/g1", "/g2", "/g3"]
        proxy.clear()
        second = mount_fs(url, *options)
        wait_for(lambda: server_keys(s3_server.client(), prefix) == {}, timeout=20)
        assert os.listdir(second.path) == []


def test_a_refused_removal_brings_the_name_back_and_later_ones_wait(mount_fs, s3_server):
    prefix = unique("rm-refused")
    with fault_proxy(s3_server.endpoint) as proxy:
        mnt = _mount_with_a_removal_done(mount_fs, proxy.url, prefix)
        for name in ("kept", "next"):
            (mnt.path / name).write_bytes(name.encode())
        proxy.inject("deny", "/kept", method="DELETE")
        os.unlink(mnt.path / "kept")  # returns before the server refuses it
        wait_for(lambda: "kept" in os.listdir(mnt.path), timeout=10)
        assert (mnt.path / "kept").read_bytes() == b"kept"
        listed = run_cli("uploads", str(mnt.path))
        assert "unlink /kept" in listed.stdout and "denied" in listed.stdout.lower(), \
            listed.stdout
        # From now on an unlink waits for the server: its refusal is the unlink's error.
        proxy.inject("deny", "/next", method="DELETE", times=1)
        with pytest.raises(PermissionError):
            os.unlink(mnt.path / "next")
        assert "next" in server_keys(s3_server.client(), prefix)


def test_removals_run_at_most_so_far_ahead_of_a_failing_server(mount_fs, s3_server):
    prefix = unique("rm-bound")
    with fault_proxy(s3_server.endpoint) as proxy:
        mnt = _mount_with_a_removal_done(mount_fs, proxy.url, prefix)
        names = [f"h{i:03d}" for i in range(REMOVALS_AHEAD + 1)]
        for name in names:
            (mnt.path / name).write_bytes(b"")
        failing = proxy.inject("error", f"{prefix}/h")  # every DELETE and DeleteObjects
        for name in names[:REMOVALS_AHEAD]:
            os.unlink(mnt.path / name)
        with pytest.raises(OSError) as raised:
            os.unlink(mnt.path / names[-1])
        assert raised.value.errno == errno.EIO
        assert failing.hits >= 1
        assert len(server_keys(s3_server.client(), prefix)) == REMOVALS_AHEAD + 1
        proxy.clear()
        fsync(mnt.path)
        assert sorted(server_keys(s3_server.client(), prefix)) == [names[-1]]
