"""A small Redis client for the trio loop: hiredis speaks RESP, trio does the I/O.

Measured on this machine (``docs/shared.md``): redis-py's blocking client in worker threads
costs 197 µs per small GET and 13-16 ms for a pipeline of 40 values of 256 KiB; hiredis's
parser and packer over a trio stream cost 75 µs and 4.4 ms. So the protocol is the kept C
library's and the sockets are the event loop's.

Contract: :meth:`Redis.run` sends commands as one pipeline and returns their replies in order,
or raises :class:`RedisDown`. ``timeout`` bounds Redis's *silence*: connecting, sending each
:data:`SEND_PIECE`, and every wait for more of the reply must each progress within it (a large
payload or reply that keeps moving is not cut off because this node is busy), and a whole
call never takes more than :data:`CALL_LIMIT` timeouts. A failure opens a *breaker*: for a
back-off that doubles up to :data:`MAX_BACKOFF` every call fails at once, without waiting on a
server that just failed, so no FUSE request pays the timeout twice in a row. The first failure
and the recovery are logged once each. Error replies (``OOM``, a wrong type) raise
:class:`RedisDown` too: callers treat any failure the same way, by working without Redis.
"""

from __future__ import annotations

import logging
import os
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import hiredis
import trio

from rucio_fs.errors import InvalidInput
from rucio_fs.options import without_password

log = logging.getLogger(__name__)

#: The environment variable that gives Redis's password when the URL does not.
PASSWORD_VARIABLE = "RUCIO_FS_SHARED_CACHE_PASSWORD"
#: Longest the breaker stays open after repeated failures.
MAX_BACKOFF = 5.0
FIRST_BACKOFF = 0.5
#: A call may take this many times the timeout in all, as long as Redis keeps answering.
CALL_LIMIT = 20
#: A Redis that keeps failing and recovering logs its failure at most this often.
LOG_INTERVAL = 60.0
#: Connections kept open for concurrent callers.
MAX_IDLE = 8
#: Most bytes one send may take to go out before Redis counts as silent.
SEND_PIECE = 64 << 10

Command = Sequence[str | bytes | int | float]


class RedisDown(Exception):
    """Redis did not answer in time, refused, or replied with an error."""


@dataclass(frozen=True)
class RedisAddress:
    """Where Redis listens: ``redis://[user:pass@]HOST:PORT/DB``, or over TLS
    ``rediss://...[?ca=CA-FILE]`` (the server's certificate is verified against ``ca``, else
    the system's CAs). Without a password in the URL, :data:`PASSWORD_VARIABLE` gives it (a
    command line is visible to every local user in ``ps``). ``str()`` never shows it."""

    host: str
    port: int = 6379
    db: int = 0
    username: str = ""
    password: str = field(default="", repr=False)
    tls: bool = False
    ca: str = ""

    @classmethod
    def parse(cls, url: str) -> RedisAddress:
        parts = urlsplit(url)
        shown = without_password(url)
        if parts.scheme not in ("redis", "rediss"):
            raise InvalidInput(f"shared cache {shown!r}: expected redis://HOST:PORT/DB or "
                               "rediss://...")
        try:
            port = parts.port or 6379
        except ValueError:
            raise InvalidInput(f"shared cache {shown!r}: bad port") from None
        if not parts.hostname:
            raise InvalidInput(f"shared cache {shown!r}: no host")
        path = parts.path.strip("/")
        if path and not path.isdigit():
            raise InvalidInput(f"shared cache {shown!r}: the database must be a number")
        query = parse_qs(parts.query, keep_blank_values=True)
        if parts.fragment or set(query) - {"ca"} or len(query.get("ca", [])) > 1:
            raise InvalidInput(f"shared cache {shown!r}: the only option is ca=CA-FILE "
                               "(rediss://)")
        ca = query.get("ca", [""])[0]
        if ca and parts.scheme != "rediss":
            raise InvalidInput(f"shared cache {shown!r}: ca= is for rediss:// (TLS)")
        if ca and not os.path.isfile(ca):
            raise InvalidInput(f"shared cache {shown!r}: CA file {ca} does not exist")
        password = unquote(parts.password or "") or os.environ.get(PASSWORD_VARIABLE, "")
        return cls(parts.hostname, port, int(path or 0), unquote(parts.username or ""),
                   password, parts.scheme == "rediss", ca)

    def __str__(self) -> str:
        scheme = "rediss" if self.tls else "redis"
        user = f"{self.username}@" if self.username else ""
        return f"{scheme}://{user}{self.host}:{self.port}/{self.db}"


class _Connection:
    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.reader = hiredis.Reader()

    async def execute(self, commands: Sequence[Command],
                      silence: float) -> tuple[list[Any], int, int]:
        """The replies to ``commands``, and the bytes sent and received. Each step (the send,
        every receive) must make progress within ``silence`` seconds."""
        payload = b"".join(hiredis.pack_command(tuple(c)) for c in commands)
        # A large payload (a listing's chunks) goes in pieces, each within ``silence``: Redis
        # that keeps reading is progressing, however long the whole send takes on a busy node.
        view = memoryview(payload)
        for start in range(0, len(view), SEND_PIECE):
            with trio.fail_after(silence):
                await self.stream.send_all(view[start:start + SEND_PIECE])
        replies: list[Any] = []
        received = 0
        while len(replies) < len(commands):
            reply = self.reader.gets()
            if reply is False:
                with trio.fail_after(silence):
                    data = await self.stream.receive_some(1 << 20)
                if not data:
                    raise RedisDown("connection closed by Redis")
                received += len(data)
                self.reader.feed(data)
                continue
            replies.append(reply)
        return replies, len(payload), received


class Redis:
    """Pipelined commands with a deadline, a few pooled connections, and a breaker."""

    def __init__(self, address: RedisAddress, timeout: float) -> None:
        self.address = address
        self.timeout = timeout
        self.bytes_read = 0
        self.bytes_written = 0
        self._idle: list[_Connection] = []
        self._down_until = 0.0
        self._backoff = FIRST_BACKOFF
        self._down = False
        self._quiet_until = 0.0
        self._logged_down = False
        self.failures = 0
        self.bypassed = 0
        # Made once, here: loading the CA certificates takes tens of milliseconds of CPU,
        # which inside a connection's deadline made a refused certificate look like silence.
        self._tls: ssl.SSLContext | None = None
        if address.tls:
            try:
                self._tls = ssl.create_default_context(cafile=address.ca or None)
            except (OSError, ssl.SSLError) as exc:
                raise InvalidInput(f"shared cache {address}: CA file {address.ca} cannot "
                                   f"be used ({exc})") from None

    @property
    def available(self) -> bool:
        """False while the breaker is open (calls fail at once)."""
        return time.monotonic() >= self._down_until

    async def run(self, *commands: Command, force: bool = False) -> list[Any]:
        """The replies of ``commands``, sent as one pipeline; :class:`RedisDown` on any
        failure, an error reply included. ``force``: try even while the breaker is open
        (releasing a lease others wait for is worth one more timeout)."""
        if not force and not self.available:
            self.bypassed += 1
            raise RedisDown("the shared cache is in back-off after a failure")
        connection: _Connection | None = None
        try:
            with trio.fail_after(self.timeout * CALL_LIMIT):
                if self._idle:
                    connection = self._idle.pop()
                else:
                    with trio.fail_after(self.timeout):
                        connection = await self._connect()
                replies, sent, received = await connection.execute(commands, self.timeout)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError,
                ssl.SSLError, hiredis.ProtocolError, RedisDown) as exc:
            if connection is not None:
                await _close(connection)
            cause = exc.__cause__ or exc  # trio wraps TLS failures (certificate verify failed)
            reason = (f"no answer within {self.timeout * 1000:g} ms"
                      if isinstance(exc, trio.TooSlowError)
                      else str(cause) or type(cause).__name__)
            self._failed(reason)
            raise RedisDown(reason) from None
        except BaseException:
            if connection is not None:  # cancelled mid-reply: the stream is out of step
                await _close(connection)
            raise
        self.bytes_read += received
        self.bytes_written += sent
        if len(self._idle) < MAX_IDLE:
            self._idle.append(connection)
        else:
            await _close(connection)
        for reply in replies:
            if isinstance(reply, hiredis.ReplyError):
                self._failed(f"Redis replied: {reply}")
                raise RedisDown(f"Redis replied: {reply}")
        self._succeeded()
        return replies

    async def _connect(self) -> _Connection:
        a = self.address
        if self._tls is not None:
            stream: trio.abc.Stream = await trio.open_ssl_over_tcp_stream(
                a.host, a.port, ssl_context=self._tls)
        else:
            stream = await trio.open_tcp_stream(a.host, a.port)
        connection = _Connection(stream)
        hello: list[Command] = []
        if a.password:
            hello.append(("AUTH", a.username, a.password) if a.username
                         else ("AUTH", a.password))
        if a.db:
            hello.append(("SELECT", a.db))
        if hello:
            replies, _, _ = await connection.execute(hello, self.timeout)
            for reply in replies:
                if isinstance(reply, hiredis.ReplyError):
                    await _close(connection)
                    raise RedisDown(f"Redis refused the connection: {reply}")
        return connection

    def _failed(self, reason: str) -> None:
        self.failures += 1
        now = time.monotonic()
        self._down_until = now + self._backoff
        self._backoff = min(self._backoff * 2, MAX_BACKOFF)
        if not self._down:
            self._down = True
            if now >= self._quiet_until:  # a flapping Redis logs once a minute, not per flap
                self._quiet_until = now + LOG_INTERVAL
                self._logged_down = True
                log.warning("shared cache %s failed (%s): working without it until it "
                            "answers (%d failures so far)", self.address, reason,
                            self.failures)

    def _succeeded(self) -> None:
        self._backoff = FIRST_BACKOFF
        if self._down:
            self._down = False
            if self._logged_down:
                self._logged_down = False
                log.warning("shared cache %s answers again", self.address)

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for connection in idle:
            await _close(connection)


async def _close(connection: _Connection) -> None:
    with trio.CancelScope(shield=True):
        await connection.stream.aclose()
