"""The published experiments, reproduced on any landed backend: one command, one results directory.

    python benchmarks/suite.py --backend demo|rucio [--experiments ls,users,cat,nfsrods,local,peers]
                               [--repeat 10] [--smoke] [--server DIR] [--out DIR]

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
(rclone mount of the Rucio storage, when installed). The GeeseFS and mdtest experiments need a
writable backend; they are listed as not run until one has landed. ``--smoke`` runs every
experiment in seconds (CI runs it so the suite cannot rot).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import click
from common import (
    RUCIO_FS,
    Mount,
    drop_page_cache,
    rclone_http_mount,
    read_whole,
    timed,
    tmpfs_twin,
)

REPO = Path(__file__).resolve().parent.parent
SERVER = REPO / "scripts" / "servers" / "rucio.sh"
EXPERIMENTS = ("ls", "users", "cat", "nfsrods", "local", "peers")
NOT_RUN = {"geesefs": "GeeseFS small-file and 10 GB write tests need a writable backend "
                      "(S3 or iRODS issue)",
           "mdtest": "mdtest-like metadata rates need a writable backend (S3 or iRODS issue)"}
BIG_SIZE = 4_509_715_660


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


def demo_target() -> Target:
    from rucio_fs.backends.demo import LS_SIZES
    return Target("demo", "demo://", {n: f"ls/files-{n}" for n in LS_SIZES}, "ls/files-500",
                  f"big/frame-{BIG_SIZE}.gwf")


def rucio_target(server: Path) -> Target:
    env = dict(line.split("=", 1) for line in (server / "server.env").read_text().splitlines())
    catalog = json.loads((server / "catalog.json").read_text())
    sizes = sorted(int(k[2:]) for k in catalog if k.startswith("ds") and k[2:].isdigit())
    big = next((Path(env["DAV_ROOT"]) / "rucio" / "bench").rglob(f"frame-{BIG_SIZE}.gwf"))
    storage = f"http://127.0.0.1:{env['DAV_HTTP']}/"
    return Target("rucio", "rucio:///bench?schemes=http", {n: f"ds{n}" for n in sizes},
                  "ds1000", f"big/frame-{BIG_SIZE}.gwf", {"RUCIO_CONFIG": env["RUCIO_CONFIG"]},
                  storage, storage + str(big.relative_to(Path(env["DAV_ROOT"]))), str(big))


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
            "mounts": {}, "experiments": {}, "not_run": NOT_RUN,
        }
        self.summary: list[str] = []

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
        tail = ["", "Not run: " + "; ".join(NOT_RUN.values()) + "."]
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
        m = Mount(root, target.url, *([] if coalescing else ["--no-coalescing"]))
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
        if big_bytes == BIG_SIZE:  # identity: the daemon verified the catalog's checksum
            identical = m.stats()["events"].get("checksum_verified", 0) == verified + 1
        else:  # identity: the bytes read again, against the source
            identical = _md5_prefix(big, big_bytes) == _md5_prefix_source(target, big_bytes)
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
    how = ("checksum verified by the daemon" if big_bytes == BIG_SIZE
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


def _md5_prefix(path: Path, size: int) -> str:
    md5 = hashlib.md5()
    with open(path, "rb") as f:
        md5.update(f.read(size))
    return md5.hexdigest()


def _md5_prefix_source(target: Target, size: int) -> str:
    if target.big_local:
        return _md5_prefix(Path(target.big_local), size)
    from rucio_fs.backends.demo_content import big_file_range
    return hashlib.md5(big_file_range(0, size)).hexdigest()


def exp_nfsrods(root: Path, target: Target, res: Results, repeat: int) -> None:
    sizes = [n for n in (500, 1000, 3000, 6000, 10_000) if n in target.dirs]
    rows = []
    for label, options in (("no cache", ("--cold",)), ("cached", ())):
        m = Mount(root, target.url, *options)
        res.mount_config(f"nfsrods_{label}", m)
        try:
            for n in progress(sizes, f"NFSRODS table ({label})"):
                d = m.path / target.dirs[n]
                if label == "cached":
                    timed(["ls", str(d)])
                times = []
                for _ in range(repeat):
                    start = time.perf_counter()
                    out = subprocess.run(f"ls {d} | wc -l", shell=True, check=True,
                                         capture_output=True, text=True).stdout
                    times.append(time.perf_counter() - start)
                    if int(out) != n:
                        raise RuntimeError(f"ls | wc -l gave {out.strip()} for {n} entries")
                mean, sd = spread(times)
                rows.append({"entries": n, "mode": label, "mean_s": mean, "stdev_s": sd,
                             "n": repeat})
        finally:
            m.unmount()
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=("demo", "rucio"), default="demo")
    ap.add_argument("--experiments", default=",".join(EXPERIMENTS))
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--smoke", action="store_true", help="seconds per experiment (CI)")
    ap.add_argument("--server", type=Path, help="a running rucio.sh server (rucio backend)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    chosen = [e for e in args.experiments.split(",") if e]
    unknown = set(chosen) - set(EXPERIMENTS)
    if unknown:
        ap.error(f"unknown experiment(s): {', '.join(sorted(unknown))}")
    root = Path(tempfile.mkdtemp(prefix="rucio-fs-suite-"))
    server = None
    if args.backend == "rucio":
        server = args.server or root / "server"
        if args.server is None:
            subprocess.run(["bash", str(SERVER), "start", str(server)], check=True)
        target = rucio_target(server)
    else:
        target = demo_target()
    os.environ.update(target.env)
    out = args.out or REPO / "benchmarks" / "results" / (
        time.strftime("%Y%m%d-%H%M%S") + f"-{target.backend}")
    out.mkdir(parents=True, exist_ok=True)
    res = Results(out, target, args.smoke)
    repeat = 2 if args.smoke else args.repeat
    sizes = [n for n in sorted(target.dirs) if not args.smoke or n <= 1000]
    runs: dict[str, Callable[[], None]] = {
        "ls": lambda: exp_ls(root, target, res, sizes, repeat),
        "users": lambda: exp_users(root, target, res, [1, 5] if args.smoke
                                   else [1, 2, 5, 10, 20, 50, 100]),
        "cat": lambda: exp_cat(root, target, res, 5 if args.smoke else 50,
                               64 << 20 if args.smoke else BIG_SIZE),
        "nfsrods": lambda: exp_nfsrods(root, target, res, repeat if args.smoke else 5),
        "local": lambda: exp_local(root, target, res, 20 if args.smoke else 200),
        "peers": lambda: exp_peers(root, target, res, 64 << 20 if args.smoke else BIG_SIZE),
    }
    try:
        for name in EXPERIMENTS:
            if name in chosen:
                runs[name]()
    finally:
        res.write()
        if server is not None and args.server is None:
            subprocess.run(["bash", str(SERVER), "stop", str(server)], check=False)
    print(f"results: {out}")
    print((out / "summary.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
