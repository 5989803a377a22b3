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
