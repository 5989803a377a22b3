"""`rucio-fs trace`: kernel tracepoints joined with the daemon's own request records."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import RUCIO_FS, run_cli
from test_cli_errors import assert_one_line_error

from rucio_fs.observe import tracing

TRACEFS = Path("/sys/kernel/tracing")


def tracing_state() -> dict[str, str]:
    """The global tracing state a trace must leave as it found it."""
    state = {}
    for name in ("tracing_on", "current_tracer", "trace_clock", "buffer_size_kb",
                 "events/fuse/fuse_request_send/enable", "events/fuse/fuse_request_end/enable",
                 "events/fuse/fuse_request_send/filter"):
        state[name] = (TRACEFS / name).read_text()
    state["instances"] = " ".join(sorted(os.listdir(TRACEFS / "instances")))
    return state


@pytest.fixture(scope="module", autouse=True)
def tracefs_mounted() -> None:
    # Fresh machines may not have tracefs mounted: the tool's own --mount-tracefs does it.
    tracing.check_tracing(mount_tracefs=True)


def trace_json(m, *command: str, extra: tuple[str, ...] = ()) -> dict:
    result = run_cli("trace", str(m.path), "--format", "json", *extra, "--", *command,
                     check=True)
    return json.loads(result.stdout)


def test_trace_ls_matches_daemon_counters(mount_fs):
    m = mount_fs()
    before = tracing_state()
    m.stats(reset=True)
    report = trace_json(m, "ls", "-l", str(m.path / "ls" / "files-500"))
    snap = m.stats()
    ops = report["ops"]
    for opcode, daemon_op in (("FUSE_OPENDIR", "opendir"), ("FUSE_READDIRPLUS", "readdir"),
                              ("FUSE_LOOKUP", "lookup")):
        assert ops[opcode]["count"] == m.fuse_calls(daemon_op, snap) >= 1, opcode
        assert ops[opcode]["joined"] == ops[opcode]["count"], opcode
        assert ops[opcode]["unanswered"] == 0
    assert ops["FUSE_LOOKUP"]["count"] >= 2  # ls/ and files-500/
    assert report["lost_events"] == 0
    assert tracing_state() == before


def test_every_handler_of_the_daemon_joins_its_kernel_requests():
    """Each FUSE operation the daemon answers (every ``fuse_op`` handler) names the kernel
    opcodes it answers: else its requests would be reported as never reaching the daemon."""
    import inspect

    from rucio_fs.fuse.fs import RucioFs

    handlers = {name for name, fn in inspect.getmembers(RucioFs, inspect.iscoroutinefunction)
                if getattr(fn, "__wrapped__", None) is not None}
    assert {"lookup", "create", "write", "flush", "rename"} <= handlers
    assert handlers <= set(tracing.DAEMON_OPCODES)


def test_a_copy_into_a_writable_mount_joins_its_writes(mount_fs, tmp_path):
    """``cp`` of new files: their creates, writes, flushes and releases reach the daemon,
    and the report says so."""
    source = tmp_path / "source"
    source.mkdir()
    for i in range(20):
        (source / f"f{i}").write_bytes(b"x" * 100)
    m = mount_fs(f"memory://trace-{os.getpid()}")
    report = trace_json(m, "cp", "-r", str(source), str(m.path / "copy"))
    ops = report["ops"]
    for opcode in ("FUSE_CREATE", "FUSE_WRITE", "FUSE_FLUSH", "FUSE_RELEASE", "FUSE_MKDIR"):
        assert ops[opcode]["count"] >= 1, opcode
        assert ops[opcode]["joined"] == ops[opcode]["count"], (opcode, ops[opcode])
    assert not report["daemon_only"], report["daemon_only"]


def test_a_slow_backend_shows_as_daemon_time_of_the_requests_waiting_for_it(mount_fs):
    """Every backend call of a cold ``ls`` sleeps 200 ms (demo latency): each request that
    waited for one (the lookups for the stats, the opening of the directory for its
    listing) joined its kernel request, and its time in the daemon holds the delay: the
    daemon's record of a request covers what the request awaited, not only what the
    kernel measured around it."""
    latency_ns = 200_000_000
    m = mount_fs("demo://?latency=200ms")
    m.stats(reset=True)
    report = trace_json(m, "ls", str(m.path / "ls" / "files-500"))
    calls = {name: op["latency"]["count"] for name, op in m.stats()["backend"].items()}
    assert calls["list"] == 1 and calls["stat"] >= 1, calls
    ops = report["ops"]
    for opcodes, call in ((("FUSE_LOOKUP",), "stat"),
                          (("FUSE_OPENDIR", "FUSE_READDIRPLUS"), "list")):
        waited = [ops[opcode] for opcode in opcodes if opcode in ops]
        assert all(op["joined"] == op["count"] for op in waited), opcodes
        in_daemon = sum(op["daemon"]["total_ns"] for op in waited)
        assert in_daemon >= calls[call] * latency_ns, (opcodes, in_daemon, calls[call])


def test_trace_csv_works_with_stats_diff(mount_fs, tmp_path):
    on = mount_fs()
    off = mount_fs("demo://", "--no-kernel-cache")
    files = []
    for m, name in ((on, "on.csv"), (off, "off.csv")):
        d = str(m.path / "ls" / "files-500")
        run_cli("trace", str(m.path), "--", "ls", "-l", d, check=True)  # warm up
        out = run_cli("trace", str(m.path), "--format", "csv", "--", "ls", "-l", d, check=True)
        (tmp_path / name).write_text(out.stdout)
        files.append(str(tmp_path / name))
    rows = dict(line.split(",", 1) for line in (tmp_path / "off.csv").read_text().splitlines())
    assert int(rows["trace.FUSE_LOOKUP.count"]) >= 500  # every entry revalidated
    diff = run_cli("stats", "diff", *files, check=True).stdout
    assert any(line.startswith("trace.FUSE_LOOKUP.count ") and "!!!" in line
               for line in diff.splitlines())


def test_duration_and_table(mount_fs):
    m = mount_fs()
    result = run_cli("trace", str(m.path), "--duration", "0.2", check=True)
    assert result.stdout.startswith("FUSE connection ")


def test_errors_restore_state(mount_fs):
    m = mount_fs()
    before = tracing_state()
    assert_one_line_error(run_cli("trace", str(m.path), "--", "no-such-command-xyz"),
                          "command not found: no-such-command-xyz")
    assert tracing_state() == before
    assert_one_line_error(run_cli("trace", "/proc", "--duration", "1"), "not a rucio-fs mount")
    assert_one_line_error(run_cli("trace", str(m.path), "--duration", "1", "--", "true"),
                          "either --duration or a command")


def test_tracefs_not_mounted(mount_fs):
    m = mount_fs()
    script = 'mount -t tmpfs none /sys/kernel && exec "$@"'
    import subprocess

    base = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
            *RUCIO_FS, "trace", str(m.path)]
    result = subprocess.run([*base, "--duration", "0.1"], capture_output=True, text=True)
    assert_one_line_error(result, "tracefs is not mounted", "--mount-tracefs")
    result = subprocess.run([*base, "--mount-tracefs", "--format", "json", "--", "ls", str(m.path)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["ops"]["FUSE_OPENDIR"]["joined"] == 1


def test_not_root(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(tracing.TraceError, match="tracing needs root"):
        tracing.check_tracing()


def test_kernel_without_tracepoints(monkeypatch, tmp_path):
    (tmp_path / "instances").mkdir()
    monkeypatch.setattr(tracing, "TRACEFS_ROOTS", (str(tmp_path),))
    with pytest.raises(tracing.TraceError, match=r"no fuse:fuse_request_send tracepoint"):
        tracing.check_tracing()


def test_join_by_containment():
    k = [tracing.KernelRequest(1, "FUSE_LOOKUP", 1_000, 9_000),
         tracing.KernelRequest(2, "FUSE_LOOKUP", 2_000, 5_000),
         tracing.KernelRequest(3, "FUSE_GETATTR", 2_500, None)]
    unjoined = tracing.join(k, [("lookup", 2_500, 4_000, 0), ("lookup", 3_000, 8_000, 0),
                                ("forget", 3_000, 3_100, 0)])
    assert k[0].daemon == (2_500, 4_000) and k[1].daemon is None
    assert unjoined == {"lookup": 1, "forget": 1}
