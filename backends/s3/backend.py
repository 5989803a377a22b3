"""``s3://`` — an S3 bucket (or a prefix of it) as a read-write directory tree.

Tree. ``/`` in keys separates directories. A directory is a common prefix of keys or an empty
``dir/`` marker object (``mkdir`` writes one); its time is the mount's start. A file is an
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
Looking up a name no listing has shown sends a HEAD of the key and a 1-key LIST under
``key/`` at once. Reads are ranged GETs on a presigned URL through the core's read path.

Writes (see :mod:`rucio_fs.writeback`): a file up to ``part_size`` is one PUT, a larger one a
multipart upload whose parts are sent while it is written. Every body carries ``Content-MD5``,
which S3 checks. ``unlink`` is DELETE; ``mkdir`` PUTs a marker; ``rmdir`` removes an empty
directory's marker; renaming a file is a server-side copy then DELETE (multipart copy above
5 GiB). Renaming a directory is refused with EXDEV, a documented limit: S3 has no directory
to rename, and ``mv`` then copies and deletes the tree itself. ``chmod``/``chown`` and
arbitrary times cannot be stored (EPERM); setting the time to now (``touch``) copies the
object onto itself. Extended attributes: ``user.s3.etag``, ``user.s3.storage_class``, and
``user.s3.meta.<key>`` for user metadata, which ``setxattr``/``removexattr`` rewrite with a
copy-in-place.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections import Counter
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from email.utils import parsedate_to_datetime
from types import MappingProxyType
from typing import Any, ClassVar
from urllib.parse import quote, urlsplit

import httpx
import trio

from rucio_fs.backend import Backend, Capability, Entry, Kind, check_confirmed
from rucio_fs.errors import (
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
from rucio_fs.http import ApiClient, RangeReader, client_counters, quote_path, tls_context
from rucio_fs.identity import CallerCredentials, caller_source
from rucio_fs.tasks import open_nursery

from .pages import (
    DELETE_BATCH,
    PageFolder,
    delete_errors,
    delete_request,
    describe,
    next_token,
    parse_page,
    result,
    xml_safe,
)
from .settings import CREDENTIAL_ENV, S3Settings, caller_aws_file, parse_url
from .signing import SigV4
from .upload import MultipartUpload, content_md5, md5, md5_of

log = logging.getLogger(__name__)

#: Keys one ``stat`` LIST asks for: the name's own key, and siblings that sort before its
#: ``name/`` prefix.
STAT_KEYS = 100
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


class S3Backend(Backend):
    scheme: ClassVar[str] = "s3"
    description: ClassVar[str] = "S3 buckets (AWS and compatible servers), read-write"
    capabilities: ClassVar[Capability] = (Capability.WRITE | Capability.MKDIR
                                          | Capability.UNLINK | Capability.RENAME
                                          | Capability.SETXATTR)

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
            await self.api.request("GET", self._bucket_path + "/" + query,
                                   what=f"bucket {settings.bucket}")
        except NotFound as exc:
            raise NotFound(f"bucket {settings.bucket} does not exist at "
                           f"{settings.endpoint_url} ({exc})") from None
        except PermissionDenied as exc:
            raise PermissionDenied(f"access to bucket {settings.bucket} denied: {exc}") from None
        # The first read then pays no TCP/TLS handshake and no worker-thread start.
        await self.reader.connect(self._base + "/")

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
        response = await self._api().request(
            "GET", self._bucket_path + "/" + self._query(params), what=f"list {prefix or '/'}")
        return response.content

    async def list(self, path: str) -> AsyncIterator[Entry]:
        """The keys and common prefixes under ``path/``. A listing that names nothing, not
        even the directory's marker, sends one HEAD of the key (below the mount's root
        only): an object there is NotADirectory, no object NotFound, as :meth:`stat` says of
        a prefix without keys. A listing that names anything costs no request more."""
        prefix = self._key(path).rstrip("/") + "/" if path != "/" else self.settings.prefix
        page = PageFolder(prefix, self._file_entry,
                           Entry(name="", kind=Kind.DIR, mtime_ns=self._started_ns))
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
        try:
            size = int(item.get("Size", "0"))
        except ValueError:
            raise Unavailable(f"listing: bad size {item.get('Size')!r} for {name}") from None
        return Entry(name=name, kind=Kind.FILE, size=size,
                     mtime_ns=_iso_ns(item.get("LastModified", "")),
                     version=item.get("ETag", "").strip('"'),
                     metadata=_storage_class(item.get("StorageClass", "")))

    async def stat(self, path: str) -> Entry:
        """One LIST of the keys that start with the name answers both questions: an object
        of that exact key (a file) and the prefix ``name/`` (a directory, which wins). Only
        when more than :data:`STAT_KEYS` siblings sort between the two (``name-1``,
        ``name.bak`` …) is ``name/`` asked separately. (A HEAD and a one-key LIST at once
        cost 2.0 ms of this daemon's time on versitygw, against 0.9 ms for one LIST.)"""
        if path == "/":
            return Entry(name="", kind=Kind.DIR, mtime_ns=self._started_ns)
        key = self._key(path)
        name = path.rpartition("/")[2]
        body = await self._fetch_page(key, None, "/", STAT_KEYS)
        contents, prefixes = parse_page(body, key)
        below = key + "/"
        if below in prefixes:
            return Entry(name=name, kind=Kind.DIR, mtime_ns=self._started_ns)
        seen = [item.get("Key", "") for item in contents] + prefixes
        if next_token(body, key) is not None and max(seen, default="") < below:
            sub_contents, sub_prefixes = await self._first_keys(below, 1)
            if sub_contents or sub_prefixes:
                return Entry(name=name, kind=Kind.DIR, mtime_ns=self._started_ns)
        for item in contents:
            if item.get("Key") == key:
                return self._file_entry(name, item)
        raise NotFound(path)

    async def _head(self, key: str) -> httpx.Response:
        return await self._api().request("HEAD", self._url_path(key), what=f"HEAD {key}")

    def _head_entry(self, name: str, response: httpx.Response) -> Entry:
        headers = response.headers
        return Entry(name=name, kind=Kind.FILE, size=int(headers.get("content-length", "0")),
                     mtime_ns=_http_date_ns(headers.get("last-modified")),
                     version=headers.get("etag", "").strip('"'),
                     metadata={"storage_class": headers.get("x-amz-storage-class",
                                                            "STANDARD")})

    async def xattrs(self, path: str, entry: Entry) -> Mapping[str, bytes]:
        if entry.is_dir:
            return {}
        response = await self._head(self._key(path))
        headers = response.headers
        attrs = {"s3.etag": headers.get("etag", "").strip('"').encode(),
                 "s3.storage_class": headers.get("x-amz-storage-class", "STANDARD").encode()}
        for name, value in headers.items():
            if name.lower().startswith("x-amz-meta-"):
                attrs[f"s3.meta.{name[11:].lower()}"] = value.encode()
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

    async def put(self, path: str, data: bytes) -> Entry:
        key = self._key(path)
        digest = await md5_of(data)
        response = await self._api().request(
            "PUT", self._url_path(key), what=f"PUT {key}", content=data,
            headers={"Content-MD5": content_md5(digest)})
        etag = self._predicted(digest.hex(), response.headers.get("etag", ""), key)
        return Entry(name=path.rpartition("/")[2], kind=Kind.FILE, size=len(data),
                     mtime_ns=time.time_ns(), version=etag)

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
        """One HEAD of the key: there, with the size and ETag of what was sent."""
        key = self._key(path)
        try:
            stored = self._head_entry(path.rpartition("/")[2], await self._head(key))
        except NotFound:
            raise Unconfirmed(f"{key}: not on the server after the upload") from None
        return check_confirmed(key, stored, expected)

    async def begin_upload(self, path: str) -> MultipartUpload:
        key = self._key(path)
        upload_id = await self._create_multipart(key, {})
        return MultipartUpload(self, key, upload_id, path.rpartition("/")[2])

    async def _create_multipart(self, key: str, headers: Mapping[str, str]) -> str:
        response = await self._api().request(
            "POST", self._url_path(key) + "?uploads", what=f"create upload {key}",
            headers=dict(headers))
        upload_id = result(response, f"create upload {key}").get("UploadId")
        if not upload_id:
            raise Unavailable(f"create upload {key}: no UploadId in the answer")
        return upload_id

    async def mkdir(self, path: str) -> Entry:
        key = self._key(path) + "/"
        await self._api().request("PUT", self._url_path(key), what=f"mkdir {key}", content=b"",
                                  headers={"Content-MD5": content_md5(md5(b""))})
        return Entry(name=path.rpartition("/")[2], kind=Kind.DIR, mtime_ns=time.time_ns())

    async def unlink(self, path: str) -> None:
        key = self._key(path)
        await self._api().request("DELETE", self._url_path(key), expect=(200, 204),
                                  what=f"DELETE {key}")

    remove_batch_max = DELETE_BATCH

    async def remove_many(self, items: Sequence[tuple[str, Kind]]
                          ) -> Mapping[str, RucioFsError]:
        """One DeleteObjects request for all of ``items`` (a directory's marker is deleted
        without looking below it: see :meth:`Backend.remove_many`). Keys XML cannot carry go
        one by one."""
        keys = {self._key(path) + ("/" if kind is Kind.DIR else ""): path
                for path, kind in items}
        failures: dict[str, RucioFsError] = {}
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
        body = delete_request(keys)
        response = await self._api().request(
            "POST", self._bucket_path + "/" + self._query({"delete": ""}),
            what=f"DeleteObjects of {len(keys)} keys", content=body,
            headers={"Content-MD5": content_md5(md5(body)),
                     "Content-Type": "application/xml"})
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
            await self._api().request("DELETE", self._url_path(marker), expect=(200, 204),
                                      what=f"DELETE {marker}")

    async def rename(self, old: str, new: str, entry: Entry) -> Entry:
        if entry.is_dir:
            raise CrossDevice(f"{old}: S3 cannot rename a directory in place (mv copies it)")
        source, target = self._key(old), self._key(new)
        etag = await self._copy(source, target, entry.size, None)
        await self.unlink(old)
        return Entry(name=new.rpartition("/")[2], kind=Kind.FILE, size=entry.size,
                     mtime_ns=time.time_ns(), version=etag)

    async def _copy(self, source: str, target: str, size: int,
                    metadata: Mapping[str, str] | None) -> str:
        """Server-side copy of ``source`` to ``target`` (``metadata``: replace the user
        metadata with it; None: keep it). Returns the new ETag."""
        copy_from = f"/{quote(self.settings.bucket)}/{quote(source, safe='/~')}"
        headers = {"x-amz-copy-source": copy_from}
        if metadata is not None:
            headers["x-amz-metadata-directive"] = "REPLACE"
            headers.update({f"x-amz-meta-{k}": v for k, v in metadata.items()})
        if size <= COPY_MAX:
            response = await self._api().request("PUT", self._url_path(target),
                                                 what=f"copy {source} to {target}",
                                                 headers=headers)
            return result(response, f"copy {source}").get("ETag", "").strip('"')
        copy_source = headers.pop("x-amz-copy-source")
        upload = MultipartUpload(self, target, await self._create_multipart(target, {
            k: v for k, v in headers.items() if k.startswith("x-amz-meta-")}), "")
        try:
            for number, offset in enumerate(range(0, size, COPY_PART), start=1):
                last = min(offset + COPY_PART, size) - 1
                response = await self._api().request(
                    "PUT", self._url_path(target) + self._query(
                        {"partNumber": str(number), "uploadId": upload.upload_id}),
                    what=f"copy part {number} of {source}",
                    headers={"x-amz-copy-source": copy_source,
                             "x-amz-copy-source-range": f"bytes={offset}-{last}"})
                upload.etags[number] = result(response, "copy part").get("ETag", "")
            return (await upload.commit(size)).version
        except BaseException:
            await upload.abort()
            raise

    async def _copy_in_place(self, path: str, entry: Entry,
                             change: Mapping[str, str | None]) -> Entry:
        """Copy an object onto itself with its user metadata changed (None: removed)."""
        key = self._key(path)
        head = await self._head(key)
        metadata = {name[11:].lower(): value for name, value in head.headers.items()
                    if name.lower().startswith("x-amz-meta-")}
        for name, value in change.items():
            if value is None:
                if name not in metadata:
                    raise NoSuchAttribute(f"{path}: no user.s3.meta.{name}")
                del metadata[name]
            else:
                metadata[name] = value
        size = int(head.headers.get("content-length", "0"))
        etag = await self._copy(key, key, size, metadata)
        return Entry(name=entry.name, kind=Kind.FILE, size=size, mtime_ns=time.time_ns(),
                     version=etag or entry.version, metadata=entry.metadata)

    async def set_xattr(self, path: str, entry: Entry, name: str, value: bytes | None) -> Entry:
        if name in ("s3.etag", "s3.storage_class"):
            raise NotPermitted(f"user.{name} is read-only")
        if not name.startswith("s3.meta.") or entry.is_dir:
            raise NotSupported(f"only files' user.s3.meta.* attributes can be set, not user.{name}")
        key = name[len("s3.meta."):].lower()
        if not key or not all(c.isalnum() or c in "-_." for c in key):
            raise NotSupported(f"user.{name}: S3 metadata names are letters, digits, - _ .")
        text = None
        if value is not None:
            try:
                text = value.decode("ascii")
            except UnicodeDecodeError:
                raise NotSupported(f"user.{name}: S3 metadata values are ASCII") from None
            if any(c in _UNSAFE_META for c in text):
                raise NotSupported(f"user.{name}: S3 metadata values are one line")
        return await self._copy_in_place(path, entry, {key: text})

    async def set_mtime(self, path: str, entry: Entry, mtime_ns: int, now: bool) -> Entry:
        if not now:
            raise NotPermitted(f"{path}: S3 stores only the time of the upload")
        return await self._copy_in_place(path, entry, {})

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


