"""The benchmark suite's smoke mode on every landed backend, so the suite cannot rot."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

SUITE = Path(__file__).resolve().parent.parent / "benchmarks" / "suite.py"


WRITABLE = {"s3", "irods"}


@pytest.mark.parametrize("backend", ["demo", "rucio", "s3", "irods"])
def test_smoke_run_writes_every_artifact(backend, tmp_path, request):
    args = [sys.executable, str(SUITE), "--backend", backend, "--smoke", "--out", str(tmp_path)]
    if backend in ("rucio", "s3"):
        server = request.getfixturevalue(f"{backend}_server")
        args += ["--server", str(server.base)]
    result = subprocess.run(args, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["backend"] == backend and data["machine"]["cpus"] >= 1
    assert set(data["experiments"]) >= {"ls", "users", "cat", "nfsrods", "local"}
    assert all(config["kernel"] in (True, False) for config in data["mounts"].values())
    for name in ("ls", "users", "cat", "nfsrods", "local"):
        with open(tmp_path / f"{name}.csv") as f:
            assert len(list(csv.DictReader(f))) >= 2, name
    for plot in ("ls.png", "users.png", "local.png"):
        assert (tmp_path / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = (tmp_path / "summary.md").read_text()
    assert "## NFSRODS table" in summary
    if backend in WRITABLE:
        assert data["not_run"] == {} and "Not run" not in summary
        geesefs = data["experiments"]["geesefs"]
        assert {(r["test"], r["client"]) for r in geesefs} >= {
            ("small files", "local disk"), ("small files", "rucio-fs"),
            ("small files", "rucio-fs async"), ("big file", "local disk"),
            ("big file", "rucio-fs")}
        assert all(r["rss_peak_MB"] > 0 for r in geesefs if r["client"] == "rucio-fs async")
        assert all(r["identical"] for r in geesefs if r["test"] == "big file")
        assert all(r["cp_x_local"] > 0 for r in geesefs if r["test"] == "small files")
        mdtest = {r["phase"]: r for r in data["experiments"]["mdtest"]}
        assert len(mdtest) == 9 and mdtest["file creation"]["operations"] == 14
        assert all(r["mount_ops_per_s"] > 0 and r["mount_async_ops_per_s"] > 0
                   for r in mdtest.values())
        assert "## GeeseFS tests" in summary and "## Metadata rates" in summary
    else:
        assert set(data["not_run"]) == {"geesefs", "mdtest"} and "Not run: GeeseFS" in summary
    ls_rows = data["experiments"]["ls"]
    assert {r["mode"] for r in ls_rows} == {"cold", "warm", "tmpfs"}
    assert all(r["ratio_to_tmpfs"] > 0 for r in ls_rows)
    users = data["experiments"]["users"]
    assert all(r["backend_listings"] == 0 for r in users if r["mode"] == "warm")
    mounts = data["experiments"]["mounts"]
    assert {(r["mounts"], r["shared"]) for r in mounts} == {(1, False), (1, True), (2, False),
                                                            (2, True)}
    # One listing per mount without the tier, one in all with it: more only where the row
    # records a Redis failure or a lease takeover (each makes a mount list for itself).
    for r in mounts:
        expected = 1 if r["shared"] else r["mounts"]
        assert expected <= r["backend_listings"] <= expected + r["tier_failures"], r
    assert all(r["rss_mb"] > 0 for r in mounts) and (tmp_path / "mounts.png").is_file()
    assert data["experiments"]["mounts_redis"][0]["read_s"] > 0
    if backend in ("rucio", "s3"):  # HTTP reads: the data proxy part ran
        proxied = data["experiments"]["mounts_proxy"]
        # one copy plus, at most, one reader's read-ahead (32 MiB) past what was read
        assert all(r["storage_bytes"] <= r["bytes_each"] + (40 << 20) for r in proxied)
        assert len(proxied) == 2
    if backend == "rucio":
        assert all(r["server_listings"] == r["backend_listings"] for r in mounts)
    if backend == "rucio":
        assert "rclone" in summary or "not run" in summary


@pytest.mark.parametrize("args, message", [
    (["--backend", "s3", "--server", "/nonexistent"], "no server.env there"),
    (["--backend", "demo", "--server", "/tmp"], "only for --backend rucio or s3"),
    (["--big-write", "10Q"], "not a size"),
    (["--mdtest", "6,x"], "not B,Z,I"),
    (["--experiments", "ls,nosuch"], "unknown experiment"),
])
def test_bad_arguments_fail_with_an_error_line(args, message):
    result = subprocess.run([sys.executable, str(SUITE), *args], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert message in result.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("latency", [True, False], ids=["demo-with-latency", "demo-at-once"])
def test_an_off_variant_that_changes_nothing_fails_the_run(tmp_path, latency):
    """The users experiment (concurrent cold ``ls``, coalescing on and off) on the demo
    catalog: with a latency per request the ``ls`` processes overlap and coalescing off makes
    more listings; answering at once (the mutation), off makes as few as on and the suite's
    consistency check says so."""
    import dataclasses
    sys.path.insert(0, str(SUITE.parent))
    try:
        import suite
    finally:
        sys.path.remove(str(SUITE.parent))
    target = suite.demo_target()
    if not latency:
        target = dataclasses.replace(target, latency_url="")
    out = tmp_path / "out"
    out.mkdir()
    res = suite.Results(out, target, smoke=True)
    suite.exp_users(tmp_path, target, res, [1, 5])
    found = res.data["inconsistent"]
    if latency:
        assert found == []
    else:
        assert len(found) == 1 and found[0].startswith("users: with coalescing off"), found
