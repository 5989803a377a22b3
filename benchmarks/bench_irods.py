"""iRODS benchmark against the fake iRODS HTTP API (``rucio_fs.testing.irods_fake``), 127.0.0.1.

    python benchmarks/bench_irods.py [--entries 10000] [--latency-ms 5] [--repeat 5]
                                     [--out FILE.json]

``ls``: cold ``ls -l`` of a collection of N data objects (a fresh mount each time) with
``--latency-ms`` added by the server to every request, against the baseline of the same run:
the two listing queries sent at once straight to the server with ``http.client`` and their
JSON parsed (two round trips plus parsing, the least any client can do). Then warm ``ls -l``
and cached ``ls | wc -l`` (NFSRODS 2.0's published figures for 10,000 entries: 9.3 s cold,
0.058 s cached). A real server's query time is not modelled: the fake answers from memory.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlencode

from common import Mount, irods_fake_control, timed
from rucio_fs.backends.irods.query import Dialect, coll_query, data_query

from rucio_fs.testing import irods_fake
from rucio_fs.testing.irods_fake import API, PASSWORD, USER

NFSRODS = {"cold_s": 9.3, "cached_s": 0.058}


def raw_listing(port: int, collection: str, rows: int) -> float:
    """Seconds for both listing queries sent at once, answers parsed (the baseline)."""
    conn = http.client.HTTPConnection("127.0.0.1", port)
    basic = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    conn.request("POST", API + "/authenticate", headers={"Authorization": f"Basic {basic}"})
    token = conn.getresponse().read().decode()
    conn.close()
    dialect = Dialect("genquery2", True, rows - 1, 15)  # exactly the mount's two queries
    queries = []
    for select, where in (data_query(dialect, collection), coll_query(dialect, parent=collection)):
        key = select.split(",")[0]
        queries.append(f"select {select} where {where} order by {key} limit {rows}")
    found: list[int] = []

    def run(query: str) -> None:
        c = http.client.HTTPConnection("127.0.0.1", port)
        c.request("GET", API + "/query?" + urlencode(
            {"op": "execute_genquery", "parser": "genquery2", "query": query}),
            headers={"Authorization": f"Bearer {token}"})
        found.append(len(json.loads(c.getresponse().read())["rows"]))  # parsed, as a client must
        c.close()

    start = time.perf_counter()
    threads = [threading.Thread(target=run, args=(q,)) for q in queries]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    assert sum(found) >= 1, found
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=10_000)
    parser.add_argument("--latency-ms", type=float, default=5.0)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    process, port = irods_fake.start()
    os.environ["IRODS_PASSWORD"] = PASSWORD
    os.environ["IRODS_ENVIRONMENT_FILE"] = "/nonexistent"
    collection = f"/tempZone/home/{USER}/bench"
    try:
        files = {f"f{i:06d}.dat": base64.b64encode(i.to_bytes(4, "big") * 1024).decode()
                 for i in range(args.entries)}
        irods_fake_control(port, "seed", {"collection": collection, "owner": USER, "files": files})
        irods_fake_control(port, "config", {"latency_ms": args.latency_ms})
        raw = [raw_listing(port, collection, args.entries + 1) for _ in range(args.repeat)]
        url = f"irods://{USER}@127.0.0.1:{port}{collection}?api_path={API}"
        cold, warm, cached = [], [], []
        with tempfile.TemporaryDirectory() as tmp:
            for _ in range(args.repeat):
                mount = Mount(Path(tmp), url)
                try:
                    cold.append(timed(["ls", "-l", str(mount.path)]))
                    warm.append(min(timed(["ls", "-l", str(mount.path)]) for _ in range(3)))
                    cached.append(min(timed(f"ls {mount.path} | wc -l", shell=True)
                                      for _ in range(3)))
                finally:
                    mount.unmount()
    finally:
        process.terminate()
        process.wait(timeout=10)
    result = {"entries": args.entries, "latency_ms": args.latency_ms,
              "raw_two_queries_s": sorted(raw), "cold_ls_l_s": sorted(cold),
              "warm_ls_l_s": sorted(warm), "cached_ls_wc_s": sorted(cached),
              "cold_over_raw": statistics.median(cold) / statistics.median(raw),
              "nfsrods_published": NFSRODS}
    print(f"ls -l {args.entries} entries, {args.latency_ms:g} ms per request "
          f"(median of {args.repeat}):\n"
          f"  two queries + parsing (baseline) {statistics.median(raw):.3f} s\n"
          f"  rucio-fs cold ls -l              {statistics.median(cold):.3f} s "
          f"({result['cold_over_raw']:.2f}x baseline; NFSRODS 2.0 published 9.3 s)\n"
          f"  rucio-fs warm ls -l              {statistics.median(warm):.3f} s "
          f"(baseline + warm = {statistics.median(raw) + statistics.median(warm):.3f} s, "
          f"the floor of a cold ls -l)\n"
          f"  rucio-fs cached ls | wc -l       {statistics.median(cached):.3f} s "
          f"(NFSRODS 2.0 published 0.058 s)")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
