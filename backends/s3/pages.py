"""S3's XML answers: ListObjectsV2 pages folded into entries, error bodies described.

Pages are read with regular expressions over the bytes, never trusted to be complete: a page
that does not end its document, or says it is truncated without a token, is an error.
"""

from __future__ import annotations

import html
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any
from urllib.parse import unquote
from xml.sax.saxutils import escape

import httpx

from rucio_fs.backend import Entry, usable_name
from rucio_fs.errors import NoSpace, QuotaExceeded, RucioFsError, Unavailable
from rucio_fs.http import status_error


def _local(tag: str) -> str:
    return tag.rpartition("}")[2]


def _children(element: ET.Element) -> dict[str, str]:
    return {_local(child.tag): child.text or "" for child in element}


def describe(response: httpx.Response) -> str:
    """``Code: Message`` of an S3 error body."""
    try:
        return describe_fields(_children(ET.fromstring(response.content)))
    except ET.ParseError:
        return ""


def describe_fields(fields: Mapping[str, str]) -> str:
    code, message = fields.get("Code", ""), fields.get("Message", "")
    return f"{code}: {message}".strip(": ")


#: Error codes of a spent quota: MinIO's bucket quota, Ceph RGW's user and bucket quotas
#: (RGW answers 403, which alone would read as a refused permission).
QUOTA_CODES = frozenset({"XMinioAdminBucketQuotaExceeded", "QuotaExceeded"})
#: Error codes of a server out of room (MinIO answers 507 Insufficient Storage).
NO_SPACE_CODES = frozenset({"XMinioStorageFull"})
#: Statuses whose error code can tell more than the status: the caller reads the body.
EXAMINED_STATUSES = frozenset({400, 403, 507})


def s3_error(response: httpx.Response, what: str) -> RucioFsError:
    """The typed error of an S3 error answer: a spent quota QuotaExceeded (EDQUOT), a full
    server NoSpace (ENOSPC), anything else as its HTTP status says (403 PermissionDenied)."""
    try:
        fields = _children(ET.fromstring(response.content)) if response.content else {}
    except ET.ParseError:
        fields = {}
    detail = describe_fields(fields)
    coded = _coded_error(fields.get("Code", ""), f"{what}: {detail}")
    if coded is not None:
        return coded
    if response.status_code == 507:
        return NoSpace(f"{what}: {detail or 'HTTP 507'}")
    return status_error(response.status_code, what, detail)


def _coded_error(code: str, message: str) -> RucioFsError | None:
    """The error an S3 error code means beyond its status, if it means one."""
    if code in QUOTA_CODES:
        return QuotaExceeded(message)
    if code in NO_SPACE_CODES:
        return NoSpace(message)
    return None


_TRUNCATED = re.compile(rb"<IsTruncated>\s*true\s*</IsTruncated>", re.IGNORECASE)
_TOKEN = re.compile(rb"<NextContinuationToken>([^<]*)</NextContinuationToken>")


def next_token(body: bytes, prefix: str) -> str | None:
    """The continuation token of a listing page, found without parsing the page."""
    if not _TRUNCATED.search(body):
        return None
    match = _TOKEN.search(body)
    if not match or not match.group(1):
        raise Unavailable(f"list {prefix}: truncated answer without a continuation token")
    return _text(match.group(1))


_FIELD = re.compile(rb"<(Key|LastModified|ETag|Size|StorageClass)>([^<]*)</")
_COMMON_PREFIX = re.compile(rb"<CommonPrefixes>\s*<Prefix>([^<]*)</Prefix>")
_ENCODING_URL = re.compile(rb"<EncodingType>\s*url\s*</EncodingType>", re.IGNORECASE)


def _text(raw: bytes) -> str:
    text = raw.decode()
    return html.unescape(text) if "&" in text else text


def parse_page(body: bytes, prefix: str) -> tuple[list[dict[str, str]], list[str]]:
    """Objects (their fields) and common prefixes of a ListObjectsV2 page.

    Regular expressions over the bytes instead of an XML tree: 3x faster on 1,000-key pages
    (2.9 vs 8.2 ms), and listing is what ``ls -l`` waits for. Element text is XML-escaped, so
    the markup cannot occur inside a key.
    """
    if b"<ListBucketResult" not in body[:512]:
        try:
            root = ET.fromstring(body)
        except ET.ParseError as exc:
            raise Unavailable(f"list {prefix}: malformed answer ({exc})") from None
        raise Unavailable(f"list {prefix}: {describe_fields(_children(root)) or root.tag}")
    if not body.rstrip().endswith(b"</ListBucketResult>"):
        raise Unavailable(f"list {prefix}: truncated answer")
    contents = []
    for chunk in body.split(b"<Contents>")[1:]:
        end = chunk.find(b"</Contents>")
        contents.append({k.decode(): _text(v) for k, v in _FIELD.findall(chunk, 0, end)})
    prefixes = [_text(p) for p in _COMMON_PREFIX.findall(body)]
    if _ENCODING_URL.search(body):
        for item in contents:
            item["Key"] = unquote(item.get("Key", ""))
        prefixes = [unquote(p) for p in prefixes]
    return contents, prefixes


#: The most keys one DeleteObjects request may name (S3's limit).
DELETE_BATCH = 1000
_XML_UNSAFE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def xml_safe(key: str) -> bool:
    """Whether XML 1.0 can carry ``key`` (a DeleteObjects request names keys in XML)."""
    return _XML_UNSAFE.search(key) is None


def delete_request(keys: Iterable[str]) -> bytes:
    """A quiet DeleteObjects body: the answer names only the keys that failed."""
    objects = "".join(f"<Object><Key>{escape(key)}</Key></Object>" for key in keys)
    return ('<?xml version="1.0" encoding="UTF-8"?><Delete '
            'xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Quiet>true</Quiet>'
            f"{objects}</Delete>").encode()


def delete_errors(body: bytes) -> list[tuple[str, str, str]]:
    """(key, code, message) of each failure a DeleteObjects answer names; an answer that is
    not a whole DeleteResult is an error (never taken as "all deleted")."""
    try:
        root = ET.fromstring(body)
    except ET.ParseError as exc:
        raise Unavailable(f"DeleteObjects: malformed answer ({exc})") from None
    if _local(root.tag) != "DeleteResult":
        fields = _children(root)
        raise Unavailable(f"DeleteObjects: {describe_fields(fields) or _local(root.tag)}")
    return [(f.get("Key", ""), f.get("Code", ""), f.get("Message", ""))
            for f in (_children(e) for e in root if _local(e.tag) == "Error")]


def result(response: httpx.Response, what: str) -> dict[str, str]:
    """The fields of an XML answer; S3 may answer 200 with an ``<Error>`` body (raised as
    :func:`s3_error` would)."""
    try:
        root = ET.fromstring(response.content) if response.content else None
    except ET.ParseError:
        raise Unavailable(f"{what}: malformed answer") from None
    if root is None:
        return {}
    fields = _children(root)
    if _local(root.tag) == "Error":
        message = f"{what}: {fields.get('Code', '')}: {fields.get('Message', '')}"
        raise _coded_error(fields.get("Code", ""), message) or Unavailable(message)
    return fields


class PageFolder:
    """Turns the pages of one ``/``-delimited listing into entries, applying the rule for keys
    that cannot be POSIX names (``hidden``).

    A file ``k`` is held back until the listing has passed ``k/``: keys arrive in order, and a
    common prefix ``k/`` that comes later (after keys like ``k-1``) must win over the file.
    """

    def __init__(self, prefix: str, file_entry: Any, directory: Entry,
                 dir_entry: Callable[[str, str], Entry] | None = None) -> None:
        """``file_entry(name, fields)`` makes a file's entry; a directory's is ``directory``
        renamed, or ``dir_entry(name, prefix)`` when given (``prefix``: its key, ``/``
        ended). Both may be called in a worker thread."""
        self.prefix = prefix
        self.file_entry = file_entry
        self.directory = directory
        self.dir_entry = dir_entry
        self.hidden: list[str] = []
        self.held: dict[str, Entry] = {}
        self.dirs: set[str] = set()
        #: Whether a page named any key or common prefix (the directory's own marker and
        #: hidden keys count: the prefix then exists).
        self.named_any = False
        #: Whether the directory's own marker holds data (an object, not only a marker).
        self.marker_holds_data = False

    def fold(self, body: bytes, last: bool) -> list[Entry]:
        """The entries that can be given out after this page (all of them after the last)."""
        contents, prefixes = parse_page(body, self.prefix)
        self.named_any = self.named_any or bool(contents or prefixes)
        prefix, cut = self.prefix, len(self.prefix)
        ready: list[Entry] = []
        for item in contents:
            key = item.get("Key", "")
            name = key[cut:]
            if not name:  # the directory's own marker
                self.marker_holds_data = item.get("Size", "0") != "0"
                continue
            if not usable_name(name) or name in self.dirs or name in self.held:
                self.hidden.append(key)
                continue
            self.held[name] = self.file_entry(name, item)
        for common in prefixes:
            name = common[cut:].removesuffix("/")
            if not usable_name(name) or name in self.dirs:
                self.hidden.append(common)
                continue
            if self.held.pop(name, None) is not None:
                self.hidden.append(prefix + name)  # the object that the directory hides
            self.dirs.add(name)
            ready.append(replace(self.directory, name=name) if self.dir_entry is None
                         else self.dir_entry(name, common))
        if last:
            ready.extend(self.held.values())
            self.held.clear()
            return ready
        # Whatever sorts before the page's last name + "/" can no longer be shadowed.
        ends = [c["Key"][cut:] for c in contents[-1:]] + [p[cut:] for p in prefixes[-1:]]
        horizon = max(ends, default="")
        for name in [n for n in self.held if n + "/" < horizon]:
            ready.append(self.held.pop(name))
        return ready
