"""GenQuery for the iRODS backend: query text, paging, and rows folded into entries.

A directory listing is two queries sent at once, one for data objects and one for
subcollections, never ``collections op=list`` plus a stat per name.

* **GenQuery2** returns a whole result set per request, 256 rows unless told otherwise. Each
  query therefore carries ``order by <name> limit page_rows + 1``: a page with more than
  ``page_rows`` rows says there is more, and the next query continues after the last name
  whose rows are all in hand (keyset paging, ``<name> > 'last'``). Paging never re-runs the
  query from the start, and a listing is never cut short.
* **GenQuery1** (servers without GenQuery2) is capped by the HTTP API at
  ``max_number_of_rows_per_catalog_query`` rows per request (15 by default), so its pages are
  fetched with ``offset``/``count``: one, then windows of 2, 4 and 8 pages at once.

A data object has one row per replica (and per access-list entry when permissions are asked
for). Its entry takes the newest good replica (``DATA_REPL_STATUS`` 1), else the newest one,
as the iRODS S3 API does; its mode comes from the best permission held by the mounting user
or one of their groups.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import itertools
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from types import MappingProxyType

import trio

from rucio_fs.backend import Entry, Kind
from rucio_fs.errors import Unavailable

#: ``run(query_text, parser, extra_params) -> rows``
Runner = Callable[[str, str, dict[str, str]], Awaitable[list[list[str]]]]

DATA_COLUMNS = ("DATA_NAME", "DATA_SIZE", "DATA_MODIFY_TIME", "DATA_CHECKSUM",
                "DATA_REPL_NUM", "DATA_REPL_STATUS")
DATA_ACL = ("DATA_ACCESS_PERM_NAME", "DATA_ACCESS_USER_NAME")
COLL_COLUMNS = ("COLL_NAME", "COLL_MODIFY_TIME")
COLL_ACL = ("COLL_ACCESS_PERM_NAME", "COLL_ACCESS_USER_NAME")

#: Permission names (iRODS 4.2 and 4.3 spellings) by level.
_READ = frozenset({"read", "read_object", "read object", "create_metadata", "modify_metadata",
                   "delete_metadata", "create_object", "write", "modify_object",
                   "modify object", "delete_object", "own"})
_WRITE = frozenset({"write", "modify_object", "modify object", "delete_object", "own"})
#: The checksums and metadata of most listed objects, shared.
_EMPTY: Mapping[str, str] = MappingProxyType({})
#: GenQuery1 pages fetched at once.
GQ1_WINDOW = 8


def literal(value: str) -> str:
    """A GenQuery string literal: ``'`` doubled, ``\\`` as the byte escape ``\\x5c``."""
    return "'" + value.replace("\\", "\\x5c").replace("'", "''") + "'"


@dataclass(frozen=True)
class Dialect:
    """How this server is queried: GenQuery ``parser`` (``genquery2`` or ``genquery1``),
    whether rows carry access lists, the GenQuery2 page size and the GenQuery1 row cap."""

    parser: str
    acls: bool
    page_rows: int
    row_cap: int

    def data_columns(self) -> tuple[str, ...]:
        return DATA_COLUMNS + (DATA_ACL if self.acls else ())

    def coll_columns(self) -> tuple[str, ...]:
        return COLL_COLUMNS + (COLL_ACL if self.acls else ())


def data_query(dialect: Dialect, collection: str, name: str | None = None) -> tuple[str, str]:
    """(select list, condition) for the data objects of ``collection`` (or one of them)."""
    where = f"COLL_NAME = {literal(collection)}"
    if name is not None:
        where += f" and DATA_NAME = {literal(name)}"
    return ", ".join(dialect.data_columns()), where


def coll_query(dialect: Dialect, parent: str | None = None,
               path: str | None = None) -> tuple[str, str]:
    """(select list, condition) for the subcollections of ``parent`` (or collection ``path``)."""
    where = (f"COLL_PARENT_NAME = {literal(parent)}" if parent is not None
             else f"COLL_NAME = {literal(path or '/')}")
    return ", ".join(dialect.coll_columns()), where


class Pager:
    """The rows of one query, page by page, in the order of its first column.

    ``next_page()`` returns the next rows, ``None`` when there are no more. Rows of one name
    never straddle pages from the keyset pager; the offset pager may split them, which
    :class:`Folder` handles.
    """

    def __init__(self, run: Runner, dialect: Dialect, select: str, where: str) -> None:
        self.run = run
        self.dialect = dialect
        self.select = select
        self.where = where
        self.key = select.split(",")[0].strip()
        self.done = False
        self._after: str | None = None
        self._offset = 0
        self._window = 1  # GenQuery1 pages at once: 1, 2, 4 ... up to GQ1_WINDOW

    async def next_page(self) -> list[list[str]] | None:
        if self.done:
            return None
        if self.dialect.parser == "genquery2":
            return await self._keyset_page()
        return await self._offset_pages()

    async def _keyset_page(self) -> list[list[str]]:
        where = self.where
        if self._after is not None:
            where += f" and {self.key} > {literal(self._after)}"
        rows = self.dialect.page_rows
        text = f"select {self.select} where {where} order by {self.key} limit {rows + 1}"
        page = await self.run(text, "genquery2", {})
        if len(page) <= rows:
            self.done = True
            return page
        last = page[-1][0]
        complete = [row for row in page if row[0] != last]
        if not complete:
            raise Unavailable(f"{self.where}: more than {rows} rows for {last!r}; "
                              "raise page_rows")
        self._after = complete[-1][0]
        return complete

    async def _offset_pages(self) -> list[list[str]]:
        cap = self.dialect.row_cap
        text = f"select {self.select} where {self.where}"
        start = self._offset
        window = self._window
        self._window = min(window * 2, GQ1_WINDOW)
        pages: list[list[list[str]]] = [[] for _ in range(window)]

        async def fetch(index: int) -> None:
            pages[index] = await self.run(text, "genquery1", {
                "offset": str(start + index * cap), "count": str(cap)})

        async with trio.open_nursery() as nursery:
            for index in range(window):
                nursery.start_soon(fetch, index)
        rows: list[list[str]] = []
        for page in pages:
            rows.extend(page)
            if len(page) > cap:
                raise Unavailable(f"{self.where}: the server sent {len(page)} rows "
                                  f"for a page of {cap}")
            if len(page) < cap:
                self.done = True
                break
        self._offset = start + len(rows)
        return rows


def _int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise Unavailable(f"query answer: {what} {text!r} is not a number") from None


class Folder:
    """Turns rows of :func:`data_query` or :func:`coll_query` into entries.

    The rows of the last name of a page are held back until the next page (or the end),
    since the offset pager may split one name's rows across pages.
    """

    def __init__(self, kind: Kind, principals: frozenset[str] | None) -> None:
        self.kind = kind
        self.principals = principals
        self._held: list[list[str]] = []
        self._modes: dict[tuple, int] = {}

    def fold(self, rows: Sequence[list[str]], last: bool) -> list[Entry]:
        groups = [list(group) for _, group in
                  itertools.groupby(itertools.chain(self._held, rows), key=itemgetter(0))]
        self._held = [] if last or not groups else groups.pop()
        build = self._file if self.kind is Kind.FILE else self._dir
        return [build(group) for group in groups]

    def _mode(self, rows: list[list[str]], first_acl: int, directory: bool) -> int | None:
        if self.principals is None or len(rows[0]) <= first_acl:
            return None
        if len(rows) == 1:
            key: tuple = (directory, rows[0][first_acl], rows[0][first_acl + 1])
        else:
            key = (directory, *((row[first_acl], row[first_acl + 1]) for row in rows))
        mode = self._modes.get(key)
        if mode is None:
            perms = {row[first_acl].lower() for row in rows
                     if row[first_acl + 1] in self.principals}
            mode = (0o555 if directory else 0o444) if perms & _READ else 0
            if perms & _WRITE:
                mode |= 0o200
            self._modes[key] = mode
        return mode

    def _file(self, rows: list[list[str]]) -> Entry:
        if len(rows) == 1:
            best = rows[0]
        else:
            good = [row for row in rows if row[5] == "1"] or rows
            best = max(good, key=lambda row: (_int(row[2], "DATA_MODIFY_TIME"),
                                              _int(row[4], "DATA_REPL_NUM")))
        try:
            size, seconds = int(best[1]), int(best[2])
        except ValueError:
            raise Unavailable(f"query answer: bad size or time in {best[:3]}") from None
        checksum = best[3]
        return Entry(best[0], Kind.FILE, size, seconds * 1_000_000_000,
                     checksums_of(checksum) if checksum else _EMPTY, False,
                     version_of(seconds, size, checksum), _EMPTY,
                     self._mode(rows, len(DATA_COLUMNS), directory=False))

    def _dir(self, rows: list[list[str]]) -> Entry:
        row = rows[0]
        return Entry(name=row[0].rpartition("/")[2], kind=Kind.DIR,
                     mtime_ns=_int(row[1], "COLL_MODIFY_TIME") * 1_000_000_000,
                     mode=self._mode(rows, len(COLL_COLUMNS), directory=True))


_HEX_MD5 = re.compile(r"^[0-9a-fA-F]{32}$")
_DIGESTS = {"sha2": "sha256", "sha512": "sha512", "sha1": "sha1", "md5": "md5"}


def checksums_of(raw: str) -> Mapping[str, str]:
    """An iRODS checksum (``sha2:<base64>``, ``sha512:``/``sha1:``/``md5:<base64>``, or a bare
    md5 in hex) as the core's checksums: the raw text under ``irods`` (shown as an xattr), and
    the hex digest under its algorithm, so the core verifies whole-file reads with it."""
    if not raw:
        return {}
    result = {"irods": raw}
    if _HEX_MD5.match(raw):
        result["md5"] = raw.lower()
        return result
    prefix, _, encoded = raw.partition(":")
    algorithm = _DIGESTS.get(prefix)
    if algorithm and encoded:
        with contextlib.suppress(binascii.Error, ValueError):  # else shown, not verified
            result[algorithm] = base64.b64decode(encoded, validate=True).hex()
    return result


def version_of(seconds: int, size: int, checksum: str) -> str:
    """What identifies a data object's content: iRODS keeps no etag, so its modification
    second, size and checksum (a rewrite within the same second to the same size is not
    seen until the next listing shows another checksum; NFSRODS has the same limit)."""
    return f"{seconds}:{size}:{checksum}"
