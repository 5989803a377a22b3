"""The control channel of a live mount: one JSON request and one JSON reply per connection,
over a unix socket (mode 0600) at :func:`rucio_fs.mounts.socket_path`.

Requests: ``{"op": "info"}``, ``{"op": "stats", "reset": bool}``,
``{"op": "drop", "layers": [...]}``. Replies: ``{"ok": true, "result": ...}`` or
``{"ok": false, "error": "one line"}``.
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

from .errors import InvalidInput, RucioFsError, Unavailable
from .mounts import require_rucio_fs, socket_path

if TYPE_CHECKING:
    import trio

log = logging.getLogger(__name__)

Handler = Callable[[dict[str, Any]], Awaitable[Any]]
MAX_REQUEST = 1 << 16


async def serve(path: Path, handler: Handler, *,
                task_status: trio.TaskStatus[None] | None = None) -> None:
    """Serve requests on ``path`` until cancelled; removes the socket file on the way out.
    (trio is imported here, not with the module: the CLI's clients start without it.)"""
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


async def _handle(stream: trio.SocketStream, handler: Handler) -> None:
    import trio

    async with stream:
        try:
            raw = b""
            with trio.fail_after(10):
                while not raw.endswith(b"\n") and len(raw) < MAX_REQUEST:
                    chunk = await stream.receive_some(MAX_REQUEST)
                    if not chunk:
                        break
                    raw += chunk
            reply = {"ok": True, "result": await handler(json.loads(raw))}
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
            await stream.send_all(json.dumps(reply).encode() + b"\n")


def request(mountpoint: str, op: str, timeout: float | None = 60.0, **args: Any) -> Any:
    """Send one request to the daemon serving ``mountpoint`` (blocking; used by the CLI)."""
    mount = require_rucio_fs(mountpoint)
    path = socket_path(mount.minor)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(str(path))
            sock.sendall(json.dumps({"op": op, **args}).encode() + b"\n")
            raw = b""
            while not raw.endswith(b"\n"):
                chunk = sock.recv(1 << 20)
                if not chunk:
                    break
                raw += chunk
        except FileNotFoundError:
            raise Unavailable(f"{mountpoint}: no control socket at {path} "
                              "(daemon gone? try: rucio-fs unmount)") from None
        except OSError as exc:
            raise Unavailable(f"{mountpoint}: control socket {path}: {exc}") from None
    try:
        reply = json.loads(raw)
    except ValueError:
        raise Unavailable(f"{mountpoint}: daemon sent no valid reply") from None
    if not reply.get("ok"):
        raise InvalidInput(reply.get("error", "request failed"))
    return reply["result"]
