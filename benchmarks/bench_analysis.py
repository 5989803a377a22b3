"""An analysis job's reads: uproot reading a generated ROOT file through an S3 or Rucio mount,
beside the same reads from local disk and over uproot's own HTTP access, on loopback and with a
delay.

    python benchmarks/bench_analysis.py [--backend s3|rucio] [--server DIR]
                                        [--entries 5000000] [--clusters 100]
                                        [--repeat 3] [--delay-ms 20] [--out DIR]

The file: one TTree of 10 branches (5 float64, 5 float32), uncompressed, ``--clusters``
baskets per branch (the defaults make the 300 MB, 1,000-basket file of the columnar-reads
issue). Three reads: 2 of 10 branches, the first 10,000 entries of one branch, every branch.
Each read is made three ways, cold (the machine's page cache dropped, a new mount with no
disk layer): uproot on a local copy, uproot on the mount (its default way of opening a path),
and uproot's ``HTTPSource`` on the same object's URL (S3: presigned; Rucio: the replica on
the storage; the Rucio mount reads over http, as uproot does). "needed" is what uproot
reads from the local copy; "server" is what the server sent: the daemon's backend bytes for the
mount, uproot's requested bytes over HTTP. ``--delay-ms`` repeats the mount and HTTP reads
through a TCP proxy in front of the storage that holds each request that long before passing
it on (the Rucio catalog's own requests are not delayed).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from bench_rucio import token as rucio_token
from common import (
    SERVERS,
    Goal,
    Mount,
    add_goals,
    at_most,
    drop_page_cache,
    free_port,
    read_env,
)

from rucio_fs.testing.root_files import CountingFile, make_tree

REPO = Path(__file__).resolve().parent.parent

READS = {"two branches": (["b0", "b7"], None), "first 10,000 entries": (["b3"], 10_000),
         "all branches": ([f"b{i}" for i in range(10)], None)}


def read(source, branches: list[str], stop: int | None, **options) -> float:
    import uproot
    start = time.perf_counter()
    with uproot.open(source, **options) as f:
        f["tree"].arrays(branches, entry_stop=stop, library="np")
        if options:
            read.last_bytes = f.file.source.num_requested_bytes  # type: ignore[attr-defined]
    return time.perf_counter() - start


@contextmanager
def delay_proxy(upstream_port: int, delay: float) -> Iterator[int]:
    """127.0.0.1:PORT forwarding to the upstream, each chunk from the client held ``delay``
    seconds first (a request's added latency); answers pass at once."""
    port = free_port()
    loop = asyncio.new_event_loop()
    ready = threading.Event()

    async def pump(reader, writer, hold: float) -> None:
        try:
            while data := await reader.read(1 << 16):
                if hold:
                    await asyncio.sleep(hold)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def serve(client_r, client_w) -> None:
        up_r, up_w = await asyncio.open_connection("127.0.0.1", upstream_port)
        await asyncio.gather(pump(client_r, up_w, delay), pump(up_r, client_w, 0))

    async def main() -> None:
        server = await asyncio.start_server(serve, "127.0.0.1", port)
        ready.set()
        async with server:
            await server.serve_forever()

    def serve_until_cancelled() -> None:
        with contextlib.suppress(asyncio.CancelledError):
            loop.run_until_complete(main())

    thread = threading.Thread(target=serve_until_cancelled, daemon=True)
    thread.start()
    ready.wait(10)
    try:
        yield port
    finally:
        for task in asyncio.all_tasks(loop):
            loop.call_soon_threadsafe(task.cancel)
        thread.join(10)


def presigned(endpoint: str, env: dict[str, str], key: str) -> str:
    import botocore.session
    from botocore.config import Config
    client = botocore.session.get_session().create_client(
        "s3", endpoint_url=endpoint, region_name=env["AWS_REGION"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        config=Config(signature_version="s3v4"))
    return client.generate_presigned_url("get_object", Params={"Bucket": "test", "Key": key},
                                         ExpiresIn=3600)


@dataclass
class Placement:
    """Where the file lies on one backend: how a mount and uproot's HTTP reach it, through
    the storage's port or a proxy in front of it."""

    #: The storage's HTTP port (what the delay proxy forwards to).
    storage_port: int
    #: The mount's URL and options given the port reads go to.
    mount: Callable[[int], tuple[str, list[str]]]
    #: The file's path below the mount.
    path: str
    #: An HTTP URL of the file through the port.
    http_url: Callable[[int], str]


def s3_placement(server: Path, root: Path, local: Path) -> Placement:
    """The file uploaded through a mount into versitygw; HTTP through a presigned URL."""
    env = read_env(server / "server.env")
    os.environ.update({k: env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                            "AWS_REGION")})
    prefix = f"analysis-{uuid.uuid4().hex[:6]}"
    writer = Mount(root, f"s3://test/{prefix}?endpoint_url={env['VGW_ENDPOINT']}")
    subprocess.run(["cp", str(local), str(writer.path / "events.root")], check=True)
    writer.unmount()
    return Placement(
        int(env["VGW_PORT"]),
        lambda port: (f"s3://test/{prefix}?endpoint_url=http://127.0.0.1:{port}", []),
        "events.root",
        lambda port: presigned(f"http://127.0.0.1:{port}", env, f"{prefix}/events.root"))


def rucio_placement(server: Path, root: Path, local: Path) -> Placement:
    """The file written on the test server's DAV storage where its deterministic layout puts
    it and registered (a dataset, its replica, the attachment) through Rucio's REST API;
    the mount has no option but http reads (and their redirect through the proxy)."""
    env = read_env(server / "server.env")
    os.environ["RUCIO_CONFIG"] = env["RUCIO_CONFIG"]
    host = env["RUCIO_HOST"]
    dataset, name = f"analysis-{uuid.uuid4().hex[:6]}", "events.root"
    digest = hashlib.md5(f"bench:{name}".encode()).hexdigest()
    relative = f"rucio/bench/{digest[0:2]}/{digest[2:4]}/{name}"
    target = Path(env["DAV_ROOT"]) / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    data = local.read_bytes()
    target.write_bytes(data)
    headers = {"X-Rucio-Auth-Token": rucio_token(host)}
    calls = [("POST", f"/dids/bench/{dataset}", {"type": "DATASET"}),
             ("POST", "/replicas", {"rse": "DAV", "files": [{
                 "scope": "bench", "name": name, "bytes": len(data),
                 "adler32": f"{zlib.adler32(data):08x}", "md5": hashlib.md5(data).hexdigest()}]}),
             ("POST", f"/dids/bench/{dataset}/dids", {"dids": [{"scope": "bench",
                                                                 "name": name}]})]
    for method, path, body in calls:
        answer = httpx.request(method, host + path, json=body, headers=headers)
        if answer.status_code not in (200, 201) and "already" not in answer.text.lower():
            raise RuntimeError(f"{method} {path}: HTTP {answer.status_code} {answer.text}")
    storage = f"http://127.0.0.1:{env['DAV_HTTP']}/"
    return Placement(
        int(env["DAV_HTTP"]),
        lambda port: (f"rucio:///bench/{dataset}?schemes=http"
                      f"&redirect={storage}=http://127.0.0.1:{port}/", []),
        name, lambda port: f"http://127.0.0.1:{port}/{relative}")


def run(place: Placement, root: Path, local: Path, args: argparse.Namespace) -> dict:
    import uproot
    rows = []
    for delay_ms in sorted({0, args.delay_ms}):
        with delay_proxy(place.storage_port, delay_ms / 1000) as port:
            url, options = place.mount(port)
            http_url = place.http_url(port)
            for name, (branches, stop) in READS.items():
                counting = CountingFile(local)
                read(counting, branches, stop)
                row = {"read": name, "delay_ms": delay_ms, "needed": counting.bytes}
                times: dict[str, list[float]] = {"local": [], "mount": [], "http": []}
                for _ in range(args.repeat):
                    if delay_ms == 0:
                        drop_page_cache()
                        times["local"].append(read(str(local), branches, stop))
                    m = Mount(root, url, *options, "--no-disk-cache")
                    try:
                        drop_page_cache()
                        times["mount"].append(read(str(m.path / place.path), branches, stop))
                        stats = m.stats()
                        row["mount_server"] = stats["backend"]["read"]["bytes"]
                        row["mount_requests"] = stats["backend"]["read"]["latency"]["count"]
                    finally:
                        m.unmount()
                    times["http"].append(read(http_url, branches, stop,
                                              handler=uproot.source.http.HTTPSource))
                    row["http_server"] = read.last_bytes  # type: ignore[attr-defined]
                for way, values in times.items():
                    if values:
                        row[f"{way}_s"] = statistics.median(values)
                rows.append(row)
                print(json.dumps(row), flush=True)
    return {"backend": args.backend, "entries": args.entries, "clusters": args.clusters,
            "repeat": args.repeat, "file_bytes": local.stat().st_size, "rows": rows}


def goals(result: dict) -> list[Goal]:
    """The columnar-reads issue's goals, per read, from the rows in ``result``: what the
    server sent to the mount within 1.2x what uproot needs (no delay); the mount's time no
    more than uproot's own HTTP access with no delay, and within 0.8x of it with one."""
    bench = f"bench_analysis ({result['backend']})"
    rows = []
    for r in result["rows"]:
        delay = r["delay_ms"]
        if delay == 0:
            ratio = r["mount_server"] / r["needed"]
            rows.append(Goal(bench, f"{r['read']}: bytes the server sent to the mount",
                             f"{r['mount_server'] / 1e6:.2f} MB",
                             f"needed {r['needed'] / 1e6:.2f} MB", ratio, "≤ 1.2x needed",
                             at_most(ratio, 1.2)))
        limit = 1.0 if delay == 0 else 0.8
        ratio = r["mount_s"] / r["http_s"]
        rows.append(Goal(bench, f"{r['read']}: time through the mount, {delay} ms added per "
                         "request", f"{r['mount_s']:.3f} s", f"uproot's HTTP {r['http_s']:.3f} s",
                         ratio, "≤ uproot's HTTP" if delay == 0 else f"≤ {limit:g}x uproot's HTTP",
                         at_most(ratio, limit)))
    return rows


def summary(result: dict) -> str:
    lines = [f"uproot on {result['backend']}, {result['file_bytes'] / 1e6:.0f} MB file, "
             f"{result['clusters']} baskets per branch, median of {result['repeat']}", "",
             "| read | delay | needed | mount: server | ratio | HTTP: server | local s | "
             "mount s | HTTP s | mount / HTTP |", "|---" + "|---:" * 9 + "|"]
    for r in result["rows"]:
        local = f"{r['local_s']:.3f}" if "local_s" in r else "—"
        lines.append(
            f"| {r['read']} | {r['delay_ms']} ms | {r['needed'] / 1e6:.2f} MB | "
            f"{r['mount_server'] / 1e6:.2f} MB | {r['mount_server'] / r['needed']:.2f}x | "
            f"{r['http_server'] / 1e6:.2f} MB | {local} | {r['mount_s']:.3f} | "
            f"{r['http_s']:.3f} | {r['mount_s'] / r['http_s']:.2f}x |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=("s3", "rucio"), default="s3")
    ap.add_argument("--server", type=Path,
                    help="a running scripts/servers/s3.sh (or rucio.sh) directory")
    ap.add_argument("--entries", type=int, default=5_000_000)
    ap.add_argument("--clusters", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--delay-ms", type=int, default=20)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.server is not None and not (args.server / "server.env").is_file():
        ap.error(f"--server {args.server}: no server.env there")
    root = Path(tempfile.mkdtemp(prefix="rucio-fs-analysis-"))
    script = SERVERS / f"{args.backend}.sh"
    server = args.server or root / "server"
    if args.server is None:
        subprocess.run(["bash", str(script), "start", str(server)], check=True,
                       env={**os.environ, "PYTHON": sys.executable})
    try:
        local = root / "events.root"
        make_tree(local, args.entries, args.clusters)
        placement = (s3_placement if args.backend == "s3" else rucio_placement)(
            server, root, local)
        result = run(placement, root, local, args)
    finally:
        if args.server is None:
            subprocess.run(["bash", str(script), "stop", str(server)], check=False)
    out = args.out or REPO / "benchmarks" / "results" / (
        time.strftime("%Y%m%d-%H%M%S") + f"-analysis-{args.backend}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(add_goals(result, goals(result)), indent=1))
    text = summary(result)
    (out / "summary.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
