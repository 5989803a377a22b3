"""``s3://`` — an S3 bucket (or a prefix of it) as a read-write directory tree.

Tree. ``/`` in keys separates directories. A directory is a common prefix of keys or an empty
``dir/`` marker object (``mkdir`` writes one); its time is the mount's start unless its marker
stores one (see Attributes). A file is an
object; its version is the ETag (reads send ``If-Match``, so a file changed on the server
mid-read fails instead of mixing contents).

Keys that cannot be POSIX paths follow one documented rule: they are left out of listings,
counted in the ``hidden_keys`` counter and named once in the log. These are keys with an empty
component (``a//b``), a ``.`` or ``..`` component, or a NUL. When a key is both an object and
a prefix (``k`` beside ``k/child``), the directory wins and the object is hidden, as
mountpoint-s3 does. A hidden key is never read, written or deleted through the mount.

Costs. A listing is ListObjectsV2 with ``delimiter=/`` (1,000 keys per page), whose entries
carry size, time and ETag: no HEAD per entry. Only a listing that names no key at all (not
even an empty directory's marker) sends one HEAD of the key: a file's path is NotADirectory,
and a path with neither object, marker nor key below is NotFound, as its ``stat`` says.
Looking up a name no listing has shown sends a LIST of the keys starting with it and a HEAD
of the key at once; a directory then a HEAD of its marker. Reads are ranged GETs on a
presigned URL through the core's read path.

Writes (see :mod:`rucio_fs.write.writeback`): a file up to ``part_size`` is one PUT, a larger one a
multipart upload whose parts are sent while it is written. Every body carries ``Content-MD5``,
which S3 checks; a PUT sent once and answered with its body's MD5 as ETag is confirmed by that
answer, every other upload by a HEAD. ``unlink`` is DELETE; ``mkdir`` PUTs a marker;
``rmdir`` removes an empty directory's marker; renaming a file is a server-side copy then
DELETE (multipart copy above 5 GiB). Renaming a directory is refused with EXDEV, a documented
limit: S3 has no directory to rename, and ``mv`` then copies and deletes the tree itself.
Extended attributes: ``user.s3.etag``, ``user.s3.storage_class``, and ``user.s3.meta.<key>``
for user metadata, which ``setxattr``/``removexattr`` rewrite with a copy-in-place (but for
the attributes' headers below, which ``stat`` shows and ``chmod``, ``chown`` and ``touch``
set).

Attributes (``chmod``, ``chown``, times) are user metadata in the headers s3fs-fuse writes
and reads, so that s3fs and rclone mounts of the same bucket show them: ``x-amz-meta-mtime``,
``-mode``, ``-uid``, ``-gid`` (formats, and how rclone's are read too: :mod:`.metadata`). An
upload carries the attributes the core gives it; changing them later is a copy of the object
onto itself that replaces its metadata (every other user metadata and content header kept;
the multipart copy above 5 GiB): the content stays, and so does the ETag of an object put
in one piece (servers may give a copied multipart object a new one). Such a copy also stores
the object's time as ``mtime`` when it had none, so a ``chmod`` or a rename never shows as a
new modification. A directory's attributes live on its ``dir/`` marker, where it has one; a
directory that is only a prefix (and the mount's root) stores none: the core keeps them for
the mount's life, and no marker is written for them.

A ``/``-delimited listing carries no user metadata, and sending a HEAD per entry would make
``ls -l`` of 10,000 objects cost 10,000 requests. So ``stat`` of a file sends a HEAD beside
its LIST (at once: one round trip) and shows the stored attributes, while a listing shows
each object with its Last-Modified time unless this backend has learned the object's
attributes (from a HEAD, its own upload or change: :class:`~.metadata.AttributeMemo`, for
100,000 keys) and the object listed still has that ETag and Last-Modified second. A listed
directory shows what was learned of its marker (a listing does not show the marker itself).
Limit: a server that keeps Last-Modified through a copy of an object onto itself (versitygw
does) hides another client's change of only the metadata made that way from this check; a
lookup of the name (``stat``) shows it.

Symbolic links are objects whose content is the target, marked by the mode ``S_IFLNK|0777``
as s3fs makes them; ``readlink`` reads the content (4 KiB at most). A listing cannot see the
mode: it shows a link that this backend has not stat-ed or made as a file (a documented
limit), until a lookup of the name shows it as the link it is.

Errors: 403 is EACCES, a spent quota (MinIO's ``XMinioAdminBucketQuotaExceeded``, Ceph's
``QuotaExceeded``) EDQUOT, a full server (``XMinioStorageFull``, HTTP 507) ENOSPC.

Why one module of this size: it is the S3 mapping of the whole backend contract (listing,
reading, writing, attributes, removal in batches); the request plumbing, signing, metadata,
listing pages and uploads have modules of their own.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import stat
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from email.utils import parsedate_to_datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar, TypeVar
from urllib.parse import quote, urlsplit

import httpx
import trio
from cachetools import LRUCache

from rucio_fs.backend import (
    NO_ATTRIBUTES,
    Attributes,
    Backend,
    Capability,
    Entry,
    Kind,
    check_confirmed,
)
from rucio_fs.errors import (
    AlreadyExists,
    CrossDevice,
    InvalidInput,
    MissingCredentials,
    NoSuchAttribute,
    NotADirectory,
    NotEmpty,
    NotFound,
    NotPermitted,
    NotSupported,
    PermissionDenied,
    RucioFsError,
    Unavailable,
    Unconfirmed,
)
from rucio_fs.http import (
    ApiClient,
    RangeReader,
    client_counters,
    quote_path,
    sent_once,
    tls_context,
)
from rucio_fs.identity import CallerCredentials, caller_source
from rucio_fs.kept_file import KeptFile
from rucio_fs.tasks import open_nursery

from .metadata import (
    ATTRIBUTE_NAMES,
    MTIME,
    SYMLINK_MODE,
    AttributeMemo,
    StoredAttributes,
    format_mtime,
    read_attributes,
    user_metadata,
    written_metadata,
)
from .pages import (
    DELETE_BATCH,
    EXAMINED_STATUSES,
    PageFolder,
    delete_errors,
    delete_request,
    describe,
    next_token,
    parse_page,
    result,
    s3_error,
    xml_safe,
)
from .settings import CREDENTIAL_ENV, S3Settings, caller_aws_file, parse_url
from .signing import SigV4
from .upload import MultipartUpload, content_md5, md5, md5_of

log = logging.getLogger(__name__)

#: Keys one ``stat`` LIST asks for: the name's own key, and siblings that sort before its
#: ``name/`` prefix.
STAT_KEYS = 100
#: Objects whose last HEAD is kept for the next metadata copy of them (only the headers a
#: copy needs: about half a kilobyte each). `rsync -a` makes a tree's directories first and
#: sets their times again once their files are in.
HEADS_KEPT = 16384
#: The most directories remembered as holding what their listing does not show.
UNLISTED_KEPT = 4096
#: The headers of a kept HEAD: what a metadata copy or a rename starts from.
_HEAD_KEPT_NAMES = frozenset({"etag", "content-length", "last-modified",
                              "x-amz-storage-class"})
#: Presigned read URLs live this long and are renewed at half of it.
PRESIGN_SECONDS = 3600
#: CopyObject's size limit; larger objects are copied part by part.
COPY_MAX = 5 << 30
COPY_PART = 1 << 30
_UNSAFE_META = frozenset("\r\n\0")


@functools.lru_cache(maxsize=4096)
def _iso_ns(text: str) -> int:
    """Nanoseconds of an ISO 8601 time (cached: objects written together share times)."""
    try:
        return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1e9)
    except ValueError:
        return 0


@functools.lru_cache(maxsize=64)
def _storage_class(name: str) -> Mapping[str, str]:
    """One shared, read-only metadata mapping per storage class."""
    return MappingProxyType({"storage_class": name} if name else {})


@functools.lru_cache(maxsize=64)  # (answers of one second carry one date)
def _http_date_ns(text: str | None) -> int:
    try:
        return int(parsedate_to_datetime(text).timestamp() * 1e9) if text else 0
    except (TypeError, ValueError):
        return 0


@dataclass
class _ReadHandle:
    key: str
    etag: str
    url: str
    signed_at: float


#: When this process started: the time of directories (prefixes have none), the same for
#: every backend of the daemon (a per-user mount's users see the same attributes).
STARTED_NS = time.time_ns()
#: The longest symbolic link target read (Linux's PATH_MAX).
SYMLINK_MAX = 4096
#: Headers a copy that replaces the metadata must send again, or the object loses them.
_KEPT_HEADERS = ("content-type", "cache-control", "content-disposition", "content-encoding",
                 "content-language", "expires", "x-amz-storage-class",
                 "x-amz-server-side-encryption", "x-amz-server-side-encryption-aws-kms-key-id")

A = TypeVar("A")
B = TypeVar("B")


async def _both(first: Callable[[], Awaitable[A]], second: Callable[[], Awaitable[B]]
                ) -> tuple[A, B]:
    """Both calls' results, the calls made at once (the first failure cancels the other)."""
    results: dict[int, Any] = {}

    async def run(index: int, call: Callable[[], Awaitable[Any]]) -> None:
        results[index] = await call()

    async with open_nursery() as nursery:
        nursery.start_soon(run, 0, first)
        nursery.start_soon(run, 1, second)
    return results[0], results[1]


def _seconds(ns: int) -> int:
    return ns // 1_000_000_000


def _etag(response: httpx.Response) -> str:
    return response.headers.get("etag", "").strip('"')


def _last_modified_ns(response: httpx.Response) -> int:
    return _http_date_ns(response.headers.get("last-modified"))


def _date_s(response: httpx.Response) -> int | None:
    """The second the server dated its answer (``Date``), None without one."""
    ns = _http_date_ns(response.headers.get("date"))
    return _seconds(ns) if ns else None


def _pin_mtime(metadata: dict[str, str], head: httpx.Response) -> None:
    """Store the object's Last-Modified as its ``mtime`` if it stores none: the copy about to
    be made would otherwise show as a modification."""
    if MTIME not in metadata:
        metadata[MTIME] = format_mtime(_last_modified_ns(head))


def _replacing(head: httpx.Response, metadata: Mapping[str, str]) -> dict[str, str]:
    """The headers of a copy that replaces the metadata of the object whose HEAD is ``head``
    with ``metadata`` (names without ``x-amz-meta-``), keeping its content headers."""
    headers = {name: head.headers[name] for name in _KEPT_HEADERS if name in head.headers}
    headers.update({f"x-amz-meta-{name}": value for name, value in metadata.items()})
    return headers


class S3Backend(Backend):
    scheme: ClassVar[str] = "s3"
    description: ClassVar[str] = "S3 buckets (AWS and compatible servers), read-write"
    capabilities: ClassVar[Capability] = (Capability.WRITE | Capability.MKDIR
                                          | Capability.UNLINK | Capability.RENAME
                                          | Capability.SETXATTR | Capability.SYMLINK)
    #: ``x-amz-meta-mtime`` rides in the PUT (or the multipart upload's start).
    stores_write_times: ClassVar[bool] = True
    implied_directories: ClassVar[bool] = True

    def __init__(self, settings: S3Settings) -> None:
        self.settings = settings
        self.single_put_max = self.upload_part_size = settings.part_size
        self.counters_extra: Counter[str] = Counter()
        self._credentials: Any = None
        self._signer: SigV4 | None = None
        self._started_ns = STARTED_NS
        endpoint = urlsplit(settings.endpoint_url)
        if settings.path_style:
            self._base = settings.endpoint_url
            self._bucket_path = "/" + quote(settings.bucket)
        else:
            self._base = f"{endpoint.scheme}://{settings.bucket}.{endpoint.netloc}"
            self._bucket_path = ""
        self.api: ApiClient | None = None
        self.reader: RangeReader | None = None
        self._hidden_logged = 0
        self._data_proxy = ""
        self._etag_scheme_logged = False
        self.memo = AttributeMemo()
        #: The last HEAD this mount saw of an object it just uploaded or changed (key ->
        #: the answer): what the next metadata copy of it keeps, if its ETag still matches
        #: (`rsync` uploads, sets the time, then renames: one HEAD for the three).
        self._heads: LRUCache[str, dict[str, str]] = LRUCache(HEADS_KEPT)
        #: Markers of listed directories, each with whether its last listing found what it
        #: cannot show: hidden keys, or the marker's own data (see :meth:`holds_unlisted`).
        self._unlisted: LRUCache[str, bool] = LRUCache(UNLISTED_KEPT)
        #: Objects whose PUT answer proved them (key -> ETag): their ``confirm`` needs no HEAD.
        self._proven: LRUCache[str, str] = LRUCache(HEADS_KEPT)
        #: Where the memo is kept for the next mounts (``--cache-dir``), else None.
        self._kept_dir: Path | None = None
        self._kept_memo: KeptFile | None = None
        self._memo_identity = ""

    @classmethod
    def from_url(cls, url: str) -> S3Backend:
        return cls(parse_url(url))

    # -- lifecycle ------------------------------------------------------------------------

    credential_env: ClassVar[tuple[str, ...]] = CREDENTIAL_ENV

    @classmethod
    def for_caller(cls, url: str, credentials: CallerCredentials) -> S3Backend:
        """The caller's ``AWS_*`` variables, then its ``~/.aws/credentials`` and
        ``~/.aws/config`` (or ``AWS_SHARED_CREDENTIALS_FILE`` / ``AWS_CONFIG_FILE``), read as
        the caller; never the machine's instance or container role (that is the node's
        identity, not the user's)."""
        import botocore.configloader
        import botocore.credentials as providers

        source = caller_source(credentials)
        backend = cls(parse_url(url, source))
        if backend.settings.anonymous:
            return backend
        profile = backend.settings.profile or "default"
        chain: list[Any] = [providers.EnvProvider(environ=dict(source.environ))]
        shared = caller_aws_file(source, "credentials")
        if shared is not None:
            chain.append(providers.SharedCredentialProvider(shared, profile_name=profile))
        config = caller_aws_file(source, "config")
        if config is not None:
            chain.append(providers.ConfigProvider(config, profile_name=profile,
                                                  config_parser=botocore.configloader.
                                                  raw_config_parse))
        found = providers.CredentialResolver(chain).load_credentials()
        if found is None:
            raise MissingCredentials(f"uid {credentials.uid} has no AWS credentials "
                                     "(AWS_ACCESS_KEY_ID, ~/.aws/credentials or ~/.aws/config)")
        backend._credentials = found
        return backend

    async def start(self) -> None:
        settings = self.settings
        signer = None
        if not settings.anonymous:
            if self._credentials is None:
                self._credentials = await trio.to_thread.run_sync(self._find_credentials)
            signer = self._signer = SigV4(self._credentials, settings.region)
        ca = os.environ.get("AWS_CA_BUNDLE") or None
        context = tls_context(ca)
        self.api = ApiClient(self._base, verify=context, timeout=settings.timeout,
                             describe=describe, signer=signer)
        self.reader = RangeReader(context=context, timeout=settings.timeout,
                                  via=self._data_proxy)
        # One cheap request proves bucket, endpoint and credentials before mounting.
        query = self._query({"list-type": "2", "max-keys": "1", "prefix": settings.prefix})
        try:
            await self._request("GET", self._bucket_path + "/" + query,
                                what=f"bucket {settings.bucket}")
        except NotFound as exc:
            raise NotFound(f"bucket {settings.bucket} does not exist at "
                           f"{settings.endpoint_url} ({exc})") from None
        except PermissionDenied as exc:
            raise PermissionDenied(f"access to bucket {settings.bucket} denied: {exc}") from None
        # The first read then pays no TCP/TLS handshake and no worker-thread start.
        await self.reader.connect(self._base + "/")
        if self._kept_dir is not None and self.memo.enabled:
            await trio.to_thread.run_sync(self._restore_memo)

    def keep_state_in(self, directory: Path) -> None:
        """The attribute memo is kept there at unmount, and the next mount of the bucket
        with the same credentials starts from it: a listing then shows the stored times and
        modes of the files it had learned (if each is unchanged: same ETag and
        Last-Modified) without a HEAD apiece (``rsync -a`` into a tree copied before).
        Directories still get the HEAD of their marker."""
        self._kept_dir = directory

    def _restore_memo(self) -> None:
        assert self._kept_dir is not None
        credentials = getattr(self._credentials, "access_key", None) or "anonymous"
        identity = hashlib.sha256(f"{self.settings.endpoint_url} {self.settings.bucket} "
                                  f"{credentials}".encode()).hexdigest()
        self._kept_memo = KeptFile(self._kept_dir / f"attributes-{identity[:16]}.json")
        kept = self._kept_memo.read()
        if isinstance(kept, dict) and kept.get("identity") == identity:
            taken = self.memo.restore(kept.get("records") or [])
            log.info("%s: attributes of %d objects kept from an earlier mount",
                     self.settings.bucket, taken)
        self._memo_identity = identity

    def _find_credentials(self) -> Any:
        import botocore.session

        session = botocore.session.Session(profile=self.settings.profile)
        try:
            credentials = session.get_credentials()
        except Exception as exc:
            raise InvalidInput(f"AWS credentials: {exc}") from None
        if credentials is None:
            raise InvalidInput("no AWS credentials found (environment, ~/.aws/credentials, "
                               "profile, or instance role); use -o anonymous=1 for a public "
                               "bucket")
        return credentials

    async def aclose(self) -> None:
        if self._kept_memo is not None and self.memo.enabled:
            value = {"identity": self._memo_identity, "records": self.memo.records()}
            await trio.to_thread.run_sync(self._kept_memo.write, value)
        if self.api is not None:
            await self.api.aclose()
        if self.reader is not None:
            self.reader.close()

    # -- names ------------------------------------------------------------------------------

    def _key(self, path: str) -> str:
        return self.settings.prefix + path.lstrip("/")

    def _url_path(self, key: str) -> str:
        return f"{self._bucket_path}/{quote_path(key)}"

    @staticmethod
    def _query(params: Mapping[str, str]) -> str:
        """A query string encoded exactly as SigV4 canonicalises it."""
        return "?" + "&".join(f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}"
                              for k, v in params.items())

    def _api(self) -> ApiClient:
        assert self.api is not None, "S3Backend.start() was not called"
        return self.api

    async def _request(self, method: str, path: str, *, expect: Sequence[int] = (200,),
                       what: str, **kwargs: Any) -> httpx.Response:
        """One S3 request (retried as :meth:`ApiClient.request` does); an unexpected answer
        raises the error its S3 error code means (:func:`~.pages.s3_error`)."""
        wanted = frozenset(expect)
        response = await self._api().request(method, path, expect=wanted | EXAMINED_STATUSES,
                                             what=what, **kwargs)
        if response.status_code not in wanted:
            raise s3_error(response, what)
        return response

    # -- the backend's own cache ----------------------------------------------------------

    def use_caches(self, enabled: bool) -> None:
        """Without caches no attributes are remembered: a listing shows Last-Modified."""
        self.memo.enabled = enabled
        if not enabled:
            self.memo.clear()
            self._heads = LRUCache(0)

    def drop_caches(self) -> None:
        self.memo.clear()
        self._heads.clear()

    async def _head_for_change(self, key: str, version: str) -> httpx.Response:
        """The HEAD of ``key`` a metadata copy starts from: the one kept of the object this
        mount last uploaded or changed there, if it is still that object (``version``),
        else a new one. Taken once: a change keeps the HEAD it makes of its result."""
        kept = self._kept_head(key)
        if kept is not None and version and _etag(kept) == version:
            self.counters_extra["heads_saved"] += 1
            return kept
        return await self._head(key)

    def _keep(self, key: str, headers: Mapping[str, str]) -> None:
        """Keep what a HEAD of ``key`` answers now (the headers a copy needs)."""
        self._heads[key] = {name.lower(): value for name, value in headers.items()
                            if name.lower() in _HEAD_KEPT_NAMES
                            or name.lower() in _KEPT_HEADERS
                            or name.lower().startswith("x-amz-meta-")}

    def _kept_head(self, key: str) -> httpx.Response | None:
        """The kept HEAD of ``key``, taken (a change keeps the one of its result)."""
        kept = self._heads.pop(key, None)
        return None if kept is None else httpx.Response(200, headers=kept)

    def _keep_head(self, key: str, head: httpx.Response, headers: Mapping[str, str],
                   etag: str) -> None:
        """What a HEAD of ``key`` now answers, after a copy with ``headers`` made ``etag``
        of the object ``head`` described."""
        kept = {name: value for name, value in head.headers.items()
                if not name.lower().startswith("x-amz-meta-") and name.lower() not in headers}
        kept.update(headers)
        kept["etag"] = f'"{etag}"'
        self._keep(key, kept)

    # -- namespace --------------------------------------------------------------------------

    async def _first_keys(self, prefix: str,
                          max_keys: int) -> tuple[list[dict[str, str]], list[str]]:
        """The first ``max_keys`` keys under ``prefix`` (no delimiter, no paging)."""
        return parse_page(await self._fetch_page(prefix, None, "", max_keys), prefix)

    async def _fetch_page(self, prefix: str, token: str | None, delimiter: str,
                          max_keys: int) -> bytes:
        params = {"list-type": "2", "prefix": prefix, "encoding-type": "url",
                  "max-keys": str(max_keys)}
        if delimiter:
            params["delimiter"] = delimiter
        if token:
            params["continuation-token"] = token
        response = await self._request(
            "GET", self._bucket_path + "/" + self._query(params), what=f"list {prefix or '/'}")
        return response.content

    async def list(self, path: str) -> AsyncIterator[Entry]:
        """The keys and common prefixes under ``path/``. A listing that names nothing, not
        even the directory's marker, sends one HEAD of the key (below the mount's root
        only): an object there is NotADirectory, no object NotFound, as :meth:`stat` says of
        a prefix without keys. A listing that names anything costs no request more."""
        prefix = self._key(path).rstrip("/") + "/" if path != "/" else self.settings.prefix
        page = PageFolder(prefix, self._file_entry, self._dir_entry("", None),
                          dir_entry=self._listed_dir)
        # Each page is parsed in a worker thread while the next one is being fetched, so
        # parsing overlaps the server's work; its entries go out page by page.
        body = await self._fetch_page(prefix, None, "/", 1000)
        while True:
            token = next_token(body, prefix)
            following: dict[str, bytes] = {}

            async def fetch(token: str | None = token, into: dict = following) -> None:
                into["body"] = await self._fetch_page(prefix, token, "/", 1000)

            async with open_nursery() as nursery:
                if token is not None:
                    nursery.start_soon(fetch)
                ready = await trio.to_thread.run_sync(page.fold, body, token is None)
            for entry in ready:
                yield entry
            if token is None:
                break
            body = following["body"]
        if not page.named_any and path != "/":
            await self._not_listable(path, prefix[:-1])
        self._unlisted[prefix] = bool(page.hidden) or page.marker_holds_data
        if page.hidden:
            self.counters_extra["hidden_keys"] += len(page.hidden)
            if self._hidden_logged < 20:
                self._hidden_logged += 1
                log.warning("%s: %d key(s) cannot be shown as POSIX names and are hidden "
                            "(e.g. %r)", path, len(page.hidden), page.hidden[0])

    async def _not_listable(self, path: str, key: str) -> None:
        """Raise why ``path``, whose listing named no key, is no directory: NotADirectory
        if ``key`` is an object, else NotFound."""
        try:
            await self._head(key)
        except NotFound:
            raise NotFound(f"{path}: no object, directory marker or key below it") from None
        raise NotADirectory(path)

    def _file_entry(self, name: str, item: Mapping[str, str]) -> Entry:
        """A listed object's entry: as listed, with the attributes remembered for it if it
        is still the object they were learned from (may run in a worker thread)."""
        try:
            size = int(item.get("Size", "0"))
        except ValueError:
            raise Unavailable(f"listing: bad size {item.get('Size')!r} for {name}") from None
        mtime_ns = _iso_ns(item.get("LastModified", ""))
        etag = item.get("ETag", "").strip('"')
        stored = self.memo.matching(item.get("Key", ""), etag, _seconds(mtime_ns))
        if stored is None:  # (a lookup of the name asks `stat` for what is stored)
            return Entry(name=name, kind=Kind.FILE, size=size, mtime_ns=mtime_ns, version=etag,
                         metadata=_storage_class(item.get("StorageClass", "")),
                         complete=False)
        return Entry(name=name, kind=stored.kind, size=size,
                     mtime_ns=mtime_ns if stored.mtime_ns is None else stored.mtime_ns,
                     version=etag, metadata=_storage_class(item.get("StorageClass", "")),
                     mode=stored.mode, uid=stored.uid, gid=stored.gid)

    def _dir_entry(self, name: str, stored: StoredAttributes | None) -> Entry:
        """A directory's entry: the mount's start time unless its marker is known (its stored
        attributes, else its own time)."""
        if not stored:
            return Entry(name=name, kind=Kind.DIR, mtime_ns=self._started_ns)
        return Entry(name=name, kind=Kind.DIR,
                     mtime_ns=self._started_ns if stored.mtime_ns is None else stored.mtime_ns,
                     mode=stored.mode, uid=stored.uid, gid=stored.gid)

    def _listed_dir(self, name: str, prefix: str) -> Entry:
        """A listed directory shows what was learned of its marker ``prefix`` (a listing does
        not show the marker, so this cannot be checked against it); one never learned is
        incomplete."""
        known = self.memo.known(prefix)
        if known is None:
            return Entry(name=name, kind=Kind.DIR, mtime_ns=self._started_ns, complete=False)
        return self._dir_entry(name, known)

    async def stat(self, path: str) -> Entry:
        """A LIST of the keys that start with the name and a HEAD of the key, sent at once
        (one round trip). The LIST says whether ``name/`` is a directory (which wins over an
        object of the same name); a directory then sends a HEAD of its marker, whose
        attributes it shows. A file's entry is the HEAD's: its stored attributes (a symlink
        by its mode), which a listing cannot show; the LIST's when the HEAD found nothing
        (deleted in between, or a server whose HEAD is refused). (On versitygw on loopback a
        file's stat costs 1.8 ms of this daemon's CPU, against 0.8 ms for the LIST alone and
        1.3 ms for a LIST then a HEAD; sent at once they save a round trip to a remote
        server. A directory: 2.5 ms with its marker's HEAD after.)"""
        if path == "/":
            return self._dir_entry("", None)
        key = self._key(path)
        name = path.rpartition("/")[2]
        (is_dir, listed), head = await _both(lambda: self._stat_listing(key),
                                             lambda: self._head_if_any(key))
        if is_dir:
            return await self._directory(name, key + "/")
        if head is not None:
            return self._head_entry(name, key, head)
        if listed is not None:
            return self._file_entry(name, listed)
        raise NotFound(path)

    async def complete(self, path: str, listed: Entry) -> Entry:
        """One HEAD, where :meth:`stat` sends a LIST too: of the marker of a listed
        directory, of the key of a listed file (when that key is gone, the whole stat)."""
        key = self._key(path)
        if listed.is_dir:
            return await self._directory(listed.name, key + "/")
        head = await self._head_if_any(key)
        if head is None:
            return await self.stat(path)
        return self._head_entry(listed.name, key, head)

    async def _stat_listing(self, key: str) -> tuple[bool, Mapping[str, str] | None]:
        """One LIST of the keys that start with ``key``: whether ``key/`` is a directory, and
        the listed object of that exact key (if any). Only when more than :data:`STAT_KEYS`
        siblings sort between the two (``name-1``, ``name.bak`` …) is ``key/`` asked
        separately."""
        body = await self._fetch_page(key, None, "/", STAT_KEYS)
        contents, prefixes = parse_page(body, key)
        below = key + "/"
        if below in prefixes:
            return True, None
        seen = [item.get("Key", "") for item in contents] + prefixes
        if next_token(body, key) is not None and max(seen, default="") < below:
            sub_contents, sub_prefixes = await self._first_keys(below, 1)
            if sub_contents or sub_prefixes:
                return True, None
        return False, next((item for item in contents if item.get("Key") == key), None)

    async def _head_if_any(self, key: str) -> httpx.Response | None:
        """The HEAD of ``key``; None when there is no such object (or HEAD is refused)."""
        try:
            return await self._head(key)
        except (NotFound, PermissionDenied):
            return None

    async def _directory(self, name: str, marker: str) -> Entry:
        """Directory ``name`` with the attributes its ``marker`` stores, if it has one."""
        head = await self._head_if_any(marker)
        if head is None:
            self.memo.forget(marker)
            return self._dir_entry(name, None)
        stored = read_attributes(user_metadata(head.headers), marker=True)
        if stored.mtime_ns is None:  # a marker that stores no time shows its own
            stored = stored.then(Attributes(mtime_ns=_last_modified_ns(head)))
        self.memo.remember(marker, _etag(head), _seconds(_last_modified_ns(head)), stored)
        return self._dir_entry(name, stored)

    async def _head(self, key: str) -> httpx.Response:
        return await self._request("HEAD", self._url_path(key), what=f"HEAD {key}")

    def _head_entry(self, name: str, key: str, response: httpx.Response) -> Entry:
        """The entry a HEAD of object ``key`` shows, its attributes remembered."""
        headers = response.headers
        entry = Entry(name=name, kind=Kind.FILE, size=int(headers.get("content-length", "0")),
                      mtime_ns=_last_modified_ns(response), version=_etag(response),
                      metadata=_storage_class(headers.get("x-amz-storage-class", "STANDARD")))
        stored = read_attributes(user_metadata(headers), marker=False)
        self.memo.remember(key, entry.version, _seconds(entry.mtime_ns), stored)
        return stored.shown_by(entry) if stored else entry

    async def xattrs(self, path: str, entry: Entry) -> Mapping[str, bytes]:
        """ETag, storage class and the user metadata, but for the attributes' headers:
        ``stat`` shows those (and ``cp -a`` would otherwise set each again, a copy apiece)."""
        if entry.is_dir:
            return {}
        response = await self._head(self._key(path))
        headers = response.headers
        attrs = {"s3.etag": headers.get("etag", "").strip('"').encode(),
                 "s3.storage_class": headers.get("x-amz-storage-class", "STANDARD").encode()}
        for name, value in user_metadata(headers).items():
            if name not in ATTRIBUTE_NAMES:
                attrs[f"s3.meta.{name}"] = value.encode()
        return attrs

    # -- reading ----------------------------------------------------------------------------

    def _presign(self, key: str) -> str:
        url = self._base + self._url_path(key)
        if self._signer is None:
            return url
        return self._signer.presign(url, PRESIGN_SECONDS)

    async def open(self, path: str, entry: Entry) -> _ReadHandle:
        key = self._key(path)
        return _ReadHandle(key, entry.version, self._presign(key), time.monotonic())

    async def read(self, handle: _ReadHandle, offset: int, size: int) -> bytes | memoryview:
        if time.monotonic() - handle.signed_at > PRESIGN_SECONDS / 2:
            handle.url, handle.signed_at = self._presign(handle.key), time.monotonic()
        assert self.reader is not None
        headers = {"If-Match": f'"{handle.etag}"'} if handle.etag else None
        return await self.reader.read(handle.url, offset, size, headers)

    # -- writing ----------------------------------------------------------------------------

    def _metadata_headers(self, stored: StoredAttributes, kind: Kind) -> dict[str, str]:
        return {f"x-amz-meta-{name}": value
                for name, value in written_metadata(stored, kind).items()}

    async def put(self, path: str, data: bytes, attributes: Attributes = NO_ATTRIBUTES
                  ) -> Entry:
        """One PUT carrying the set ``attributes`` as metadata.

        The answer proves the object when the request was sent once and its ETag is the MD5
        of the bytes (which the server checked against ``Content-MD5``): the server computed
        it from the body it stored. Then :meth:`confirm` sends no HEAD. After a retry an
        earlier send may have done the work (or the answer may not be the server's own), and
        a server whose ETags are not MD5s proves nothing by them: those get the HEAD."""
        key = self._key(path)
        stored = StoredAttributes().then(attributes)
        digest = await md5_of(data)
        headers = self._metadata_headers(stored, Kind.FILE)
        response = await self._request(
            "PUT", self._url_path(key), what=f"PUT {key}", content=data,
            headers={"Content-MD5": content_md5(digest), **headers})
        etag = self._predicted(digest.hex(), response.headers.get("etag", ""), key)
        self.memo.remember(key, etag, None, stored, _date_s(response))
        self._proven.pop(key, None)
        if sent_once(response) and _etag(response) == digest.hex():
            self._proven[key] = etag
            # What a HEAD of the new object answers: its attribute changes need not ask.
            self._keep(key, {**headers, "content-length": str(len(data)), "etag": f'"{etag}"'})
        return stored.shown_by(Entry(name=path.rpartition("/")[2], kind=Kind.FILE,
                                     size=len(data), mtime_ns=time.time_ns(), version=etag))

    def _predicted(self, predicted: str, answered: str, key: str) -> str:
        """The ETag to confirm an upload by: the one predicted from the bytes, unless the
        server makes ETags its own way (encryption with KMS, some gateways); then its own."""
        answered = answered.strip('"')
        if answered and answered != predicted:
            if not self._etag_scheme_logged:
                self._etag_scheme_logged = True
                log.warning("%s: the server's ETag %s is not the MD5 of the content (%s): "
                            "uploads are confirmed by size and the server's ETag only",
                            key, answered, predicted)
            return answered
        return predicted

    async def confirm(self, path: str, expected: Entry) -> Entry:
        """The server holds the object ``expected`` describes: proved by the answer of the
        PUT that made it (see :meth:`put`), else by one HEAD of the key, with the size and
        ETag of what was sent."""
        key = self._key(path)
        if expected.version and self._proven.pop(key, None) == expected.version:
            self.counters_extra["confirmed_by_put"] += 1
            return expected
        try:
            head = await self._head(key)
        except NotFound:
            raise Unconfirmed(f"{key}: not on the server after the upload") from None
        confirmed = check_confirmed(key, self._head_entry(path.rpartition("/")[2], key, head),
                                    expected)
        self._keep(key, head.headers)
        return confirmed

    async def begin_upload(self, path: str, attributes: Attributes = NO_ATTRIBUTES
                           ) -> MultipartUpload:
        """A multipart upload whose object carries the set ``attributes`` as metadata."""
        key = self._key(path)
        stored = StoredAttributes().then(attributes)
        upload_id = await self._create_multipart(key, self._metadata_headers(stored, Kind.FILE))
        return MultipartUpload(self, key, upload_id, path.rpartition("/")[2], stored)

    async def _create_multipart(self, key: str, headers: Mapping[str, str]) -> str:
        response = await self._request(
            "POST", self._url_path(key) + "?uploads", what=f"create upload {key}",
            headers=dict(headers))
        upload_id = result(response, f"create upload {key}").get("UploadId")
        if not upload_id:
            raise Unavailable(f"create upload {key}: no UploadId in the answer")
        return upload_id

    async def mkdir(self, path: str, attributes: Attributes = NO_ATTRIBUTES) -> Entry:
        """A PUT of the empty marker ``path/``, carrying the set ``attributes``."""
        key = self._key(path) + "/"
        stored = StoredAttributes(kind=Kind.DIR).then(attributes)
        headers = self._metadata_headers(stored, Kind.DIR)
        response = await self._request(
            "PUT", self._url_path(key), what=f"mkdir {key}", content=b"",
            headers={"Content-MD5": content_md5(md5(b"")), **headers})
        self.memo.forget(key)
        self._unlisted[key] = False  # (a new directory: nothing was below its name)
        # What a HEAD of the new marker answers: its attribute changes need not ask.
        self._keep(key, {
            **headers, "content-length": "0",
            "etag": response.headers.get("etag") or f'"{md5(b"").hex()}"'})
        if stored:
            self.memo.remember(key, "", None, stored)
        return stored.shown_by(Entry(name=path.rpartition("/")[2], kind=Kind.DIR,
                                     mtime_ns=time.time_ns()))

    async def unlink(self, path: str) -> None:
        key = self._key(path)
        self._proven.pop(key, None)
        await self._request("DELETE", self._url_path(key), expect=(200, 204),
                            what=f"DELETE {key}")
        self.memo.forget(key)
        self._heads.pop(key, None)

    def holds_unlisted(self, path: str) -> bool | None:
        """Whether the last listing of ``path`` found hidden keys or a marker holding data:
        the directory is not empty, though it lists so, and no removal deletes its
        marker. None when this backend has not listed it (or forgot it)."""
        return self._unlisted.get(self._key(path) + "/")

    remove_batch_max = DELETE_BATCH
    removals_run_ahead = True

    async def remove_many(self, items: Sequence[tuple[str, Kind]]
                          ) -> Mapping[str, RucioFsError]:
        """One DeleteObjects request for all of ``items`` (a directory's marker is deleted
        without looking below it: see :meth:`Backend.remove_many`). Keys XML cannot carry go
        one by one."""
        keys = {self._key(path) + ("/" if kind is Kind.DIR else ""): path
                for path, kind in items}
        failures: dict[str, RucioFsError] = {}
        for key in [key for key in keys if self._unlisted.get(key)]:
            failures[keys.pop(key)] = NotEmpty(f"{key}: it holds keys or data a listing does "
                                               "not show")
        for key in keys:
            self._heads.pop(key, None)
        for key in [key for key in keys if not xml_safe(key)]:
            path = keys.pop(key)
            try:
                await (self.rmdir(path) if key.endswith("/") else self.unlink(path))
            except NotFound:
                pass
            except RucioFsError as exc:
                failures[path] = exc
        if not keys:
            return failures
        if len(keys) == 1:  # a DELETE costs the server half what a DeleteObjects does
            [(key, path)] = keys.items()
            try:
                await self._request("DELETE", self._url_path(key), expect=(200, 204, 404),
                                    what=f"DELETE {key}")
            except RucioFsError as exc:
                failures[path] = exc
            self.memo.forget(key)
            return failures
        body = delete_request(keys)
        response = await self._request(
            "POST", self._bucket_path + "/" + self._query({"delete": ""}),
            what=f"DeleteObjects of {len(keys)} keys", content=body,
            headers={"Content-MD5": content_md5(md5(body)),
                     "Content-Type": "application/xml"})
        for key in keys:
            self.memo.forget(key)
        for key, code, message in delete_errors(response.content):
            if code != "NoSuchKey" and key in keys:
                failures[keys[key]] = (PermissionDenied if code == "AccessDenied"
                                       else Unavailable)(f"DELETE {key}: {code}: {message}")
        return failures

    async def rmdir(self, path: str) -> None:
        """Look first, then delete the marker: a directory with any key below its marker is
        not empty (ENOTEMPTY, even when every key below is one the odd-key rule hides), and a
        marker holding data is never deleted (ENOTEMPTY too: it is an object, not only a
        marker). Nothing is written when the directory stays."""
        marker = self._key(path) + "/"
        contents, prefixes = await self._first_keys(marker, 2)
        if prefixes or any(item.get("Key") != marker for item in contents):
            raise NotEmpty(path)
        for item in contents:
            if item.get("Size", "0") != "0":
                raise NotEmpty(f"{path}: its marker {marker} holds {item.get('Size')} bytes of "
                               "data (remove that object with an S3 client)")
        if contents:
            await self._request("DELETE", self._url_path(marker), expect=(200, 204),
                                what=f"DELETE {marker}")
        self.memo.forget(marker)
        self._heads.pop(marker, None)

    async def rename(self, old: str, new: str, entry: Entry) -> Entry:
        """A HEAD, a copy to the new key with every header and metadata of the object (its
        time stored as ``mtime`` when it had none: a rename is no modification), then a
        DELETE of the old key."""
        return await self.rename_with(old, new, entry, NO_ATTRIBUTES)

    async def rename_with(self, old: str, new: str, entry: Entry, attributes: Attributes
                          ) -> Entry:
        """:meth:`rename`, whose copy also carries the set ``attributes`` (no request of
        their own: `rsync` sets a file's time and mode just before it renames it)."""
        if entry.is_dir:
            raise CrossDevice(f"{old}: S3 cannot rename a directory in place (mv copies it)")
        source, target = self._key(old), self._key(new)
        head = await self._head_for_change(source, entry.version)
        metadata = user_metadata(head.headers)
        _pin_mtime(metadata, head)
        if attributes:
            kind = read_attributes(metadata, marker=False).kind
            metadata.update(written_metadata(StoredAttributes(kind).then(attributes), kind))
        etag, modified_s, size = await self._copy_replacing(source, target, head, metadata)
        await self.unlink(old)
        stored = read_attributes(metadata, marker=False)
        self.memo.remember(target, etag, modified_s, stored)
        return stored.shown_by(Entry(name=new.rpartition("/")[2], kind=Kind.FILE, size=size,
                                     mtime_ns=entry.mtime_ns, version=etag,
                                     metadata=entry.metadata))

    async def _copy_replacing(self, source: str, target: str, head: httpx.Response,
                              metadata: Mapping[str, str]) -> tuple[str, int | None, int]:
        """Copy ``source`` (whose HEAD is ``head``) to ``target`` with ``metadata`` as its
        user metadata and its content headers kept; what a HEAD of the copy answers is kept
        for the next change. Returns the copy's ETag, Last-Modified second and size."""
        size = int(head.headers.get("content-length", "0"))
        replacing = _replacing(head, metadata)
        etag, modified_s = await self._copy(source, target, size, replacing)
        if etag:
            self._keep_head(target, head, replacing, etag)
        else:
            self._heads.pop(target, None)
        return etag, modified_s, size

    async def _copy(self, source: str, target: str, size: int,
                    headers: Mapping[str, str]) -> tuple[str, int | None]:
        """Server-side copy of ``source`` to ``target`` whose metadata and content headers
        are ``headers`` (REPLACE). Returns the new ETag and Last-Modified second (None when
        the answer does not say: a copy in parts)."""
        copy_from = f"/{quote(self.settings.bucket)}/{quote(source, safe='/~')}"
        if size <= COPY_MAX:
            response = await self._request(
                "PUT", self._url_path(target), what=f"copy {source} to {target}",
                headers={"x-amz-copy-source": copy_from, "x-amz-metadata-directive": "REPLACE",
                         **headers})
            fields = result(response, f"copy {source}")
            modified = fields.get("LastModified")
            return (fields.get("ETag", "").strip('"'),
                    _seconds(_iso_ns(modified)) if modified else None)
        upload = MultipartUpload(self, target, await self._create_multipart(target, headers), "")
        try:
            for number, offset in enumerate(range(0, size, COPY_PART), start=1):
                last = min(offset + COPY_PART, size) - 1
                response = await self._request(
                    "PUT", self._url_path(target) + self._query(
                        {"partNumber": str(number), "uploadId": upload.upload_id}),
                    what=f"copy part {number} of {source}",
                    headers={"x-amz-copy-source": copy_from,
                             "x-amz-copy-source-range": f"bytes={offset}-{last}"})
                upload.etags[number] = result(response, "copy part").get("ETag", "")
            return (await upload.commit(size)).version, None
        except BaseException:
            await upload.abort()
            raise

    async def _rewrite(self, name: str, key: str, head: httpx.Response,
                       attributes: Attributes, change: Mapping[str, str | None]) -> Entry:
        """Copy object ``key`` (whose HEAD is ``head``) onto itself with the set
        ``attributes`` and the user metadata ``change`` (None: removed) laid over its
        metadata; everything else it has is kept, its time too (stored as ``mtime`` when it
        had none, unless ``change`` names ``mtime``). Returns its new entry."""
        metadata = user_metadata(head.headers)
        for meta_name, value in change.items():
            if value is None:
                if meta_name not in metadata:
                    raise NoSuchAttribute(f"{key}: no user.s3.meta.{meta_name}")
                del metadata[meta_name]
            else:
                metadata[meta_name] = value
        kind = read_attributes(metadata, marker=False).kind
        metadata.update(written_metadata(StoredAttributes(kind).then(attributes), kind))
        if MTIME not in change:
            _pin_mtime(metadata, head)
        etag, modified_s, size = await self._copy_replacing(key, key, head, metadata)
        stored = read_attributes(metadata, marker=False)
        self.memo.remember(key, etag, modified_s, stored)
        entry = Entry(name=name, kind=Kind.FILE, size=size,
                      mtime_ns=time.time_ns() if modified_s is None else modified_s * 10**9,
                      version=etag or _etag(head),
                      metadata=_storage_class(head.headers.get("x-amz-storage-class",
                                                               "STANDARD")))
        return stored.shown_by(entry) if stored else entry

    async def set_attributes(self, path: str, entry: Entry, attributes: Attributes) -> Entry:
        """A file or symlink: a copy onto itself with the attributes' metadata (above 5 GiB,
        in parts); its content and time stay. A directory with a marker: the same of its
        marker. A directory that is only a prefix, and the mount's root, keep nothing
        (``entry`` as it was: the core keeps them for the mount's life)."""
        if not attributes or path == "/":
            return entry
        if entry.is_dir:
            return await self._set_marker_attributes(path, entry, attributes)
        key = self._key(path)
        return await self._rewrite(entry.name, key, await self._head_for_change(
            key, entry.version), attributes, {})

    async def _set_marker_attributes(self, path: str, entry: Entry,
                                     attributes: Attributes) -> Entry:
        marker = self._key(path) + "/"
        head = self._kept_head(marker)
        if head is not None:
            self.counters_extra["heads_saved"] += 1
        else:
            head = await self._head_if_any(marker)
            if head is None:
                return entry
        metadata = user_metadata(head.headers)
        metadata.update(written_metadata(StoredAttributes(Kind.DIR).then(attributes),
                                         Kind.DIR))
        try:
            etag, modified_s, _ = await self._copy_replacing(marker, marker, head, metadata)
        except NotFound:  # the marker went meanwhile: a prefix keeps nothing
            self.memo.forget(marker)
            return entry
        stored = read_attributes(metadata, marker=True)
        self.memo.remember(marker, etag, modified_s, stored)
        return self._dir_entry(entry.name, stored)

    async def set_xattr(self, path: str, entry: Entry, name: str, value: bytes | None) -> Entry:
        if name in ("s3.etag", "s3.storage_class"):
            raise NotPermitted(f"user.{name} is read-only")
        if not name.startswith("s3.meta.") or entry.is_dir:
            raise NotSupported(f"only files' user.s3.meta.* attributes can be set, not user.{name}")
        meta_name = name[len("s3.meta."):].lower()
        if not meta_name or not all(c.isalnum() or c in "-_." for c in meta_name):
            raise NotSupported(f"user.{name}: S3 metadata names are letters, digits, - _ .")
        if meta_name in ATTRIBUTE_NAMES:
            raise NotPermitted(f"user.{name} is the file's {meta_name}: chmod, chown or touch "
                               "set it")
        text = None
        if value is not None:
            try:
                text = value.decode("ascii")
            except UnicodeDecodeError:
                raise NotSupported(f"user.{name}: S3 metadata values are ASCII") from None
            if any(c in _UNSAFE_META for c in text):
                raise NotSupported(f"user.{name}: S3 metadata values are one line")
        key = self._key(path)
        return await self._rewrite(entry.name, key, await self._head(key), NO_ATTRIBUTES,
                                   {meta_name: text})

    # -- symbolic links -----------------------------------------------------------------------

    async def symlink(self, path: str, target: str) -> Entry:
        """An object whose content is ``target`` and whose mode is s3fs's ``S_IFLNK|0777``
        (with the time); AlreadyExists when a HEAD finds the key."""
        key = self._key(path)
        if await self._head_if_any(key) is not None:
            raise AlreadyExists(path)
        self._heads.pop(key, None)
        data = os.fsencode(target)
        stored = StoredAttributes(Kind.SYMLINK, mtime_ns=time.time_ns(),
                                  mode=stat.S_IMODE(SYMLINK_MODE))
        digest = md5(data)
        response = await self._request(
            "PUT", self._url_path(key), what=f"symlink {key}", content=data,
            headers={"Content-MD5": content_md5(digest),
                     "Content-Type": "application/octet-stream",
                     **self._metadata_headers(stored, Kind.SYMLINK)})
        etag = self._predicted(digest.hex(), response.headers.get("etag", ""), key)
        self.memo.remember(key, etag, None, stored, _date_s(response))
        return stored.shown_by(Entry(name=path.rpartition("/")[2], kind=Kind.SYMLINK,
                                     size=len(data), version=etag))

    async def readlink(self, path: str, entry: Entry) -> str:
        """The object's content (the version ``entry`` names), at most
        :data:`SYMLINK_MAX` bytes: a longer one is no link target (EIO)."""
        key = self._key(path)
        if entry.size > SYMLINK_MAX:
            raise Unavailable(f"{key}: {entry.size} bytes, too long for a link target")
        if entry.size == 0:
            return ""
        headers = {"Range": f"bytes=0-{SYMLINK_MAX}"}
        if entry.version:
            headers["If-Match"] = f'"{entry.version}"'
        response = await self._request("GET", self._url_path(key), expect=(200, 206),
                                       what=f"readlink {key}", headers=headers)
        if len(response.content) > SYMLINK_MAX:
            raise Unavailable(f"{key}: more than {SYMLINK_MAX} bytes, too long for a link "
                              "target")
        return os.fsdecode(response.content)

    def use_data_proxy(self, url: str) -> None:
        """Reads are pre-signed GETs with ``If-Match: "<etag>"``: the shipped proxy keys its
        cache on the object's URL path and that ETag, never the signature (which changes
        with every signing), so a new version of an object is never served from an old
        one's bytes. The proxy does not check signatures on a hit: it is for one identity's
        mounts or public buckets (docs/shared.md)."""
        self._data_proxy = url
        if self.reader is not None:
            self.reader.via = url

    def shared_identity(self) -> str:
        """Endpoint, bucket, prefix and access key ID (an ID, not the secret): what a
        listing shows depends on all four."""
        s = self.settings
        key = getattr(self._credentials, "access_key", None) or "anonymous"
        return f"s3 {s.endpoint_url} bucket={s.bucket} prefix={s.prefix} key={key}"

    def counters(self) -> Mapping[str, int]:
        counters = client_counters(self.api, self.reader) + self.counters_extra
        return counters


