"""Stats of a live mount: exact counts for a known workload, every format, reset and diff."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import socket
import subprocess
import urllib.request

import pytest
from conftest import RUCIO_FS, free_ports, run_cli, wait_for
from prometheus_client.parser import text_string_to_metric_families

from rucio_fs.observe.stats import N_BINS


def test_counts_match_a_known_workload_exactly(mount_fs):
    m = mount_fs()
    os.stat(m.path)  # the kernel fetches the root's attributes once after mounting
    before = m.stats(reset=True)["backend_counters"]
    f = m.path / "ls" / "files-500" / "file-000009.dat"
    os.stat(f)
    os.stat(f)  # served by the kernel (entry and attribute timeouts)
    with open(f, "rb") as handle:
        assert len(handle.read()) == 4096
    snap = wait_for(lambda: (s := m.stats()) and m.fuse_calls("release", s) == 1 and s)
    fuse = {op: data["latency"]["count"] for op, data in snap["fuse"].items()}
    assert fuse == {"lookup": 3, "open": 1, "read": 1, "release": 1}, fuse
    backend = {call: data["latency"]["count"] for call, data in snap["backend"].items()}
    assert backend == {"stat": 3, "open": 1, "read": 1, "close": 1}, backend
    assert snap["backend"]["read"]["bytes"] == 4096
    # The demo's own request counters start again at the reset too, and agree with the
    # daemon's accounting.
    assert before  # the root's stat at the mount
    own = {k: v for k, v in snap["backend_counters"].items() if v}
    assert own == {"stat": 3, "open": 1, "read": 1, "read_bytes": 4096}
    assert snap["cache"]["data"]["misses"] == 1 and snap["cache"]["data"]["stores"] == 1
    hist = snap["fuse"]["lookup"]["latency"]
    assert len(hist["bins"]) == N_BINS >= 30 and sum(hist["bins"]) == 3
    # One call at a time, each kind: the most under way at once is 1 (lookups made together
    # are in test_mount.py).
    assert {data["peak"] for section in ("fuse", "backend")
            for data in snap[section].values()} == {1}


def test_errors_are_counted_by_errno(mount_fs):
    m = mount_fs("demo://", "--no-kernel-cache")
    for _ in range(2):
        assert not os.path.exists(m.path / "nope")
    assert m.stats()["fuse"]["lookup"]["errors"] == {"ENOENT": 2}


def test_formats_reset_and_diff(mount_fs, tmp_path):
    m = mount_fs()
    os.listdir(m.path / "ls" / "files-500")
    table = run_cli("stats", str(m.path), check=True).stdout
    assert "readdir" in table and "cache layer" in table and "config:" in table
    assert "at once" in table.splitlines()[3]
    data = json.loads(run_cli("stats", str(m.path), "--format", "json", check=True).stdout)
    assert data["fuse"]["opendir"]["latency"]["count"] >= 1
    assert data["config"]["listing"] is True
    prom = run_cli("stats", str(m.path), "--format", "prometheus", check=True).stdout
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(prom) for s in f.samples}
    assert samples[("rucio_fs_fuse_latency_seconds_count", (("op", "opendir"),))] >= 1
    assert samples[("rucio_fs_cache_events_total",
                    (("event", "misses"), ("layer", "listing")))] >= 1
    assert samples[("rucio_fs_fuse_at_once_max", (("op", "opendir"),))] >= 1

    first = run_cli("stats", str(m.path), "--format", "csv", "--reset", check=True).stdout
    rows = dict(csv.reader(io.StringIO(first)))
    assert rows["metric"] == "value" and int(rows["backend.list.count"]) >= 1
    assert int(rows["fuse.opendir.peak"]) >= 1
    (tmp_path / "a.csv").write_text(first)
    after_reset = m.stats()
    assert not after_reset["backend"]
    assert not any(after_reset["backend_counters"].values())
    m.drop()  # the kernel layer's drop count appears; a reset keeps every layer's switch
    run_cli("stats", str(m.path), "--reset", check=True)
    layers = run_cli("stats", str(m.path), check=True).stdout
    kernel_line = next(line for line in layers.splitlines() if line.startswith("kernel "))
    assert kernel_line.split()[1] == "yes", kernel_line
    os.listdir(m.path / "ls" / "files-1000")
    os.listdir(m.path / "ls" / "files-5000")
    second = run_cli("stats", str(m.path), "--format", "csv", check=True).stdout
    (tmp_path / "b.csv").write_text(second)
    diff = run_cli("stats", "diff", str(tmp_path / "a.csv"), str(tmp_path / "b.csv"), check=True)
    lines = diff.stdout.splitlines()
    assert lines[0].split()[:3] == ["metric", "A", "B"]
    listed = next(line for line in lines if line.startswith("events.listed_entries "))
    assert "+5500" in listed and "!!!" in listed


def test_stats_diff_rejects_other_files(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("x,y\n")
    result = run_cli("stats", "diff", str(bad), str(bad))
    assert result.returncode == 1
    assert result.stderr.strip() == f"rucio-fs: {bad}: not a rucio-fs stats CSV " \
                                    "(header must be 'metric,value')"


def test_every_mount_is_served_to_prometheus_with_its_label(mount_fs):
    first, second = mount_fs(), mount_fs()
    os.listdir(first.path / "ls" / "files-500")
    port = free_ports(1)[0]
    server = subprocess.Popen([*RUCIO_FS, "stats", "--serve", f"127.0.0.1:{port}"],
                              stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: socket.socket().connect_ex(("127.0.0.1", port)) == 0)
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        families = {f.name: f for f in text_string_to_metric_families(text.decode())}
        up = {s.labels["mount"]: s.value for s in families["rucio_fs_up"].samples}
        assert up[str(first.path)] == 1 and up[str(second.path)] == 1
        opendirs = [s for s in families["rucio_fs_fuse_latency_seconds"].samples
                    if s.name.endswith("_count") and s.labels["op"] == "opendir"]
        assert {s.labels["mount"]: s.value for s in opendirs}[str(first.path)] >= 1
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=10) == 0  # a clean stop, no traceback
    assert "Traceback" not in server.stderr.read()


@pytest.mark.parametrize(("args", "message"), [
    (["--serve", "nohostport"], "expected HOST:PORT"),
    (["--serve", "127.0.0.1:1", "/mnt"], "takes no MOUNTPOINT"),
])
def test_serve_refuses_bad_input_in_one_line(args, message):
    result = run_cli("stats", *args)
    assert result.returncode != 0 and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
