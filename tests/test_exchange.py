"""One-shot requests on trio (``rucio_fs.exchange``, through :class:`ApiClient`): every way an
HTTP/1.1 answer may be framed reads to its own body, a connection is reused only when the
answer before it was read through, and a stall or a cancellation never leaves a connection
whose next answer belongs to another request. Against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import trio

from rucio_fs.errors import Unavailable
from rucio_fs.http import ApiClient, RetryPolicy


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        super().setup()
        with self.server.lock:
            self.server.connections += 1

    def do_HEAD(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "12345")
        self.end_headers()

    def do_PUT(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self._answer(hashlib.md5(body).hexdigest().encode())

    def do_GET(self) -> None:
        kind, _, arg = self.path.strip("/").partition("/")
        if kind == "sized":
            self._answer(arg.encode() * 1000)
        elif kind == "quietly-closed":
            self._answer(arg.encode())
            self.close_connection = True  # no "Connection: close" said
        elif kind == "chunked":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for piece in (arg.encode(), b"-", arg.encode() * 3000):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.write(b"0\r\n\r\n")
        elif kind == "until-closed":
            self.send_response(200)
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(arg.encode() * 500)
            self.close_connection = True
        elif kind == "empty":
            self.send_response(204)
            self.end_headers()
        elif kind == "slow":
            time.sleep(float(arg))
            self._answer(f"slow {arg}".encode())
        elif kind == "stall":  # half an answer, then nothing
            self.send_response(200)
            self.send_header("Content-Length", "100")
            self.end_headers()
            self.wfile.write(b"x" * 10)
            self.wfile.flush()
            time.sleep(3)
            self.close_connection = True

    def _answer(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lock = threading.Lock()
        self.connections = 0


@pytest.fixture
def server() -> Iterator[_Server]:
    server = _Server()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _client(server: _Server, **kwargs: object) -> ApiClient:
    return ApiClient(f"http://127.0.0.1:{server.server_port}", **kwargs)  # type: ignore[arg-type]


def test_every_framing_of_an_answer_reads_to_its_own_body_over_one_connection(server):
    """Sized, chunked, empty (204) and HEAD answers, one after another on a single kept
    connection; an answer read until the server closes ends that connection only."""
    async def main() -> list[tuple[int, bytes]]:
        api = _client(server)
        answers = []
        for method, path in [("GET", "/sized/a"), ("GET", "/chunked/b"), ("GET", "/empty"),
                             ("HEAD", "/anything"), ("GET", "/sized/c"),
                             ("GET", "/until-closed/d"), ("GET", "/sized/e")]:
            response = await api.request(method, path, expect=(200, 204))
            answers.append((response.status_code, response.content))
        await api.aclose()
        return answers

    answers = trio.run(main)
    assert answers == [(200, b"a" * 1000), (200, b"b-" + b"b" * 3000), (204, b""), (200, b""),
                       (200, b"c" * 1000), (200, b"d" * 500), (200, b"e" * 1000)]
    assert server.connections == 2  # a new one only after the answer that closed its own


def test_a_connection_the_server_closed_quietly_is_replaced_without_a_retry(server):
    async def main() -> tuple[list[bytes], int]:
        api = _client(server)
        bodies = []
        for i in range(4):
            bodies.append((await api.request("GET", f"/quietly-closed/{i}")).content)
            await trio.sleep(0.05)  # the server's FIN arrives
        await api.aclose()
        return bodies, api.counters["retries"]

    bodies, retries = trio.run(main)
    assert bodies == [b"0", b"1", b"2", b"3"] and retries == 0
    assert server.connections == 4


def test_a_large_body_arrives_whole(server):
    body = bytes(range(256)) * (3 << 12)  # 3 MiB: written apart from its head

    async def main() -> bytes:
        api = _client(server)
        try:
            return (await api.request("PUT", "/echo", content=body)).content
        finally:
            await api.aclose()

    assert trio.run(main) == hashlib.md5(body).hexdigest().encode()


def test_a_stalled_answer_times_out_and_is_retried_a_bounded_number_of_times(server):
    async def main() -> tuple[float, int]:
        api = _client(server, timeout=0.3, retry=RetryPolicy(attempts=2, backoff=0.05))
        start = trio.current_time()
        with pytest.raises(Unavailable, match="ReadTimeout after 2 attempts"):
            await api.request("GET", "/stall")
        took = trio.current_time() - start
        await api.aclose()
        return took, api.counters["requests"]

    took, requests = trio.run(main)
    assert requests == 2 and took < 2.0


def test_a_cancelled_request_never_hands_its_answer_to_the_next(server):
    """The connection of a request given up while its answer was on the way is closed: the
    next request on the client gets its own answer, not the late one."""
    async def main() -> bytes:
        api = _client(server)
        await api.request("GET", "/sized/warm")  # one kept connection to reuse
        with trio.move_on_after(0.1):
            await api.request("GET", "/slow/0.4")
        await trio.sleep(0.5)  # the late answer has arrived on that connection
        content = (await api.request("GET", "/sized/z")).content
        await api.aclose()
        return content

    assert trio.run(main) == b"z" * 1000
