"""POSIX attributes kept in S3 user metadata, in the headers s3fs-fuse and rclone share.

Conventions found in those tools (read, not copied):

* s3fs-fuse (``src/s3fs.cpp`` ``s3fs_chmod``, ``s3fs_symlink``, ``create_directory_object``;
  ``src/fdcache_entity.cpp`` ``FdEntity::SetModeHasLock``, ``SetMtimeHasLock``):
  ``x-amz-meta-mode``, ``-uid``, ``-gid`` in decimal, the mode with its file type bits
  (``33188`` for a 0644 file; a symlink is ``S_IFLNK|0777`` = ``41471``; a directory marker's
  mode may have no type bits); ``x-amz-meta-mtime`` (and ``-atime``, ``-ctime``) as seconds,
  with a 9-digit fraction when the nanoseconds are not zero (``src/string_util.cpp``
  ``str(timespec)``). A symlink is an object whose content is its target. It reads the mode
  with ``strtol`` base 0 (a leading ``0`` means octal; ``src/metaheader.cpp`` ``get_mode``)
  and the time's fraction as a count of nanoseconds (``cvt_string_to_time``): ``1.5`` is read
  as 1 s + 5 ns, so only a 9-digit fraction is read right by s3fs.
* rclone (``backend/s3/s3.go``: ``metaMtime``, ``SetModTime``; ncw/swift's
  ``TimeToFloatString``/``FloatStringToTime``): ``x-amz-meta-mtime`` as decimal seconds,
  trailing zeros of the fraction dropped (``1.5``), read back as a decimal number. With
  ``--metadata`` from a local disk (``backend/local/metadata_linux.go``) ``mode`` is octal
  with the type bits and no leading zero (``100644``), ``uid``/``gid`` decimal.
* GeeseFS (``core/handles.go`` ``setMetadata``/``setFileMode``) uses the same names: mode
  decimal with type bits, mtime whole seconds (``ParseUint``: a time with a fraction is
  ignored, Last-Modified shown instead); its symlinks keep the target in
  ``x-amz-meta---symlink-target`` instead (not read here).

What this module writes: the s3fs convention (mode decimal with type bits, uid/gid decimal,
mtime whole seconds or seconds and a 9-digit fraction), which s3fs and rclone read exactly
(GeeseFS: whole seconds only). What it reads: both tools' values. All use the same header
names, so two tools never disagree by header; a value's format decides:

* mtime: decimal seconds with any fraction (up to 9 digits; more are cut), read as a decimal
  number (rclone's ``1.5`` is 1.5 s).
* mode: a leading ``0`` is octal (as s3fs's ``strtol`` reads it). Otherwise decimal (s3fs,
  GeeseFS) when that gives a mode whose type suits the object (a regular file or a symlink
  for an object, a directory for a ``dir/`` marker, or no type at all), else octal (rclone)
  when that does. When both readings suit, decimal wins: it is what s3fs itself shows. No
  rclone mode of a file or a marker reads as a suitable decimal one (its file modes are above
  ``0o177777`` read as decimal, its directory modes give a non-directory type).
* uid, gid: decimal.

A value that fits no rule is ignored (the attribute then has its default).
"""

from __future__ import annotations

import re
import stat
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from cachetools import LRUCache

from rucio_fs.backend import Attributes, Entry, Kind

#: User metadata names (without ``x-amz-meta-``) of the attributes.
MTIME, MODE, UID, GID = "mtime", "mode", "uid", "gid"
ATTRIBUTE_NAMES = frozenset({MTIME, MODE, UID, GID})
#: The mode s3fs gives a symbolic link.
SYMLINK_MODE = stat.S_IFLNK | 0o777
#: Keys whose attributes one backend remembers (see :class:`AttributeMemo`).
MEMO_KEYS = 100_000
#: How far a server's ``Date`` may lag the Last-Modified it gives an object it just wrote,
#: in seconds (versitygw's HTTP server renews its ``Date`` once a second: 1 s behind).
DATE_LAG_S = 2

_SECONDS = re.compile(r"^(-?)(\d+)(?:\.(\d*))?$")
_DIGITS = re.compile(r"^\d+$")
_TYPE_OF_KIND = {Kind.FILE: stat.S_IFREG, Kind.SYMLINK: stat.S_IFLNK, Kind.DIR: stat.S_IFDIR}


@dataclass(frozen=True, slots=True)
class StoredAttributes:
    """What an object's metadata says of it: its kind (a symlink by its mode) and the
    attributes it stores (None: not stored)."""

    kind: Kind = Kind.FILE
    mtime_ns: int | None = None
    mode: int | None = None
    uid: int | None = None
    gid: int | None = None

    def __bool__(self) -> bool:
        """Whether the object stores anything (being a symlink counts)."""
        return (self.kind is Kind.SYMLINK or self.mtime_ns is not None
                or self.mode is not None or self.uid is not None or self.gid is not None)

    def then(self, change: Attributes) -> StoredAttributes:
        """These attributes with ``change``'s set ones laid over them."""
        return StoredAttributes(
            self.kind,
            self.mtime_ns if change.mtime_ns is None else change.mtime_ns,
            self.mode if change.mode is None else change.mode,
            self.uid if change.uid is None else change.uid,
            self.gid if change.gid is None else change.gid)

    def shown_by(self, entry: Entry) -> Entry:
        """``entry`` (made from the listing or the headers) showing these attributes; its own
        time stays where none is stored."""
        return Entry(name=entry.name, kind=self.kind, size=entry.size,
                     mtime_ns=entry.mtime_ns if self.mtime_ns is None else self.mtime_ns,
                     checksums=entry.checksums, immutable=entry.immutable,
                     version=entry.version, metadata=entry.metadata, mode=self.mode,
                     uid=self.uid, gid=self.gid)


def format_mtime(mtime_ns: int) -> str:
    """Seconds, with a 9-digit fraction only when there are nanoseconds (as s3fs writes)."""
    sign = "-" if mtime_ns < 0 else ""
    seconds, nanos = divmod(abs(mtime_ns), 1_000_000_000)
    return f"{sign}{seconds}.{nanos:09d}" if nanos else f"{sign}{seconds}"


def parse_mtime(text: str) -> int | None:
    """Nanoseconds of decimal seconds (``1700000000``, ``1700000000.5``); None if not one."""
    match = _SECONDS.match(text.strip())
    if match is None:
        return None
    sign, seconds, fraction = match.groups()
    nanos = int(seconds) * 1_000_000_000 + int((fraction or "")[:9].ljust(9, "0"))
    return -nanos if sign else nanos


def _suits(mode: int, kind: Kind) -> bool:
    """Whether ``mode`` is one an object of ``kind`` (FILE: any object, DIR: a marker) can
    have: at most 16 bits, with no file type or one that kind may carry."""
    if mode > 0o177777:
        return False
    kind_type = stat.S_IFMT(mode)
    if kind is Kind.DIR:
        return kind_type in (0, stat.S_IFDIR)
    return kind_type in (0, stat.S_IFREG, stat.S_IFLNK)


def _octal(text: str) -> int | None:
    return None if "8" in text or "9" in text else int(text, 8)


def parse_mode(text: str, kind: Kind) -> int | None:
    """The mode (type and permission bits) in a ``mode`` value of an object of ``kind``
    (FILE for any object, DIR for a marker) by the rule of the module docstring; None when
    it fits none."""
    text = text.strip()
    if not _DIGITS.match(text):
        return None
    if len(text) > 1 and text.startswith("0"):
        readings = [_octal(text)]
    else:
        readings = [int(text), _octal(text)]
    return next((mode for mode in readings if mode is not None and _suits(mode, kind)), None)


def parse_id(text: str) -> int | None:
    """A decimal uid or gid; None if the value is not one."""
    text = text.strip()
    return int(text) if _DIGITS.match(text) and len(text) <= 10 else None


def read_attributes(metadata: Mapping[str, str], marker: bool) -> StoredAttributes:
    """The attributes the user metadata ``metadata`` (names without ``x-amz-meta-``, lower
    case) stores for an object, or for a directory's marker (kind DIR)."""
    kind = Kind.DIR if marker else Kind.FILE
    mode = parse_mode(metadata[MODE], kind) if MODE in metadata else None
    if mode is not None and stat.S_ISLNK(mode):
        kind = Kind.SYMLINK
    return StoredAttributes(
        kind=kind,
        mtime_ns=parse_mtime(metadata[MTIME]) if MTIME in metadata else None,
        mode=None if mode is None else stat.S_IMODE(mode),
        uid=parse_id(metadata[UID]) if UID in metadata else None,
        gid=parse_id(metadata[GID]) if GID in metadata else None)


def user_metadata(headers: Mapping[str, str]) -> dict[str, str]:
    """The user metadata in response headers: names without ``x-amz-meta-``, lower case."""
    return {name[11:].lower(): value for name, value in headers.items()
            if name.lower().startswith("x-amz-meta-")}


def written_metadata(stored: StoredAttributes, kind: Kind) -> dict[str, str]:
    """User metadata (names without ``x-amz-meta-``) storing the set ones of ``stored`` for
    an object of ``kind`` (a marker: DIR), in the s3fs convention."""
    metadata = {}
    if stored.mtime_ns is not None:
        metadata[MTIME] = format_mtime(stored.mtime_ns)
    if stored.mode is not None:
        metadata[MODE] = str(_TYPE_OF_KIND[kind] | stat.S_IMODE(stored.mode))
    if stored.uid is not None:
        metadata[UID] = str(stored.uid)
    if stored.gid is not None:
        metadata[GID] = str(stored.gid)
    return metadata


@dataclass(frozen=True, slots=True)
class _Remembered:
    etag: str
    #: Last-Modified in whole seconds; None until a listing or a HEAD shows it (a PUT's
    #: answer does not say).
    modified_s: int | None
    stored: StoredAttributes
    #: While ``modified_s`` is None: the second of the ``Date`` of the answer to the request
    #: that wrote the object (None: unknown). The object was modified by then (give or take
    #: :data:`DATE_LAG_S`), so a listed Last-Modified after that is a later write of the
    #: same bytes.
    written_by_s: int | None = None


class AttributeMemo:
    """Attributes this backend learned for keys (from a HEAD, an upload, a metadata change),
    with the ETag and Last-Modified (whole seconds) of the object they were learned from.

    A listing does not carry user metadata: a listed object whose ETag and Last-Modified
    still match is shown with the remembered attributes; any other is shown as the listing
    says. Bounded (least recently used go first). Used from the listing's worker threads,
    hence the lock.

    What an earlier mount kept (:meth:`restore`) is held as it was read and taken into the
    memo key by key as listings show the keys: a mount starts in milliseconds whatever it
    finds kept (100,000 records read in 0.17 s, against 1 s to take them in at once).
    """

    def __init__(self, size: int = MEMO_KEYS) -> None:
        self._keys: LRUCache[str, _Remembered] = LRUCache(maxsize=size)
        #: An earlier mount's records not taken in yet, by key (see :meth:`restore`).
        self._kept: dict[str, list] = {}
        self._size = size
        self._lock = threading.Lock()
        self.enabled = True

    def remember(self, key: str, etag: str, modified_s: int | None,
                 stored: StoredAttributes, written_by_s: int | None = None) -> None:
        """``key``, as the object with ``etag`` last modified at ``modified_s``, stores
        ``stored`` (nothing stored: forgotten). ``modified_s`` None: not known yet, but
        at the latest ``written_by_s`` when given (the server's answer to the write was
        dated then)."""
        if not self.enabled:
            return
        with self._lock:
            self._kept.pop(key, None)
            if stored and etag:
                self._keys[key] = _Remembered(etag, modified_s, stored,
                                              None if modified_s is not None else written_by_s)
            else:
                self._keys.pop(key, None)

    def forget(self, key: str) -> None:
        with self._lock:
            self._keys.pop(key, None)
            self._kept.pop(key, None)

    def matching(self, key: str, etag: str, modified_s: int) -> StoredAttributes | None:
        """The attributes remembered for ``key`` if it still is the same object (same ETag,
        same Last-Modified second; one not known yet is taken from this sighting)."""
        if not self._keys and not self._kept:
            return None
        with self._lock:
            known = self._keys.get(key)
            if known is None and self._kept:
                known = _taken_in(self._kept.pop(key, None))
                if known is not None:
                    self._keys[key] = known
            if known is None or known.etag != etag:
                return None
            if known.modified_s is None:
                if (known.written_by_s is not None
                        and modified_s > known.written_by_s + DATE_LAG_S):
                    return None  # the same bytes written again since
                self._keys[key] = _Remembered(etag, modified_s, known.stored)
            elif known.modified_s != modified_s:
                return None
            return known.stored

    def known(self, key: str) -> StoredAttributes | None:
        """The attributes remembered for ``key`` whatever the object now is (a directory's
        marker, which a ``/``-delimited listing does not show; markers are never kept)."""
        if not self._keys:
            return None
        with self._lock:
            known = self._keys.get(key)
            return None if known is None else known.stored

    def clear(self) -> None:
        with self._lock:
            self._keys.clear()
            self._kept.clear()

    def records(self) -> list[list]:
        """What a later mount may start from (:meth:`restore`), least recently used first
        (an earlier mount's records this one never used come first), at most the memo's
        size: the objects whose Last-Modified is known or bounded (this mount's uploads
        never listed since), as JSON values. Directory markers
        are left out: a listing of their parent does not show them, and a server that keeps
        a marker's Last-Modified through a change of its metadata (versitygw) would make a
        check of them by their own listing wrong."""
        with self._lock:
            learned = [[key, r.etag, r.modified_s, r.stored.kind.value, r.stored.mtime_ns,
                        r.stored.mode, r.stored.uid, r.stored.gid,
                        *([] if r.modified_s is not None else [r.written_by_s])]
                       for key, r in self._keys.items()
                       if (r.modified_s is not None or r.written_by_s is not None)
                       and not key.endswith("/")]
            return [*self._kept.values(), *learned][-self._size:]

    def restore(self, records: list) -> int:
        """Remember what :meth:`records` gave (an earlier mount's): each is used only for
        an object a listing shows with the same ETag and Last-Modified, and a malformed one
        never. Returns how many there are."""
        with self._lock:
            for record in records:
                if (isinstance(record, list) and record and isinstance(record[0], str)
                        and not record[0].endswith("/")):
                    self._kept[record[0]] = record
            return len(self._kept)


#: Kinds by their value in a kept record.
_KINDS = {kind.value: kind for kind in Kind}


def _taken_in(record: list | None) -> _Remembered | None:
    """A kept record as remembered, or None (no record, or a malformed one)."""
    if record is None:
        return None
    try:
        _key, etag, modified_s, kind, mtime_ns, mode, uid, gid, *written_by = record
        # Known modification second, or (an upload never listed) the second it was done by.
        dated = (type(modified_s) is int and not written_by) or (
            modified_s is None and len(written_by) == 1 and type(written_by[0]) is int)
        if not (isinstance(etag, str) and etag and dated):
            return None
        return _Remembered(etag, modified_s, StoredAttributes(
            _KINDS[kind], _int_or_none(mtime_ns), _int_or_none(mode), _int_or_none(uid),
            _int_or_none(gid)), written_by[0] if written_by else None)
    except (TypeError, ValueError, KeyError):
        return None


def _int_or_none(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise TypeError(f"not an int: {value!r}")
