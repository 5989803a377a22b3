"""Bad input: one line on stderr, a non-zero exit, no traceback, nothing left mounted.
Backend failures during operations: the right errno and one log line, never a dead daemon."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import RUCIO_FS, run_cli, wait_for

from rucio_fs.cli.daemon import process_running
from rucio_fs.observe import control
from rucio_fs.observe.mounts import find_mount, read_mounts


def assert_one_line_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("rucio-fs: ")
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.fixture
def mountpoint(tmp_path):
    path = tmp_path / "mp"
    path.mkdir()
    yield path
    assert find_mount(str(path)) is None, "a failed mount left something mounted"


@pytest.mark.parametrize(("url", "needle"), [
    ("nosuch://x", "unknown URL scheme 'nosuch' (installed backends: "),
    ("just-a-path", "malformed URL 'just-a-path'"),
    ("demo://host/path", "demo URL takes no host or path"),
    ("demo://?latency=fast", "invalid duration 'fast'"),
    ("demo://?colour=blue", "unknown demo option(s) colour (known: latency, faults, page)"),
])
def test_bad_urls(mountpoint, url, needle):
    assert_one_line_error(run_cli("mount", url, str(mountpoint)), needle)


def test_missing_mountpoint(tmp_path):
    result = run_cli("mount", "demo://", str(tmp_path / "absent"))
    assert_one_line_error(result, "does not exist")


def test_mountpoint_not_a_directory(tmp_path):
    (tmp_path / "file").write_text("x")
    assert_one_line_error(run_cli("mount", "demo://", str(tmp_path / "file")),
                          "is not a directory")


def test_mountpoint_not_empty(mountpoint):
    (mountpoint / "something").write_text("x")
    assert_one_line_error(run_cli("mount", "demo://", str(mountpoint)), "is not empty")


def test_already_mounted(mount_fs):
    m = mount_fs()
    result = run_cli("mount", "demo://", str(m.path))
    assert_one_line_error(result, "is already a mountpoint (fuse.rucio-fs)")


@pytest.mark.parametrize(("args", "needle"), [
    (["mount", "--bogus", "demo://", "."], "--bogus"),
    (["mount", "demo://"], "MOUNTPOINT"),
    (["mount", "demo://", ".", "--kernel-ttl", "soon"], "invalid duration 'soon'"),
    (["mount", "demo://", ".", "--data-cache-size", "lots"], "invalid size 'lots'"),
    (["mount", "demo://", ".", "--block-size", "3000"], "block-size must be a power of two"),
    (["frobnicate"], "frobnicate"),
])
def test_usage_errors(args, needle):
    result = run_cli(*args)
    assert_one_line_error(result, needle)


def test_tools_on_something_not_mounted(tmp_path):
    assert_one_line_error(run_cli("stats", str(tmp_path)), "not a mountpoint")
    assert_one_line_error(run_cli("cache", "drop", "/proc"), "not a rucio-fs mount (it is proc)")
    assert_one_line_error(run_cli("unmount", str(tmp_path)), "not a mountpoint")


def test_no_dev_fuse(mountpoint):
    """In a private mount namespace whose /dev has no fuse device."""
    result = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         'mount -t tmpfs none /dev && exec "$@"', "sh", *RUCIO_FS, "mount", "demo://",
         str(mountpoint)], capture_output=True, text=True, timeout=60)
    assert_one_line_error(result, "/dev/fuse is missing")


def test_no_permission_on_dev_fuse(mountpoint):
    """A /dev/fuse with mode 000, opened by root without its permission-override capabilities."""
    script = ('mount -t tmpfs none /dev && mknod -m 000 /dev/fuse c 10 229 && '
              'exec setpriv --bounding-set=-dac_override,-dac_read_search "$@"')
    result = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
         *RUCIO_FS, "mount", "demo://", str(mountpoint)],
        capture_output=True, text=True, timeout=60)
    assert_one_line_error(result, "no permission to open /dev/fuse")


def test_backend_faults_become_errno_and_one_log_line(mount_fs):
    m = mount_fs("demo://?faults=1")
    faults = m.path / "faults"
    with pytest.raises(PermissionError):
        (faults / "eacces.dat").read_bytes()
    for name in ("eio.dat", "crash.dat"):
        with pytest.raises(OSError) as exc:
            (faults / name).read_bytes()
        assert exc.value.errno == errno.EIO
    with pytest.raises(OSError) as exc:  # a listing broken mid-stream is EIO, never shorter
        os.listdir(faults / "broken-listing")
    assert exc.value.errno == errno.EIO
    assert len(os.listdir(m.path / "ls" / "files-500")) == 500  # the daemon lives on
    # One log line per failed request (the kernel retries a failed read once by itself).
    log = m.log_text().splitlines()
    errors = m.stats()["fuse"]
    assert errors["open"]["errors"] == {"EACCES": 1}
    # Entries arrive while the listing is fetched: the break surfaces in opendir or readdir.
    listing_errors = [errors.get(op, {"errors": {}})["errors"] for op in ("opendir", "readdir")]
    assert sum(e.get("EIO", 0) for e in listing_errors) == 1
    assert not any(set(e) - {"EIO"} for e in listing_errors)
    failed_reads = errors["read"]["errors"]["EIO"]
    assert len(log) == 1 + 1 + 1 + failed_reads  # "mounted", open, the listing, reads
    denied = "WARNING rucio_fs.fuse.fs: open failed: demo: permission denied"
    assert sum(denied in x for x in log) == 1
    assert sum("dir failed: demo: listing stream broken" in x for x in log) == 1
    unavailable = sum("read failed: demo: storage unavailable (injected)" in x for x in log)
    crashed = sum("read failed: backend read failed unexpectedly: RuntimeError('demo: "
                  "backend bug (injected)')" in x for x in log)
    assert unavailable >= 1 and crashed >= 1 and unavailable + crashed == failed_reads


def test_a_hanging_backend_call_times_out_with_eio(mount_fs):
    m = mount_fs("demo://?faults=1", "--timeout", "0.5s")
    started = time.monotonic()
    with pytest.raises(OSError) as exc:
        (m.path / "faults" / "hang.dat").read_bytes()
    assert exc.value.errno == errno.EIO
    assert time.monotonic() - started < 10
    assert m.stats()["backend"]["read"]["errors"]["ETIMEDOUT"] >= 1
    assert "read failed: backend read timed out after 0.5 s" in m.log_text()
    started = time.monotonic()
    with pytest.raises(OSError) as exc:  # df of a hung backend
        os.statvfs(m.path)
    assert exc.value.errno == errno.EIO and time.monotonic() - started < 10
    assert m.stats()["backend"]["usage"]["errors"]["ETIMEDOUT"] == 1


def test_two_mounts_at_once_on_one_mountpoint_never_stack(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        procs = [subprocess.Popen([*RUCIO_FS, "mount", "demo://?latency=300ms", str(mnt)],
                                  stderr=subprocess.PIPE, text=True) for _ in range(2)]
        results = [(p.wait(timeout=60), p.stderr.read()) for p in procs]
        assert sorted(code for code, _ in results) == [0, 1], results
        error = next(err for code, err in results if code)
        assert len(error.strip().splitlines()) == 1 and "Traceback" not in error
        assert "rucio-fs" in error and str(mnt) in error
        mounted = [m for m in read_mounts() if m.mountpoint == str(mnt)]
        assert len(mounted) == 1
    finally:
        run_cli("unmount", str(mnt))


def test_mounting_over_a_dead_mount_names_it_and_the_fix(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    run_cli("mount", "demo://", str(mnt), check=True)
    try:
        pid = control.request(str(mnt), "info")["pid"]
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not os.path.exists(f"/proc/{pid}"))
        again = run_cli("mount", "demo://", str(mnt))
        assert again.returncode == 2 or again.returncode == 1
        assert "daemon is gone" in again.stderr and f"rucio-fs unmount {mnt}" in again.stderr
        assert len(again.stderr.strip().splitlines()) == 1
        run_cli("unmount", str(mnt), check=True)
        run_cli("mount", "demo://", str(mnt), check=True)
        assert "ls" in os.listdir(mnt)
    finally:
        run_cli("unmount", str(mnt))
        subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True)


def test_unmount_waits_for_the_daemon(mount_fs):
    m = mount_fs()
    pid = m.stats()["pid"]
    run_cli("unmount", str(m.path), check=True)
    assert find_mount(str(m.path)) is None
    assert not process_running(pid)


def test_sigterm_unmounts_cleanly(mount_fs):
    m = mount_fs()
    pid = m.stats()["pid"]
    os.kill(pid, signal.SIGTERM)
    wait_for(lambda: find_mount(str(m.path)) is None)
    wait_for(lambda: not process_running(pid), timeout=10)
    assert "received SIGTERM, unmounting" in m.log_text()


def test_checksum_mismatch_is_eio_never_wrong_data(mount_fs):
    m = mount_fs("demo://?faults=1")
    corrupt = m.path / "faults" / "corrupt.dat"
    for _ in range(2):  # nothing cached may serve the bad bytes afterwards
        with pytest.raises(OSError) as exc:
            corrupt.read_bytes()
        assert exc.value.errno == errno.EIO
    mismatches = sum("adler32 mismatch: the catalog says" in line
                     for line in m.log_text().splitlines())
    assert mismatches >= 2  # one line per failed request; the kernel retries a read once
    good = m.path / "ls" / "files-500" / "file-000001.dat"
    good.read_bytes()
    events = wait_for(lambda: (e := m.stats()["events"]) and "checksum_verified" in e and e)
    assert events["checksum_verified"] == 1 and events["checksum_mismatch"] == 2

    unverified = mount_fs("demo://?faults=1", "--no-verify")
    assert (unverified.path / "faults" / "corrupt.dat").read_bytes().startswith(b"0000002\n")


def test_an_exited_daemon_not_yet_reaped_is_not_running():
    """A zombie (exited, not yet reaped by init) counts as gone: unmount waited for the
    reaping (1.3 s per unmount under a slow-reaping PID 1)."""
    child = subprocess.Popen(["true"])
    stat = Path(f"/proc/{child.pid}/stat")
    wait_for(lambda: stat.read_text().rpartition(") ")[2][0] == "Z")
    os.kill(child.pid, 0)  # the process table still has it
    assert not process_running(child.pid)
    child.wait()
    assert not process_running(child.pid)
    assert process_running(os.getpid())
