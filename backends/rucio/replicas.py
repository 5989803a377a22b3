"""Replicas of files, resolved in shared batches: concurrent first reads share one
``POST /replicas/list`` of up to 1,000 DIDs (the server's limit), with companions (files a
read is likely to want next) riding along; answers are cached, and offered to other mounts
through the shared tier. Readable PFNs come ordered: local mounts of an RSE, then the RSE
preference, then the scheme preference."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import trio
from cachetools import TTLCache

from rucio_fs.backend import SharedValues
from rucio_fs.errors import NotFound, RucioFsError
from rucio_fs.http import ApiClient, quote_path

from .layout import pfn_url
from .names import Did
from .settings import MAX_DIDS_PER_REQUEST, RucioSettings

#: Resolved replicas are reused this long by later opens of the same file.
REPLICA_TTL = 600.0


class Replica(NamedTuple):
    url: str
    rse: str


@dataclass
class _Slot:
    """One DID waiting for its replicas."""

    done: trio.Event = field(default_factory=trio.Event)
    replicas: list[Replica] = field(default_factory=list)
    error: RucioFsError | None = None
    #: Callers waiting for it; a slot nobody waits for any more leaves the queue, unless it
    #: was asked for as a companion (resolved for later opens, see ``resolve``).
    waiters: int = 0
    companion: bool = False

    def result(self) -> list[Replica]:
        if self.error is not None:
            raise type(self.error)(str(self.error))
        return self.replicas


class ReplicaResolver:
    """Replicas of files, resolved in shared batches (group commit, no added delay).

    The first caller sends its DID at once; DIDs asked for while that request runs wait and
    go together in the next one (up to :data:`MAX_DIDS_PER_REQUEST`). So a lone ``cat`` pays
    one request and a hundred concurrent opens pay a handful. Every answer is shown to
    ``observe`` (the speculator learns RSE layouts from it).
    """

    def __init__(self, api: ApiClient, settings: RucioSettings,
                 observe: Callable[[Did, Mapping[str, Mapping[str, Any]]], None] | None = None
                 ) -> None:
        self.api = api
        self.settings = settings
        self.observe = observe
        self.requests = 0
        self.dids = 0
        self._pending: dict[Did, _Slot] = {}
        #: DIDs of the request under way: a caller asking for one waits for that answer.
        self._inflight: dict[Did, _Slot] = {}
        self._busy: trio.Event | None = None
        self._cache: TTLCache[Did, list[Replica]] = TTLCache(100_000, REPLICA_TTL)
        self.caching = True
        #: Where resolved PFNs are shared with the other mounts of this identity (if anywhere).
        self.shared: SharedValues | None = None
        self.shared_hits = 0

    def known(self, did: Did) -> bool:
        """Whether ``did``'s replicas are cached or on their way."""
        return (did in self._pending or did in self._inflight
                or (self.caching and did in self._cache))

    async def resolve(self, did: Did, companions: Iterable[Did] = ()) -> list[Replica]:
        """``did``'s replicas, best first. ``companions`` go in the same request without
        being waited for: their answers are cached for the opens expected next."""
        cached = self._cache.get(did) if self.caching else None
        if cached is not None:
            return cached
        if self.shared is not None and did not in self._pending:
            pfns = await self.shared.get("replicas", str(did))
            if isinstance(pfns, dict):
                self.shared_hits += 1
                replicas = self._order(pfns)
                if self.caching:
                    self._cache[did] = replicas
                return replicas
        slot = self._inflight.get(did) or self._pending.setdefault(did, _Slot())
        slot.waiters += 1
        if self.caching:
            for other in companions:
                if not self.known(other):
                    self._pending[other] = _Slot(companion=True)
        try:
            while not slot.done.is_set():
                if self._busy is None:
                    self._busy = trio.Event()
                    self._pending.setdefault(did, slot)  # a withdrawn request's DID
                    try:
                        await self._run_batch(did)
                    finally:
                        busy, self._busy = self._busy, None
                        busy.set()
                else:
                    await self._busy.wait()
        finally:
            slot.waiters -= 1
            if (not slot.done.is_set() and not slot.waiters and not slot.companion
                    and self._pending.get(did) is slot):
                del self._pending[did]  # its caller went away (e.g. a guessed read won)
        return slot.result()

    def answered(self, did: Did) -> bool:
        """Whether the catalog's answer for ``did`` is here (cached, or just received by the
        request under way)."""
        slot = self._inflight.get(did)
        return ((slot is not None and slot.done.is_set())
                or (self.caching and did in self._cache))

    def forget(self, did: Did) -> None:
        self._cache.pop(did, None)

    def clear(self) -> None:
        self._cache.clear()

    async def _run_batch(self, first: Did) -> None:
        batch = {first: self._pending.pop(first)}
        while self._pending and len(batch) < MAX_DIDS_PER_REQUEST:
            did = next(iter(self._pending))
            batch[did] = self._pending.pop(did)
        self.requests += 1
        self.dids += len(batch)
        self._inflight.update(batch)
        try:
            await self._send_batch(first, batch)
        finally:
            for did, slot in batch.items():
                if self._inflight.get(did) is slot:
                    del self._inflight[did]

    async def _send_batch(self, first: Did, batch: dict[Did, _Slot]) -> None:
        body: dict[str, Any] = {"dids": [{"scope": d.scope, "name": d.name} for d in batch],
                                "schemes": list(self.settings.schemes), "all_states": False}
        shareable: dict[str, Any] = {}
        try:
            async for line in self.api.ndjson("POST", "/replicas/list", json=body,
                                              what=f"replicas of {len(batch)} file(s)"):
                did = Did(line.get("scope", ""), line.get("name", ""))
                slot = batch.get(did)
                if slot is not None and not slot.done.is_set():
                    pfns = line.get("pfns") or {}
                    if self.observe is not None:
                        self.observe(did, pfns)
                    slot.replicas = self._order(pfns)
                    if self.caching:
                        self._cache[did] = slot.replicas
                    if slot.replicas and not any("?" in pfn for pfn in pfns):
                        # a query could be a signature: signed URLs are never shared
                        shareable[str(did)] = {pfn: {"rse": info.get("rse", ""),
                                                     "priority": info.get("priority")}
                                               for pfn, info in pfns.items()}
                    slot.done.set()
        except RucioFsError as exc:
            failure: RucioFsError | None = exc
        except trio.Cancelled:
            # Our caller went away: the DIDs others still wait for (or that were asked for
            # as companions) go to whoever leads the next batch.
            for did, slot in batch.items():
                if not slot.done.is_set() and (slot.waiters > (did == first) or slot.companion):
                    self._pending.setdefault(did, slot)
            raise
        else:
            failure = None
        for did, slot in batch.items():
            if not slot.done.is_set():
                slot.error = failure or NotFound(f"{did}: the catalog has no such file")
                slot.done.set()
        if self.shared is not None and shareable:
            await self.shared.put("replicas", shareable, REPLICA_TTL)

    def _order(self, pfns: Mapping[str, Mapping[str, Any]]) -> list[Replica]:
        """Readable PFNs, best first: local mounts, then RSE preference, then scheme."""
        s = self.settings
        ranked = []
        for pfn, info in pfns.items():
            scheme = pfn.partition("://")[0]
            if scheme not in s.schemes:
                continue
            rse = str(info.get("rse", ""))
            url, local = readable_url(pfn, s)
            rse_rank = s.rses.index(rse) if rse in s.rses else len(s.rses)
            ranked.append(((not local, rse_rank, s.schemes.index(scheme),
                            info.get("priority") or 0), Replica(url, rse)))
        ranked.sort(key=lambda pair: pair[0])
        return [replica for _, replica in ranked]


def readable_url(pfn: str, settings: RucioSettings) -> tuple[str, bool]:
    """The URL to read ``pfn`` from (:func:`.layout.pfn_url`, unless a ``local`` or
    ``redirect`` setting maps it), and whether it is a local file."""
    for prefix, directory in settings.local:
        if pfn.startswith(prefix):
            return "file://" + quote_path(directory.rstrip("/") + "/" + pfn[len(prefix):]), True
    for prefix, target in settings.redirect:
        if pfn.startswith(prefix):
            return target.rstrip("/") + "/" + quote_path(pfn[len(prefix):].lstrip("/")), False
    return pfn_url(pfn), False


__all__ = ["REPLICA_TTL", "Replica", "ReplicaResolver", "readable_url"]
