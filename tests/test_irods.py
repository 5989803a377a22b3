"""The iRODS backend through real mounts against the iRODS HTTP API: the fake
(``rucio_fs/testing/irods_fake.py``), or a real server when ``RUCIO_FS_TEST_IRODS_URL`` is set
(tests that need the fake's controls say so and are skipped there)."""

from __future__ import annotations

import base64
import errno
import hashlib
import os
import random
import stat
import subprocess
import time

import pytest
from conftest import free_ports, run_cli, start_irods_fake, wait_for

from rucio_fs.backend import Attributes, Entry
from rucio_fs.errors import NoSpace, PermissionDenied, QuotaExceeded
from rucio_fs.testing.conformance import run_with

MiB = 1 << 20


def mount_irods(mount_fs, server, collection: str, *options: str):
    return mount_fs(server.url(collection), "--xattrs", *options)


def counters(mnt) -> dict:
    return mnt.stats()["backend_counters"]


def test_listing_10000_entries_takes_two_queries_and_reads_verify(mount_fs, irods_server):
    collection = irods_server.collection("many")
    files = {f"obj{i:05d}.dat": f"object {i}\n".encode() * (i % 7 + 1) for i in range(10_000)}
    files.update({f"sub{i}/inner.txt": f"inner {i}\n".encode() for i in range(3)})
    irods_server.seed(collection, files)
    mnt = mount_irods(mount_fs, irods_server, collection)
    before = counters(mnt).get("queries_genquery2", 0)
    with os.scandir(mnt.path) as listing:
        entries = {e.name: e.stat() for e in listing}
    queries = counters(mnt)["queries_genquery2"] - before
    assert queries == 2, f"one data-object and one collection query, made {queries}"
    assert len(entries) == 10_003
    assert {n: s.st_size for n, s in entries.items() if n.startswith("obj")} == {
        n: len(d) for n, d in files.items() if n.startswith("obj")}
    assert all(entries[f"sub{i}"].st_mode & 0o040000 for i in range(3))
    for name in random.Random(7).sample(sorted(n for n in files if "/" not in n), 20):
        assert (mnt.path / name).read_bytes() == files[name]
    assert (mnt.path / "sub2" / "inner.txt").read_bytes() == b"inner 2\n"


def test_a_collection_larger_than_a_page_is_paged_never_truncated(mount_fs, irods_server):
    collection = irods_server.collection("paged")
    files = {f"f{i:04d}": b"x" * i for i in range(2_500)}
    irods_server.seed(collection, files)
    mnt = mount_irods(mount_fs, irods_server, collection, "-o", "page_rows=1000")
    before = counters(mnt).get("queries_genquery2", 0)
    assert sorted(os.listdir(mnt.path)) == sorted(files)
    # 3 keyset pages of data objects (1,000 + 1,000 + 500) and 1 of collections
    assert counters(mnt)["queries_genquery2"] - before == 4
    assert os.stat(mnt.path / "f2499").st_size == 2499


def test_genquery1_fallback_pages_at_the_row_cap_and_takes_the_good_replica(mount_fs,
                                                                            irods_server):
    irods_server.require_fake()
    collection = irods_server.collection("gq1")
    files = {f"g{i:03d}.txt": f"gq1 {i}\n".encode() for i in range(100)}
    irods_server.seed(collection, files,
                      stale={"g005.txt": {"size": 999_999, "mtime": int(time.time()) + 60}})
    irods_server.configure(gq2=False)
    try:
        mnt = mount_irods(mount_fs, irods_server, collection)
        at_mount = counters(mnt)
        names = sorted(os.listdir(mnt.path))
        assert names == sorted(files)
        # the stale replica is newer and bigger; the good one is what the file is
        assert os.stat(mnt.path / "g005.txt").st_size == len(files["g005.txt"])
        assert (mnt.path / "g005.txt").read_bytes() == files["g005.txt"]
        after = counters(mnt)
        assert after.get("queries_genquery2", 0) == at_mount.get("queries_genquery2", 0)
        # 101 data-object rows (a stale replica included) at 15 per request take 7 pages,
        # fetched in windows of 1, 2 and 4; the collection query 1 more
        assert after["queries_genquery1"] - at_mount["queries_genquery1"] == 7 + 1
        assert "listing with genquery1" in mnt.log_text()
    finally:
        irods_server.configure(gq2=True)


def test_reads_of_all_sizes_and_checksums_verified(mount_fs, irods_server):
    irods_server.require_fake()
    collection = irods_server.collection("reads")
    rng = random.Random(3)
    files = {"empty": b"", "one": b"1", "three-mib": rng.randbytes(3 * MiB + 17),
             "good-sum": rng.randbytes(2 * MiB), "bad-sum": rng.randbytes(300_000)}
    good = "sha2:" + base64.b64encode(hashlib.sha256(files["good-sum"]).digest()).decode()
    bad = "sha2:" + base64.b64encode(hashlib.sha256(b"something else").digest()).decode()
    irods_server.seed(collection, files, checksums={"good-sum": good, "bad-sum": bad})
    mnt = mount_irods(mount_fs, irods_server, collection)
    for name in ("empty", "one", "three-mib", "good-sum"):
        assert (mnt.path / name).read_bytes() == files[name], name
    assert os.getxattr(mnt.path / "good-sum", "user.irods.checksum").decode() == good
    with pytest.raises(OSError) as raised:
        (mnt.path / "bad-sum").read_bytes()
    assert raised.value.errno == errno.EIO
    assert "the data gives" in mnt.log_text()  # the verifier's mismatch report


@pytest.mark.parametrize("size", [0, MiB, 50 * MiB])
def test_written_files_are_stored_byte_identical(mount_fs, irods_server, tmp_path, size):
    collection = irods_server.collection("writes")
    mnt = mount_irods(mount_fs, irods_server, collection)
    if irods_server.fake:
        irods_server.reset_stats()
    data = random.Random(size).randbytes(size)
    source = tmp_path / "source"
    source.write_bytes(data)
    subprocess.run(["cp", str(source), str(mnt.path / "copy.bin")], check=True)
    # (an empty new file is stored at its last release, which follows close())
    wait_for(lambda: irods_server.read(f"{collection}/copy.bin") == data)
    assert (mnt.path / "copy.bin").read_bytes() == data
    assert os.stat(mnt.path / "copy.bin").st_size == size
    if irods_server.fake:
        stats = irods_server.stats()
        inits = stats["counts"].get("POST /data-objects parallel_write_init", 0)
        assert inits == (1 if size > 8 * MiB else 0)
        assert stats["counts"].get("POST /data-objects parallel_write_shutdown", 0) == inits
        assert stats["open_handles"] == 0
        assert stats["counts"].get("POST /data-objects write", 0) == (
            -(-size // (8 * MiB)) if size else 0)


def test_a_large_file_with_a_unicode_name_fits_the_body_limit(mount_fs, irods_server):
    """Such paths go as multipart forms (method 1), whose overhead counts against the
    server's request body limit too."""
    collection = irods_server.collection("unicode-big")
    mnt = mount_irods(mount_fs, irods_server, collection)
    data = random.Random(5).randbytes(20 * MiB)
    (mnt.path / "größe-ü.bin").write_bytes(data)
    assert irods_server.read(f"{collection}/größe-ü.bin") == data


def test_avus_round_trip_through_xattrs(mount_fs, irods_server):
    collection = irods_server.collection("avus")
    irods_server.seed(collection, {"data.txt": b"metadata\n"})
    mnt = mount_irods(mount_fs, irods_server, collection)
    path = mnt.path / "data.txt"
    os.setxattr(path, "user.irods.experiment", b"LIGO")
    os.setxattr(path, "user.irods.length", b"100")
    os.setxattr(path, "user.irods.length@units", b"m")
    os.setxattr(path, "user.irods.tags", b"alpha\nbeta")
    assert irods_server.avus(f"{collection}/data.txt") == [
        ("experiment", "LIGO", ""), ("length", "100", "m"), ("tags", "alpha", ""),
        ("tags", "beta", "")]
    assert os.getxattr(path, "user.irods.length") == b"100"
    assert os.getxattr(path, "user.irods.length@units") == b"m"
    assert os.getxattr(path, "user.irods.tags") == b"alpha\nbeta"
    assert "user.irods.experiment" in os.listxattr(path)
    os.setxattr(path, "user.irods.length", b"200")  # a new value keeps the units
    os.removexattr(path, "user.irods.tags")
    assert irods_server.avus(f"{collection}/data.txt") == [
        ("experiment", "LIGO", ""), ("length", "200", "m")]
    with pytest.raises(OSError) as raised:
        os.removexattr(path, "user.irods.absent")
    assert raised.value.errno == errno.ENODATA
    with pytest.raises(OSError) as raised:
        os.setxattr(path, "user.irods.checksum", b"sha2:forged")
    assert raised.value.errno == errno.EPERM
    directory = mnt.path / "tagged"
    directory.mkdir()
    os.setxattr(directory, "user.irods.run", b"O4")
    assert os.getxattr(directory, "user.irods.run") == b"O4"


def test_namespace_operations(mount_fs, irods_server):
    collection = irods_server.collection("names")
    irods_server.seed(collection, {"a.txt": b"a\n", "b.txt": b"b\n", "full/x": b"x"})
    mnt = mount_irods(mount_fs, irods_server, collection)
    root = mnt.path
    (root / "dir").mkdir()
    (root / "dir" / "inside.txt").write_bytes(b"inside\n")
    os.rename(root / "dir", root / "moved")  # a whole collection, in place
    assert irods_server.kind(f"{collection}/moved") == "collection"
    assert irods_server.kind(f"{collection}/dir") is None
    assert irods_server.read(f"{collection}/moved/inside.txt") == b"inside\n"
    assert (root / "moved" / "inside.txt").read_bytes() == b"inside\n"
    os.rename(root / "a.txt", root / "b.txt")  # replaces, as POSIX says
    assert irods_server.read(f"{collection}/b.txt") == b"a\n"
    assert irods_server.kind(f"{collection}/a.txt") is None
    assert sorted(os.listdir(root)) == ["b.txt", "full", "moved"]
    with pytest.raises(OSError) as raised:
        os.rmdir(root / "full")
    assert raised.value.errno == errno.ENOTEMPTY
    os.unlink(root / "full" / "x")
    os.rmdir(root / "full")
    assert irods_server.kind(f"{collection}/full") is None
    os.truncate(root / "b.txt", 1)
    assert irods_server.read(f"{collection}/b.txt") == b"a"
    os.utime(root / "b.txt", (1_600_000_000, 1_600_000_000))
    assert os.stat(root / "b.txt").st_mtime == 1_600_000_000
    if irods_server.fake:  # rm moves to the trash unless no_trash is set
        trash = irods_server.query("select DATA_NAME where COLL_NAME = "
                                   f"'/tempZone/trash/home/{irods_server.user}'")
        assert any(row[0].startswith("x.") for row in trash)


def test_names_with_quotes_backslashes_and_unicode(mount_fs, irods_server):
    collection = irods_server.collection("odd names")
    names = ["it's.txt", "naïve ü.dat", "back\\slash", "%25 percent", "O'Brien's dir/f"]
    irods_server.seed(collection, {name: name.encode() for name in names})
    mnt = mount_irods(mount_fs, irods_server, collection)
    assert sorted(os.listdir(mnt.path)) == sorted(
        ["it's.txt", "naïve ü.dat", "back\\slash", "%25 percent", "O'Brien's dir"])
    for name in names:
        assert (mnt.path / name).read_bytes() == name.encode()
    (mnt.path / "O'Brien's dir" / "new 'ü'").write_bytes(b"new")
    assert irods_server.read(f"{collection}/O'Brien's dir/new 'ü'") == b"new"
    # a fresh mount finds single names by stat (queries with quoted literals)
    again = mount_irods(mount_fs, irods_server, collection)
    assert (again.path / "O'Brien's dir" / "new 'ü'").read_bytes() == b"new"


def test_permissions_become_mode_bits_and_the_server_decides(mount_fs, irods_server):
    irods_server.require_fake()
    shared = f"/tempZone/home/bob/shared-{os.urandom(4).hex()}"
    irods_server.seed(shared, {"readonly.txt": b"read me\n"}, owner="bob",
                      acl={"readers": "read_object"})
    mnt = mount_irods(mount_fs, irods_server, shared)
    assert os.stat(mnt.path / "readonly.txt").st_mode & 0o777 == 0o444
    assert os.stat(mnt.path).st_mode & 0o777 == 0o555
    assert (mnt.path / "readonly.txt").read_bytes() == b"read me\n"
    with pytest.raises(OSError) as raised:  # root passes the kernel's check; iRODS refuses
        (mnt.path / "readonly.txt").write_bytes(b"no")
    assert raised.value.errno == errno.EACCES
    own = irods_server.collection("own")
    irods_server.seed(own, {"mine.txt": b"mine"})
    mine = mount_irods(mount_fs, irods_server, own)
    assert os.stat(mine.path / "mine.txt").st_mode & 0o777 == 0o644


def test_an_expired_token_is_renewed_once(mount_fs, irods_server):
    irods_server.require_fake()
    collection = irods_server.collection("tokens")
    irods_server.seed(collection, {"t.txt": b"token\n", "d/u.txt": b"u\n"})
    mnt = mount_irods(mount_fs, irods_server, collection, "--cold")
    assert (mnt.path / "t.txt").read_bytes() == b"token\n"
    logins = counters(mnt)["logins"]
    irods_server.configure(expire_tokens=True)
    assert os.listdir(mnt.path / "d") == ["u.txt"]  # a query after expiry
    irods_server.configure(expire_tokens=True)
    assert (mnt.path / "d" / "u.txt").read_bytes() == b"u\n"  # a data read after expiry
    assert counters(mnt)["logins"] == logins + 2


def test_a_busy_server_backs_off_parallel_uploads(mount_fs, irods_server, tmp_path):
    """Two 30 MiB uploads and a stream budget for one: the second waits on 503 and gets
    through once the first is done."""
    irods_server.require_fake()
    collection = irods_server.collection("busy")
    mnt = mount_irods(mount_fs, irods_server, collection)
    irods_server.configure(streams_total=3)
    try:
        blobs = [random.Random(i).randbytes(30 * MiB) for i in range(2)]
        sources = []
        for i, blob in enumerate(blobs):
            sources.append(tmp_path / f"s{i}")
            sources[-1].write_bytes(blob)
        copies = [subprocess.Popen(["cp", str(s), str(mnt.path / s.name)]) for s in sources]
        assert [c.wait(timeout=120) for c in copies] == [0, 0]
    finally:
        irods_server.configure(streams_total=15)
    for source, blob in zip(sources, blobs, strict=True):
        assert irods_server.read(f"{collection}/{source.name}") == blob
    assert irods_server.stats()["open_handles"] == 0


def test_bad_input_gives_one_line_errors(tmp_path, irods_server):
    target = tmp_path / "m"
    target.mkdir()
    home = irods_server.home
    cases = {
        "wrong password": (irods_server.url(home), {"IRODS_PASSWORD": "wrong"}, "refused"),
        "no such collection": (irods_server.url(home + "/absent"), {}, "no collection"),
        "unknown zone": (irods_server.url("/otherZone/home"), {}, "no collection"),
        "unknown option": (irods_server.url(home) + "&colour=1", {}, "unknown irods option"),
        "no credentials": (irods_server.url(home), {"IRODS_PASSWORD": None}, "credentials"),
        "nobody listening": (f"irods://alice@127.0.0.1:{free_ports(1)[0]}{home}", {},
                             "cannot reach"),
    }
    for label, (url, env_change, message) in cases.items():
        env = dict(os.environ)
        for key, value in env_change.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        result = run_cli("mount", url, str(target), env=env, timeout=60)
        assert result.returncode != 0, label
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], f"{label}: {result.stderr!r}"
        assert "Traceback" not in result.stderr


def test_server_down_gives_eio_then_the_mount_recovers(mount_fs, irods_server):
    """A server of the test's own: stopped, the mount answers EIO within its timeout;
    started again (empty, on the same port), the mount logs in anew and works."""
    irods_server.require_fake()
    from conftest import IrodsServer

    from rucio_fs.testing.irods_fake import API, PASSWORD, USER

    port = free_ports(1)[0]
    process = start_irods_fake(port)
    own = IrodsServer(f"http://127.0.0.1:{port}{API}", USER, PASSWORD,
                      f"/tempZone/home/{USER}", fake=True, process=process)
    try:
        own.seed(own.home + "/down", {"f.txt": b"before\n", "later/g.txt": b"g\n"})
        mnt = mount_irods(mount_fs, own, own.home + "/down", "--option", "timeout=2",
                          "--cold")
        assert (mnt.path / "f.txt").read_bytes() == b"before\n"
        process.terminate()
        process.wait(timeout=10)
        started = time.monotonic()
        with pytest.raises(OSError) as raised:
            os.listdir(mnt.path / "later")
        assert raised.value.errno == errno.EIO
        assert time.monotonic() - started < 30
        process = own.process = start_irods_fake(port)
        own._token = ""
        own.seed(own.home + "/down", {"f.txt": b"after\n", "later/g.txt": b"g\n"})
        assert os.listdir(mnt.path / "later") == ["g.txt"]
        assert (mnt.path / "f.txt").read_bytes() == b"after\n"
    finally:
        process.terminate()
        process.wait(timeout=10)


# -- attributes: times stored in whole seconds, modes and owners never -------------------

NS = 1_000_000_000
SET = 1_600_000_000 * NS + 123_456_789  # stored as 1_600_000_000 s


def _fresh(server, collection: str, *paths: str) -> dict[str, Entry]:
    """What a new backend finds at each of ``paths``, by stat and by its parent's listing
    (they must agree)."""

    async def look(backend) -> dict[str, Entry]:
        found = {}
        for path in paths:
            parent = path.rpartition("/")[0] or "/"
            listed = {e.name: e for e in [e async for e in backend.list(parent)]}
            found[path] = await backend.stat(path)
            assert listed[path.rpartition("/")[2]].mtime_ns == found[path].mtime_ns, path
        return found

    return run_with(server.url(collection), look)


def test_set_attributes_stores_the_second_and_never_a_mode_or_owner(irods_server):
    collection = irods_server.collection("attrs")
    irods_server.seed(collection, {"f.txt": b"times\n", "sub/g": b"g"})
    wanted = Attributes(mtime_ns=SET, mode=0o600, uid=1234, gid=5678)

    async def change(backend) -> dict[str, tuple[Entry, Entry]]:
        changed = {}
        for path in ("/f.txt", "/sub"):
            before = await backend.stat(path)
            changed[path] = before, await backend.set_attributes(path, before, wanted)
        return changed

    if irods_server.fake:
        irods_server.reset_stats()
    changed = run_with(irods_server.url(collection), change)
    for path, (before, after) in changed.items():
        assert after.mtime_ns == 1_600_000_000 * NS, path  # the stored second
        assert (after.mode, after.uid, after.gid) == (before.mode, None, None), path
        missing = wanted.missing_from(after)  # what the core keeps for the mount's life
        assert missing == Attributes(mtime_ns=SET, mode=0o600, uid=1234, gid=5678), path
    file_before, file_after = changed["/f.txt"]
    assert file_after.version != file_before.version  # the version names the second
    fresh = _fresh(irods_server, collection, "/f.txt", "/sub")
    assert fresh["/f.txt"].mtime_ns == fresh["/sub"].mtime_ns == 1_600_000_000 * NS
    assert fresh["/f.txt"].version == file_after.version
    assert fresh["/f.txt"].mode == file_before.mode and fresh["/f.txt"].uid is None
    if irods_server.fake:
        assert irods_server.stored(f"{collection}/f.txt")["acl"] == {irods_server.user: "own"}
        counts = irods_server.stats()["counts"]
        assert counts.get("POST /data-objects touch") == 1
        assert counts.get("POST /collections touch") == 1


def test_attributes_not_storable_make_no_request(irods_server):
    """A mode or owner alone, or a time iRODS cannot hold (after 2038, before 1970), is not
    sent: the entry returned does not show it and the server keeps its time."""
    irods_server.require_fake()
    collection = irods_server.collection("unstorable")
    irods_server.seed(collection, {"f": b"f"})

    async def change(backend) -> list[tuple[Entry, Entry]]:
        before = await backend.stat("/f")
        return [(before, await backend.set_attributes("/f", before, attributes))
                for attributes in (Attributes(mode=0o700, uid=0, gid=0),
                                   Attributes(mtime_ns=2**31 * NS),
                                   Attributes(mtime_ns=-5 * NS))]

    irods_server.reset_stats()
    for before, after in run_with(irods_server.url(collection), change):
        assert after == before
    counts = irods_server.stats()["counts"]
    assert not any("touch" in key for key in counts), counts
    assert _fresh(irods_server, collection, "/f")["/f"].mtime_ns == before.mtime_ns


def test_a_time_is_set_on_every_replica_a_listing_may_show(irods_server):
    """iRODS touches only the newest good replica unless told which; the newer second good
    replica would still show its own time."""
    irods_server.require_fake()
    collection = irods_server.collection("replicated")
    irods_server.seed(collection, {"r.dat": b"twice"}, stale={
        "r.dat": {"size": 5, "mtime": int(time.time()) + 3600, "status": "1"}})

    async def change(backend) -> Entry:
        before = await backend.stat("/r.dat")
        return await backend.set_attributes("/r.dat", before, Attributes(mtime_ns=SET))

    assert run_with(irods_server.url(collection), change).mtime_ns == 1_600_000_000 * NS
    assert _fresh(irods_server, collection, "/r.dat")["/r.dat"].mtime_ns == 1_600_000_000 * NS
    replicas = irods_server.stored(f"{collection}/r.dat")["replicas"]
    assert [(n, t) for n, t, _ in replicas] == [(0, 1_600_000_000), (1, 1_600_000_000)]


def test_uploads_carry_their_time(irods_server):
    """``put`` and a parallel upload store ``attributes.mtime_ns`` once the content is in;
    without a time, no request more than the content's."""
    collection = irods_server.collection("upload-times")
    big = random.Random(9).randbytes(3 * MiB + 5)

    async def upload(backend) -> list[Entry]:
        entries = [await backend.put("/small", b"small", Attributes(mtime_ns=SET, mode=0o600)),
                   await backend.put("/empty", b"", Attributes(mtime_ns=SET + NS))]
        upload = await backend.begin_upload("/big", Attributes(mtime_ns=SET + 2 * NS))
        part = backend.upload_part_size
        for number, offset in enumerate(range(0, len(big), part), start=1):
            await upload.write_part(number, offset, big[offset:offset + part])
        entries.append(await upload.commit(len(big)))
        for entry, path in zip(entries, ("/small", "/empty", "/big"), strict=True):
            assert await backend.confirm(path, entry)
        return entries

    url = irods_server.url(collection) + "&part_size=1M"
    entries = run_with(url, upload)
    assert [e.mtime_ns // NS - 1_600_000_000 for e in entries] == [0, 1, 2]
    assert entries[0].mode is None
    fresh = _fresh(irods_server, collection, "/small", "/empty", "/big")
    assert [fresh[p].mtime_ns // NS - 1_600_000_000 for p in ("/small", "/empty", "/big")] == [
        0, 1, 2]
    assert irods_server.read(f"{collection}/big") == big
    if irods_server.fake:
        irods_server.reset_stats()

        async def plain(backend) -> Entry:
            return await backend.put("/plain", b"plain", Attributes(mode=0o600))

        assert run_with(url, plain).mtime_ns // NS >= time.time() - 60
        counts = irods_server.stats()["counts"]
        assert not any("touch" in key for key in counts), counts


def test_times_modes_and_links_through_a_mount(mount_fs, irods_server):
    collection = irods_server.collection("mount-attrs")
    irods_server.seed(collection, {"f.txt": b"f\n"})
    mnt = mount_irods(mount_fs, irods_server, collection)
    os.utime(mnt.path / "f.txt", ns=(SET, SET))
    os.mkdir(mnt.path / "d")
    os.utime(mnt.path / "d", (1_500_000_000, 1_500_000_000))
    assert os.stat(mnt.path / "f.txt").st_mtime_ns == SET  # kept for the mount's life
    os.chmod(mnt.path / "f.txt", 0o600)  # kept for the mount's life, never an ACL
    assert os.stat(mnt.path / "f.txt").st_mode & 0o777 == 0o600
    with pytest.raises(OSError) as raised:
        os.symlink("f.txt", mnt.path / "link")
    assert raised.value.errno == errno.EOPNOTSUPP
    with pytest.raises(OSError) as raised:
        os.link(mnt.path / "f.txt", mnt.path / "hard")
    assert raised.value.errno == errno.EPERM
    for path in (mnt.path / "f.txt", mnt.path / "d"):  # what was set is stored by now
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    again = mount_irods(mount_fs, irods_server, collection)
    assert os.stat(again.path / "f.txt").st_mtime_ns == 1_600_000_000 * NS
    assert os.stat(again.path / "d").st_mtime == 1_500_000_000
    assert os.stat(again.path / "f.txt").st_mode & 0o777 == 0o644
    if irods_server.fake:
        assert irods_server.stored(f"{collection}/f.txt")["acl"] == {irods_server.user: "own"}


def test_a_spent_quota_or_full_storage_is_reported_as_such(mount_fs, irods_server):
    """The server's codes reach the caller as EDQUOT and ENOSPC, not EIO: through the
    backend, and through a mount at ``close``."""
    irods_server.require_fake()
    collection = irods_server.collection("quota")
    write = {"endpoint": "/data-objects", "op": "write"}

    async def put(backend) -> None:
        await backend.put("/q", b"over quota")

    for code, error in ((-186000, QuotaExceeded), (-110000, QuotaExceeded),
                        (-520028, NoSpace), (-818000, PermissionDenied)):
        irods_server.configure(fail={**write, "code": code, "times": 1})
        with pytest.raises(error, match=str(code)):
            run_with(irods_server.url(collection), put)
    mnt = mount_irods(mount_fs, irods_server, collection)
    for code, expected in ((-186000, errno.EDQUOT), (-311000, errno.ENOSPC)):
        irods_server.configure(fail={**write, "code": code, "times": -1})
        try:
            with pytest.raises(OSError) as raised, open(mnt.path / f"full{-code}", "wb") as f:
                f.write(b"x" * 1000)
            assert raised.value.errno == expected, raised.value
        finally:
            irods_server.configure(fail=None)


def test_a_chmod_made_after_a_queued_mkdir_is_what_the_mount_shows(mount_fs, irods_server,
                                                                   tmp_path):
    """iRODS keeps no modes, so the mount keeps them. With async write-back, a directory made
    0700 and then chmod'ed 0755 shows 0755 from the chmod on: also once its queued mkdir
    (which asked for 0700) is stored while the chmod's own op still waits for its retry,
    and after it."""
    irods_server.require_fake()
    collection = irods_server.collection("kept-in-order")
    mnt = mount_irods(mount_fs, irods_server, collection, "--write-back", "async",
                      "--no-kernel-cache", "--staging-dir", str(tmp_path / "staging"))
    directory = mnt.path / "d"
    # The mkdir's first try fails (the chmod queues behind it); the chmod's op keeps failing.
    irods_server.configure(fail=[
        {"endpoint": "/collections", "op": "create", "code": -154000, "times": 1},
        {"endpoint": "/collections", "op": "touch", "code": -154000, "times": -1}])
    try:
        os.mkdir(directory, 0o700)
        os.chmod(directory, 0o755)
        os.utime(directory, (1_234_567_890, 1_234_567_890))  # its op sends a touch
        wait_for(lambda: "queued attrs /d (try 2" in run_cli("uploads", str(mnt.path)).stdout,
                 timeout=30, interval=0.1)
        assert irods_server.kind(f"{collection}/d") is not None  # the mkdir is stored
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o755
    finally:
        irods_server.configure(fail=None)
    assert run_cli("uploads", "--wait", str(mnt.path)).returncode == 0
    shown = os.stat(directory)
    assert (stat.S_IMODE(shown.st_mode), shown.st_mtime) == (0o755, 1_234_567_890)
