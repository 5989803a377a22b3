"""Writing into Rucio as ``rucio upload`` does: a file closed in a dataset becomes a file DID
with its replica on the mount's ``upload_rse``, registered AVAILABLE and attached.

One file, whatever path it took (one ``PUT`` for a small file, a body streamed while a big
one is still being written)::

    PUT     <pfn>.<tag>.rucio.upload         the bytes, adler32 and md5 computed as they pass
    POST    /replicas                        the DID and its replica, state COPYING (a name
                                             claimed: a replica nobody may read yet)
    POST    /dids/bulkmeta                   the catalog holds our size and checksums? Else
                                             the name is someone else's: EEXIST, nothing moved
    MOVE    temp -> <pfn>                    the bytes where the catalog says they are
    HEAD    <pfn>                            their size checked on the storage
    PUT     /replicas                        state AVAILABLE
    POST    /replicas/list                   read back: AVAILABLE, our size and checksums
    POST    /dids/attachments                attached to the dataset
    GET     /dids/<dataset>/dids (or the     read back (the core's ``confirm``)
            file's parents)

(and first ``GET /rses/<rse>/lfns2pfns``: where the bytes go.)

The catalog steps of files uploaded at the same time (async write-back runs many) go
together: one request for the whole group at each step (:class:`GroupCommit`).

Every step may be repeated: the core uploads the staged file again after a failure, a crash
or a remount (its journal), and each step finds what an earlier try did: registering a
file that exists changes nothing, a repeated move finds the bytes in place (checked by
size), an attachment that exists is done. The same content under the same name (an earlier
try, or another client's) lands on the same PFN: never a second copy. So a replica is
AVAILABLE only once its bytes are verified at its PFN, and a file is attached only once its
replica is AVAILABLE. A file whose name holds other content in the catalog is never
stored: Rucio files are immutable.

Namespace: ``mkdir`` makes a dataset (in a scope, or attached to the container it is made
in) with a rule of one copy on ``upload_rse`` (lifetime ``upload_rule_lifetime``), as
``rucio upload`` does for a dataset it creates. ``unlink`` detaches a file the mount's
account created from its open dataset (the replica is then the reaper's); everything else
is refused. A closed dataset takes no files.

Why one module of this size: the upload is one protocol whose steps (and the group commit
that batches them) must be read together to check its invariant.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import secrets
import ssl
import zlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Generic, TypeVar
from urllib.parse import quote, urlsplit

import trio
from cachetools import TTLCache

from rucio_fs.backend import Entry, Kind, Upload
from rucio_fs.errors import (
    AlreadyExists,
    IntegrityError,
    InvalidInput,
    NotFound,
    NotPermitted,
    PermissionDenied,
    RucioFsError,
    Unavailable,
    Unconfirmed,
)
from rucio_fs.http import ApiClient, StreamedPut
from rucio_fs.xroot import RootStorage, RootWriter, is_root

from .layout import pfn_url
from .names import Did
from .settings import RucioSettings

log = logging.getLogger(__name__)

T = TypeVar("T")
V = TypeVar("V")

#: DID names the server's generic schema accepts.
NAME_PATTERN = re.compile(r"^[/A-Za-z0-9][/A-Za-z0-9.\-_]*$")
NAME_MAX = 250
#: The longest name a POSIX file system behind a storage keeps (NAME_MAX of Linux).
STORAGE_NAME_MAX = 255
#: Collection types files and datasets may be made in.
FILE_PARENTS = frozenset({"DATASET"})
DATASET_PARENTS = frozenset({"SCOPE", "CONTAINER"})
#: Most files in one registration request (SQLite-backed servers refuse 999 or more).
BATCH_MAX = 500
#: Largest dataset whose content is listed to check that files were attached to it (a
#: bigger one is asked each file's parents).
LISTED_CHECK_MAX = 10_000
#: Most storage paths asked in one request (names in its URL).
PFN_BATCH_MAX = 50
#: The scheme a read-back asks PFNs in: no RSE protocol has it, so the server builds none.
_NO_SCHEME = "rucio-fs-states-only"
#: How long a replica read back AVAILABLE by its upload answers for ``confirm``.
VERIFIED_TTL = 30.0
#: How long whether a dataset is open is remembered.
OPEN_TTL = 60.0


class DidPath:
    """A file or dataset to be made: its DID, and the collection it goes into (None: the
    top level of its scope)."""

    __slots__ = ("did", "parent")

    def __init__(self, did: Did, parent: Did | None) -> None:
        self.did = did
        self.parent = parent


def check_name(name: str) -> None:
    """InvalidInput unless Rucio's generic schema accepts ``name`` for a DID."""
    if len(name) > NAME_MAX or not NAME_PATTERN.match(name):
        raise InvalidInput(f"{name!r} is no Rucio name: names start with a letter, digit "
                           f"or '/', then letters, digits and '/.-_' (at most {NAME_MAX})")


def check_new(kind: Kind, parent_type: str, name: str) -> None:
    """Raise what making a ``kind`` named ``name`` in a collection of ``parent_type``
    (``SCOPE``, ``CONTAINER``, ``DATASET``; empty: the list of scopes) would meet."""
    if kind is Kind.FILE:
        if parent_type not in FILE_PARENTS:
            raise NotPermitted(f"{name}: Rucio keeps files in datasets (make a directory in a "
                               "scope or container: it is a dataset)")
    elif kind is Kind.DIR:
        if parent_type not in DATASET_PARENTS:
            raise NotPermitted(f"{name}: a directory made here is a dataset, which goes in a "
                               "scope or a container" + (", not in a dataset"
                                                          if parent_type == "DATASET" else ""))
    else:
        raise NotPermitted(f"{name}: Rucio has no symbolic links")
    check_name(name)


class Uploads:
    """The mount's writes into Rucio (see the module docstring); ``rse`` is where files go."""

    def __init__(self, api: ApiClient, settings: RucioSettings, context: ssl.SSLContext,
                 mtime_ns: int) -> None:
        self.api = api
        self.settings = settings
        self.rse = settings.upload_rse
        self.context = context
        self.mtime_ns = mtime_ns
        self._storage: dict[str, ApiClient] = {}
        #: root:// storage (an RSE whose write protocol is XRootD).
        self.root = RootStorage(settings.timeout, {"X509_USER_PROXY": settings.client_proxy}
                                if settings.client_proxy else None)
        #: Files whose replica an upload just read back AVAILABLE (DID -> adler32): their
        #: ``confirm`` reads back only the attachment.
        self._available: TTLCache[Did, str] = TTLCache(100_000, VERIFIED_TTL)
        self._pfns = GroupCommit(self._lookup_pfns, PFN_BATCH_MAX)
        self._attached = GroupCommit(self._check_attached, BATCH_MAX)
        self._datasets = GroupCommit(self._describe_datasets, PFN_BATCH_MAX)
        #: How many files each dataset written into holds, about (what the catalog said at
        #: its first write, plus the files attached since).
        self._lengths: dict[Did, int] = {}
        self._claims = GroupCommit(self._claim, BATCH_MAX)
        self._availability = GroupCommit(self._make_available, BATCH_MAX)
        self._attachments = GroupCommit(self._attach_all, BATCH_MAX)
        #: Whether datasets written into are open (see :meth:`check_open`).
        self._open: TTLCache[Did, bool] = TTLCache(10_000, OPEN_TTL)

    async def aclose(self) -> None:
        for client in self._storage.values():
            await client.aclose()

    # -- files ------------------------------------------------------------------------------

    async def put(self, target: DidPath, name: str, data: bytes) -> Entry:
        """Store ``data`` as file ``target`` (see the module docstring)."""
        if target.parent is not None:
            await self.check_open(target.parent)
        adler32, md5 = await trio.to_thread.run_sync(_checksums, data)
        final = await self._pfn(target.did)
        temp = _temporary(final, md5[:8])
        if is_root(temp):
            await trio.to_thread.run_sync(self.root.put, temp, data, abandon_on_cancel=True)
        else:
            client, path = self._client(temp)
            await client.request("PUT", path, content=data, expect=(200, 201, 204),
                                 what=f"upload of {target.did} to {self.rse}")
        return await self._register(target, name, temp, final, len(data), adler32, md5)

    async def begin(self, target: DidPath, name: str) -> Upload:
        """An upload of file ``target`` whose body is streamed as its parts come."""
        if target.parent is not None:
            await self.check_open(target.parent)
        final = await self._pfn(target.did)
        temp = _temporary(final, secrets.token_hex(4))
        put: StreamedPut | _RootPut
        if is_root(temp):
            put = _RootPut(await trio.to_thread.run_sync(self.root.writer, temp,
                                                         abandon_on_cancel=True))
        else:
            put = StreamedPut(pfn_url(temp), context=self.context,
                              timeout=self.settings.timeout)
        return _StreamedUpload(self, target, name, final, temp, put)

    async def confirm(self, target: DidPath, expected: Entry) -> Entry:
        """Prove what :meth:`_register` did, read back from the catalog (a request
        answered with success that did nothing must not pass): an AVAILABLE replica on the
        RSE with the expected size and adler32, attached to its dataset. Unconfirmed
        otherwise."""
        did = target.did
        found: dict[str, Any] = {}

        async def replica() -> None:
            found["replica"] = (await self._replicas([did])).get(did)

        async def attached() -> None:
            found["attached"] = await self._attached.run(target)

        # The replica was read back AVAILABLE moments ago by the upload itself.
        verified = self._available.get(did) == expected.version
        async with trio.open_nursery() as nursery:
            if not verified:
                nursery.start_soon(replica)
            if target.parent is not None:
                nursery.start_soon(attached)
        line = found.get("replica") or {}
        if not verified and (not _available_on(line, self.rse) or not _same_file(
                line, expected.size, expected.version, expected.checksums.get("md5", ""))):
            raise Unconfirmed(f"{did}: no AVAILABLE replica on {self.rse} with "
                              f"{expected.size} bytes and adler32 {expected.version}")
        if target.parent is not None and not found.get("attached"):
            raise Unconfirmed(f"{did}: not attached to {target.parent}")
        return expected

    async def _check_attached(self, targets: list[DidPath]) -> dict[DidPath, bool]:
        """Whether each file is attached to its dataset, as the catalog says now: one
        listing of a dataset for all of its files here, while it holds at most
        :data:`LISTED_CHECK_MAX` files; else each file's parents."""
        by_parent: dict[Did, list[DidPath]] = {}
        for target in targets:
            assert target.parent is not None
            by_parent.setdefault(target.parent, []).append(target)
        found: dict[DidPath, bool] = {}

        async def check(parent: Did, group: list[DidPath]) -> None:
            if len(group) > 1 and self._lengths.get(parent, 0) <= LISTED_CHECK_MAX:
                content = set()
                async for line in self.api.ndjson("GET", parent.url() + "/dids",
                                                  what=f"content of {parent}"):
                    content.add((line.get("scope"), line.get("name")))
                for target in group:
                    found[target] = (target.did.scope, target.did.name) in content
                return
            for target in group:
                found[target] = False
                async for line in self.api.ndjson("GET", target.did.url() + "/parents",
                                                  what=f"parents of {target.did}"):
                    if (line.get("scope"), line.get("name")) == (parent.scope, parent.name):
                        found[target] = True

        async with trio.open_nursery() as nursery:
            for parent, group in by_parent.items():
                nursery.start_soon(check, parent, group)
        return found

    async def _register(self, target: DidPath, name: str, temp: str, final: str, size: int,
                        adler32: str, md5: str) -> Entry:
        """The bytes are at ``temp``: claim the name, move them to ``final``, verify, make
        the replica AVAILABLE and attach it. The catalog steps of uploads under way at the
        same time go together (see :class:`GroupCommit`)."""
        file = _File(target, temp, final, size, adler32, md5)
        await self._claims.run(file)
        await self._move(temp, final, size)
        await self._availability.run(file)
        self._available[target.did] = adler32
        if target.parent is not None:
            await self._attachments.run(file)
        return Entry(name=name, kind=Kind.FILE, size=size, mtime_ns=self.mtime_ns,
                     checksums={"adler32": adler32, "md5": md5}, immutable=True,
                     version=adler32)

    async def _claim(self, files: list[_File]) -> dict[_File, RucioFsError]:
        """Register the files (replicas COPYING: nobody reads them yet) and check that the
        catalog holds their size and checksums: registering a file that exists changes
        nothing, so the name is ours only if it does (an earlier try, or the same content).
        Another file under the name: AlreadyExists, and its bytes are left alone."""
        # One record per DID: the same file written into several datasets at once is one
        # registration (a DID twice in one request is a database error on the server).
        records = list({f.did: dict(f.record(), state="C") for f in reversed(files)}.values())
        await self.api.request("POST", "/replicas", expect=(201,),
                               json={"rse": self.rse, "ignore_availability": True,
                                     "files": records},
                               what=f"registration of {_files(files)} on {self.rse}")
        held: dict[tuple[str, str], Mapping[str, Any]] = {}
        body = {"dids": [{"scope": f.did.scope, "name": f.did.name} for f in files]}
        async for meta in self.api.ndjson("POST", "/dids/bulkmeta", json=body,
                                          what=f"metadata of {_files(files)}"):
            if isinstance(meta, dict):
                held[(str(meta.get("scope")), str(meta.get("name")))] = meta
        failures: dict[_File, RucioFsError] = {}
        for f in files:
            if not _same_file(held.get((f.did.scope, f.did.name), {}), f.size, f.adler32,
                              f.md5):
                await self._discard(f.temp)
                failures[f] = AlreadyExists(f"{f.did} exists in Rucio with other content "
                                            "(files are immutable: write it under another "
                                            "name)")
        return failures

    async def _make_available(self, files: list[_File]) -> dict[_File, RucioFsError]:
        """Make the replicas AVAILABLE (their bytes are in place), then read them back: an
        answer of success may not mean it, and a file is attached only once AVAILABLE."""
        await self.api.request("PUT", "/replicas", expect=(200,),
                               json={"rse": self.rse, "files": [
                                   {"scope": did.scope, "name": did.name, "state": "A"}
                                   for did in dict.fromkeys(f.did for f in files)]},
                               what=f"replicas of {_files(files)} made available")
        held = await self._replicas([f.did for f in files])
        failures: dict[_File, RucioFsError] = {}
        for f in files:
            record = held.get(f.did) or {}
            if not _available_on(record, self.rse) or not _same_file(
                    record, f.size, f.adler32, f.md5):
                failures[f] = Unavailable(f"{f.did}: no AVAILABLE replica on {self.rse} "
                                          "after making it so")
        return failures

    async def _attach_all(self, files: list[_File]) -> dict[_File, RucioFsError]:
        """Attach the files to their datasets (one request; one per file if it fails, to
        tell which)."""
        by_parent: dict[Did, list[_File]] = {}
        for f in files:
            assert f.target.parent is not None
            by_parent.setdefault(f.target.parent, []).append(f)
        attachments = [{"scope": parent.scope, "name": parent.name,
                        "dids": [{"scope": f.did.scope, "name": f.did.name} for f in group]}
                       for parent, group in by_parent.items()]
        try:
            await self.api.request("POST", "/dids/attachments", expect=(201,),
                                   json={"attachments": attachments, "ignore_duplicate": True},
                                   what=f"attachment of {_files(files)}")
            for parent, group in by_parent.items():
                self._lengths[parent] = self._lengths.get(parent, 0) + len(group)
            return {}
        except RucioFsError:
            if len(files) == 1:
                raise
        failures: dict[_File, RucioFsError] = {}
        for f in files:
            try:
                assert f.target.parent is not None
                await self._attach(f.target.parent, f.did)
            except RucioFsError as exc:
                failures[f] = exc
        return failures

    async def _replicas(self, dids: list[Did]) -> dict[Did, Mapping[str, Any]]:
        """The catalog's records of files ``dids`` with their replicas' states per RSE,
        without PFNs: a scheme no protocol has makes the server skip building them, about a
        third of its work for a list. Every state on every RSE is asked for: the server
        leaves out RSEs whose reads are switched off, where an upload may still go, unless
        told to ignore their availability."""
        wanted = set(dids)
        body = {"dids": [{"scope": did.scope, "name": did.name} for did in dids],
                "all_states": True, "ignore_availability": True, "schemes": [_NO_SCHEME]}
        found: dict[Did, Mapping[str, Any]] = {}
        async for line in self.api.ndjson("POST", "/replicas/list", json=body,
                                          what=f"replicas of {len(dids)} file(s)"):
            did = _did_of(line)
            if did in wanted:
                found[did] = line
        return found

    async def _attach(self, parent: Did, did: Did) -> None:
        try:
            await self.api.request("POST", parent.url() + "/dids", expect=(201,),
                                   json={"dids": [{"scope": did.scope, "name": did.name}]},
                                   what=f"attachment of {did} to {parent}")
        except AlreadyExists as exc:
            if "UnsupportedOperation" in str(exc):  # (a 409 too)
                raise NotPermitted(f"{parent} is closed: nothing can be added to it") from None
            # else attached by an earlier try

    async def check_open(self, dataset: Did) -> None:
        """NotPermitted unless ``dataset`` is open (a closed one takes no files); an
        answer is remembered for a minute."""
        is_open = self._open.get(dataset)
        if is_open is None:
            is_open = await self._datasets.run(dataset)
        if not is_open:
            raise NotPermitted(f"{dataset} is closed: nothing can be added to it or taken "
                               "from it")

    async def _describe_datasets(self, datasets: list[Did]) -> dict[Did, bool]:
        """Whether each dataset is open (remembered), and how many files it holds."""
        found: dict[Did, bool] = {}

        async def describe(dataset: Did) -> None:
            info = await self.api.json("GET", dataset.url(), what=f"stat of {dataset}")
            found[dataset] = self._open[dataset] = info.get("open") is not False
            self._lengths.setdefault(dataset, int(info.get("length") or 0))

        async with trio.open_nursery() as nursery:
            for dataset in datasets:
                nursery.start_soon(describe, dataset)
        return found

    async def _pfn(self, did: Did) -> str:
        """Where the RSE's deterministic layout puts ``did`` (its write protocol); the
        lookups of uploads under way at the same time go in one request."""
        pfn = await self._pfns.run(did)
        assert isinstance(pfn, str)
        return pfn

    async def _lookup_pfns(self, dids: list[Did]) -> dict[Did, str | RucioFsError]:
        lfns = {f"{did.scope}:{did.name}": did for did in dids}
        answer = await self.api.json(
            "GET", f"/rses/{quote(self.rse, safe='')}/lfns2pfns",
            params=[*(("lfn", lfn) for lfn in lfns), ("operation", "write")],
            what=f"storage paths of {len(dids)} file(s) on {self.rse}")
        found: dict[Did, str | RucioFsError] = {}
        for lfn, did in lfns.items():
            pfn = answer.get(lfn) if isinstance(answer, dict) else None
            if not isinstance(pfn, str) or not pfn:
                found[did] = Unavailable(f"{self.rse} gave no storage path for {did}")
            elif urlsplit(pfn_url(pfn)).scheme not in ("http", "https") and not is_root(pfn):
                found[did] = NotPermitted(f"{self.rse} is written over "
                                          f"{pfn.partition(':')[0]}://, which this mount "
                                          "cannot write (davs, https, http and root can)")
            else:
                found[did] = pfn
        return found

    # -- the storage ------------------------------------------------------------------------

    def _client(self, pfn: str) -> tuple[ApiClient, str]:
        """The storage client of ``pfn``'s server, and the request path of ``pfn``."""
        parts = urlsplit(pfn_url(pfn))
        base = f"{parts.scheme}://{parts.netloc}"
        client = self._storage.get(base)
        if client is None:
            client = self._storage[base] = ApiClient(base, verify=self.context,
                                                     timeout=self.settings.timeout)
        return client, parts.path

    async def _move(self, temp: str, final: str, size: int) -> None:
        """``temp`` renamed to ``final`` on the storage, then ``final`` checked to hold
        ``size`` bytes. A retried MOVE whose first try did it finds no ``temp``: the check
        says whether it was done."""
        if is_root(temp):
            with contextlib.suppress(NotFound):
                await trio.to_thread.run_sync(self.root.move, temp, final)
            try:
                stored = await trio.to_thread.run_sync(self.root.size, final)
            except NotFound:
                raise Unavailable(f"{final}: not on the storage after its upload") from None
            if stored != size:
                raise IntegrityError(f"{final}: the storage holds {stored} bytes, not {size}")
            return
        client, path = self._client(temp)
        with contextlib.suppress(NotFound):
            await client.request("MOVE", path, expect=(201, 204),
                                 headers={"Destination": pfn_url(final),
                                          "Overwrite": "T"},
                                 what=f"renaming the upload to {final}")
        client, path = self._client(final)
        try:
            answer = await client.request("HEAD", path, what=f"size of {final}")
        except NotFound:
            raise Unavailable(f"{final}: not on the storage after its upload") from None
        stored = int(answer.headers.get("content-length", "-1"))
        if stored != size:
            raise IntegrityError(f"{final}: the storage holds {stored} bytes, not {size}")

    async def _discard(self, temp: str) -> None:
        """Remove an upload's temporary copy (best effort: a leftover is dark data)."""
        try:
            if is_root(temp):
                await trio.to_thread.run_sync(self.root.remove, temp)
            else:
                client, path = self._client(temp)
                await client.request("DELETE", path, expect=(200, 204),
                                     what=f"removal of {temp}")
        except NotFound:
            pass
        except RucioFsError as exc:
            log.warning("%s: left on the storage: %s", temp, exc)

    # -- namespace --------------------------------------------------------------------------

    async def make_dataset(self, target: DidPath, name: str) -> Entry:
        """Dataset ``target`` with its rule, attached to its container if any. A dataset
        that exists already (a repeated try) is attached, not made again."""
        did = target.did
        rule = {"account": self.settings.account, "copies": 1, "rse_expression": self.rse,
                "grouping": "DATASET", "lifetime": _lifetime(self.settings)}
        try:
            await self.api.request("POST", did.url(), expect=(201,),
                                   json={"type": "DATASET", "rules": [rule]},
                                   what=f"creation of dataset {did}")
        except AlreadyExists:
            info = await self.api.json("GET", did.url(), what=f"stat of {did}")
            if str(info.get("type") or "").upper() != "DATASET":
                raise AlreadyExists(f"{did} exists in Rucio and is no dataset") from None
        if target.parent is not None:
            await self._attach(target.parent, did)
        return Entry(name=name, kind=Kind.DIR, mtime_ns=self.mtime_ns,
                     metadata={"type": "DATASET"})

    async def detach(self, target: DidPath) -> None:
        """Detach file ``target`` from its dataset, if the mount's account created it."""
        did = target.did
        meta = await self.api.json("GET", did.url() + "/meta", what=f"metadata of {did}")
        if meta.get("account") != self.settings.account or target.parent is None:
            raise PermissionDenied(f"{did}: only files account {self.settings.account} "
                                   "created can be removed (detached) here")
        try:
            await self.check_open(target.parent)
        except NotPermitted as exc:
            raise PermissionDenied(str(exc)) from None
        await self.api.request("DELETE", target.parent.url() + "/dids", expect=(200,),
                               json={"dids": [{"scope": did.scope, "name": did.name}]},
                               what=f"detachment of {did} from {target.parent}")


class _StreamedUpload(Upload):
    """A big file's body sent to its temporary PFN part by part (parts come in order: the
    backend's ``upload_parallelism`` is 1), its checksums computed as it passes."""

    def __init__(self, uploads: Uploads, target: DidPath, name: str, final: str, temp: str,
                 put: StreamedPut | _RootPut) -> None:
        self.uploads = uploads
        self.target = target
        self.name = name
        self.final = final
        self.temp = temp
        self.put = put
        self.size = 0
        self.adler32 = zlib.adler32(b"")
        self.md5 = hashlib.md5()
        self.finished = False

    async def write_part(self, number: int, offset: int, data: bytes) -> None:
        if offset != self.size:
            raise Unavailable(f"{self.target.did}: part {number} at {offset}, expected "
                              f"{self.size} (parts must come in order)")
        await trio.to_thread.run_sync(self._take, data, abandon_on_cancel=True)

    def _take(self, data: bytes) -> None:
        self.adler32 = zlib.adler32(data, self.adler32)
        self.md5.update(data)
        self.put.send_blocking(data)
        self.size += len(data)

    async def commit(self, size: int) -> Entry:
        if size != self.size:
            raise Unavailable(f"{self.target.did}: {self.size} bytes sent, {size} committed")
        status = await self.put.finish()
        self.finished = True
        if status not in (200, 201, 204):
            raise Unavailable(f"upload of {self.target.did} to {self.uploads.rse}: "
                              f"HTTP {status}")
        return await self.uploads._register(self.target, self.name, self.temp, self.final,
                                            size, f"{self.adler32:08x}",
                                            self.md5.hexdigest())

    def commit_seconds(self) -> float:
        return 60.0 + self.size / (50 << 20)  # the storage may copy the body into place

    async def abort(self) -> None:
        self.put.abort()
        if self.finished:
            await self.uploads._discard(self.temp)


class _RootPut:
    """A streamed body to root:// storage, with :class:`~rucio_fs.http.StreamedPut`'s face."""

    def __init__(self, writer: RootWriter) -> None:
        self.writer = writer

    def send_blocking(self, data: bytes) -> None:
        self.writer.send_blocking(data)

    async def finish(self) -> int:
        await trio.to_thread.run_sync(self.writer.finish_blocking, abandon_on_cancel=True)
        return 201

    def abort(self) -> None:
        self.writer.abort()


class _File:
    """One file on its way into the catalog (hashed by identity: a batch's member)."""

    __slots__ = ("adler32", "final", "md5", "size", "target", "temp")

    def __init__(self, target: DidPath, temp: str, final: str, size: int, adler32: str,
                 md5: str) -> None:
        self.target, self.temp, self.final = target, temp, final
        self.size, self.adler32, self.md5 = size, adler32, md5

    @property
    def did(self) -> Did:
        return self.target.did

    def record(self) -> dict[str, Any]:
        return {"scope": self.did.scope, "name": self.did.name, "bytes": self.size,
                "adler32": self.adler32, "md5": self.md5}


class GroupCommit(Generic[T, V]):
    """Many callers' items sent in few calls of ``send`` (group commit, no added delay):
    the first caller sends its item at once; items arriving while a call is on its way go
    together in the next one (at most ``most``). ``send`` returns each item's value or
    error (an item it leaves out gets None); an error it raises fails every item of its
    call."""

    def __init__(self, send: Callable[[list[T]], Awaitable[Mapping[T, V | RucioFsError]]],
                 most: int) -> None:
        self._send = send
        self._most = most
        self._pending: dict[T, _Outcome] = {}
        self._sending: trio.Event | None = None
        self.calls = 0

    async def run(self, item: T) -> V | None:
        outcome = self._pending.setdefault(item, _Outcome())
        while not outcome.done.is_set():
            if self._sending is None:
                self._sending = trio.Event()
                try:
                    await self._send_batch(item)
                finally:
                    sending, self._sending = self._sending, None
                    sending.set()
            else:
                await self._sending.wait()
        if isinstance(outcome.value, RucioFsError):
            raise outcome.value
        return outcome.value

    async def _send_batch(self, first: T) -> None:
        batch = {first: self._pending.pop(first)}
        while self._pending and len(batch) < self._most:
            item = next(iter(self._pending))
            batch[item] = self._pending.pop(item)
        self.calls += 1
        try:
            answers: Mapping[T, Any] = await self._send(list(batch))
        except RucioFsError as exc:
            answers = dict.fromkeys(batch, exc)
        except BaseException:
            for outcome in batch.values():
                outcome.value = Unavailable("the request this was sent in was cancelled")
                outcome.done.set()
            raise
        for item, outcome in batch.items():
            outcome.value = answers.get(item)
            outcome.done.set()


class _Outcome:
    __slots__ = ("done", "value")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.value: Any = None


def _files(files: list[_File]) -> str:
    return str(files[0].did) if len(files) == 1 else f"{len(files)} files"


def _did_of(line: Mapping[str, Any]) -> Did:
    return Did(str(line.get("scope", "")), str(line.get("name", "")))


def _checksums(data: bytes) -> tuple[str, str]:
    return f"{zlib.adler32(data):08x}", hashlib.md5(data).hexdigest()


def _available_on(record: Mapping[str, Any], rse: str) -> bool:
    """Whether a ``/replicas/list`` record says the file's replica on ``rse`` is AVAILABLE."""
    return (record.get("states") or {}).get(rse) == "AVAILABLE"


def _same_file(record: Mapping[str, Any], size: int, adler32: str, md5: str) -> bool:
    """Whether the catalog's ``record`` of a file (its metadata, or a replica listing's
    line) has this size and these checksums (an md5 missing on either side is not
    compared)."""
    held_md5 = str(record.get("md5") or "")
    return (record.get("bytes") is not None and int(record["bytes"]) == size
            and _same_adler32(str(record.get("adler32") or ""), adler32)
            and (not held_md5 or not md5 or held_md5.lower() == md5))


def _same_adler32(a: str, b: str) -> bool:
    """Rucio stores adler32 as text that may have lost its leading zeros."""
    return a.lower().lstrip("0") == b.lower().lstrip("0")


def _temporary(pfn: str, tag: str) -> str:
    """The temporary name beside ``pfn`` of an upload tagged ``tag`` (``rucio upload``'s
    suffix): a file's content names it (its md5's start) where it is known before the
    upload, so a repeated upload overwrites what an interrupted one left; a streamed upload
    gets a random tag (one interrupted midway leaves its part behind, as dark data).

    Where the suffix would make the last component longer than a POSIX storage allows
    (NAME_MAX: Rucio names reach 250 bytes), that component is replaced by a digest of it."""
    suffix = f".{tag}.rucio.upload"
    directory, _, base = pfn.rpartition("/")
    if len((base + suffix).encode()) > STORAGE_NAME_MAX:
        base = hashlib.sha256(base.encode()).hexdigest()[:32]
    return f"{directory}/{base}{suffix}"


def _lifetime(settings: RucioSettings) -> int | None:
    lifetime = settings.upload_rule_lifetime
    return None if lifetime is None else max(1, round(lifetime))


__all__ = ["NAME_PATTERN", "DidPath", "Uploads", "check_name", "check_new"]
