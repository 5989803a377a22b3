"""One mount, many users: a catalog per local user and credential (``--identity per-user``).

Each request is served by the catalog of its caller's credentials (:mod:`.identity`): a
backend built for that user alone (its own login, tokens and connections) and the core's
layers above it (metadata, listings, data), so nothing one user's credentials fetched is
ever served to another through the daemon. A caller whose credentials cannot be found or
are refused gets EACCES, with one log line naming the uid (never a secret), and is asked
again after :data:`FAILURE_TTL`.

Credentials are looked at again at most every :data:`RECHECK` seconds per user: a changed
environment or credential file (a renewed proxy) makes a new catalog; the old one is closed
once nothing uses it.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from rucio_fs.backend import Backend
from rucio_fs.errors import NoCredentials, RucioFsError
from rucio_fs.identity import Caller, CallerCredentials

from .identity_map import IdentityMap

log = logging.getLogger(__name__)

#: How long a user's credentials are trusted before they are looked at again.
RECHECK = 2.0
#: How long a user whose credentials failed is answered EACCES without trying again.
FAILURE_TTL = 2.0

#: ``make(credentials) -> backend``: a started backend acting as that user.
MakeBackend = Callable[[CallerCredentials], Awaitable[Backend]]


@dataclass
class _Identity:
    credentials: CallerCredentials
    catalog: Any
    checked_at: float
    environ: dict[str, str] = field(default_factory=dict)


class Identities:
    """The catalogs of a per-user mount, one per (uid, credentials)."""

    def __init__(self, make_backend: MakeBackend,
                 make_catalog: Callable[[Backend, CallerCredentials], Any],
                 credential_env: tuple[str, ...], private_dir: str,
                 identity_map: IdentityMap | None = None) -> None:
        self.make_backend = make_backend
        #: The site's settings per user, which win over the caller's environment.
        self.identity_map = identity_map
        self.make_catalog = make_catalog
        self.credential_env = credential_env
        self.private_dir = private_dir
        #: Per uid: requests served, refusals, catalogs made (shown by ``stats``).
        self.counters: dict[int, Counter[str]] = {}
        self._by_uid: dict[int, _Identity] = {}
        self._by_fingerprint: dict[str, _Identity] = {}
        self._failed: dict[tuple[int, str], tuple[float, str]] = {}
        self._locks: dict[int, trio.Lock] = {}
        self._retired: list[Any] = []

    async def catalog_for(self, caller: Caller) -> Any:
        """The catalog serving ``caller``; PermissionDenied when it has no usable
        credentials."""
        counters = self.counters.setdefault(caller.uid, Counter())
        counters["requests"] += 1
        now = time.monotonic()
        known = self._by_uid.get(caller.uid)
        if known is not None and now - known.checked_at < RECHECK:
            return known.catalog
        lock = self._locks.setdefault(caller.uid, trio.Lock())
        async with lock:
            known = self._by_uid.get(caller.uid)
            if known is not None and now - known.checked_at < RECHECK:
                return known.catalog
            try:
                identity = await self._current(caller, known)
            except RucioFsError:
                counters["refused"] += 1
                raise
            identity.checked_at = time.monotonic()
            self._by_uid[caller.uid] = identity
            return identity.catalog

    async def _current(self, caller: Caller, known: _Identity | None) -> _Identity:
        def find() -> CallerCredentials:  # files are looked at: off the event loop
            mapped = (self.identity_map.for_user(caller.uid)
                      if self.identity_map is not None else {})
            return CallerCredentials.of(caller, self.credential_env, self.private_dir, mapped)

        credentials = await trio.to_thread.run_sync(find)
        environ = dict(credentials.environ)
        if (known is not None and known.environ == environ
                and not await trio.to_thread.run_sync(known.credentials.changed, credentials)):
            return known
        key = (caller.uid, repr(sorted(environ.items())))
        failed = self._failed.get(key)
        if failed is not None and time.monotonic() - failed[0] < FAILURE_TTL:
            raise NoCredentials(failed[1])
        try:
            backend = await self.make_backend(credentials)
        except RucioFsError as exc:
            message = f"uid {caller.uid}: no usable credentials ({exc})"
            self._failed[key] = (time.monotonic(), message)
            log.warning("%s", message)
            raise NoCredentials(message) from None
        self._failed.pop(key, None)
        fingerprint = credentials.fingerprint()
        same = self._by_fingerprint.get(fingerprint)
        if same is not None:  # another process of the user with the same credentials
            await backend.aclose()
            return _Identity(same.credentials, same.catalog, 0.0, environ)
        self.counters[caller.uid]["catalogs"] += 1
        identity = _Identity(credentials, self.make_catalog(backend, credentials), 0.0, environ)
        self._by_fingerprint[fingerprint] = identity
        if known is not None:
            log.info("uid %d: credentials changed, a new catalog serves it", caller.uid)
            self._by_fingerprint.pop(known.credentials.fingerprint(), None)
            self._retired.append(known.catalog)
        return identity

    def catalogs(self) -> list[Any]:
        """Every catalog in use (for ``cache drop`` and the statistics)."""
        return list({id(i.catalog): i.catalog for i in self._by_fingerprint.values()}.values())

    def snapshot(self) -> dict[str, dict[str, int]]:
        """Per-uid counters for ``stats`` (uids, never credentials)."""
        return {str(uid): dict(c) for uid, c in sorted(self.counters.items())}

    async def aclose(self) -> None:
        for catalog in [*self.catalogs(), *self._retired]:
            await catalog.aclose()
        self._by_fingerprint.clear()
        self._by_uid.clear()
        self._retired.clear()
