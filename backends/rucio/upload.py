"""Writing into Rucio as ``rucio upload`` does: a file closed in a dataset becomes a file DID
with its replica on the mount's ``upload_rse``, registered AVAILABLE and attached.

One file, whatever path it took (one ``PUT`` for a small file, a body streamed while a big
one is still being written)::

    PUT     <pfn>.<tag>.rucio.upload         the bytes, adler32 and md5 computed as they pass
    POST    /replicas                        the DID and its replica, state COPYING (a name
                                             claimed: a replica nobody may read yet)
    GET     /dids/<scope>/<name>/meta        the catalog holds our size and checksums? Else
                                             the name is someone else's: EEXIST, nothing moved
    MOVE    temp -> <pfn>                    the bytes where the catalog says they are
    HEAD    <pfn>                            their size checked on the storage
    PUT     /replicas                        state AVAILABLE
    POST    /replicas/list                   read back: AVAILABLE, our size and checksums
    POST    /dids/<dataset>/dids             attached
    GET     /dids/<scope>/<name>/parents     read back (the core's ``confirm``)

Every step may be repeated: the core uploads the staged file again after a failure, a crash
or a remount (its journal), and each step finds what an earlier try did: registering a
file that exists changes nothing, a repeated move finds the bytes in place (checked by
size), an attachment that exists is done. The same content under the same name (an earlier
try, or another client's) lands on the same PFN: never a second copy. So a replica is AVAILABLE only once its bytes are verified at its PFN, and a file is
attached only once its replica is AVAILABLE. A file whose name holds other content in the
catalog is never stored: Rucio files are immutable.

Namespace: ``mkdir`` makes a dataset (in a scope, or attached to the container it is made
in) with a rule of one copy on ``upload_rse`` (lifetime ``upload_rule_lifetime``), as
``rucio upload`` does for a dataset it creates. ``unlink`` detaches a file the mount's
account created from its open dataset (the replica is then the reaper's); everything else
is refused. A closed dataset takes no files.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import secrets
import ssl
import zlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
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
from rucio_fs.http import ApiClient, StreamedPut, url_from_literal

from .settings import RucioSettings

if TYPE_CHECKING:
    from .backend import Did

log = logging.getLogger(__name__)

#: DID names the server's generic schema accepts.
NAME_PATTERN = re.compile(r"^[/A-Za-z0-9][/A-Za-z0-9.\-_]*$")
NAME_MAX = 250
#: Collection types files and datasets may be made in.
FILE_PARENTS = frozenset({"DATASET"})
DATASET_PARENTS = frozenset({"SCOPE", "CONTAINER"})
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
        #: Files whose replica an upload just read back AVAILABLE (DID -> adler32): their
        #: ``confirm`` reads back only the attachment.
        self._available: TTLCache[Did, str] = TTLCache(100_000, VERIFIED_TTL)
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
        put = StreamedPut(_writable_url(temp), context=self.context,
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
            body = {"dids": [{"scope": did.scope, "name": did.name}], "all_states": False}
            async for line in self.api.ndjson("POST", "/replicas/list", json=body,
                                              what=f"replicas of {did}"):
                if line.get("scope") == did.scope and line.get("name") == did.name:
                    found["replica"] = line

        async def attached() -> None:
            async for line in self.api.ndjson("GET", did.url() + "/parents",
                                              what=f"parents of {did}"):
                if (line.get("scope"), line.get("name")) == (target.parent.scope,
                                                             target.parent.name):
                    found["attached"] = True

        # The replica was read back AVAILABLE moments ago by the upload itself.
        verified = self._available.get(did) == expected.version
        async with trio.open_nursery() as nursery:
            if not verified:
                nursery.start_soon(replica)
            if target.parent is not None:
                nursery.start_soon(attached)
        line = found.get("replica") or {}
        if not verified and (
                self.rse not in (line.get("rses") or {})
                or line.get("bytes") is None or int(line["bytes"]) != expected.size
                or not _same_adler32(str(line.get("adler32") or ""), expected.version)):
            raise Unconfirmed(f"{did}: no AVAILABLE replica on {self.rse} with "
                              f"{expected.size} bytes and adler32 {expected.version}")
        if target.parent is not None and not found.get("attached"):
            raise Unconfirmed(f"{did}: not attached to {target.parent}")
        return expected

    async def _register(self, target: DidPath, name: str, temp: str, final: str, size: int,
                        adler32: str, md5: str) -> Entry:
        """The bytes are at ``temp``: claim the name, move them to ``final``, verify, make
        the replica AVAILABLE and attach it."""
        did = target.did
        file = {"scope": did.scope, "name": did.name, "bytes": size, "adler32": adler32,
                "md5": md5}
        await self.api.request("POST", "/replicas", expect=(201,),
                               json={"rse": self.rse, "ignore_availability": True,
                                     "files": [dict(file, state="C")]},
                               what=f"registration of {did} on {self.rse}")
        # Registering an existing file changes nothing: the name is ours if the catalog
        # holds our size and checksums (an earlier try of ours, or the same content).
        meta = await self.api.json("GET", did.url() + "/meta", what=f"metadata of {did}")
        if not _same_file(meta, size, adler32, md5):
            await self._discard(temp)
            raise AlreadyExists(f"{did} exists in Rucio with other content (files are "
                                "immutable: write it under another name)")
        await self._move(temp, final, size)
        await self.api.request("PUT", "/replicas", expect=(200,),
                               json={"rse": self.rse, "files": [
                                   {"scope": did.scope, "name": did.name, "state": "A"}]},
                               what=f"replica of {did} on {self.rse} made available")
        # Attached only once AVAILABLE: read back (an answer of success may not mean it).
        held = await self._replica(did, all_states=False)
        if self.rse not in ((held or {}).get("rses") or {}) or not _same_file(
                held or {}, size, adler32, md5):
            raise Unavailable(f"{did}: no AVAILABLE replica on {self.rse} after making it so")
        self._available[did] = adler32
        if target.parent is not None:
            await self._attach(target.parent, did)
        return Entry(name=name, kind=Kind.FILE, size=size, mtime_ns=self.mtime_ns,
                     checksums={"adler32": adler32, "md5": md5}, immutable=True,
                     version=adler32)

    async def _replica(self, did: Did, all_states: bool = True) -> Mapping[str, Any] | None:
        """The catalog's record of file ``did`` with its replicas (each state's, or the
        AVAILABLE ones)."""
        body = {"dids": [{"scope": did.scope, "name": did.name}], "all_states": all_states}
        found = None
        async for line in self.api.ndjson("POST", "/replicas/list", json=body,
                                          what=f"replicas of {did}"):
            if line.get("scope") == did.scope and line.get("name") == did.name:
                found = line
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
            info = await self.api.json("GET", dataset.url(), what=f"stat of {dataset}")
            is_open = self._open[dataset] = info.get("open") is not False
        if not is_open:
            raise NotPermitted(f"{dataset} is closed: nothing can be added to it or taken "
                               "from it")

    async def _pfn(self, did: Did) -> str:
        """Where the RSE's deterministic layout puts ``did`` (its write protocol)."""
        lfn = f"{did.scope}:{did.name}"
        answer = await self.api.json("GET", f"/rses/{quote(self.rse, safe='')}/lfns2pfns",
                                     params=[("lfn", lfn), ("operation", "write")],
                                     what=f"storage path of {did} on {self.rse}")
        pfn = answer.get(lfn) if isinstance(answer, dict) else None
        if not isinstance(pfn, str) or not pfn:
            raise Unavailable(f"{self.rse} gave no storage path for {did}")
        if urlsplit(_writable_url(pfn)).scheme not in ("http", "https"):
            raise NotPermitted(f"{self.rse} is written over {pfn.partition(':')[0]}://, "
                               "which this mount cannot write (davs, https and http can)")
        return pfn

    # -- the storage ------------------------------------------------------------------------

    def _client(self, pfn: str) -> tuple[ApiClient, str]:
        """The storage client of ``pfn``'s server, and the request path of ``pfn``."""
        parts = urlsplit(_writable_url(pfn))
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
        client, path = self._client(temp)
        with contextlib.suppress(NotFound):
            await client.request("MOVE", path, expect=(201, 204),
                                 headers={"Destination": _writable_url(final),
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
        client, path = self._client(temp)
        try:
            await client.request("DELETE", path, expect=(200, 204), what=f"removal of {temp}")
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
                 put: StreamedPut) -> None:
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


def _checksums(data: bytes) -> tuple[str, str]:
    return f"{zlib.adler32(data):08x}", hashlib.md5(data).hexdigest()


def _same_file(record: Mapping[str, Any], size: int, adler32: str, md5: str) -> bool:
    """Whether the catalog's ``record`` of a file (its metadata, or a replica listing's
    line) has this size and these checksums (an md5 it does not hold is not compared)."""
    held_md5 = str(record.get("md5") or "")
    return (record.get("bytes") is not None and int(record["bytes"]) == size
            and _same_adler32(str(record.get("adler32") or ""), adler32)
            and (not held_md5 or held_md5.lower() == md5))


def _same_adler32(a: str, b: str) -> bool:
    """Rucio stores adler32 as text that may have lost its leading zeros."""
    return a.lower().lstrip("0") == b.lower().lstrip("0")


def _temporary(pfn: str, tag: str) -> str:
    """The temporary name beside ``pfn`` of an upload tagged ``tag`` (``rucio upload``'s
    suffix): a file's content names it (its md5's start) where it is known before the
    upload, so a repeated upload overwrites what an interrupted one left; a streamed upload
    gets a random tag (one interrupted midway leaves its part behind, as dark data)."""
    return f"{pfn}.{tag}.rucio.upload"


def _writable_url(pfn: str) -> str:
    """The http(s) URL a PFN is written at (``davs``/``dav`` are WebDAV over http(s))."""
    if pfn.startswith("davs://"):
        pfn = "https://" + pfn[len("davs://"):]
    elif pfn.startswith("dav://"):
        pfn = "http://" + pfn[len("dav://"):]
    return url_from_literal(pfn)


def _lifetime(settings: RucioSettings) -> int | None:
    lifetime = settings.upload_rule_lifetime
    return None if lifetime is None else max(1, round(lifetime))


__all__ = ["NAME_PATTERN", "DidPath", "Uploads", "check_name", "check_new"]
