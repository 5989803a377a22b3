"""S3 benchmarks against versitygw on 127.0.0.1, side by side with s3fs and rclone (from apt).

    python benchmarks/bench_s3.py [--server DIR] [--objects 10000] [--small-files 6400]
                                  [--big-mib 1024] [--big-write-mib 10240]
                                  [--peers s3fs,rclone] [--baseline DIR]
                                  [--experiments ls,small,big,rsync,...] [--out FILE.json]

Experiments (the same server, one run):

* ``ls``: cold ``ls -l`` of N objects (a fresh mount; ``ls -l`` stats every entry) against the
  raw ListObjectsV2 pages of the same prefix (presigned GETs read with ``http.client``: the
  server's own cost plus the least a client can do), then warm ``ls -l``. Goals: cold <= 1.3x
  raw, warm <= 0.10 s. With ``--baseline DIR`` (another checkout, e.g. ``git worktree add DIR
  COMMIT``) every repeat also mounts DIR's code, the two alternating; medians compared.
* ``rsync``: ``rsync -a`` of GeeseFS's small-file tree (below), its files and directories
  given distinct old times (some with nanoseconds) and a few modes, from local disk into an
  empty prefix through rucio-fs (``--write-back sync`` and ``async``), rclone and s3fs in turn:
  the first run (rucio-fs: until ``rucio-fs uploads --wait`` returns, everything on the
  server: async, the uploads; sync, the times and modes held back for a rename),
  a second run on the same mount, and a second run on a new mount of the prefix (memory
  caches cold; rucio-fs mounts with one ``--cache-dir`` for both, as a user who syncs again
  does, so the new mount starts from the file attributes the first one learned).
  Each run is ``rsync -ai``: its exit code and the lines it itemized (none on a second run
  when the client keeps what rsync set). rclone is mounted without ``--use-server-modtime``
  (it then shows the times rsync set; no ``--vfs-cache-mode``: like s3fs and sync rucio-fs,
  its ``close`` returns once the object is on the server). Goals: first run <= rclone,
  second run <= 0.5x rclone. rucio-fs logs: ``OUT-logs/``.
* ``small``: GeeseFS's small-file test: 6,400 files of 0.5-300 KB (30 KB on average) in 1,024
  directories two levels deep; ``cp -r`` into the mount, then ``rm -r``. Against s3fs and rclone.
* ``big``: 1 GiB written with ``dd bs=1M`` (until close returns: the upload is done) and read
  back cold with ``cat``, beside s3fs.
* ``big-write``: ``--big-write-mib`` (10 GiB) of zeros written with ``dd bs=1M`` into the
  staging disk itself, then into async rucio-fs without and with ``--passthrough`` (until
  ``close`` returns, and until ``rucio-fs uploads --wait`` says the server holds it), and into
  s3fs (whose ``close`` uploads). Goals: with passthrough, close >= 0.8x the staging disk's
  speed, and on the server >= 2x s3fs's.
* ``first-byte``: ``cat`` of a 4 KiB object on a fresh mount with the page cache dropped,
  every client in turn (rucio-fs, the peers, GeeseFS when built), median of ``--repeat``.
* ``burst``: 16 ``cat``s at once of 4 KiB objects in one directory, fresh mounts, page cache
  dropped: rucio-fs, rucio-fs with the kernel's serial lookups (``rucio-fs-serial``), the
  peers. On loopback every request is CPU, so this measures CPU per file more than waiting.

``--server DIR`` reuses servers started with ``scripts/servers/s3.sh start DIR``; otherwise they
are started in a temporary directory and stopped by PID at the end. Writes ``--out`` (JSON,
default ``benchmarks/results/bench_s3.json``) and a Markdown summary beside it (``.md``).
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote, urlsplit

from common import (
    RESULTS,
    RUCIO_FS,
    CheckoutMount,
    Goal,
    Mount,
    add_goals,
    at_least,
    at_most,
    checkout_code,
    concurrently,
    drop_page_cache,
    geesefs_binary,
    random_file,
    read_env,
    s3_peer_mount,
    small_tree,
    timed,
)

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "servers" / "s3.sh"


@contextmanager
def servers(reuse: str | None):
    base = Path(reuse) if reuse else Path(tempfile.mkdtemp(prefix="bench-s3-"))
    if not reuse:
        subprocess.run(["bash", str(SCRIPT), "start", str(base)], check=True,
                       env={**os.environ, "PYTHON": sys.executable})
    env = read_env(base / "server.env")
    os.environ.update({k: env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                           "AWS_REGION")})
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
    try:
        yield env
    finally:
        if not reuse:
            subprocess.run(["bash", str(SCRIPT), "stop", str(base)])
            shutil.rmtree(base, ignore_errors=True)


def seed(env: dict, prefix: str, count: int) -> None:
    """``count`` 4 KiB objects stored the way versitygw stores them (file + ETag xattr)."""
    root = Path(env["VGW_DATA"]) / "test" / prefix
    root.mkdir(parents=True)
    for i in range(count):
        data = i.to_bytes(4, "big") * 1024
        path = root / f"obj{i:06d}"
        path.write_bytes(data)
        os.setxattr(path, "user.etag", f'"{hashlib.md5(data).hexdigest()}"'.encode())


def raw_listing(endpoint: str, prefix: str) -> tuple[float, int]:
    """Seconds to fetch every ListObjectsV2 page of ``prefix`` (delimiter ``/``)."""
    import botocore.session
    from botocore.auth import S3SigV4QueryAuth
    from botocore.awsrequest import AWSRequest

    creds = botocore.session.get_session().get_credentials().get_frozen_credentials()
    host = urlsplit(endpoint).netloc
    conn = http.client.HTTPConnection(host)
    token, keys = None, 0
    start = time.perf_counter()
    while True:
        query = f"delimiter=%2F&list-type=2&max-keys=1000&prefix={quote(prefix + '/', safe='')}"
        if token:
            query += f"&continuation-token={quote(token, safe='')}"
        request = AWSRequest(method="GET", url=f"{endpoint}/test/?{query}")
        S3SigV4QueryAuth(creds, "s3", "us-east-1", expires=600).add_auth(request)
        conn.request("GET", request.url[len(endpoint):])
        body = conn.getresponse().read().decode()
        keys += body.count("<Key>")
        match = re.search(r"<NextContinuationToken>([^<]+)<", body)
        if "<IsTruncated>true" not in body or not match:
            break
        token = match.group(1)
    elapsed = time.perf_counter() - start
    conn.close()
    return elapsed, keys


def ls_l(path: Path) -> float:
    """Seconds of ``ls -l``: a listing, then a stat of every entry (its output discarded)."""
    return timed(["ls", "-l", str(path)])


def ls_l_entries(path: Path) -> int:
    """The entries ``ls -l`` shows (each with its attributes)."""
    out = subprocess.run(["ls", "-l", str(path)], check=True, capture_output=True, text=True)
    return sum(1 for line in out.stdout.splitlines() if not line.startswith("total "))


def exp_ls(env: dict, root: Path, objects: int, repeat: int,
           baseline: dict[str, str] | None = None) -> dict:
    prefix = f"ls-{uuid.uuid4().hex[:6]}"
    seed(env, prefix, objects)
    raw = min(raw_listing(env["VGW_ENDPOINT"], prefix)[0] for _ in range(repeat))
    codes = ["current", *(["baseline"] if baseline else [])]
    cold: dict[str, list[float]] = {code: [] for code in codes}
    warm: dict[str, list[float]] = {code: [] for code in codes}
    options = ("-o", f"endpoint_url={env['VGW_ENDPOINT']}")
    for i in range(repeat):  # alternating, each code first in turn
        for code in codes[i % 2:] + codes[:i % 2]:
            mount = (Mount(root, f"s3://test/{prefix}", *options) if code == "current" else
                     CheckoutMount(root, baseline, f"s3://test/{prefix}", *options))
            try:
                cold[code].append(ls_l(mount.path))
                warm[code].append(min(ls_l(mount.path) for _ in range(3)))
                shown = ls_l_entries(mount.path)
                assert shown == objects, (code, shown)
            finally:
                mount.unmount()
    result = {"objects": objects, "raw_list_s": raw, "cold_s": sorted(cold["current"]),
              "warm_s": sorted(warm["current"]),
              "cold_median_s": statistics.median(cold["current"]),
              "cold_over_raw": min(cold["current"]) / raw}
    print(f"ls -l {objects}: raw pages {raw:.3f} s, cold {min(cold['current']):.3f} s "
          f"(median {result['cold_median_s']:.3f} s, {result['cold_over_raw']:.2f}x raw), "
          f"warm {min(warm['current']):.3f} s", flush=True)
    if baseline:
        base = statistics.median(cold["baseline"])
        result.update(baseline_cold_s=sorted(cold["baseline"]),
                      baseline_warm_s=sorted(warm["baseline"]), baseline_cold_median_s=base,
                      cold_over_baseline=result["cold_median_s"] / base)
        print(f"  baseline code: cold median {base:.3f} s, warm "
              f"{min(warm['baseline']):.3f} s; current / baseline "
              f"{result['cold_over_baseline']:.2f}x", flush=True)
    return result


def exp_small(env: dict, root: Path, files: int, peers: list[str]) -> dict:
    source = root / "small-source"
    total = small_tree(source, files)
    print(f"small files: {files} files, {total / files / 1000:.1f} KB on average", flush=True)
    results = {}
    for kind in ["rucio-fs", *peers]:
        prefix = f"small-{kind}-{uuid.uuid4().hex[:6]}"
        with s3_peer_mount(kind, env, prefix, root) as mnt:
            copy = timed(["cp", "-r", str(source), str(mnt / "tree")])
            remove = timed(["rm", "-r", str(mnt / "tree")])
        results[kind] = {"cp_s": copy, "rm_s": remove}
        print(f"  {kind:<9} cp -r {copy:7.2f} s   rm -r {remove:7.2f} s", flush=True)
    shutil.rmtree(source)
    return results


def aged(root: Path) -> None:
    """The tree under ``root`` given what ``rsync -a`` has to carry: distinct old times (every
    third file's with nanoseconds), and a few modes besides 0644 (files 0600, 0755, 0640;
    every fourth directory 0750)."""
    files = sorted(p for p in root.rglob("*") if p.is_file())
    for i, path in enumerate(files):
        path.chmod({0: 0o600, 1: 0o755, 2: 0o640}.get(i % 8, 0o644))
        ns = (1_300_000_000 + 97 * i) * 10**9 + (i * 7919 % 10**9 if i % 3 == 0 else 0)
        os.utime(path, ns=(ns, ns))
    dirs = sorted((p for p in root.rglob("*") if p.is_dir()), reverse=True)
    for i, path in enumerate([*dirs, root]):
        if i % 4 == 0 and path != root:
            path.chmod(0o750)
        ns = (1_200_000_000 + 1000 * i) * 10**9
        os.utime(path, ns=(ns, ns))


def rsync_run(source: Path, target: Path, wait: bool) -> dict:
    """``rsync -ai source/ target/`` timed (``wait``: and ``rucio-fs uploads --wait``): its
    exit code, how many lines it itemized (with the first few), its stderr's tail."""
    start = time.perf_counter()
    done = subprocess.run(["rsync", "-ai", f"{source}/", f"{target}/"], capture_output=True,
                          text=True)
    waited = (subprocess.run([*RUCIO_FS, "uploads", "--wait", str(target.parent)],
                             capture_output=True, text=True) if wait else None)
    elapsed = time.perf_counter() - start
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    return {"s": elapsed, "exit": done.returncode, "itemized": len(lines),
            "itemized_first": lines[:5], "stderr": done.stderr.splitlines()[-10:],
            **({"uploads_wait_exit": waited.returncode} if waited else {})}


#: The clients of the rsync experiment: (name, kind of s3_peer_mount, rucio-fs options).
RSYNC_CLIENTS = [("rucio-fs sync", "rucio-fs", ("--write-back", "sync")),
                 ("rucio-fs async", "rucio-fs", ("--write-back", "async")),
                 ("rclone", "rclone", ()), ("s3fs", "s3fs", ())]
RSYNC_RUNS = {"first": "first run", "again": "second run, same mount",
              "remount": "second run, new mount"}


def exp_rsync(env: dict, root: Path, files: int, peers: list[str], logs: Path) -> dict:
    source = root / "rsync-source"
    total = small_tree(source, files)
    aged(source)
    logs.mkdir(parents=True, exist_ok=True)
    print(f"rsync -a: {files} files, {total / files / 1000:.1f} KB on average", flush=True)
    results: dict = {}
    for name, kind, options in RSYNC_CLIENTS:
        if not kind.startswith("rucio-fs") and kind not in peers:
            continue
        prefix = f"rsync-{kind}-{uuid.uuid4().hex[:6]}"
        wait = kind == "rucio-fs"
        runs = {}
        for mount_no, run_names in enumerate([("first", "again"), ("remount",)], start=1):
            log = logs / f"{name.replace(' ', '-')}-{mount_no}.log"
            extra = ((*options, "--log-file", str(log), "--cache-dir",
                      str(root / f"cache-{prefix}")) if kind == "rucio-fs" else ())
            with s3_peer_mount(kind, env, prefix, root, options=extra, keep_times=True) as mnt:
                for run in run_names:
                    runs[run] = rsync_run(source, mnt / "tree", wait)
        results[name] = runs
        print(f"  {name:<15}" + "   ".join(
            f"{RSYNC_RUNS[run].split(',')[-1].strip()} {r['s']:7.2f} s (exit {r['exit']}, "
            f"{r['itemized']} itemized)" for run, r in runs.items()), flush=True)
        for run, r in runs.items():
            if r["exit"] or (run != "first" and r["itemized"]):
                print(f"    {run}: {r['itemized_first']} {r['stderr']}", flush=True)
    if "rclone" in results:
        for runs in results.values():
            for run, r in runs.items():
                r["over_rclone"] = r["s"] / results["rclone"][run]["s"]
    shutil.rmtree(source)
    return results


def exp_big(env: dict, root: Path, mib: int, peers: list[str]) -> dict:
    source = root / "big-source"
    random_file(source, mib << 20)
    results = {}
    for kind in ["rucio-fs", *[p for p in peers if p == "s3fs"]]:
        prefix = f"big-{kind}-{uuid.uuid4().hex[:6]}"
        with s3_peer_mount(kind, env, prefix, root) as mnt:
            drop_page_cache()
            write = timed(["dd", f"if={source}", f"of={mnt / 'big'}", "bs=1M"])
        with s3_peer_mount(kind, env, prefix, root) as mnt:
            drop_page_cache()
            read = timed(["cat", str(mnt / "big")])
        mb = mib * (1 << 20) / 1e6
        results[kind] = {"write_MBps": mb / write, "read_MBps": mb / read}
        print(f"  {kind:<9} write {mb / write:7.0f} MB/s   read {mb / read:7.0f} MB/s",
              flush=True)
    source.unlink()
    return results


def exp_big_write(env: dict, root: Path, mib: int, peers: list[str]) -> dict:
    """``dd bs=1M`` of ``mib`` MiB of zeros, timed until ``close`` returns and until the
    server holds it, into the staging disk itself (the baseline), async rucio-fs without and
    with ``--passthrough`` (staging in ``root``), and s3fs (whose close uploads)."""
    # versitygw's posix backend keeps a multipart upload's part list in one xattr, which ext4
    # caps at one block: past 4 GiB every client writes 64 MB parts.
    part_mb = 64 if mib > 4096 else 0
    parts = ("-o", f"part_size={part_mb}M") if part_mb else ()
    mb = mib * (1 << 20) / 1e6
    results = {}

    def dd(target: Path) -> float:
        return timed(["dd", "if=/dev/zero", f"of={target}", "bs=1M", f"count={mib}",
                      "status=none"])

    probe = root / "staging-probe"
    probe.mkdir()
    drop_page_cache()
    results["staging disk"] = {"close_s": dd(probe / "big"), "stored_s": None}
    (probe / "big").unlink()
    clients = {"rucio-fs async": ("--write-back", "async"),
               "rucio-fs async passthrough": ("--write-back", "async", "--passthrough")}
    for kind, options in clients.items():
        prefix = f"big-write-{uuid.uuid4().hex[:6]}"
        staging = root / f"staging-{prefix}"
        with s3_peer_mount("rucio-fs", env, prefix, root,
                           options=(*options, *parts, "--staging-dir", str(staging))) as mnt:
            drop_page_cache()
            start = time.perf_counter()
            close = dd(mnt / "big")
            subprocess.run([*RUCIO_FS, "uploads", "--wait", str(mnt)], check=True,
                           capture_output=True)
            stored = time.perf_counter() - start
            size = (mnt / "big").stat().st_size
            (mnt / "big").unlink()
            subprocess.run([*RUCIO_FS, "uploads", "--wait", str(mnt)], check=True,
                           capture_output=True)
        if size != mib << 20:
            raise RuntimeError(f"{kind}: {size} bytes stored of {mib << 20}")
        results[kind] = {"close_s": close, "stored_s": stored}
    if "s3fs" in peers:
        prefix = f"big-write-{uuid.uuid4().hex[:6]}"
        with s3_peer_mount("s3fs", env, prefix, root, part_mb) as mnt:
            drop_page_cache()
            close = dd(mnt / "big")
            (mnt / "big").unlink()
        results["s3fs"] = {"close_s": close, "stored_s": close}
    for kind, r in results.items():
        r["close_MBps"] = mb / r["close_s"]
        r["stored_MBps"] = mb / r["stored_s"] if r["stored_s"] else None
        stored = f"{r['stored_MBps']:7.0f}" if r["stored_MBps"] else "      -"
        print(f"  {kind:<27} close {r['close_MBps']:7.0f} MB/s   on the server {stored} MB/s",
              flush=True)
    return {"mib": mib, "clients": results}


def big_write_goals(r: dict) -> list[Goal]:
    clients = r["clients"]
    passthrough = clients["rucio-fs async passthrough"]
    disk = clients["staging disk"]
    size = f"{r['mib'] / 1024:g} GiB"
    rows = [Goal("s3", f"{size} written with dd, async, --passthrough: until close returns",
                 f"{passthrough['close_MBps']:.0f} MB/s",
                 f"the staging disk {disk['close_MBps']:.0f} MB/s",
                 passthrough["close_MBps"] / disk["close_MBps"], ">= 0.8x the staging disk",
                 at_least(passthrough["close_MBps"] / disk["close_MBps"], 0.8))]
    if "s3fs" in clients:
        s3fs = clients["s3fs"]["stored_MBps"]
        rows.append(Goal("s3", f"{size} written with dd, async, --passthrough: until the "
                         "server holds it", f"{passthrough['stored_MBps']:.0f} MB/s",
                         f"s3fs {s3fs:.0f} MB/s", passthrough["stored_MBps"] / s3fs,
                         ">= 2x s3fs", at_least(passthrough["stored_MBps"] / s3fs, 2.0)))
    return rows


def medians_ms(times: dict[str, list[float]], what: str) -> dict:
    """Each client's median and range in ms, printed one line each."""
    result = {kind: {"median_ms": 1000 * statistics.median(t),
                     "range_ms": [1000 * min(t), 1000 * max(t)]} for kind, t in times.items()}
    for kind, r in result.items():
        print(f"  {kind:<15} {what} {r['median_ms']:6.1f} ms "
              f"({r['range_ms'][0]:.1f}-{r['range_ms'][1]:.1f})", flush=True)
    return result


def exp_first_byte(env: dict, root: Path, repeat: int, peers: list[str]) -> dict:
    prefix = f"first-byte-{uuid.uuid4().hex[:6]}"
    with s3_peer_mount("rucio-fs", env, prefix, root) as mnt:
        for i in range(repeat):
            (mnt / f"small-{i}.dat").write_bytes(os.urandom(4096))
    kinds = ["rucio-fs", *peers, *(["geesefs"] if geesefs_binary() else [])]
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    for i in range(repeat):  # interleaved: every client sees the same server and machine
        for kind in kinds:
            with s3_peer_mount(kind, env, prefix, root) as mnt:
                drop_page_cache()
                start = time.perf_counter()
                data = (mnt / f"small-{i}.dat").read_bytes()
                times[kind].append(time.perf_counter() - start)
                assert len(data) == 4096, (kind, len(data))
    return medians_ms(times, "cold cat 4 KiB")


def exp_burst(env: dict, root: Path, repeat: int, peers: list[str], width: int = 16) -> dict:
    prefix = f"burst-{uuid.uuid4().hex[:6]}"
    with s3_peer_mount("rucio-fs", env, prefix, root) as mnt:
        (mnt / "d").mkdir()
        for i in range(repeat * width):
            (mnt / "d" / f"small-{i}.dat").write_bytes(os.urandom(4096))
    kinds = ["rucio-fs", "rucio-fs-serial", *peers]
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    for i in range(repeat):  # interleaved; each round reads files no mount has seen
        files = [f"d/small-{i * width + k}.dat" for k in range(width)]
        for kind in kinds:
            with s3_peer_mount(kind, env, prefix, root) as mnt:
                os.stat(mnt / "d")
                drop_page_cache()
                times[kind].append(max(concurrently([["cat", str(mnt / f)] for f in files])))
    return medians_ms(times, f"{width} cold cats at once")


def ls_goals(r: dict) -> list[Goal]:
    """The S3 issue's listing goals (and, with ``--baseline``, the attributes issue's
    "within 10 % of the older code")."""
    warm = statistics.median(r["warm_s"])
    rows = [Goal("bench_s3", f"cold `ls -l` of {r['objects']:,} objects, fresh mount",
                 f"best {min(r['cold_s']):.3f} s (median {r['cold_median_s']:.3f} s)",
                 f"raw ListObjectsV2 pages {r['raw_list_s']:.3f} s", r["cold_over_raw"],
                 "≤ 1.3x raw", at_most(r["cold_over_raw"], 1.3)),
            Goal("bench_s3", f"warm `ls -l` of {r['objects']:,} objects", f"{warm:.3f} s", "",
                 None, "≤ 0.10 s", at_most(warm, 0.10))]
    if "cold_over_baseline" in r:
        rows.append(Goal("bench_s3", "cold `ls -l`, this code beside `--baseline` code",
                         f"median {r['cold_median_s']:.3f} s",
                         f"baseline code {r['baseline_cold_median_s']:.3f} s",
                         r["cold_over_baseline"], "≤ 1.10x", at_most(r["cold_over_baseline"],
                                                                     1.10)))
    return rows


def small_goals(r: dict) -> list[Goal]:
    """The S3 issue's small-file goal: ``cp -r`` in and ``rm -r`` faster than every peer."""
    rows = []
    peers = {kind: t for kind, t in r.items() if kind != "rucio-fs"}
    for key, what in (("cp_s", "`cp -r` of GeeseFS's small-file tree in"),
                      ("rm_s", "`rm -r` of that tree")):
        mine = r["rucio-fs"][key]
        fastest = min((t[key] for t in peers.values()), default=None)
        rows.append(Goal("bench_s3", what, f"{mine:.1f} s",
                         ", ".join(f"{kind} {t[key]:.1f} s" for kind, t in peers.items())
                         or "no peer measured", None if fastest is None else mine / fastest,
                         "faster than each peer",
                         None if fastest is None else mine < fastest))
    return rows


def first_byte_goals(r: dict) -> list[Goal]:
    """The first-byte issue's goal on S3: a cold ``cat`` of 4 KiB no slower than s3fs."""
    mine = r["rucio-fs"]["median_ms"]
    s3fs = r.get("s3fs", {}).get("median_ms")
    return [Goal("bench_s3", "cold `cat` of a 4 KiB object, fresh mount, page cache dropped",
                 f"{mine:.1f} ms", "s3fs not measured" if s3fs is None else f"s3fs {s3fs:.1f} ms",
                 None if s3fs is None else mine / s3fs, "≤ s3fs",
                 None if s3fs is None else mine <= s3fs)]


def rsync_goals(r: dict) -> list[Goal]:
    """The attributes issue's goals: ``rsync -a``'s first run through each rucio-fs mode no
    slower than through rclone; its second runs at most half rclone's time, itemizing
    nothing; every run exiting 0."""
    rows = []
    for name in ("rucio-fs sync", "rucio-fs async"):
        for run, label in RSYNC_RUNS.items():
            mine, rclone = r[name][run], r.get("rclone", {}).get(run)
            limit = 1.0 if run == "first" else 0.5
            ratio = None if rclone is None else mine["over_rclone"]
            goal = "≤ rclone, exit 0" if run == "first" else "≤ 0.5x rclone, 0 itemized, exit 0"
            met = None if ratio is None else (ratio <= limit and mine["exit"] == 0 and (
                run == "first" or mine["itemized"] == 0))
            rows.append(Goal(
                "bench_s3", f"`rsync -ai` of the small-file tree, {label}, {name}",
                f"{mine['s']:.2f} s, exit {mine['exit']}, {mine['itemized']:,} itemized",
                "rclone not measured" if rclone is None else
                f"rclone {rclone['s']:.2f} s, {rclone['itemized']:,} itemized", ratio, goal,
                met))
    return rows


def goals(results: dict) -> list[Goal]:
    """The goal rows of the experiments that ran (``big`` and ``burst`` have none)."""
    makers = {"ls": ls_goals, "small": small_goals, "first_byte": first_byte_goals,
              "rsync": rsync_goals, "big_write": big_write_goals}
    return [row for key, make in makers.items() if key in results for row in make(results[key])]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", help="directory of servers started by s3.sh (reused)")
    parser.add_argument("--objects", type=int, default=10_000)
    parser.add_argument("--small-files", type=int, default=6400)
    parser.add_argument("--big-mib", type=int, default=1024)
    parser.add_argument("--big-write-mib", type=int, default=10240)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--peers", default="s3fs,rclone")
    parser.add_argument("--experiments", default="ls,small,big")
    parser.add_argument("--baseline", type=Path,
                        help="another checkout of rucio-fs (git worktree add DIR COMMIT): "
                             "the ls experiment mounts its code too, alternating")
    parser.add_argument("--out", type=Path, default=RESULTS / "bench_s3.json")
    args = parser.parse_args()
    peers = [p for p in args.peers.split(",") if p]
    for peer in peers:
        if shutil.which(peer) is None:
            print(f"bench_s3: {peer} is not installed (apt-get install {peer})", file=sys.stderr)
            return 2
    chosen = args.experiments.split(",")
    results: dict = {}
    with servers(args.server) as env, tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if "ls" in chosen:
            baseline = checkout_code(args.baseline, root) if args.baseline else None
            results["ls"] = exp_ls(env, root, args.objects, args.repeat, baseline)
        if "rsync" in chosen:
            results["rsync"] = exp_rsync(env, root, args.small_files, peers,
                                         args.out.with_name(args.out.stem + "-logs"))
        if "small" in chosen:
            results["small"] = exp_small(env, root, args.small_files, peers)
        if "big" in chosen:
            results["big"] = exp_big(env, root, args.big_mib, peers)
        if "big-write" in chosen:
            results["big_write"] = exp_big_write(env, root, args.big_write_mib, peers)
        if "first-byte" in chosen:
            results["first_byte"] = exp_first_byte(env, root, max(args.repeat, 5), peers)
        if "burst" in chosen:
            results["burst"] = exp_burst(env, root, max(args.repeat, 5), peers)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(add_goals(results, goals(results)), indent=1))
    args.out.with_suffix(".md").write_text(summary(results))
    return 0


def summary(results: dict) -> str:
    """The Markdown summary of the ls and rsync experiments (the others: their JSON)."""
    lines = ["# bench_s3", ""]
    if "ls" in results:
        r = results["ls"]
        lines += [f"Cold `ls -l` of {r['objects']:,} objects (fresh mount): median "
                  f"{r['cold_median_s']:.3f} s, raw ListObjectsV2 pages {r['raw_list_s']:.3f} s "
                  f"(best {r['cold_over_raw']:.2f}x raw); warm {min(r['warm_s']):.3f} s."]
        if "baseline_cold_median_s" in r:
            lines += [f"Baseline code, alternating: median {r['baseline_cold_median_s']:.3f} s;"
                      f" current / baseline {r['cold_over_baseline']:.2f}x."]
        lines.append("")
    if "rsync" in results:
        lines += ["| client | " + " | ".join(RSYNC_RUNS.values()) + " |",
                  "|---|" + "---:|" * len(RSYNC_RUNS)]
        for name, runs in results["rsync"].items():
            cells = []
            for run in RSYNC_RUNS:
                r = runs[run]
                ratio = f", {r['over_rclone']:.2f}x rclone" if "over_rclone" in r else ""
                cells.append(f"{r['s']:.2f} s (exit {r['exit']}, {r['itemized']} itemized"
                             f"{ratio})")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
