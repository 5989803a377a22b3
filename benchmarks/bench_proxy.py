"""Which caching proxy for the data tier: nginx with the slice module, Squid, Varnish — each
in front of the Rucio test storage, measured in one run the way mounts read.

    python benchmarks/bench_proxy.py --server DIR     # a running scripts/servers/rucio.sh DIR

For each proxy, with an empty cache: the first byte of a 1 MiB range at offset 0 and at 3 GiB
of the 4.2 GB file; then 4 readers at once each reading the first 256 MiB in 8 MiB ranges (as
the mounts' read-ahead asks); the bytes the storage served for all of it (from its access log,
which logs what was sent even when a transfer is cut); and the same 256 MiB again, warm.
nginx runs the shipped ``containers/data-proxy/nginx.conf`` (``scripts/servers/proxy.sh``);
Squid and Varnish run the configurations below, tuned to cache ranges as well as each can
(Squid: ``range_offset_limit -1`` fetches the whole object for a range, the only way it caches
one; Varnish: whole objects, streamed while they arrive). apt: ``squid varnish``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from common import free_port, read_env, script_server
from threads import in_threads

MiB = 1 << 20
BIG = "frame-4509715660.gwf"


def get(port: int, target: str, start: int, size: int) -> tuple[float, int]:
    """Seconds to the first byte of a ranged GET through the proxy at ``port``, and bytes."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    began = time.perf_counter()
    conn.request("GET", target, headers={"Range": f"bytes={start}-{start + size - 1}"})
    response = conn.getresponse()
    first = response.read(1)
    ttfb = time.perf_counter() - began
    total = len(first) + len(response.read())
    conn.close()
    if response.status not in (200, 206) or total != size:
        raise RuntimeError(f"{target}: HTTP {response.status}, {total} of {size} bytes")
    return ttfb, total


@contextmanager
def nginx(base: Path, origin: str, path: str) -> Iterator[tuple[int, str]]:
    port = free_port()
    with script_server("proxy", base, PROXY_PORT=str(port)):
        yield port, f"/http/{origin}{path}"


@contextmanager
def squid(base: Path, origin: str, path: str) -> Iterator[tuple[int, str]]:
    port = free_port()
    base.mkdir(parents=True, exist_ok=True)
    (base / "squid.conf").write_text(f"""
http_port 127.0.0.1:{port}
http_access allow all
pid_filename {base}/squid.pid
cache_dir ufs {base}/cache 20000 16 256
maximum_object_size 8 GB
cache_mem 64 MB
range_offset_limit -1
quick_abort_min -1 KB
collapsed_forwarding on
access_log stdio:{base}/access.log
cache_log {base}/cache.log
coredump_dir {base}
""")
    for owned in (base, *base.iterdir()):  # squid runs as its own user
        shutil.chown(owned, "proxy", "proxy")
    subprocess.run(["squid", "-f", str(base / "squid.conf"), "-z", "--foreground"], check=True,
                   capture_output=True)
    subprocess.run(["squid", "-f", str(base / "squid.conf")], check=True)
    try:
        _wait_port(port)
        yield port, f"http://{origin}{path}"  # a forward proxy: the absolute URL
    finally:
        subprocess.run(["squid", "-f", str(base / "squid.conf"), "-k", "shutdown"],
                       capture_output=True)
        _wait_gone(base / "squid.pid")


@contextmanager
def varnish(base: Path, origin: str, path: str) -> Iterator[tuple[int, str]]:
    port = free_port()
    host, origin_port = origin.split(":")
    base.mkdir(parents=True, exist_ok=True)
    (base / "default.vcl").write_text(f"""vcl 4.1;
backend storage {{ .host = "{host}"; .port = "{origin_port}"; }}
sub vcl_backend_response {{ set beresp.ttl = 1h; set beresp.do_stream = true; }}
""")
    subprocess.run(["varnishd", "-j", "none", "-a", f"127.0.0.1:{port}",
                    "-f", str(base / "default.vcl"),
                    "-s", f"file,{base}/storage.bin,6G", "-n", str(base / "work"),
                    "-P", str(base / "varnish.pid")], check=True)
    try:
        _wait_port(port)
        yield port, path
    finally:
        pid = int((base / "varnish.pid").read_text())
        subprocess.run(["kill", str(pid)])
        _wait_gone(base / "varnish.pid", pid)


def _wait_port(port: int) -> None:
    import socket
    for _ in range(200):
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def _wait_gone(pid_file: Path, pid: int | None = None) -> None:
    for _ in range(200):
        if pid is None and not pid_file.exists():
            return
        if pid is not None and not Path(f"/proc/{pid}").exists():
            return
        time.sleep(0.1)


def storage_bytes(log: Path, start: int) -> int:
    total = 0
    for line in log.read_text().splitlines()[start:]:
        if BIG in line:
            total += int(line.split('"')[2].split()[1])
    return total


def measure(name: str, proxy, root: Path, env: dict[str, str]) -> dict:
    storage = f"127.0.0.1:{env['DAV_HTTP']}"
    [stored] = Path(env["DAV_ROOT"]).rglob(BIG)
    path = "/" + str(stored.relative_to(env["DAV_ROOT"]))
    log = Path(env["ACCESS_LOG"]).parent / "nginx-access.log"
    start = len(log.read_text().splitlines())
    with proxy(root / name, storage, path) as (port, target):
        first, _ = get(port, target, 0, MiB)
        deep, _ = get(port, target, 3 << 30, MiB)

        def reader() -> None:
            for offset in range(0, 256 * MiB, 8 * MiB):
                get(port, target, offset, 8 * MiB)

        cold = in_threads(reader, 4)
        began = time.perf_counter()
        for offset in range(0, 256 * MiB, 8 * MiB):
            get(port, target, offset, 8 * MiB)
        warm = time.perf_counter() - began
        time.sleep(2)  # what the proxy still fetches after its clients are done counts too
    return {"proxy": name, "ttfb_0_ms": 1000 * first, "ttfb_3GiB_ms": 1000 * deep,
            "four_readers_256MiB_s": cold, "warm_256MiB_MBps": 256 * MiB / 1e6 / warm,
            "storage_MiB": storage_bytes(log, start) / MiB}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", type=Path, required=True,
                    help="directory of a running scripts/servers/rucio.sh server")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "proxy.json")
    args = ap.parse_args()
    if not (args.server / "server.env").is_file():
        ap.error(f"--server {args.server}: no server.env there")
    env = read_env(args.server / "server.env")
    root = Path(tempfile.mkdtemp(prefix="rucio-fs-proxies-"))
    root.chmod(0o755)  # squid and its cache run as user proxy
    candidates = {"nginx slice": nginx, "squid": squid, "varnish": varnish}
    rows = []
    try:
        for name, proxy in candidates.items():
            binary = {"nginx slice": "nginx", "squid": "squid", "varnish": "varnishd"}[name]
            if shutil.which(binary) is None:
                print(f"{name}: not installed (apt-get install squid varnish)", file=sys.stderr)
                continue
            rows.append(measure(name.replace(" ", "-"), proxy, root, env))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1))
    print("| proxy | first byte at 0 | first byte at 3 GiB | 4 readers of 256 MiB, cold "
          "| storage served | 256 MiB warm |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['proxy']} | {r['ttfb_0_ms']:.1f} ms | {r['ttfb_3GiB_ms']:.1f} ms | "
              f"{r['four_readers_256MiB_s']:.2f} s | {r['storage_MiB']:.0f} MiB | "
              f"{r['warm_256MiB_MBps']:.0f} MB/s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
