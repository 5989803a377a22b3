"""Time to first byte on Rucio: a cold ``cat`` of a small file, once and 1,000 times in a loop.

Every variant runs on a fresh mount (nothing listed, nothing resolved) against the real
server of the tests, in the same run as its baseline — the mount with first-read
guesses and sibling batches switched off (``speculate=off&replica_batch=0``), which is how
rucio-fs read before them:

1. ``cat`` of one 4 KiB file in a never-listed dataset, alternating baseline / guessed
   (``rses=DAV``) / auto (no option: the mount lists and describes the RSEs as it starts,
   and its first cat guesses on each candidate at once), median of ``--repeat``; with the
   machine's page cache dropped before
   each (which evicts the co-located servers' pages too) and without;
2. ``cat`` of ``--files`` files of that dataset in a shell loop, never listed: baseline vs
   guessed vs auto;
3. the same loop after an ``ls`` of the dataset, guesses off: baseline vs sibling batches.

Also reports the replica requests each variant made (the mount's counters). Uses the server
in ``--server DIR`` or starts one. Prints Markdown, writes JSON.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import (
    Goal,
    Mount,
    add_goals,
    at_most,
    drop_page_cache,
    rucio_arguments,
    rucio_server,
)

REPO = Path(__file__).resolve().parent.parent
BASELINE = "speculate=off&replica_batch=0"
VARIANTS = {"baseline": BASELINE, "guessed": "rses=DAV", "auto": ""}


def mount(root: Path, options: str) -> Mount:
    return Mount(root, "rucio:///bench" + (f"?{options}" if options else ""))


def counters(m: Mount) -> dict:
    c = m.stats()["backend_counters"]
    return {k: c.get(k, 0) for k in ("replica_requests", "replica_dids", "speculative_reads",
                                     "speculative_hits", "rse_descriptions")}


def cold_cat(root: Path, options: str, path: str, drop: bool) -> tuple[float, dict]:
    m = mount(root, options)
    try:
        if drop:  # also evicts the co-located server's own pages: its answers slow down
            drop_page_cache()
        start = time.perf_counter()
        subprocess.run(["cat", str(m.path / path)], check=True, stdout=subprocess.DEVNULL)
        return time.perf_counter() - start, counters(m)
    finally:
        m.unmount()


def cat_loop(root: Path, options: str, dataset: str, names: list[str],
             listed: bool) -> tuple[float, dict]:
    m = mount(root, options)
    try:
        if listed:
            os.listdir(m.path / dataset)
        script = 'for f in "$@"; do cat "$f" >/dev/null || exit 1; done'
        paths = [str(m.path / dataset / n) for n in names]
        start = time.perf_counter()
        subprocess.run(["sh", "-c", script, "sh", *paths], check=True)
        return time.perf_counter() - start, counters(m)
    finally:
        m.unmount()


#: The loops with a goal: (key in ``results["loop"]``, its baseline's key, what it is).
LOOP_GOALS = (("guessed", "baseline", "never listed, `rses=DAV`"),
              ("auto", "baseline", "never listed, `rses` unset (auto)"),
              ("listed_batched", "listed_baseline", "after an `ls`, sibling batches only"))


def goals(r: dict) -> list[Goal]:
    """The first-byte issue's goals, from the measurements in ``r``: a guessed cold ``cat``
    (``rses=DAV``) within 30 ms, page cache dropped or not; a loop of cold ``cat``s within
    0.3x the time of the mount without guesses and sibling batches."""
    rows = []
    cats = {k: statistics.median(v) for k, v in r["cold_cat_ms"].items()}
    for suffix, what in (("", ""), (", page cache dropped", ", the machine's page cache "
                                                          "dropped first")):
        ms, base = cats["guessed" + suffix], cats["baseline" + suffix]
        rows.append(Goal("bench_first_byte", "cold `cat` 4 KiB, never-listed dataset, fresh "
                         f"mount, `rses=DAV`{what}", f"{ms:.1f} ms",
                         f"guesses off {base:.1f} ms", ms / base, "≤ 30 ms", at_most(ms, 30)))
    loops = r.get("loop", {})
    for key, base_key, what in LOOP_GOALS:
        if key not in loops:
            continue
        loop, base = loops[key], loops[base_key]
        ratio = loop["seconds"] / base["seconds"]
        rows.append(Goal("bench_first_byte", f"`cat` of {r['files']:,} files in a shell loop, "
                         f"{what}", f"{loop['seconds']:.2f} s, {loop['replica_requests']} "
                         "replica requests", f"guesses off {base['seconds']:.2f} s, "
                         f"{base['replica_requests']} replica requests", ratio, "≤ 0.3x",
                         at_most(ratio, 0.3)))
    return rows


def main() -> int:
    ap = rucio_arguments(__doc__, "first_byte", repeat=7)
    ap.add_argument("--files", type=int, default=1000)
    args = ap.parse_args()

    root = Path(tempfile.mkdtemp(prefix="rucio-fs-bench-first-byte-"))
    results: dict = {"kernel": os.uname().release, "cpus": os.cpu_count()}
    with rucio_server(args.server, root) as (server, _):
        catalog = json.loads((server / "catalog.json").read_text())
        files = catalog["ds10000"]
        cats: dict[str, list[float]] = {}
        for i in range(args.repeat):  # interleaved: every variant sees the same server
            for k, (name, options) in enumerate(VARIANTS.items()):
                for drop in (True, False):
                    f = files[100 + 6 * i + 2 * k + drop]
                    seconds, _ = cold_cat(root, options, f"ds10000/{f['name']}", drop)
                    label = f"{name}, page cache dropped" if drop else name
                    cats.setdefault(label, []).append(seconds)
        results["cold_cat_ms"] = {k: [round(1000 * s, 1) for s in v] for k, v in cats.items()}

        names = [f["name"] for f in catalog["ds1000"]][: args.files]
        results["files"] = len(names)
        loops = {}
        for name, options in VARIANTS.items() if names else ():
            loops[name] = cat_loop(root, options, "ds1000", names, listed=False)
        if names:
            loops["listed_baseline"] = cat_loop(root, BASELINE, "ds1000", names, listed=True)
            loops["listed_batched"] = cat_loop(root, "speculate=off", "ds1000", names,
                                               listed=True)
        if loops:
            results["loop"] = {k: {"seconds": round(s, 2), **c}
                               for k, (s, c) in loops.items()}

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(add_goals(results, goals(results)), indent=1))
    med = {k: statistics.median(v) for k, v in results["cold_cat_ms"].items()}
    print("| measurement | variant | time | replica requests | vs baseline |")
    print("|---|---|---:|---:|---:|")
    for k, v in results["cold_cat_ms"].items():
        base = med["baseline" + k.partition(",")[1] + k.partition(",")[2]]
        print(f"| cold `cat` 4 KiB, fresh mount, never-listed dataset (median of "
              f"{args.repeat}) | {k} | {med[k]:.1f} ms ({min(v):.1f}-{max(v):.1f}) | | "
              f"{med[k] / base:.2f}x |")
    loop = results.get("loop", {})
    for k, v in loop.items():
        base = loop["listed_baseline" if k.startswith("listed") else "baseline"]["seconds"]
        print(f"| `cat` of {len(names)} files in a loop | {k} | {v['seconds']:.2f} s | "
              f"{v['replica_requests']} | {v['seconds'] / base:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
