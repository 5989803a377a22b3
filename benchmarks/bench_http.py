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


def small_requests(url: str, count: int) -> None:
    """Catalog-sized requests (HEAD, and PUT of 4 KiB back to ``url``) one after another on
    trio through httpx with its own transport and with ``http.client`` in a worker thread
    under it: the daemon's CPU per request (``time.process_time``, all threads) and the wall
    time."""
    import functools

    import httpx
    import trio

    from rucio_fs.http import _Pool

    class ThreadedTransport(httpx.AsyncBaseTransport):
        """The candidate: httpx above, ``http.client`` in a worker thread below (the read
        path's pool), each answer read whole."""

        def __init__(self) -> None:
            self.pool = _Pool(ssl.create_default_context(), 30.0, max_idle=16)

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            body = await request.aread()
            status, headers, content = await trio.to_thread.run_sync(
                functools.partial(self.send, request, body))
            return httpx.Response(status, headers=headers, stream=httpx.ByteStream(content),
                                  request=request)

        def send(self, request: httpx.Request, body: bytes) -> tuple[int, list, bytes]:
            url = request.url
            key = (url.scheme, url.host, url.port or 80)
            conn = self.pool.get(*key)
            conn.putrequest(request.method, url.raw_path.decode(), skip_host=True,
                            skip_accept_encoding=True)
            for name, value in request.headers.raw:
                conn.putheader(name, value)
            conn.endheaders(body or None)
            response = conn.getresponse()
            content = response.read()
            self.pool.put(*key, conn)
            return response.status, response.getheaders(), content

    body = b"x" * 4096

    async def run(client: httpx.AsyncClient, method: str) -> tuple[float, float]:
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(count):
            response = await client.request(method, url,
                                             content=body if method == "PUT" else None)
            await response.aread()
            assert response.status_code == 200, response.status_code
        return ((time.process_time() - cpu) / count * 1e6,
                (time.perf_counter() - wall) / count * 1e6)

    signer = None
    if os.environ.get("AWS_ACCESS_KEY_ID"):  # an S3 server: sign as the daemon does
        import botocore.session
        from rucio_fs.backends.s3.signing import SigV4

        signer = SigV4(botocore.session.get_session().get_credentials(),
                       os.environ.get("AWS_REGION", "us-east-1"))

    async def main() -> None:
        clients = {"httpx (httpcore/h11)": httpx.AsyncClient(auth=signer),
                   "httpx over ThreadedTransport": httpx.AsyncClient(
                       transport=ThreadedTransport(), auth=signer)}
        for method in ("PUT", "HEAD"):
            for name, client in clients.items():
                await run(client, method)  # warm: connections made
                cpu, wall = await run(client, method)
                print(f"{method:4s} {name:30s} {cpu:6.0f} us CPU {wall:6.0f} us wall",
                      flush=True)
        for client in clients.values():
            await client.aclose()

    trio.run(main)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("url")
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--workers", default="1,4,8")
    ap.add_argument("--cacert")
    ap.add_argument("--small", type=int, default=0, metavar="N",
                    help="instead: N small requests to URL (a writable object), per client")
    args = ap.parse_args()
    if args.small:
        small_requests(args.url, args.small)
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
