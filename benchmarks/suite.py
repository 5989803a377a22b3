"""The published experiments, reproduced on any landed backend: one command, one results directory.

    python benchmarks/suite.py --backend demo|rucio|s3|irods [--experiments ls,users,...]
                               [--repeat 10] [--smoke] [--server DIR] [--out DIR]
                               [--big-write SIZE] [--peers s3fs,rclone]

Writes into ``--out`` (default ``benchmarks/results/<time>-<backend>/``): ``results.json`` (machine,
versions, backend, each mount's cache configuration from ``rucio-fs stats``, every
measurement), one CSV per experiment, PNG plots and ``summary.md``. Every number sits next to a
baseline measured in the same run where one exists. "Cold" means every layer dropped with
``rucio-fs cache drop`` (the kernel's included), followed by a short settle; ``--cold`` mounts
(every layer off) are used where the published experiment had no cache at all.

Experiments: ``ls`` (RucioFS Figure 1: ls and ls -l of 500...50,000 files, cold vs warm, tmpfs
twin as baseline), ``users`` (Figure 2: 1...100 concurrent ls processes, cold/warm, coalescing
on/off, backend listings counted), ``cat`` (small files cold vs warm, the 4.2 GB file's
throughput and byte identity), ``nfsrods`` (the NFSRODS table: ``ls | wc -l``, no cache vs cached),
``local`` (the same reads from a local copy vs the mount, per-file time histograms), ``peers``
(rclone mount of the Rucio storage, when installed), and on the writable backends (S3, iRODS):
``geesefs`` (GeeseFS's tests: ``cp -r`` of 6,400 small files in 1,024 directories, ``rm -r``,
in 3 rounds with the clients interleaved, then a 10 GB write and cold read, ``--big-write``
sets the size; beside the same on local disk, and beside s3fs and rclone on S3 when
installed) and ``mdtest`` (mdtest's ``-b 6 -I 8 -z 4``
shape: tree, directory and file create/stat/read/remove rates beside local disk and beside
``floor_fs.py``, pyfuse3 doing nothing but keep names and bytes in memory: the floor of a
pyfuse3 file system on this kernel).

Backends: ``demo``; ``rucio`` (``--server DIR`` of ``scripts/servers/rucio.sh``, else one is
started); ``s3`` (``--server DIR`` of ``scripts/servers/s3.sh``, else one is started; the
catalog is written straight into versitygw's posix directory); ``irods`` (the fake iRODS HTTP
API of ``rucio_fs/testing/irods_fake.py``, started here; it holds data in memory, so its big file is
256 MiB at most). ``--smoke`` runs every experiment in seconds (CI runs it on every backend so
the suite cannot rot).

    python benchmarks/suite.py --goals [NAMES] [--smoke] [--publish]
                               [--rucio-server DIR] [--s3-server DIR] [--out DIR]

``--goals`` runs the goal benchmarks instead (``bench_*.py``, each as its own process, the test
servers they need started once) and writes their goal rows into ``summary.md``; ``--publish``
also writes it to ``benchmarks/RESULTS.md`` (:mod:`goals`).
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import click
import goals
from common import (
    CpuMeter,
    Mount,
    children_of,
    concurrently,
    drop_page_cache,
    free_port,
    geesefs_binary,
    irods_fake_control,
    md5_prefix,
    peak_rss_mb,
    random_file,
    rclone_http_mount,
    read_env,
    read_whole,
    rss_mb,
    s3_peer_mount,
    script_server,
    small_tree,
    timed,
    tmpfs_twin,
)

from rucio_fs.observe import control
from rucio_fs.testing import irods_fake
from rucio_fs.testing.mount import RUCIO_FS

REPO = Path(__file__).resolve().parent.parent
SERVERS = REPO / "scripts" / "servers"
EXPERIMENTS = ("ls", "users", "cat", "nfsrods", "local", "peers", "geesefs", "mdtest",
               "mounts")
WRITE_ONLY = {"geesefs": "GeeseFS small-file and big-write tests need a writable backend",
              "mdtest": "mdtest-like metadata rates need a writable backend"}
BIG_SIZE = 4_509_715_660
SMALL = 4096
FAKE_BIG_MAX = 256 << 20  # the fake iRODS server keeps every byte in memory


@dataclass
class Target:
    """Where each experiment finds its data on one backend's mount."""

    backend: str
    url: str
    dirs: dict[int, str]              # file count -> directory (relative to the mount)
    small_dir: str
    big: str
    env: dict[str, str] = field(default_factory=dict)
    storage_url: str = ""             # http root of the storage, for peers and curl baselines
    big_url: str = ""
    big_local: str = ""               # the big file's bytes on local disk (Rucio's storage)
    big_size: int = BIG_SIZE
    big_checksummed: bool = True      # the mount verifies the big file's catalog checksum
    writable: str = ""                # URL of an empty writable directory ("": read-only)
    server_env: dict[str, str] = field(default_factory=dict)
    http_reads: bool = False          # reads are HTTP ranges a data proxy may cache
    proxy_ca: str = ""                # CA bundle of the storage's https certificate
    #: The catalog with each request taking a while, where the experiments need requests to
    #: overlap (coalescing): the demo catalog answers at once unless given a latency.
    latency_url: str = ""

    @property
    def slow_url(self) -> str:
        return self.latency_url or self.url

    def not_run(self) -> dict[str, str]:
        return {} if self.writable else WRITE_ONLY


def demo_target() -> Target:
    from rucio_fs.backends.demo.backend import LS_SIZES
    return Target("demo", "demo://", {n: f"ls/files-{n}" for n in LS_SIZES}, "ls/files-500",
                  f"big/frame-{BIG_SIZE}.gwf", latency_url="demo://?latency=20ms")


def rucio_target(server: Path) -> Target:
    env = read_env(server / "server.env")
    catalog = json.loads((server / "catalog.json").read_text())
    sizes = sorted(int(k[2:]) for k in catalog if k.startswith("ds") and k[2:].isdigit())
    big = next((Path(env["DAV_ROOT"]) / "rucio" / "bench").rglob(f"frame-{BIG_SIZE}.gwf"))
    storage = f"http://127.0.0.1:{env['DAV_HTTP']}/"
    return Target("rucio", "rucio:///bench?schemes=http", {n: f"ds{n}" for n in sizes},
                  "ds1000", f"big/frame-{BIG_SIZE}.gwf", {"RUCIO_CONFIG": env["RUCIO_CONFIG"]},
                  storage, storage + str(big.relative_to(Path(env["DAV_ROOT"]))), str(big),
                  server_env=env, http_reads=True, proxy_ca=env["CA_CERT"])


def small_content(i: int) -> bytes:
    return i.to_bytes(4, "big") * (SMALL // 4)


def s3_target(server: Path, sizes: list[int], big_bytes: int) -> Target:
    """The catalog written straight into versitygw's posix directory (a file plus its ETag
    xattr per object, as versitygw stores them): far quicker than uploading it."""
    env = read_env(server / "server.env")
    prefix = f"suite-{uuid.uuid4().hex[:6]}"
    data = Path(env["VGW_DATA"]) / "test" / prefix
    dirs = {}
    for n in sizes:
        d = data / "ls" / f"files-{n}"
        d.mkdir(parents=True)
        for i in range(n):
            path, content = d / f"file-{i:06d}.dat", small_content(i)
            path.write_bytes(content)
            os.setxattr(path, "user.etag", f'"{hashlib.md5(content).hexdigest()}"'.encode())
        dirs[n] = f"ls/files-{n}"
    (data / "big").mkdir(parents=True)
    big = data / "big" / "frame.gwf"
    os.setxattr(big, "user.etag", f'"{random_file(big, big_bytes)}"'.encode())
    endpoint = f"?endpoint_url={env['VGW_ENDPOINT']}"
    return Target("s3", f"s3://test/{prefix}{endpoint}", dirs, dirs[min(dirs)] if dirs else "",
                  "big/frame.gwf", {k: env[k] for k in ("AWS_ACCESS_KEY_ID",
                                                        "AWS_SECRET_ACCESS_KEY", "AWS_REGION")},
                  big_local=str(big), big_size=big_bytes, big_checksummed=False,
                  writable=f"s3://test/{prefix}-w{endpoint}", server_env=env, http_reads=True)


def irods_target(root: Path, port: int, sizes: list[int], big_bytes: int) -> Target:
    """The catalog seeded into the fake through its ``/_fake/seed`` control."""
    from rucio_fs.testing.irods_fake import API, PASSWORD, USER

    collection = f"/tempZone/home/{USER}/suite"
    dirs = {}
    for n in sizes:
        for first in range(0, n, 5000):
            files = {f"file-{i:06d}.dat": base64.b64encode(small_content(i)).decode()
                     for i in range(first, min(n, first + 5000))}
            irods_fake_control(port, "seed", {"collection": f"{collection}/ls/files-{n}",
                                              "owner": USER, "files": files})
        dirs[n] = f"ls/files-{n}"
    big_bytes = min(big_bytes, FAKE_BIG_MAX)
    big = root / "irods-big-source"
    random_file(big, big_bytes)
    irods_fake_control(port, "seed", {"collection": f"{collection}/big", "owner": USER,
                                      "files": {"frame.gwf": base64.b64encode(
                                          big.read_bytes()).decode()}})
    irods_fake_control(port, "seed", {"collection": f"{collection}-w", "owner": USER,
                                      "files": {}})
    base = f"irods://{USER}@127.0.0.1:{port}"
    return Target("irods", f"{base}{collection}?api_path={API}", dirs,
                  dirs[min(dirs)] if dirs else "",
                  "big/frame.gwf", {"IRODS_PASSWORD": PASSWORD,
                                    "IRODS_ENVIRONMENT_FILE": "/nonexistent"},
                  big_local=str(big), big_size=big_bytes, big_checksummed=False,
                  writable=f"{base}{collection}-w?api_path={API}")


# -- plumbing ---------------------------------------------------------------------------------

def spread(values: list[float]) -> tuple[float, float]:
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def progress(items: Iterable, label: str) -> Iterator:
    """``items``, with a progress bar on stderr."""
    with click.progressbar(list(items), label=label, file=sys.stderr, show_pos=True,
                           item_show_func=lambda i: str(i) if i is not None else "") as bar:
        yield from bar


class Results:
    def __init__(self, out: Path, target: Target, smoke: bool) -> None:
        self.out = out
        self.data: dict = {
            "machine": {"host": platform.node(), "kernel": platform.release(),
                        "cpus": os.cpu_count(), "python": platform.python_version()},
            "versions": {"rucio-fs": subprocess.run([*RUCIO_FS, "--version"], check=True,
                                                    capture_output=True, text=True).stdout.strip()},
            "backend": target.backend, "url": target.url, "smoke": smoke,
            "mounts": {}, "experiments": {}, "not_run": target.not_run(), "inconsistent": [],
        }
        self.summary: list[str] = []

    def off_differs(self, experiment: str, variant: str, on_calls: int, off_calls: int) -> None:
        """An "off" variant must make more backend calls than "on": one that does not shows
        no difference the experiment could claim (the run then fails)."""
        if off_calls <= on_calls:
            self.data["inconsistent"].append(
                f"{experiment}: with {variant} off the backend had {off_calls} calls, with it "
                f"on {on_calls}: the off variant changed nothing")

    def mount_config(self, name: str, mount: Mount) -> None:
        self.data["mounts"][name] = mount.stats()["config"]

    def table(self, experiment: str, rows: list[dict]) -> None:
        self.data["experiments"][experiment] = rows
        with open(self.out / f"{experiment}.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)

    def write(self) -> None:
        (self.out / "results.json").write_text(json.dumps(self.data, indent=1))
        head = [f"# rucio-fs benchmark suite: {self.data['backend']}",
                "", f"Machine: {self.data['machine']}; {self.data['versions']['rucio-fs']}; "
                    f"{'smoke mode' if self.data['smoke'] else 'full mode'}.", ""]
        not_run = self.data["not_run"]
        tail = ["", "Not run: " + "; ".join(not_run.values()) + "."] if not_run else []
        if self.data["inconsistent"]:
            tail += ["", "## Inconsistent experiments", "",
                     *(f"- {line}" for line in self.data["inconsistent"])]
        (self.out / "summary.md").write_text("\n".join(head + self.summary + tail) + "\n")


def plot(path: Path, title: str, xlabel: str, ylabel: str,
         lines: dict[str, tuple[list[float], list[float]]], log: bool = True) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, (xs, ys) in lines.items():
        ax.plot(xs, ys, marker="o", label=label)
    if log:
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# -- experiments ------------------------------------------------------------------------------

def exp_ls(root: Path, target: Target, res: Results, sizes: list[int], repeat: int) -> None:
    m = Mount(root, target.url)
    res.mount_config("ls", m)
    rows, lines = [], {}
    try:
        for n in progress(sizes, "ls scaling"):
            d = m.path / target.dirs[n]
            with tmpfs_twin(root, os.listdir(d)) as twin:
                for cmd in (["ls"], ["ls", "-l"]):
                    name = " ".join(cmd)
                    cold = []
                    for _ in range(repeat):
                        m.drop()
                        cold.append(timed([*cmd, str(d)]))
                    warm = [timed([*cmd, str(d)]) for _ in range(repeat)]
                    local = [timed([*cmd, str(twin)]) for _ in range(repeat)]
                    for mode, values in (("cold", cold), ("warm", warm), ("tmpfs", local)):
                        mean, sd = spread(values)
                        rows.append({"files": n, "command": name, "mode": mode, "mean_s": mean,
                                     "stdev_s": sd, "n": len(values),
                                     "ratio_to_tmpfs": mean / statistics.mean(local)})
                        lines.setdefault(f"{name} {mode}", ([], []))
                        lines[f"{name} {mode}"][0].append(n)
                        lines[f"{name} {mode}"][1].append(mean)
    finally:
        m.unmount()
    res.table("ls", rows)
    plot(res.out / "ls.png", f"ls scaling ({target.backend})", "files", "seconds", lines)
    res.summary += ["## ls scaling (RucioFS Figure 1)", "",
                    "| files | command | cold s | warm s | tmpfs s | warm / tmpfs |",
                    "|---:|---|---:|---:|---:|---:|"]
    for n in sizes:
        for name in ("ls", "ls -l"):
            by = {r["mode"]: r for r in rows if r["files"] == n and r["command"] == name}
            res.summary.append(
                f"| {n} | `{name}` | {by['cold']['mean_s']:.3f} ± {by['cold']['stdev_s']:.3f} | "
                f"{by['warm']['mean_s']:.4f} | {by['tmpfs']['mean_s']:.4f} | "
                f"{by['warm']['ratio_to_tmpfs']:.2f} |")
    res.summary.append("")


def exp_users(root: Path, target: Target, res: Results, users: list[int]) -> None:
    n = 10_000 if 10_000 in target.dirs else max(target.dirs)
    rows, lines = [], {}
    for coalescing in (True, False):
        m = Mount(root, target.slow_url, *([] if coalescing else ["--no-coalescing"]))
        res.mount_config(f"users_coalescing_{coalescing}", m)
        d = str(m.path / target.dirs[n])
        try:
            for u in progress(users, f"concurrent users (coalescing {coalescing})"):
                for mode in ("cold", "warm"):
                    if mode == "cold":
                        m.drop()
                    else:
                        timed(["ls", d])
                    before = m.backend_calls("list")
                    start = time.perf_counter()
                    procs = [subprocess.Popen(["ls", d], stdout=subprocess.DEVNULL)
                             for _ in range(u)]
                    codes = [p.wait() for p in procs]
                    elapsed = time.perf_counter() - start
                    if any(codes):
                        raise RuntimeError(f"ls failed with {u} users")
                    listings = m.backend_calls("list") - before
                    rows.append({"users": u, "mode": mode, "coalescing": coalescing,
                                 "seconds": elapsed, "backend_listings": listings})
                    key = f"{mode}, coalescing {'on' if coalescing else 'off'}"
                    lines.setdefault(key, ([], []))
                    lines[key][0].append(u)
                    lines[key][1].append(elapsed)
        finally:
            m.unmount()
    concurrent = [r for r in rows if r["mode"] == "cold" and r["users"] > 1]
    res.off_differs("users", "coalescing",
                    sum(r["backend_listings"] for r in concurrent if r["coalescing"]),
                    sum(r["backend_listings"] for r in concurrent if not r["coalescing"]))
    one = {(r["mode"], r["coalescing"]): r["seconds"] for r in rows if r["users"] == users[0]}
    for r in rows:
        r["ratio_to_one_user"] = r["seconds"] / one[(r["mode"], r["coalescing"])]
    res.table("users", rows)
    plot(res.out / "users.png", f"{n} files, concurrent ls ({target.backend})", "users",
         "seconds until all done", lines)
    res.summary += [f"## Concurrent users (RucioFS Figure 2): `ls` of {n} files", "",
                    "| users | mode | coalescing | seconds | x 1 user | backend listings |",
                    "|---:|---|---|---:|---:|---:|"]
    res.summary += [f"| {r['users']} | {r['mode']} | {'on' if r['coalescing'] else 'off'} | "
                    f"{r['seconds']:.3f} | {r['ratio_to_one_user']:.2f} | {r['backend_listings']} |"
                    for r in rows]
    res.summary.append("")


def exp_cat(root: Path, target: Target, res: Results, files: int, big_bytes: int) -> None:
    m = Mount(root, target.url)
    res.mount_config("cat", m)
    rows = []
    try:
        d = m.path / target.small_dir
        names = sorted(os.listdir(d))[:files]
        m.drop()
        for name in progress(names, "cat small files"):
            cold = read_whole(d / name)
            warm = read_whole(d / name)
            rows.append({"what": "cat small", "file": name, "cold_s": cold, "warm_s": warm})
        big = m.path / target.big
        verified = m.stats()["events"].get("checksum_verified", 0)
        drop_page_cache()
        elapsed = timed(["head", "-c", str(big_bytes), str(big)])  # what cat/cp do
        if target.big_checksummed and big_bytes == BIG_SIZE:
            # identity: the daemon verified the catalog's checksum
            identical = m.stats()["events"].get("checksum_verified", 0) == verified + 1
        else:  # identity: the bytes read again, against the source
            identical = md5_prefix(big, big_bytes) == _md5_prefix_source(target, big_bytes)
        baseline = ""
        if target.big_url:
            curl = subprocess.run(["curl", "-sf", "-o", "/dev/null", "-r", f"0-{big_bytes - 1}",
                                   "-w", "%{time_total}", target.big_url], check=True,
                                  capture_output=True, text=True).stdout
            baseline = big_bytes / 1e6 / float(curl)
        rows.append({"what": "read big", "file": target.big, "cold_s": elapsed, "warm_s": "",
                     "MBps": big_bytes / 1e6 / elapsed, "curl_MBps": baseline,
                     "identical": identical, "bytes": big_bytes})
    finally:
        m.unmount()
    res.table("cat", [{k: r.get(k, "") for k in ("what", "file", "cold_s", "warm_s", "MBps",
                                                  "curl_MBps", "identical", "bytes")}
                      for r in rows])
    small = [r for r in rows if r["what"] == "cat small"]
    big_row = rows[-1]
    how = ("checksum verified by the daemon" if target.big_checksummed and big_bytes == BIG_SIZE
           else "md5 compared with the source")
    res.summary += ["## cat and cp", "",
                    f"- `cat` of {len(small)} small files: cold "
                    f"{1000 * statistics.median(r['cold_s'] for r in small):.2f} ms, warm "
                    f"{1000 * statistics.median(r['warm_s'] for r in small):.2f} ms (median)",
                    f"- `head -c {big_bytes}` of the big file: {big_row['MBps']:.0f} MB/s"
                    + (f" (curl of the same bytes: {big_row['curl_MBps']:.0f} MB/s)"
                       if big_row["curl_MBps"] else "")
                    + f"; byte-identical ({how}): {'yes' if big_row['identical'] else 'NO'}", ""]
    if not big_row["identical"]:
        raise RuntimeError("the big file did not read back byte-identical")


def _md5_prefix_source(target: Target, size: int) -> str:
    if target.big_local:
        return md5_prefix(Path(target.big_local), size)
    from rucio_fs.backends.demo.content import big_file_range
    return hashlib.md5(big_file_range(0, size)).hexdigest()


def exp_nfsrods(root: Path, target: Target, res: Results, repeat: int) -> None:
    sizes = [n for n in (500, 1000, 3000, 6000, 10_000) if n in target.dirs]
    rows = []
    listings: dict[str, int] = {}
    for label, options in (("no cache", ("--cold",)), ("cached", ())):
        m = Mount(root, target.url, *options)
        res.mount_config(f"nfsrods_{label}", m)
        try:
            for n in progress(sizes, f"NFSRODS table ({label})"):
                d = m.path / target.dirs[n]
                if label == "cached":
                    timed(["ls", str(d)])
                before = m.backend_calls("list")
                times = []
                for _ in range(repeat):
                    start = time.perf_counter()
                    out = subprocess.run(f"ls {d} | wc -l", shell=True, check=True,
                                         capture_output=True, text=True).stdout
                    times.append(time.perf_counter() - start)
                    if int(out) != n:
                        raise RuntimeError(f"ls | wc -l gave {out.strip()} for {n} entries")
                calls = m.backend_calls("list") - before
                listings[label] = listings.get(label, 0) + calls
                mean, sd = spread(times)
                rows.append({"entries": n, "mode": label, "mean_s": mean, "stdev_s": sd,
                             "n": repeat, "backend_listings": calls})
        finally:
            m.unmount()
    res.off_differs("nfsrods", "the cache", listings["cached"], listings["no cache"])
    res.table("nfsrods", rows)
    res.summary += ["## NFSRODS table: `time ls <collection> | wc -l`", "",
                    "| entries | no cache (s) | cached (s) |", "|---:|---:|---:|"]
    for n in sizes:
        by = {r["mode"]: r for r in rows if r["entries"] == n}
        res.summary.append(f"| {n} | {by['no cache']['mean_s']:.3f} ± "
                           f"{by['no cache']['stdev_s']:.3f} | {by['cached']['mean_s']:.3f} ± "
                           f"{by['cached']['stdev_s']:.3f} |")
    res.summary.append("")


def exp_local(root: Path, target: Target, res: Results, files: int) -> None:
    m = Mount(root, target.url)
    res.mount_config("local", m)
    local = Path(tempfile.mkdtemp(dir=root))
    rows = []
    try:
        d = m.path / target.small_dir
        names = sorted(os.listdir(d))[:files]
        for name in names:
            shutil.copyfile(d / name, local / name)
        m.drop()
        drop_page_cache()  # the local copy cold too
        for name in progress(names, "local vs network"):
            rows.append({"file": name, "local_s": read_whole(local / name),
                         "mount_s": read_whole(d / name)})
    finally:
        m.unmount()
    res.table("local", rows)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.hist([[1000 * r["local_s"] for r in rows], [1000 * r["mount_s"] for r in rows]],
            bins=30, label=["local disk", f"rucio-fs ({target.backend})"])
    ax.set(title="per-file read time, cold", xlabel="ms", ylabel="files")
    ax.legend()
    fig.tight_layout()
    fig.savefig(res.out / "local.png", dpi=100)
    plt.close(fig)
    lo = statistics.median(r["local_s"] for r in rows)
    mo = statistics.median(r["mount_s"] for r in rows)
    res.summary += ["## Local vs network (per-file read time, cold)", "",
                    f"- {len(rows)} files: local disk median {1000 * lo:.2f} ms, mount median "
                    f"{1000 * mo:.2f} ms ({mo / lo:.1f}x); histogram in `local.png`", ""]


def exp_peers(root: Path, target: Target, res: Results, big_bytes: int) -> None:
    if not (target.storage_url and shutil.which("rclone")):
        res.summary += ["## Peers", "", "- not run: needs the rucio backend and rclone (apt)", ""]
        return
    rel = target.big_url[len(target.storage_url):]
    with rclone_http_mount(root, target.storage_url, rel) as peer:
        drop_page_cache()
        peer_mbps = big_bytes / 1e6 / timed(["head", "-c", str(big_bytes), str(peer / rel)])
    ours = next((r["MBps"] for r in res.data["experiments"].get("cat", [])
                 if r.get("what") == "read big" and r.get("MBps")), None)
    res.table("peers", [{"client": "rclone mount (http)", "MBps": peer_mbps},
                        *([{"client": "rucio-fs", "MBps": ours}] if ours else [])])
    res.summary += ["## Peers on the same storage", "",
                    f"- rclone mount (http remote): {peer_mbps:.0f} MB/s"
                    + (f"; rucio-fs {float(ours):.0f} MB/s ({float(ours) / peer_mbps:.1f}x)"
                       if ours else ""), ""]


@contextmanager
def client_dir(root: Path, target: Target, client: str, name: str,
               part_mb: int = 0) -> Iterator[Path]:
    """Directory ``name`` (created if missing) as ``client`` sees it: ``local disk`` (under
    ``root``), ``rucio-fs`` (a fresh mount of the target's writable directory; unmounted on exit,
    so the next one starts cold), or an S3 peer mounting the same prefix. ``part_mb``: the
    multipart part size of the S3 clients, where not their default."""
    if client == "local disk":
        path = root / f"local-{name}"
        path.mkdir(exist_ok=True)
        yield path
        return
    if client.startswith("rucio-fs"):
        parts = ("-o", f"part_size={part_mb}M") if part_mb else ()
        m = Mount(root, target.writable, *WRITE_BACK[client], *parts)
        try:
            (m.path / name).mkdir(exist_ok=True)
            yield m.path / name
        finally:
            m.unmount(check=True)
        return
    prefix = target.writable.split("s3://test/", 1)[1].split("?", 1)[0]
    with s3_peer_mount(client, target.server_env, f"{prefix}/{name}", root, part_mb) as path:
        yield path


#: The mount options of each rucio-fs client of the write experiments.
WRITE_BACK = {"rucio-fs": (), "rucio-fs async": ("--write-back", "async")}


def drain(client: str, mount_dir: Path) -> float:
    """Seconds until an async mount's queue is empty (0 for the others)."""
    if client != "rucio-fs async":
        return 0.0
    return timed([sys.executable, "-m", "rucio_fs", "uploads", "--wait", str(mount_dir)])


def stored_files(target: Target, client: str, name: str) -> Callable[[], int] | None:
    """How many files of ``client``'s directory ``name`` the S3 server holds now, counted
    in versitygw's posix store (an object's file is there once its upload completed);
    None where that cannot be seen (local disk, other servers)."""
    data = target.server_env.get("VGW_DATA")
    if client == "local disk" or target.backend != "s3" or not data:
        return None
    prefix = target.writable.split("s3://test/", 1)[1].split("?", 1)[0]
    base = Path(data) / "test" / prefix / name

    def count() -> int:
        return sum(len(names) for _, _, names in os.walk(base))
    return count


def until_stored(count: Callable[[], int] | None, files: int, timeout: float = 600) -> float:
    """Seconds until ``count()`` reaches ``files`` (0 when it cannot be seen)."""
    if count is None:
        return 0.0
    start = time.perf_counter()
    while count() < files:
        if time.perf_counter() - start > timeout:
            raise RuntimeError(f"the server held {count()} of {files} files after {timeout} s")
        time.sleep(0.02)
    return time.perf_counter() - start


def _small_files_run(root: Path, target: Target, client: str, source: Path,
                     files: int) -> dict:
    """One ``cp -r`` of ``source`` through ``client``, until the server holds every file,
    then ``rm -r``: the times of each step (seconds) and the daemon's peak memory."""
    name = f"small-{uuid.uuid4().hex[:6]}"
    with client_dir(root, target, client, name) as d:
        copy = timed(["cp", "-r", str(source), str(d / "tree")])
        # the server holding every file, watched from the server's side for every client
        stored = until_stored(stored_files(target, client, name), files)
        copy_drain = drain(client, d.parent)
        remove = timed(["rm", "-r", str(d / "tree")])
        remove_drain = drain(client, d.parent)
        # the daemon's most resident memory over the whole test (VmHWM)
        peak = peak_rss_mb(control.request(str(d.parent), "info")["pid"]) \
            if client.startswith("rucio-fs") else 0.0
    return {"cp_s": copy, "rm_s": remove, "cp_drain_s": copy_drain,
            "cp_stored_s": copy + stored, "rm_drain_s": remove_drain, "rss_peak_MB": peak}


#: Keys of a small-files run that are times (a client's row shows their medians).
SMALL_FILE_TIMES = ("cp_s", "rm_s", "cp_drain_s", "rm_drain_s", "cp_stored_s")


def exp_geesefs(root: Path, target: Target, res: Results, files: int, big_bytes: int,
                peers: list[str], rounds: int = 3) -> None:
    """GeeseFS's tests. The small-file test runs ``rounds`` times, the clients interleaved
    and each round starting with the next client: the server's cost per request changes
    with what the clients before it left (versitygw on ext4 pays for allocating inodes
    near many just removed), so one run each would favour whoever runs first. A client's
    row holds the medians, and its fastest and slowest ``cp -r`` until stored."""
    source = root / "geesefs-source"
    total = small_tree(source, files)
    clients = ["local disk", *WRITE_BACK, *peers]
    runs: dict[str, list[dict]] = {client: [] for client in clients}
    for n in range(rounds):
        start = n % len(clients)
        order = clients[start:] + clients[:start]
        for client in progress(order, f"GeeseFS small files, round {n + 1} of {rounds}"):
            runs[client].append(_small_files_run(root, target, client, source, files))
    rows = []
    for client in clients:
        stored = [run["cp_stored_s"] for run in runs[client]]
        rows.append({"test": "small files", "client": client, "files": files, "bytes": total,
                     **{key: statistics.median(run[key] for run in runs[client])
                        for key in SMALL_FILE_TIMES},
                     "rounds": rounds, "cp_stored_min_s": min(stored),
                     "cp_stored_max_s": max(stored),
                     "rss_peak_MB": max(run["rss_peak_MB"] for run in runs[client])})
    shutil.rmtree(source)
    big = root / "geesefs-big"
    md5 = random_file(big, big_bytes)
    # versitygw's posix backend keeps a multipart upload's part list in one xattr, which ext4
    # caps at one block: completing 10 GB in the clients' 8-10 MB parts (1,100+ of them)
    # fails with 507 InsufficientStorage. Both clients use 64 MB parts for a file that big.
    part_mb = 64 if target.backend == "s3" and big_bytes > (4 << 30) else 0
    for client in progress(["local disk", "rucio-fs", *[p for p in peers if p == "s3fs"]],
                           "GeeseFS big file"):
        name = f"big-{uuid.uuid4().hex[:6]}"
        with client_dir(root, target, client, name, part_mb) as d:
            drop_page_cache()
            # until close returns, which on the mounts means uploaded; on local disk until
            # the data is on the disk (fsync), not merely in the page cache
            sync = ["conv=fsync"] if client == "local disk" else []
            write = timed(["dd", f"if={big}", f"of={d / 'big'}", "bs=1M", "status=none",
                           *sync])
        with client_dir(root, target, client, name, part_mb) as d:
            drop_page_cache()
            read = timed(["cat", str(d / "big")])
            identical = md5_prefix(d / "big", big_bytes) == md5
            (d / "big").unlink()
        rows.append({"test": "big file", "client": client, "bytes": big_bytes,
                     "write_s": write, "read_s": read, "write_MBps": big_bytes / 1e6 / write,
                     "read_MBps": big_bytes / 1e6 / read, "identical": identical})
    big.unlink()
    local = {r["test"]: r for r in rows if r["client"] == "local disk"}
    for r in rows:
        for key in ("cp_s", "rm_s", "write_s", "read_s"):
            if key in r:
                r[f"{key[:-2]}_x_local"] = r[key] / local[r["test"]][key]
    res.table("geesefs", [{k: r.get(k, "") for k in (
        "test", "client", "files", "bytes", "rounds", "cp_s", "rm_s", "cp_drain_s",
        "rm_drain_s", "cp_stored_s", "cp_stored_min_s", "cp_stored_max_s",
        "rss_peak_MB", "cp_x_local", "rm_x_local",
        "write_s", "read_s", "write_MBps", "read_MBps", "write_x_local", "read_x_local",
        "identical")} for r in rows])
    res.summary += [f"## GeeseFS tests ({files} files of 0.5-300 KB, "
                    f"{total / files / 1000:.0f} KB on average, 1,024 directories)", "",
                    f"Small files: medians of {rounds} rounds, the clients interleaved.", "",
                    "| client | cp -r s | rm -r s | cp x local | rm x local | cp -r until on "
                    "the server s (fastest-slowest) | then drained s |",
                    "|---|---:|---:|---:|---:|---:|---|"]
    res.summary += [f"| {r['client']} | {r['cp_s']:.2f} | {r['rm_s']:.2f} | "
                    f"{r['cp_x_local']:.1f} | {r['rm_x_local']:.1f} | "
                    f"{r['cp_stored_s']:.2f} ({r['cp_stored_min_s']:.2f}-"
                    f"{r['cp_stored_max_s']:.2f}) | "
                    + (f"{r['cp_drain_s']:.2f} + {r['rm_drain_s']:.2f}, RSS peak "
                       f"{r['rss_peak_MB']:.0f} MiB" if r["client"] == "rucio-fs async" else "")
                    + " |" for r in rows if r["test"] == "small files"]
    res.summary += ["", f"| client | write {big_bytes / 1e9:.2f} GB MB/s | cold read MB/s | "
                        "byte-identical |", "|---|---:|---:|---|"]
    res.summary += [f"| {r['client']} | {r['write_MBps']:.0f} | {r['read_MBps']:.0f} | "
                    f"{'yes' if r['identical'] else 'NO'} |"
                    for r in rows if r["test"] == "big file"]
    res.summary.append("")
    if not all(r["identical"] for r in rows if r["test"] == "big file"):
        raise RuntimeError("a big file did not read back byte-identical")


def mdtest_tree(base: Path, branch: int, depth: int) -> list[Path]:
    """mdtest's ``-b branch -z depth`` tree under ``base``, parents before children."""
    nodes, level = [base], [base]
    for _ in range(depth):
        level = [parent / f"mdtest_tree.{i}" for parent in level for i in range(branch)]
        nodes += level
    return nodes


def mdtest_phases(base: Path, branch: int, depth: int, items: int, size: int,
                  drop: Callable[[], None]) -> dict[str, tuple[int, float]]:
    """mdtest's phases in its order, one process: phase -> (operations, seconds). ``drop``
    runs before each stat and read phase, so those are cold."""
    nodes = mdtest_tree(base, branch, depth)
    dirs = [node / f"dir.mdtest.{i}" for node in nodes for i in range(items)]
    files = [node / f"file.mdtest.{i}" for node in nodes for i in range(items)]
    payload = os.urandom(size)

    def write(path: Path) -> None:
        with open(path, "wb") as f:
            f.write(payload)

    def read(path: Path) -> None:
        with open(path, "rb") as f:
            if len(f.read()) != size:
                raise RuntimeError(f"{path}: short read")

    phases: list[tuple[str, list[Path], Callable[[Path], object], bool]] = [
        ("tree creation", nodes, os.mkdir, False),
        ("directory creation", dirs, os.mkdir, False),
        ("directory stat", dirs, os.stat, True),
        ("directory removal", dirs, os.rmdir, False),
        ("file creation", files, write, False),
        ("file stat", files, os.stat, True),
        ("file read", files, read, True),
        ("file removal", files, os.unlink, False),
        ("tree removal", nodes[::-1], os.rmdir, False),
    ]
    results = {}
    for name, paths, op, cold in phases:
        if cold:
            drop()
        start = time.perf_counter()
        for path in paths:
            op(path)
        results[name] = (len(paths), time.perf_counter() - start)
    return results


@contextmanager
def floor_mount(root: Path) -> Iterator[Path]:
    """``floor_fs.py`` (pyfuse3 doing nothing but keep names and bytes in memory) mounted in
    ``root``; unmounted, and its process gone, on exit."""
    path = Path(tempfile.mkdtemp(dir=root))
    process = subprocess.Popen([sys.executable, str(REPO / "benchmarks" / "floor_fs.py"),
                                str(path)])
    try:
        deadline = time.monotonic() + 20
        while not os.path.ismount(path):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("floor_fs.py did not mount")
            time.sleep(0.05)
        yield path
    finally:
        subprocess.run(["fusermount3", "-u", str(path)], capture_output=True)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _mdtest_client(root: Path, target: Target, res: Results, client: str, branch: int,
                   depth: int, items: int, size: int) -> dict[str, tuple[int, float]]:
    """One pass of mdtest's phases through ``client`` (an async mount is drained after it)."""
    if client == "local disk":
        with client_dir(root, target, client, f"mdtest-{uuid.uuid4().hex[:6]}") as d:
            return mdtest_phases(d / "tree", branch, depth, items, size, drop_page_cache)
    if client == "pyfuse3 floor":
        with floor_mount(root) as d:
            return mdtest_phases(d / "tree", branch, depth, items, size, drop_page_cache)
    m = Mount(root, target.writable, *WRITE_BACK[client])
    res.mount_config("mdtest", m)
    try:
        name = f"mdtest-{uuid.uuid4().hex[:6]}"
        (m.path / name).mkdir()
        measured = mdtest_phases(m.path / name / "tree", branch, depth, items, size, m.drop)
        drain(client, m.path)
    finally:
        m.unmount(check=True)
    return measured


def exp_mdtest(root: Path, target: Target, res: Results, branch: int, depth: int,
               items: int, size: int, rounds: int = 3) -> None:
    """mdtest's phases on local disk and the sync mount once, and ``rounds`` times on the
    pyfuse3 floor and the async mount, those two interleaved (each round starting with the
    other): the machine's speed drifts by more than the gap between them, so a ratio is
    taken within each round and the median is reported, with its range."""
    compared = ["pyfuse3 floor", "rucio-fs async"]
    once = ["local disk", *[c for c in WRITE_BACK if c not in compared]]
    passes = once + [compared[(n + k) % 2] for n in range(rounds) for k in range(2)]
    measured: dict[str, list[dict[str, tuple[int, float]]]] = {}
    for client in progress(passes, f"mdtest ({rounds} rounds of the floor and async)"):
        measured.setdefault(client, []).append(
            _mdtest_client(root, target, res, client, branch, depth, items, size))

    def rate(client: str, phase: str) -> float:
        return statistics.median(ops / s for ops, s in (run[phase] for run in measured[client]))

    rows = []
    for phase, (ops, _s) in measured["local disk"][0].items():
        ratios = sorted(mount[phase][1] / floor[phase][1] for floor, mount in zip(
            measured["pyfuse3 floor"], measured["rucio-fs async"], strict=True))
        row = {"phase": phase, "operations": ops, "rounds": rounds,
               "local_ops_per_s": rate("local disk", phase),
               "floor_ops_per_s": rate("pyfuse3 floor", phase),
               "async_x_floor": statistics.median(ratios),
               "async_x_floor_min": ratios[0], "async_x_floor_max": ratios[-1]}
        for client in WRITE_BACK:
            key = client.replace("rucio-fs", "mount").replace(" ", "_")
            row[f"{key}_ops_per_s"] = rate(client, phase)
        rows.append(row)
    res.table("mdtest", rows)
    res.summary += [f"## Metadata rates (mdtest -b {branch} -z {depth} -I {items}, "
                    f"{size}-byte files, one process; stat and read phases cold)", "",
                    f"The floor and the async mount: medians of {rounds} interleaved rounds; "
                    "async x floor is the median of each round's ratio of times (range).", "",
                    "| phase | operations | local disk ops/s | pyfuse3 floor ops/s | "
                    "rucio-fs ops/s | rucio-fs async ops/s | async x floor |",
                    "|---|---:|---:|---:|---:|---:|---:|"]
    res.summary += [f"| {r['phase']} | {r['operations']} | {r['local_ops_per_s']:.0f} | "
                    f"{r['floor_ops_per_s']:.0f} | {r['mount_ops_per_s']:.0f} | "
                    f"{r['mount_async_ops_per_s']:.0f} | {r['async_x_floor']:.2f} "
                    f"({r['async_x_floor_min']:.2f}-{r['async_x_floor_max']:.2f}) |"
                    for r in rows]
    res.summary.append("")


def _catalog_listings(target: Target, directory: str) -> int | None:
    """Content listings of ``directory`` in the Rucio server's access log (None elsewhere)."""
    if target.backend != "rucio":
        return None
    needle = f"GET /dids/bench/{directory}/dids "
    with open(target.server_env["ACCESS_LOG"], errors="replace") as f:
        return sum(needle in line for line in f)


def _list_seconds(mounts: list[Mount]) -> float:
    """Mean backend listing latency over the mounts' stats (0 when none listed)."""
    total = count = 0
    for m in mounts:
        hist = m.stats()["backend"].get("list", {"latency": {"count": 0, "total_ns": 0}})
        total += hist["latency"]["total_ns"]
        count += hist["latency"]["count"]
    return total / count / 1e9 if count else 0.0


def _tier_failures(m: Mount) -> int:
    shared = m.stats()["cache"].get("shared", {})
    return shared.get("errors", 0) + shared.get("takeovers", 0)


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


def exp_mounts(root: Path, target: Target, res: Results, counts: list[int], repeat: int,
               proxy_bytes: int) -> None:
    """RucioFS Figure 2 at its real shape: N separate mounts (daemons) each running ``ls -l``
    of one cold directory at once, the shared tier (Redis) off and on; catalog listings
    counted; daemon memory. Then N mounts reading one file through the data proxy: the bytes
    the storage served."""
    n = 10_000 if 10_000 in target.dirs else max(target.dirs)
    rel = target.dirs[n]
    rows, single, proxied = [], [], []
    with script_server("redis", root / "redis", REDIS_PORT=str(free_port())) as redis:
        url = redis["REDIS_URL"]

        def flush() -> None:
            subprocess.run(["redis-cli", "-p", redis["REDIS_PORT"], "FLUSHALL"], check=True,
                           stdout=subprocess.DEVNULL)

        server = _server_pids(target)
        for count in progress(counts, "separate mounts"):
            for tier in (False, True):
                flush()
                mounts = [Mount(root, target.url, *(["--shared-cache", url] if tier else []))
                          for _ in range(count)]
                try:
                    res.mount_config(f"mounts_shared_{tier}", mounts[0])
                    pids = [m.stats()["pid"] for m in mounts]
                    before = [m.backend_calls("list") for m in mounts]
                    logged = _catalog_listings(target, rel)
                    cpu = CpuMeter(pids, server)
                    times = concurrently([["ls", "-l", str(m.path / rel)] for m in mounts])
                    used = cpu.used()
                    listed = [m.backend_calls("list") - b for m, b in zip(mounts, before,
                                                                           strict=True)]
                    listings = sum(listed)
                    if logged is not None:
                        time.sleep(0.5)  # gunicorn logs a request once it is answered
                        logged = (_catalog_listings(target, rel) or 0) - logged
                    listers = [c for c, n in zip(used["pids"], listed, strict=True) if n]
                    others = [c for c, n in zip(used["pids"], listed, strict=True) if not n]
                    rows.append({"mounts": count, "shared": tier,
                                 "p50_s": _quantile(times, 0.5), "p95_s": _quantile(times, 0.95),
                                 "max_s": max(times), "backend_listings": listings,
                                 # Redis failures and lease takeovers: each may cost a listing
                                 "tier_failures": sum(_tier_failures(m) for m in mounts),
                                 "server_listings": "" if logged is None else logged,
                                 "list_call_s": _list_seconds(mounts),
                                 "rss_mb": statistics.mean(rss_mb(p) for p in pids),
                                 # CPU per party in this run (the site model's validation)
                                 "server_cpu_s": used["server"] / max(1, listings),
                                 "daemon_list_cpu_s": statistics.mean(listers or [0.0]),
                                 "daemon_follow_cpu_s": statistics.mean(others or [0.0]),
                                 "ls_cpu_s": used["children"] / count,
                                 "machine_cpu_s": used["machine"]})
                finally:
                    for m in mounts:
                        m.unmount()
        plain, tiered = Mount(root, target.url), Mount(root, target.url, "--shared-cache", url)

        def measured(what: str, m: Mount) -> dict:
            """One ``ls -l`` on ``m``: seconds, and the CPU of ls (its system calls
            included), of the daemon, and of the catalog server (Rucio) it cost."""
            cpu = CpuMeter([m.stats()["pid"]], server)
            elapsed = timed(["ls", "-l", str(m.path / rel)])
            used = cpu.used()
            return {"what": what, "seconds": elapsed, "ls_cpu_s": used["children"],
                    "daemon_cpu_s": used["pids"][0], "server_cpu_s": used["server"]}

        try:
            for _ in progress(range(repeat), "one mount, tier off/on"):
                for label, m in (("off", plain), ("on", tiered)):
                    m.drop()
                    flush()
                    single.append(measured(f"cold ls -l, tier {label}", m))
            single += [measured("warm ls -l", plain) for _ in range(repeat)]
            timed(["ls", "-l", str(tiered.path / rel)])  # published for the fresh mounts
            redis_costs = _redis_costs(redis, repeat)
            for _ in progress(range(repeat), "fresh mounts, listing in Redis"):
                fresh = Mount(root, target.url, "--shared-cache", url)
                try:
                    single.append(measured("fresh mount, listing in Redis", fresh))
                finally:
                    fresh.unmount()
        finally:
            plain.unmount()
            tiered.unmount()
    if target.http_reads and proxy_bytes:
        env = {"PROXY_CA": target.proxy_ca} if target.proxy_ca else {}
        for count in progress(counts, "mounts reading through the data proxy"):
            with script_server("proxy", root / "proxy", PROXY_PORT=str(free_port()),
                               **env) as proxy:
                mounts = [Mount(root, target.url, "--data-proxy", proxy["PROXY_URL"])
                          for _ in range(count)]
                try:
                    drop_page_cache()
                    times = concurrently([["head", "-c", str(proxy_bytes), str(m.path / target.big)]
                                          for m in mounts])
                finally:
                    for m in mounts:
                        m.unmount()
                origin = _origin_bytes(Path(proxy["ACCESS_LOG"]))
            proxied.append({"mounts": count, "bytes_each": proxy_bytes,
                            "bytes_read": count * proxy_bytes, "storage_bytes": origin,
                            "storage_copies": origin / proxy_bytes,
                            "without_proxy_copies": count, "seconds": max(times),
                            "MBps_all": count * proxy_bytes / 1e6 / max(times)})
    res.table("mounts_redis", [redis_costs])
    _report_mounts(res, target, n, rows, single, proxied)


def _server_pids(target: Target) -> list[int]:
    """The catalog server's processes whose CPU a listing costs (Rucio: gunicorn)."""
    if target.backend != "rucio":
        return []
    pid_file = Path(target.server_env["RUCIO_CONFIG"]).parent.parent / "gunicorn.pid"
    return children_of(int(pid_file.read_text()))


def _redis_costs(redis: dict[str, str], repeat: int) -> dict:
    """Redis's own work (``INFO commandstats``) for one follower's read of the published
    listing (LRANGEs of 4 chunks, as the mounts read), and for one poll (an empty LRANGE and
    a GET)."""
    import trio

    from rucio_fs.redis_client import Redis, RedisAddress

    def cli(*args: str) -> str:
        return subprocess.run(["redis-cli", "-p", redis["REDIS_PORT"], *args], check=True,
                              capture_output=True, text=True).stdout

    def usec(name: str) -> float:
        for line in cli("INFO", "commandstats").splitlines():
            if line.startswith(f"cmdstat_{name}:"):
                return float(line.split("usec=")[1].split(",")[0])
        return 0.0

    key = next(k for k in cli("--scan", "--pattern", "*|chunks|*").splitlines())
    chunks = int(cli("LLEN", key))
    sizes: list[float] = []

    async def reads() -> float:
        client = Redis(RedisAddress.parse(redis["REDIS_URL"]), timeout=10)
        start = time.perf_counter()
        for _ in range(repeat):
            for first in range(0, chunks, 4):
                await client.run(("LRANGE", key, first, first + 3))
        elapsed = time.perf_counter() - start
        await client.aclose()
        sizes.append(client.bytes_read / repeat)
        return elapsed / repeat

    cli("CONFIG", "RESETSTAT")
    before = usec("lrange")
    client_s = trio.run(reads)
    per_read = (usec("lrange") - before) / 1e6
    cli("CONFIG", "RESETSTAT")

    async def polls() -> None:
        client = Redis(RedisAddress.parse(redis["REDIS_URL"]), timeout=10)
        for _ in range(200):
            await client.run(("LRANGE", key, chunks, chunks + 3), ("GET", "rfs1|no|lease"))
        await client.aclose()

    trio.run(polls)
    poll_usec = usec("lrange") + usec("get")
    return {"chunks": chunks, "bytes": sizes[0], "read_s": per_read / repeat,
            "poll_s": poll_usec / 200 / 1e6, "client_read_s": client_s}


def _origin_bytes(log: Path) -> int:
    """What the storages served the data proxy: the sum of every logged upstream fetch (each
    slice is logged, containers/data-proxy/nginx.conf)."""
    return sum(int(n) for line in log.read_text().splitlines() if "origin_bytes=" in line
               for n in re.findall(r"\d+", line.rsplit("origin_bytes=", 1)[1]))


def _report_mounts(res: Results, target: Target, n: int, rows: list[dict], single: list[dict],
                   proxied: list[dict]) -> None:
    res.table("mounts", rows)
    res.table("mounts_single", single)
    if proxied:
        res.table("mounts_proxy", proxied)
    lines = {}
    for r in rows:
        for stat in ("p50_s", "p95_s"):
            key = f"{stat[:3]}, shared tier {'on' if r['shared'] else 'off'}"
            lines.setdefault(key, ([], []))
            lines[key][0].append(r["mounts"])
            lines[key][1].append(r[stat])
    plot(res.out / "mounts.png", f"{n} entries, ls -l on N separate mounts ({target.backend})",
         "mounts (separate daemons)", "seconds per ls -l", lines)
    median = {w: statistics.median(r["seconds"] for r in single if r["what"] == w)
              for w in {r["what"] for r in single}}
    res.summary += [f"## Separate mounts (Figure 2 at its real shape): `ls -l` of {n} entries",
                    "", "| mounts | shared tier | p50 s | p95 s | catalog listings "
                    "| tier failures | server log | daemon RSS MiB |",
                    "|---:|---|---:|---:|---:|---:|---:|---:|"]
    res.summary += [f"| {r['mounts']} | {'on' if r['shared'] else 'off'} | {r['p50_s']:.3f} | "
                    f"{r['p95_s']:.3f} | {r['backend_listings']} | {r['tier_failures']} | "
                    f"{r['server_listings']} | {r['rss_mb']:.0f} |" for r in rows]
    off, on = median["cold ls -l, tier off"], median["cold ls -l, tier on"]
    runs = sum(1 for r in single if r["what"] == "warm ls -l")
    res.summary += ["", f"One mount (median of {runs}): cold `ls -l` {off:.3f} s without the "
                    f"tier, {on:.3f} s with it "
                    f"({100 * (on / off - 1):+.1f} %); a fresh mount whose listing is in Redis "
                    f"{median['fresh mount, listing in Redis']:.3f} s; warm "
                    f"{median['warm ls -l']:.3f} s.", ""]
    if proxied:
        res.summary += ["Mounts reading the same file through the data proxy:", "",
                        "| mounts | read each | storage served | copies | without proxy "
                        "| MB/s all |", "|---:|---:|---:|---:|---:|---:|"]
        res.summary += [f"| {r['mounts']} | {r['bytes_each'] / 2**20:.0f} MiB | "
                        f"{r['storage_bytes'] / 2**20:.0f} MiB | {r['storage_copies']:.2f} | "
                        f"{r['without_proxy_copies']} | {r['MBps_all']:.0f} |" for r in proxied]
        res.summary.append("")


def parse_size(text: str) -> int:
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    number, unit = text.rstrip("iBb").rstrip() or "0", ""
    if number[-1:].upper() in units:
        number, unit = number[:-1], number[-1].upper()
    try:
        return int(float(number) * units[unit])
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 10G, 512M)") from None


def mdtest_shape(text: str) -> tuple[int, int, int]:
    try:
        branch, depth, items = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not B,Z,I: {text!r} (e.g. 6,4,8)") from None
    if min(branch, items) < 1 or depth < 0:
        raise argparse.ArgumentTypeError(f"B and I must be at least 1, Z at least 0: {text!r}")
    return branch, depth, items


@contextmanager
def started_target(backend: str, server: Path | None, root: Path, sizes: list[int],
                   big_bytes: int) -> Iterator[Target]:
    """The chosen backend's catalog, with its server started here (and stopped by PID on exit)
    unless ``server`` names a running one."""
    if backend == "demo":
        yield demo_target()
        return
    if backend == "irods":
        process, port = irods_fake.start()
        try:
            yield irods_target(root, port, sizes, big_bytes)
        finally:
            process.terminate()
            process.wait(timeout=30)
        return
    script = SERVERS / f"{backend}.sh"
    base = server or root / "server"
    if server is None:
        subprocess.run(["bash", str(script), "start", str(base)], check=True,
                       env={**os.environ, "PYTHON": sys.executable})
    try:
        yield rucio_target(base) if backend == "rucio" else s3_target(base, sizes, big_bytes)
    finally:
        if server is None:
            subprocess.run(["bash", str(script), "stop", str(base)], check=False)


#: The options of the experiments, with no meaning in ``--goals`` mode: (dest, option).
EXPERIMENT_OPTIONS = (("backend", "--backend"), ("experiments", "--experiments"),
                      ("repeat", "--repeat"), ("server", "--server"),
                      ("big_write", "--big-write"), ("peers", "--peers"),
                      ("mdtest", "--mdtest"), ("max_mounts", "--max-mounts"))


def goals_mode(ap: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``--goals [NAMES]``: the goal benchmarks run as one (:mod:`goals`); bad arguments end
    in one error line (``ap.error``, exit 2)."""
    stray = [option for dest, option in EXPERIMENT_OPTIONS
             if getattr(args, dest) != ap.get_default(dest)]
    if stray:
        ap.error(f"{', '.join(stray)}: an experiment option, not for --goals (the goal "
                 "benchmarks take --rucio-server, --s3-server, --smoke, --out, --publish)")
    for kind in ("rucio", "s3"):
        server = getattr(args, f"{kind}_server")
        if server is not None and not (server / "server.env").is_file():
            ap.error(f"--{kind}-server {server}: no server.env there (start one with "
                     f"scripts/servers/{kind}.sh start DIR)")
    try:
        benches = goals.chosen(args.goals)
    except ValueError as e:
        ap.error(str(e))
    out = args.out or REPO / "benchmarks" / "results" / (
        time.strftime("%Y%m%d-%H%M%S") + "-goals")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        ap.error(f"--out {out}: {e.strerror}")
    command = goals.shown(["python", "benchmarks/suite.py", *sys.argv[1:]], out)
    return goals.run(benches, out, {"rucio": args.rucio_server, "s3": args.s3_server},
                     args.smoke, command, goals.RESULTS_MD if args.publish else None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=("demo", "rucio", "s3", "irods"), default="demo")
    ap.add_argument("--experiments", default=",".join(EXPERIMENTS))
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--smoke", action="store_true", help="seconds per experiment (CI)")
    ap.add_argument("--server", type=Path,
                    help="a running rucio.sh or s3.sh server directory (rucio, s3 backends)")
    ap.add_argument("--big-write", type=parse_size, default=10 << 30,
                    help="size of the GeeseFS big-file write and read (default 10G)")
    ap.add_argument("--peers", default="geesefs,rclone,s3fs",
                    help="S3 peers for the GeeseFS tests, those installed (s3 backend)")
    ap.add_argument("--mdtest", type=mdtest_shape, default=(6, 4, 8),
                    help="mdtest's -b,-z,-I: branching, depth, items per directory (6,4,8)")
    ap.add_argument("--max-mounts", type=int, default=16,
                    help="most separate mounts in the mounts experiment (default 16)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--goals", nargs="?", const="", metavar="NAMES",
                    help="run the goal benchmarks instead (comma-separated names; "
                         f"default all: {','.join(goals.BY_NAME)}) and write their goal rows")
    ap.add_argument("--publish", action="store_true",
                    help="with --goals (implied): also write the summary to "
                         "benchmarks/RESULTS.md")
    ap.add_argument("--rucio-server", type=Path,
                    help="with --goals: a running rucio.sh server directory (else one starts)")
    ap.add_argument("--s3-server", type=Path,
                    help="with --goals: a running s3.sh server directory (else one starts)")
    args = ap.parse_args()
    if args.goals is not None or args.publish:
        return goals_mode(ap, args)
    if args.rucio_server is not None or args.s3_server is not None:
        ap.error("--rucio-server and --s3-server are for --goals (the experiments take "
                 "--server)")
    chosen = [e for e in args.experiments.split(",") if e]
    unknown = set(chosen) - set(EXPERIMENTS)
    if unknown:
        ap.error(f"unknown experiment(s): {', '.join(sorted(unknown))}")
    if args.server is not None:
        if args.backend not in ("rucio", "s3"):
            ap.error("--server names a rucio.sh or s3.sh server: only for --backend rucio or s3")
        if not (args.server / "server.env").is_file():
            ap.error(f"--server {args.server}: no server.env there (start one with "
                     f"scripts/servers/{args.backend}.sh start DIR)")
    root = Path(tempfile.mkdtemp(prefix="rucio-fs-suite-"))
    smoke = args.smoke
    sizes = [500, 1000] if smoke else [500, 1000, 3000, 5000, 6000, 10_000, 50_000]
    big = 64 << 20 if smoke else BIG_SIZE
    if not set(chosen) - set(WRITE_ONLY):  # the write experiments bring their own data
        sizes, big = [], 0
    with started_target(args.backend, args.server, root, sizes, big) as target:
        os.environ.update(target.env)
        out = args.out or REPO / "benchmarks" / "results" / (
            time.strftime("%Y%m%d-%H%M%S") + f"-{target.backend}")
        out.mkdir(parents=True, exist_ok=True)
        res = Results(out, target, smoke)
        repeat = 2 if smoke else args.repeat
        ls_sizes = [n for n in sorted(target.dirs) if not smoke or n <= 1000]
        big = min(big, target.big_size)
        peers = [p for p in args.peers.split(",")
                 if p and (geesefs_binary() if p == "geesefs" else shutil.which(p))] \
            if target.backend == "s3" else []
        runs: dict[str, Callable[[], None]] = {
            "ls": lambda: exp_ls(root, target, res, ls_sizes, repeat),
            "users": lambda: exp_users(root, target, res, [1, 5] if smoke
                                       else [1, 2, 5, 10, 20, 50, 100]),
            "cat": lambda: exp_cat(root, target, res, 5 if smoke else 50, big),
            "nfsrods": lambda: exp_nfsrods(root, target, res, repeat if smoke else 5),
            "local": lambda: exp_local(root, target, res, 20 if smoke else 200),
            "peers": lambda: exp_peers(root, target, res, big),
            "geesefs": lambda: exp_geesefs(root, target, res, 100 if smoke else 6400,
                                           16 << 20 if smoke else args.big_write, peers,
                                           1 if smoke else 3),
            "mdtest": lambda: exp_mdtest(root, target, res, *((2, 2, 2) if smoke
                                                              else args.mdtest), SMALL,
                                         1 if smoke else 3),
            "mounts": lambda: exp_mounts(root, target, res, [1, 2] if smoke else
                                         [c for c in (1, 2, 4, 8, 16) if c <= args.max_mounts],
                                         repeat, min(big, 16 << 20 if smoke else 1 << 30)),
        }
        try:
            for name in EXPERIMENTS:
                if name in chosen and name not in target.not_run():
                    runs[name]()
        finally:
            res.write()
    shutil.rmtree(root, ignore_errors=True)
    print(f"results: {out}")
    print((out / "summary.md").read_text())
    for line in res.data["inconsistent"]:
        print(f"suite.py: {line}", file=sys.stderr)
    return 1 if res.data["inconsistent"] else 0


if __name__ == "__main__":
    sys.exit(main())
