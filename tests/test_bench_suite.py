"""The benchmark suite's smoke mode on every landed backend, so the suite cannot rot."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

SUITE = Path(__file__).resolve().parent.parent / "benchmarks" / "suite.py"


@pytest.mark.parametrize("backend", ["demo", "rucio"])
def test_smoke_run_writes_every_artifact(backend, tmp_path, request):
    args = [sys.executable, str(SUITE), "--backend", backend, "--smoke", "--out", str(tmp_path)]
    if backend == "rucio":
        server = request.getfixturevalue("rucio_server")
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
    assert "## NFSRODS table" in summary and "Not run: GeeseFS" in summary
    ls_rows = data["experiments"]["ls"]
    assert {r["mode"] for r in ls_rows} == {"cold", "warm", "tmpfs"}
    assert all(r["ratio_to_tmpfs"] > 0 for r in ls_rows)
    users = data["experiments"]["users"]
    assert all(r["backend_listings"] == 0 for r in users if r["mode"] == "warm")
    if backend == "rucio":
        assert "rclone" in summary or "not run" in summary
