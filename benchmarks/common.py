"""What every benchmark script needs: mounts it can query and drop, timers, baselines.

Imported by the scripts in this directory (run as ``python benchmarks/<script>.py``, which puts
this directory on ``sys.path``).
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import random
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from rucio_fs.testing.mount import RUCIO_FS
from rucio_fs.testing.mount import Mount as SharedMount


class Mount(SharedMount):
    """A rucio-fs mount in a fresh directory under ``root`` (:mod:`rucio_fs.testing.mount`)."""

    def __init__(self, root: Path, url: str, *options: str, env: dict | None = None) -> None:
        path = Path(tempfile.mkdtemp(dir=root))
        super().__init__(SharedMount.start(url, path, *options, env=env).path)

    def drop(self, *layers: str, settle: float = 0.3) -> dict:
        """Every cache layer dropped, the kernel's included; then ``settle`` seconds for the
        kernel's forgets of the dropped inodes to arrive."""
        result = super().drop(*layers)
        time.sleep(settle)
        return result


class CheckoutMount(SharedMount):
    """A rucio-fs mount in a fresh directory under ``root`` run by the code of another
    checkout (:func:`checkout_code`): a same-run baseline of older code."""

    def __init__(self, root: Path, code: dict[str, str], url: str, *options: str) -> None:
        self.code = code
        path = Path(tempfile.mkdtemp(dir=root))
        subprocess.run([*RUCIO_FS, "mount", url, str(path), *options], check=True,
                       capture_output=True, text=True, env=code, cwd=code["PYTHONPATH"],
                       timeout=300)
        super().__init__(path)

    def unmount(self, check: bool = False) -> None:
        result = subprocess.run([*RUCIO_FS, "unmount", str(self.path)], capture_output=True,
                                text=True, env=self.code, cwd=self.code["PYTHONPATH"],
                                timeout=300)
        if result.returncode != 0:
            subprocess.run(["fusermount3", "-u", "-z", str(self.path)], capture_output=True)
            if check:
                raise RuntimeError(f"unmount of {self.path} failed: {result.stderr.strip()}")


def checkout_code(checkout: Path, root: Path) -> dict[str, str]:
    """The environment under which ``python -m rucio_fs`` (run with ``cwd`` its
    ``PYTHONPATH``) runs the code of ``checkout``, another checkout of this repository (``git
    worktree add DIR COMMIT``), with this venv's packages.

    The editable install maps ``rucio_fs.backends`` to this checkout's ``backends/`` whatever
    ``rucio_fs`` is imported from, so the package is put together under ``root`` from links:
    ``checkout``'s ``rucio_fs/`` entries and its ``backends/`` as ``rucio_fs/backends``. Checked
    here: ``rucio_fs`` and the S3 backend both import from ``checkout``."""
    checkout = checkout.resolve()
    package = Path(tempfile.mkdtemp(dir=root)) / "rucio_fs"
    package.mkdir()
    for item in (checkout / "rucio_fs").iterdir():
        if item.name != "__pycache__":
            (package / item.name).symlink_to(item)
    if not (package / "backends").exists():
        (package / "backends").symlink_to(checkout / "backends")
    env = {**os.environ, "PYTHONPATH": str(package.parent)}
    shown = subprocess.run(
        [sys.executable, "-c", "import rucio_fs, rucio_fs.backends.s3.backend as s3; "
         "print(rucio_fs.__file__); print(s3.__file__)"],
        env=env, cwd=package.parent, check=True, capture_output=True, text=True).stdout.split()
    for name in shown:
        if not Path(name).resolve().is_relative_to(checkout):
            raise RuntimeError(f"{name} is not from {checkout}: the baseline would run "
                               "this checkout's code")
    return env


def read_env(path: Path) -> dict[str, str]:
    """A test server's ``server.env`` (``NAME=value`` lines)."""
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def random_file(path: Path, size: int) -> str:
    """``size`` random bytes written to ``path``; returns their md5."""
    md5 = hashlib.md5()
    with open(path, "wb") as f:
        for offset in range(0, size, 64 << 20):
            chunk = os.urandom(min(64 << 20, size - offset))
            md5.update(chunk)
            f.write(chunk)
    return md5.hexdigest()


def md5_prefix(path: Path, size: int) -> str:
    """md5 of the first ``size`` bytes of ``path``, read in chunks (files may be 10 GB)."""
    md5 = hashlib.md5()
    with open(path, "rb") as f:
        while size > 0:
            chunk = f.read(min(size, 64 << 20))
            if not chunk:
                break
            md5.update(chunk)
            size -= len(chunk)
    return md5.hexdigest()


def timed(cmd: list[str] | str, shell: bool = False) -> float:
    """Seconds one command takes, its output discarded."""
    start = time.perf_counter()
    subprocess.run(cmd, shell=shell, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def read_whole(path: Path) -> float:
    """Seconds to open and read a file the way cat does, without starting a process."""
    start = time.perf_counter()
    with open(path, "rb") as f:
        while f.read(131072):
            pass
    return time.perf_counter() - start


def peak_rss_mb(pid: int) -> float:
    """The most resident memory a process has had (MiB)."""
    return _status_mb(pid, "VmHWM")


def rss_mb(pid: int) -> float:
    """Resident memory of a process now (MiB)."""
    return _status_mb(pid, "VmRSS")


def _status_mb(pid: int, key: str) -> float:
    with open(f"/proc/{pid}/status") as f:
        return int(next(x for x in f if x.startswith(key + ":")).split()[1]) / 1024


def drop_page_cache() -> None:
    """Cold for every file system alike: the kernel's page cache of the machine dropped."""
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


@contextmanager
def tmpfs_twin(root: Path, names: Iterable[str]) -> Iterator[Path]:
    """The same names as 4 KiB files on a fresh tmpfs: the local baseline for ls."""
    path = Path(tempfile.mkdtemp(dir=root))
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(path)], check=True)
    try:
        for name in names:
            (path / name).write_bytes(b"\0" * 4096)
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=False)


@contextmanager
def rclone_http_mount(root: Path, storage_url: str, wait_for: str) -> Iterator[Path]:
    """``rclone mount`` of an http storage root (the peer client), ready once ``wait_for``
    (a path relative to the root) shows."""
    path = Path(tempfile.mkdtemp(dir=root))
    proc = subprocess.Popen(["rclone", "mount", "--read-only", "--http-url", storage_url,
                             ":http:", str(path)], stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if (path / wait_for).exists():
                break
            time.sleep(0.1)
        yield path
    finally:
        subprocess.run(["fusermount3", "-u", str(path)], check=False)
        proc.wait(timeout=30)


def irods_fake_control(port: int, name: str, body: dict) -> None:
    """POST ``body`` to the fake's ``/_fake/<name>`` (seed, config, ...)."""
    conn = http.client.HTTPConnection("127.0.0.1", port)
    conn.request("POST", f"/_fake/{name}", json.dumps(body))
    assert conn.getresponse().status == 200
    conn.close()


def small_tree(root: Path, files: int) -> int:
    """GeeseFS's tree: ``files`` files over 32x32 directories, 0.5-300 KB, ~30 KB mean."""
    rng = random.Random(42)
    total = 0
    for i in range(files):
        d = root / f"d{i % 32:02d}" / f"e{(i // 32) % 32:02d}"
        d.mkdir(parents=True, exist_ok=True)
        size = int(min(300_000, max(500, rng.expovariate(1 / 30_000))))
        (d / f"f{i:05d}").write_bytes(rng.randbytes(size))
        total += size
    return total


def geesefs_binary() -> str | None:
    """GeeseFS, when built (``$GEESEFS``, else ``geesefs`` on the PATH): it has no Debian
    package; ``go build`` of its source makes it (see benchmarks/README.md)."""
    return os.environ.get("GEESEFS") or shutil.which("geesefs")


#: The environment of a rucio-fs mount that leaves the kernel sending the lookups of one
#: directory one at a time (libfuse's behaviour before 3.17): a same-run baseline.
SERIAL_DIROPS = {"RUCIO_FS_PARALLEL_DIROPS": "0"}


@contextmanager
def s3_peer_mount(kind: str, env: dict, prefix: str, root: Path, part_mb: int = 0,
                  options: Sequence[str] = (), keep_times: bool = False) -> Iterator[Path]:
    """``prefix`` of bucket ``test`` mounted by rucio-fs, ``s3fs``, ``geesefs`` or ``rclone``
    (``env``: the ``server.env`` of ``scripts/servers/s3.sh``); unmounted on exit.
    ``rucio-fs-serial``: rucio-fs leaving the kernel's lookups in one directory one at a time
    (``RUCIO_FS_PARALLEL_DIROPS=0``). ``part_mb``: the multipart part size, where not the
    client's default (s3fs only). ``options``: more options of a rucio-fs mount
    (``--write-back async``, ``--log-file``). ``keep_times``: rclone shows the modification
    times a writer set (stored in ``x-amz-meta-mtime``), not the server's upload times
    (``--use-server-modtime``, which saves it a HEAD per file: the default here)."""
    path = Path(tempfile.mkdtemp(dir=root))
    endpoint = env["VGW_ENDPOINT"]
    if kind.startswith("rucio-fs"):
        mount = Mount(root, f"s3://test/{prefix}", "-o", f"endpoint_url={endpoint}", *options,
                      env={**os.environ, **SERIAL_DIROPS} if kind == "rucio-fs-serial" else None)
        try:
            yield mount.path
        finally:
            mount.unmount()
        return
    peer_env = {k: v for k, v in os.environ.items() if k != "AWS_CA_BUNDLE"}
    if kind == "s3fs":
        secrets = root / "s3fs.passwd"
        secrets.write_text(f"{env['AWS_ACCESS_KEY_ID']}:{env['AWS_SECRET_ACCESS_KEY']}\n")
        secrets.chmod(0o600)
        subprocess.run(["s3fs", "test:/" + prefix, str(path), "-o",
                        f"url={endpoint},use_path_request_style,passwd_file={secrets},"
                        "endpoint=us-east-1"
                        + (f",multipart_size={part_mb}" if part_mb else "")], check=True)
    elif kind == "geesefs":
        peer_env.update({k: env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")})
        subprocess.run([geesefs_binary() or "geesefs", "--endpoint", endpoint,
                        f"test:{prefix}", str(path)], check=True, env=peer_env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    else:
        peer_env.update({"RCLONE_CONFIG_S3_TYPE": "s3", "RCLONE_CONFIG_S3_PROVIDER": "Other",
                         "RCLONE_CONFIG_S3_ENDPOINT": endpoint,
                         "RCLONE_CONFIG_S3_ACCESS_KEY_ID": env["AWS_ACCESS_KEY_ID"],
                         "RCLONE_CONFIG_S3_SECRET_ACCESS_KEY": env["AWS_SECRET_ACCESS_KEY"],
                         "RCLONE_CONFIG_S3_ENV_AUTH": "false"})
        subprocess.run(["rclone", "mount", f"s3:test/{prefix}", str(path), "--daemon",
                        *([] if keep_times else ["--use-server-modtime"])],
                       check=True, env=peer_env)
    deadline = time.monotonic() + 20
    while not os.path.ismount(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        yield path
    finally:
        subprocess.run(["fusermount3", "-u", str(path)])


SERVERS = Path(__file__).resolve().parent.parent / "scripts" / "servers"
RESULTS = Path(__file__).resolve().parent / "results"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def script_server(name: str, base: Path, **env: str) -> Iterator[dict[str, str]]:
    """A server of ``scripts/servers/NAME.sh`` (redis, proxy) started in ``base`` and stopped
    by PID on exit; yields its ``server.env``."""
    script = SERVERS / f"{name}.sh"
    subprocess.run(["bash", str(script), "start", str(base)], check=True,
                   env={**os.environ, **env})
    try:
        yield read_env(base / "server.env")
    finally:
        subprocess.run(["bash", str(script), "stop", str(base)], check=False)


def rucio_arguments(doc: str, name: str, repeat: int) -> argparse.ArgumentParser:
    """The arguments every Rucio benchmark takes: ``--server`` (a running ``rucio.sh``
    server, else one is started), ``--repeat`` and ``--out`` (its JSON)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--server", type=Path, help="directory of a running rucio.sh server")
    ap.add_argument("--repeat", type=int, default=repeat)
    ap.add_argument("--out", type=Path, default=RESULTS / f"{name}.json")
    return ap


@contextmanager
def rucio_server(reuse: Path | None, root: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """The Rucio server of ``scripts/servers/rucio.sh`` in ``reuse`` (left running), else one
    started under ``root`` and stopped by PID on exit; yields its directory and ``server.env``,
    with ``RUCIO_CONFIG`` set for the mounts this process starts."""
    if reuse is not None:
        env = read_env(reuse / "server.env")
        os.environ["RUCIO_CONFIG"] = env["RUCIO_CONFIG"]
        yield reuse, env
        return
    with script_server("rucio", root / "server") as env:
        os.environ["RUCIO_CONFIG"] = env["RUCIO_CONFIG"]
        yield root / "server", env


def concurrently(commands: list[list[str]]) -> list[float]:
    """Start every command at once; each one's seconds from the common start to its exit."""
    start = time.perf_counter()
    procs = [subprocess.Popen(c, stdout=subprocess.DEVNULL) for c in commands]
    ends: list[float] = [0.0] * len(procs)

    def wait(i: int) -> None:
        if procs[i].wait() != 0:
            raise RuntimeError(f"{commands[i]} failed")
        ends[i] = time.perf_counter() - start

    threads = [threading.Thread(target=wait, args=(i,)) for i in range(len(procs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if not all(ends):
        raise RuntimeError("a concurrent command failed")
    return ends


def cpu_seconds(pids: Iterable[int]) -> float:
    """User + system CPU the processes have used so far (all their threads)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / ticks


def children_of(pid: int) -> list[int]:
    """``pid`` and its direct children (a gunicorn master and its workers)."""
    found = [pid]
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
        except (OSError, ValueError):
            continue
    return found


class CpuMeter:
    """CPU used from its creation until :meth:`used`: by each of ``pids``, by the ``server``
    processes together, by this process's finished children (the commands it ran), and by
    the whole machine (every core's non-idle time)."""

    def __init__(self, pids: list[int], server: list[int]) -> None:
        self.pids, self.server = pids, server
        self._start = self._now()

    def _now(self) -> dict:
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        with open("/proc/stat") as f:
            jiffies = [int(x) for x in f.readline().split()[1:]]
        return {"pids": [cpu_seconds([p]) for p in self.pids],
                "server": cpu_seconds(self.server),
                "children": children.ru_utime + children.ru_stime,
                "machine": (sum(jiffies) - jiffies[3] - jiffies[4]) / os.sysconf("SC_CLK_TCK")}

    def used(self) -> dict:
        now, start = self._now(), self._start
        return {"pids": [a - b for a, b in zip(now["pids"], start["pids"], strict=True)],
                **{k: now[k] - start[k] for k in ("server", "children", "machine")}}



# -- goals: what a benchmark promises, checked against what it measured ----------------------

@dataclass(frozen=True)
class Goal:
    """One goal of a benchmark as its run found it: what was measured, next to what.

    ``rucio_fs`` and ``baseline`` are display text with their units (``baseline`` is empty
    where a goal is absolute); ``ratio`` is rucio-fs over the baseline where the goal is one;
    ``met`` is computed from the measurement (:func:`at_most`, :func:`at_least`), ``None``
    when the measurement could not be made (the text says why)."""

    benchmark: str
    what: str
    rucio_fs: str
    baseline: str
    ratio: float | None
    goal: str
    met: bool | None


def at_most(value: float | None, limit: float) -> bool | None:
    """Whether ``value`` is at most ``limit``; ``None`` when there is no value."""
    return None if value is None else value <= limit


def at_least(value: float | None, limit: float) -> bool | None:
    """Whether ``value`` is at least ``limit``; ``None`` when there is no value."""
    return None if value is None else value >= limit


def add_goals(results: dict, goals: Iterable[Goal]) -> dict:
    """``results`` (a benchmark's JSON output) with its goal rows under ``"goals"``, a list
    of :class:`Goal` fields (the form ``suite.py --goals`` reads); returns ``results``."""
    results["goals"] = [asdict(goal) for goal in goals]
    return results


def goal_table(rows: Iterable[Goal | dict]) -> list[str]:
    """Goal rows as the lines of a Markdown table (a ``|`` inside a cell is escaped)."""
    lines = ["| what | rucio-fs | baseline | ratio | goal | met |",
             "|---|---:|---:|---:|---|---|"]
    for row in rows:
        r = asdict(row) if isinstance(row, Goal) else row
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        cells = [r["what"], r["rucio_fs"], r["baseline"], ratio, r["goal"], met_mark(r["met"])]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return lines


def met_mark(met: bool | None) -> str:
    """How a goal's ``met`` reads in a table."""
    return {True: "met", False: "**not met**", None: "not measured"}[met]
