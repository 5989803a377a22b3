"""Writing into Rucio through a mount next to ``rucio upload`` (the real CLI), in one run.

1. ``--files`` files of ``--size`` bytes into a new dataset: one ``rucio upload --rse DAV
   --scope bench DIR bench:DATASET`` against ``mkdir`` + ``cp -r`` through a mount with sync
   write-back (each ``close`` returns once its file is registered and attached), and with
   async write-back (timed until ``rucio-fs uploads --wait`` returns: everything stored);
2. one ``--big-gb`` GB file (sparse: the storage and the checksums see every byte): ``rucio
   upload`` against ``cp`` through a sync mount, as throughput, with the daemon's peak RSS.

Goals (issue: Rucio read-write): small files sync <= 0.2x the CLI's time, async <= 0.05x; the
big file >= 1.0x the CLI's throughput with the daemon under 300 MB.

Every run writes new names (DIDs are permanent). Uses ``--server DIR`` (a running
``scripts/servers/rucio.sh``) or starts one. Writes JSON (``--out``) and Markdown beside it.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from common import (
    Goal,
    Mount,
    add_goals,
    at_least,
    at_most,
    peak_rss_mb,
    rucio_arguments,
    rucio_server,
)


def cli_upload(env: dict[str, str], source: Path, dataset: str) -> float:
    """Seconds of one ``rucio upload`` of ``source`` (a file or a directory) into
    ``bench:dataset``."""
    start = time.perf_counter()
    subprocess.run([env["RUCIO_CLI"], "upload", "--rse", "DAV", "--scope", "bench",
                    str(source), f"bench:{dataset}"], check=True, capture_output=True,
                   env={**os.environ, "X509_USER_PROXY": env["CLI_X509_PROXY"]}, timeout=7200)
    return time.perf_counter() - start


def mount_copy(root: Path, source: Path, dataset: str, *options: str,
               wait: bool = False) -> tuple[float, float]:
    """Seconds of ``mkdir`` + ``cp -r`` of ``source``'s files into a new dataset through a
    fresh mount (and, with ``wait``, until everything is stored), and the daemon's peak RSS
    (MiB)."""
    mount = Mount(root, "rucio:///bench?upload_rse=DAV", "--staging-dir",
                  str(root / f"staging-{dataset}"), *options)
    try:
        pid = mount.stats()["pid"]
        start = time.perf_counter()
        target = mount.path / dataset
        os.mkdir(target)
        names = [str(p) for p in sorted(source.iterdir())]
        subprocess.run(["cp", *names, str(target)], check=True, timeout=7200)
        if wait:
            subprocess.run([sys.executable, "-m", "rucio_fs", "uploads", "--wait",
                            str(mount.path)], check=True, capture_output=True, timeout=7200)
        seconds = time.perf_counter() - start
        return seconds, peak_rss_mb(pid)
    finally:
        mount.unmount()


def main() -> int:
    ap = rucio_arguments(__doc__, "rucio_write", 1)
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--big-gb", type=float, default=4.0)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="rucio-fs-write-"))
    run = uuid.uuid4().hex[:6]
    rng = random.Random(run)
    result: dict = {"files": args.files, "size": args.size, "big_bytes": 0}
    with rucio_server(args.server, root) as (_, env):
        for way in ("cli", "sync", "async"):
            source = root / f"small-{way}"
            source.mkdir()
            for i in range(args.files):  # names of their own: DIDs are permanent
                (source / f"w{run}-{way}-{i:05d}.dat").write_bytes(rng.randbytes(args.size))
            dataset = f"write-{run}-{way}"
            if way == "cli":
                result["small_cli_s"] = cli_upload(env, source, dataset)
            else:
                seconds, _ = mount_copy(root, source, dataset,
                                        *(("--write-back", "async") if way == "async" else ()),
                                        wait=way == "async")
                result[f"small_{way}_s"] = seconds
            print(json.dumps(result), flush=True)
        size = int(args.big_gb * 1e9)
        result["big_bytes"] = size
        for way in ("cli", "sync"):
            source = root / f"big-{way}"
            source.mkdir()
            with open(source / f"w{run}-big-{way}.dat", "wb") as f:
                f.truncate(size)
                f.seek(size // 2)
                f.write(run.encode())
            dataset = f"write-{run}-big-{way}"
            if way == "cli":
                result["big_cli_s"] = cli_upload(env, source / f"w{run}-big-{way}.dat",
                                                 dataset)
            else:
                result["big_sync_s"], result["big_sync_rss_mb"] = mount_copy(
                    root, source, dataset)
            (source / f"w{run}-big-{way}.dat").unlink()
            print(json.dumps(result), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(add_goals(result, goals(result)), indent=1))
    text = summary(result)
    args.out.with_suffix(".md").write_text(text)
    print(text)
    return 0


def goals(r: dict) -> list[Goal]:
    """The read-write issue's goals, from the measurements in ``r``: small files through a
    mount in a fraction of the CLI's time, the big file at the CLI's throughput or better
    with the daemon's memory bounded."""
    cli, mb = r["small_cli_s"], r["big_bytes"] / 1e6
    small = f"{r['files']:,} files of {r['size']:,} B into a new dataset"
    ways = {"sync": "sync write-back",
            "async": "async write-back, until `rucio-fs uploads --wait` returns"}
    rows = [Goal("bench_rucio_write", f"{small}, {ways[way]}", f"{r[f'small_{way}_s']:.1f} s",
                 f"`rucio upload` {cli:.1f} s", r[f"small_{way}_s"] / cli, f"≤ {limit:g}x",
                 at_most(r[f"small_{way}_s"] / cli, limit))
            for way, limit in (("sync", 0.2), ("async", 0.05))]
    speedup = r["big_cli_s"] / r["big_sync_s"]
    rows += [Goal("bench_rucio_write", f"one {mb / 1e3:.1f} GB file (sparse), throughput",
                  f"{mb / r['big_sync_s']:.0f} MB/s", f"`rucio upload` {mb / r['big_cli_s']:.0f}"
                  " MB/s", speedup, "≥ 1.0x", at_least(speedup, 1.0)),
             Goal("bench_rucio_write", "daemon peak RSS while writing the big file",
                  f"{r['big_sync_rss_mb']:.0f} MB", "", None, "≤ 300 MB",
                  at_most(r["big_sync_rss_mb"], 300))]
    return rows


def summary(r: dict) -> str:
    mb = r["big_bytes"] / 1e6
    return "\n".join([
        f"Writing into Rucio: {r['files']} files of {r['size']} B, and one "
        f"{r['big_bytes'] / 1e9:.1f} GB file (sparse)", "",
        "| what | rucio upload | rucio-fs | ratio | goal |", "|---|---:|---:|---:|---|",
        f"| {r['files']} small files, sync | {r['small_cli_s']:.1f} s | "
        f"{r['small_sync_s']:.1f} s | {r['small_sync_s'] / r['small_cli_s']:.3f}x | <= 0.2x |",
        f"| {r['files']} small files, async (until stored) | {r['small_cli_s']:.1f} s | "
        f"{r['small_async_s']:.1f} s | {r['small_async_s'] / r['small_cli_s']:.3f}x | "
        "<= 0.05x |",
        f"| big file throughput | {mb / r['big_cli_s']:.0f} MB/s | "
        f"{mb / r['big_sync_s']:.0f} MB/s | {r['big_cli_s'] / r['big_sync_s']:.2f}x | "
        ">= 1.0x |",
        f"| daemon peak RSS (big file) | — | {r['big_sync_rss_mb']:.0f} MB | — | <= 300 MB |",
        ""])


if __name__ == "__main__":
    sys.exit(main())
