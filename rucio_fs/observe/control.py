"""The control channel of a live mount: JSON lines over a unix socket (mode 0600) at
:func:`rucio_fs.observe.mounts.socket_path`, one request per connection.

Requests: ``{"op": "info"}``, ``{"op": "stats", "reset": bool}``,
``{"op": "drop", "layers": [...]}``, ... Replies: ``{"ok": true, "result": ...}`` or
``{"ok": false, "error": "one line"}``; the connection ends after it. An op that converses
(``warm``) first sends replies marked ``"more": true`` and reads the client's further
messages on the same connection; the client closing its end (however it ends, ``kill -9``
too) is its hang-up, which such an op sees (:class:`Peer`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rucio_fs.errors import InvalidInput, RucioFsError, Unavailable

from .mounts import require_rucio_fs, socket_path

if TYPE_CHECKING:
    import trio

log = logging.getLogger(__name__)

MAX_REQUEST = 1 << 16


async def serve(path: Path, handler: Handler, *,
                task_status: trio.TaskStatus[None] | None = None) -> None:
    """Serve requests on ``path`` until cancelled; removes the socket file on the way out.
    ``handler(request, peer)`` returns the last reply's result. (trio is imported here, not
    with the module: the CLI's clients start without it.)"""
    import trio

    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o077)
    try:
        await sock.bind(str(path))
    finally:
        os.umask(old_umask)
    sock.listen(16)
    try:
        if task_status is not None:
            task_status.started()
        await trio.serve_listeners(lambda stream: _handle(stream, handler),
                                   [trio.SocketListener(sock)])
    finally:
        path.unlink(missing_ok=True)


class Peer:
    """The client of one control connection, as an op's handler sees it: replies before the
    last one go to it, its further messages come from it, and both tell when it has hung up.
    One task may send while another receives."""

    def __init__(self, stream: trio.SocketStream, buffered: bytes = b"") -> None:
        self._stream = stream
        self._buffer = buffered

    async def send(self, result: Any) -> bool:
        """Send ``result`` as a reply that more replies follow; False if the client has hung
        up (nothing was sent)."""
        import trio

        try:
            await self._stream.send_all(_encode({"ok": True, "result": result, "more": True}))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return False
        return True

    async def receive(self) -> dict[str, Any] | None:
        """The client's next message; None once it has hung up (closed its end, or exited
        however it did). ValueError for a message that is no JSON object."""
        import trio

        while b"\n" not in self._buffer:
            if len(self._buffer) >= MAX_REQUEST:
                raise ValueError("control message too long")
            try:
                chunk = await self._stream.receive_some(MAX_REQUEST)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return None
            if not chunk:
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        message = json.loads(line)
        if not isinstance(message, dict):
            raise ValueError("a control message is a JSON object")
        return message


Handler = Callable[[dict[str, Any], Peer], Awaitable[Any]]


async def _handle(stream: trio.SocketStream, handler: Handler) -> None:
    import trio

    async with stream:
        try:
            raw = b""
            with trio.fail_after(10):
                while b"\n" not in raw and len(raw) < MAX_REQUEST:
                    chunk = await stream.receive_some(MAX_REQUEST)
                    if not chunk:
                        break
                    raw += chunk
            line, _, rest = raw.partition(b"\n")
            reply = {"ok": True, "result": await handler(json.loads(line), Peer(stream, rest))}
        except (ValueError, KeyError, TypeError) as exc:
            reply = {"ok": False, "error": f"bad control request: {exc}"}
        except RucioFsError as exc:
            reply = {"ok": False, "error": str(exc)}
        except trio.TooSlowError:
            return
        except Exception as exc:
            log.exception("control request failed")
            reply = {"ok": False, "error": f"internal error: {exc!r}"}
        with contextlib.suppress(trio.BrokenResourceError):
            await stream.send_all(_encode(reply))


def _encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message).encode() + b"\n"


class Conversation:
    """One request to the daemon serving ``mountpoint`` and its replies, read in turn with
    :meth:`reply` (blocking; used by the CLI); :meth:`send` tells an op that converses more.
    Each wait for the daemon is bounded by ``timeout`` seconds (Unavailable then)."""

    def __init__(self, mountpoint: str, op: str, timeout: float | None = 60.0,
                 **args: Any) -> None:
        mount = require_rucio_fs(mountpoint)
        self.mountpoint = mountpoint
        self._path = socket_path(mount.minor)
        self._buffer = b""
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        try:
            self._sock.connect(str(self._path))
            self.send({"op": op, **args})
        except FileNotFoundError:
            self.close()
            raise Unavailable(f"{mountpoint}: no control socket at {self._path} "
                              "(daemon gone? try: rucio-fs unmount)") from None
        except OSError as exc:
            self.close()
            raise self._unavailable(exc) from None

    def send(self, message: dict[str, Any]) -> None:
        """Send one more message on this connection (OSError if the daemon has closed it)."""
        self._sock.sendall(_encode(message))

    def reply(self) -> tuple[Any, bool]:
        """The next reply's result, and whether more replies follow; InvalidInput with the
        daemon's error, Unavailable when no valid reply comes."""
        try:
            while b"\n" not in self._buffer:
                chunk = self._sock.recv(1 << 20)
                if not chunk:
                    break
                self._buffer += chunk
        except OSError as exc:
            raise self._unavailable(exc) from None
        line, _, self._buffer = self._buffer.partition(b"\n")
        try:
            reply = json.loads(line)
        except ValueError:
            raise Unavailable(f"{self.mountpoint}: daemon sent no valid reply") from None
        if not reply.get("ok"):
            raise InvalidInput(reply.get("error", "request failed"))
        return reply["result"], bool(reply.get("more"))

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> Conversation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _unavailable(self, exc: OSError) -> Unavailable:
        return Unavailable(f"{self.mountpoint}: control socket {self._path}: {exc}")


def request(mountpoint: str, op: str, timeout: float | None = 60.0, **args: Any) -> Any:
    """Send one request to the daemon serving ``mountpoint`` (blocking; used by the CLI)."""
    with Conversation(mountpoint, op, timeout, **args) as talk:
        return talk.reply()[0]
