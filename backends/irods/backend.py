"""``irods://`` — an iRODS collection, read-write, through the iRODS HTTP API.

Start. ``/info`` (found under the known API versions unless ``api_path`` is given) gives the
server's limits, which the mount then honours: upload parts stay within the request body
limit, a parallel upload asks for at most the streams per handle, and GenQuery1 pages are the
server's row cap. A password is exchanged for a bearer token, and so is an expired token on
the first 401 (see :mod:`.auth`). The root collection is checked, and whether the server
speaks GenQuery2 (with access-list columns) is found out by asking.

Listing and stat: two GenQuery queries at once (see :mod:`.query`); entries carry size,
time, checksum and the mounting user's permissions as mode bits. A listing that finds nothing
asks one query more (is it a collection, an empty one?), and if not one more still: a data
object's path is NotADirectory, a missing path NotFound.

Reading: ``data-objects op=read`` with ``offset``/``count`` through the core's read path,
several ranges in flight, each at most :data:`READ_MAX` (well inside the API's 30 s request
timeout).

Writing (see :mod:`rucio_fs.write.writeback`): a file up to ``part_size`` is one write with
``truncate`` on (method 2, or a multipart form for a path HTTP headers cannot carry); a
larger one goes through ``parallel_write_init`` → writes with handle, stream index and offset
(one request at a time per stream) → ``parallel_write_shutdown``, which runs also when the
upload fails. An overwrite that fails part-way leaves the object
partly written (iRODS writes in place, keeping its metadata and access list); the mount
reports the error at ``close``, keeps the new content staged and retries it. ``mkdir``,
``rm`` (to the trash unless ``no_trash``), ``rmdir``, ``rename`` (files and directories, in
place) and ``truncate`` are single calls.

Attributes (``utimens``, ``chmod``, ``chown``; see ``Backend.set_attributes``):

* **Modification times are stored**, in whole seconds (iRODS keeps no more): ``touch`` of the
  collection, or of every replica a listing may show (the good ones, else all: iRODS touches
  only the newest good replica unless told which, and a listing shows the newest good one).
  That is one query and one ``touch`` per replica, made only when a time is set (also right
  after an upload's content is stored, for ``cp -a``). The entry returned shows the stored
  second; the core shows the nanoseconds set for the mount's life. The API takes times from
  the epoch to 2038-01-19 (a 32-bit ``int``); another time is not sent, and is kept only for
  the mount's life.
* **Mode bits and owners are not stored**: iRODS permissions are access lists of users and
  groups, not POSIX bits and ids. Entries show the mounting user's permissions as mode bits
  (read, write) and no owner; a ``chmod``/``chown`` is kept for the mount's life and never
  changes an access list.
* **No links**: iRODS has no symbolic links (``ln -s`` fails with EOPNOTSUPP) and no hard
  links (``ln`` fails with EPERM: the mount makes none).

Errors: ``irods_response.status_code`` becomes the typed error a file system shows
(:func:`irods_error`): a missing path ENOENT, a refused access EACCES, a spent quota EDQUOT,
a full storage ENOSPC, and so on; anything else EIO.

Extended attributes: ``user.irods.checksum`` (read-only) and the AVUs:
``user.irods.<attribute>`` holds the value (several values of one attribute, one per line);
``user.irods.<attribute>@units`` holds the units when there are any. Setting them rewrites
the attribute's AVUs in one atomic ``modify_metadata``.

Every answer is checked twice: the HTTP status and ``irods_response.status_code`` (the API
answers some failures with HTTP 200 and a negative code).

Why one module of this size: it is the iRODS mapping of the whole backend contract; the
HTTP API's sessions, queries and parallel writes have modules of their own.
"""

from __future__ import annotations

import errno
import json
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar
from urllib.parse import urlencode

import httpx
import trio

from rucio_fs.backend import (
    NO_ATTRIBUTES,
    Attributes,
    Backend,
    Capability,
    Entry,
    Kind,
    Upload,
)
from rucio_fs.errors import (
    AlreadyExists,
    IsADirectory,
    NoSpace,
    NoSuchAttribute,
    NotADirectory,
    NotEmpty,
    NotFound,
    NotPermitted,
    NotSupported,
    PermissionDenied,
    QuotaExceeded,
    RucioFsError,
    Unavailable,
)
from rucio_fs.http import ApiClient, RangeReader, RetryPolicy, client_counters, tls_context
from rucio_fs.identity import CallerCredentials, caller_source
from rucio_fs.tasks import open_nursery

from .auth import IrodsAuth
from .query import Dialect, Folder, Pager, coll_query, data_query, literal, version_of
from .settings import CREDENTIAL_ENV, KNOWN_VERSIONS, IrodsSettings, parse_url

log = logging.getLogger(__name__)

#: Largest range asked for in one read request; larger reads are split and sent at once.
READ_MAX = 8 << 20
UNITS_SUFFIX = "@units"
#: Bytes a multipart write form adds around the data (fields, boundaries), with room to spare.
FORM_ROOM = 64 << 10
NS = 1_000_000_000
#: The latest modification time the HTTP API's ``touch`` takes (2038-01-19T03:14:07Z).
SECONDS_MAX = 2**31 - 1

# iRODS error codes (rodsErrorTable.h) that mean something to a file system. Each is
# -(1000 * n + e): ``e``, when not 0, is the errno of the system call that failed on the server.
_NOT_FOUND = frozenset({
    -310000,  # USER_FILE_DOES_NOT_EXIST
    -358000,  # OBJ_PATH_DOES_NOT_EXIST
    -808000,  # CAT_NO_ROWS_FOUND
    -814000,  # CAT_UNKNOWN_COLLECTION
    -817000,  # CAT_UNKNOWN_FILE
})
_DENIED = frozenset({
    -36000,   # SYS_NO_PATH_PERMISSION
    -40000,   # SYS_NO_DATA_OBJ_PERMISSION
    -121000,  # SYS_USER_NO_PERMISSION
    -169000,  # SYS_NOT_ALLOWED
    -350000,  # USER_ACCESS_DENIED
    -818000,  # CAT_NO_ACCESS_PERMISSION
    -826000,  # CAT_INVALID_AUTHENTICATION
    -827000,  # CAT_INVALID_USER
    -830000,  # CAT_INSUFFICIENT_PRIVILEGE_LEVEL
    -840000,  # CAT_PASSWORD_EXPIRED
    -851000,  # CAT_TABLE_ACCESS_DENIED
})
_EXISTS = frozenset({
    -312000,  # OVERWRITE_WITHOUT_FORCE_FLAG
    -809000,  # CATALOG_ALREADY_HAS_ITEM_BY_THAT_NAME
    -833000,  # CAT_NAME_EXISTS_AS_COLLECTION
    -834000,  # CAT_NAME_EXISTS_AS_DATAOBJ
})
_NOT_EMPTY = frozenset({
    -79000,   # SYS_COLLECTION_NOT_EMPTY
    -821000,  # CAT_COLLECTION_NOT_EMPTY
})
_QUOTA = frozenset({
    -110000,  # SYS_RESC_QUOTA_EXCEEDED (resource quotas)
    -186000,  # LOGICAL_QUOTA_EXCEEDED (the logical quotas rule engine plugin)
})
#: The unixfilesystem resource refuses a file larger than the space left on its device.
_NO_SPACE = frozenset({-311000})  # USER_FILE_TOO_LARGE
_UNSUPPORTED = frozenset({
    -12000,   # SYS_UNMATCHED_API_NUM (e.g. GenQuery2 asked of iRODS before 4.3.2)
    -66000,   # SYS_NOT_SUPPORTED
})
_NOT_A_COLLECTION = frozenset({-170000})  # NOT_A_COLLECTION
_NOT_A_DATA_OBJECT = frozenset({-171000})  # NOT_A_DATA_OBJECT
#: The typed error of each set of codes, in the order they are looked up.
_TYPED: tuple[tuple[frozenset[int], type[RucioFsError]], ...] = (
    (_NOT_FOUND, NotFound), (_DENIED, PermissionDenied), (_EXISTS, AlreadyExists),
    (_NOT_EMPTY, NotEmpty), (_QUOTA, QuotaExceeded), (_NO_SPACE, NoSpace),
    (_UNSUPPORTED, NotSupported), (_NOT_A_COLLECTION, NotADirectory),
    (_NOT_A_DATA_OBJECT, IsADirectory))
#: Errnos carried by a code (its last three digits) that are the user's to know: the storage
#: is full, or the user's quota on it spent. Others (a vault the server may not write, ...)
#: are the server's trouble: EIO.
_SERVER_ERRNOS: dict[int, type[RucioFsError]] = {
    errno.ENOSPC: NoSpace, errno.EDQUOT: QuotaExceeded}


def irods_error(code: int, status: int, what: str, message: str) -> RucioFsError:
    """The typed error for an iRODS answer (``code``: ``irods_response.status_code``, 0 when
    the answer has none; ``status``: the HTTP status): NotFound, PermissionDenied,
    AlreadyExists, NotEmpty, QuotaExceeded, NoSpace, NotSupported, NotADirectory or
    IsADirectory when the code (or, without one, the HTTP status) says so, else
    Unavailable."""
    detail = f"{what}: " + (f"iRODS error {code}" if code else f"HTTP {status}")
    if message:
        detail += f" ({message})"
    return _error_class(code, status)(detail)


def _error_class(code: int, status: int) -> type[RucioFsError]:
    if not code:
        if status == 404:
            return NotFound
        return PermissionDenied if status in (401, 403) else Unavailable
    if code > 0:
        return Unavailable
    base, carried = divmod(-code, 1000)
    if carried in _SERVER_ERRNOS:
        return _SERVER_ERRNOS[carried]
    for codes, error in _TYPED:
        if -base * 1000 in codes:
            return error
    return Unavailable


def answer(response: httpx.Response, what: str) -> dict[str, Any]:
    """The JSON body of a successful answer; the typed error of any other."""
    try:
        body = response.json()
    except ValueError:
        body = None
    block = body.get("irods_response") if isinstance(body, dict) else None
    if not isinstance(block, dict):
        if response.status_code == 200:
            raise Unavailable(f"{what}: answer is not an iRODS HTTP API response")
        raise irods_error(0, response.status_code, what, "")
    code = block.get("status_code", 0)
    if not isinstance(code, int):
        raise Unavailable(f"{what}: status_code {code!r} is not a number")
    if response.status_code == 200 and code >= 0:
        return body  # type: ignore[return-value]
    failed = block.get("failed_operation")
    message = ((failed.get("error_message") if isinstance(failed, dict) else None)
               or block.get("status_message") or "")
    raise irods_error(code, response.status_code, what, str(message)[:200])


def storable_seconds(mtime_ns: int | None) -> int | None:
    """The whole second iRODS stores for ``mtime_ns`` (rounded down), or None when no time
    is set or the HTTP API cannot take it (its ``seconds-since-epoch`` is a 32-bit ``int``,
    and iRODS refuses a negative one)."""
    if mtime_ns is None:
        return None
    seconds = mtime_ns // NS
    return seconds if 0 <= seconds <= SECONDS_MAX else None


@dataclass
class _ReadHandle:
    lpath: str
    size: int


def _split(value: str) -> list[str]:
    return value.split("\n") if value else [""]


class IrodsBackend(Backend):
    scheme: ClassVar[str] = "irods"
    description: ClassVar[str] = "iRODS collections through the iRODS HTTP API, read-write"
    #: Parallel writes go into the data object itself (iRODS has no multipart staging, and a
    #: rename over it would drop its AVUs): see ``Backend.atomic_uploads``.
    atomic_uploads = False
    capabilities: ClassVar[Capability] = (Capability.WRITE | Capability.MKDIR
                                          | Capability.UNLINK | Capability.RENAME
                                          | Capability.SETXATTR | Capability.TRUNCATE)

    def __init__(self, settings: IrodsSettings) -> None:
        self.settings = settings
        self.single_put_max = self.upload_part_size = settings.part_size
        self.upload_parallelism = 3
        self.info: dict[str, Any] = {}
        self.dialect = Dialect("genquery2", True, settings.page_rows, 15)
        self.principals: frozenset[str] | None = None
        self.counters_extra: Counter[str] = Counter()
        self.api: ApiClient | None = None
        self.reader: RangeReader | None = None
        self.auth: IrodsAuth | None = None
        self._plain: ApiClient | None = None
        self._base = ""

    @classmethod
    def from_url(cls, url: str) -> IrodsBackend:
        return cls(parse_url(url))

    credential_env: ClassVar[tuple[str, ...]] = CREDENTIAL_ENV

    @classmethod
    def for_caller(cls, url: str, credentials: CallerCredentials) -> IrodsBackend:
        """The caller's ``~/.irods/irods_environment.json`` (or ``IRODS_ENVIRONMENT_FILE``),
        its ``IRODS_PASSWORD`` / ``IRODS_HTTP_API_TOKEN``, or the URL's ``password_file`` /
        ``token_file`` (``~`` is the caller's home), all read as the caller."""
        return cls(parse_url(url, caller_source(credentials)))

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        settings = self.settings
        context = tls_context(settings.ca) if settings.tls else tls_context()
        self._base = await self._discover(context)
        self._plain = ApiClient(self._base, verify=context, timeout=settings.timeout)
        self.auth = IrodsAuth(settings, self._login)
        self.api = ApiClient(self._base, verify=context, timeout=settings.timeout,
                             auth=self.auth,
                             retry=RetryPolicy(attempts=8, backoff=0.1, max_backoff=3.0))
        self.reader = RangeReader(context=context, timeout=settings.timeout,
                                  auth=self.auth)
        self._apply_limits(self.info)
        await self.auth.headers()  # log in now: a wrong password fails the mount
        await self._choose_dialect()
        if self.dialect.acls:
            self.principals = await self._principals()

    async def _discover(self, context: Any) -> str:
        """The API's base URL (``api_path`` or the newest known version answering /info)."""
        server = self.settings.server
        candidates = ([self.settings.api_path] if self.settings.api_path
                      else [f"/irods-http-api/{v}" for v in KNOWN_VERSIONS])
        found: dict[str, dict[str, Any]] = {}
        failures: list[str] = []
        probe = ApiClient(server, verify=context, timeout=self.settings.timeout,
                          retry=RetryPolicy(attempts=2))

        async def ask(path: str) -> None:
            try:
                response = await probe.request("GET", path + "/info", expect=range(200, 600),
                                               what=f"{server}{path}/info")
            except Unavailable as exc:
                failures.append(str(exc))
                return
            if response.status_code == 200:
                try:
                    body = response.json()
                except ValueError:
                    return
                if isinstance(body, dict) and "api_version" in body:
                    found[path] = body

        try:
            async with open_nursery() as nursery:
                for path in candidates:
                    nursery.start_soon(ask, path)
        finally:
            await probe.aclose()
        for path in candidates:
            if path in found:
                self.info = found[path]
                zone = self.info.get("irods_zone")
                if zone and zone != self.settings.zone:
                    log.info("zone %s is not the server's own zone %s (federation?)",
                             self.settings.zone, zone)
                return server + path
        if failures and len(failures) == len(candidates):
            raise Unavailable(f"cannot reach the iRODS HTTP API at {server}: {failures[0]}")
        raise Unavailable(f"no iRODS HTTP API answers /info at {server} under "
                          f"{', '.join(candidates)} (give -o api_path=...)")

    def _apply_limits(self, info: Mapping[str, Any]) -> None:
        body_max = info.get("max_size_of_request_body_in_bytes")
        if isinstance(body_max, int) and body_max > FORM_ROOM:
            # the limit covers the whole request body: room for a method-1 form's fields
            part = min(self.settings.part_size, body_max - FORM_ROOM)
            self.single_put_max = self.upload_part_size = part
        streams = info.get("max_number_of_streams_per_parallel_write_handle")
        if isinstance(streams, int) and streams > 0:
            self.upload_parallelism = min(streams, 8)
        cap = info.get("max_number_of_rows_per_catalog_query")
        if isinstance(cap, int) and cap > 0:
            self.dialect = replace(self.dialect, row_cap=cap)

    async def _login(self, authorization: str) -> str:
        assert self._plain is not None
        response = await self._plain.request(
            "POST", "/authenticate", expect=range(200, 600), what="iRODS login",
            headers={"Authorization": authorization})
        token = response.text.strip()
        if response.status_code == 200 and token:
            return token
        if response.status_code in (401, 403):
            raise PermissionDenied(f"iRODS login as {self.settings.user} refused "
                                   "(wrong user name or password)")
        raise Unavailable(f"iRODS login: HTTP {response.status_code}")

    async def _choose_dialect(self) -> None:
        """GenQuery2 with access lists, else without, else GenQuery1 (``genquery`` option
        narrows the choice); the probe is the root collection's own query, so a missing
        root fails the mount here."""
        root = self.settings.root
        choices = {"2": [("genquery2", True), ("genquery2", False)],
                   "1": [("genquery1", False)]}.get(self.settings.genquery, [
                       ("genquery2", True), ("genquery2", False), ("genquery1", False)])
        failure: RucioFsError | None = None
        for parser, acls in choices:
            dialect = replace(self.dialect, parser=parser, acls=acls)
            select, where = coll_query(dialect, path=root)
            try:
                rows = await self._query(f"select {select} where {where}", parser,
                                         {"count": "1"} if parser == "genquery1" else {})
            except (Unavailable, NotSupported) as exc:
                failure = exc
                continue
            self.dialect = dialect
            if not rows:
                raise NotFound(f"no collection {root} on {self.settings.server} "
                               f"(or no access to it)")
            if parser != "genquery2" or not acls:
                log.info("listing with %s%s", parser, "" if acls else " without access lists")
            return
        raise Unavailable(f"the server answers no usable GenQuery: {failure}")

    async def _principals(self) -> frozenset[str]:
        """The mounting user, their groups and ``public``: whose permissions count."""
        user = self.settings.user
        dialect = replace(self.dialect, parser="genquery1")
        pager = Pager(self._query, dialect, "USER_GROUP_NAME",
                      f"USER_NAME = {literal(user)} and USER_ZONE = "
                      f"{literal(self.settings.zone)}")
        names = {user, "public"}
        try:
            while (rows := await pager.next_page()) is not None:
                names.update(row[0] for row in rows)
        except RucioFsError as exc:
            log.info("group membership of %s unknown (%s); own permissions only", user, exc)
        return frozenset(names)

    async def aclose(self) -> None:
        for client in (self.api, self._plain):
            if client is not None:
                await client.aclose()
        if self.reader is not None:
            self.reader.close()

    # -- requests ---------------------------------------------------------------------------

    def _api(self) -> ApiClient:
        assert self.api is not None, "IrodsBackend.start() was not called"
        return self.api

    async def _get(self, endpoint: str, what: str, **params: str) -> dict[str, Any]:
        response = await self._api().request("GET", endpoint, params=params,
                                             expect=range(200, 600), what=what)
        return answer(response, what)

    async def _post(self, endpoint: str, what: str, **fields: str) -> dict[str, Any]:
        response = await self._api().request("POST", endpoint, data=fields,
                                             expect=range(200, 600), what=what)
        return answer(response, what)

    async def _write(self, lpath: str, data: bytes, what: str, **fields: str) -> None:
        """A write of ``data``. Method 2 (options in headers, the bytes as the body, streamed
        into iRODS) when the path is ASCII; HTTP headers cannot carry other text, so such
        paths use method 1 (a multipart form, buffered by the API; parts fit its limit)."""
        if lpath.isascii():
            headers = {"irods-api-request-op": "write", "irods-api-request-lpath": lpath,
                       "Content-Type": "application/octet-stream"}
            headers.update({f"irods-api-request-{k}": v for k, v in fields.items()})
            response = await self._api().request("POST", "/data-objects", content=data,
                                                 headers=headers, expect=range(200, 600),
                                                 what=what)
        else:
            form = {"op": "write", "lpath": lpath, "count": str(len(data)), **fields}
            response = await self._api().request(
                "POST", "/data-objects", data=form,
                files={"bytes": ("bytes", data, "application/octet-stream")},
                expect=range(200, 600), what=what)
        answer(response, what)

    async def _query(self, text: str, parser: str, extra: dict[str, str]) -> list[list[str]]:
        self.counters_extra[f"queries_{parser}"] += 1
        body = await self._get("/query", f"query {text[:120]}", op="execute_genquery",
                               parser=parser, query=text, **extra)
        rows = body.get("rows")
        if not isinstance(rows, list) or not all(isinstance(r, list) for r in rows):
            raise Unavailable(f"query {text[:80]}: answer has no rows")
        return rows

    def _lpath(self, path: str) -> str:
        return self.settings.root if path == "/" else self.settings.root + path

    # -- namespace --------------------------------------------------------------------------

    async def list(self, path: str) -> AsyncIterator[Entry]:
        """The data objects and subcollections of collection ``path``: two queries at
        once (then their further pages). A listing that finds nothing asks whether ``path``
        is a collection (one query; an empty one lists empty), and only if not whether it is
        a data object (one more): NotADirectory if so, else NotFound."""
        collection = self._lpath(path)
        folders = {Kind.DIR: Folder(Kind.DIR, self.principals),
                   Kind.FILE: Folder(Kind.FILE, self.principals)}
        pagers = {Kind.DIR: Pager(self._query, self.dialect, *coll_query(self.dialect,
                                                                         parent=collection)),
                  Kind.FILE: Pager(self._query, self.dialect, *data_query(self.dialect,
                                                                          collection))}
        pages: dict[Kind, list[list[str]] | None] = {}
        listed_any = False

        async def step(kind: Kind, pager: Pager) -> None:
            pages[kind] = await pager.next_page()

        while pagers:
            pages.clear()
            async with open_nursery() as nursery:
                for kind, pager in pagers.items():
                    nursery.start_soon(step, kind, pager)
            for kind in list(pagers):
                page = pages[kind]
                done = pagers[kind].done
                for entry in folders[kind].fold(page or [], last=done):
                    listed_any = True
                    yield entry
                if done:
                    del pagers[kind]
        if not listed_any and path != "/":  # the root was checked as the mount started
            await self._check_empty(path, collection)

    async def _check_empty(self, path: str, lpath: str) -> None:
        """Return if ``lpath`` is a collection (an empty one); raise NotADirectory if it
        is a data object, else NotFound."""
        if await self._named(Kind.DIR, *coll_query(self.dialect, path=lpath)):
            return
        parent, _, name = lpath.rpartition("/")
        if await self._named(Kind.FILE, *data_query(self.dialect, parent or "/", name)):
            raise NotADirectory(path)
        raise NotFound(path)

    async def _named(self, kind: Kind, select: str, where: str) -> list[Entry]:
        """The entries of one query for a single name (whose rows one answer holds)."""
        rows = await self._query(f"select {select} where {where}", self.dialect.parser, {})
        return Folder(kind, self.principals).fold(rows, last=True)

    async def stat(self, path: str) -> Entry:
        lpath = self._lpath(path)
        parent, _, name = lpath.rpartition("/")
        found: dict[Kind, list[Entry]] = {}

        async def one(kind: Kind, select: str, where: str) -> None:
            found[kind] = await self._named(kind, select, where)

        async with open_nursery() as nursery:
            nursery.start_soon(one, Kind.DIR, *coll_query(self.dialect, path=lpath))
            if path != "/":
                nursery.start_soon(one, Kind.FILE, *data_query(self.dialect, parent or "/",
                                                               name))
        entries = found.get(Kind.DIR) or found.get(Kind.FILE)
        if not entries:
            raise NotFound(path)
        return replace(entries[0], name=path.rpartition("/")[2])

    # -- reading ----------------------------------------------------------------------------

    async def open(self, path: str, entry: Entry) -> _ReadHandle:
        return _ReadHandle(self._lpath(path), entry.size)

    async def read(self, handle: _ReadHandle, offset: int, size: int) -> bytes | memoryview:
        size = max(0, min(size, handle.size - offset))
        if size == 0:
            return b""
        if size <= READ_MAX:
            return await self._read_range(handle.lpath, offset, size)
        pieces: dict[int, bytes | memoryview] = {}

        async def piece(start: int) -> None:
            pieces[start] = await self._read_range(handle.lpath, start,
                                                   min(READ_MAX, offset + size - start))

        async with open_nursery() as nursery:
            for start in range(offset, offset + size, READ_MAX):
                nursery.start_soon(piece, start)
        return b"".join(pieces[start] for start in sorted(pieces))

    async def _read_range(self, lpath: str, offset: int, size: int) -> bytes | memoryview:
        assert self.reader is not None and self.auth is not None
        url = self._base + "/data-objects?" + urlencode(
            {"op": "read", "lpath": lpath, "offset": offset, "count": size})
        return await self.reader.read(url, offset, size, range_in_url=True)

    # -- writing ----------------------------------------------------------------------------

    def _written(self, path: str, size: int) -> Entry:
        seconds = int(time.time())
        return Entry(name=path.rpartition("/")[2], kind=Kind.FILE, size=size,
                     mtime_ns=seconds * NS, version=version_of(seconds, size, ""))

    async def put(self, path: str, data: bytes, attributes: Attributes = NO_ATTRIBUTES
                  ) -> Entry:
        """Write ``data`` as the object's content, then store ``attributes.mtime_ns`` when it
        is set (see :meth:`set_attributes`; no request more otherwise)."""
        lpath = self._lpath(path)
        if data:
            await self._write(lpath, data, f"write {lpath}", truncate="1")
        else:  # an empty body is no write: create the object, then make sure it is empty
            await self._post("/data-objects", f"create {lpath}", op="touch", lpath=lpath)
            await self._post("/data-objects", f"truncate {lpath}", op="truncate",
                             lpath=lpath, size="0")
        return await self._stored(path, len(data), attributes)

    def _sent(self, path: str, size: int) -> Entry:
        """What an upload of ``size`` bytes stored; the version (the modification second the
        server chose) is for :meth:`confirm`'s stat to tell."""
        return replace(self._written(path, size), version="")

    async def _stored(self, path: str, size: int, attributes: Attributes) -> Entry:
        """The entry of an upload of ``size`` bytes whose content is stored, once the set
        modification time of ``attributes`` is stored too (mode and owner are not)."""
        sent = self._sent(path, size)
        seconds = storable_seconds(attributes.mtime_ns)
        if seconds is None:
            return sent
        await self._touch_data_object(self._lpath(path), seconds)
        return replace(sent, mtime_ns=seconds * NS)

    async def begin_upload(self, path: str, attributes: Attributes = NO_ATTRIBUTES
                           ) -> _ParallelUpload:
        """A parallel write handle on ``path``; its commit stores ``attributes`` as
        :meth:`put` does."""
        lpath = self._lpath(path)
        body = await self._post("/data-objects", f"upload {lpath}", op="parallel_write_init",
                                lpath=lpath, **{"stream-count": str(self.upload_parallelism),
                                                "truncate": "1"})
        handle = body.get("parallel_write_handle")
        if not isinstance(handle, str) or not handle:
            raise Unavailable(f"upload {lpath}: no parallel_write_handle in the answer")
        self.counters_extra["parallel_uploads"] += 1
        return _ParallelUpload(self, path, lpath, handle, self.upload_parallelism, attributes)

    async def mkdir(self, path: str, attributes: Attributes = NO_ATTRIBUTES) -> Entry:
        """A collection (the mode asked for is not stored: see the module docstring)."""
        lpath = self._lpath(path)
        body = await self._post("/collections", f"mkdir {lpath}", op="create", lpath=lpath)
        if body.get("created") is False:
            raise AlreadyExists(path)
        return Entry(name=path.rpartition("/")[2], kind=Kind.DIR,
                     mtime_ns=int(time.time()) * NS)

    def _trash(self) -> dict[str, str]:
        return {"no-trash": "1"} if self.settings.no_trash else {}

    async def unlink(self, path: str) -> None:
        lpath = self._lpath(path)
        await self._post("/data-objects", f"rm {lpath}", op="remove", lpath=lpath,
                         **{"catalog-only": "0"}, **self._trash())

    async def rmdir(self, path: str) -> None:
        lpath = self._lpath(path)
        await self._post("/collections", f"rmdir {lpath}", op="remove", lpath=lpath,
                         recurse="0", **self._trash())

    async def rename(self, old: str, new: str, entry: Entry) -> Entry:
        source, target = self._lpath(old), self._lpath(new)
        endpoint = "/collections" if entry.is_dir else "/data-objects"

        async def move() -> None:
            await self._post(endpoint, f"rename {source}", op="rename",
                             **{"old-lpath": source, "new-lpath": target})

        try:
            await move()
        except AlreadyExists:
            # iRODS never replaces; POSIX does (a file by a file, an empty directory by a
            # directory), so the target goes first.
            await (self.rmdir(new) if entry.is_dir else self.unlink(new))
            await move()
        return replace(entry, name=new.rpartition("/")[2])

    async def truncate(self, path: str, size: int) -> Entry:
        lpath = self._lpath(path)
        await self._post("/data-objects", f"truncate {lpath}", op="truncate", lpath=lpath,
                         size=str(size))
        return self._written(path, size)

    async def set_attributes(self, path: str, entry: Entry, attributes: Attributes) -> Entry:
        """Store the modification time (whole seconds, see the module's docstring); the entry
        returned shows the stored second and never the mode or owner asked for: iRODS keeps
        access lists, not POSIX bits and ids. No request when no storable time is set."""
        seconds = storable_seconds(attributes.mtime_ns)
        if seconds is None:
            return entry
        lpath = self._lpath(path)
        if entry.is_dir:
            await self._post("/collections", f"touch {lpath}", op="touch", lpath=lpath,
                             **{"seconds-since-epoch": str(seconds)})
            return replace(entry, mtime_ns=seconds * NS)
        await self._touch_data_object(lpath, seconds)
        return replace(entry, mtime_ns=seconds * NS, version=version_of(
            seconds, entry.size, entry.checksums.get("irods", "")))

    async def _touch_data_object(self, lpath: str, seconds: int) -> None:
        """Set the modification time of every replica a listing may show (the good ones, else
        all): iRODS touches only the newest good replica unless told which, and another good
        one would still show its own time. NotFound when there is no such data object."""
        parent, _, name = lpath.rpartition("/")
        rows = await self._small_result(
            "DATA_REPL_NUM, DATA_REPL_STATUS",
            f"COLL_NAME = {literal(parent or '/')} and DATA_NAME = {literal(name)}")
        if not rows:
            raise NotFound(f"touch {lpath}: no such data object")
        replicas = sorted({row[0] for row in rows if row[1] == "1"} or {row[0] for row in rows})

        async def touch(number: str) -> None:
            await self._post("/data-objects", f"touch {lpath}", op="touch", lpath=lpath,
                             **{"no-create": "1", "replica-number": number,
                                "seconds-since-epoch": str(seconds)})

        async with open_nursery() as nursery:
            for number in replicas:
                nursery.start_soon(touch, number)

    async def _small_result(self, select: str, where: str) -> list[list[str]]:
        """All rows of a query about one object (its replicas, its AVUs): one GenQuery2
        query of up to ``page_rows`` rows, or GenQuery1 page by page."""
        if self.dialect.parser == "genquery2":
            return await self._query(f"select {select} where {where} "
                                     f"limit {self.dialect.page_rows}", "genquery2", {})
        pager = Pager(self._query, self.dialect, select, where)
        rows: list[list[str]] = []
        while (page := await pager.next_page()) is not None:
            rows.extend(page)
        return rows

    # -- metadata (AVUs) ----------------------------------------------------------------------

    async def _avus(self, path: str, entry: Entry) -> list[tuple[str, str, str]]:
        lpath = self._lpath(path)
        if entry.is_dir:
            select = "META_COLL_ATTR_NAME, META_COLL_ATTR_VALUE, META_COLL_ATTR_UNITS"
            where = f"COLL_NAME = {literal(lpath)}"
        else:
            parent, _, name = lpath.rpartition("/")
            select = "META_DATA_ATTR_NAME, META_DATA_ATTR_VALUE, META_DATA_ATTR_UNITS"
            where = f"COLL_NAME = {literal(parent or '/')} and DATA_NAME = {literal(name)}"
        rows = await self._small_result(select, where)
        return [(row[0], row[1], row[2] if len(row) > 2 else "") for row in rows]

    async def xattrs(self, path: str, entry: Entry) -> Mapping[str, bytes]:
        attrs: dict[str, list[tuple[str, str]]] = {}
        for name, value, units in await self._avus(path, entry):
            attrs.setdefault(name, []).append((value, units))
        result: dict[str, bytes] = {}
        for name, pairs in attrs.items():
            pairs.sort()
            result[f"irods.{name}"] = "\n".join(v for v, _ in pairs).encode()
            if any(u for _, u in pairs):
                result[f"irods.{name}{UNITS_SUFFIX}"] = "\n".join(u for _, u in pairs).encode()
        checksum = entry.checksums.get("irods")
        if checksum:
            result["irods.checksum"] = checksum.encode()
        return result

    async def set_xattr(self, path: str, entry: Entry, name: str, value: bytes | None) -> Entry:
        if name == "irods.checksum":
            raise NotPermitted("user.irods.checksum is computed by iRODS")
        if not name.startswith("irods.") or len(name) == len("irods."):
            raise NotSupported(f"only user.irods.* attributes are stored, not user.{name}")
        try:
            text = None if value is None else value.decode()
        except UnicodeDecodeError:
            raise NotSupported(f"user.{name}: AVU values are UTF-8 text") from None
        attribute = name[len("irods."):]
        units_only = attribute.endswith(UNITS_SUFFIX)
        if units_only:
            attribute = attribute[:-len(UNITS_SUFFIX)]
        current = [(v, u) for a, v, u in await self._avus(path, entry) if a == attribute]
        if text is None and not (current and (not units_only or any(u for _, u in current))):
            raise NoSuchAttribute(f"{path}: no user.{name}")
        if units_only:
            units = _split(text or "")
            if text is not None and len(units) not in (1, len(current)):
                raise NotSupported(f"user.{name}: give one unit or one per value")
            if not current:
                raise NoSuchAttribute(f"{path}: no user.irods.{attribute} to give units to")
            wanted = [(v, units[i] if len(units) > 1 else units[0])
                      for i, (v, _) in enumerate(sorted(current))]
        elif text is None:
            wanted = []
        else:
            values = _split(text)
            old_units = {u for _, u in current}
            keep = old_units.pop() if len(old_units) == 1 else ""
            wanted = [(v, keep) for v in values]
        operations = [{"operation": "remove", "attribute": attribute, "value": v,
                       **({"units": u} if u else {})} for v, u in current]
        operations += [{"operation": "add", "attribute": attribute, "value": v,
                        **({"units": u} if u else {})} for v, u in wanted]
        lpath = self._lpath(path)
        await self._post("/collections" if entry.is_dir else "/data-objects",
                         f"metadata of {lpath}", op="modify_metadata", lpath=lpath,
                         operations=json.dumps(operations))
        return entry

    def use_data_proxy(self, url: str) -> None:
        """Refused: reads are ``op=read&offset&count`` calls of the HTTP API carrying the
        reader's bearer token, not HTTP ranges of a URL that names the content; a cache
        keyed on them would hand one user's bytes to another."""
        raise NotSupported("irods: reads are calls of the iRODS HTTP API under the reader's "
                           "token, not cacheable HTTP ranges; no data proxy")

    def shared_identity(self) -> str:
        s = self.settings
        return f"irods {s.host}:{s.port} zone={s.zone} user={s.user} root={s.root}"

    def counters(self) -> Mapping[str, int]:
        counters = client_counters(self.api, self.reader) + self.counters_extra
        if self.auth is not None:
            counters["logins"] = self.auth.renewals
        return counters


class _ParallelUpload(Upload):
    """One parallel write handle: part ``n`` goes to stream ``(n - 1) % streams``, one request
    at a time per stream (the API requires it when the stream index is given)."""

    def __init__(self, backend: IrodsBackend, path: str, lpath: str, handle: str,
                 streams: int, attributes: Attributes) -> None:
        self.backend = backend
        self.attributes = attributes
        self.path = path
        self.lpath = lpath
        self.handle = handle
        self.streams = [trio.Lock() for _ in range(streams)]
        self._closed = False

    async def write_part(self, number: int, offset: int, data: bytes) -> None:
        index = (number - 1) % len(self.streams)
        async with self.streams[index]:
            await self.backend._write(
                self.lpath, data, f"part {number} of {self.lpath}", offset=str(offset),
                truncate="0", **{"parallel-write-handle": self.handle,
                                 "stream-index": str(index)})

    async def _shutdown(self) -> None:
        await self.backend._post("/data-objects", f"finish upload of {self.lpath}",
                                 op="parallel_write_shutdown",
                                 **{"parallel-write-handle": self.handle})
        self._closed = True  # a failed shutdown is tried again by abort()

    async def commit(self, size: int) -> Entry:
        await self._shutdown()
        return await self.backend._stored(self.path, size, self.attributes)

    async def release_unconfirmed(self) -> None:
        """The shutdown's success was not real: close the handle (again), quietly."""
        try:
            await self.backend._post("/data-objects", f"finish upload of {self.lpath}",
                                     op="parallel_write_shutdown",
                                     **{"parallel-write-handle": self.handle})
        except RucioFsError as exc:
            log.debug("closing the unconfirmed upload of %s: %s", self.lpath, exc)

    async def abort(self) -> None:
        if self._closed:
            return
        try:
            await self._shutdown()
        except RucioFsError as exc:
            log.warning("closing the upload of %s failed: %s", self.lpath, exc)
