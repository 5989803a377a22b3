"""Core listing benchmarks on the demo catalog (latency 0 unless said), with same-run baselines.

1. warm ``ls -l`` of 50,000 files: mount vs the same names and sizes materialised on tmpfs;
2. warm ``ls -l`` and plain ``ls`` of 10,000 files (absolute, against the prototype's numbers);
3. cold ``ls -l`` of 10,000 files with 20 ms injected per request, every cache layer (the
   kernel's too) dropped before each run: time, backend round trips, time beyond them; and the
   same on a ``--cold`` mount (every layer off: the kernel asks ~13 FUSE requests per entry);
4. the always-on stats: warm ``ls -l`` of 10,000 with and without latency histograms;
5. a burst of 16 ``cat``s at once in one cold directory, 20 ms per request: the kernel told
   that lookups in one directory may run together, against its serial default (libfuse
   before 3.17; ``RUCIO_FS_PARALLEL_DIROPS=0``). ``--only burst`` runs this one alone.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import SERIAL_DIROPS, Goal, Mount, add_goals, at_most, concurrently, timed


def repeated(cmd: list[str], repeat: int) -> list[float]:
    return [timed(cmd) for _ in range(repeat)]


def summary(times: list[float]) -> dict[str, float]:
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times),
            "n": len(times)}


def materialise(root: Path, count: int) -> Path:
    """The demo directory's names and sizes as real (sparse) files on tmpfs."""
    target = root / f"files-{count}"
    target.mkdir()
    for n in range(1, count + 1):
        with open(target / f"file-{n:06d}.dat", "wb") as f:
            f.truncate(4096)
        os.utime(target / f"file-{n:06d}.dat", (1_554_076_800, 1_554_076_800))
    return target


def burst(work: Path, mounts: list[Mount], repeat: int, width: int = 16) -> dict:
    """``width`` cold ``cat``s at once in ``ls/files-1000``, with 20 ms per request."""
    told = Mount(work, "demo://?latency=20ms")
    serial = Mount(work, "demo://?latency=20ms", env={**os.environ, **SERIAL_DIROPS})
    mounts += [told, serial]
    samples: dict[str, list[float]] = {"told": [], "serial": []}
    for _ in range(repeat):  # interleaved, so drift hits both alike
        for key, mount in (("told", told), ("serial", serial)):
            mount.drop(settle=0.2)
            directory = mount.path / "ls" / "files-1000"
            os.stat(directory)
            samples[key].append(max(concurrently(
                [["cat", str(directory / f"file-{n:06d}.dat")] for n in range(1, width + 1)])))
    r = {k: summary(v) for k, v in samples.items()}
    r["ratio"] = r["told"]["median_s"] / r["serial"]["median_s"]
    r["lookup_peak"] = {"told": told.stats()["fuse"]["lookup"]["peak"],
                        "serial": serial.stats()["fuse"]["lookup"]["peak"]}
    return r


def print_burst(r: dict, repeat: int) -> None:
    print(f"| 16 `cat`s at once, one cold directory, 20 ms/request (median of {repeat}) | "
          f"{r['told']['median_s']:.3f} s | kernel's serial lookups {r['serial']['median_s']:.3f}"
          f" s | {r['ratio']:.2f}x | lookups at once {r['lookup_peak']} |")


def goals(results: dict) -> list[Goal]:
    """The core issue's goals, from the measurements in ``results`` (none when only the
    burst ran: it has no goal)."""
    if "warm_ls_l_50k" not in results:
        return []
    rows = []
    for key, what, limit in (("warm_ls_l_50k", "warm `ls -l` 50,000 files", None),
                             ("warm_ls_l_10k", "warm `ls -l` 10,000 files", 0.06),
                             ("warm_ls_10k", "warm `ls` 10,000 files", 0.016)):
        r = results[key]
        mount, tmpfs = r["mount"]["median_s"], r["tmpfs"]["median_s"]
        rows.append(Goal("bench_core", what, f"{mount:.4f} s", f"tmpfs {tmpfs:.4f} s",
                         r["ratio"], "≤ 1.5x tmpfs" if limit is None else f"≤ {limit:g} s",
                         at_most(r["ratio"], 1.5) if limit is None else at_most(mount, limit)))
    c = results["cold_ls_l_10k_20ms"]
    trips = c["round_trips_per_ls"]
    listings = trips.get("list", 0) + trips.get("list_page", 0)
    rows.append(Goal(
        "bench_core", "cold `ls -l` 10,000 files, 20 ms per request, every layer dropped",
        f"{c['median_s']:.3f} s: {sum(trips.values()):g} round trips ({listings:g} listing), "
        f"{c['beyond_round_trips_s']:.3f} s beyond them", "", None,
        "≤ 1 listing round trip, ≤ 0.15 s beyond the round trips",
        listings <= 1 and c["beyond_round_trips_s"] <= 0.15))
    s = results["stats_overhead_warm_ls_l_10k"]
    rows.append(Goal("bench_core", "always-on stats, warm `ls -l` 10,000 files",
                     f"stats on {s['stats_on']['median_s']:.4f} s",
                     f"stats off {s['stats_off']['median_s']:.4f} s", 1 + s["overhead"],
                     "≤ 3 % slower", at_most(s["overhead"], 0.03)))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--only", choices=["burst"], help="run this experiment alone")
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).parent / "results" / "core.json")
    args = parser.parse_args()
    results: dict = {"machine": {"host": platform.node(), "kernel": platform.release(),
                                 "cpus": os.cpu_count(), "python": platform.python_version()},
                     "repeat": args.repeat, "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    work = Path(tempfile.mkdtemp(prefix="rucio-fs-bench-", dir="/tmp"))
    shm = Path(tempfile.mkdtemp(prefix="rucio-fs-bench-", dir="/dev/shm"))
    mounts: list[Mount] = []
    try:
        if args.only == "burst":
            results["burst_16_cats_20ms"] = burst(work, mounts, args.repeat)
            print_burst(results["burst_16_cats_20ms"], args.repeat)
            return 0
        tmpfs50k, tmpfs10k = materialise(shm, 50_000), materialise(shm, 10_000)
        warm = Mount(work, "demo://")
        mounts.append(warm)
        fuse50k, fuse10k = warm.path / "ls" / "files-50000", warm.path / "ls" / "files-10000"
        for path in (fuse50k, fuse10k, tmpfs50k, tmpfs10k):
            repeated(["ls", "-l", str(path)], 1)  # warm up: caches filled
        r = results["warm_ls_l_50k"] = {
            "mount": summary(repeated(["ls", "-l", str(fuse50k)], args.repeat)),
            "tmpfs": summary(repeated(["ls", "-l", str(tmpfs50k)], args.repeat))}
        r["ratio"] = r["mount"]["median_s"] / r["tmpfs"]["median_s"]
        for cmd in (["ls", "-l"], ["ls"]):
            key = "warm_" + "_".join(c.strip("-") for c in cmd) + "_10k"
            r = results[key] = {"mount": summary(repeated([*cmd, str(fuse10k)], args.repeat)),
                                "tmpfs": summary(repeated([*cmd, str(tmpfs10k)], args.repeat))}
            r["ratio"] = r["mount"]["median_s"] / r["tmpfs"]["median_s"]

        slow = Mount(work, "demo://?latency=20ms")
        mounts.append(slow)
        target = str(slow.path / "ls" / "files-10000")
        times, trips = [], {}
        for _ in range(args.repeat):
            slow.drop(settle=0)
            before = slow.stats()["backend_counters"]
            times += repeated(["ls", "-l", target], 1)
            after = slow.stats()["backend_counters"]
            for k in after:
                trips[k] = trips.get(k, 0) + (after[k] - before.get(k, 0)) / args.repeat
        trips = {k: round(v, 2) for k, v in trips.items()}
        r = results["cold_ls_l_10k_20ms"] = {**summary(times), "round_trips_per_ls": trips}
        r["beyond_round_trips_s"] = r["median_s"] - sum(trips.values()) * 0.020

        off = Mount(work, "demo://?latency=20ms", "--cold")
        mounts.append(off)
        runs = max(2, args.repeat // 5)
        before = off.stats()
        times = repeated(["ls", "-l", str(off.path / "ls" / "files-10000")], runs)
        after = off.stats()
        results["all_layers_off_ls_l_10k_20ms"] = {
            **summary(times),
            "backend_calls_per_ls": {k: (v - before["backend_counters"].get(k, 0)) / runs
                                     for k, v in after["backend_counters"].items()},
            "fuse_requests_per_ls": sum(
                d["latency"]["count"] - before["fuse"].get(op, {"latency": {"count": 0}})[
                    "latency"]["count"] for op, d in after["fuse"].items()) / runs}

        nostats = Mount(work, "demo://", env={**os.environ, "RUCIO_FS_STATS": "0"})
        mounts.append(nostats)
        pair = {"stats_on": warm.path / "ls" / "files-10000",
                "stats_off": nostats.path / "ls" / "files-10000"}
        repeated(["ls", "-l", str(pair["stats_off"])], 1)
        samples: dict[str, list[float]] = {k: [] for k in pair}
        for _ in range(args.repeat):  # interleaved, so drift hits both alike
            for key, path in pair.items():
                samples[key] += repeated(["ls", "-l", str(path)], 1)
        r = results["stats_overhead_warm_ls_l_10k"] = {k: summary(v) for k, v in samples.items()}
        r["overhead"] = r["stats_on"]["median_s"] / r["stats_off"]["median_s"] - 1
        results["burst_16_cats_20ms"] = burst(work, mounts, args.repeat)
        results["config"] = warm.stats()["config"]
    finally:
        for m in mounts:
            m.unmount(check=True)
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(add_goals(results, goals(results)), indent=2))
    w50, wl, wp = (results[k] for k in ("warm_ls_l_50k", "warm_ls_l_10k", "warm_ls_10k"))
    c, s = results["cold_ls_l_10k_20ms"], results["stats_overhead_warm_ls_l_10k"]
    print(f"| benchmark (median of {args.repeat}) | rucio-fs | baseline (same run) | ratio "
          "| goal |")
    print("|---|---:|---:|---:|---|")
    print(f"| warm `ls -l` 50,000 | {w50['mount']['median_s']:.3f} s | tmpfs "
          f"{w50['tmpfs']['median_s']:.3f} s | {w50['ratio']:.2f}x | ≤ 1.5x |")
    print(f"| warm `ls -l` 10,000 | {wl['mount']['median_s']:.3f} s | tmpfs "
          f"{wl['tmpfs']['median_s']:.3f} s | {wl['ratio']:.2f}x | ≤ 0.06 s |")
    print(f"| warm `ls` 10,000 | {wp['mount']['median_s']:.4f} s | tmpfs "
          f"{wp['tmpfs']['median_s']:.4f} s | {wp['ratio']:.2f}x | ≤ 0.016 s |")
    trips = sum(c["round_trips_per_ls"].values())
    print(f"| cold `ls -l` 10,000, 20 ms/request | {c['median_s']:.3f} s | {trips:g} round trips"
          f" ({c['round_trips_per_ls']}) | {c['beyond_round_trips_s']:.3f} s beyond them"
          f" | ≤ 0.15 s beyond 1 listing |")
    o = results["all_layers_off_ls_l_10k_20ms"]
    print(f"| `--cold` mount (every layer off) `ls -l` 10,000, 20 ms/request | "
          f"{o['median_s']:.3f} s | backend {o['backend_calls_per_ls']}, "
          f"{o['fuse_requests_per_ls']:.0f} FUSE requests | | information |")
    print(f"| stats on vs off, warm `ls -l` 10,000 | {s['stats_on']['median_s']:.4f} s | "
          f"{s['stats_off']['median_s']:.4f} s | {100 * s['overhead']:+.1f} % | ≤ 3 % |")
    print_burst(results["burst_16_cats_20ms"], args.repeat)
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
