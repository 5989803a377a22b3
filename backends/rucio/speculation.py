"""Which RSE a small file is guessed on, and whether the guessed bytes are the file.

A file's first read usually waits for ``POST /replicas/list`` (65-115 ms on the test
server, the largest part of a cold ``cat``). On a deterministic RSE the PFN follows from the
DID (:mod:`.layout`), so the read can start at once; the bytes found there are served only
when they match every checksum the catalog listed for the file — the checksums prove the
bytes, whatever the replica's state. Anything else (a 404, fewer bytes, other bytes, an
error) is a miss, and the read goes the replica catalog's way as before.

Which RSEs are guessed (``?speculate=``):

* ``auto`` (the default): the RSEs of ``?rses=`` in order, then RSEs this mount has seen the
  catalog place files on *at the computed PFN* (confirmed, most often first). A mount
  without ``rses`` lists the catalog's RSEs when it starts (:meth:`Speculator.discover`) and
  describes the deterministic disk RSEs it finds; while none is confirmed, a first read
  guesses on every one of them at once, up to :data:`BLIND_MAX` (the first verified copy
  wins and confirms its RSE). With more candidates than that it guesses nothing until the
  first replica answer; a first read already waiting for its own replica answer then starts
  its guess at once (on a per-user mount, whichever user's answer taught it: see
  :class:`Layouts`). What a mount learned is kept for the next ones (:mod:`.kept_layouts`).
* ``RSE[,RSE...]``: only those, in order (an unknown name fails the mount).
* ``off``: never.

Once an RSE is confirmed (or named), only the first RSE that gives a PFN is guessed (one
GET per file). An RSE is never guessed
when its description refuses (non-deterministic, tape, signed URLs, unknown algorithm), nor
after the catalog listed a PFN on it that differs from the computed one (its layout is not
the one computed here: counted, logged once).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import zlib
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import quote

import trio
from cachetools import TTLCache

from rucio_fs.backend import Entry
from rucio_fs.errors import InvalidInput, NotFound, RucioFsError
from rucio_fs.http import ApiClient

from .kept_layouts import KeptLayouts
from .layout import RseDescription
from .settings import RucioSettings

log = logging.getLogger(__name__)

#: How long an RSE's description is used before it is asked again.
DESCRIPTION_TTL = 3600.0
#: How long an RSE whose description could not be fetched is not asked again.
DESCRIPTION_RETRY = 60.0
#: Catalog PFNs remembered per RSE not described yet (checked once it is).
SAMPLES_PER_RSE = 4
#: The most RSEs a first read guesses on at once while none is confirmed (one GET of the
#: small file each); a catalog with more candidates is learned from its answers instead.
BLIND_MAX = 4
#: Catalog answers placing no file at a discovered candidate's computed PFN (while none is
#: confirmed) after which first reads stop guessing on the candidates: their files lie
#: elsewhere, and each guess would be a GET for nothing.
BLIND_GIVE_UP = 3
#: Longest a mount's start waits for the RSE list and descriptions (they are hints: past
#: it the mount learns from the catalog's answers).
DISCOVERY_WAIT = 2.0
#: Longest a first read waits for the first replica lookup since a drop (see
#: :meth:`Layouts.lesson_under_way`) before it asks on its own: a lookup takes 60-300 ms
#: on the test server; one stuck for longer delays the others by at most this.
LESSON_WAIT = 1.0


def checksums_match(data: bytes | memoryview, entry: Entry) -> bool:
    """Whether ``data`` is the file ``entry`` describes: its size and every checksum the
    catalog gave (adler32, md5). False when the catalog gave none: nothing proves it."""
    if len(data) != entry.size or not entry.checksums:
        return False
    for algo, expected in entry.checksums.items():
        if algo == "adler32":
            actual = f"{zlib.adler32(data):08x}"
            expected = expected.lower().rjust(8, "0")
        elif algo == "md5":
            actual = hashlib.md5(data).hexdigest()
        else:
            continue
        if actual != expected.lower():
            return False
    return any(algo in ("adler32", "md5") for algo in entry.checksums)


class Layouts:
    """What is known of RSE layouts: their descriptions and what the catalog's answers
    confirmed or contradicted of them. Hints of where to look, never an answer: a file's
    bytes are served from a computed PFN only once they match its own catalog entry's
    checksums, read with its reader's own credentials. So one ``Layouts`` may serve every
    user of a per-user mount (for one catalog host and VO): what one user's answers taught,
    another user's reads try first."""

    def __init__(self) -> None:
        self.descriptions: TTLCache[str, RseDescription] = TTLCache(1000, DESCRIPTION_TTL)
        self.unreachable: TTLCache[str, bool] = TTLCache(1000, DESCRIPTION_RETRY)
        self.describing: dict[str, trio.Event] = {}
        #: RSEs whose catalog PFNs matched the computed ones, with how often.
        self.confirmed: Counter[str] = Counter()
        #: RSEs whose catalog PFNs did not: never guessed again on this mount.
        self.rejected: set[str] = set()
        self.samples: dict[str, list[tuple[str, str, str]]] = {}
        #: Descriptions as the catalog gave them (what a snapshot keeps).
        self.described: dict[str, dict[str, Any]] = {}
        #: The deterministic disk RSEs a first read may guess on while none is confirmed.
        self.candidates: list[str] = []
        #: Catalog answers that confirmed no candidate while none was confirmed.
        self.unplaced = 0
        #: Whether the RSE list was read or a snapshot restored (once per mount).
        self.discovered = False
        #: Whether something worth keeping changed since the last snapshot was kept.
        self.changed = False
        self._learned = trio.Event()
        #: Set when the first replica lookup since the last :meth:`forget` ends (None:
        #: none started yet).
        self._first_lookup: trio.Event | None = None

    def lesson_under_way(self) -> trio.Event | None:
        """While the first replica lookup since the last :meth:`forget` runs, the event set
        when it ends: a first read with nothing to guess on waits for it rather than send
        a lookup of its own beside it (what it teaches may make that read a guess; on a
        per-user mount, ten users' lookups at once also kept the catalog's workers from
        everyone's stats). None once it ended: reads that find nothing to guess then
        ask at once. Waiting is bounded by :data:`LESSON_WAIT`."""
        event = self._first_lookup
        return event if event is not None and not event.is_set() else None

    @contextlib.contextmanager
    def first_lookup(self) -> Iterator[None]:
        """Around a replica lookup: marks the first one since the last :meth:`forget`."""
        if self._first_lookup is not None:
            yield
            return
        self._first_lookup = event = trio.Event()
        try:
            yield
        finally:
            event.set()

    def next_lesson(self) -> trio.Event:
        """An event set when something is next learned that may make a guess possible: an
        RSE confirmed for the first time, or a catalog PFN on an RSE not described yet."""
        return self._learned

    def confirm(self, rse: str) -> None:
        new = rse not in self.confirmed
        self.confirmed[rse] += 1
        if new:
            self.changed = True
            self._tell()

    def describe(self, rse: str, info: Mapping[str, Any]) -> RseDescription:
        description = RseDescription.parse(rse, info)
        self.descriptions[rse] = description
        self.described[rse] = dict(info)
        self.changed = True
        return description

    def snapshot(self) -> dict[str, Any]:
        """What the next mounts may start from (see :mod:`.kept_layouts`)."""
        self.changed = False
        return {"descriptions": {rse: info for rse, info in self.described.items()
                                 if rse in self.descriptions},
                "candidates": self.candidates, "confirmed": dict(self.confirmed),
                "rejected": sorted(self.rejected)}

    def restore(self, snapshot: Mapping[str, Any]) -> bool:
        """Start from a kept snapshot; False (nothing taken) when it does not parse."""
        try:
            descriptions = {str(rse): dict(info)
                            for rse, info in snapshot["descriptions"].items()}
            candidates = [str(rse) for rse in snapshot["candidates"]]
            confirmed = {str(rse): int(n) for rse, n in snapshot["confirmed"].items()}
            rejected = {str(rse) for rse in snapshot["rejected"]}
        except (KeyError, TypeError, ValueError, AttributeError):
            return False
        for rse, info in descriptions.items():
            self.describe(rse, info)
        self.candidates = [rse for rse in candidates if rse in self.descriptions]
        self.confirmed.update(confirmed)
        self.rejected |= rejected
        self.discovered, self.changed = True, False
        self._tell()
        return True

    def sample(self, rse: str, scope: str, name: str, pfn: str) -> None:
        samples = self.samples.setdefault(rse, [])
        if len(samples) < SAMPLES_PER_RSE:
            samples.append((scope, name, pfn))
            if len(samples) == 1:
                self._tell()

    def _tell(self) -> None:
        self._learned.set()
        self._learned = trio.Event()

    def forget(self) -> None:
        """Forget what was learned from the catalog (a cache drop: cold means cold). The
        descriptions stay: they are the storage's configuration, not catalog content."""
        self.confirmed.clear()
        self.samples.clear()
        self._first_lookup = None
        self.unplaced = 0
        self.changed = True


class Speculator:
    """The RSEs one backend may guess on: its settings, and the :class:`Layouts` it learns
    into (its own, or one shared by the backends of a per-user mount)."""

    def __init__(self, api: ApiClient, settings: RucioSettings,
                 layouts: Layouts | None = None) -> None:
        self.api = api
        self.settings = settings
        self.counters: Counter[str] = Counter()
        self.layouts = layouts or Layouts()
        #: Whether RSEs are learned from the catalog's answers (off with the metadata layer:
        #: then only ``rses`` and ``speculate`` name RSEs to guess on).
        self.learning = True
        #: Where what was learned is kept for the next mounts.
        self.kept = KeptLayouts(f"{settings.rucio_host} vo={settings.vo}")

    @property
    def enabled(self) -> bool:
        return self.settings.speculate != ("off",)

    @property
    def explicit(self) -> bool:
        return self.settings.speculate not in (("auto",), ("off",))

    @property
    def learns(self) -> bool:
        """Whether a guess may become possible while a read waits for the catalog."""
        return self.enabled and not self.explicit and self.learning

    async def start(self) -> None:
        """Describe the RSEs named by the settings before the first read needs them. An
        RSE named in ``speculate=`` that the catalog does not know fails the mount."""
        named = self.settings.speculate if self.explicit else self.settings.rses
        if not self.enabled:
            return
        for rse in named:
            if rse in self.layouts.descriptions:
                continue
            try:
                await self._fetch(rse)
            except NotFound:
                if self.explicit:
                    raise InvalidInput(f"rucio option speculate: the catalog has no RSE "
                                       f"{rse!r}") from None
            except RucioFsError as exc:
                log.warning("RSE %s not described (%s): not guessed for now", rse, exc)
        if self.learns and not self.settings.rses:
            with trio.move_on_after(DISCOVERY_WAIT):
                await self.discover()

    async def discover(self) -> None:
        """Learn the RSEs a first read may guess on: from a kept snapshot, else from the
        catalog's RSE list (``GET /rses/``) and a description of each deterministic disk RSE
        readable in it, when there are at most :data:`BLIND_MAX` of them. Once per mount
        (per-user mounts: once for all users); a failure is logged, and the mount then
        learns from the catalog's answers."""
        layouts = self.layouts
        if layouts.discovered:
            return
        layouts.discovered = True
        snapshot = await self.kept.load()
        if snapshot is not None and layouts.restore(snapshot):
            self.counters["rse_layouts_restored"] += 1
            return
        try:
            self.counters["rse_lists"] += 1
            names = [str(rse["rse"]) async for rse in self.api.ndjson(
                "GET", "/rses/", what="the list of RSEs") if _may_guess(rse)]
        except RucioFsError as exc:
            log.info("RSEs not listed (%s): learned from the catalog's answers", exc)
            return
        if len(names) <= BLIND_MAX:
            async with trio.open_nursery() as nursery:
                for rse in names:
                    nursery.start_soon(self._describe, rse)
            layouts.candidates = [rse for rse in names if (
                description := layouts.descriptions.get(rse)) and not description.refusal]
        else:
            log.info("%d deterministic disk RSEs: guesses start once the catalog names one",
                     len(names))
        await self.keep()

    async def keep(self) -> None:
        """Keep what was learned for the next mounts, if anything changed."""
        if self.layouts.changed:
            await self.kept.save(self.layouts.snapshot())

    def first_endpoints(self) -> list[str]:
        """A PFN on each storage the first guesses go to (to connect to them ahead): the
        first named or confirmed RSE's, else each discovered candidate's."""
        layouts = self.layouts

        def pfn_of(rse: str) -> str | None:
            description = layouts.descriptions.get(rse)
            return description.pfn("x", "x", self.settings.schemes) if description else None

        named = self.settings.speculate if self.explicit else self.settings.rses
        for rse in [*named, *(rse for rse, _ in layouts.confirmed.most_common())]:
            pfn = pfn_of(rse)
            if pfn is not None:
                return [pfn]
        if self.explicit or not self.learning:
            return []
        return [pfn for rse in layouts.candidates if (pfn := pfn_of(rse)) is not None][
            :BLIND_MAX]

    def applies(self, entry: Entry) -> bool:
        """Whether a first read of ``entry`` may be guessed: small and checksummed."""
        return (self.enabled and 0 < entry.size <= self.settings.speculate_max
                and any(algo in entry.checksums for algo in ("adler32", "md5")))

    async def guesses(self, scope: str, name: str) -> list[tuple[str, str]]:
        """``(rse, pfn)`` pairs to read ``scope:name`` from before the catalog answers: the
        first named or confirmed RSE that gives a PFN; while none is confirmed, every
        discovered candidate that gives one; else none."""
        for rse in await self._candidates():
            description = await self._describe(rse)
            if description is None or rse in self.layouts.rejected:
                continue
            pfn = description.pfn(scope, name, self.settings.schemes)
            if pfn is not None:
                return [(rse, pfn)]
        layouts = self.layouts
        if self.explicit or not self.learning or layouts.confirmed:
            return []
        blind = []
        for rse in layouts.candidates:
            description = layouts.descriptions.get(rse)
            pfn = None if description is None or rse in layouts.rejected else \
                description.pfn(scope, name, self.settings.schemes)
            if pfn is not None:
                blind.append((rse, pfn))
        return blind[:BLIND_MAX]

    def verified(self, rse: str) -> None:
        """A guess on ``rse`` gave the file's bytes: its layout is the computed one."""
        if self.learning:
            self.layouts.confirm(rse)

    def observe(self, scope: str, name: str, pfns: Mapping[str, Mapping[str, Any]]) -> None:
        """What the catalog said of ``scope:name``: confirms or rejects each RSE's computed
        layout (RSEs not described yet are checked once they are)."""
        if not self.enabled:
            return
        layouts = self.layouts
        for pfn, info in pfns.items():
            rse = str(info.get("rse", ""))
            if not rse or rse in layouts.rejected:
                continue
            description = layouts.descriptions.get(rse)
            if description is None:
                layouts.sample(rse, scope, name, pfn)  # checked once it is described
                continue
            self._check(description, scope, name, pfn)
        if layouts.candidates and not layouts.confirmed:
            layouts.unplaced += 1
            if layouts.unplaced >= BLIND_GIVE_UP:
                log.info("%d files answered, none at a discovered RSE's computed PFN: first "
                         "reads no longer guess on %s", layouts.unplaced,
                         ", ".join(layouts.candidates))
                layouts.candidates = []
                layouts.changed = True

    def forget(self) -> None:
        """Forget what was learned from the catalog (see :meth:`Layouts.forget`)."""
        self.layouts.forget()

    # -- internals ---------------------------------------------------------------------------

    async def _candidates(self) -> list[str]:
        if self.explicit:
            return list(self.settings.speculate)
        layouts = self.layouts
        for rse in list(layouts.samples):  # RSEs the catalog named: describe and check them
            if rse not in layouts.descriptions and rse not in layouts.unreachable:
                await self._describe(rse)
        preferred = [r for r in self.settings.rses if r not in layouts.rejected]
        learned = [r for r, _ in layouts.confirmed.most_common() if r not in preferred]
        return preferred + learned

    def _check(self, description: RseDescription, scope: str, name: str, pfn: str) -> None:
        computed = description.pfns(scope, name)
        if not computed:
            return
        layouts = self.layouts
        if pfn in computed:
            if self.learning:
                layouts.confirm(description.rse)
            return
        layouts.rejected.add(description.rse)
        layouts.confirmed.pop(description.rse, None)
        layouts.changed = True
        self.counters["speculative_layout_rejected"] += 1
        log.warning("RSE %s: the catalog's PFN for %s:%s is not the one computed with "
                    "lfn2pfn %s: its files are no longer guessed", description.rse, scope,
                    name, description.algorithm)

    async def _describe(self, rse: str) -> RseDescription | None:
        """The RSE's description, fetched once (concurrent callers wait for one request);
        None while it cannot be had."""
        description = self.layouts.descriptions.get(rse)
        if description is not None or rse in self.layouts.unreachable:
            return description
        try:
            return await self._fetch(rse)
        except RucioFsError as exc:
            log.info("RSE %s not described (%s): not guessed for %.0f s", rse, exc,
                     DESCRIPTION_RETRY)
            return None

    async def _fetch(self, rse: str) -> RseDescription | None:
        layouts = self.layouts
        pending = layouts.describing.get(rse)
        if pending is not None:
            await pending.wait()
            return layouts.descriptions.get(rse)
        layouts.describing[rse] = trio.Event()
        try:
            self.counters["rse_descriptions"] += 1
            info = await self.api.json("GET", f"/rses/{quote(rse, safe='')}",
                                       what=f"description of RSE {rse}")
        except RucioFsError:
            layouts.unreachable[rse] = True
            raise
        finally:
            layouts.describing.pop(rse).set()
        description = layouts.describe(rse, info if isinstance(info, dict) else {})
        if description.refusal:
            log.info("RSE %s: files are not guessed (%s)", rse, description.refusal)
        for scope, name, pfn in layouts.samples.pop(rse, []):
            self._check(description, scope, name, pfn)
        return description


def _may_guess(rse: Any) -> bool:
    """Whether an entry of the RSE list may be guessed on: deterministic, disk, readable."""
    return (isinstance(rse, dict) and bool(rse.get("rse")) and rse.get("deterministic") is True
            and str(rse.get("rse_type") or "DISK").upper() == "DISK"
            and rse.get("availability_read", True) is not False)
