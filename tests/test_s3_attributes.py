"""POSIX attributes, symbolic links and error codes of the S3 backend, in-process against the
real servers (versitygw and moto), and read by an independent client (botocore) to prove what
is stored is what s3fs-fuse and rclone write."""

from __future__ import annotations

import hashlib
import json
import random
import stat
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import trio
from rucio_fs.backends.s3 import backend as s3_backend
from rucio_fs.backends.s3.metadata import (
    DATE_LAG_S,
    format_mtime,
    parse_mode,
    parse_mtime,
    read_attributes,
)
from rucio_fs.backends.s3.pages import result

from rucio_fs import errors
from rucio_fs.backend import Attributes, Backend, Entry, Kind
from rucio_fs.registry import open_backend
from rucio_fs.testing.conformance import run_with

T = TypeVar("T")
MiB = 1 << 20
#: A time with nanoseconds, before any test ran (so never "now").
PAST_NS = 1_500_000_000_123_456_789


@pytest.fixture(params=["VGW_ENDPOINT", "MOTO_ENDPOINT"], ids=["versitygw", "moto"])
def endpoint(request, s3_server) -> str:
    return s3_server.env[request.param]


@pytest.fixture
def prefix() -> str:
    return f"attrs-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def url(endpoint: str, prefix: str) -> str:
    return f"s3://test/{prefix}?endpoint_url={endpoint}"


@pytest.fixture
def client(s3_server, endpoint: str):
    """botocore on the same server: another client, and the judge of what is stored."""
    return s3_server.client(endpoint)


def backend_run(url: str, work: Callable[[Backend], Awaitable[T]]) -> T:
    """``work`` on a fresh backend (as after a remount: it has learned nothing yet)."""
    return run_with(url, work)


async def listed(backend: Backend, path: str = "/") -> dict[str, Entry]:
    return {entry.name: entry async for entry in backend.list(path)}


def stored_metadata(client, key: str) -> dict[str, str]:
    return client.head_object(Bucket="test", Key=key)["Metadata"]


def test_a_put_stores_its_attributes_as_s3fs_does_and_a_fresh_backend_sees_them(
        url, prefix, client):
    wanted = Attributes(mtime_ns=PAST_NS, mode=0o640, uid=1234, gid=99)

    async def put(backend: Backend) -> Entry:
        return await backend.put("/f", b"hello", wanted)

    put_entry = backend_run(url, put)
    assert (put_entry.mtime_ns, put_entry.mode, put_entry.uid, put_entry.gid) == (
        PAST_NS, 0o640, 1234, 99)
    assert stored_metadata(client, f"{prefix}/f") == {
        "mtime": "1500000000.123456789", "mode": str(stat.S_IFREG | 0o640), "uid": "1234",
        "gid": "99"}
    entry = backend_run(url, lambda backend: backend.stat("/f"))
    assert entry.kind is Kind.FILE and entry.size == 5
    assert (entry.mtime_ns, entry.mode, entry.uid, entry.gid) == (PAST_NS, 0o640, 1234, 99)


def test_a_put_without_attributes_stores_none_and_shows_last_modified(url, prefix, client):
    async def put_and_stat(backend: Backend) -> Entry:
        await backend.put("/plain", b"x")
        return await backend.stat("/plain")

    entry = backend_run(url, put_and_stat)
    head = client.head_object(Bucket="test", Key=f"{prefix}/plain")
    assert head["Metadata"] == {}
    assert entry.mtime_ns == int(head["LastModified"].timestamp()) * 10**9
    assert (entry.mode, entry.uid, entry.gid) == (None, None, None)


def test_a_multipart_upload_carries_its_attributes(url, prefix, client):
    data = random.Random(1).randbytes(5 * MiB + 7)
    wanted = Attributes(mtime_ns=PAST_NS, mode=0o600, uid=7, gid=8)

    async def upload(backend: Backend) -> Entry:
        upload = await backend.begin_upload("/big", wanted)
        await upload.write_part(1, 0, data[:5 * MiB])
        await upload.write_part(2, 5 * MiB, data[5 * MiB:])
        return await upload.commit(len(data))

    committed = backend_run(url, upload)
    assert (committed.mtime_ns, committed.mode, committed.uid, committed.gid) == (
        PAST_NS, 0o600, 7, 8)
    assert stored_metadata(client, f"{prefix}/big")["mode"] == str(stat.S_IFREG | 0o600)
    entry = backend_run(url, lambda backend: backend.stat("/big"))
    assert (entry.size, entry.mtime_ns, entry.mode, entry.uid, entry.gid) == (
        len(data), PAST_NS, 0o600, 7, 8)


def test_set_attributes_copies_in_place_keeping_content_etag_and_other_headers(
        url, prefix, client):
    key = f"{prefix}/f"
    client.put_object(Bucket="test", Key=key, Body=b"content", ContentType="text/plain",
                      Metadata={"color": "blue"})
    before = client.head_object(Bucket="test", Key=key)
    change = Attributes(mtime_ns=PAST_NS, mode=0o751, uid=501, gid=20)

    async def set_attributes(backend: Backend) -> Entry:
        return await backend.set_attributes("/f", await backend.stat("/f"), change)

    entry = backend_run(url, set_attributes)
    assert (entry.mtime_ns, entry.mode, entry.uid, entry.gid) == (PAST_NS, 0o751, 501, 20)
    assert entry.version == before["ETag"].strip('"')
    after = client.head_object(Bucket="test", Key=key)
    assert after["ETag"] == before["ETag"]
    assert after["ContentType"] == "text/plain"
    assert after["Metadata"] == {"color": "blue", "mtime": "1500000000.123456789",
                                 "mode": str(stat.S_IFREG | 0o751), "uid": "501", "gid": "20"}
    assert client.get_object(Bucket="test", Key=key)["Body"].read() == b"content"
    fresh = backend_run(url, lambda backend: backend.stat("/f"))
    assert (fresh.mtime_ns, fresh.mode, fresh.uid, fresh.gid) == (PAST_NS, 0o751, 501, 20)


def test_changing_the_mode_alone_keeps_the_time_an_object_had(url, prefix, client):
    """A ``chmod`` is no modification: an object that stored no time keeps showing its
    Last-Modified (now stored as mtime), although the copy gives it a new one."""
    key = f"{prefix}/old"
    client.put_object(Bucket="test", Key=key, Body=b"old")
    shown = int(client.head_object(Bucket="test", Key=key)["LastModified"].timestamp())
    time.sleep(1.1)

    async def chmod(backend: Backend) -> Entry:
        return await backend.set_attributes("/old", await backend.stat("/old"),
                                            Attributes(mode=0o600))

    entry = backend_run(url, chmod)
    assert entry.mode == 0o600 and entry.mtime_ns == shown * 10**9
    assert stored_metadata(client, key)["mtime"] == str(shown)
    assert backend_run(url, lambda backend: backend.stat("/old")).mtime_ns == shown * 10**9


def test_set_attributes_of_a_large_object_takes_the_multipart_copy(url, prefix, client,
                                                                    monkeypatch):
    """Above COPY_MAX (5 GiB, made tiny here) the copy goes part by part: the content stays."""
    monkeypatch.setattr(s3_backend, "COPY_MAX", MiB)
    monkeypatch.setattr(s3_backend, "COPY_PART", 5 * MiB)
    data = random.Random(2).randbytes(6 * MiB)
    key = f"{prefix}/large"
    client.put_object(Bucket="test", Key=key, Body=data, ContentType="application/x-hdf5",
                      Metadata={"run": "42"})

    async def set_attributes(backend: Backend) -> Entry:
        return await backend.set_attributes("/large", await backend.stat("/large"),
                                            Attributes(mtime_ns=PAST_NS, mode=0o444))

    entry = backend_run(url, set_attributes)
    assert (entry.size, entry.mtime_ns, entry.mode) == (len(data), PAST_NS, 0o444)
    head = client.head_object(Bucket="test", Key=key)
    assert head["ETag"].strip('"').endswith("-2"), "copied in two parts"
    assert entry.version == head["ETag"].strip('"')
    assert head["ContentType"] == "application/x-hdf5"
    assert head["Metadata"] == {"run": "42", "mtime": "1500000000.123456789",
                                "mode": str(stat.S_IFREG | 0o444)}
    body = client.get_object(Bucket="test", Key=key)["Body"].read()
    assert hashlib.md5(body).digest() == hashlib.md5(data).digest()


def test_a_directory_marker_keeps_the_directory_attributes(url, prefix, client):
    change = Attributes(mtime_ns=PAST_NS, mode=0o710, uid=42, gid=43)

    async def make(backend: Backend) -> tuple[Entry, dict[str, Entry]]:
        await backend.mkdir("/d")
        entry = await backend.set_attributes("/d", await backend.stat("/d"), change)
        return entry, await listed(backend)

    entry, shown = backend_run(url, make)
    assert entry.kind is Kind.DIR
    assert (entry.mtime_ns, entry.mode, entry.uid, entry.gid) == (PAST_NS, 0o710, 42, 43)
    assert (shown["d"].mtime_ns, shown["d"].mode) == (PAST_NS, 0o710), "listed as learned"
    assert stored_metadata(client, f"{prefix}/d/") == {
        "mtime": "1500000000.123456789", "mode": str(stat.S_IFDIR | 0o710), "uid": "42",
        "gid": "43"}
    fresh = backend_run(url, lambda backend: backend.stat("/d"))
    assert fresh.kind is Kind.DIR
    assert (fresh.mtime_ns, fresh.mode, fresh.uid, fresh.gid) == (PAST_NS, 0o710, 42, 43)


def test_a_bare_prefix_and_the_root_keep_nothing_and_get_no_marker(url, prefix, client):
    client.put_object(Bucket="test", Key=f"{prefix}/bare/x", Body=b"x")
    change = Attributes(mtime_ns=PAST_NS, mode=0o700)

    async def try_both(backend: Backend) -> tuple[Entry, Entry, Entry, Entry]:
        bare, root = await backend.stat("/bare"), await backend.stat("/")
        return (bare, await backend.set_attributes("/bare", bare, change),
                root, await backend.set_attributes("/", root, change))

    bare, bare_after, root, root_after = backend_run(url, try_both)
    assert bare_after == bare and root_after == root
    assert bare_after.mode is None and bare_after.mtime_ns != PAST_NS
    keys = [item["Key"] for item in
            client.list_objects_v2(Bucket="test", Prefix=f"{prefix}/")["Contents"]]
    assert keys == [f"{prefix}/bare/x"]


def test_symlinks_are_s3fs_objects_read_back_by_a_fresh_backend(url, prefix, client):
    target = "../data/run 7/frame.gwf"

    async def make(backend: Backend) -> tuple[Entry, str, dict[str, Entry]]:
        entry = await backend.symlink("/link", target)
        with pytest.raises(errors.AlreadyExists):
            await backend.symlink("/link", "elsewhere")
        return entry, await backend.readlink("/link", entry), await listed(backend)

    made, read, shown = backend_run(url, make)
    assert made.kind is Kind.SYMLINK and made.size == len(target.encode())
    assert read == target
    assert shown["link"].kind is Kind.SYMLINK, "the backend knows the link it made"
    head = client.head_object(Bucket="test", Key=f"{prefix}/link")
    assert head["Metadata"]["mode"] == str(stat.S_IFLNK | 0o777)
    assert client.get_object(Bucket="test", Key=f"{prefix}/link")["Body"].read() == \
        target.encode()

    async def fresh(backend: Backend) -> tuple[Entry, Entry, str]:
        # A listing cannot see the mode: a link not stat-ed yet is listed as a file.
        first_listed = (await listed(backend))["link"]
        entry = await backend.stat("/link")
        return first_listed, entry, await backend.readlink("/link", entry)

    first_listed, entry, read = backend_run(url, fresh)
    assert first_listed.kind is Kind.FILE
    assert entry.kind is Kind.SYMLINK and entry.size == len(target.encode())
    assert entry.mode == 0o777 and read == target

    async def remove(backend: Backend) -> None:
        await backend.unlink("/link")
        with pytest.raises(errors.NotFound):
            await backend.stat("/link")

    backend_run(url, remove)


def test_a_link_object_too_long_for_a_target_is_an_error(url, prefix, client):
    client.put_object(Bucket="test", Key=f"{prefix}/long", Body=b"x" * 5000,
                      Metadata={"mode": str(stat.S_IFLNK | 0o777)})

    async def read(backend: Backend) -> None:
        entry = await backend.stat("/long")
        assert entry.kind is Kind.SYMLINK
        await backend.readlink("/long", entry)

    with pytest.raises(errors.Unavailable, match="too long"):
        backend_run(url, read)


def test_listings_show_learned_attributes_until_the_object_changes(url, prefix, client):
    key = f"{prefix}/f"

    async def learn(backend: Backend) -> tuple[Entry, Entry]:
        await backend.put("/f", b"data")
        changed = await backend.set_attributes("/f", await backend.stat("/f"),
                                               Attributes(mtime_ns=PAST_NS, mode=0o600))
        return changed, (await listed(backend))["f"]

    changed, shown = backend_run(url, learn)
    assert (shown.mtime_ns, shown.mode) == (PAST_NS, 0o600) == (changed.mtime_ns, changed.mode)

    async def outdated(backend: Backend) -> tuple[Entry, Entry, Entry]:
        await backend.stat("/f")  # learned
        await trio.sleep(1.1)  # the next change has another Last-Modified second
        # The same bytes again with other metadata (versitygw keeps Last-Modified through a
        # copy onto itself, so that change would not show: a documented limit).
        metadata = {"mtime": "1600000000", "mode": str(stat.S_IFREG | 0o644)}
        client.put_object(Bucket="test", Key=key, Body=b"data", Metadata=metadata)
        stale = (await listed(backend))["f"]
        fresh = await backend.stat("/f")
        return stale, fresh, (await listed(backend))["f"]

    stale, fresh, relisted = backend_run(url, outdated)
    modified = client.head_object(Bucket="test", Key=key)["LastModified"]
    assert stale.mtime_ns == int(modified.timestamp()) * 10**9 and stale.mode is None, \
        "another client's change: the listing shows what it says, not what was learned"
    assert (fresh.mtime_ns, fresh.mode) == (1_600_000_000 * 10**9, 0o644)
    assert (relisted.mtime_ns, relisted.mode) == (fresh.mtime_ns, fresh.mode)


def test_the_memo_honours_the_cache_switches(url):
    async def check(backend: Backend) -> tuple[Entry, Entry, Entry]:
        await backend.put("/f", b"data", Attributes(mtime_ns=PAST_NS, mode=0o600))
        remembered = (await listed(backend))["f"]
        backend.drop_caches()
        dropped = (await listed(backend))["f"]
        backend.use_caches(False)
        await backend.stat("/f")
        return remembered, dropped, (await listed(backend))["f"]

    remembered, dropped, uncached = backend_run(url, check)
    assert (remembered.mtime_ns, remembered.mode) == (PAST_NS, 0o600)
    assert dropped.mode is None and dropped.mtime_ns != PAST_NS
    assert uncached.mode is None and uncached.mtime_ns != PAST_NS


def test_a_rename_keeps_metadata_headers_and_time(url, prefix, client):
    client.put_object(Bucket="test", Key=f"{prefix}/foreign", Body=b"f", ContentType="image/png",
                      Metadata={"color": "red"})
    shown = int(client.head_object(Bucket="test",
                                   Key=f"{prefix}/foreign")["LastModified"].timestamp())
    time.sleep(1.1)  # a copy now has another Last-Modified

    async def rename(backend: Backend) -> tuple[Entry, Entry]:
        await backend.put("/mine", b"m", Attributes(mtime_ns=PAST_NS, mode=0o604, uid=3))
        mine = await backend.rename("/mine", "/mine2", await backend.stat("/mine"))
        return mine, await backend.rename("/foreign", "/foreign2",
                                          await backend.stat("/foreign"))

    mine, foreign = backend_run(url, rename)
    assert (mine.name, mine.mtime_ns, mine.mode, mine.uid) == ("mine2", PAST_NS, 0o604, 3)
    assert foreign.mtime_ns == shown * 10**9
    head = client.head_object(Bucket="test", Key=f"{prefix}/foreign2")
    assert head["ContentType"] == "image/png"
    assert head["Metadata"] == {"color": "red", "mtime": str(shown)}

    async def fresh(backend: Backend) -> tuple[Entry, Entry]:
        return await backend.stat("/mine2"), await backend.stat("/foreign2")

    mine, foreign = backend_run(url, fresh)
    assert (mine.mtime_ns, mine.mode, mine.uid) == (PAST_NS, 0o604, 3)
    assert foreign.mtime_ns == shown * 10**9


def test_attribute_headers_are_no_extended_attributes(url, prefix, client):
    """``stat`` shows them; as ``user.s3.meta.*`` a ``cp -a`` would set each again."""

    async def check(backend: Backend) -> dict[str, bytes]:
        entry = await backend.put("/f", b"x", Attributes(mtime_ns=PAST_NS, mode=0o600))
        entry = await backend.set_xattr("/f", entry, "s3.meta.color", b"green")
        assert (entry.mtime_ns, entry.mode) == (PAST_NS, 0o600), "kept by the copy"
        with pytest.raises(errors.NotPermitted):
            await backend.set_xattr("/f", entry, "s3.meta.mode", b"33279")
        return dict(await backend.xattrs("/f", entry))

    shown = backend_run(url, check)
    assert {name for name in shown if name.startswith("s3.meta.")} == {"s3.meta.color"}
    assert stored_metadata(client, f"{prefix}/f") == {
        "color": "green", "mtime": "1500000000.123456789", "mode": str(stat.S_IFREG | 0o600)}


def test_objects_written_by_s3fs_and_rclone_are_read_right(url, prefix, client):
    objects = {
        # s3fs: decimal mode with type bits, integer time
        "s3fs": {"mode": "33261", "mtime": "1700000000", "uid": "1000", "gid": "100"},
        "s3fs-ns": {"mode": "33188", "mtime": "1700000000.000000005"},
        "s3fs-link": {"mode": "41471", "mtime": "1700000000"},
        # rclone: decimal seconds with the trailing zeros dropped, octal mode (--metadata)
        "rclone": {"mtime": "1700000000.5", "mode": "100640", "uid": "1001", "gid": "1002"},
        "rclone-link": {"mode": "120777"},
        "leading-zero": {"mode": "0600"},
        "nonsense": {"mode": "rw-r--r--", "mtime": "yesterday", "uid": "-1"},
    }
    for name, metadata in objects.items():
        client.put_object(Bucket="test", Key=f"{prefix}/{name}", Body=b"x",
                          Metadata=metadata)
    markers = {"s3fs-dir": {"mode": "493"}, "rclone-dir": {"mode": "42750"},
               "s3fs-typed-dir": {"mode": "16832", "mtime": "1700000001"}}
    for name, metadata in markers.items():
        client.put_object(Bucket="test", Key=f"{prefix}/{name}/", Body=b"", Metadata=metadata)

    async def stat_all(backend: Backend) -> dict[str, Entry]:
        return {name: await backend.stat(f"/{name}") for name in [*objects, *markers]}

    seen = backend_run(url, stat_all)
    second = 1_700_000_000 * 10**9
    shown = {name: (e.kind, e.mtime_ns if name != "nonsense" else None, e.mode, e.uid, e.gid)
             for name, e in seen.items()}
    assert shown == {
        "s3fs": (Kind.FILE, second, 0o755, 1000, 100),
        "s3fs-ns": (Kind.FILE, second + 5, 0o644, None, None),
        "s3fs-link": (Kind.SYMLINK, second, 0o777, None, None),
        "rclone": (Kind.FILE, second + 500_000_000, 0o640, 1001, 1002),
        "rclone-link": (Kind.SYMLINK, seen["rclone-link"].mtime_ns, 0o777, None, None),
        "leading-zero": (Kind.FILE, seen["leading-zero"].mtime_ns, 0o600, None, None),
        "nonsense": (Kind.FILE, None, None, None, None),
        "s3fs-dir": (Kind.DIR, seen["s3fs-dir"].mtime_ns, 0o755, None, None),
        "rclone-dir": (Kind.DIR, seen["rclone-dir"].mtime_ns, 0o2750, None, None),
        "s3fs-typed-dir": (Kind.DIR, second + 10**9, 0o700, None, None),
    }
    last_modified = client.head_object(Bucket="test", Key=f"{prefix}/nonsense")["LastModified"]
    assert seen["nonsense"].mtime_ns == int(last_modified.timestamp()) * 10**9


@pytest.mark.parametrize(("text", "kind", "mode"), [
    ("33188", Kind.FILE, 0o100644),      # s3fs
    ("100644", Kind.FILE, 0o100644),     # rclone
    ("41471", Kind.FILE, 0o120777),      # s3fs symlink
    ("120777", Kind.FILE, 0o120777),     # rclone symlink
    ("420", Kind.FILE, 0o644),           # no type bits: decimal
    ("0644", Kind.FILE, 0o644),          # leading zero: octal
    ("16877", Kind.DIR, 0o40755),        # s3fs marker
    ("41777", Kind.DIR, 0o41777),        # rclone sticky directory (decimal would be a link)
    ("16877", Kind.FILE, None),          # a directory's mode on an object
    ("99999999", Kind.FILE, None),
    ("", Kind.FILE, None),
])
def test_mode_values_of_both_tools(text, kind, mode):
    assert parse_mode(text, kind) == mode


@pytest.mark.parametrize(("text", "ns"), [
    ("1700000000", 1_700_000_000 * 10**9),
    ("1700000000.5", 1_700_000_000_500_000_000),
    ("1700000000.123456789", 1_700_000_000_123_456_789),
    ("1700000000.1234567891", 1_700_000_000_123_456_789),
    ("-1.5", -1_500_000_000),
    ("1.7e9", None),
    ("", None),
])
def test_mtime_values_of_both_tools(text, ns):
    assert parse_mtime(text) == ns


@pytest.mark.parametrize("ns", [0, 1, PAST_NS, 1_700_000_000 * 10**9, -1, -1_500_000_000])
def test_written_times_read_back_exactly(ns):
    text = format_mtime(ns)
    assert parse_mtime(text) == ns
    assert "." not in text or len(text.partition(".")[2]) == 9, "s3fs reads 9 digits only"


def test_a_marker_never_reads_as_a_link_or_a_file():
    assert read_attributes({"mode": "33188"}, marker=True).mode is None
    assert read_attributes({"mode": "120777"}, marker=True).mode is None
    assert read_attributes({"mode": "16877"}, marker=True).kind is Kind.DIR
    assert read_attributes({"mode": "41471"}, marker=False).kind is Kind.SYMLINK


# -- errors ------------------------------------------------------------------------------------

ERRORS = {
    "/test/quota-minio": (400, "XMinioAdminBucketQuotaExceeded", errors.QuotaExceeded),
    "/test/quota-ceph": (403, "QuotaExceeded", errors.QuotaExceeded),
    "/test/full": (507, "XMinioStorageFull", errors.NoSpace),
    "/test/denied": (403, "AccessDenied", errors.PermissionDenied),
    "/test/bad": (400, "InvalidArgument", errors.Unavailable),
}


@pytest.fixture
def erring_server() -> Iterator[str]:
    """An S3 lookalike answering each path of :data:`ERRORS` with its error (and an empty
    listing of the bucket, for the start-up check)."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def answer(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            self.rfile.read(length)
            path = self.path.partition("?")[0]
            if path in ERRORS:
                status, code, _ = ERRORS[path]
                body = (f"<?xml version='1.0'?><Error><Code>{code}</Code>"
                        f"<Message>refused</Message></Error>").encode()
            else:
                status, body = 200, (b"<?xml version='1.0'?><ListBucketResult>"
                                     b"<IsTruncated>false</IsTruncated></ListBucketResult>")
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_PUT = do_POST = answer

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("path", list(ERRORS))
def test_s3_error_codes_are_the_errors_they_mean(erring_server, path):
    _, code, expected = ERRORS[path]

    async def put(backend: Backend) -> None:
        with pytest.raises(errors.RucioFsError) as caught:
            await backend.put(path.removeprefix("/test"), b"data")
        assert type(caught.value) is expected, caught.value
        assert code in str(caught.value)

    backend_run(f"s3://test?endpoint_url={erring_server}&anonymous=1", put)


def test_an_error_in_a_200_answer_is_the_error_its_code_means():
    """S3 may fail a CompleteMultipartUpload after answering 200: the body says why."""
    body = b"<Error><Code>XMinioAdminBucketQuotaExceeded</Code><Message>m</Message></Error>"
    with pytest.raises(errors.QuotaExceeded):
        result(httpx.Response(200, content=body), "complete k")
    with pytest.raises(errors.Unavailable, match="InternalError"):
        result(httpx.Response(200, content=b"<Error><Code>InternalError</Code></Error>"), "k")


def test_an_upload_its_time_and_its_rename_cost_no_head(url, prefix, client):
    """What `rsync -a` does with each file: upload a temporary name, set its time, rename it.
    The PUT's answer proves the upload and tells what a HEAD would; each copy keeps the HEAD
    of its own result, and nothing of the foreign metadata or content headers is lost on the
    way: one request per step (PUT, copy, copy, DELETE)."""

    async def rsync_like(backend: Backend) -> tuple[Entry, dict[str, int]]:
        started = backend.counters()["api_requests"]
        sent = await backend.put("/.f.XXXX", b"content", Attributes(mode=0o600))
        entry = await backend.confirm("/.f.XXXX", sent)
        entry = await backend.set_attributes("/.f.XXXX", entry,
                                             Attributes(mtime_ns=PAST_NS, mode=0o640))
        moved = await backend.rename("/.f.XXXX", "/f", entry)
        return moved, {**backend.counters(),
                       "sent": backend.counters()["api_requests"] - started}

    moved, counters = backend_run(url, rsync_like)
    assert (counters["confirmed_by_put"], counters["heads_saved"]) == (1, 2), counters
    assert counters["sent"] == 4, counters
    assert (moved.mtime_ns, moved.mode) == (PAST_NS, 0o640)
    assert stored_metadata(client, f"{prefix}/f") == {
        "mtime": format_mtime(PAST_NS), "mode": str(stat.S_IFREG | 0o640)}
    assert client.get_object(Bucket="test", Key=f"{prefix}/f")["Body"].read() == b"content"


def test_a_small_upload_is_one_request_unless_its_put_was_sent_again(endpoint, prefix,
                                                                      client):
    """A PUT answered on its first send with the MD5 of its body is proved by that answer:
    no HEAD. One sent again after a failure (the failed send may have done the work, or the
    answer may not be the server's) is proved by a HEAD, which finds what the server holds."""
    from fault_proxy import fault_proxy

    async def upload(backend: Backend) -> dict[str, int]:
        started = backend.counters()["api_requests"]
        for name in ("/first", "/again"):
            sent = await backend.put(name, name.encode(), Attributes(mode=0o600))
            await backend.confirm(name, sent)
        return {**backend.counters(), "sent": backend.counters()["api_requests"] - started}

    with fault_proxy(endpoint) as proxy:
        proxy.inject("error", "/again", times=1, method="PUT")
        counters = run_with(f"s3://test/{prefix}?endpoint_url={proxy.url}", upload)
    assert counters["confirmed_by_put"] == 1, counters
    assert counters["sent"] == 1 + 3, counters  # PUT; PUT, PUT again, HEAD
    for name in ("first", "again"):
        assert client.get_object(Bucket="test", Key=f"{prefix}/{name}")["Body"].read() == \
            f"/{name}".encode()


def test_a_kept_head_of_another_version_is_not_used(url, prefix, client):
    """An object replaced by another client since the mount's HEAD (another ETag): the
    metadata copy asks the server again, and keeps what that client stored."""

    async def change(backend: Backend) -> Entry:
        sent = await backend.put("/f", b"mine", Attributes(mode=0o600))
        await backend.confirm("/f", sent)
        client.put_object(Bucket="test", Key=f"{prefix}/f", Body=b"theirs",
                          Metadata={"color": "blue"})
        entry = await backend.stat("/f")
        return await backend.set_attributes("/f", entry, Attributes(mode=0o644))

    backend_run(url, change)
    metadata = stored_metadata(client, f"{prefix}/f")
    assert metadata["color"] == "blue" and metadata["mode"] == str(stat.S_IFREG | 0o644)


def test_a_new_directory_takes_its_times_and_modes_without_a_head(url, prefix, client):
    """What `rsync -a` does with each directory: make it, set its time and mode, fill it,
    set its time again. The marker's PUT and each copy keep what a HEAD would answer, also
    after many other objects went up in between (rsync makes a tree's directories first)."""

    async def rsync_like(backend: Backend) -> tuple[Entry, int]:
        entry = await backend.mkdir("/d", Attributes(mode=0o700))
        entry = await backend.set_attributes("/d", entry, Attributes(mtime_ns=PAST_NS))
        entry = await backend.set_attributes("/d", entry, Attributes(mode=0o750))
        for i in range(1100):  # more than the old bound of kept HEADs
            sent = await backend.put(f"/d/f{i}", b"x")
            await backend.confirm(f"/d/f{i}", sent)
        entry = await backend.set_attributes("/d", entry, Attributes(mtime_ns=PAST_NS + 10**9))
        return entry, backend.counters()["heads_saved"]

    entry, saved = backend_run(url, rsync_like)
    assert saved == 3
    assert (entry.mtime_ns, entry.mode) == (PAST_NS + 10**9, 0o750)
    assert stored_metadata(client, f"{prefix}/d/") == {
        "mtime": format_mtime(PAST_NS + 10**9), "mode": str(stat.S_IFDIR | 0o750)}


def test_a_marker_removed_by_another_client_keeps_the_change_for_the_mount(url, prefix,
                                                                          client):
    """The kept HEAD of a marker another client deleted since: the change is kept for the
    mount's life, as for a directory that is only a prefix (no error, no marker made)."""

    async def change(backend: Backend) -> Entry:
        entry = await backend.mkdir("/d", Attributes(mode=0o700))
        await backend.put("/d/f", b"x")
        client.delete_object(Bucket="test", Key=f"{prefix}/d/")
        return await backend.set_attributes("/d", entry, Attributes(mode=0o750))

    entry = backend_run(url, change)
    assert entry.is_dir
    keys = [item["Key"] for item in
            client.list_objects_v2(Bucket="test", Prefix=f"{prefix}/").get("Contents", [])]
    assert keys == [f"{prefix}/d/f"]


def test_a_listed_name_is_completed_by_one_head(url, prefix, client):
    """A listing shows the stored attributes of neither files nor directories: ``complete``
    asks one HEAD (the key's, or the marker's) where ``stat`` sends a LIST too; a key gone
    since the listing is what ``stat`` says (NotFound)."""
    client.put_object(Bucket="test", Key=f"{prefix}/d/", Body=b"",
                      Metadata={"mode": str(stat.S_IFDIR | 0o750)})
    client.put_object(Bucket="test", Key=f"{prefix}/f", Body=b"x",
                      Metadata={"mode": str(stat.S_IFREG | 0o600), "mtime": "1500000000"})
    client.put_object(Bucket="test", Key=f"{prefix}/gone", Body=b"x")

    async def complete(backend: Backend) -> tuple[dict[str, Entry], int]:
        entries = await listed(backend)
        assert not any(entry.complete for entry in entries.values())
        before = backend.counters()["api_requests"]
        shown = {name: await backend.complete(f"/{name}", entries[name]) for name in "df"}
        requests = backend.counters()["api_requests"] - before
        client.delete_object(Bucket="test", Key=f"{prefix}/gone")
        with pytest.raises(errors.NotFound):
            await backend.complete("/gone", entries["gone"])
        return shown, requests

    shown, requests = backend_run(url, complete)
    assert requests == 2
    assert (shown["d"].is_dir, shown["d"].mode) == (True, 0o750)
    assert (shown["f"].mode, shown["f"].mtime_ns) == (0o600, 1_500_000_000 * 10**9)


# -- attributes kept in --cache-dir for the next mount ----------------------------------------


def kept_run(url: str, state: Path, work: Callable[[Backend], Awaitable[T]]) -> T:
    """``work`` on a fresh backend that keeps its state in ``state`` (``--cache-dir``): it
    starts from what the last one kept there, and keeps what it learned when it closes."""

    async def main() -> T:
        backend = open_backend(url)
        backend.keep_state_in(state)
        await backend.start()
        try:
            return await work(backend)
        finally:
            await backend.aclose()

    return trio.run(main)


def requests(backend: Backend) -> int:
    return backend.counters()["api_requests"]


async def learn_a_file_and_a_directory(backend: Backend) -> None:
    await backend.put("/f", b"data", Attributes(mtime_ns=PAST_NS, mode=0o600))
    await backend.mkdir("/d", Attributes(mtime_ns=PAST_NS, mode=0o750))
    await backend.put("/d/g", b"g", Attributes(mtime_ns=PAST_NS, mode=0o640))
    await backend.stat("/f")
    await backend.stat("/d")  # Last-Modified of both learned, as a walk does
    await listed(backend, "/d")


def test_a_later_mount_shows_kept_attributes_of_unchanged_objects_without_a_head(
        url, tmp_path):
    """`rsync -a` again into a tree copied before, on a new mount with the same
    ``--cache-dir``: the listing shows what the files store, with no HEAD per file (a
    directory still gets the HEAD of its marker)."""
    state = tmp_path / "state"
    kept_run(url, state, learn_a_file_and_a_directory)

    async def again(backend: Backend) -> tuple[Entry, Entry, Entry, int]:
        before = requests(backend)
        root = await listed(backend)
        directory = await backend.complete("/d", root["d"])
        inside = await listed(backend, "/d")
        return root["f"], directory, inside["g"], requests(backend) - before

    f, d, g, sent = kept_run(url, state, again)
    assert f.complete and (f.mtime_ns, f.mode) == (PAST_NS, 0o600)
    assert (d.mtime_ns, d.mode) == (PAST_NS, 0o750)
    assert g.complete and (g.mtime_ns, g.mode) == (PAST_NS, 0o640)
    assert sent == 3  # the root's listing, d's marker's HEAD, d's listing


def test_uploads_never_listed_are_kept_for_the_next_mount(url, prefix, client, tmp_path):
    """`rsync -a` into a new tree, then again on a new mount: the files this mount uploaded
    were never listed or asked for (the answer to their PUT proves them), yet the next mount
    shows what they store without a HEAD apiece: the PUT's answer was dated, and an object
    last modified by then is the one uploaded. The same bytes written again later by another
    client, with other attributes, are not taken for it."""
    state = tmp_path / "state"

    async def upload(backend: Backend) -> None:
        for name in ("a", "b"):
            await backend.put(f"/{name}", b"same", Attributes(mtime_ns=PAST_NS, mode=0o600))

    kept_run(url, state, upload)
    time.sleep(DATE_LAG_S + 1.1)  # a Last-Modified after the PUT's answer, give or take
    client.put_object(Bucket="test", Key=f"{prefix}/b", Body=b"same",
                      Metadata={"mtime": "1600000000", "mode": str(stat.S_IFREG | 0o644)})

    async def again(backend: Backend) -> tuple[dict[str, Entry], int]:
        before = requests(backend)
        return await listed(backend), requests(backend) - before

    shown, sent = kept_run(url, state, again)
    assert sent == 1  # the listing
    assert shown["a"].complete and (shown["a"].mtime_ns, shown["a"].mode) == (PAST_NS, 0o600)
    assert not shown["b"].complete  # its HEAD tells what it stores now


def test_kept_attributes_of_objects_changed_since_are_not_shown(url, prefix, client,
                                                                 tmp_path):
    """Another client rewrote the file and the marker between two mounts: the next mount
    shows what they store now, never what was kept."""
    state = tmp_path / "state"
    kept_run(url, state, learn_a_file_and_a_directory)
    time.sleep(1.1)  # another Last-Modified second
    theirs = {"mtime": "1600000000", "mode": str(stat.S_IFREG | 0o644)}
    client.put_object(Bucket="test", Key=f"{prefix}/f", Body=b"data", Metadata=theirs)
    client.put_object(Bucket="test", Key=f"{prefix}/d/", Body=b"",
                      Metadata={"mtime": "1600000000", "mode": str(stat.S_IFDIR | 0o700)})

    async def again(backend: Backend) -> tuple[Entry, Entry]:
        root = await listed(backend)
        assert not root["f"].complete  # its HEAD is needed
        return (await backend.complete("/f", root["f"]),
                await backend.complete("/d", root["d"]))

    f, d = kept_run(url, state, again)
    assert (f.mtime_ns, f.mode) == (1_600_000_000 * 10**9, 0o644)
    assert (d.mtime_ns, d.mode) == (1_600_000_000 * 10**9, 0o700)


def test_damaged_kept_attributes_cost_a_head_and_nothing_else(url, tmp_path):
    """Kept records that do not parse, or a kept file cut short, are no error: the objects
    are shown as their listing says, and a HEAD tells what they store."""
    state = tmp_path / "state"
    kept_run(url, state, learn_a_file_and_a_directory)
    (kept,) = state.glob("attributes-*.json")
    value = json.loads(kept.read_text())
    value["records"] = [["junk"], 7, *[[*r[:3], "no such kind", *r[4:]]
                                       for r in value["records"]]]
    kept.write_text(json.dumps(value))

    async def shown(backend: Backend) -> tuple[Entry, Entry]:
        listed_f = (await listed(backend))["f"]
        return listed_f, await backend.complete("/f", listed_f)

    for damage in ("records", "file"):
        if damage == "file":
            kept.write_text(kept.read_text()[:20])
        as_listed, completed = kept_run(url, state, shown)
        assert not as_listed.complete
        assert (completed.mtime_ns, completed.mode) == (PAST_NS, 0o600)
