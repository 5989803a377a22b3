"""S3 benchmarks against versitygw on 127.0.0.1, side by side with s3fs and rclone (from apt).

    python benchmarks/bench_s3.py [--server DIR] [--objects 10000] [--small-files 6400]
                                  [--big-mib 1024] [--peers s3fs,rclone] [--out FILE.json]

Experiments (the same server, one run):

* ``ls``: cold ``ls -l`` of N objects (a fresh mount) against the raw ListObjectsV2 pages of
  the same prefix (presigned GETs read with ``http.client``: the server's own cost plus the
  least a client can do), then warm ``ls -l``. Goals: cold <= 1.3x raw, warm <= 0.10 s.
* ``small``: GeeseFS's small-file test: 6,400 files of 0.5-300 KB (30 KB on average) in 1,024
  directories two levels deep; ``cp -r`` into the mount, then ``rm -r``. Against s3fs and rclone.
* ``big``: 1 GiB written with ``dd bs=1M`` (until close returns: the upload is done) and read
  back cold with ``cat``, beside s3fs.
* ``first-byte``: ``cat`` of a 4 KiB object on a fresh mount with the page cache dropped,
  every client in turn (rucio-fs, the peers, GeeseFS when built), median of ``--repeat``.
* ``burst``: 16 ``cat``s at once of 4 KiB objects in one directory, fresh mounts, page cache
  dropped: rucio-fs, rucio-fs with the kernel's serial lookups (``rucio-fs-serial``), the
  peers. On loopback every request is CPU, so this measures CPU per file more than waiting.

``--server DIR`` reuses servers started with ``scripts/servers/s3.sh start DIR``; otherwise they
are started in a temporary directory and stopped by PID at the end.
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
    Mount,
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
    return timed(["ls", "-l", str(path)])


def exp_ls(env: dict, root: Path, objects: int, repeat: int) -> dict:
    prefix = f"ls-{uuid.uuid4().hex[:6]}"
    seed(env, prefix, objects)
    raw = min(raw_listing(env["VGW_ENDPOINT"], prefix)[0] for _ in range(repeat))
    cold, warm = [], []
    for _ in range(repeat):
        mount = Mount(root, f"s3://test/{prefix}", "-o", f"endpoint_url={env['VGW_ENDPOINT']}")
        try:
            cold.append(ls_l(mount.path))
            warm.append(min(ls_l(mount.path) for _ in range(3)))
        finally:
            mount.unmount()
    result = {"objects": objects, "raw_list_s": raw, "cold_s": sorted(cold),
              "warm_s": sorted(warm), "cold_over_raw": min(cold) / raw}
    print(f"ls -l {objects}: raw pages {raw:.3f} s, cold {min(cold):.3f} s "
          f"({result['cold_over_raw']:.2f}x raw), warm {min(warm):.3f} s", flush=True)
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", help="directory of servers started by s3.sh (reused)")
    parser.add_argument("--objects", type=int, default=10_000)
    parser.add_argument("--small-files", type=int, default=6400)
    parser.add_argument("--big-mib", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--peers", default="s3fs,rclone")
    parser.add_argument("--experiments", default="ls,small,big")
    parser.add_argument("--out", type=Path)
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
            results["ls"] = exp_ls(env, root, args.objects, args.repeat)
        if "small" in chosen:
            results["small"] = exp_small(env, root, args.small_files, peers)
        if "big" in chosen:
            results["big"] = exp_big(env, root, args.big_mib, peers)
        if "first-byte" in chosen:
            results["first_byte"] = exp_first_byte(env, root, max(args.repeat, 5), peers)
        if "burst" in chosen:
            results["burst"] = exp_burst(env, root, max(args.repeat, 5), peers)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
