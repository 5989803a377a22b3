"""A fake iRODS HTTP API (0.7.0) for the tests: the subset rucio-fs uses, with its quirks.

No iRODS server can be installed on the machines this project is built on, so this server
implements the documented behaviour (``../shared/notes/irods-and-rucio-clients.md`` §1), and
where the documentation is silent, what the API's handlers and iRODS's own APIs do
(``irods_client_http_api`` ``endpoints/*/src/main.cpp``, ``irods`` ``plugins/api/src/
touch.cpp``, ``rodsErrorTable.h``):

* ``POST /authenticate`` (Basic) gives a bearer token that lives ``token_lifetime`` seconds
  whether used or not; an expired or unknown token gets **401**.
* ``GET /info`` (no auth) with the server's limits.
* Collections: ``list`` (absolute paths, no attributes), ``stat``, ``create``, ``remove``,
  ``rename``, ``touch``, ``modify_metadata``. Data objects: ``stat``, ``read`` (chunked
  transfer encoding above 1 MiB), method-2 ``write`` (options in ``irods-api-request-*``
  headers; ``truncate`` defaults to **1**), ``parallel_write_init``/``shutdown`` (at most 3
  streams per handle and 15 in all, else **503**; a stream used by two requests at once gets
  **429**), ``touch``, ``remove`` (to the trash unless ``no-trash``), ``rename``,
  ``truncate`` (``size`` required), ``modify_metadata`` (atomic), ``calculate_checksum``.
* ``touch``: ``seconds-since-epoch`` (a C ``int``: from 0 to 2038; not a number or out of
  range: a bare **400**, negative: INPUT_ARG_NOT_WELL_FORMED_ERR) or ``reference`` (not
  both); collections are never created, and a missing path with ``no-create`` (always, for
  collections) is **success with nothing done**. A data object's touch changes one replica:
  ``replica-number``'s, ``leaf-resource``'s, else the newest good one's, and needs
  ``modify_metadata``; a collection's needs ``modify_object``. The wrong kind of path gets
  **400** with NOT_A_COLLECTION / NOT_A_DATA_OBJECT.
* ``GET /query``: GenQuery2 (``select … where … [order by …] [limit n] [offset n]``, whole
  result at once, 256 rows when no limit) and GenQuery1 (rows capped at 15 per request,
  paged with ``offset``/``count``); only objects the user holds a permission on are seen.
  With GenQuery2 off (iRODS before 4.3.2), a GenQuery2 query gets **400** with
  SYS_UNMATCHED_API_NUM.
* Failures of namespace operations come as **HTTP 200 with a negative status code**, as the
  real handlers do; a read of a missing object is 404; ``list`` of a data object is 400.
  Permission levels are ordered as the catalog orders them (``read_object`` is below
  ``modify_metadata``, which is below ``modify_object``).

Test controls live under ``/_fake/`` (no auth): ``seed`` (files, with ``stale`` extra
replicas: ``size``, ``mtime``, optional ``status`` and ``number``), ``stats`` (request counts,
armed faults), ``config`` (latency, token lifetime, expire all tokens, GenQuery2 on/off,
``fail``: answer the next requests of an endpoint and op with an iRODS error code, see
:meth:`State.arm`), ``object`` (the stored bytes, time and replicas).

Run: ``python -m rucio_fs.testing.irods_fake --port N [--zone Z]``; it prints ``ready`` when
listening. :func:`start` does that on a free port.

Why one module of this size: the fake is one server, started with ``python -m``.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import re
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from email import policy as email_policy
from email.parser import BytesParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

API = "/irods-http-api/0.7.0"
USER, PASSWORD = "alice", "alice-pass"
OTHER, OTHER_PASSWORD = "bob", "bob-pass"
MAX_READ = 1 << 20
MAX_BODY = 8 << 20
STREAMS_PER_HANDLE = 3
STREAMS_TOTAL = 15
ROW_CAP = 15
GQ2_DEFAULT_ROWS = 256
#: Permission levels as the catalog orders them (R_TOKN_MAIN ``access_type``); ``read`` and
#: ``write`` are the iRODS 4.2 names of ``read_object`` and ``modify_object``.
LEVELS = {"read_metadata": 1040, "read_object": 1050, "read": 1050, "create_metadata": 1070,
          "modify_metadata": 1080, "delete_metadata": 1090, "create_object": 1110,
          "modify_object": 1120, "write": 1120, "delete_object": 1130, "own": 1200}
#: The resource holding replica 0 of every data object (an extra replica's resource is not
#: modelled: naming it finds no replica).
DEFAULT_RESOURCE = "demoResc"
#: The range of C++ ``int``, which the API's ``std::stoi`` parses into.
INT_MIN, INT_MAX = -2**31, 2**31 - 1

# rodsErrorTable.h
SYS_UNMATCHED_API_NUM = -12000
SYS_RESC_DOES_NOT_EXIST = -78000
SYS_INVALID_INPUT_PARAM = -130000
SYS_REPLICA_DOES_NOT_EXIST = -164000
SYS_NO_GOOD_REPLICA = -166000
NOT_A_COLLECTION = -170000
NOT_A_DATA_OBJECT = -171000
OBJ_PATH_DOES_NOT_EXIST = -358000
USER_INCOMPATIBLE_PARAMS = -402000
CAT_NO_ROWS_FOUND = -808000
CAT_UNKNOWN_COLLECTION = -814000
CAT_NO_ACCESS_PERMISSION = -818000
CAT_COLLECTION_NOT_EMPTY = -821000
CAT_NAME_EXISTS_AS_COLLECTION = -833000
CAT_NAME_EXISTS_AS_DATAOBJ = -834000
INPUT_ARG_NOT_WELL_FORMED_ERR = -1084000
INVALID_OBJECT_TYPE = -1105000


class Failure(Exception):
    """A failed request: answered with HTTP ``http`` and ``irods_response`` holding ``code``,
    ``message`` (when not empty) and ``extra``."""

    def __init__(self, code: int, message: str, http: int = 200, **extra: Any) -> None:
        super().__init__(message)
        self.code, self.message, self.http, self.extra = code, message, http, extra


class BadRequest(Failure):
    """The API's bare refusal of a request it cannot parse (a parameter missing, a number
    that is none): HTTP 400 with an empty body."""

    def __init__(self, message: str) -> None:
        super().__init__(0, message, http=400)


def stoi(text: str) -> int:
    """What C++ ``std::stoi`` makes of ``text`` (blanks, a sign and digits; anything after
    them ignored); BadRequest where it throws (no digits, a number outside ``int``), as the
    API answers then."""
    match = re.match(r"\s*([+-]?\d+)", text)
    if match is None or not INT_MIN <= int(match.group(1)) <= INT_MAX:
        raise BadRequest(f"{text!r} is not an int")
    return int(match.group(1))


@dataclass
class Replica:
    number: int
    size: int
    mtime: int
    status: str = "1"


@dataclass
class Obj:
    data: bytearray
    mtime: int
    acl: dict[str, str]
    avus: list[tuple[str, str, str]] = field(default_factory=list)
    checksum: str = ""
    stale: list[Replica] = field(default_factory=list)  # extra replicas, shown by queries
    status: str = "1"
    ident: int = 0

    def replicas(self) -> list[Replica]:
        """Replica 0 (this object's own bytes, on :data:`DEFAULT_RESOURCE`) and the extra
        ones, in the catalog's order; a change to them does not change the object."""
        return [Replica(0, len(self.data), self.mtime, self.status), *self.stale]

    def set_replica_mtime(self, number: int, mtime: int) -> None:
        """Set the modification time of replica ``number`` (which exists)."""
        if number == 0:
            self.mtime = mtime
        else:
            next(r for r in self.stale if r.number == number).mtime = mtime


@dataclass
class Coll:
    mtime: int
    acl: dict[str, str]
    avus: list[tuple[str, str, str]] = field(default_factory=list)
    ident: int = 0


@dataclass
class Handle:
    lpath: str
    streams: int
    buffer: bytearray
    busy: set[int] = field(default_factory=set)


def now() -> int:
    return int(time.time())


def parent_of(path: str) -> str:
    return path.rpartition("/")[0] or "/"


class State:
    def __init__(self, zone: str) -> None:
        self.zone = zone
        self.lock = threading.RLock()
        self.passwords = {USER: PASSWORD, OTHER: OTHER_PASSWORD, "rods": "rods"}
        self.groups = {"readers": {USER, OTHER}, "public": {USER, OTHER, "rods"}}
        self.tokens: dict[str, tuple[str, float]] = {}
        self.token_lifetime = 3600.0
        self.latency = 0.0
        self.gq2 = True
        self.streams_total = STREAMS_TOTAL
        self.colls: dict[str, Coll] = {}
        self.objs: dict[str, Obj] = {}
        self.handles: dict[str, Handle] = {}
        self.counts: Counter[str] = Counter()
        #: Armed failures (see :meth:`arm`), in the order they were armed.
        self.faults: list[dict[str, Any]] = []
        self.next_id = 10000
        for path in ("/", f"/{zone}", f"/{zone}/home", f"/{zone}/trash",
                     f"/{zone}/trash/home", f"/{zone}/home/public"):
            self.colls[path] = self.new_coll({"rods": "own", "public": "read_object"})
        for user in (USER, OTHER, "rods"):
            self.colls[f"/{zone}/home/{user}"] = self.new_coll({user: "own"})
            self.colls[f"/{zone}/trash/home/{user}"] = self.new_coll({user: "own"})

    def new_coll(self, acl: dict[str, str]) -> Coll:
        self.next_id += 1
        return Coll(now(), dict(acl), ident=self.next_id)

    def new_obj(self, data: bytes, acl: dict[str, str]) -> Obj:
        self.next_id += 1
        return Obj(bytearray(data), now(), dict(acl), ident=self.next_id)

    # -- access ---------------------------------------------------------------------------

    def principals(self, user: str) -> set[str]:
        return {user} | {g for g, members in self.groups.items() if user in members}

    def level(self, user: str, acl: dict[str, str]) -> int:
        if user == "rods":
            return LEVELS["own"]
        names = self.principals(user)
        return max((LEVELS.get(p, 0) for u, p in acl.items() if u in names), default=0)

    def need(self, user: str, acl: dict[str, str], level: str, path: str) -> None:
        if self.level(user, acl) < LEVELS[level]:
            raise Failure(CAT_NO_ACCESS_PERMISSION, f"no {level} permission on {path}")

    def coll(self, path: str) -> Coll:
        found = self.colls.get(path)
        if found is None:
            raise Failure(CAT_UNKNOWN_COLLECTION, f"no collection {path}")
        return found

    def obj(self, path: str, http: int = 200) -> Obj:
        found = self.objs.get(path)
        if found is None:
            raise Failure(OBJ_PATH_DOES_NOT_EXIST, f"no data object {path}", http=http)
        return found

    def free(self, path: str) -> None:
        if path in self.colls:
            raise Failure(CAT_NAME_EXISTS_AS_COLLECTION, f"{path} exists as a collection")
        if path in self.objs:
            raise Failure(CAT_NAME_EXISTS_AS_DATAOBJ, f"{path} exists as a data object")

    def creatable(self, user: str, path: str) -> Coll:
        parent = self.coll(parent_of(path))
        self.need(user, parent.acl, "modify_object", parent_of(path))
        self.free(path)
        return parent

    # -- touch (the server's API; the HTTP API checks the kind of the path first) ---------

    def touch(self, user: str, lpath: str, options: dict[str, Any]) -> None:
        """Set the modification time of ``lpath`` as the iRODS ``touch`` API does with
        ``options`` (``no_create``, ``replica_number``, ``leaf_resource_name``,
        ``seconds_since_epoch``, ``reference``): a missing path with ``no_create`` is no
        error and no change; otherwise a missing path becomes an empty data object. A
        collection needs ``modify_object``, a data object ``modify_metadata`` (the catalog's
        check of a metadata update), and only one replica changes: the one named, else the
        newest good one."""
        if not lpath:
            raise Failure(INPUT_ARG_NOT_WELL_FORMED_ERR, "[logical_path] cannot be empty.")
        check_touch_options(options)
        if lpath not in self.colls and lpath not in self.objs:
            if options.get("no_create"):
                return
            self._touch_create(user, lpath, options)
        mtime = self._touch_time(user, options)
        if lpath in self.colls:
            if "replica_number" in options or "leaf_resource_name" in options:
                raise Failure(USER_INCOMPATIBLE_PARAMS, "[replica_number] and "
                              "[leaf_resource_name] cannot be used for collections.")
            coll = self.colls[lpath]
            self.need(user, coll.acl, "modify_object", lpath)
            coll.mtime = mtime
            return
        obj = self.objs[lpath]
        self.need(user, obj.acl, "modify_metadata", lpath)
        obj.set_replica_mtime(touched_replica(obj, options), mtime)

    def _touch_create(self, user: str, lpath: str, options: dict[str, Any]) -> None:
        if "replica_number" in options:
            raise Failure(OBJ_PATH_DOES_NOT_EXIST,
                          "Replica numbers cannot be used when creating new data objects.")
        resource = options.get("leaf_resource_name", DEFAULT_RESOURCE)
        if resource != DEFAULT_RESOURCE:
            raise Failure(SYS_RESC_DOES_NOT_EXIST, f"no resource {resource}")
        self.creatable(user, lpath)
        self.objs[lpath] = self.new_obj(b"", {user: "own"})

    def _touch_time(self, user: str, options: dict[str, Any]) -> int:
        """The time ``touch`` sets: the reference's, the given one, or now."""
        if "reference" in options:
            return self.last_write_time(user, options["reference"])
        if "seconds_since_epoch" in options:
            return int(options["seconds_since_epoch"])
        return now()

    def last_write_time(self, user: str, lpath: str) -> int:
        """The modification time of what ``user`` sees at ``lpath``: a collection's, a data
        object's newest good replica's (INVALID_OBJECT_TYPE for nothing seen there)."""
        coll, obj = self.colls.get(lpath), self.objs.get(lpath)
        if coll is not None and self.level(user, coll.acl) >= 1:
            return coll.mtime
        if obj is not None and self.level(user, obj.acl) >= 1:
            times = [r.mtime for r in obj.replicas() if r.status == "1"]
            if not times:
                raise Failure(CAT_NO_ROWS_FOUND, f"no good replica of {lpath}")
            return max(times)
        raise Failure(INVALID_OBJECT_TYPE, f"cannot get mtime: {lpath}")

    # -- failures on demand -----------------------------------------------------------------

    def arm(self, faults: list[dict[str, Any]] | dict[str, Any] | None) -> None:
        """Answer the next requests of an ``endpoint`` (``/data-objects``) and ``op``
        (``write``) with iRODS error ``code`` instead of doing them, as a server does that
        refuses them: HTTP ``http`` (default 200) with the code and ``message``, ``times``
        times (default 1; -1: until disarmed). None or []: disarm all."""
        if not faults:
            self.faults.clear()
            return
        for fault in faults if isinstance(faults, list) else [faults]:
            if not str(fault.get("endpoint", "")).startswith("/") or not fault.get("op"):
                raise ValueError(f"a fault needs an endpoint and an op: {fault}")
            self.faults.append({"endpoint": fault["endpoint"], "op": fault["op"],
                                "code": int(fault["code"]), "http": int(fault.get("http", 200)),
                                "message": str(fault.get("message", "injected failure")),
                                "times": int(fault.get("times", 1))})

    def take_fault(self, endpoint: str, op: str) -> dict[str, Any] | None:
        """The armed fault that answers this request, counted as used; None for none."""
        for fault in self.faults:
            if fault["endpoint"] == endpoint and fault["op"] == op and fault["times"] != 0:
                if fault["times"] > 0:
                    fault["times"] -= 1
                return fault
        return None

    def trash_path(self, user: str, path: str) -> str:
        base = f"/{self.zone}/trash/home/{user}"
        return f"{base}/{path.rpartition('/')[2]}.{uuid.uuid4().hex[:8]}"

    def seed(self, collection: str, files: dict[str, bytes], owner: str,
             acl: dict[str, str] | None = None) -> None:
        parts = collection.strip("/").split("/")
        for depth in range(1, len(parts) + 1):
            path = "/" + "/".join(parts[:depth])
            if path not in self.colls:
                self.colls[path] = self.new_coll({owner: "own", **(acl or {})})
        for relative, data in files.items():
            path = f"{collection}/{relative}"
            parent = parent_of(path)
            if parent not in self.colls:
                self.seed(parent, {}, owner, acl)
            self.objs[path] = self.new_obj(data, {owner: "own", **(acl or {})})


def check_touch_options(options: dict[str, Any]) -> None:
    """The ``touch`` API's checks of its options, in its order."""
    if "replica_number" in options and "leaf_resource_name" in options:
        raise Failure(USER_INCOMPATIBLE_PARAMS,
                      "[replica_number] and [leaf_resource_name] cannot be used together.")
    if "reference" in options and "seconds_since_epoch" in options:
        raise Failure(USER_INCOMPATIBLE_PARAMS,
                      "[reference] and [seconds_since_epoch] cannot be used together.")
    for name in ("leaf_resource_name", "reference"):
        if name in options and not options[name]:
            raise Failure(INPUT_ARG_NOT_WELL_FORMED_ERR, f"[{name}] cannot be empty.")
    for name in ("replica_number", "seconds_since_epoch"):
        if options.get(name, 0) < 0:
            raise Failure(INPUT_ARG_NOT_WELL_FORMED_ERR, f"[{name}] cannot be less than zero.")


def touched_replica(obj: Obj, options: dict[str, Any]) -> int:
    """The replica ``touch`` changes: the one numbered, the one on the resource named, else
    the good one with the latest time (the first of equals)."""
    replicas = obj.replicas()
    if "replica_number" in options:
        if all(r.number != options["replica_number"] for r in replicas):
            raise Failure(SYS_REPLICA_DOES_NOT_EXIST,
                          "Replica does not exist matching that replica number.")
        return int(options["replica_number"])
    if "leaf_resource_name" in options:
        if options["leaf_resource_name"] != DEFAULT_RESOURCE:
            raise Failure(SYS_REPLICA_DOES_NOT_EXIST, "Replica does not exist in resource.")
        return 0
    latest: Replica | None = None
    for replica in replicas:
        if replica.status == "1" and (latest is None or replica.mtime > latest.mtime):
            latest = replica
    if latest is None:
        raise Failure(SYS_NO_GOOD_REPLICA, "No good replicas found.")
    return latest.number


# -- GenQuery ------------------------------------------------------------------------------

_TOKEN = re.compile(r"\s*(?:('(?:[^']|'')*')|(>=|<=|!=|<>|=|>|<|,)|([A-Za-z_][A-Za-z0-9_]*)"
                    r"|(\d+)|(\S))")


def _unquote(text: str) -> str:
    body = text[1:-1].replace("''", "'")
    return re.sub(r"\\x([0-9a-fA-F]{2})", lambda m: chr(int(m.group(1), 16)), body)


def tokenize(text: str) -> list[tuple[str, str]]:
    tokens, pos = [], 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if not match or match.end() == pos:
            break
        pos = match.end()
        literal, op, word, number, junk = match.groups()
        if literal is not None:
            tokens.append(("lit", _unquote(literal)))
        elif op is not None:
            tokens.append(("op", op))
        elif word is not None:
            tokens.append(("word", word))
        elif number is not None:
            tokens.append(("num", number))
        elif junk is not None:
            raise Failure(SYS_INVALID_INPUT_PARAM, f"syntax error near {junk!r}", http=400)
    return tokens


@dataclass
class Query:
    columns: list[str]
    conditions: list[tuple[str, str, str]]
    order: str | None = None
    descending: bool = False
    limit: int | None = None
    offset: int = 0


def parse_query(text: str) -> Query:
    tokens = tokenize(text)
    pos = 0

    def take(kind: str | None = None, value: str | None = None) -> str:
        nonlocal pos
        if pos >= len(tokens):
            raise Failure(SYS_INVALID_INPUT_PARAM, "unexpected end of query", http=400)
        tkind, tvalue = tokens[pos]
        if (kind and tkind != kind) or (value and tvalue.lower() != value):
            raise Failure(SYS_INVALID_INPUT_PARAM, f"syntax error at {tvalue!r}", http=400)
        pos += 1
        return tvalue

    def peek(value: str) -> bool:
        return pos < len(tokens) and tokens[pos][1].lower() == value

    take("word", "select")
    columns = [take("word").upper()]
    while peek(","):
        take("op")
        columns.append(take("word").upper())
    query = Query(columns, [])
    if peek("where"):
        take()
        while True:
            column = take("word").upper()
            if peek("like"):
                take()
                op = "like"
            else:
                op = take("op")
            query.conditions.append((column, op, take("lit")))
            if not peek("and"):
                break
            take()
    if peek("order"):
        take()
        take("word", "by")
        query.order = take("word").upper()
        if peek("asc") or peek("desc"):
            query.descending = take().lower() == "desc"
    if peek("limit"):
        take()
        query.limit = int(take("num"))
    if peek("offset"):
        take()
        query.offset = int(take("num"))
    if pos != len(tokens):
        raise Failure(SYS_INVALID_INPUT_PARAM, f"syntax error at {tokens[pos][1]!r}", http=400)
    return query


def _matches(value: str, op: str, wanted: str) -> bool:
    if op == "=":
        return value == wanted
    if op in ("!=", "<>"):
        return value != wanted
    if op == ">":
        return value > wanted
    if op == "<":
        return value < wanted
    if op == ">=":
        return value >= wanted
    if op == "<=":
        return value <= wanted
    pattern = "^" + re.escape(wanted).replace("%", ".*").replace("_", ".") + "$"
    return re.match(pattern, value) is not None


def _time(seconds: int) -> str:
    return f"{seconds:011d}"


def _joined(row: dict[str, str], kind: str, acl: dict[str, str] | bool,
            avus: list[tuple[str, str, str]] | bool) -> list[dict[str, str]]:
    """``row`` joined with its access list and its AVUs when the query names them (``kind``:
    ``DATA`` or ``COLL``), one row per combination, as SQL joins give them."""
    rows = [row]
    if acl:
        rows = [{**r, f"{kind}_ACCESS_USER_NAME": u, f"{kind}_ACCESS_PERM_NAME": p}
                for r in rows for u, p in acl.items()]  # type: ignore[union-attr]
    if avus is not False:
        rows = [{**r, f"META_{kind}_ATTR_NAME": a, f"META_{kind}_ATTR_VALUE": v,
                 f"META_{kind}_ATTR_UNITS": u} for r in rows for a, v, u in avus or ()]
    return rows


def query_rows(state: State, user: str, query: Query) -> list[list[str]]:
    used = set(query.columns) | {c for c, _, _ in query.conditions}
    if query.order:
        used.add(query.order)
    rows: list[dict[str, str]] = []
    if any(c.startswith("USER_") for c in used):
        for group, members in state.groups.items():
            for member in members:
                rows.append({"USER_NAME": member, "USER_ZONE": state.zone,
                             "USER_GROUP_NAME": group})
        for member in state.passwords:
            rows.append({"USER_NAME": member, "USER_ZONE": state.zone,
                         "USER_GROUP_NAME": member})
    elif any(c.startswith(("DATA_", "META_DATA_")) for c in used):
        acl_rows = any(c.startswith("DATA_ACCESS_") for c in used)
        meta_rows = any(c.startswith("META_DATA_") for c in used)
        for path, obj in state.objs.items():
            if state.level(user, obj.acl) < 1:
                continue
            coll, _, name = path.rpartition("/")
            base = {"COLL_NAME": coll or "/", "DATA_NAME": name, "DATA_ID": str(obj.ident),
                    "DATA_CHECKSUM": obj.checksum}
            for replica in obj.replicas():
                row = {**base, "DATA_SIZE": str(replica.size),
                       "DATA_MODIFY_TIME": _time(replica.mtime),
                       "DATA_REPL_NUM": str(replica.number),
                       "DATA_REPL_STATUS": replica.status}
                rows.extend(_joined(row, "DATA", acl_rows and obj.acl,
                                    meta_rows and obj.avus))
    else:
        acl_rows = any(c.startswith("COLL_ACCESS_") for c in used)
        meta_rows = any(c.startswith("META_COLL_") for c in used)
        for path, coll in state.colls.items():
            if state.level(user, coll.acl) < 1:
                continue
            row = {"COLL_NAME": path, "COLL_PARENT_NAME": parent_of(path) if path != "/" else "",
                   "COLL_ID": str(coll.ident), "COLL_MODIFY_TIME": _time(coll.mtime)}
            rows.extend(_joined(row, "COLL", acl_rows and coll.acl, meta_rows and coll.avus))
    for column in used:
        if rows and column not in rows[0]:
            raise Failure(SYS_INVALID_INPUT_PARAM, f"unknown column {column}", http=400)
    selected = []
    for row in rows:
        if all(_matches(row[c], op, v) for c, op, v in query.conditions):
            selected.append(row)
    keys = [query.order] if query.order else query.columns
    selected.sort(key=lambda r: [r[k] for k in keys], reverse=query.descending)
    out: list[list[str]] = []
    seen: set[tuple[str, ...]] = set()
    for row in selected:  # DISTINCT, as GenQuery applies it
        values = tuple(row[c] for c in query.columns)
        if values not in seen:
            seen.add(values)
            out.append(list(values))
    return out


# -- HTTP ----------------------------------------------------------------------------------


def _form_parts(content_type: str, body: bytes) -> tuple[dict[str, str], bytes]:
    """The text fields and the ``bytes`` field of a multipart/form-data body."""
    message = BytesParser(policy=email_policy.HTTP).parsebytes(
        f"Content-Type: {content_type}\r\n\r\n".encode() + body)
    fields, data = {}, b""
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True) or b""
        if name == "bytes":
            data = payload
        else:
            fields[name] = payload.decode()
    return fields, data


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes: with Nagle's algorithm on, each answer
    # would wait ~40 ms for the client's delayed ACK (a real server sends them together).
    disable_nagle_algorithm = True
    server: FakeServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    @property
    def state(self) -> State:
        return self.server.state

    # -- plumbing -------------------------------------------------------------------------

    def _send(self, status: int, body: bytes, content_type: str = "application/json",
              headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, payload: dict[str, Any]) -> None:
        self._send(status, json.dumps(payload).encode())

    def _ok(self, **payload: Any) -> None:
        self._json(200, {"irods_response": {"status_code": 0}, **payload})

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _user(self) -> str | None:
        header = self.headers.get("Authorization", "")
        if not header.startswith("Bearer "):
            return None
        with self.state.lock:
            found = self.state.tokens.get(header[7:])
        if found is None or found[1] < time.time():
            return None
        return found[0]

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def _dispatch(self, method: str) -> None:
        parts = urlsplit(self.path)
        params = dict(parse_qsl(parts.query, keep_blank_values=True))
        body = self._body() if method == "POST" else b""
        if len(body) > MAX_BODY and not parts.path.startswith("/_fake/"):
            # the limit is on the whole request body, form overhead included
            self._json(413, {"irods_response": {"status_code": SYS_INVALID_INPUT_PARAM,
                                                "status_message": "body limit exceeded"}})
            return
        if parts.path.startswith("/_fake/"):
            self._control(parts.path[len("/_fake/"):], params, body)
            return
        if not parts.path.startswith(API + "/"):
            self._send(404, b"not found", "text/plain")
            return
        endpoint = parts.path[len(API):]
        if self.state.latency:
            time.sleep(self.state.latency)
        if method == "POST" and not self.headers.get("irods-api-request-op"):
            content_type = self.headers.get("Content-Type", "")
            if content_type.startswith("multipart/form-data"):  # method-1 write
                params, body = _form_parts(content_type, body)
            else:
                params = dict(parse_qsl(body.decode(), keep_blank_values=True))
        op = params.get("op") or self.headers.get("irods-api-request-op", "")
        key = f"{method} {endpoint} {op}".strip()
        if op == "execute_genquery":
            key += f" {params.get('parser', 'genquery1')}"
        with self.state.lock:
            self.state.counts[key] += 1
        try:
            if endpoint == "/info":
                self._info()
                return
            if endpoint == "/authenticate":
                self._authenticate()
                return
            user = self._user()
            if user is None:
                self._send(401, b"", "text/plain")
                return
            handler = getattr(self, f"_{endpoint.strip('/').replace('-', '_')}", None)
            if handler is None:
                raise Failure(SYS_INVALID_INPUT_PARAM, f"no endpoint {endpoint}", http=404)
            with self.state.lock:
                fault = self.state.take_fault(endpoint, op)
            if fault is not None:
                raise Failure(fault["code"], fault["message"], http=fault["http"])
            handler(user, method, op, params, body)
        except BadRequest:
            self._send(400, b"")
        except Failure as failure:
            status = {"status_code": failure.code,
                      **({"status_message": failure.message} if failure.message else {}),
                      **failure.extra}
            self._json(failure.http, {"irods_response": status})

    def _info(self) -> None:
        payload = {"api_version": "0.7.0", "build": "rucio-fs fake",
                   "irods_zone": self.state.zone,
                   "max_number_of_parallel_write_streams": self.state.streams_total,
                   "max_number_of_rows_per_catalog_query": ROW_CAP,
                   "max_number_of_streams_per_parallel_write_handle": STREAMS_PER_HANDLE,
                   "max_size_of_request_body_in_bytes": MAX_BODY,
                   "openid_connect_enabled": False}
        if self._user():
            payload["irods_server_version"] = "4.3.4" if self.state.gq2 else "4.3.1"
        self._send(200, json.dumps(payload).encode())

    def _authenticate(self) -> None:
        header = self.headers.get("Authorization", "")
        try:
            user, _, password = base64.b64decode(header.removeprefix("Basic ")).decode() \
                .partition(":")
        except ValueError:
            user, password = "", None
        if not header.startswith("Basic ") or self.state.passwords.get(user) != password:
            self._send(401, b"", "text/plain")
            return
        token = str(uuid.uuid4())
        with self.state.lock:
            self.state.tokens[token] = (user, time.time() + self.state.token_lifetime)
        self._send(200, token.encode(), "text/plain")

    # -- endpoints ------------------------------------------------------------------------

    def _query(self, user: str, method: str, op: str, params: dict[str, str],
               body: bytes) -> None:
        if op != "execute_genquery":
            raise Failure(SYS_INVALID_INPUT_PARAM, f"unsupported op {op}", http=400)
        parser = params.get("parser", "genquery1")
        if parser == "genquery2" and not self.state.gq2:
            # iRODS before 4.3.2 has no GenQuery2 API; the HTTP API passes its error on
            raise Failure(SYS_UNMATCHED_API_NUM, "", http=400)
        query = parse_query(params.get("query", ""))
        with self.state.lock:
            rows = query_rows(self.state, user, query)
        if parser == "genquery2":
            rows = rows[query.offset:]
            rows = rows[:query.limit if query.limit is not None else GQ2_DEFAULT_ROWS]
        else:
            count = min(max(int(params.get("count") or ROW_CAP), 1), ROW_CAP)
            offset = int(params.get("offset") or 0)
            rows = rows[offset:offset + count]
        self._ok(rows=rows)

    def _collections(self, user: str, method: str, op: str, params: dict[str, str],
                     body: bytes) -> None:
        state = self.state
        lpath = params.get("lpath", "")
        with state.lock:
            if op == "stat":
                coll = state.coll(lpath)
                state.need(user, coll.acl, "read_metadata", lpath)
                self._ok(type="collection", inheritance_enabled=False, registered=True,
                         modified_at=coll.mtime, permissions=self._permissions(coll.acl))
            elif op == "list":
                if lpath in state.objs:
                    raise Failure(NOT_A_COLLECTION, "", http=400)
                state.coll(lpath)
                entries = sorted(p for p in [*state.colls, *state.objs]
                                 if p != lpath and parent_of(p) == lpath)
                self._ok(entries=entries)
            elif op == "create":
                if lpath in state.colls:
                    self._ok(created=False)
                    return
                parent = state.creatable(user, lpath)
                state.colls[lpath] = state.new_coll({user: "own"})
                parent.mtime = now()
                self._ok(created=True)
            elif op == "remove":
                coll = state.coll(lpath)
                state.need(user, coll.acl, "delete_object", lpath)
                prefix = lpath + "/"
                if (params.get("recurse") != "1"
                        and any(p.startswith(prefix) for p in [*state.colls, *state.objs])):
                    raise Failure(CAT_COLLECTION_NOT_EMPTY, f"{lpath} is not empty")
                for table in (state.colls, state.objs):
                    for path in [p for p in table if p.startswith(prefix)]:
                        del table[path]
                del state.colls[lpath]
                state.coll(parent_of(lpath)).mtime = now()
                self._ok()
            elif op == "rename":
                self._rename(user, params, collection=True)
            elif op == "touch":
                self._touch(user, params, collection=True)
            elif op == "modify_metadata":
                self._modify_metadata(user, state.coll(lpath), lpath, params)
            else:
                raise Failure(SYS_INVALID_INPUT_PARAM, f"unsupported op {op}", http=400)

    def _touch(self, user: str, params: dict[str, str], collection: bool) -> None:
        """``touch`` of ``/collections`` (never creates; takes ``seconds-since-epoch`` and
        ``reference``) or ``/data-objects`` (also ``no-create``, ``replica-number``,
        ``leaf-resource``): parameters as the HTTP API parses them, then the server's API."""
        if "lpath" not in params:
            raise BadRequest("missing lpath")
        lpath = params["lpath"]
        options: dict[str, Any] = {"no_create": True} if collection else {}
        if not collection:
            if "no-create" in params:
                options["no_create"] = params["no-create"] == "1"
            if "replica-number" in params:
                options["replica_number"] = stoi(params["replica-number"])
            if "leaf-resource" in params:
                options["leaf_resource_name"] = params["leaf-resource"]
        if "seconds-since-epoch" in params:
            options["seconds_since_epoch"] = stoi(params["seconds-since-epoch"])
        if "reference" in params:
            options["reference"] = params["reference"]
        state = self.state
        if collection and lpath in state.objs:
            raise Failure(NOT_A_COLLECTION, "", http=400)
        if not collection and lpath in state.colls:
            raise Failure(NOT_A_DATA_OBJECT, "", http=400)
        state.touch(user, lpath, options)
        self._ok()

    def _modify_metadata(self, user: str, entry: Coll | Obj, lpath: str,
                         params: dict[str, str]) -> None:
        self.state.need(user, entry.acl, "modify_metadata", lpath)
        entry.avus = self._modify(entry.avus, params.get("operations", "[]"))
        self._ok()

    def _data_objects(self, user: str, method: str, op: str, params: dict[str, str],
                      body: bytes) -> None:
        state = self.state
        if self.headers.get("irods-api-request-op"):
            params = {name[len("irods-api-request-"):].lower(): value
                      for name, value in self.headers.items()
                      if name.lower().startswith("irods-api-request-")}
        lpath = params.get("lpath", "")
        if op == "read":
            self._read(user, params)
            return
        if op == "write":
            self._write(user, params, body)
            return
        with state.lock:
            if op == "stat":
                obj = state.obj(lpath)
                state.need(user, obj.acl, "read_metadata", lpath)
                self._ok(type="data_object", size=len(obj.data), checksum=obj.checksum,
                         modified_at=obj.mtime, permissions=self._permissions(obj.acl))
            elif op == "parallel_write_init":
                self._init(user, params)
            elif op == "parallel_write_shutdown":
                handle = state.handles.pop(params.get("parallel-write-handle", ""), None)
                if handle is None:
                    raise Failure(SYS_INVALID_INPUT_PARAM, "no such parallel write handle",
                                  http=400)
                obj = state.obj(handle.lpath)
                obj.data, obj.mtime, obj.checksum, obj.status = handle.buffer, now(), "", "1"
                self._ok()
            elif op == "touch":
                self._touch(user, params, collection=False)
            elif op == "remove":
                obj = state.obj(lpath)
                state.need(user, obj.acl, "delete_object", lpath)
                del state.objs[lpath]
                if params.get("no-trash") != "1":
                    state.objs[state.trash_path(user, lpath)] = obj
                state.coll(parent_of(lpath)).mtime = now()
                self._ok()
            elif op == "rename":
                self._rename(user, params, collection=False)
            elif op == "truncate":
                if "size" not in params:
                    raise Failure(SYS_INVALID_INPUT_PARAM, "missing size", http=400)
                obj = state.obj(lpath)
                state.need(user, obj.acl, "modify_object", lpath)
                size = int(params["size"])
                obj.data = obj.data[:size] + bytearray(max(0, size - len(obj.data)))
                obj.mtime, obj.checksum = now(), ""
                self._ok()
            elif op == "modify_metadata":
                self._modify_metadata(user, state.obj(lpath), lpath, params)
            elif op == "calculate_checksum":
                obj = state.obj(lpath)
                state.need(user, obj.acl, "read_object", lpath)
                digest = base64.b64encode(hashlib.sha256(obj.data).digest()).decode()
                obj.checksum = f"sha2:{digest}"
                self._ok(checksum=obj.checksum)
            else:
                raise Failure(SYS_INVALID_INPUT_PARAM, f"unsupported op {op}", http=400)

    def _permissions(self, acl: dict[str, str]) -> list[dict[str, str]]:
        return [{"name": u, "perm": p, "type": "rodsgroup" if u in self.state.groups
                 else "rodsuser", "zone": self.state.zone} for u, p in acl.items()]

    def _rename(self, user: str, params: dict[str, str], collection: bool) -> None:
        state = self.state
        old, new = params.get("old-lpath", ""), params.get("new-lpath", "")
        table = state.colls if collection else state.objs
        if old not in table:
            raise Failure(CAT_UNKNOWN_COLLECTION if collection else OBJ_PATH_DOES_NOT_EXIST,
                          f"no {old}")
        state.need(user, table[old].acl, "delete_object", old)
        state.creatable(user, new)
        table[new] = table.pop(old)
        if collection:
            prefix = old + "/"
            for inner in (state.colls, state.objs):
                for path in [p for p in inner if p.startswith(prefix)]:
                    inner[new + path[len(old):]] = inner.pop(path)
        state.coll(parent_of(old)).mtime = state.coll(parent_of(new)).mtime = now()
        self._ok()

    def _modify(self, avus: list[tuple[str, str, str]], text: str) -> list[tuple[str, str, str]]:
        result = list(avus)
        operations = json.loads(text)
        for index, operation in enumerate(operations):
            avu = (operation.get("attribute", ""), operation.get("value", ""),
                   operation.get("units", ""))
            if not avu[0] or not avu[1]:
                raise Failure(SYS_INVALID_INPUT_PARAM, "attribute and value are required",
                              failed_operation={"operation": operation,
                                                "operation_index": index,
                                                "error_message": "empty attribute or value"})
            if operation.get("operation") == "add":
                if avu not in result:
                    result.append(avu)
            elif avu in result:
                result.remove(avu)
            else:
                raise Failure(-1, "AVU not found", failed_operation={
                    "operation": operation, "operation_index": index,
                    "error_message": "no such AVU"})
        return result  # applied only when every operation succeeded: atomic

    def _read(self, user: str, params: dict[str, str]) -> None:
        lpath = params.get("lpath", "")
        with self.state.lock:
            obj = self.state.obj(lpath, http=404)
            self.state.need(user, obj.acl, "read_object", lpath)
            offset = int(params.get("offset") or 0)
            size = len(obj.data)
            count = int(params["count"]) if params.get("count") else size - offset
            count = max(0, min(count, size - offset))
            data = bytes(obj.data[offset:offset + count])
        if count <= MAX_READ:
            self._send(200, data, "application/octet-stream")
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        view = memoryview(data)
        for start in range(0, len(view), 256 << 10):
            chunk = view[start:start + (256 << 10)]
            self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        self.wfile.write(b"0\r\n\r\n")

    def _write(self, user: str, params: dict[str, str], body: bytes) -> None:
        state = self.state
        offset = int(params.get("offset") or 0)
        handle_id = params.get("parallel-write-handle")
        if handle_id:
            with state.lock:
                handle = state.handles.get(handle_id)
                if handle is None:
                    raise Failure(SYS_INVALID_INPUT_PARAM, "no such parallel write handle",
                                  http=400)
                stream = int(params.get("stream-index", "-1"))
                if not 0 <= stream < handle.streams:
                    raise Failure(SYS_INVALID_INPUT_PARAM, "bad stream index", http=400)
                busy = stream in handle.busy
                handle.busy.add(stream)
                if not busy and len(handle.buffer) < offset + len(body):
                    handle.buffer.extend(bytes(offset + len(body) - len(handle.buffer)))
            if busy:  # two requests on one stream at once: the client broke the rule
                self._send(429, b'{"irods_response":{"status_code":-1,'
                                b'"status_message":"stream is busy"}}')
                return
            try:
                time.sleep(0.001)  # the write takes a moment, as on a real server
                handle.buffer[offset:offset + len(body)] = body
            finally:
                with state.lock:
                    handle.busy.discard(stream)
            self._ok()
            return
        with state.lock:
            lpath = params.get("lpath", "")
            if lpath not in state.objs:
                state.creatable(user, lpath)
                state.objs[lpath] = state.new_obj(b"", {user: "own"})
            obj = state.obj(lpath)
            state.need(user, obj.acl, "modify_object", lpath)
            if params.get("truncate", "1") == "1":  # the documented default
                obj.data = bytearray()
            if params.get("append") == "1":
                offset = len(obj.data)
            if len(obj.data) < offset:
                obj.data.extend(bytes(offset - len(obj.data)))
            obj.data[offset:offset + len(body)] = body
            obj.mtime, obj.checksum = now(), ""
        self._ok()

    def _init(self, user: str, params: dict[str, str]) -> None:
        state = self.state
        lpath = params.get("lpath", "")
        streams = int(params.get("stream-count") or 0)
        if not 1 <= streams <= STREAMS_PER_HANDLE:
            raise Failure(SYS_INVALID_INPUT_PARAM, f"stream-count must be 1 to "
                          f"{STREAMS_PER_HANDLE}", http=400)
        if sum(h.streams for h in state.handles.values()) + streams > state.streams_total:
            self._send(503, b'{"irods_response":{"status_code":-1,'
                            b'"status_message":"too many parallel write streams"}}')
            return
        if lpath not in state.objs:
            state.creatable(user, lpath)
            state.objs[lpath] = state.new_obj(b"", {user: "own"})
        obj = state.obj(lpath)
        state.need(user, obj.acl, "modify_object", lpath)
        truncate = params.get("truncate", "1") == "1"
        handle = Handle(lpath, streams, bytearray() if truncate else bytearray(obj.data))
        obj.status = "2"  # intermediate until shut down
        token = uuid.uuid4().hex
        state.handles[token] = handle
        self._ok(parallel_write_handle=token)

    # -- test controls ----------------------------------------------------------------------

    def _control(self, name: str, params: dict[str, str], body: bytes) -> None:
        state = self.state
        with state.lock:
            if name == "seed":
                request = json.loads(body)
                files = {k: base64.b64decode(v) for k, v in request["files"].items()}
                state.seed(request["collection"], files, request.get("owner", USER),
                           request.get("acl"))
                for relative, extra in request.get("stale", {}).items():
                    obj = state.objs[f"{request['collection']}/{relative}"]
                    obj.stale.append(Replica(int(extra.get("number", 1)), extra["size"],
                                             extra["mtime"], str(extra.get("status", "0"))))
                for relative, avus in request.get("avus", {}).items():
                    state.objs[f"{request['collection']}/{relative}"].avus = [
                        tuple(a) for a in avus]
                for relative, checksum in request.get("checksums", {}).items():
                    state.objs[f"{request['collection']}/{relative}"].checksum = checksum
                self._json(200, {"seeded": len(files)})
            elif name == "stats":
                self._json(200, {"counts": dict(state.counts),
                                 "open_handles": len(state.handles),
                                 "tokens": len(state.tokens),
                                 "faults": [dict(f) for f in state.faults]})
            elif name == "reset-stats":
                state.counts.clear()
                self._json(200, {})
            elif name == "config":
                request = json.loads(body or b"{}")
                if "latency_ms" in request:
                    state.latency = request["latency_ms"] / 1000
                if "token_lifetime" in request:
                    state.token_lifetime = float(request["token_lifetime"])
                if request.get("expire_tokens"):
                    state.tokens.clear()
                if "streams_total" in request:
                    state.streams_total = int(request["streams_total"])
                if "gq2" in request:
                    state.gq2 = bool(request["gq2"])
                if "fail" in request:
                    state.arm(request["fail"])
                self._json(200, {})
            elif name == "object":
                obj = state.objs.get(params.get("lpath", ""))
                if obj is None:
                    self._json(404, {})
                    return
                self._json(200, {"data": base64.b64encode(obj.data).decode(),
                                 "avus": obj.avus, "mtime": obj.mtime, "acl": obj.acl,
                                 "replicas": [[r.number, r.mtime, r.status]
                                              for r in obj.replicas()]})
            elif name == "exists":
                path = params.get("lpath", "")
                self._json(200, {"collection": path in state.colls,
                                 "data_object": path in state.objs})
            else:
                self._json(404, {})


class FakeServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], zone: str) -> None:
        super().__init__(address, Handler)
        self.state = State(zone)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client went away: normal
            super().handle_error(request, client_address)


def start(port: int = 0) -> tuple[subprocess.Popen[str], int]:
    """The fake in a process of its own on ``port`` of 127.0.0.1 (0: a free one), once it
    listens; stop it with ``terminate()``."""
    if not port:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
    process = subprocess.Popen([sys.executable, "-m", __spec__.name, "--port", str(port)],
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    if process.stdout.readline().strip() != "ready":
        process.kill()
        raise RuntimeError("the fake iRODS HTTP API did not start")
    return process, port


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--zone", default="tempZone")
    args = parser.parse_args()
    server = FakeServer(("127.0.0.1", args.port), args.zone)
    print("ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
