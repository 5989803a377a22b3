"""HTTP plumbing shared by every backend that speaks HTTP: one way to retry, to turn answers
into typed errors, to stream ndjson and to read byte ranges.

Two clients, chosen by measurement (``benchmarks/bench_http.py``, loopback, 1 MiB ranges):

* :class:`ApiClient` for catalog requests: JSON, XML pages, ndjson listings, auth. A
  one-shot request is put together here when it is a path and a body (by httpx when it has
  JSON or form fields) and exchanged on the event loop by :mod:`rucio_fs.exchange` (trio
  sockets, keep-alive connections). httpx's own connection machinery cost 3-4 times
  the CPU per request, and ``http.client`` from a worker thread cost more than the exchange
  whenever many requests were in flight, the GIL going back and forth with the event loop
  (``bench_http.py --small N --concurrency 16``). An ndjson listing streams through
  ``http.client`` in a thread of its own (:class:`_Stream`), parsed as it arrives.
* :class:`RangeReader` (the standard library's ``http.client`` in worker threads, reading into
  one buffer with ``readinto``) for data. httpx moves 0.37-0.45 GB/s here whatever the number of
  threads; ``http.client`` moved 3.7-4.2 GB/s (urllib3 1.7-2.3, pycurl 2.1-3.4, curl 2.2),
  because the bytes never pass through Python-level chunking. Its only missing piece, a pool of
  keep-alive connections, is the few lines of :class:`_Pool`.

Contracts: a truncated or malformed listing raises :class:`Unavailable`, never ends early; a
range read returns what the server sent for that range (fewer bytes only when the object is
shorter), retrying dropped connections, stalls and 5xx with backoff a bounded number of times.

Why one module of this size: it is the plugin API's whole HTTP surface (what a backend
imports is in one place): the catalog client, the data reader and the streamed upload share
the retry policy, the connection pools and the error mapping.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import json
import logging
import math
import os
import queue
import random
import select
import socket
import ssl
import threading
import time
import urllib.request
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import httpx
import trio

from rucio_fs.errors import (
    AlreadyExists,
    BadRequestTarget,
    NotFound,
    PermissionDenied,
    RucioFsError,
    Unauthorized,
    Unavailable,
)
from rucio_fs.exchange import Exchanges

log = logging.getLogger(__name__)
# httpx logs every request at INFO: far too much for a daemon's log.
logging.getLogger("httpx").setLevel(logging.WARNING)

#: Statuses worth asking again: the server or something in front of it is busy or restarting.
RETRYABLE = frozenset({408, 429, 500, 502, 503, 504})
#: Answers that send the client elsewhere (followed by httpx).
REDIRECTS = frozenset({301, 302, 303, 307, 308})
#: One-shot requests of one client at once (and idle connections kept per server).
DIRECT_REQUESTS = 32
#: Idle connections kept for streamed answers.
STREAMS_KEPT = 8
#: Range reads of one reader in flight at once. Strided read-ahead keeps the next pieces of
#: several reader threads in flight together, each waiting on the network, not the CPU.
RANGE_THREADS = 48
#: The most bytes a streamed answer hands over at once.
STREAM_CHUNK = 1 << 16


@dataclass(frozen=True)
class RetryPolicy:
    """``attempts`` tries in all, sleeping ``backoff`` doubled each time (with jitter)."""

    attempts: int = 4
    backoff: float = 0.1
    max_backoff: float = 2.0

    def delays(self) -> Iterable[float]:
        """The sleeps before the 2nd, 3rd, ... attempt."""
        delay = self.backoff
        for _ in range(self.attempts - 1):
            yield delay * (0.5 + random.random())
            delay = min(delay * 2, self.max_backoff)


def quote_path(text: str) -> str:
    """A literal path (any characters: space, ``%``, unicode, a tab) as a URL path: every byte
    but unreserved characters and ``/`` percent-encoded from UTF-8. The one way every backend
    turns names into request paths (S3 signs exactly this form)."""
    return quote(text, safe="/~")


def url_from_literal(url: str) -> str:
    """``scheme://host[:port]`` followed by a literal path (as catalogs store PFNs, which
    are never percent-encoded), as a URL that can be sent."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    host, slash, path = rest.partition("/")
    return f"{scheme}://{host}{slash}{quote_path(path)}" if slash else url


def _check_sendable(url: str) -> None:
    """BadRequestTarget unless ``url`` can go on an HTTP request line as it is (checked
    before ``urlsplit``, which silently drops tabs and newlines). Permanent: a retry would
    send the same."""
    if not url.isascii() or not url.isprintable() or " " in url:
        raise BadRequestTarget(f"{_redact(url)!r}: cannot be sent as an HTTP request "
                               "(unencoded characters in it)")


def tls_context(ca: str | None = None, cert: str | None = None,
                key: str | None = None) -> ssl.SSLContext:
    """Verifying TLS context: system CAs, or ``ca`` (a PEM file or a hashed directory), with
    the client certificate ``cert`` (and ``key``) when given: PermissionDenied when it cannot
    be used (not PEM, a key that does not match, gone)."""
    if ca and os.path.isdir(ca):
        ctx = ssl.create_default_context(capath=ca)
    else:
        ctx = ssl.create_default_context(cafile=ca)
    if cert:
        try:
            ctx.load_cert_chain(cert, key)
        except (ssl.SSLError, OSError) as exc:
            reason = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or exc
            raise PermissionDenied(f"the client certificate cannot be used ({reason})") from None
    return ctx


def status_error(status: int, what: str, detail: str = "") -> RucioFsError:
    """The typed error for an unexpected HTTP status."""
    message = f"{what}: HTTP {status}" + (f" {detail}" if detail else "")
    if status == 404:
        return NotFound(message)
    if status == 401:
        return Unauthorized(message)
    if status == 403:
        return PermissionDenied(message)
    if status == 409:
        return AlreadyExists(message)
    if status == 412:
        return Unavailable(f"{message} (it changed on the server since it was listed)")
    return Unavailable(message)


class TokenAuth(ABC):
    """How an :class:`ApiClient` or a :class:`RangeReader` authenticates: one renewable token
    (Rucio's, iRODS's).

    The token is renewed ahead of its expiry (``margin`` before, at most half its lifetime)
    and once the server refuses it. Callers that found the same token stale share one renewal
    (a lock, then a check that nobody replaced the token meanwhile), so a burst of 401s from
    concurrent requests costs one login. Subclasses say how a token is obtained and sent.
    """

    #: Seconds before the expiry at which the token is renewed.
    margin: float = 300.0

    def __init__(self, token: str = "") -> None:
        self.renewals = 0
        self._token = token
        self._renew_at = math.inf
        self._lock = trio.Lock()

    @property
    def token(self) -> str:
        return self._token

    @abstractmethod
    def header(self) -> dict[str, str]:
        """The headers that send the current token (synchronous: worker threads use it)."""

    @abstractmethod
    async def obtain(self, refused: bool) -> tuple[str, float]:
        """A new token and its expiry (seconds since the epoch; ``math.inf``: unknown).
        ``refused``: the server just refused :attr:`token`. Raise PermissionDenied when no
        better token can be had."""

    async def headers(self) -> dict[str, str]:
        if not self._token or time.time() > self._renew_at:
            await self.renew(self._token)
        return self.header()

    async def refresh(self, sent: Mapping[str, str]) -> None:
        """The server refused the token that request headers ``sent`` carried (401): get a
        new one, unless a newer one is there already (concurrent requests refused together
        renew once)."""
        token = self._token
        if any(sent.get(name) != value for name, value in self.header().items()):
            return  # renewed since that request was sent
        await self.renew(token, refused=True)

    async def renew(self, stale: str, refused: bool = False) -> None:
        """Replace token ``stale`` unless somebody already did (or it is still fresh and
        was not refused)."""
        async with self._lock:
            if self._token != stale:
                return
            if not refused and self._token and time.time() <= self._renew_at:
                return
            self.renewals += 1
            self._token, expires = await self.obtain(refused)
            left = expires - time.time()
            self._renew_at = expires - min(self.margin, max(left, 0.0) / 2)


class ApiClient:
    """Catalog requests with retries, auth and typed errors (async, trio).

    ``describe`` turns an error response into a one-line detail (e.g. the server's own
    exception message). Connection failures, timeouts and :data:`RETRYABLE` statuses are
    retried per ``retry``; a 401 refreshes the credentials once and tries again. ``signer``
    signs every request (and every retry) itself, for schemes like AWS SigV4.
    """

    def __init__(self, base_url: str, *, verify: ssl.SSLContext | bool = True,
                 timeout: float = 30.0, retry: RetryPolicy | None = None,
                 auth: TokenAuth | None = None,
                 describe: Callable[[httpx.Response], str] | None = None,
                 headers: dict[str, str] | None = None,
                 signer: httpx.Auth | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.retry = retry or RetryPolicy()
        self.auth = auth
        self.describe = describe or (lambda r: "")
        self.counters: Counter[str] = Counter()
        self._client = httpx.AsyncClient(verify=verify, timeout=timeout, headers=headers,
                                         follow_redirects=True, auth=signer)
        self._signer = signer
        #: One-shot requests are exchanged on trio and streamed answers read in a thread,
        #: unless a proxy from the environment applies (httpx honours it).
        self._direct: Exchanges | None = None
        self._streams: _Streams | None = None
        if not _environment_proxy(self.base_url):
            if isinstance(verify, ssl.SSLContext):
                context = verify
            elif self.base_url.startswith("https:"):  # (loading the CAs costs: only if used)
                context = tls_context()
                if not verify:
                    context.check_hostname = False
                    context.verify_mode = ssl.CERT_NONE
            else:
                context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # never used: plain http
            self._direct = Exchanges(context, timeout, limit=DIRECT_REQUESTS)
            self._streams = _Streams(_Pool(context, timeout, max_idle=STREAMS_KEPT))
        base = urlsplit(self.base_url)
        self._endpoint = _server(base.scheme, base.hostname, base.port)
        self._host_header = base.netloc
        self._base_path = base.path.rstrip("/")
        #: The client's own headers (and httpx's defaults), but no compression.
        self._default_headers = {k.lower(): v for k, v in self._client.headers.items()
                                 if k.lower() != "accept-encoding"}

    async def aclose(self) -> None:
        await self._client.aclose()
        if self._direct is not None:
            self._direct.close()
        if self._streams is not None:
            self._streams.pool.close()

    async def request(self, method: str, path: str, *, expect: Iterable[int] = (200,),
                      what: str = "", **kwargs: Any) -> httpx.Response:
        """One request whose whole body is read; raises a typed error unless ``expect``-ed."""
        expected = frozenset(expect)

        extra_headers = kwargs.pop("headers", None)
        sent: dict[str, str] = {}  # the credentials the last try sent (a 401 renews them)

        async def once() -> httpx.Response:
            headers = await self._headers({"headers": extra_headers})
            sent.clear()
            sent.update(headers)
            if self._direct is not None:
                response = await self._send_direct(method, path, headers, dict(kwargs))
                if response is not None:
                    return response
            response = await self._client.request(method, self.base_url + path, **kwargs,
                                                  headers=headers)
            await response.aread()
            _forget_body(response)
            return response

        response = await self._with_retries(once, what or f"{method} {path}", sent)
        if response.status_code not in expected:
            raise status_error(response.status_code, what or f"{method} {path}",
                               self.describe(response))
        return response

    async def _send_direct(self, method: str, path: str, headers: dict[str, str],
                           kwargs: dict[str, Any]) -> httpx.Response | None:
        """One exchange on trio (:mod:`rucio_fs.exchange`), the answer handed back as an
        httpx response; None for a redirect (the caller then sends the request the httpx
        way, which follows it)."""
        assert self._direct is not None
        endpoint, target, wire, body, timeout = await self._wire(method, path, headers, kwargs)
        status, answer_headers, content = await self._direct.exchange(
            endpoint, method, target, wire, body, timeout)
        if status in REDIRECTS:
            return None
        return httpx.Response(status, headers=answer_headers, content=content)

    async def _wire(self, method: str, path: str, headers: dict[str, str],
                    kwargs: dict[str, Any]) -> tuple[tuple[str, str, int], str,
                                                     dict[str, str], bytes | bytearray |
                                                     memoryview, float | None]:
        """What goes on the wire for a request: (server, target, headers, body, timeout).

        A request of a path and at most a body (every S3 request) is put together here and
        signed by the signer's ``sign_headers``; one with ``json``, ``data`` or ``params``
        is built (and signed) by httpx first (building an ``httpx.Request`` alone costs
        0.27 ms: URL parsing)."""
        timeout = kwargs.pop("timeout", None)
        if set(kwargs) <= {"content"} and (self._signer is None
                                           or hasattr(self._signer, "sign_headers")):
            body: bytes | bytearray | memoryview = kwargs.get("content") or b""
            target = self._base_path + path
            wire = dict(self._default_headers)
            wire["host"] = self._host_header
            for name, value in headers.items():
                wire[name.lower()] = value
            if body or method in ("POST", "PUT"):
                wire["content-length"] = str(len(body))
            if self._signer is not None:
                wire.update(self._signer.sign_headers(  # type: ignore[attr-defined]
                    method, self._host_header, target, wire))
            return self._endpoint, target, wire, body, timeout
        request = self._client.build_request(method, self.base_url + path,
                                             headers=headers, **kwargs)
        request.headers.pop("accept-encoding", None)  # bodies as sent: nothing to decode
        if self._signer is not None:  # a signer of one step (SigV4)
            request = next(self._signer.auth_flow(request))
        body = await request.aread()
        url = request.url
        return (_server(url.scheme, url.host, url.port), url.raw_path.decode("ascii"),
                dict(request.headers.items()), body, timeout)

    async def json(self, method: str, path: str, **kwargs: Any) -> Any:
        response = await self.request(method, path, **kwargs)
        try:
            return response.json()
        except ValueError:
            raise Unavailable(f"{kwargs.get('what') or path}: answer is not JSON") from None

    async def ndjson(self, method: str, path: str, *, what: str = "",
                     **kwargs: Any) -> AsyncIterator[Any]:
        """The JSON values of a newline-delimited JSON answer, parsed as they arrive.

        A stream that breaks off (an incomplete chunked body, a reset) or carries a line that
        is not JSON raises :class:`Unavailable`: a listing is complete or it is an error.
        """
        what = what or f"{method} {path}"
        extra_headers = kwargs.pop("headers", None)
        failure = ""
        for attempt, delay in enumerate([0.0, *self.retry.delays()]):
            await trio.sleep(delay)
            yielded = [False]
            try:
                headers = await self._headers({"headers": extra_headers})
                async with self._answer(method, path, headers, kwargs) as answer:
                    self.counters["requests"] += 1
                    if answer.status == 401 and self.auth and attempt == 0:
                        await self.auth.refresh(answer.sent)
                        continue
                    if answer.status in RETRYABLE:
                        self.counters["retries"] += 1
                        failure = f"HTTP {answer.status}"
                        continue
                    if answer.status != 200:
                        raise status_error(answer.status, what, self.describe(
                            await answer.whole()))
                    async for value in _json_lines(answer.chunks, what, yielded):
                        yield value
                    return
            except httpx.TransportError as exc:
                if yielded[0]:
                    raise Unavailable(f"{what}: stream broken after partial answer "
                                      f"({type(exc).__name__})") from None
                self.counters["retries"] += 1
                failure = type(exc).__name__
        raise Unavailable(f"{what}: {failure or 'no answer'} after {self.retry.attempts} attempts")

    @contextlib.asynccontextmanager
    async def _answer(self, method: str, path: str, headers: dict[str, str],
                      kwargs: dict[str, Any]) -> AsyncIterator[_Answer]:
        """A request's answer whose body is read as it arrives: through ``http.client`` in a
        thread of its own (see :class:`_Stream`), else (a proxy from the environment, or a
        redirect, which httpx follows) through httpx."""
        if self._streams is not None:
            stream = _Stream(self._streams, *await self._wire(method, path, headers,
                                                             dict(kwargs)), method=method)
            try:
                status, answer_headers = await stream.head()
                if status not in REDIRECTS:
                    async def whole() -> httpx.Response:
                        return httpx.Response(status, headers=answer_headers,
                                              content=await stream.body())

                    yield _Answer(status, headers, stream.chunks(), whole)
                    return
            finally:
                stream.close()
        async with self._client.stream(method, self.base_url + path, **kwargs,
                                       headers=headers) as response:
            async def read_whole() -> httpx.Response:
                await response.aread()
                return response

            yield _Answer(response.status_code, response.request.headers,
                          response.aiter_bytes(), read_whole)

    async def _headers(self, kwargs: dict[str, Any]) -> dict[str, str]:
        headers = dict(kwargs.pop("headers", None) or {})
        if self.auth:
            headers.update(await self.auth.headers())
        return headers

    async def _with_retries(self, once: Callable[[], Awaitable[httpx.Response]],
                            what: str, sent: Mapping[str, str]) -> httpx.Response:
        refreshed = False
        delays = iter(self.retry.delays())
        sends = 0
        while True:
            failure: str
            try:
                self.counters["requests"] += 1
                sends += 1
                response = await once()
                response.extensions[SENDS] = sends
            except httpx.TransportError as exc:
                if untrusted_certificate(exc):
                    raise Unavailable(f"{what}: {certificate_advice(exc)}") from None
                failure = type(exc).__name__
            else:
                if response.status_code == 401 and self.auth and not refreshed:
                    refreshed = True
                    await self.auth.refresh(sent)
                    continue
                if response.status_code not in RETRYABLE:
                    return response
                failure = f"HTTP {response.status_code} {self.describe(response)}".strip()
            delay = next(delays, None)
            if delay is None:
                raise Unavailable(f"{what}: {failure} after {self.retry.attempts} attempts")
            self.counters["retries"] += 1
            await trio.sleep(delay)


#: The key of a response's ``extensions`` that says how many times its request was sent.
SENDS = "rucio_fs.sends"


def sent_once(response: httpx.Response) -> bool:
    """Whether the answer is to the request's first send: no earlier try (failed, timed out,
    refused for credentials) may have done or half-done the work before it. Only an
    :class:`ApiClient` answer can say so: any other is not taken as sent once."""
    return response.extensions.get(SENDS) == 1


def _forget_body(response: httpx.Response) -> None:
    """Let go of the request body once it is sent. httpx keeps a request and its response in
    a reference cycle, so an upload's part stayed in memory until the cyclic garbage collector
    ran (which counts objects, not bytes): 32 MiB parts took the daemon to 600 MB."""
    request = response.request  # httpx has no public way to drop the body
    if getattr(request, "_content", b""):
        request._content = b""
    if isinstance(request.stream, httpx.ByteStream):
        request.stream._stream = b""


def client_counters(api: ApiClient | None, reader: RangeReader | None) -> Counter[str]:
    """A backend's request counters: ``api_*`` of its catalog client, ``data_*`` of its
    data reader."""
    counters: Counter[str] = Counter()
    if api is not None:
        counters.update({f"api_{k}": v for k, v in api.counters.items()})
    if reader is not None:
        counters.update({f"data_{k}": v for k, v in reader.counters.items()})
    return counters


def _parse_line(line: bytes, what: str) -> Any:
    try:
        return json.loads(line)
    except ValueError:
        raise Unavailable(f"{what}: malformed line in streamed answer: {line[:80]!r}") from None


class _Pool:
    """Idle keep-alive ``http.client`` connections per (scheme, host, port); thread-safe."""

    def __init__(self, context: ssl.SSLContext, timeout: float, max_idle: int) -> None:
        self.context = context
        self.timeout = timeout
        self.max_idle = max_idle
        self._idle: dict[tuple[str, str, int], list[http.client.HTTPConnection]] = {}
        self._lock = threading.Lock()

    def get(self, scheme: str, host: str, port: int) -> http.client.HTTPConnection:
        with self._lock:
            idle = self._idle.get((scheme, host, port))
            while idle:
                conn = idle.pop()
                if not _closed_by_server(conn):
                    return conn
                conn.close()
        if scheme == "https":
            return http.client.HTTPSConnection(host, port, timeout=self.timeout,
                                               context=self.context)
        return http.client.HTTPConnection(host, port, timeout=self.timeout)

    def put(self, scheme: str, host: str, port: int, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            idle = self._idle.setdefault((scheme, host, port), [])
            if len(idle) < self.max_idle:
                idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            conns = [c for idle in self._idle.values() for c in idle]
            self._idle.clear()
        for conn in conns:
            conn.close()


class _Streams:
    """Requests whose answers are read as they arrive, over a :class:`_Pool`, each in a
    worker thread of its own."""

    def __init__(self, pool: _Pool) -> None:
        self.pool = pool

    def stream(self, key: tuple[str, str, int], method: str, target: str,
               headers: Mapping[str, str], body: bytes | bytearray | memoryview,
               timeout: float | None, put: Callable[[tuple[str, Any]], None],
               stop: threading.Event) -> None:
        """:meth:`exchange`, its answer handed over as it arrives (blocking; in a thread of
        its own): ``("head", (status, headers))``, then ``("chunk", bytes)`` for each piece
        of the body and ``("chunk", None)`` at its end, or ``("error", exception)`` (the
        httpx transport error a failure is) at any point. ``stop`` set: the reading ends."""
        conn = None
        try:
            conn, response = self._send(key, method, target, headers, body, timeout)
            put(("head", (response.status, response.getheaders())))
            while not stop.is_set():
                # (read1 would hand over each chunk of a chunked answer on its own)
                chunk = response.read(STREAM_CHUNK)
                if not chunk:
                    if response.length:  # a sized body that ended early: read(amt) says b""
                        raise http.client.IncompleteRead(b"", response.length)
                    put(("chunk", None))
                    self._done(key, conn, response, timeout)
                    return
                put(("chunk", chunk))
            conn.close()
            put(("chunk", None))  # (a reader that gave up may still be waiting)
        except httpx.TransportError as exc:
            put(("error", exc))
        except (OSError, http.client.HTTPException) as exc:
            if conn is not None:
                conn.close()
            put(("error", _transport_error(exc)))
        except BaseException as exc:  # handed to the reader, never lost
            if conn is not None:
                conn.close()
            put(("error", exc))

    def _send(self, key: tuple[str, str, int], method: str, target: str,
              headers: Mapping[str, str], body: bytes | bytearray | memoryview,
              timeout: float | None) -> tuple[http.client.HTTPConnection,
                                              http.client.HTTPResponse]:
        """The request sent and its answer's head read, over a pooled connection. A
        keep-alive connection the server closed before answering is replaced once, at once;
        other failures raise the httpx transport error they are."""
        for attempt in (0, 1):
            conn = self.pool.get(*key)
            reused = conn.sock is not None
            if timeout is not None:
                conn.timeout = timeout
                if conn.sock is not None:
                    conn.sock.settimeout(timeout)
            with _closed_on_failure(conn):
                try:
                    conn.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
                    for name, value in headers.items():
                        conn.putheader(name, value)
                    conn.endheaders(body or None)
                    return conn, conn.getresponse()
                except (http.client.RemoteDisconnected, BrokenPipeError) as exc:
                    conn.close()
                    if reused and attempt == 0:
                        continue  # the server had let go of an idle connection: nothing done
                    raise httpx.RemoteProtocolError(str(exc) or type(exc).__name__) from None
        raise AssertionError("unreachable")

    def _done(self, key: tuple[str, str, int], conn: http.client.HTTPConnection,
              response: http.client.HTTPResponse, timeout: float | None) -> None:
        """An answer read through: its connection kept for the next request, unless the
        server closes it or it has a timeout of its own."""
        if response.will_close or timeout is not None:
            conn.close()
        else:
            self.pool.put(*key, conn)


@dataclass
class _Answer:
    """The head of an answer whose body is still to be read."""

    status: int
    #: The headers the request was sent with (a 401 renews the credentials among them).
    sent: Mapping[str, str]
    chunks: AsyncIterator[bytes]
    #: The whole answer, its body read (for an error's description).
    whole: Callable[[], Awaitable[httpx.Response]]


async def _json_lines(chunks: AsyncIterator[bytes], what: str,
                      yielded: list[bool]) -> AsyncIterator[Any]:
    """The JSON values of newline-delimited ``chunks``; ``yielded[0]`` turns True with the
    first (a failure after it cannot be retried)."""
    pending = b""
    async for chunk in chunks:
        lines = (pending + chunk).split(b"\n")
        pending = lines.pop()
        for line in lines:
            if line.strip():
                yielded[0] = True
                yield _parse_line(line, what)
    if pending.strip():
        yield _parse_line(pending, what)


class _Stream:
    """One request whose answer's body is read as it arrives, over a pooled ``http.client``
    connection in a thread of its own: the pieces reach trio through a queue. ``http.client``
    spends a third of the CPU httpx does on a chunked answer of many small chunks (a Rucio
    listing of 10,000 DIDs: 0.18 s against 0.45 s), the difference between a cold ``ls -l``
    bound by the server and one bound by the client."""

    def __init__(self, exchanges: _Streams, key: tuple[str, str, int], target: str,
                 headers: Mapping[str, str], body: bytes | bytearray | memoryview,
                 timeout: float | None, *, method: str) -> None:
        self._queue: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._stop = threading.Event()
        thread = threading.Thread(
            target=exchanges.stream, daemon=True, name="rucio-fs-stream",
            args=(key, method, target, headers, body, timeout, self._queue.put, self._stop))
        thread.start()

    async def _next(self) -> Any:
        kind, value = await trio.to_thread.run_sync(self._queue.get, abandon_on_cancel=True)
        if kind == "error":
            raise value
        return value

    async def head(self) -> tuple[int, list[tuple[str, str]]]:
        return await self._next()  # type: ignore[no-any-return]

    async def body(self) -> bytes:
        chunks = [chunk async for chunk in self.chunks()]
        return b"".join(chunks)

    async def chunks(self) -> AsyncIterator[bytes]:
        while (chunk := await self._next()) is not None:
            yield chunk

    def close(self) -> None:
        """Stop reading (the connection is closed unless the answer was read through)."""
        self._stop.set()


@contextlib.contextmanager
def _closed_on_failure(conn: http.client.HTTPConnection) -> Iterator[None]:
    """Whatever fails in the block closes ``conn`` (it is in an unknown state); a socket or
    protocol failure raises the httpx transport error it is."""
    try:
        yield
    except (OSError, http.client.HTTPException) as exc:
        conn.close()
        raise _transport_error(exc) from None
    except BaseException:
        conn.close()
        raise


def _transport_error(exc: BaseException) -> httpx.TransportError:
    """The httpx transport error an ``http.client`` failure is."""
    text = str(exc) or type(exc).__name__
    if isinstance(exc, TimeoutError):
        return httpx.ReadTimeout(text)
    if isinstance(exc, ConnectionRefusedError | socket.gaierror):
        return httpx.ConnectError(text)
    if isinstance(exc, http.client.HTTPException):
        return httpx.RemoteProtocolError(text)
    return httpx.ReadError(text)


#: Servers whose certificate was refused, each logged once (``host:port``).
_UNTRUSTED: set[str] = set()


def untrusted_certificate(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is a TLS certificate the client does not trust:
    permanent until the trusted CAs change, so never worth a retry."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError) or (
                "CERTIFICATE_VERIFY_FAILED" in str(seen)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def certificate_advice(exc: BaseException) -> str:
    """One line for an untrusted certificate: what failed and how to trust the CA. Logged
    as a warning the first time per server (the failure itself may be handled quietly,
    e.g. by reading another replica)."""
    text = str(exc).split(" (_ssl.c")[0] or type(exc).__name__
    advice = (f"TLS certificate not trusted ({text}): name its CA with the catalog's CA "
              "setting (rucio.cfg ca_cert, X509_CERT_DIR, AWS_CA_BUNDLE, ?ca=)")
    if text not in _UNTRUSTED:
        _UNTRUSTED.add(text)
        log.warning("%s", advice)
    return advice


def _environment_proxy(url: str) -> bool:
    """Whether a proxy from the environment (``HTTPS_PROXY``, ...) applies to ``url``."""
    parts = urlsplit(url)
    proxies = urllib.request.getproxies()
    return bool(proxies.get(parts.scheme) or proxies.get("all")) and not (
        urllib.request.proxy_bypass(parts.hostname or ""))


def _server(scheme: str, host: str | None, port: int | None) -> tuple[str, str, int]:
    """(scheme, host, port) of an ``http``/``https`` server, the scheme's port filled in:
    how connections are pooled."""
    return scheme, host or "", port or (443 if scheme == "https" else 80)


def _closed_by_server(conn: http.client.HTTPConnection) -> bool:
    """Whether an idle keep-alive connection was closed meanwhile (its socket reads as ready:
    end of file), so that a request is not sent into it and failed for nothing."""
    sock = conn.sock
    return sock is None or bool(select.select([sock], [], [], 0)[0])


class StreamedPut:
    """One ``PUT`` of a body sent piece by piece as the caller has it (chunked transfer
    encoding), over a connection of its own, each piece from a worker thread: for a storage
    that takes a file only whole (WebDAV) while the file is still being written. Not
    retried: a failure fails the upload, which the caller starts again whole.

    ``send`` returns once the piece is handed to the socket; ``finish`` ends the body and
    returns the answer's status (raising the transport error a failure is, as
    :class:`Unavailable`); ``abort`` drops the connection (the server discards the body)."""

    def __init__(self, url: str, *, context: ssl.SSLContext, timeout: float,
                 headers: Mapping[str, str] | None = None) -> None:
        _check_sendable(url)
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise Unavailable(f"cannot write {parts.scheme}:// URLs")
        self.url = url
        self.sent = 0
        self._target = parts.path + (f"?{parts.query}" if parts.query else "")
        self._headers = dict(headers or {})
        host, port = parts.hostname or "", parts.port
        self._conn: http.client.HTTPConnection = (
            http.client.HTTPSConnection(host, port, timeout=timeout, context=context)
            if parts.scheme == "https" else http.client.HTTPConnection(host, port,
                                                                     timeout=timeout))
        self._started = False

    async def send(self, data: bytes | bytearray | memoryview) -> None:
        await trio.to_thread.run_sync(self.send_blocking, data, abandon_on_cancel=True)

    async def finish(self) -> int:
        return await trio.to_thread.run_sync(self._finish, abandon_on_cancel=True)

    def abort(self) -> None:
        self._conn.close()

    def send_blocking(self, data: bytes | bytearray | memoryview) -> None:
        """:meth:`send`, from a worker thread."""
        try:
            if not self._started:
                self._conn.putrequest("PUT", self._target, skip_accept_encoding=True)
                for name, value in self._headers.items():
                    self._conn.putheader(name, value)
                self._conn.putheader("Transfer-Encoding", "chunked")
                self._conn.endheaders()
                self._started = True
            if len(data):
                self._conn.send(b"%x\r\n" % len(data))
                self._conn.send(data)
                self._conn.send(b"\r\n")
                self.sent += len(data)
        except (OSError, http.client.HTTPException) as exc:
            self._conn.close()
            raise Unavailable(f"PUT {_redact(self.url)}: {_transport_error(exc)}") from None

    def _finish(self) -> int:
        self.send_blocking(b"")
        try:
            self._conn.send(b"0\r\n\r\n")
            response = self._conn.getresponse()
            response.read()
            return response.status
        except (OSError, http.client.HTTPException) as exc:
            raise Unavailable(f"PUT {_redact(self.url)}: {_transport_error(exc)}") from None
        finally:
            self._conn.close()


class RangeReader:
    """Byte ranges of ``http``, ``https`` and ``file`` URLs, read in worker threads.

    ``read`` returns the bytes the server holds for the range (a read-only memoryview of a
    buffer nobody else holds): exactly ``size`` unless the object ends first (the caller
    decides whether that is an error). ``timeout`` bounds every socket operation, so a stalled
    server costs at most ``timeout`` per attempt; a dropped connection, a stall, a body that
    ends early and :data:`RETRYABLE` statuses are retried per ``retry``, then raise
    :class:`Unavailable`.

    ``via`` (see :func:`through_proxy`) sends every ``http``/``https`` read through a caching
    proxy instead (``rucio-fs mount --data-proxy``; ``containers/data-proxy``).
    """

    def __init__(self, *, context: ssl.SSLContext | None = None, timeout: float = 30.0,
                 retry: RetryPolicy | None = None, threads: int = RANGE_THREADS,
                 auth: TokenAuth | None = None, via: str = "") -> None:
        self.via = via
        self.retry = retry or RetryPolicy()
        self.auth = auth
        self.headers: Callable[[], dict[str, str]] = auth.header if auth is not None else dict
        self.counters: Counter[str] = Counter()
        self._pool = _Pool(context or tls_context(), timeout, max_idle=threads)
        self._limiter = trio.CapacityLimiter(threads)

    async def read(self, url: str, offset: int, size: int,
                   headers: dict[str, str] | None = None, *,
                   range_in_url: bool = False) -> bytes | memoryview:
        """``headers`` are sent with this read (e.g. ``If-Match``). ``range_in_url``: the URL
        itself names the range (an API such as iRODS's ``op=read&offset&count``), so no
        ``Range`` header is sent and a 200 answer is the range's bytes. With an ``auth``, a
        refused token is renewed once and the read tried again."""
        token = self.auth.token if self.auth is not None else ""
        read = functools.partial(self.read_blocking, url, offset, size, headers, range_in_url)
        try:
            return await trio.to_thread.run_sync(read, limiter=self._limiter,
                                                 abandon_on_cancel=True)
        except Unauthorized:
            if self.auth is None:
                raise
        await self.auth.renew(token, refused=True)
        return await trio.to_thread.run_sync(read, limiter=self._limiter, abandon_on_cancel=True)

    def close(self) -> None:
        self._pool.close()

    async def connect(self, url: str) -> None:
        """Open a keep-alive connection to ``url``'s server ahead of the first read (the TCP
        and TLS handshakes off a first byte's path). Best effort: a failure only logs."""
        if self.via:
            url = through_proxy(self.via, url)
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            return
        key = _server(parts.scheme, parts.hostname, parts.port)

        def connect() -> None:
            conn = self._pool.get(*key)
            try:
                if conn.sock is None:
                    conn.connect()
            except OSError as exc:
                conn.close()
                log.debug("no connection ahead to %s: %s", _redact(url), exc)
                return
            self._pool.put(*key, conn)

        await trio.to_thread.run_sync(connect, limiter=self._limiter, abandon_on_cancel=True)

    def read_blocking(self, url: str, offset: int, size: int,
                      headers: dict[str, str] | None = None,
                      range_in_url: bool = False) -> bytes | memoryview:
        _check_sendable(url)
        if self.via:
            url = through_proxy(self.via, url)
        parts = urlsplit(url)
        if parts.scheme == "file":
            return _pread(unquote(parts.path), offset, size)
        if parts.scheme not in ("http", "https"):
            raise Unavailable(f"cannot read {parts.scheme}:// URLs")
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        key = _server(parts.scheme, parts.hostname, parts.port)
        failure = ""
        for delay in [0.0, *self.retry.delays()]:
            if delay:
                self.counters["retries"] += 1
                time.sleep(delay)
            conn = self._pool.get(*key)
            try:
                data, reusable = self._get(conn, target, offset, size, url, headers,
                                           range_in_url)
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                if untrusted_certificate(exc):  # no retry makes it trusted
                    raise Unavailable(f"{_redact(url)}: {certificate_advice(exc)}") from None
                failure = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                continue
            except _Retry as exc:
                conn.close()
                failure = str(exc)
                continue
            except BaseException:
                conn.close()
                raise
            if reusable:
                self._pool.put(*key, conn)
            else:
                conn.close()
            return data
        raise Unavailable(f"{_redact(url)}: {failure} after {self.retry.attempts} attempts")

    def _get(self, conn: http.client.HTTPConnection, target: str, offset: int, size: int,
             url: str, headers: dict[str, str] | None,
             range_in_url: bool) -> tuple[memoryview, bool]:
        """One ranged GET: (data, connection reusable)."""
        self.counters["requests"] += 1
        sent = {**self.headers(), **(headers or {})}
        if not range_in_url:
            sent["Range"] = f"bytes={offset}-{offset + size - 1}"
        conn.request("GET", target, headers=sent)
        resp = conn.getresponse()
        if resp.status == 416:  # the object ends before offset
            resp.read()
            return memoryview(b""), not resp.will_close
        if resp.status in RETRYABLE:
            resp.read()
            raise _Retry(f"HTTP {resp.status}")
        if resp.status == 200 and (offset == 0 or range_in_url):
            pass  # the range asked for (or the server ignored Range at offset 0)
        elif resp.status == 206:
            start = _content_range_start(resp.getheader("Content-Range", ""))
            if start != offset:
                resp.close()
                raise Unavailable(f"{_redact(url)}: asked for offset {offset}, "
                                  f"got Content-Range {resp.getheader('Content-Range')!r}")
        else:
            resp.read()
            raise status_error(resp.status, _redact(url))
        buf = bytearray(size)
        view, got = memoryview(buf), 0
        while got < size:
            n = resp.readinto(view[got:])
            if not n:
                break
            got += n
        expected = resp.length  # bytes the server still owed for this response
        if got < size and expected:
            raise _Retry(f"body ended after {got} of {got + expected} bytes")
        self.counters["bytes"] += got
        if resp.chunked and not resp.isclosed() and resp.read(1):
            # A chunked body longer than the range: the connection is left mid-answer.
            resp.close()
            return view[:got].toreadonly(), False
        # The buffer is handed over as is (a read-only view): copying it would cost as much
        # CPU as receiving it.
        data = view[:got].toreadonly()
        if expected:  # a 200 for the whole object: the rest is not ours to read
            resp.close()
            return data, False
        return data, not resp.will_close


class _Retry(Exception):
    """A failure worth another attempt on a fresh connection."""


def _content_range_start(value: str) -> int:
    """The first byte of a ``Content-Range: bytes a-b/total`` header (-1 if unparseable)."""
    try:
        return int(value.split()[1].split("-")[0])
    except (IndexError, ValueError):
        return -1


def _pread(path: str, offset: int, size: int) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise NotFound(path) from None
    except PermissionError:
        raise PermissionDenied(path) from None
    except OSError as exc:
        raise Unavailable(f"{path}: {exc.strerror}") from None
    try:
        parts, got = [], 0
        while got < size:
            chunk = os.pread(fd, size - got, offset + got)
            if not chunk:
                break
            parts.append(chunk)
            got += len(chunk)
        return b"".join(parts)
    except OSError as exc:
        raise Unavailable(f"{path}: {exc.strerror}") from None
    finally:
        os.close(fd)


def through_proxy(proxy: str, url: str) -> str:
    """The URL that reads ``url`` through the data proxy at ``proxy``: the origin's scheme,
    host and port become the first two path components (``http://proxy/https/host:port/
    path?query``), so one proxy serves every storage, over TLS to ``https`` origins, and
    keeps their URLs apart in its cache. Other schemes (``file``) are returned unchanged."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        return url
    port = _server(parts.scheme, parts.hostname, parts.port)[2]
    host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname
    query = f"?{parts.query}" if parts.query else ""
    return f"{proxy.rstrip('/')}/{parts.scheme}/{host}:{port}{parts.path or '/'}{query}"


def _redact(url: str) -> str:
    """A URL fit for logs: no query string (pre-signed URLs carry credentials there)."""
    return url.split("?", 1)[0]
