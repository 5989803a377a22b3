"""The fake iRODS HTTP API answers in the shapes of the real one, and the backend's query
text and row folding hold for any names and any page boundaries.

The shapes below are transcribed from responses recorded against real iRODS HTTP API
servers (the rirods client's httptest2 fixtures, named in ``irods-and-rucio-clients.md`` §1):
``collections?op=stat`` (``collection-http/collections-70d180``), ``query`` rows
(``coerce-irods_df/query-9a9228``), ``data-objects?op=read`` (``data-objects-http/
data-objects-0389de``), and the API reference for the rest.
"""

from __future__ import annotations

import itertools
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rucio_fs.backends.irods.query import Folder, literal

from rucio_fs.backend import Kind
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
