"""One-shot requests on trio (``rucio_fs.exchange``, through :class:`ApiClient`): every way an
HTTP/1.1 answer may be framed reads to its own body, a connection is reused only when the
answer before it was read through, and a stall or a cancellation never leaves a connection
whose next answer belongs to another request. Against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import contextlib
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


#: Raw answers of the scripted server, by request path (each ends its connection's use
#: as noted).
RAW_ANSWERS = {
    "/interim": b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nafter",
    "/chunk-extras": (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                      b"3;name=value\r\nabc\r\n2\r\nde\r\n0\r\nTrailer-Field: x\r\n\r\n"),
    "/http10": b"HTTP/1.0 200 OK\r\nContent-Length: 4\r\n\r\nold.",
    "/two-lengths": b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
    "/not-http": b"SSH-2.0-OpenSSH_9.2\r\n\r\n",
    "/folded": b"HTTP/1.1 200 OK\r\nX-A: one\r\n two\r\nContent-Length: 0\r\n\r\n",
    "/bad-chunk": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
    "/long-chunk": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n0\r\n\r\n",
    "/short": b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this",
    # kept open, but the next request on it is read and never answered
    "/then-drop": b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nkept",
    "/fresh": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfresh",
    # said, but the connection stays open a while: any request sent on it is counted
    "/says-close": b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 3\r\n\r\nbye",
}


@pytest.fixture
def scripted() -> Iterator[tuple[int, list[int]]]:
    """A TCP server on 127.0.0.1 answering each request with ``RAW_ANSWERS[path]`` (then
    closing when the answer says so or is malformed): (port, requests per connection)."""
    import socket

    listener = socket.create_server(("127.0.0.1", 0))
    per_connection: list[int] = []

    def serve(conn: socket.socket) -> None:
        index = len(per_connection)
        per_connection.append(0)
        data = b""
        drop_next = False
        with conn:
            while True:
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, _, data = data.partition(b"\r\n\r\n")
                per_connection[index] += 1
                if drop_next:
                    return
                path = head.split(b" ")[1].decode()
                drop_next = path == "/then-drop"
                answer = RAW_ANSWERS[path]
                conn.sendall(answer)
                if path == "/says-close":
                    conn.settimeout(0.5)
                    with contextlib.suppress(OSError):
                        per_connection[index] += bool(conn.recv(65536))
                    return
                if path not in ("/interim", "/chunk-extras", "/then-drop", "/fresh"):
                    return

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield listener.getsockname()[1], per_connection
    finally:
        listener.close()


def test_interim_answers_chunk_extensions_and_trailers_are_read_past(scripted):
    port, per_connection = scripted

    async def main() -> list[bytes]:
        api = ApiClient(f"http://127.0.0.1:{port}")
        bodies = [(await api.request("GET", path)).content
                  for path in ("/interim", "/chunk-extras", "/interim", "/http10", "/interim")]
        await api.aclose()
        return bodies

    assert trio.run(main) == [b"after", b"abcde", b"after", b"old.", b"after"]
    # kept across the first three; an HTTP/1.0 answer ends its connection
    assert per_connection == [4, 1]


@pytest.mark.parametrize("path", ["/two-lengths", "/not-http", "/folded", "/bad-chunk",
                                  "/long-chunk", "/short"])
def test_an_answer_that_breaks_the_framing_is_a_protocol_error_never_a_body(scripted, path):
    port, per_connection = scripted

    async def main() -> None:
        api = ApiClient(f"http://127.0.0.1:{port}", retry=RetryPolicy(attempts=2, backoff=0.01))
        try:
            with pytest.raises(Unavailable, match="RemoteProtocolError after 2 attempts"):
                await api.request("GET", path)
        finally:
            await api.aclose()

    trio.run(main)
    assert per_connection == [1, 1]


def test_a_header_that_would_break_the_request_is_refused_before_sending(server):
    from rucio_fs.errors import BadRequestTarget

    async def main() -> int:
        api = _client(server)
        with pytest.raises(BadRequestTarget, match="x-smuggled"):
            await api.request("GET", "/sized/a", headers={"x-smuggled": "a\r\nX-Other: b"})
        await api.aclose()
        return api.counters["retries"]

    assert trio.run(main) == 0
    assert server.connections == 0


def test_a_kept_connection_dropped_as_the_request_arrives_is_replaced_at_once(scripted):
    """The server took the request on a kept connection and closed it without a byte of
    answer: the request goes again on a new connection, at once, not as a retry."""
    port, per_connection = scripted

    async def main() -> tuple[list[bytes], int]:
        api = ApiClient(f"http://127.0.0.1:{port}")
        bodies = [(await api.request("GET", path)).content for path in ("/then-drop", "/fresh")]
        await api.aclose()
        return bodies, api.counters["retries"]

    assert trio.run(main) == ([b"kept", b"fresh"], 0)
    assert per_connection == [2, 1]


def test_an_answer_that_says_close_ends_its_connection(scripted):
    port, per_connection = scripted

    async def main() -> list[bytes]:
        api = ApiClient(f"http://127.0.0.1:{port}")
        bodies = [(await api.request("GET", path)).content for path in ("/says-close", "/fresh")]
        await api.aclose()
        return bodies

    assert trio.run(main) == [b"bye", b"fresh"]
    assert per_connection == [1, 1]
