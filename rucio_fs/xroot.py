"""Byte ranges of ``root://`` (XRootD) URLs, read through the XRootD client's own Python
bindings (the ``xrootd`` package) in worker threads.

Contract, that of :class:`rucio_fs.http.RangeReader`: :meth:`RootReader.read` returns the
bytes the storage holds for the range: exactly ``size`` unless the file ends first (the
caller decides whether that is an error). Every request (open, read) is bounded by
``timeout``; a failed one is retried per ``retry`` on a freshly opened file, then raises
:class:`~rucio_fs.errors.Unavailable`; a file the storage does not have is
:class:`~rucio_fs.errors.NotFound` at once. Files stay open for the next reads of the same
URL (the client multiplexes them over one connection per storage).

The client's defaults suit a batch copy, not a file system: a storage killed mid-read was
noticed after 8 minutes, and one that was restarted could not be reached for 30 more. The
first :class:`RootReader` sets bounds from its ``timeout`` (``XRD_*`` variables, as the
client reads them once; ones the user set win). Authentication is the client's: an X.509
proxy (``X509_USER_PROXY``, else ``/tmp/x509up_u<uid>``) or a token (``BEARER_TOKEN``,
``BEARER_TOKEN_FILE``, else ``$XDG_RUNTIME_DIR/bt_u<uid>``; tokens need ``roots://``).
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Mapping
from typing import Any

import trio

from .errors import NotFound, PermissionDenied, RucioFsError, Unavailable
from .http import RANGE_THREADS, RetryPolicy

log = logging.getLogger(__name__)

#: XRootD's answer codes (``XRootDStatus.errno``) that are not worth a retry.
NOT_FOUND = 3011
NOT_AUTHORIZED = 3010
#: URLs whose files are kept open for the next reads (the least recently read are closed).
OPEN_URLS = 64


def _bounds(timeout: float) -> dict[str, str]:
    """The client settings that bound every wait by ``timeout`` (whole seconds)."""
    seconds = str(max(1, math.ceil(timeout)))
    return {
        "XRD_REQUESTTIMEOUT": seconds,       # a request's answer (default 1800 s)
        "XRD_STREAMTIMEOUT": seconds,        # silence on a busy connection (60 s)
        "XRD_CONNECTIONWINDOW": seconds,     # one connection attempt (120 s)
        "XRD_CONNECTIONRETRY": "1",          # attempts per request (5): ours retry
        "XRD_TIMEOUTRESOLUTION": "1",        # how often timeouts are checked (15 s)
        "XRD_STREAMERRORWINDOW": "1",        # a failed storage refused for this long (1800 s)
    }


_client: Any = None
_client_lock = threading.Lock()


def bindings(timeout: float, credentials: Mapping[str, str] | None = None) -> Any:
    """``XRootD.client``, its settings bounded by ``timeout`` and ``credentials`` (e.g.
    ``X509_USER_PROXY``: the proxy the catalog's login uses) put in the environment before
    its first use (what is set there already wins; the daemon's one client has one set of
    them); Unavailable when the package is missing."""
    global _client
    with _client_lock:
        if _client is None:
            for name, value in {**_bounds(timeout), **(credentials or {})}.items():
                os.environ.setdefault(name, value)
            try:
                from XRootD import client
            except ImportError:
                raise Unavailable("root:// needs the xrootd Python package "
                                  "(pip install xrootd)") from None
            _client = client
        return _client


def failure(url: str, what: str, status: Any) -> RucioFsError:
    """The error of a failed request (``XRootDStatus``) for ``what`` of ``url``:
    NotFound and PermissionDenied, which no retry mends, else Unavailable."""
    if status.errno == NOT_FOUND:
        return NotFound(f"{url}: the storage has no such file")
    if status.errno == NOT_AUTHORIZED:
        return PermissionDenied(f"{what} {url}: {status.message}")
    return Unavailable(f"{what} {url}: {str(status.message).strip()}")


class RootReader:
    """Ranged reads of root:// URLs (see the module's contract)."""

    def __init__(self, *, timeout: float = 30.0, retry: RetryPolicy | None = None,
                 threads: int = RANGE_THREADS,
                 credentials: Mapping[str, str] | None = None) -> None:
        self.timeout = timeout
        self.credentials = dict(credentials or {})
        self.retry = retry or RetryPolicy()
        self.counters: Counter[str] = Counter()
        self._idle: OrderedDict[str, list[Any]] = OrderedDict()  # url -> open, unread now
        self._lock = threading.Lock()
        self._threads = threads
        self._limiter = trio.CapacityLimiter(threads)

    async def read(self, url: str, offset: int, size: int) -> bytes:
        return await trio.to_thread.run_sync(self.read_blocking, url, offset, size,
                                             limiter=self._limiter, abandon_on_cancel=True)

    def read_blocking(self, url: str, offset: int, size: int) -> bytes:
        client = bindings(self.timeout, self.credentials)
        seconds = max(1, math.ceil(self.timeout))
        failure = ""
        for delay in [0.0, *self.retry.delays()]:
            if delay:
                self.counters["retries"] += 1
                time.sleep(delay)
            file = self._take(url)
            if file is None:
                file = client.File()
                status, _ = file.open(url, timeout=seconds)
                if not status.ok:
                    failure = self._failure(url, status)
                    continue
            self.counters["requests"] += 1
            status, data = file.read(offset, size, timeout=seconds)
            if not status.ok:
                file.close(timeout=1)
                failure = self._failure(url, status)
                continue
            self._give(url, file)
            self.counters["bytes"] += len(data)
            return data
        raise Unavailable(f"{url}: {failure} after {self.retry.attempts} attempts")

    async def connect(self, url: str) -> None:
        """Log in to ``url``'s storage ahead of the first read (the connection, handshake and
        login off a first byte's path: the client keeps the channel for the files opened
        there later). Best effort: a failure only logs."""
        if not is_root(url):
            return

        def ping() -> None:
            try:
                client = bindings(self.timeout, self.credentials)
            except RucioFsError as exc:  # (the package missing: its reads will say so)
                log.debug("no connection ahead to %s: %s", url, exc)
                return
            status, _ = client.FileSystem(url).ping(timeout=max(1, math.ceil(self.timeout)))
            if status.ok:
                self.counters["logins_ahead"] += 1
            else:
                log.debug("no connection ahead to %s: %s", url, status.message)

        await trio.to_thread.run_sync(ping, limiter=self._limiter, abandon_on_cancel=True)

    def _failure(self, url: str, status: Any) -> str:
        """The message of a failed request; raises at once where no retry can help."""
        error = failure(url, "reading", status)
        if not isinstance(error, Unavailable):
            raise error
        return str(status.message).strip()

    def _take(self, url: str) -> Any:
        with self._lock:
            idle = self._idle.get(url)
            return idle.pop() if idle else None

    def _give(self, url: str, file: Any) -> None:
        closing = []
        with self._lock:
            idle = self._idle.setdefault(url, [])
            self._idle.move_to_end(url)
            if len(idle) < self._threads:
                idle.append(file)
            else:
                closing.append(file)
            while len(self._idle) > OPEN_URLS:
                closing += self._idle.popitem(last=False)[1]
        for other in closing:
            other.close(timeout=1)

    def close(self) -> None:
        """Close the files kept open (the backend stops)."""
        with self._lock:
            files = [f for idle in self._idle.values() for f in idle]
            self._idle.clear()
        for file in files:
            file.close(timeout=1)


def is_root(url: str) -> bool:
    return url.startswith(("root://", "roots://"))


class RootStorage:
    """Writes to root:// storage for uploads: whole files, files streamed part by part,
    renames, sizes and removals. Each call is bounded by ``timeout`` (no retry: the upload
    repeats its steps); a failure raises :class:`~rucio_fs.errors.Unavailable`
    (:class:`~rucio_fs.errors.NotFound` for a missing file)."""

    def __init__(self, timeout: float = 30.0,
                 credentials: Mapping[str, str] | None = None) -> None:
        self.timeout = timeout
        self.credentials = dict(credentials or {})
        self.seconds = max(1, math.ceil(timeout))

    def _check(self, url: str, what: str, status: Any) -> None:
        if not status.ok:
            raise failure(url, what, status)

    def _filesystem(self, url: str) -> tuple[Any, str]:
        client = bindings(self.timeout, self.credentials)
        parsed = client.URL(url)
        return client.FileSystem(f"{parsed.protocol}://{parsed.hostid}"), parsed.path

    def writer(self, url: str) -> RootWriter:
        """``url`` created (replaced if there, directories made), open for writing."""
        client = bindings(self.timeout, self.credentials)
        from XRootD.client.flags import AccessMode, OpenFlags

        file = client.File()
        mode = AccessMode.UR | AccessMode.UW | AccessMode.GR | AccessMode.OR
        status, _ = file.open(url, OpenFlags.DELETE | OpenFlags.MAKEPATH, mode,
                              timeout=self.seconds)
        self._check(url, "creating", status)
        return RootWriter(self, url, file)

    def put(self, url: str, data: bytes) -> None:
        """``url`` holds ``data``."""
        writer = self.writer(url)
        try:
            writer.send_blocking(data)
        except BaseException:
            writer.abort()
            raise
        writer.finish_blocking()

    def move(self, source: str, target: str) -> None:
        filesystem, path = self._filesystem(source)
        status, _ = filesystem.mv(path, self._filesystem(target)[1], timeout=self.seconds)
        self._check(source, "renaming", status)

    def size(self, url: str) -> int:
        filesystem, path = self._filesystem(url)
        status, info = filesystem.stat(path, timeout=self.seconds)
        self._check(url, "the size of", status)
        return int(info.size)

    def remove(self, url: str) -> None:
        filesystem, path = self._filesystem(url)
        status, _ = filesystem.rm(path, timeout=self.seconds)
        self._check(url, "removing", status)


class RootWriter:
    """One file being written to root:// storage, in order (``send_blocking``), then closed
    (``finish_blocking``: the storage holds it) or given up (``abort``)."""

    def __init__(self, storage: RootStorage, url: str, file: Any) -> None:
        self.storage = storage
        self.url = url
        self.file = file
        self.offset = 0

    def send_blocking(self, data: bytes) -> None:
        status, _ = self.file.write(data, self.offset, timeout=self.storage.seconds)
        self.storage._check(self.url, "writing", status)
        self.offset += len(data)

    def finish_blocking(self) -> None:
        status, _ = self.file.close(timeout=self.storage.seconds)
        self.storage._check(self.url, "closing", status)

    def abort(self) -> None:
        self.file.close(timeout=1)
