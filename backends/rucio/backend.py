"""``rucio://`` — a Rucio server's namespace as directories.

Tree::

    /                    the scopes
    /SCOPE               the scope's top-level DIDs (those attached to no collection)
    /SCOPE/DID/...       containers and datasets are directories, files are files

Any DID can also be reached by path without being listed: ``/SCOPE/NAME``. Below that a path
exists exactly when each DID in it is attached to the one before: ``/SCOPE/DS/F`` is checked
with ``F``'s parents (one small request, however large ``DS`` is), never by listing ``DS``.

Names: a child from another scope appears as ``scope:name``, and ``%``, ``/`` and ``:`` in a
name are escaped (:mod:`.names`).

Costs. A directory listing is one content request (``GET /dids/S/N/dids``), which already
carries bytes, adler32 and md5 of every file: no per-file stat, no replica lookup (only a DID
whose content is empty costs one request more, for its type: a file is no directory). Replicas
are resolved on a file's first read, never while listing; concurrent first reads share one
``POST /replicas/list`` of up to 1,000 DIDs (the server's limit). Files are immutable in Rucio,
so their attributes and data are cached for the long TTL; collections follow the listing TTL.

Writing (``upload_rse=RSE``): files closed in a dataset are uploaded and registered as
``rucio upload`` does, a directory made is a dataset; see :mod:`.upload`. Without it the
mount is read-only.

Reads are HTTP ranged GETs on the PFN chosen by the ``rses`` and ``schemes`` preferences
(``davs``/``dav`` are read as ``https``/``http``; ``local=`` maps PFNs to a local mount of the
RSE), falling over to the next replica when one fails or holds fewer bytes than the catalog
says. Settings: :mod:`.settings`; tokens: :mod:`.auth`.

Why one module of this size: it is the Rucio mapping of the whole backend contract, with
the first read's race between guessed and resolved replicas; names, replicas, speculation,
uploads and settings have modules of their own.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import quote

import trio
from cachetools import TTLCache

from rucio_fs.backend import (
    NO_ATTRIBUTES,
    Attributes,
    Backend,
    Capability,
    Entry,
    Kind,
    SharedValues,
    Upload,
)
from rucio_fs.errors import (
    CrossDevice,
    IntegrityError,
    InvalidInput,
    MissingCredentials,
    NotADirectory,
    NotFound,
    NotPermitted,
    PermissionDenied,
    RucioFsError,
    Unavailable,
)
from rucio_fs.http import (
    ApiClient,
    RangeReader,
    RetryPolicy,
    tls_context,
)
from rucio_fs.identity import CallerCredentials, caller_source
from rucio_fs.options import url_option_values
from rucio_fs.tasks import open_nursery
from rucio_fs.xroot import RootReader

from .auth import RucioAuth, default_token_file, describe
from .names import Did, component_for, did_for
from .replicas import REPLICA_TTL, Replica, ReplicaResolver, readable_url
from .settings import (
    CREDENTIAL_ENV,
    MAX_DIDS_PER_REQUEST,
    OPTIONS,
    RucioSettings,
    load_settings,
)
from .speculation import LESSON_WAIT, Speculator, checksums_match
from .upload import DidPath, Uploads
from .upload import check_new as check_new_did

__all__ = ["RucioBackend"]

log = logging.getLogger(__name__)

#: Siblings resolved with the second cache miss in a dataset; each later miss there takes
#: four times more, up to ``replica_batch``. One ``POST /replicas/list`` costs 60-90 ms plus
#: 1.35 ms per DID on the test server: 16 DIDs cost about as much as one, so the second file
#: read from a dataset already pays for the next 16 (docs/backends/rucio.md, measured).
FIRST_SIBLING_BATCH = 16
#: When this process started: the modification time of every entry (Rucio keeps none).
STARTED_NS = time.time_ns()
#: Most file names of one collection remembered from its listing, for sibling batches.
MAX_SIBLINGS = 100_000

def _did_type(info: Mapping[str, Any]) -> str:
    """The type (``FILE``, ``DATASET``, ``CONTAINER`` …) a DID's description gives."""
    return str(info.get("type") or info.get("did_type") or "").upper()


class _Siblings:
    """The files of one collection in listing order, and where each stands in it."""

    __slots__ = ("files", "index")

    def __init__(self, files: list[Did]) -> None:
        self.files = files
        self.index = {did: i for i, did in enumerate(files)}

    def __len__(self) -> int:
        return len(self.files)

    def around(self, did: Did) -> Iterable[Did]:
        """Every file, starting with those listed after ``did`` (then those before)."""
        start = self.index.get(did, -1) + 1
        return itertools.chain(self.files[start:], self.files[:start])


@dataclass
class _Handle:
    did: Did
    entry: Entry
    #: The collection the file was opened in (None: opened by its scope path).
    parent: Did | None = None
    replicas: list[Replica] | None = None
    preferred: int = 0
    #: Whether the first read may still be guessed (see :mod:`.speculation`).
    guessable: bool = False
    #: The whole file, as a guessed read found and verified it (let go once as many bytes
    #: were served as it holds, in any order, or at close).
    content: bytes | memoryview | None = None
    served: int = 0
    #: Set once the guess has its verdict (concurrent reads wait for it).
    guessing: trio.Event | None = None
    #: An RSE whose copy just failed verification: its replica is tried last.
    distrusted: str = ""


#: What a mount with ``upload_rse`` can do.
WRITABLE = Capability.WRITE | Capability.MKDIR | Capability.UNLINK | Capability.RENAME


class RucioBackend(Backend):
    scheme: ClassVar[str] = "rucio"
    description: ClassVar[str] = ("Rucio data management: rucio://[account@][host[:port]]/"
                                  "[scope[/did]] (rucio.cfg via RUCIO_CONFIG)")
    # A file goes to its storage as one streamed body: its parts in order, one at a time.
    upload_parallelism: ClassVar[int] = 1
    write_once: ClassVar[bool] = True
    # Uploads at the same time share their catalog requests (upload.GroupCommit): the more
    # on their way, the fewer requests per file.
    write_back_parallelism: ClassVar[int] = 128

    def __init__(self, settings: RucioSettings) -> None:
        self.settings = settings
        # Rucio keeps no modification times: every entry shows when this daemon started (one
        # time for all its backends, so a per-user mount's users see the same attributes).
        self.mtime_ns = STARTED_NS
        self.auth = RucioAuth(settings)
        context = tls_context(settings.ca_cert or None)
        self.api = ApiClient(settings.rucio_host, verify=context, timeout=settings.timeout,
                             auth=self.auth, describe=describe,
                             headers={"Accept": "application/x-json-stream, application/json"})
        self.reader = RangeReader(context=context, timeout=settings.timeout)
        #: Guessed reads are tried once: a miss costs the replica lookup, not retries.
        self.guess_reader = RangeReader(context=context, timeout=settings.timeout,
                                        retry=RetryPolicy(attempts=1), threads=4)
        #: root:// (XRootD) replicas: read through the XRootD client, same contract.
        root_credentials = {"X509_USER_PROXY": settings.client_proxy} \
            if settings.client_proxy else {}
        self.root_reader = RootReader(timeout=settings.timeout, credentials=root_credentials)
        self.guess_root_reader = RootReader(timeout=settings.timeout, threads=4,
                                            retry=RetryPolicy(attempts=1),
                                            credentials=root_credentials)
        self.speculator = Speculator(self.api, settings)
        self.resolver = ReplicaResolver(
            self.api, settings, lambda did, pfns: self.speculator.observe(*did, pfns))
        #: (parent, child) attachments already checked (see :meth:`_check_members`).
        self._members: TTLCache[tuple[Did, Did], bool] = TTLCache(200_000, REPLICA_TTL)
        #: Files of each collection in listing order, as this mount last listed them.
        self._siblings: TTLCache[Did, _Siblings] = TTLCache(
            2_000_000, REPLICA_TTL, getsizeof=len)
        #: Replica lookups that missed the cache, per collection (sets the next batch).
        self._misses: TTLCache[Did, int] = TTLCache(10_000, REPLICA_TTL)
        #: RSEs whose copy of a file failed verification, read last for that file.
        self._distrusted: TTLCache[Did, frozenset[str]] = TTLCache(10_000, REPLICA_TTL)
        self._caching = True
        self.uploads: Uploads | None = None
        if settings.upload_rse:
            self.capabilities = WRITABLE
            self.uploads = Uploads(self.api, settings, context, self.mtime_ns)

    @classmethod
    def capabilities_for(cls, url: str) -> Capability:
        """Writable when the URL names an ``upload_rse``."""
        query = url.partition("?")[2]
        try:
            named = url_option_values(query, OPTIONS, "rucio").get("upload_rse")
        except InvalidInput:
            return cls.capabilities  # building the backend says what is wrong
        return WRITABLE if named and named[-1] else cls.capabilities

    credential_env: ClassVar[tuple[str, ...]] = CREDENTIAL_ENV

    @classmethod
    def from_url(cls, url: str) -> RucioBackend:
        return cls(load_settings(url))

    @classmethod
    def for_caller(cls, url: str, credentials: CallerCredentials) -> RucioBackend:
        """The caller's rucio.cfg (``RUCIO_CONFIG``, ``$RUCIO_HOME/etc``, ``$VIRTUAL_ENV/etc``,
        ``/opt/rucio/etc``), then its environment (``X509_USER_PROXY``, else
        ``/tmp/x509up_u<uid>``; ``RUCIO_AUTH_TOKEN``, else its token file), then the URL."""
        settings = load_settings(url, caller_source(credentials))
        if settings.auth_type == "token" and not settings.token:
            path = settings.token_file or default_token_file(settings.account,
                                                             credentials.user)
            if not credentials.readable(path):
                raise MissingCredentials(f"auth_type token needs RUCIO_AUTH_TOKEN or a token "
                                         f"file ({path})")
            settings = dataclasses.replace(settings, token_file=credentials.private_copy(path))
        return cls(settings)

    async def start(self) -> None:
        await self.auth.headers()  # a bad password fails the mount, not the first ls
        await self.speculator.start()
        async with trio.open_nursery() as nursery:  # first guesses pay no TCP/TLS handshake
            for endpoint in self.speculator.first_endpoints():
                url = readable_url(endpoint, self.settings)[0]
                nursery.start_soon(self._reader(url, guess=True).connect, url)

    async def aclose(self) -> None:
        if self.uploads is not None:
            await self.uploads.aclose()
        await self.api.aclose()
        self.reader.close()
        self.guess_reader.close()
        self.root_reader.close()
        self.guess_root_reader.close()

    # -- paths and entries -------------------------------------------------------------------

    def _components(self, path: str) -> list[str]:
        return [*self.settings.root, *(p for p in path.split("/") if p)]

    @staticmethod
    def _dids(components: list[str]) -> list[Did]:
        """The DIDs along ``/scope/c1/c2/...``: each component relative to its parent's
        scope."""
        did, dids = Did(components[0], ""), []
        for component in components[1:]:
            did = did_for(component, did.scope)
            dids.append(did)
        return dids

    def _did(self, components: list[str]) -> Did:
        """The DID at ``/scope/c1/c2/...``."""
        return self._dids(components)[-1]

    async def _check_members(self, dids: list[Did]) -> None:
        """NotFound unless every DID in ``dids`` is attached to the one before it. Each link
        is one ``parents`` request of the child (all at once), remembered while caching."""
        links = [(parent, child) for parent, child in itertools.pairwise(dids)
                 if not (self._caching and (parent, child) in self._members)]

        async def check(parent: Did, child: Did) -> None:
            async for line in self.api.ndjson("GET", child.url() + "/parents",
                                              what=f"parents of {child}"):
                if Did(str(line.get("scope", "")), str(line.get("name", ""))) == parent:
                    if self._caching:
                        self._members[(parent, child)] = True
                    return
            raise NotFound(f"{child} is not attached to {parent}")

        async with open_nursery() as nursery:
            for parent, child in links:
                nursery.start_soon(check, parent, child)

    def _entry(self, name: str, info: Mapping[str, Any]) -> Entry:
        kind = _did_type(info)
        if kind != "FILE":
            return Entry(name=name, kind=Kind.DIR, mtime_ns=self.mtime_ns,
                         metadata={"type": kind})
        checksums = {algo: str(info[algo]) for algo in ("adler32", "md5") if info.get(algo)}
        return Entry(name=name, kind=Kind.FILE, size=int(info.get("bytes") or 0),
                     mtime_ns=self.mtime_ns, checksums=checksums, immutable=True,
                     version=checksums.get("adler32") or checksums.get("md5", ""))

    async def _scopes(self) -> list[str]:
        answer = await self.api.json("GET", "/scopes/", what="list of scopes")
        if not isinstance(answer, list):
            raise Unavailable("list of scopes: unexpected answer")
        # Rucio 41 answers names; some versions answer {"scope": name} objects.
        return [s["scope"] if isinstance(s, dict) else str(s) for s in answer]

    # -- the Backend contract ----------------------------------------------------------------

    async def stat(self, path: str) -> Entry:
        components = self._components(path)
        if not components:
            return Entry(name="", kind=Kind.DIR, mtime_ns=self.mtime_ns)
        if len(components) == 1:
            if components[0] not in await self._scopes():
                raise NotFound(f"no scope {components[0]!r}")
            return Entry(name=components[0], kind=Kind.DIR, mtime_ns=self.mtime_ns,
                         metadata={"type": "SCOPE"})
        dids = self._dids(components)
        did = dids[-1]
        answer: dict[str, Any] = {}

        async def fetch() -> None:
            answer["info"] = await self.api.json("GET", did.url(), what=f"stat of {did}")

        async with open_nursery() as nursery:  # the DID and its attachments at once
            nursery.start_soon(fetch)
            nursery.start_soon(self._check_members, dids)
        entry = self._entry(components[-1], answer["info"])
        if path == "/" and not entry.is_dir:  # the mount's root: checked as it mounts
            raise InvalidInput(f"{did} is a file, not a collection: mount its dataset or "
                               "container")
        return entry

    async def list(self, path: str) -> AsyncIterator[Entry]:
        """The scopes, a scope's top-level DIDs, or a collection's content (one request).
        A file's content is empty as an empty collection's is, so a DID's path below a scope
        that lists nothing costs one request more, for its type: a file is NotADirectory.
        A file this mount saw in its collection's listing is known: no request for it."""
        components = self._components(path)
        if not components:
            for scope in await self._scopes():
                yield Entry(name=scope, kind=Kind.DIR, mtime_ns=self.mtime_ns,
                            metadata={"type": "SCOPE"})
            return
        did: Did | None = None
        if len(components) == 1:
            scope = components[0]
            request, parent_scope = f"/dids/{quote(scope, safe='')}/", scope
            what = f"top-level DIDs of scope {scope}"
        else:
            dids = self._dids(components)
            await self._check_members(dids)
            did = dids[-1]
            if self._listed_as_file(dids):
                raise NotADirectory(path)
            request, parent_scope, what = did.url() + "/dids", did.scope, f"content of {did}"
        # A scope's listing carries no checksums: its files' come from bulk metadata (one
        # request per MAX_DIDS_PER_REQUEST files), so they are verified like any other.
        unsummed: list[tuple[Did, dict[str, Any]]] = []
        files: list[Did] | None = [] if len(components) > 1 and self._caching else None
        empty = True
        async for info in self.api.ndjson("GET", request, what=what):
            child = Did(str(info.get("scope") or parent_scope), str(info.get("name", "")))
            if not child.name:
                continue
            empty = False
            is_file = _did_type(info) == "FILE"
            if is_file and files is not None:
                files.append(child)
                if len(files) > MAX_SIBLINGS:
                    files = None
            if is_file and not (info.get("adler32") or info.get("md5")):
                unsummed.append((child, dict(info)))
                if len(unsummed) >= MAX_DIDS_PER_REQUEST:
                    for entry in await self._with_checksums(unsummed, parent_scope):
                        yield entry
                    unsummed = []
                continue
            yield self._entry(component_for(child, parent_scope), info)
        if unsummed:
            for entry in await self._with_checksums(unsummed, parent_scope):
                yield entry
        if files:
            self._siblings[self._did(components)] = _Siblings(files)
        if empty and did is not None:
            info = await self.api.json("GET", did.url(), what=f"type of {did}")
            if _did_type(info) == "FILE":
                raise NotADirectory(path)

    def _listed_as_file(self, dids: list[Did]) -> bool:
        """Whether the last of ``dids`` is a file as its collection's listing by this mount
        showed it (a DID never changes type)."""
        siblings = self._siblings.get(dids[-2]) if self._caching and len(dids) > 1 else None
        return siblings is not None and dids[-1] in siblings.index

    async def _with_checksums(self, files: list[tuple[Did, dict[str, Any]]],
                              parent_scope: str) -> list[Entry]:
        """Entries of ``files`` with the checksums their bulk metadata gives."""
        body = {"dids": [{"scope": did.scope, "name": did.name} for did, _ in files]}
        sums: dict[Did, dict[str, Any]] = {}
        async for meta in self.api.ndjson("POST", "/dids/bulkmeta", json=body,
                                          what=f"metadata of {len(files)} file(s)"):
            if isinstance(meta, dict):
                sums[Did(str(meta.get("scope", "")), str(meta.get("name", "")))] = meta
        entries = []
        for did, info in files:
            meta = sums.get(did, {})
            info.update({algo: meta[algo] for algo in ("adler32", "md5") if meta.get(algo)})
            entries.append(self._entry(component_for(did, parent_scope), info))
        return entries

    def use_caches(self, enabled: bool) -> None:
        self.resolver.caching = self._caching = enabled
        self.speculator.learning = enabled

    def use_shared_values(self, values: SharedValues) -> None:
        """Resolved replica locations (the PFNs and their RSEs, as the catalog listed them;
        never a signed one) are shared: the first read of a file on another mount skips the
        catalog. Each mount still orders them by its own ``rses``, ``local`` and schemes.
        What a mount learned of RSE layouts is shared too (:mod:`.kept_layouts`)."""
        self.resolver.shared = self.speculator.kept.shared = values

    def keep_state_in(self, directory: Path) -> None:
        """What a mount learned of RSE layouts is kept there (:mod:`.kept_layouts`)."""
        self.speculator.kept.keep_in(directory)

    def use_hints(self, hints: dict[str, Any]) -> None:
        """The users of a per-user mount share what they learn of RSE layouts (per catalog
        host and VO): a guessed read is served only when its bytes match the caller's own
        catalog entry, read with the caller's own credentials."""
        key = f"rucio layouts {self.settings.rucio_host} vo={self.settings.vo}"
        self.speculator.layouts = hints.setdefault(key, self.speculator.layouts)

    def use_data_proxy(self, url: str) -> None:
        """Replica URLs name the file, not the reader: a proxy may cache them (``local=``
        replicas are read from the local file system, never through it)."""
        self.reader.via = self.guess_reader.via = url

    def drop_caches(self) -> None:
        self.resolver.clear()
        self._members.clear()
        self._siblings.clear()
        self._misses.clear()
        self.speculator.forget()

    def lists_everything(self, path: str) -> bool:
        return len(self._components(path)) != 1  # a scope lists only its top-level DIDs

    async def open(self, path: str, entry: Entry) -> _Handle:
        # Replicas are resolved by the first read that misses the data cache: a warm cat
        # costs no request at all.
        dids = self._dids(self._components(path))
        return _Handle(dids[-1], entry, dids[-2] if len(dids) > 1 else None,
                       guessable=self.speculator.applies(entry))

    async def read(self, handle: _Handle, offset: int, size: int) -> bytes | memoryview:
        if handle.content is None and handle.guessable and handle.replicas is None:
            handle.guessable = False
            handle.guessing = trio.Event()
            try:
                handle.content = await self._first_read(handle)
            finally:
                handle.guessing.set()
        elif handle.guessing is not None and not handle.guessing.is_set():
            await handle.guessing.wait()  # a concurrent read waits for the guess's verdict
        if handle.content is not None:
            data = handle.content[offset:offset + size]
            handle.served += len(data)
            if handle.served >= len(handle.content):
                handle.content = None  # read through: a later read asks the replicas
            return data
        if handle.replicas is None:
            handle.replicas = self._ordered(handle, await self._resolve(handle))
        replicas = handle.replicas
        if not replicas:
            handle.replicas = None
            self.resolver.forget(handle.did)
            raise Unavailable(f"{handle.did}: no available replica in a readable scheme "
                              f"({', '.join(self.settings.schemes)})")
        failures: list[str] = []
        short = False
        for step in range(len(replicas)):
            index = (handle.preferred + step) % len(replicas)
            replica = replicas[index]
            try:
                data = await self._reader(replica.url).read(replica.url, offset, size)
            except RucioFsError as exc:
                failures.append(f"{replica.rse}: {exc}")
                continue
            if len(data) < size:
                short = True
                failures.append(f"{replica.rse}: storage holds fewer bytes than the catalog")
                continue
            handle.preferred = index
            return data
        # Every replica failed: the next read asks the catalog again (replicas may have moved).
        handle.replicas = None
        self.resolver.forget(handle.did)
        error = IntegrityError if short else Unavailable
        raise error(f"{handle.did}: no readable replica ({'; '.join(failures) or 'none'})")

    async def close(self, handle: _Handle) -> None:
        handle.content = None

    def _reader(self, url: str, guess: bool = False) -> RangeReader | RootReader:
        """What reads ``url``: the XRootD client for root://, else HTTP (or a local file)."""
        if url.startswith(("root://", "roots://")):
            return self.guess_root_reader if guess else self.root_reader
        return self.guess_reader if guess else self.reader

    async def _first_read(self, handle: _Handle) -> bytes | memoryview | None:
        """The whole file read from its guessed PFN while the replica lookup runs (started
        after ``speculate_hedge`` of silence, or at once when the guess misses): the verified
        bytes, or None with ``handle.replicas`` set by the lookup. A lookup that fails
        leaves the guess to answer; if both fail, the lookup's error is raised. With nothing
        to guess yet, the lookup goes at once, and a layout another answer teaches while it
        runs (another file's, or another user's) is guessed on then."""
        speculator = self.speculator
        guesses = await speculator.guesses(*handle.did)
        if not guesses and not speculator.learns:
            return None
        counters = speculator.counters
        under_way = speculator.layouts.lesson_under_way() if not guesses else None
        if under_way is not None:
            counters["speculative_waited"] += 1
            with trio.move_on_after(LESSON_WAIT):
                await under_way.wait()
            guesses = await speculator.guesses(*handle.did)
        found: list[bytes | memoryview] = []
        failures: list[RucioFsError] = []
        hedge = trio.CancelScope()
        guessing = False
        #: Guesses started and not answered yet: the lookup starts when the last one misses.
        unanswered = 0

        async def lookup() -> None:
            try:
                with self.speculator.layouts.first_lookup():
                    handle.replicas = self._ordered(handle, await self._resolve(handle))
            except RucioFsError as exc:
                failures.append(exc)
                if guessing:
                    return  # the guess may still answer
            nursery.cancel_scope.cancel()

        def start_lookup() -> None:
            if not hedge.cancel_called:
                hedge.cancel()
                nursery.start_soon(lookup)

        async def guessed_read(guess: tuple[str, str]) -> None:
            nonlocal unanswered
            rse, pfn = guess
            url, _ = readable_url(pfn, self.settings)
            counters["speculative_reads"] += 1
            try:
                data = await self._reader(url, guess=True).read(url, 0, handle.entry.size)
            except RucioFsError as exc:
                counters["speculative_misses"] += 1
                log.debug("%s: not at its computed PFN on %s (%s)", handle.did, rse, exc)
            else:
                if checksums_match(data, handle.entry):
                    counters["speculative_hits"] += 1
                    speculator.verified(rse)
                    found.append(data)
                    nursery.cancel_scope.cancel()
                    return
                if len(data) < handle.entry.size:
                    counters["speculative_misses"] += 1
                else:
                    counters["speculative_mismatches"] += 1
                    handle.distrusted = rse
                    log.warning("%s: the copy at its computed PFN on %s does not match the "
                                "catalog's checksums: asking the replica catalog", handle.did,
                                rse)
            unanswered -= 1
            if not unanswered:
                start_lookup()

        def start_guesses(guesses: list[tuple[str, str]]) -> None:
            nonlocal guessing, unanswered
            guessing = True
            unanswered += len(guesses)
            for guess in guesses:
                nursery.start_soon(guessed_read, guess)

        async def hedge_timer() -> None:
            with hedge:
                await trio.sleep(self.settings.speculate_hedge)
                counters["speculative_hedged"] += 1
            start_lookup()

        async def late_guess() -> None:
            while True:
                lesson = speculator.layouts.next_lesson()
                guesses = await speculator.guesses(*handle.did)
                if guesses:
                    break
                await lesson.wait()
                if self.resolver.answered(handle.did):
                    return  # the answer that taught it is this file's own: it is on its way
            counters["speculative_late"] += 1
            start_guesses(guesses)

        async with trio.open_nursery() as nursery:
            if guesses:
                start_guesses(guesses)
                nursery.start_soon(hedge_timer)
            else:  # the lookup goes at once; a layout learned meanwhile is guessed on
                start_lookup()
                nursery.start_soon(late_guess)
        await speculator.keep()
        if found:
            return found[0]
        if handle.replicas is None:
            raise failures[0]
        return None

    async def _resolve(self, handle: _Handle) -> list[Replica]:
        """The replicas of ``handle``'s file, with siblings resolved in the same request once
        its collection's files are being read one after another."""
        return await self.resolver.resolve(handle.did, self._companions(handle))

    def _companions(self, handle: _Handle) -> list[Did]:
        """The siblings to resolve with ``handle``'s file: none on the first replica lookup in
        its collection, then :data:`FIRST_SIBLING_BATCH`, four times more each lookup after,
        up to ``replica_batch`` — the files listed after it first, then those before."""
        parent = handle.parent
        if (parent is None or not self._caching or not self.settings.replica_batch
                or self.resolver.known(handle.did)):
            return []
        misses = self._misses.get(parent, 0)
        self._misses[parent] = misses + 1
        siblings = self._siblings.get(parent)
        if not misses or siblings is None:
            return []
        want = min(self.settings.replica_batch, FIRST_SIBLING_BATCH * 4 ** (misses - 1))
        return list(itertools.islice(
            (did for did in siblings.around(handle.did)
             if did != handle.did and not self.resolver.known(did)), want))

    def _ordered(self, handle: _Handle, replicas: list[Replica]) -> list[Replica]:
        """``replicas`` with those on an RSE whose copy failed verification last."""
        distrusted = self._distrusted.get(handle.did, frozenset())
        if not handle.distrusted and not distrusted:
            return replicas
        return sorted(replicas, key=lambda r: r.rse == handle.distrusted or r.rse in distrusted)

    def distrust(self, handle: _Handle) -> None:
        """The copy the handle read failed verification: read that file elsewhere next."""
        if handle.replicas:
            rse = handle.replicas[handle.preferred].rse
            self._distrusted[handle.did] = self._distrusted.get(handle.did, frozenset()) | {rse}
            log.warning("%s: the copy on %s does not match the catalog's checksum; reading "
                        "other copies first", handle.did, rse)
        handle.replicas, handle.preferred = None, 0

    async def xattrs(self, path: str, entry: Entry) -> Mapping[str, bytes]:
        components = self._components(path)
        if len(components) < 2:  # the account shows whose view a (per-user) mount serves
            return {"rucio.account": self.settings.account.encode(),
                    **({"rucio.scope": components[0].encode()} if components else {})}
        did = self._did(components)
        attrs: dict[str, str] = {"rucio.scope": did.scope, "rucio.name": did.name,
                                 "rucio.type": entry.metadata.get("type", "FILE")}
        if not entry.is_dir:
            attrs["rucio.bytes"] = str(entry.size)
            attrs.update({f"rucio.{algo}": value for algo, value in entry.checksums.items()})
            replicas = await self.resolver.resolve(did)
            attrs["rucio.replicas"] = ",".join(dict.fromkeys(r.rse for r in replicas))
        meta = await self.api.json("GET", did.url() + "/meta", what=f"metadata of {did}")
        for key, value in (meta.items() if isinstance(meta, dict) else ()):
            if value is not None and value != "":
                attrs[f"rucio.meta.{key}"] = str(value)
        return {key: value.encode() for key, value in attrs.items()}

    # -- writing (see :mod:`.upload`) --------------------------------------------------------

    def _writer(self) -> Uploads:
        if self.uploads is None:
            raise NotPermitted("this Rucio mount is read-only (mount with upload_rse=RSE to "
                               "write)")
        return self.uploads

    def _target(self, path: str) -> DidPath:
        """The DID ``path`` names and the collection it is in (None: its scope's top)."""
        components = self._components(path)
        if len(components) < 2:
            raise NotPermitted(f"{path}: scopes are made by Rucio's administrators")
        dids = self._dids(components)
        return DidPath(dids[-1], dids[-2] if len(dids) > 1 else None)

    def check_new(self, path: str, kind: Kind, parent: Entry) -> None:
        """Files go in datasets and directories (datasets) in scopes or containers; names
        follow Rucio's schema. A directory made here and not yet sent is a dataset."""
        self._writer()
        depth = len(self._components(path)) - 1  # the parent's
        if depth == 0:
            parent_type = ""
        elif depth == 1:
            parent_type = "SCOPE"
        else:
            parent_type = str(parent.metadata.get("type") or "DATASET").upper()
        check_new_did(kind, parent_type, self._target(path).did.name if depth else path)

    async def put(self, path: str, data: bytes, attributes: Attributes = NO_ATTRIBUTES
                  ) -> Entry:
        return await self._writer().put(self._target(path), path.rpartition("/")[2], data)

    async def begin_upload(self, path: str, attributes: Attributes = NO_ATTRIBUTES) -> Upload:
        return await self._writer().begin(self._target(path), path.rpartition("/")[2])

    async def confirm(self, path: str, expected: Entry) -> Entry:
        return await self._writer().confirm(self._target(path), expected)

    async def mkdir(self, path: str, attributes: Attributes = NO_ATTRIBUTES) -> Entry:
        return await self._writer().make_dataset(self._target(path), path.rpartition("/")[2])

    async def unlink(self, path: str) -> None:
        target = self._target(path)
        await self._writer().detach(target)
        self._members.pop((target.parent, target.did), None)  # type: ignore[arg-type]

    async def rmdir(self, path: str) -> None:
        raise PermissionDenied(f"{path}: Rucio keeps collections (rm -r detaches the files "
                               "your account wrote, and leaves the dataset)")

    async def rename(self, old: str, new: str, entry: Entry) -> Entry:
        raise CrossDevice(f"{old}: Rucio names are permanent (mv copies the file under the "
                          "new name and detaches the old one)")

    def shared_identity(self) -> str:
        s = self.settings
        return (f"rucio {s.rucio_host} vo={s.vo} account={s.account} "
                f"root=/{'/'.join(s.root)}")

    def counters(self) -> Mapping[str, int]:
        return {
            **{f"api_{k}": v for k, v in self.api.counters.items()},
            **{f"storage_{k}": v for k, v in self.reader.counters.items()},
            **{f"xroot_{k}": v for k, v in self.root_reader.counters.items()},
            "xroot_logins_ahead": self.guess_root_reader.counters["logins_ahead"],
            **self.speculator.counters,
            "replica_requests": self.resolver.requests,
            "replica_shared_hits": self.resolver.shared_hits,
            "replica_dids": self.resolver.dids,
            "token_fetches": self.auth.renewals,
        }
