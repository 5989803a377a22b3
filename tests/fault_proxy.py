"""A reverse proxy on 127.0.0.1 that breaks answers on purpose, for the network fault tests.

It forwards every request to one upstream (the Rucio server or the WebDAV storage) and, while
a fault is armed for a path, spoils the answer the way real networks and servers do:

* ``drop``:    send the headers and half the body, then close the connection;
* ``stall``:   send the headers and half the body, then hang;
* ``corrupt``: send the whole body with one byte flipped;
* ``error``:   answer 500 with Rucio's error headers instead of forwarding;
* ``short-token``: say a Rucio token expires in 4 s (``X-Rucio-Auth-Token-Expires``);
* ``slowdown``: answer 503 SlowDown as S3 does when it throttles.

The Host header is forwarded as the client sent it, so AWS SigV4 signatures stay valid.

``drop`` also models a short body: the Content-Length promised more than arrives.
"""

from __future__ import annotations

import email.utils
import http.client
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}


class FaultProxy:
    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.faults: list[list] = []  # [kind, path substring, times left (-1: forever)]
        self.requests = 0
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                proxy.forward(self)

            do_POST = do_HEAD = do_PUT = do_DELETE = do_GET

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

    def inject(self, kind: str, match: str = "", times: int = -1) -> None:
        """Spoil the next ``times`` answers (all with -1) whose path contains ``match``."""
        assert kind in ("drop", "stall", "corrupt", "error", "short-token", "slowdown")
        with self.lock:
            self.faults.append([kind, match, times])

    def clear(self) -> None:
        with self.lock:
            self.faults.clear()

    def _peek_fault(self, path: str) -> str | None:
        with self.lock:
            return next((kind for kind, match, left in self.faults
                         if match in path and left != 0), None)

    def _take_fault(self, path: str) -> str | None:
        with self.lock:
            self.requests += 1
            for fault in self.faults:
                kind, match, left = fault
                if match in path and left != 0:
                    fault[2] = left - 1 if left > 0 else left
                    return kind
        return None

    def forward(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else None
        if self._peek_fault(handler.path) == "slowdown":
            self._take_fault(handler.path)
            _answer(handler, 503, {"Content-Type": "application/xml"},
                    b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>SlowDown</Code>"
                    b"<Message>Please reduce your request rate.</Message></Error>")
            return
        if self._peek_fault(handler.path) == "error":
            self._take_fault(handler.path)
            _answer(handler, 500, {"ExceptionClass": "DatabaseException",
                                   "ExceptionMessage": "injected"},
                    b'{"ExceptionClass": "DatabaseException", "ExceptionMessage": "injected"}')
            return
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in HOP_BY_HOP}
        upstream = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            upstream.request(handler.command, handler.path, body=body, headers=headers)
            response = upstream.getresponse()
            data = response.read()
            status, reply_headers = response.status, response.getheaders()
        finally:
            upstream.close()
        fault = self._take_fault(handler.path) if data or status == 200 else None
        assert fault not in ("error", "slowdown")
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
        handler.send_header("Content-Length", str(len(data)))
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


@contextmanager
def fault_proxy(upstream: str) -> Iterator[FaultProxy]:
    proxy = FaultProxy(upstream).start()
    try:
        yield proxy
    finally:
        proxy.stop()
