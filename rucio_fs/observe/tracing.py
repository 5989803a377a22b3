"""Kernel-to-userland FUSE tracing: where every microsecond of a call goes.

The kernel's tracepoints ``fuse:fuse_request_send`` and ``fuse:fuse_request_end`` (Linux 6.15+)
are enabled in a private tracefs instance — so the global tracing state is never touched and
removing the instance restores it — filtered to one mount's FUSE connection. The daemon records
each request it handles (operation, start and end on CLOCK_MONOTONIC, errno) while a trace
runs; the kernel instance uses the same clock (``trace_clock=mono``).

pyfuse3 does not expose the request's ``unique`` id to handlers, so the join key is the
operation plus time containment: a daemon record joins the earliest-sent unmatched kernel
request of the same opcode that was sent before the handler started and ended after it
returned. Kernel timestamps have microsecond resolution (tracefs text output); joins allow 1 µs.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rucio_fs.errors import InvalidInput, RucioFsError
from rucio_fs.observe import control

from .mounts import require_rucio_fs
from .stats import Log2Histogram, errno_name, quantile, summarize

TRACEFS_ROOTS = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")
EVENTS = ("fuse_request_send", "fuse_request_end")

#: The daemon's operation names and the kernel opcodes they answer.
DAEMON_OPCODES: Mapping[str, tuple[str, ...]] = {
    "lookup": ("FUSE_LOOKUP",), "getattr": ("FUSE_GETATTR",), "opendir": ("FUSE_OPENDIR",),
    "readdir": ("FUSE_READDIRPLUS", "FUSE_READDIR"), "releasedir": ("FUSE_RELEASEDIR",),
    "open": ("FUSE_OPEN",), "read": ("FUSE_READ",), "release": ("FUSE_RELEASE",),
    "statfs": ("FUSE_STATFS",), "getxattr": ("FUSE_GETXATTR",),
    "listxattr": ("FUSE_LISTXATTR",), "forget": ("FUSE_FORGET", "FUSE_BATCH_FORGET"),
    "create": ("FUSE_CREATE",), "write": ("FUSE_WRITE",), "flush": ("FUSE_FLUSH",),
    "fsync": ("FUSE_FSYNC",), "fsyncdir": ("FUSE_FSYNCDIR",), "setattr": ("FUSE_SETATTR",),
    "mkdir": ("FUSE_MKDIR",), "symlink": ("FUSE_SYMLINK",), "readlink": ("FUSE_READLINK",),
    "link": ("FUSE_LINK",), "unlink": ("FUSE_UNLINK",), "rmdir": ("FUSE_RMDIR",),
    "rename": ("FUSE_RENAME2", "FUSE_RENAME"), "setxattr": ("FUSE_SETXATTR",),
    "removexattr": ("FUSE_REMOVEXATTR",), "access": ("FUSE_ACCESS",),
}
_TOLERANCE_NS = 1_000


class RequestRecorder:
    """The daemon's per-request log while a trace runs (bounded; excess is counted)."""

    def __init__(self, limit: int = 2_000_000) -> None:
        self.limit = limit
        self.records: list[tuple[str, int, int, int]] = []
        self.dropped = 0

    def add(self, op: str, start_ns: int, end_ns: int, code: int) -> None:
        if len(self.records) < self.limit:
            self.records.append((op, start_ns, end_ns, code))
        else:
            self.dropped += 1


class TraceError(RucioFsError):
    """Tracing is not possible here; the message says why and what to do."""


def find_tracefs() -> Path | None:
    for root in TRACEFS_ROOTS:
        if os.path.isdir(os.path.join(root, "instances")):
            return Path(root)
    return None


def check_tracing(mount_tracefs: bool = False) -> Path:
    """The tracefs root, after checking root privileges and the kernel's FUSE tracepoints."""
    if os.geteuid() != 0:
        raise TraceError("tracing needs root (tracefs is root-only)")
    root = find_tracefs()
    if root is None and mount_tracefs:
        os.makedirs(TRACEFS_ROOTS[0], exist_ok=True)
        result = subprocess.run(["mount", "-t", "tracefs", "nodev", TRACEFS_ROOTS[0]],
                                capture_output=True)
        root = find_tracefs() if result.returncode == 0 else None
        if root is None:
            raise TraceError("could not mount tracefs on /sys/kernel/tracing")
    if root is None:
        raise TraceError("tracefs is not mounted; mount it with "
                         "`mount -t tracefs nodev /sys/kernel/tracing` or pass --mount-tracefs")
    for event in EVENTS:
        if not (root / "events" / "fuse" / event).is_dir():
            raise TraceError(f"this kernel ({os.uname().release}) has no fuse:{event} "
                             "tracepoint (added in Linux 6.15)")
    return root


def opcode_names(root: Path) -> dict[int, str]:
    """Opcode number → name, read from the send event's own print format."""
    text = (root / "events" / "fuse" / "fuse_request_send" / "format").read_text()
    return {int(n): name for n, name in re.findall(r'\{(\d+), "(\w+)"\}', text)}


class KernelTrace:
    """A private tracefs instance recording one FUSE connection's requests."""

    def __init__(self, root: Path, connection: int, buffer_kb: int) -> None:
        self.root = root
        self.connection = connection
        self.buffer_kb = buffer_kb
        self.instance = root / "instances" / f"rucio-fs-trace-{os.getpid()}"

    def _write(self, relative: str, value: str) -> None:
        (self.instance / relative).write_text(value)

    def start(self) -> None:
        try:
            self.instance.mkdir()
        except OSError as exc:
            raise TraceError(f"cannot create tracefs instance {self.instance}: "
                             f"{exc.strerror}") from None
        self._write("tracing_on", "0")
        self._write("trace_clock", "mono")
        self._write("buffer_size_kb", str(self.buffer_kb))
        for event in EVENTS:
            self._write(f"events/fuse/{event}/filter", f"connection == {self.connection}")
            self._write(f"events/fuse/{event}/enable", "1")
        self._write("tracing_on", "1")

    def stop(self) -> tuple[str, int]:
        """Stop recording; returns the trace text and how many events the buffer lost."""
        self._write("tracing_on", "0")
        text = (self.instance / "trace").read_text()
        lost = 0
        for stats in self.instance.glob("per_cpu/cpu*/stats"):
            match = re.search(r"^overrun: (\d+)", stats.read_text(), re.MULTILINE)
            lost += int(match.group(1)) if match else 0
        return text, lost

    def close(self) -> None:
        """Remove the instance (its events go with it). Safe to call more than once."""
        if not self.instance.exists():
            return
        for event in EVENTS:
            with contextlib.suppress(OSError):
                self._write(f"events/fuse/{event}/enable", "0")
        self.instance.rmdir()


@dataclass
class KernelRequest:
    unique: int
    opcode: str
    send_ns: int
    end_ns: int | None = None
    error: int | None = None
    daemon: tuple[int, int] | None = None


_LINE = re.compile(
    r"\s(\d+)\.(\d{6}): fuse_request_(send|end): connection (\d+) req (\d+) "
    r"(?:opcode \d+ \((\w+)\) len \d+|len \d+ error (-?\d+))")


def parse_trace(text: str, connection: int) -> list[KernelRequest]:
    """Kernel requests of ``connection``, paired send→end by ``unique``, in send order."""
    requests: dict[int, KernelRequest] = {}
    for match in _LINE.finditer(text):
        sec, usec, kind, conn, unique, opcode, error = match.groups()
        if int(conn) != connection:
            continue
        ts = int(sec) * 1_000_000_000 + int(usec) * 1_000
        if kind == "send":
            requests[int(unique)] = KernelRequest(int(unique), opcode, ts)
        elif int(unique) in requests:
            request = requests[int(unique)]
            request.end_ns, request.error = ts, int(error)
    return sorted(requests.values(), key=lambda r: r.send_ns)


def join(kernel: Sequence[KernelRequest], records: Iterable[Sequence[Any]]) -> dict[str, int]:
    """Attach each daemon record to its kernel request (see the module docstring).

    Returns the number of daemon records by operation that joined no kernel request.
    """
    by_opcode: dict[str, list[KernelRequest]] = {}
    for request in kernel:
        if request.end_ns is not None:
            by_opcode.setdefault(request.opcode, []).append(request)
    unjoined: dict[str, int] = {}
    pending: dict[str, list[KernelRequest]] = {}
    cursor: dict[str, int] = {}
    for op, start, end, _code in sorted(records, key=lambda r: r[1]):
        matched = False
        for opcode in DAEMON_OPCODES.get(op, ()):
            candidates = by_opcode.get(opcode)
            if not candidates:
                continue
            waiting = pending.setdefault(opcode, [])
            i = cursor.get(opcode, 0)
            while i < len(candidates) and candidates[i].send_ns <= start + _TOLERANCE_NS:
                waiting.append(candidates[i])
                i += 1
            cursor[opcode] = i
            # Requests that ended before this handler started can never join a later one.
            waiting[:] = [r for r in waiting if r.end_ns + _TOLERANCE_NS >= start]  # type: ignore[operator]
            for k, request in enumerate(waiting):
                if request.end_ns + _TOLERANCE_NS >= end:  # type: ignore[operator]
                    request.daemon = (start, end)
                    del waiting[k]
                    matched = True
                    break
            if matched:
                break
        if not matched:
            unjoined[op] = unjoined.get(op, 0) + 1
    return unjoined


def _hist(values: Iterable[int]) -> dict[str, Any]:
    hist = Log2Histogram()
    for value in values:
        hist.add(max(0, value))
    return hist.as_dict()


def analyse(kernel: Sequence[KernelRequest], records: Sequence[Sequence[Any]],
            lost_events: int, dropped_records: int, connection: int) -> dict[str, Any]:
    """Per-opcode report of a trace: JSON-able, rendered by :func:`render`."""
    unjoined = join(kernel, records)
    ops: dict[str, Any] = {}
    for opcode in sorted({r.opcode for r in kernel}):
        reqs = [r for r in kernel if r.opcode == opcode]
        answered = [r for r in reqs if r.end_ns is not None]
        joined = [r for r in answered if r.daemon is not None]
        errors: dict[str, int] = {}
        for r in answered:
            if r.error:
                name = errno_name(-r.error)
                errors[name] = errors.get(name, 0) + 1
        gaps = [(r.end_ns - r.send_ns) - (r.daemon[1] - r.daemon[0])  # type: ignore[operator,index]
                for r in joined]
        ops[opcode] = {
            "count": len(reqs), "answered": len(answered), "unanswered": len(reqs) - len(answered),
            "joined": len(joined), "not_seen_by_daemon": len(answered) - len(joined),
            "errors": errors,
            "kernel": _hist(r.end_ns - r.send_ns for r in answered),  # type: ignore[operator]
            "daemon": _hist(r.daemon[1] - r.daemon[0] for r in joined),  # type: ignore[index]
            "outside_daemon": _hist(gaps),
            # Kernel latency minus daemon time, smallest over joined requests (≥ 0 expected).
            "min_outside_ns": min(gaps) if gaps else None,
        }
    return {"connection": connection, "ops": ops, "daemon_records": len(records),
            "daemon_only": unjoined, "lost_events": lost_events,
            "dropped_daemon_records": dropped_records}


def flatten(report: Mapping[str, Any]) -> dict[str, float]:
    """``metric -> value`` rows, the same CSV shape as ``rucio-fs stats`` (for ``stats diff``)."""
    flat: dict[str, float] = {}
    for opcode, data in report["ops"].items():
        prefix = f"trace.{opcode}"
        for key in ("count", "unanswered", "joined", "not_seen_by_daemon"):
            flat[f"{prefix}.{key}"] = data[key]
        flat[f"{prefix}.errors"] = sum(data["errors"].values())
        for name, n in sorted(data["errors"].items()):
            flat[f"{prefix}.errno.{name}"] = n
        for part in ("kernel", "daemon", "outside_daemon"):
            flat.update(summarize(f"{prefix}.{part}_ns", data[part]))
    for op, n in sorted(report["daemon_only"].items()):
        flat[f"trace.daemon_only.{op}"] = n
    flat["trace.lost_events"] = report["lost_events"]
    return flat


def render_table(report: Mapping[str, Any]) -> str:
    def us(hist: Mapping[str, Any], q: float) -> str:
        return f"{quantile(hist, q) / 1e3:.1f}" if hist["count"] else "-"

    lines = [f"FUSE connection {report['connection']}: kernel-observed latency vs time inside "
             "the daemon (µs; outside = queueing and transit)",
             f"{'opcode':<18} {'count':>7} {'errors':>6} {'joined':>7} {'kern p50':>9} "
             f"{'kern p99':>9} {'dmn p50':>8} {'dmn p99':>8} {'out p50':>8} {'out p99':>8}"]
    for opcode, d in report["ops"].items():
        lines.append(
            f"{opcode:<18} {d['count']:>7} {sum(d['errors'].values()):>6} {d['joined']:>7} "
            f"{us(d['kernel'], .5):>9} {us(d['kernel'], .99):>9} {us(d['daemon'], .5):>8} "
            f"{us(d['daemon'], .99):>8} {us(d['outside_daemon'], .5):>8} "
            f"{us(d['outside_daemon'], .99):>8}")
        notes = []
        if d["errors"]:
            notes.append("errors " + ", ".join(f"{k}={v}" for k, v in sorted(d["errors"].items())))
        if d["not_seen_by_daemon"]:
            notes.append(f"{d['not_seen_by_daemon']} answered without reaching a rucio-fs "
                         "handler (libfuse/pyfuse3 defaults)")
        if d["unanswered"]:
            notes.append(f"{d['unanswered']} never answered during the trace")
        if notes:
            lines.append(f"{'':<18} " + "; ".join(notes))
    if report["daemon_only"]:
        lines.append("daemon records without a kernel request (no tracepoint for these): "
                     + ", ".join(f"{k}={v}" for k, v in sorted(report["daemon_only"].items())))
    if report["lost_events"] or report["dropped_daemon_records"]:
        lines.append(f"WARNING: {report['lost_events']} kernel events lost (buffer full; raise "
                     f"--buffer-mb), {report['dropped_daemon_records']} daemon records dropped")
    return "\n".join(lines)


def run_trace(mountpoint: str, command: Sequence[str], duration: float | None, buffer_mb: int,
              mount_tracefs: bool) -> tuple[int, dict[str, Any]]:
    """Trace ``command`` (or ``duration`` seconds, or until Ctrl-C) on a mount.

    Returns the exit code to use (the command's, 130 after Ctrl-C) and the :func:`analyse`
    report. The tracefs instance is removed on every path out, errors and Ctrl-C included.
    """
    mount = require_rucio_fs(mountpoint)
    if command and duration is not None:
        raise InvalidInput("give either --duration or a command, not both")
    if duration is not None and duration <= 0:
        raise InvalidInput("--duration must be positive")
    root = check_tracing(mount_tracefs)
    kernel_trace = KernelTrace(root, mount.minor, buffer_mb * 1024)
    code = 0
    try:
        kernel_trace.start()
        control.request(mountpoint, "trace_start")
        try:
            if command:
                code = subprocess.run(list(command), stdout=sys.stderr).returncode
            elif duration is not None:
                time.sleep(duration)
            else:
                while True:
                    signal.pause()
        except KeyboardInterrupt:
            code = 130
        except FileNotFoundError:
            raise InvalidInput(f"command not found: {command[0]}") from None
        finally:
            daemon = control.request(mountpoint, "trace_stop")
        text, lost = kernel_trace.stop()
    finally:
        kernel_trace.close()
    kernel = parse_trace(text, mount.minor)
    return code, analyse(kernel, daemon["records"], lost, daemon["dropped"], mount.minor)
