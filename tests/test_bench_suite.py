"""The benchmark suite's smoke mode on every landed backend, so the suite cannot rot."""

from __future__ import annotations

import csv
import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

SUITE = Path(__file__).resolve().parent.parent / "benchmarks" / "suite.py"
BENCHMARKS = SUITE.parent


def bench_module(name: str):
    """A module of benchmarks/ (``suite``, ``goals``, ``bench_core``...), imported the way
    the scripts import each other: with their directory on ``sys.path``."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCHMARKS))


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
    (["--goals", "core,nosuch"], "unknown goal benchmark(s): nosuch"),
    (["--goals", "--rucio-server", "/nonexistent"], "no server.env there"),
    (["--goals", "read", "--backend", "s3"], "an experiment option, not for --goals"),
    (["--s3-server", "/tmp"], "are for --goals"),
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


# -- the goal benchmarks run as one (suite.py --goals) ---------------------------------------

HEAD = {"machine": "bench-host, 2 CPUs (Test CPU), kernel 6.0, Python 3.11",
        "date": "2030-01-02 03:04:05 UTC",
        "commit": "0123456789abcdef0123456789abcdef01234567 with uncommitted changes",
        "rucio-fs": "rucio-fs, version 0.1.0"}


def goal(what: str, met: bool | None, ratio: float | None = 1.5) -> dict:
    return {"benchmark": "bench_x", "what": what, "rucio_fs": "1.0 s", "baseline": "tmpfs 2.0 s",
            "ratio": ratio, "goal": "≤ 1.5x", "met": met}


def test_the_summary_shows_the_run_and_every_goal_and_a_failed_benchmark_fails_it(
        tmp_path, capsys):
    goals = bench_module("goals")
    outcomes = [
        goals.Outcome("core", "bench_core.py", ".venv/bin/python benchmarks/bench_core.py "
                      "--out $OUT/core.json", 61.2,
                      [goal("warm `ls | wc -l`", True), goal("cold", False, None),
                       goal("peer", None)]),
        goals.Outcome("s3", "bench_s3.py", ".venv/bin/python benchmarks/bench_s3.py", None,
                      error="not run: s3fs is not installed (apt-get install s3fs)"),
        goals.Outcome("rucio", "bench_rucio.py", ".venv/bin/python benchmarks/bench_rucio.py",
                      5.0, error="failed: exit 1: RuntimeError: boom")]
    published = tmp_path / "RESULTS.md"
    code = goals.finish(HEAD, outcomes, tmp_path, False, "python benchmarks/suite.py --goals",
                        published)
    text = (tmp_path / "summary.md").read_text()
    assert code == 1 and published.read_text() == text
    first = text.splitlines()[0]
    assert first.startswith(goals.GENERATED) and "do not edit by hand" in first
    for value in HEAD.values():
        assert value in text
    assert f"- Benchmarks: core, s3, rucio (3 of the {len(goals.BENCHMARKS)} with goals); 1 ran" \
        in text
    assert "- Goals: 1 met, 1 not met, 1 not measured" in text
    assert "| warm `ls \\| wc -l` | 1.0 s | tmpfs 2.0 s | 1.50x | ≤ 1.5x | met |" in text
    assert "| cold | 1.0 s | tmpfs 2.0 s |  | ≤ 1.5x | **not met** |" in text
    assert "| not measured |" in text
    assert "## `core` (bench_core.py, 61 s)" in text
    assert "--out $OUT/core.json" in text
    for reason in ("not run: s3fs is not installed (apt-get install s3fs)",
                   "failed: exit 1: RuntimeError: boom"):
        assert text.count(reason) == 2  # in the list at the top and in its own section
    saved = json.loads((tmp_path / "goals.json").read_text())
    assert saved["header"] == HEAD and len(saved["benchmarks"]) == 3
    err = capsys.readouterr().err
    assert "suite.py: s3: not run: s3fs" in err and "goal core: cold" in err

    assert goals.finish(HEAD, outcomes[:1], tmp_path, True, "cmd", None) == 0  # not met: a result
    assert "Form: short" in (tmp_path / "summary.md").read_text()


FAKE_BENCHMARK = """
import json, sys
out = sys.argv[sys.argv.index("--out") + 1]
if "--fail" in sys.argv:
    print("bench: it broke", file=sys.stderr)
    sys.exit(3)
if "--rows" in sys.argv:
    json.dump({"goals": [{"benchmark": "fake", "what": "w", "rucio_fs": "1 s", "baseline": "",
                          "ratio": None, "goal": "≤ 2 s", "met": True}]}, open(out, "w"))
"""


def test_a_run_collects_rows_and_reports_what_failed_did_not_run_or_wrote_nothing(
        tmp_path, monkeypatch, capsys):
    goals = bench_module("goals")
    script = tmp_path / "fake_bench.py"
    script.write_text(FAKE_BENCHMARK)
    monkeypatch.setattr(goals, "missing", lambda bench: "")
    benches = [goals.GoalBenchmark("ok", str(script), 1, ("--rows",)),
               goals.GoalBenchmark("broken", str(script), 1, ("--fail",)),
               goals.GoalBenchmark("silent", str(script), 1),
               goals.GoalBenchmark("served", str(script), 1, ("--rows",), server="nosuch")]
    out = tmp_path / "out"
    assert goals.run(benches, out, {}, False, "cmd", None) == 1
    saved = {b["name"]: b for b in json.loads((out / "goals.json").read_text())["benchmarks"]}
    assert saved["ok"]["error"] == "" and saved["ok"]["goals"][0]["met"] is True
    assert saved["ok"]["command"].startswith(".venv/bin/python ")
    assert saved["ok"]["command"].endswith("--rows --out $OUT/ok.json")
    assert saved["broken"]["error"] == "failed: exit 3: bench: it broke"
    assert saved["silent"]["error"] == "failed: no readable JSON at " + \
        f"{out / 'silent.json'}: [Errno 2] No such file or directory: '{out / 'silent.json'}'"
    assert saved["served"]["error"].startswith("not run: the nosuch server did not start: ")
    assert "bench: it broke" in (out / "broken.log").read_text()
    capsys.readouterr()


def test_a_benchmark_missing_a_program_says_which_and_how_to_install_it(monkeypatch):
    goals = bench_module("goals")
    monkeypatch.setattr(goals.os, "geteuid", lambda: 0)
    bench = goals.GoalBenchmark("x", "bench_x.py", 1, programs=("no-such-program-rfs",))
    assert goals.missing(bench) == ("no-such-program-rfs is not installed "
                                    "(apt-get install no-such-program-rfs)")
    bench = goals.GoalBenchmark("x", "bench_x.py", 1, modules=("no_such_module_rfs",))
    assert "no_such_module_rfs is not installed" in goals.missing(bench)
    monkeypatch.setattr(goals.os, "geteuid", lambda: 1000)
    assert goals.missing(goals.BY_NAME["read"]).startswith("needs root")


def test_every_goal_benchmark_is_described_in_the_readme():
    goals = bench_module("goals")
    readme = (BENCHMARKS / "README.md").read_text()
    for bench in goals.BENCHMARKS:
        assert (BENCHMARKS / bench.script).is_file(), bench.script
        rows = [line for line in readme.splitlines() if line.startswith("|")
                and f"`{bench.name}`" in line and bench.script in line]
        assert rows, f"no row of the README's table names {bench.name} ({bench.script})"
    assert goals.PUBLISH in readme and "[RESULTS.md](RESULTS.md)" in readme


def test_results_md_is_generated_and_names_its_commit():
    goals = bench_module("goals")
    text = goals.RESULTS_MD.read_text()
    first = text.splitlines()[0]
    assert first.startswith(goals.GENERATED) and "do not edit by hand" in first
    assert re.search(r"^- Commit: [0-9a-f]{40}\b", text, re.MULTILINE), text[:800]


#: Measurements as each goal benchmark writes them (its JSON), and which goals they meet.
MEASURED = {
    "bench_core": ({
        "warm_ls_l_50k": {"mount": {"median_s": 0.33}, "tmpfs": {"median_s": 0.34},
                          "ratio": 0.97},
        "warm_ls_l_10k": {"mount": {"median_s": 0.067}, "tmpfs": {"median_s": 0.07},
                          "ratio": 0.96},
        "warm_ls_10k": {"mount": {"median_s": 0.015}, "tmpfs": {"median_s": 0.0076},
                        "ratio": 1.97},
        "cold_ls_l_10k_20ms": {"median_s": 0.2, "round_trips_per_ls": {"list": 1, "stat": 3},
                               "beyond_round_trips_s": 0.12},
        "stats_overhead_warm_ls_l_10k": {"stats_on": {"median_s": 0.066},
                                         "stats_off": {"median_s": 0.065},
                                         "overhead": 0.015}},
        [True, False, True, True, True]),
    "bench_read": ({"cat_4k_cold_20ms_ms": 21.3, "random_4k_fetched_per_asked": 2.5,
                    "reread_passthrough_GBps": 2.07, "reread_disk_GBps": 2.25,
                    "reread_daemon_GBps": 0.7},
                   [True, True, False]),
    "bench_rucio": ({
        "cold_ls_l_10k_s": 0.474, "raw_listing_s": 0.406, "cold_ratio": 1.17,
        "warm_ls_l_10k_s": 0.068, "tmpfs_ls_l_10k_s": 0.071, "warm_ls_10k_s": 0.015,
        "tmpfs_ls_10k_s": 0.009, "cat_cold_ms": 89.0, "replica_request_ms": 70.0,
        "storage_get_ms": 4.0, "cat_warm_ms": 0.3,
        "big_http": {"mount_MBps": 950.0, "curl_MBps": 2400.0, "peak_rss_mb": 263.0},
        "big_https": {"mount_MBps": 800.0, "curl_MBps": 1900.0, "peak_rss_mb": 263.0},
        "big_root": {"mount_MBps": 900.0, "xrdcp_MBps": 850.0, "peak_rss_mb": 320.0},
        "cat_cold_root_ms": 95.0},
        [True, False, True, False, True, True, True, True, False, False, None]),
    "bench_rucio_write": ({
        "files": 1000, "size": 4096, "big_bytes": 4_000_000_000, "small_cli_s": 271.2,
        "small_sync_s": 281.8, "small_async_s": 13.0, "big_cli_s": 24.7, "big_sync_s": 20.8,
        "big_sync_rss_mb": 44.0}, [False, True, True, True]),
    "bench_first_byte": ({
        "files": 1000,
        "cold_cat_ms": {"baseline": [75.8, 70.0], "baseline, page cache dropped": [97.3],
                        "guessed": [17.0, 19.0], "guessed, page cache dropped": [31.0],
                        "auto": [75.7], "auto, page cache dropped": [90.0]},
        "loop": {"baseline": {"seconds": 93.4, "replica_requests": 1000},
                 "guessed": {"seconds": 11.7, "replica_requests": 0},
                 "auto": {"seconds": 30.0, "replica_requests": 1},
                 "listed_baseline": {"seconds": 72.9, "replica_requests": 1000},
                 "listed_batched": {"seconds": 3.8, "replica_requests": 7}}},
        [True, False, True, False, True]),
    "bench_per_user": ({
        "users": 10,
        "1 user": {"warm_ls_l_10k_s": {"single": 0.0841, "per-user": 0.0833},
                   "cold_cat_s": {"single": 0.145, "per-user": 0.141}},
        "10 users": {"warm_ls_l_10k_s": {"single": 0.4868, "per-user": 0.466},
                     "cold_cat_s": {"single": 0.1949, "per-user": 0.25}}},
        [True, True, True, False]),
    "bench_s3": ({
        "ls": {"objects": 10000, "raw_list_s": 0.26, "cold_s": [0.399, 0.41],
               "warm_s": [0.061, 0.062], "cold_median_s": 0.40, "cold_over_raw": 1.53},
        "small": {"rucio-fs": {"cp_s": 27.1, "rm_s": 20.7},
                  "s3fs": {"cp_s": 41.4, "rm_s": 11.6}, "rclone": {"cp_s": 30.0, "rm_s": 5.9}},
        "big": {"rucio-fs": {"write_MBps": 167.0, "read_MBps": 812.0}},
        "first_byte": {"rucio-fs": {"median_ms": 9.0}, "s3fs": {"median_ms": 10.8}},
        "rsync": {
            name: {run: {"s": s, "exit": 0, "itemized": n, "over_rclone": ratio}
                   for run, s, n, ratio in runs}
            for name, runs in {
                "rucio-fs sync": [("first", 96.2, 6400, 2.08), ("again", 1.77, 0, 2.19),
                                  ("remount", 4.57, 0, 0.72)],
                "rucio-fs async": [("first", 48.7, 6400, 1.05), ("again", 0.86, 0, 1.06),
                                   ("remount", 2.0, 0, 0.31)],
                "rclone": [("first", 46.3, 6400, 1.0), ("again", 0.81, 2664, 1.0),
                           ("remount", 6.39, 3457, 1.0)]}.items()}},
        [False, True, True, False, True, False, False, False, False, False, True]),
    "bench_analysis": ({
        "backend": "s3",
        "rows": [{"read": "two branches", "delay_ms": 0, "needed": 1e6, "mount_server": 1.1e6,
                  "mount_s": 0.5, "http_s": 0.6},
                 {"read": "two branches", "delay_ms": 20, "needed": 1e6,
                  "mount_server": 1.1e6, "mount_s": 0.9, "http_s": 1.0}]},
        [True, True, False]),
}


@pytest.mark.parametrize("script", sorted(MEASURED))
def test_each_goal_benchmark_computes_its_goals_from_what_it_measured(script):
    """Each script's goal rows, from measurements shaped as it writes them: ``met`` follows
    the numbers, and the rows go into the JSON the suite reads and its table."""
    module, common = bench_module(script), bench_module("common")
    measured, expected = MEASURED[script]
    rows = module.goals(measured, True) if script == "bench_rucio" else module.goals(measured)
    assert [row.met for row in rows] == expected, [(row.what, row.met) for row in rows]
    saved = json.loads(json.dumps(common.add_goals({}, rows)))["goals"]
    assert {tuple(r) for r in saved} == {("benchmark", "what", "rucio_fs", "baseline", "ratio",
                                          "goal", "met")}
    assert len(common.goal_table(saved)) == len(rows) + 2
