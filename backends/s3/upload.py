"""S3 multipart uploads: parts carry ``Content-MD5``, and the ETag of the completed object is
predicted from the parts' digests, so that confirming it proves the content."""

from __future__ import annotations

import base64
import hashlib
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import httpx
import trio

from rucio_fs.backend import Entry, Kind, Upload
from rucio_fs.errors import RucioFsError, Unavailable

from .metadata import AttributeMemo, StoredAttributes
from .pages import result
from .settings import S3Settings

log = logging.getLogger(__name__)

#: Seconds a complete-multipart request may take per part beyond the request timeout (a server
#: assembles the parts while the request waits: versitygw on ext4 took > 30 s for 768 parts).
COMPLETE_SECONDS_PER_PART = 0.25


def md5(data: bytes) -> bytes:
    return hashlib.md5(data).digest()


def content_md5(digest: bytes) -> str:
    """The ``Content-MD5`` header of a body with this MD5 digest."""
    return base64.b64encode(digest).decode()


async def md5_of(body: bytes) -> bytes:
    """The MD5 digest of a body (``Content-MD5`` and the predicted ETag); large ones are
    hashed off the event loop (hashlib lets go of the GIL), so parts are hashed in parallel."""
    if len(body) < 1 << 20:
        return md5(body)
    return await trio.to_thread.run_sync(md5, body)


def multipart_etag(part_digests: list[bytes]) -> str:
    """The ETag S3 gives an object completed from parts with these MD5 digests."""
    return f"{hashlib.md5(b''.join(part_digests)).hexdigest()}-{len(part_digests)}"



class Bucket(Protocol):
    """What an upload needs of the backend that began it (:class:`~.backend.S3Backend`)."""

    settings: S3Settings
    memo: AttributeMemo

    def _url_path(self, key: str) -> str: ...

    def _query(self, params: Mapping[str, str]) -> str: ...

    async def _request(self, method: str, path: str, *, expect: Sequence[int] = (200,),
                       what: str, **kwargs: Any) -> httpx.Response: ...

    def _predicted(self, predicted: str, answered: str, key: str) -> str: ...


class MultipartUpload(Upload):
    """One multipart upload of ``key``, created with the metadata of ``stored`` (the
    attributes the committed entry shows and the backend then remembers)."""

    def __init__(self, backend: Bucket, key: str, upload_id: str, name: str,
                 stored: StoredAttributes | None = None) -> None:
        self.backend = backend
        self.key = key
        self.upload_id = upload_id
        self.name = name
        self.stored = stored or StoredAttributes()
        self.etags: dict[int, str] = {}
        self.digests: dict[int, bytes] = {}

    def _target(self, params: Mapping[str, str]) -> str:
        return self.backend._url_path(self.key) + self.backend._query(params)

    async def write_part(self, number: int, offset: int, data: bytes) -> None:
        digest = await md5_of(data)
        response = await self.backend._request(
            "PUT", self._target({"partNumber": str(number), "uploadId": self.upload_id}),
            what=f"part {number} of {self.key}", content=data,
            headers={"Content-MD5": content_md5(digest)})
        etag = response.headers.get("etag")
        if not etag:
            raise Unavailable(f"part {number} of {self.key}: no ETag in the answer")
        self.etags[number] = etag
        self.digests[number] = digest

    def commit_seconds(self) -> float:
        return COMPLETE_SECONDS_PER_PART * len(self.etags)

    async def commit(self, size: int) -> Entry:
        numbers = sorted(self.etags)
        if numbers != list(range(1, len(numbers) + 1)):
            raise Unavailable(f"upload of {self.key}: parts {numbers} are not contiguous")
        body = "<CompleteMultipartUpload>" + "".join(
            f"<Part><PartNumber>{n}</PartNumber><ETag>{xml_escape(self.etags[n])}</ETag></Part>"
            for n in numbers) + "</CompleteMultipartUpload>"
        timeout = self.backend.settings.timeout + self.commit_seconds()
        response = await self.backend._request(
            "POST", self._target({"uploadId": self.upload_id}), what=f"complete {self.key}",
            content=body.encode(), timeout=timeout)
        answered = result(response, f"complete {self.key}").get("ETag", "")
        if len(self.digests) == len(numbers):
            etag = self.backend._predicted(
                multipart_etag([self.digests[n] for n in numbers]), answered, self.key)
        else:  # parts copied on the server: no digest to predict from
            etag = answered.strip('"')
        self.backend.memo.remember(self.key, etag, None, self.stored)
        return self.stored.shown_by(Entry(name=self.name, kind=Kind.FILE, size=size,
                                          mtime_ns=time.time_ns(), version=etag))

    async def abort(self) -> None:
        try:
            await self.backend._request(
                "DELETE", self._target({"uploadId": self.upload_id}), expect=(200, 204, 404),
                what=f"abort upload of {self.key}")
        except RucioFsError as exc:
            log.warning("abort of the upload of %s failed: %s", self.key, exc)


def xml_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
