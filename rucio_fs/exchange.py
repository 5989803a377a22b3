"""Whole HTTP/1.1 request/answer exchanges on trio, over keep-alive connections, the protocol
kept by h11.

This is how :class:`~rucio_fs.http.ApiClient` sends a one-shot request (every S3 request, a
Rucio catalog call). It runs on the event loop itself: no worker thread, no hand-off of the
GIL. With 16 signed 4 KiB S3 PUTs in flight (``benchmarks/bench_http.py --small 2000
--concurrency 16``), a request cost 235 µs of CPU this way, 262 µs sent by ``http.client``
from a worker thread and 753 µs through httpx; a HEAD 148, 221 and 665 µs. In the daemon the
difference is larger, its event loop being busy: the uploads of 6,400 small files written
back took 3.5 s of its CPU against 5.3-6.3 s from worker threads.

Contract: :meth:`Exchanges.exchange` returns the answer's status, headers and whole body, or
raises the httpx transport error a failure is (``ConnectError``, ``ConnectTimeout``,
``ReadTimeout``, ``ReadError``, ``WriteError``, ``RemoteProtocolError``), so that a caller's
retries treat every path alike. A connection is reused only after an answer was read through
on it and both sides may go on; any failure or cancellation closes it.
"""

from __future__ import annotations

import select
import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field

import h11
import httpx
import trio

#: The most bytes asked of the socket at once.
RECEIVE = 1 << 18
#: A body up to this size goes out in one write with its head (one system call); a larger
#: one is written on its own, never copied.
JOINED_BODY = 1 << 16

#: (scheme, host, port): the server a connection goes to.
Server = tuple[str, str, int]
Answer = tuple[int, list[tuple[str, str]], bytes]


@dataclass(eq=False)
class _Connection:
    stream: trio.abc.Stream
    raw: trio.socket.SocketType
    protocol: h11.Connection = field(default_factory=lambda: h11.Connection(h11.CLIENT))
    #: Whether a byte of the current exchange's answer has arrived.
    answered: bool = False

    def close(self) -> None:
        self.raw.close()

    def closed_by_peer(self) -> bool:
        """Whether the idle connection reads as ready: the server closed it (or sent
        something unasked, which makes it unusable too)."""
        return bool(select.select([self.raw.fileno()], [], [], 0)[0])


class _Stale(Exception):
    """A reused connection that the server had let go of before the request reached it."""


class Exchanges:
    """Exchanges with HTTP servers over pooled keep-alive connections: at most ``limit``
    at once per client, ``limit`` idle connections kept per server."""

    def __init__(self, context: ssl.SSLContext, timeout: float, limit: int) -> None:
        self.context = context
        self.timeout = timeout
        self.limit = limit
        self.limiter = trio.CapacityLimiter(limit)
        self._idle: dict[Server, list[_Connection]] = {}

    async def exchange(self, server: Server, method: str, target: str,
                       headers: Mapping[str, str], body: bytes | bytearray | memoryview,
                       timeout: float | None = None) -> Answer:
        """Send ``method target`` with ``headers`` (``host`` among them, and
        ``content-length`` for a body) and ``body``; (status, headers, whole body).

        ``timeout`` (else the client's) bounds connecting and each wait for the server to
        take or send bytes. A reused connection found closed by the server before it
        answered is replaced once, at once: the request never reached the server."""
        wait = self.timeout if timeout is None else timeout
        async with self.limiter:
            conn = self._take_idle(server)
            if conn is not None:
                try:
                    return await self._over(conn, server, method, target, headers, body, wait,
                                            reused=True)
                except _Stale:
                    pass
            conn = await self._connect(server, wait)
            return await self._over(conn, server, method, target, headers, body, wait,
                                    reused=False)

    def close(self) -> None:
        """Close the idle connections."""
        idle = [conn for conns in self._idle.values() for conn in conns]
        self._idle.clear()
        for conn in idle:
            conn.close()

    def _take_idle(self, server: Server) -> _Connection | None:
        idle = self._idle.get(server)
        while idle:
            conn = idle.pop()
            if not conn.closed_by_peer():
                return conn
            conn.close()
        return None

    def _keep(self, server: Server, conn: _Connection) -> None:
        idle = self._idle.setdefault(server, [])
        if len(idle) < self.limit:
            idle.append(conn)
        else:
            conn.close()

    async def _connect(self, server: Server, wait: float) -> _Connection:
        scheme, host, port = server
        try:
            with trio.fail_after(wait):
                tcp = await trio.open_tcp_stream(host, port)
                stream: trio.abc.Stream = tcp
                if scheme == "https":
                    stream = trio.SSLStream(tcp, self.context, server_hostname=host,
                                            https_compatible=True)
                    try:
                        await stream.do_handshake()
                    except BaseException:
                        tcp.socket.close()
                        raise
        except trio.TooSlowError:
            raise httpx.ConnectTimeout(f"connecting to {host}:{port}") from None
        except (OSError, trio.BrokenResourceError) as exc:
            raise httpx.ConnectError(_reason(exc)) from exc
        return _Connection(stream, tcp.socket)

    async def _over(self, conn: _Connection, server: Server, method: str, target: str,
                    headers: Mapping[str, str], body: bytes | bytearray | memoryview,
                    wait: float, *, reused: bool) -> Answer:
        """The exchange over ``conn``, which is kept for the next one or closed."""
        conn.answered = False
        scope = trio.CancelScope(deadline=trio.current_time() + wait)
        try:
            with scope:
                answer = await self._send_and_read(conn, method, target, headers, body,
                                                   scope, wait)
        except (OSError, trio.BrokenResourceError, h11.ProtocolError) as exc:
            conn.close()
            if reused and not conn.answered and not isinstance(exc, h11.LocalProtocolError):
                raise _Stale from None
            if isinstance(exc, h11.ProtocolError):
                raise httpx.RemoteProtocolError(str(exc) or type(exc).__name__) from None
            raise httpx.ReadError(_reason(exc)) from exc
        except BaseException:
            conn.close()
            raise
        if scope.cancelled_caught:
            conn.close()
            raise httpx.ReadTimeout(f"no answer from {server[1]}:{server[2]} in {wait:g} s")
        protocol = conn.protocol
        if protocol.our_state is h11.DONE and protocol.their_state is h11.DONE:
            protocol.start_next_cycle()
            self._keep(server, conn)
        else:
            conn.close()
        return answer

    @staticmethod
    async def _send_and_read(conn: _Connection, method: str, target: str,
                             headers: Mapping[str, str], body: bytes | bytearray | memoryview,
                             scope: trio.CancelScope, wait: float) -> Answer:
        """The request written and its whole answer read; each wait for the server moves
        ``scope``'s deadline ``wait`` seconds on."""
        protocol = conn.protocol
        head = protocol.send(h11.Request(method=method, target=target,
                                         headers=list(headers.items())))
        assert head is not None
        if body and len(body) > JOINED_BODY:
            await conn.stream.send_all(head)
            await conn.stream.send_all(body)
        else:
            await conn.stream.send_all(head + body if body else head)
        if body:  # (its bytes went out above: only h11's count of them is wanted)
            protocol.send_with_data_passthrough(h11.Data(data=body))
        protocol.send(h11.EndOfMessage())
        status = 0
        answer_headers: list[tuple[str, str]] = []
        parts: list[bytes] = []
        while True:
            event = protocol.next_event()
            if event is h11.NEED_DATA:
                data = await conn.stream.receive_some(RECEIVE)
                conn.answered = conn.answered or bool(data)
                protocol.receive_data(data)
                scope.deadline = trio.current_time() + wait
                continue
            if isinstance(event, h11.Response):
                status = event.status_code
                answer_headers = [(name.decode("latin-1"), value.decode("latin-1"))
                                  for name, value in event.headers]
            elif isinstance(event, h11.Data):
                parts.append(event.data)
            elif isinstance(event, h11.EndOfMessage):
                return status, answer_headers, b"".join(parts)
            elif isinstance(event, h11.ConnectionClosed):
                raise h11.RemoteProtocolError("the server closed the connection unanswered")
            # (an InformationalResponse, such as 100 Continue, is passed over)


def _reason(exc: BaseException) -> str:
    """What a socket or TLS failure says, its cause's words first (a broken TLS stream's
    cause says why, e.g. ``CERTIFICATE_VERIFY_FAILED``)."""
    cause = exc.__cause__ or exc.__context__
    if isinstance(exc, trio.BrokenResourceError) and cause is not None:
        exc = cause
    if isinstance(exc, socket.gaierror):
        return f"name not resolved: {exc}"
    return str(exc) or type(exc).__name__
