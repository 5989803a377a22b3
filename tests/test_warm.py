"""``rucio-fs warm``: the daemon's own caches filled before a job reads, through a real mount."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from conftest import RUCIO_FS, run_cli, wait_for


def test_warm_lists_once_so_the_job_asks_nothing(mount_fs):
    m = mount_fs()
    result = run_cli("warm", str(m.path / "ls" / "files-10000"), check=True)
    assert "1 directories, 10,000 files" in result.stderr
    lists = m.backend_calls("list")
    assert lists == 1
    assert len(os.listdir(m.path / "ls" / "files-10000")) == 10_000
    with os.scandir(m.path / "ls" / "files-10000") as it:
        assert sum(e.stat().st_size for e in it) > 0
    assert m.backend_calls("list") == lists  # the job's ls -l asked the catalog nothing


def test_warm_recursive_and_data_fill_the_disk_layer(mount_fs, tmp_path):
    m = mount_fs("demo://", "--cache-dir", str(tmp_path / "cache"))
    result = run_cli("warm", "--recursive", "--data", "-j", "4",
                     str(m.path / "ls" / "files-500"), check=True)
    assert "500 files" in result.stderr and "2.0 MB read" in result.stderr
    reads = m.backend_calls("read")
    assert reads >= 500
    for name in sorted(os.listdir(m.path / "ls" / "files-500"))[:50]:
        assert len((m.path / "ls" / "files-500" / name).read_bytes()) > 0
    assert m.backend_calls("read") == reads  # served from what warm read
    assert m.stats()["sizes"]["disk_blocks"] >= 500


def test_ctrl_c_stops_the_warm_up_in_the_daemon_too(mount_fs):
    m = mount_fs("demo://?latency=20ms")  # the 4.5 GB file would take minutes
    proc = subprocess.Popen([*RUCIO_FS, "warm", "--data", str(m.path / "big")],
                            stderr=subprocess.PIPE, text=True)
    wait_for(lambda: m.stats()["backend"].get("read", {}).get("latency", {}).get("count"))
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 130
    stderr = proc.stderr.read()
    assert stderr.startswith("warm cancelled: ") and "Traceback" not in stderr
    reads = m.backend_calls("read")
    time.sleep(0.5)
    assert m.backend_calls("read") == reads  # nothing goes on reading in the daemon


def test_warm_refuses_a_path_on_no_mount_in_one_line(tmp_path):
    result = run_cli("warm", str(tmp_path))
    assert result.returncode == 1
    assert result.stderr.strip() == f"rucio-fs: warm: {tmp_path} is on no rucio-fs mount"


def _warm_big(m, **popen: object) -> subprocess.Popen[str]:
    """``rucio-fs warm --data`` of the 4.5 GB file, returned once the daemon reads for it."""
    proc = subprocess.Popen([*RUCIO_FS, "warm", "--data", str(m.path / "big")],
                            stderr=subprocess.PIPE, text=True, **popen)
    wait_for(lambda: m.backend_calls("read") >= 5, timeout=30)
    return proc


def _reads_stop(m, within: float = 20.0) -> None:
    """Until the daemon's backend reads stop growing (no read in half a second); fails if
    they still grow after ``within`` seconds (the walk alone would take minutes)."""
    def quiet() -> bool:
        before = m.backend_calls("read")
        time.sleep(0.5)
        return m.backend_calls("read") == before

    wait_for(quiet, timeout=within, interval=0)


def test_a_killed_client_stops_the_walk_in_the_daemon(mount_fs):
    m = mount_fs("demo://?latency=20ms")
    proc = _warm_big(m)
    proc.kill()  # SIGKILL: the client can do nothing; the daemon sees its connection close
    proc.wait(timeout=30)
    _reads_stop(m)
    assert m.stats()["events"].get("warm_client_gone") == 1


def test_sigterm_cancels_the_warm_up_with_its_summary(mount_fs):
    m = mount_fs("demo://?latency=20ms")
    proc = _warm_big(m)
    proc.terminate()
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    stderr = proc.stderr.read()
    assert stderr.startswith("warm cancelled: ") and len(stderr.splitlines()) == 1, stderr
    _reads_stop(m)
    assert not m.stats()["events"].get("warm_client_gone")  # it asked; it did not vanish


def test_ctrl_c_works_when_the_client_inherited_sigint_ignored(mount_fs):
    m = mount_fs("demo://?latency=20ms")
    # What a non-interactive shell gives a command started with `&`.
    proc = _warm_big(m, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130
    finally:
        proc.kill()
    stderr = proc.stderr.read()
    assert stderr.startswith("warm cancelled: ") and len(stderr.splitlines()) == 1, stderr
    assert "Traceback" not in stderr
    _reads_stop(m)
