"""Which HTTP machinery moves bytes fastest from a loopback server, measured, not assumed.

Reads one large object (default 1 GiB) as 1 MiB ranged GETs -- the shape of the read path's
block fetches -- with 1 and several workers, through each candidate client, next to ``curl``
of the whole object. Usage::

    python benchmarks/bench_http.py URL [--size-mib 1024] [--workers 1,4,8] [--cacert FILE]

Clients that are not installed are reported as such. The result decides
``rucio_fs.http``'s machinery (see benchmarks/README.md). ``--small N`` measures catalog-sized
requests instead (HEAD and 4 KiB PUT of URL; signed with SigV4 when ``AWS_ACCESS_KEY_ID`` is
set, as for the ``server.env`` of ``scripts/servers/s3.sh``)::

    python benchmarks/bench_http.py http://127.0.0.1:PORT/bucket/key --small 2000
    python benchmarks/bench_http.py http://127.0.0.1:PORT/bucket/key --small 50 --idle 0.2

``--signing N [--idle S]`` compares SigV4 signing (botocore's and the daemon's) instead; the
URL is then not used.
"""

from __future__ import annotations

import argparse
import http.client
import os
import ssl
import subprocess
import threading
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from threads import in_threads

BLOCK = 1 << 20


def ranges(total: int) -> list[tuple[int, int]]:
    return [(off, min(BLOCK, total - off)) for off in range(0, total, BLOCK)]


def run_threads(make_reader: Callable[[], Callable[[int, int], int]], total: int,
                workers: int) -> float:
    """Each worker takes the next range; returns seconds for all of them."""
    todo = ranges(total)
    lock = threading.Lock()

    def work() -> None:
        read = make_reader()
        while True:
            with lock:
                if not todo:
                    return
                off, size = todo.pop(0)
            got = read(off, size)
            assert got == size, (got, size)

    return in_threads(work, workers)

def fill(resp, buf: bytearray, size: int) -> int:
    """Read up to ``size`` bytes of a response into ``buf`` with ``readinto``."""
    view, got = memoryview(buf)[:size], 0
    while got < size:
        n = resp.readinto(view[got:])
        if not n:
            break
        got += n
    return got


def httpx_reader(url: str, ctx: ssl.SSLContext | bool):
    import httpx

    client = httpx.Client(verify=ctx, timeout=30)

    def make():
        def read(off: int, size: int) -> int:
            r = client.get(url, headers={"Range": f"bytes={off}-{off + size - 1}"})
            return len(r.content)
        return read
    return make


def stdlib_reader(url: str, ctx: ssl.SSLContext | None):
    parts = urlsplit(url)

    def make():
        if parts.scheme == "https":
            conn = http.client.HTTPSConnection(parts.hostname, parts.port, context=ctx)
        else:
            conn = http.client.HTTPConnection(parts.hostname, parts.port)
        buf = bytearray(BLOCK)

        def read(off: int, size: int) -> int:
            conn.request("GET", parts.path, headers={"Range": f"bytes={off}-{off + size - 1}"})
            resp = conn.getresponse()
            got = fill(resp, buf, size)
            resp.read()
            return got
        return read
    return make


def urllib3_reader(url: str, cacert: str | None):
    import urllib3

    pool = urllib3.PoolManager(maxsize=32, ca_certs=cacert)

    def make():
        buf = bytearray(BLOCK)

        def read(off: int, size: int) -> int:
            resp = pool.request("GET", url, preload_content=False,
                                headers={"Range": f"bytes={off}-{off + size - 1}"})
            got = fill(resp, buf, size)
            resp.release_conn()
            return got
        return read
    return make


def pycurl_reader(url: str, cacert: str | None):
    import io

    import pycurl

    def make():
        curl = pycurl.Curl()
        curl.setopt(pycurl.URL, url)
        curl.setopt(pycurl.BUFFERSIZE, 512 * 1024)
        if cacert:
            curl.setopt(pycurl.CAINFO, cacert)

        def read(off: int, size: int) -> int:
            out = io.BytesIO()
            curl.setopt(pycurl.RANGE, f"{off}-{off + size - 1}")
            curl.setopt(pycurl.WRITEDATA, out)
            curl.perform()
            return out.tell()
        return read
    return make


def httpx_trio(url: str, ctx: ssl.SSLContext | bool, total: int, workers: int) -> float:
    import httpx
    import trio

    async def main() -> float:
        todo = ranges(total)
        async with httpx.AsyncClient(verify=ctx, timeout=30,
                                     limits=httpx.Limits(max_connections=workers)) as client:
            async def work() -> None:
                while todo:
                    off, size = todo.pop(0)
                    r = await client.get(url, headers={"Range": f"bytes={off}-{off + size - 1}"})
                    assert len(r.content) == size

            start = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for _ in range(workers):
                    nursery.start_soon(work)
            return time.perf_counter() - start
    return trio.run(main)


def httpx_stream(url: str, ctx: ssl.SSLContext | bool, total: int) -> float:
    import httpx

    start = time.perf_counter()
    with httpx.Client(verify=ctx, timeout=30) as client, client.stream("GET", url) as r:
        got = sum(len(chunk) for chunk in r.iter_raw(BLOCK))
    assert got >= total
    return time.perf_counter() - start


def small_requests(url: str, count: int, idle: float, concurrency: int = 1) -> None:
    """Catalog-sized requests (HEAD, and PUT of 4 KiB back to ``url``) on trio, three ways:
    through httpx's own connection machinery (httpcore/h11 on trio sockets), through
    :class:`rucio_fs.http.ApiClient` (on trio sockets, :mod:`rucio_fs.exchange`), and the
    same requests sent by ``http.client`` from a worker thread (the baseline). Prints the
    daemon's CPU per request (``time.process_time``, all threads) and the wall time.
    ``idle``: seconds of quiet before each request, as a first byte meets it (the loop, the
    threads and the CPU caches have gone cold); ``concurrency``: requests in flight at once,
    as write-back uploads are."""
    import functools

    import httpx
    import trio

    from rucio_fs.http import ApiClient, _Pool, _server, _Streams

    body = b"x" * 4096
    parts = urlsplit(url)
    base = f"{parts.scheme}://{parts.netloc}"

    signer = None
    if os.environ.get("AWS_ACCESS_KEY_ID"):  # an S3 server: sign as the daemon does
        import botocore.session
        from rucio_fs.backends.s3.signing import SigV4

        signer = SigV4(botocore.session.get_session().get_credentials(),
                       os.environ.get("AWS_REGION", "us-east-1"))

    httpx_client = httpx.AsyncClient(auth=signer)
    api = ApiClient(base, signer=signer)
    # the old way, with the project's own pool of http.client connections
    streams = _Streams(_Pool(ssl.create_default_context(), 30.0, max_idle=concurrency))
    server = _server(parts.scheme, parts.hostname, parts.port)

    def thread_exchange(method: str, target: str, headers: dict[str, str],
                        content: bytes) -> int:
        conn, response = streams._send(server, method, target, headers, content, None)
        response.read()
        streams._done(server, conn, response, None)
        return response.status

    async def via_httpx(method: str) -> None:
        response = await httpx_client.request(method, url,
                                              content=body if method == "PUT" else None)
        await response.aread()
        assert response.status_code == 200, response.status_code

    async def via_api(method: str) -> None:
        await api.request(method, parts.path, content=body if method == "PUT" else None)

    async def via_thread(method: str) -> None:
        content = body if method == "PUT" else b""
        _, target, wire, _, _ = await api._wire(method, parts.path, {},
                                                {"content": content})
        status = await trio.to_thread.run_sync(functools.partial(
            thread_exchange, method, target, wire, content))
        assert status == 200, status

    async def run(send: Callable, method: str) -> tuple[float, float]:
        cpu = wall = 0.0

        async def worker(n: int) -> None:
            nonlocal cpu, wall
            for _ in range(n):
                if idle:
                    await trio.sleep(idle)
                c, w = time.process_time(), time.perf_counter()
                await send(method)
                if concurrency == 1:
                    cpu += time.process_time() - c
                    wall += time.perf_counter() - w

        c, w = time.process_time(), time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(concurrency):
                nursery.start_soon(worker, count // concurrency)
        if concurrency > 1:  # all requests' CPU, and the wall time per request
            cpu, wall = time.process_time() - c, time.perf_counter() - w
        done = count // concurrency * concurrency
        return cpu / done * 1e6, wall / done * 1e6

    async def main() -> None:
        clients = {"httpx (httpcore/h11 on trio)": via_httpx,
                   "ApiClient (on trio sockets)": via_api,
                   "http.client in a worker thread": via_thread}
        for method in ("PUT", "HEAD"):
            for name, send in clients.items():
                await send(method)  # warm: connections made
                cpu, wall = await run(send, method)
                print(f"{method:4s} {name:31s} {cpu:6.0f} us CPU {wall:6.0f} us wall"
                      + (f" (after {idle * 1000:.0f} ms idle)" if idle else "")
                      + (f" ({concurrency} at once)" if concurrency > 1 else ""), flush=True)
        await httpx_client.aclose()
        await api.aclose()

    trio.run(main)


def signing(count: int, idle: float) -> None:
    """SigV4 of an S3 LIST request and of a presigned GET: botocore's signer against
    ``rucio_fs.backends.s3.signing`` (the daemon's), each after ``idle`` seconds of quiet."""
    import botocore.credentials
    from botocore.auth import S3SigV4Auth, S3SigV4QueryAuth
    from botocore.awsrequest import AWSRequest
    from rucio_fs.backends.s3.signing import SigV4

    creds = botocore.credentials.Credentials("AKIDEXAMPLE", "secret")
    ours = SigV4(creds, "us-east-1")
    url = "http://127.0.0.1:7070/bucket/run/file-{}.dat"
    listing = "/bucket/?list-type=2&prefix=run%2Ffile-{}.dat&max-keys=2&delimiter=%2F"

    def botocore_headers(i: int) -> None:
        request = AWSRequest(method="GET", url="http://127.0.0.1:7070" + listing.format(i))
        S3SigV4Auth(creds.get_frozen_credentials(), "s3", "us-east-1").add_auth(request)

    def botocore_presign(i: int) -> None:
        request = AWSRequest(method="GET", url=url.format(i))
        S3SigV4QueryAuth(creds.get_frozen_credentials(), "s3", "us-east-1",
                         expires=3600).add_auth(request)

    cases = {"headers, botocore": botocore_headers,
             "headers, rucio-fs": lambda i: ours.sign_headers(
                 "GET", "127.0.0.1:7070", listing.format(i), {}),
             "presign, botocore": botocore_presign,
             "presign, rucio-fs": lambda i: ours.presign(url.format(i), 3600)}
    times: dict[str, list[float]] = {name: [] for name in cases}
    for i in range(count):
        for name, sign in cases.items():
            time.sleep(idle)
            start = time.perf_counter()
            sign(i)
            times[name].append((time.perf_counter() - start) * 1e6)
    for name, values in times.items():
        values.sort()
        print(f"{name:18s} median {values[len(values) // 2]:6.0f} us"
              + (f" (after {idle * 1000:.0f} ms idle)" if idle else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("url")
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--workers", default="1,4,8")
    ap.add_argument("--cacert")
    ap.add_argument("--small", type=int, default=0, metavar="N",
                    help="instead: N small requests to URL (a writable object), per client")
    ap.add_argument("--idle", type=float, default=0.0, metavar="SECONDS",
                    help="--small: quiet before each request (e.g. 0.2: a first byte's case)")
    ap.add_argument("--concurrency", type=int, default=1, metavar="C",
                    help="--small: requests in flight at once (e.g. 16: write-back uploads)")
    ap.add_argument("--signing", type=int, default=0, metavar="N",
                    help="instead: N SigV4 signatures per signer (with --idle between)")
    args = ap.parse_args()
    if args.signing:
        signing(args.signing, args.idle)
        return
    if args.small:
        small_requests(args.url, args.small, args.idle, args.concurrency)
        return
    total = args.size_mib << 20
    ctx = ssl.create_default_context(cafile=args.cacert) if args.cacert else None
    mb = total / 1e6

    def show(name: str, fn: Callable[[], float]) -> None:
        try:
            secs = fn()
        except ImportError as exc:
            print(f"{name:34s} not installed ({exc.name})")
            return
        print(f"{name:34s} {mb / secs:8.0f} MB/s", flush=True)

    curl = ["curl", "-sf", "-o", "/dev/null", "-r", f"0-{total - 1}", args.url]
    if args.cacert:
        curl[1:1] = ["--cacert", args.cacert]

    def run_curl() -> float:
        start = time.perf_counter()
        subprocess.run(curl, check=True)
        return time.perf_counter() - start

    show("curl (one stream)", run_curl)
    show("httpx stream (one stream)", lambda: httpx_stream(args.url, ctx or True, total))
    for workers in (int(w) for w in args.workers.split(",")):
        show(f"httpx sync, {workers} threads", lambda w=workers: run_threads(
            httpx_reader(args.url, ctx or True), total, w))
        show(f"httpx async (trio), {workers} tasks",
             lambda w=workers: httpx_trio(args.url, ctx or True, total, w))
        show(f"http.client readinto, {workers} threads", lambda w=workers: run_threads(
            stdlib_reader(args.url, ctx), total, w))
        show(f"urllib3 readinto, {workers} threads", lambda w=workers: run_threads(
            urllib3_reader(args.url, args.cacert), total, w))
        show(f"pycurl, {workers} threads", lambda w=workers: run_threads(
            pycurl_reader(args.url, args.cacert), total, w))


if __name__ == "__main__":
    main()
