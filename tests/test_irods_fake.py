"""The fake iRODS HTTP API answers in the shapes of the real one, and the backend's query
text and row folding hold for any names and any page boundaries.

The shapes below are transcribed from responses recorded against real iRODS HTTP API
servers (the rirods client's httptest2 fixtures, named in ``irods-and-rucio-clients.md`` §1):
``collections?op=stat`` (``collection-http/collections-70d180``), ``query`` rows
(``coerce-irods_df/query-9a9228``), ``data-objects?op=read`` (``data-objects-http/
data-objects-0389de``), and the API reference for the rest.
"""

from __future__ import annotations

import errno
import itertools
import os
import string
import time

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rucio_fs.backends.irods.backend import answer, irods_error, storable_seconds
from rucio_fs.backends.irods.query import Folder, literal

from rucio_fs.backend import Kind
from rucio_fs.errors import QuotaExceeded, RucioFsError, Unavailable
from rucio_fs.testing.irods_fake import parse_query

RECORDED = {
    "collection stat": {"inheritance_enabled", "irods_response", "modified_at", "permissions",
                        "registered", "type"},
    "permission": {"name", "perm", "type", "zone"},
    "query": {"irods_response", "rows"},
    "data object stat": {"irods_response", "type", "permissions", "size", "checksum",
                         "modified_at"},
    "info": {"api_version", "build", "irods_zone",
             "max_number_of_streams_per_parallel_write_handle",
             "max_number_of_rows_per_catalog_query", "max_size_of_request_body_in_bytes",
             "openid_connect_enabled"},
}


def test_answers_have_the_recorded_shapes(irods_server):
    irods_server.require_fake()
    collection = irods_server.collection("shapes")
    irods_server.seed(collection, {"bar.csv": b"x" * 2000})
    stat = irods_server.call("GET", "/collections", op="stat", lpath=collection).json()
    assert set(stat) == RECORDED["collection stat"]
    assert stat["irods_response"] == {"status_code": 0} and stat["type"] == "collection"
    assert all(set(p) == RECORDED["permission"] for p in stat["permissions"])
    assert isinstance(stat["modified_at"], int)
    data = irods_server.call("GET", "/data-objects", op="stat",
                             lpath=f"{collection}/bar.csv").json()
    assert set(data) == RECORDED["data object stat"] and data["size"] == 2000
    query = irods_server.call("GET", "/query", op="execute_genquery", parser="genquery1",
                              query=f"select COLL_NAME, DATA_NAME where COLL_NAME = "
                                    f"'{collection}'").json()
    assert set(query) == RECORDED["query"]
    assert query["rows"] == [[collection, "bar.csv"]]
    read = irods_server.call("GET", "/data-objects", op="read", lpath=f"{collection}/bar.csv",
                             offset="0", count="2000")
    assert read.status_code == 200
    assert read.headers["content-type"] == "application/octet-stream"
    assert read.headers["content-length"] == "2000"
    info = irods_server._http.get(irods_server.api + "/info").json()
    assert RECORDED["info"] <= set(info)


def test_documented_quirks(irods_server):
    irods_server.require_fake()
    collection = irods_server.collection("quirks")
    files = {f"q{i:02d}": b"q" for i in range(40)}
    irods_server.seed(collection, {**files, "big": b"b" * (3 << 20)})
    # a failed namespace operation: HTTP 200 with a negative status code
    failed = irods_server.call("POST", "/collections", op="remove", lpath=collection)
    assert failed.status_code == 200
    assert failed.json()["irods_response"]["status_code"] < 0
    # a missing object's read is 404; list of a data object is 400
    assert irods_server.call("GET", "/data-objects", op="read",
                             lpath=f"{collection}/absent").status_code == 404
    assert irods_server.call("GET", "/collections", op="list",
                             lpath=f"{collection}/q00").status_code == 400
    # GenQuery1 is capped at 15 rows; GenQuery2 gives 256 rows without a limit
    gq1 = irods_server.call("GET", "/query", op="execute_genquery", parser="genquery1",
                            count="100", query=f"select DATA_NAME where COLL_NAME = "
                                               f"'{collection}'").json()["rows"]
    assert len(gq1) == 15
    # reads above 1 MiB are chunked
    big = irods_server.call("GET", "/data-objects", op="read", lpath=f"{collection}/big")
    assert big.headers.get("transfer-encoding") == "chunked" and len(big.content) == 3 << 20
    # writes truncate unless told otherwise
    irods_server.write(f"{collection}/q01", b"new")
    assert irods_server.read(f"{collection}/q01") == b"new"
    # truncate needs its size (missing from the API reference)
    assert irods_server.call("POST", "/data-objects", op="truncate",
                             lpath=f"{collection}/q01").status_code == 400
    # an unknown token is refused with 401
    response = irods_server._http.get(irods_server.api + "/query",
                                      headers={"Authorization": "Bearer nonsense"})
    assert response.status_code == 401


names = st.text(alphabet=string.ascii_letters + string.digits + "'\\ %_-.üé漢",
                min_size=1, max_size=20)


@settings(max_examples=200, deadline=None)
@given(names)
def test_any_name_survives_quoting(name):
    query = parse_query(f"select DATA_NAME where DATA_NAME = {literal(name)} "
                        f"and COLL_NAME > {literal(name + chr(39))}")
    assert query.conditions == [("DATA_NAME", "=", name), ("COLL_NAME", ">", name + "'")]


def _rows(spec: list[tuple[str, int]]) -> list[list[str]]:
    rows = []
    for name, replicas in spec:
        for number in range(replicas):
            rows.append([name, str(10 + number), f"{1000 + number:011d}", "", str(number),
                         "1" if number == 0 else "0", "own", "alice"])
    return rows


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.text(string.ascii_lowercase, min_size=1, max_size=4),
                          st.integers(1, 3)), unique_by=lambda t: t[0], max_size=30),
       st.lists(st.integers(0, 100), max_size=6))
def test_folding_does_not_depend_on_page_boundaries(spec, cuts):
    rows = _rows(sorted(spec))
    whole = Folder(Kind.FILE, frozenset({"alice"})).fold(rows, last=True)
    folder = Folder(Kind.FILE, frozenset({"alice"}))
    bounds = sorted({min(c, len(rows)) for c in cuts} | {0, len(rows)})
    paged = []
    for start, end in itertools.pairwise(bounds):
        paged += folder.fold(rows[start:end], last=end == len(rows))
    if len(bounds) == 1:
        paged = folder.fold([], last=True)
    assert paged == whole
    assert [e.name for e in whole] == [name for name, _ in sorted(spec)]
    assert all(e.size == 10 and e.mode == 0o644 for e in whole)  # the good replica 0


@pytest.mark.parametrize("raw, expected", [
    ("sha2:" + "A" * 43 + "=", {"sha256": "00" * 32}),
    ("d41d8cd98f00b204e9800998ecf8427e", {"md5": "d41d8cd98f00b204e9800998ecf8427e"}),
    ("sha2:not base64!", {}),
])
def test_checksums_are_verifiable_when_recognised(raw, expected):
    from rucio_fs.backends.irods.query import checksums_of

    assert checksums_of(raw) == {"irods": raw, **expected}


# -- touch, as the HTTP API and iRODS's touch API answer it --------------------------------


def _status(response) -> int | None:
    """``irods_response.status_code`` of an answer, None for a bare (empty) one."""
    return response.json()["irods_response"]["status_code"] if response.content else None


def _mtime(server, lpath: str) -> int:
    parent, _, name = lpath.rpartition("/")
    if server.kind(lpath) == "collection":
        rows = server.query(f"select COLL_MODIFY_TIME where COLL_NAME = '{lpath}'")
    else:
        rows = server.query(f"select DATA_MODIFY_TIME where COLL_NAME = '{parent}' "
                            f"and DATA_NAME = '{name}'")
    return max(int(row[0]) for row in rows)


def test_touch_sets_times_and_refuses_what_the_api_refuses(irods_server):
    """Behaviour taken from the API's handlers and iRODS's touch API; it holds for a real
    server too (nothing here needs the fake's controls)."""
    collection = irods_server.collection("touch")
    irods_server.seed(collection, {"f": b"touched", "sub/g": b"g"})
    f, sub = f"{collection}/f", f"{collection}/sub"

    def touch(endpoint: str, **params: str):
        return irods_server.call("POST", endpoint, op="touch", **params)

    for endpoint, lpath in (("/data-objects", f), ("/collections", sub)):
        answer = touch(endpoint, lpath=lpath, **{"seconds-since-epoch": "1600000000"})
        assert (answer.status_code, _status(answer)) == (200, 0)
        assert _mtime(irods_server, lpath) == 1_600_000_000
    # a C int, parsed with std::stoi: not a number or out of range is a bare 400
    for bad in ("soon", str(2**31)):
        answer = touch("/data-objects", lpath=f, **{"seconds-since-epoch": bad})
        assert (answer.status_code, answer.content) == (400, b"")
    assert touch("/data-objects", lpath=f, **{"seconds-since-epoch": str(2**31 - 1)}
                 ).json()["irods_response"]["status_code"] == 0
    negative = touch("/collections", lpath=sub, **{"seconds-since-epoch": "-1"})
    assert _status(negative) == -1084000  # INPUT_ARG_NOT_WELL_FORMED_ERR
    both = touch("/data-objects", lpath=f, reference=sub, **{"seconds-since-epoch": "5"})
    assert _status(both) == -402000  # USER_INCOMPATIBLE_PARAMS
    assert _status(touch("/data-objects", lpath=f, reference=sub)) == 0
    assert _mtime(irods_server, f) == 1_600_000_000  # the collection's time, copied
    # the wrong kind of path
    wrong = touch("/collections", lpath=f)
    assert (wrong.status_code, _status(wrong)) == (400, -170000)  # NOT_A_COLLECTION
    wrong = touch("/data-objects", lpath=sub)
    assert (wrong.status_code, _status(wrong)) == (400, -171000)  # NOT_A_DATA_OBJECT
    # a missing path: nothing done, no error (collections are never created)
    for endpoint, extra in (("/collections", {}), ("/data-objects", {"no-create": "1"})):
        answer = touch(endpoint, lpath=f"{collection}/absent", **extra)
        assert _status(answer) == 0
        assert irods_server.kind(f"{collection}/absent") is None
    assert _status(touch("/data-objects", lpath=f"{collection}/new")) == 0
    assert irods_server.kind(f"{collection}/new") == "data_object"
    assert irods_server.read(f"{collection}/new") == b""
    assert (touch("/collections").status_code, touch("/collections").content) == (400, b"")


def test_touch_changes_one_replica_and_needs_permission(irods_server):
    irods_server.require_fake()
    collection = irods_server.collection("replicas")
    later = int(time.time()) + 600
    irods_server.seed(collection, {"two": b"2"},
                      stale={"two": {"size": 1, "mtime": later, "status": "1"}})
    lpath = f"{collection}/two"

    def touch(**params: str) -> int | None:
        return _status(irods_server.call("POST", "/data-objects", op="touch", lpath=lpath,
                                         **params))

    def replicas() -> dict[int, int]:
        return {n: t for n, t, _ in irods_server.stored(lpath)["replicas"]}

    first = replicas()[0]
    assert touch(**{"seconds-since-epoch": "1000"}) == 0  # the newest good replica only
    assert replicas() == {0: first, 1: 1000}
    assert touch(**{"seconds-since-epoch": "2000", "replica-number": "0"}) == 0
    assert replicas() == {0: 2000, 1: 1000}
    assert touch(**{"replica-number": "7"}) == -164000  # SYS_REPLICA_DOES_NOT_EXIST
    assert touch(**{"replica-number": "0", "leaf-resource": "demoResc"}) == -402000
    # read_object is below modify_metadata: bob may read, not touch
    shared = f"/tempZone/home/bob/touch-{os.urandom(4).hex()}"
    irods_server.seed(shared, {"r": b"r"}, owner="bob", acl={"readers": "read_object"})
    answer = irods_server.call("POST", "/data-objects", op="touch", lpath=f"{shared}/r",
                               **{"seconds-since-epoch": "5"})
    assert _status(answer) == -818000  # CAT_NO_ACCESS_PERMISSION
    answer = irods_server.call("POST", "/collections", op="touch", lpath=shared)
    assert _status(answer) == -818000


def test_armed_faults_answer_with_their_code_then_disarm(irods_server):
    irods_server.require_fake()
    collection = irods_server.collection("faults")
    irods_server.configure(fail={"endpoint": "/collections", "op": "create",
                                 "code": -186000, "times": 1})
    refused = irods_server.call("POST", "/collections", op="create",
                                lpath=f"{collection}/quota")
    assert (refused.status_code, _status(refused)) == (200, -186000)
    assert irods_server.kind(f"{collection}/quota") is None  # not done
    done = irods_server.call("POST", "/collections", op="create", lpath=f"{collection}/quota")
    assert _status(done) == 0
    assert irods_server.stats()["faults"][-1]["times"] == 0
    irods_server.configure(fail=None)
    assert irods_server.stats()["faults"] == []


# -- error codes ---------------------------------------------------------------------------


@pytest.mark.parametrize("code, status, expected", [
    (-818000, 200, errno.EACCES),   # CAT_NO_ACCESS_PERMISSION
    (-830000, 200, errno.EACCES),   # CAT_INSUFFICIENT_PRIVILEGE_LEVEL
    (-169000, 200, errno.EACCES),   # SYS_NOT_ALLOWED
    (-350000, 200, errno.EACCES),   # USER_ACCESS_DENIED
    (-110000, 200, errno.EDQUOT),   # SYS_RESC_QUOTA_EXCEEDED
    (-186000, 200, errno.EDQUOT),   # LOGICAL_QUOTA_EXCEEDED
    (-311000, 200, errno.ENOSPC),   # USER_FILE_TOO_LARGE: more than the device has left
    (-520028, 500, errno.ENOSPC),   # UNIX_FILE_WRITE_ERR with ENOSPC
    (-511122, 200, errno.EDQUOT),   # UNIX_FILE_CREATE_ERR with EDQUOT
    (-510013, 200, errno.EIO),      # UNIX_FILE_OPEN_ERR with EACCES: the server's vault
    (-358000, 200, errno.ENOENT),   # OBJ_PATH_DOES_NOT_EXIST
    (-358002, 200, errno.ENOENT),   # ... with ENOENT
    (-814000, 200, errno.ENOENT),   # CAT_UNKNOWN_COLLECTION
    (-834000, 200, errno.EEXIST),   # CAT_NAME_EXISTS_AS_DATAOBJ
    (-833000, 200, errno.EEXIST),   # CAT_NAME_EXISTS_AS_COLLECTION
    (-809000, 200, errno.EEXIST),   # CATALOG_ALREADY_HAS_ITEM_BY_THAT_NAME
    (-812000, 200, errno.EIO),      # CAT_INVALID_RESOURCE_NET_ADDR: no name clash
    (-821000, 200, errno.ENOTEMPTY),  # CAT_COLLECTION_NOT_EMPTY
    (-170000, 400, errno.ENOTDIR),  # NOT_A_COLLECTION
    (-171000, 400, errno.EISDIR),   # NOT_A_DATA_OBJECT
    (-12000, 400, errno.ENOTSUP),   # SYS_UNMATCHED_API_NUM (no GenQuery2)
    (-66000, 200, errno.ENOTSUP),   # SYS_NOT_SUPPORTED
    (-1084000, 200, errno.EIO),     # INPUT_ARG_NOT_WELL_FORMED_ERR
    (0, 404, errno.ENOENT),
    (0, 403, errno.EACCES),
    (0, 400, errno.EIO),
    (0, 500, errno.EIO),
])
def test_error_codes_become_the_errors_a_file_system_shows(code, status, expected):
    error = irods_error(code, status, "write /z/f", "refused")
    assert isinstance(error, RucioFsError) and error.errno == expected, error
    assert str(error).startswith("write /z/f: ") and "refused" in str(error)


def test_answers_are_checked_by_status_and_code():
    ok = httpx.Response(200, json={"irods_response": {"status_code": 0}, "x": 1})
    assert answer(ok, "op")["x"] == 1
    with pytest.raises(QuotaExceeded, match="-186000"):
        answer(httpx.Response(200, json={"irods_response": {
            "status_code": -186000, "status_message": "quota"}}), "write /z/f")
    with pytest.raises(Unavailable, match="HTTP 400"):
        answer(httpx.Response(400, content=b""), "touch /z/f")  # the API's bare 400


@pytest.mark.parametrize("mtime_ns, seconds", [
    (None, None), (0, 0), (1_600_000_000_999_999_999, 1_600_000_000),
    ((2**31 - 1) * 10**9 + 5, 2**31 - 1), (2**31 * 10**9, None), (-1, None),
])
def test_times_outside_what_touch_takes_are_not_sent(mtime_ns, seconds):
    assert storable_seconds(mtime_ns) == seconds
