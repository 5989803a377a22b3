"""A reverse proxy on 127.0.0.1 that breaks answers on purpose, for the network fault tests.

It forwards every request to one upstream (the Rucio server or the WebDAV storage) and, while
a fault is armed for a path, spoils the answer the way real networks and servers do:

* ``drop``:    send the headers and half the body, then close the connection;
* ``stall``:   send the headers and half the body, then hang;
* ``corrupt``: send the whole body with one byte flipped;
* ``error``:   answer 500 with Rucio's error headers instead of forwarding;
* ``short-token``: say a Rucio token expires in 4 s (``X-Rucio-Auth-Token-Expires``);
* ``slowdown``: answer 503 SlowDown as S3 does when it throttles;
* ``deny``: answer 403 AccessDenied as S3 does for credentials that may not do it;
* ``fake-ok``: answer 200 without forwarding, as a server whose retry is answered with success
  although the work failed (an S3 ``ETag`` header for a PUT, a completion body for a POST);
* ``lost-ok``: forward (the server does the work), then answer 500: a success the client never
  hears of;
* ``late``: forward after :data:`LATE` seconds, as a busy server answers.

A fault may be limited to one HTTP method (``inject(..., method="POST")``). Its ``match`` is
looked for in the request's path, its body (an iRODS form's ``op=...``) and its headers,
each written ``name: value`` with the name in lower case (the iRODS HTTP API's write sends
its op as ``irods-api-request-op: write``).

Every armed fault must fire: a fault with a number of ``times`` must be used up, one armed
for ever must fire at least once. :func:`fault_proxy` fails the test at its end otherwise (a
test whose fault never fired tested the happy path under another name).

The Host header is forwarded as the client sent it, so AWS SigV4 signatures stay valid.

``drop`` also models a short body: the Content-Length promised more than arrives. A chunked
request body (a streamed upload) is read whole and forwarded with its length.
"""

from __future__ import annotations

import email.utils
import http.client
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}
KINDS = ("drop", "stall", "corrupt", "error", "short-token", "slowdown", "deny", "fake-ok",
         "lost-ok", "late")
#: Seconds a ``late`` answer waits before the request is forwarded.
LATE = 0.3
#: The faults answered with an S3 error instead of forwarding: (status, code, message).
S3_ERRORS = {"slowdown": (503, "SlowDown", "Please reduce your request rate."),
             "deny": (403, "AccessDenied", "Access Denied")}


@dataclass(eq=False)
class Fault:
    """One armed fault: what it does, which requests it spoils, how often it did."""

    kind: str
    match: str
    #: Answers still to spoil (-1: every one).
    left: int
    #: Only requests of this method ("": any).
    method: str
    #: How many answers it spoiled.
    hits: int = 0

    @property
    def fired_enough(self) -> bool:
        """Used up (a fault armed for N answers), or used at all (one armed for ever)."""
        return self.hits > 0 and self.left <= 0

    def __str__(self) -> str:
        times = "for ever" if self.left < 0 else f"{self.hits} of {self.hits + self.left} times"
        return (f"{self.kind} on {self.method or 'any'} {self.match!r}: fired {times}"
                if self.hits else f"{self.kind} on {self.method or 'any'} {self.match!r}: "
                "never fired")


class FaultProxy:
    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        #: The armed faults, and those cleared (kept to check that each fired).
        self.faults: list[Fault] = []
        self.cleared: list[Fault] = []
        self.requests = 0
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                proxy.forward(self)

            do_POST = do_HEAD = do_PUT = do_DELETE = do_MOVE = do_GET

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def inject(self, kind: str, match: str = "", times: int = -1, method: str = "") -> Fault:
        """Spoil the next ``times`` answers (all with -1) to requests whose path, body or
        headers contain ``match`` (and whose method is ``method``, if given)."""
        assert kind in KINDS, kind
        assert times != 0, "a fault armed for no answer cannot fire"
        fault = Fault(kind, match, times, method)
        with self.lock:
            self.faults.append(fault)
        return fault

    def clear(self) -> None:
        """Disarm every fault (they still count for :meth:`unfired`)."""
        with self.lock:
            self.cleared.extend(self.faults)
            self.faults.clear()

    def unfired(self) -> list[Fault]:
        """Faults armed in this proxy's life that did not fire as often as armed."""
        with self.lock:
            return [f for f in self.cleared + self.faults if not f.fired_enough]

    def _find(self, method: str, path: str, body: bytes, headers: str) -> Fault | None:
        return next((fault for fault in self.faults
                     if fault.left != 0 and fault.method in ("", method)
                     and _matches(fault.match, path, body, headers)), None)

    def _peek_fault(self, method: str, path: str, body: bytes, headers: str) -> str | None:
        with self.lock:
            fault = self._find(method, path, body, headers)
            return fault.kind if fault is not None else None

    def _take_fault(self, method: str, path: str, body: bytes, headers: str) -> str | None:
        with self.lock:
            self.requests += 1
            fault = self._find(method, path, body, headers)
            if fault is None:
                return None
            fault.hits += 1
            if fault.left > 0:
                fault.left -= 1
            return fault.kind

    def forward(self, handler: BaseHTTPRequestHandler) -> None:
        if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body: bytes | None = _chunked_body(handler)
        else:
            length = int(handler.headers.get("Content-Length") or 0)
            body = handler.rfile.read(length) if length else None
        method, path, sent = handler.command, handler.path, body or b""
        said = "\n".join(f"{k.lower()}: {v}" for k, v in handler.headers.items())
        request = (method, path, sent, said)
        before = self._peek_fault(*request)
        if before == "fake-ok":
            self._take_fault(*request)
            _fake_ok(handler, sent)
            return
        if before in S3_ERRORS:
            self._take_fault(*request)
            _s3_error(handler, *S3_ERRORS[before])
            return
        if before == "error":
            self._take_fault(*request)
            _answer(handler, 500, {"ExceptionClass": "DatabaseException",
                                   "ExceptionMessage": "injected"},
                    b'{"ExceptionClass": "DatabaseException", "ExceptionMessage": "injected"}')
            return
        if before == "late":
            self._take_fault(*request)
            time.sleep(LATE)
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in HOP_BY_HOP}
        upstream = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            upstream.request(handler.command, handler.path, body=body, headers=headers)
            response = upstream.getresponse()
            data = response.read()
            status, reply_headers = response.status, response.getheaders()
        finally:
            upstream.close()
        fault = (self._take_fault(*request)
                 if before != "late" and (data or 200 <= status < 300) else None)
        assert fault not in ("error", "slowdown", "deny", "fake-ok", "late")
        if fault == "lost-ok":
            _s3_error(handler, 500, "InternalError", "injected after the work was done")
            return
        if fault == "corrupt":
            middle = len(data) // 2
            data = data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1:]
        if fault == "short-token":
            expires = email.utils.formatdate(time.time() + 4, usegmt=True)
            reply_headers = [(k, expires if k.lower() == "x-rucio-auth-token-expires" else v)
                             for k, v in reply_headers]
        handler.send_response(status)
        for key, value in reply_headers:
            if key.lower() not in HOP_BY_HOP:
                handler.send_header(key, value)
        if handler.command == "HEAD":  # the size of what a GET would send, as upstream said
            length = response.getheader("Content-Length") or "0"
        else:
            length = str(len(data))
        handler.send_header("Content-Length", length)
        if fault in ("drop", "stall"):
            handler.send_header("Connection", "close")
        handler.end_headers()
        if handler.command == "HEAD":
            return
        if fault in ("drop", "stall"):
            handler.wfile.write(data[:len(data) // 2])
            handler.wfile.flush()
            if fault == "stall":
                time.sleep(3600)
            handler.close_connection = True
            return
        handler.wfile.write(data)


def _chunked_body(handler: BaseHTTPRequestHandler) -> bytes:
    """A chunked request body, whole (it is forwarded with its length)."""
    pieces = []
    while True:
        size = int(handler.rfile.readline().split(b";")[0].strip() or b"0", 16)
        if size == 0:
            while handler.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return b"".join(pieces)
        pieces.append(handler.rfile.read(size))
        handler.rfile.readline()


def _matches(match: str, path: str, body: bytes, headers: str) -> bool:
    """A fault's ``match`` is found in the request's path, body or headers."""
    return (match in path
            or (bool(match) and (match.encode() in body or match.lower() in headers)))


def _fake_ok(handler: BaseHTTPRequestHandler, body: bytes) -> None:
    """A 200 as the server would send it (S3, or the iRODS HTTP API), for work never done."""
    import hashlib

    if "/data-objects" in handler.path:
        _answer(handler, 200, {"Content-Type": "application/json"},
                b'{"irods_response": {"status_code": 0}}')
        return
    etag = f'"{hashlib.md5(body).hexdigest()}"'
    if handler.command == "POST" and "uploadId=" in handler.path:
        _answer(handler, 200, {"Content-Type": "application/xml"},
                b"<?xml version='1.0' encoding='UTF-8'?><CompleteMultipartUploadResult>"
                b"<ETag>&quot;0123456789abcdef0123456789abcdef-2&quot;</ETag>"
                b"</CompleteMultipartUploadResult>")
    else:
        _answer(handler, 200, {"ETag": etag}, b"")


def _answer(handler: BaseHTTPRequestHandler, status: int, headers: dict[str, str],
            body: bytes) -> None:
    """An injected answer instead of the upstream's (no body for HEAD)."""
    handler.send_response(status)
    for key, value in headers.items():
        handler.send_header(key, value)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    if handler.command != "HEAD":
        handler.wfile.write(body)


def _s3_error(handler: BaseHTTPRequestHandler, status: int, code: str, message: str) -> None:
    """An S3 error answer instead of the upstream's."""
    _answer(handler, status, {"Content-Type": "application/xml"},
            f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code>"
            f"<Message>{message}</Message></Error>".encode())


class FaultNeverFired(AssertionError):
    """A test armed a fault that its requests never met."""


@contextmanager
def fault_proxy(upstream: str) -> Iterator[FaultProxy]:
    """A started :class:`FaultProxy`; at the end (unless the test failed already), every
    fault armed must have fired as often as armed."""
    proxy = FaultProxy(upstream).start()
    try:
        yield proxy
    finally:
        proxy.stop()
    unfired = proxy.unfired()
    if unfired:
        raise FaultNeverFired("armed faults did not fire: " + "; ".join(map(str, unfired)))
