"""The S3 backend through real mounts against real servers: versitygw (the main server) and
moto (for keys a posix-backed server cannot hold)."""

from __future__ import annotations

import errno
import hashlib
import os
import random
import signal
import stat
import subprocess
import time
import uuid
from pathlib import Path
from urllib.parse import unquote

import pytest
from conftest import journal_records, run_cli, staged_bytes, wait_for
from fault_proxy import fault_proxy
from odd_names import check_round_trip
from rucio_fs.backends.s3.backend import STAT_KEYS

MiB = 1 << 20


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def mount_s3(mount_fs, endpoint: str, prefix: str, *options: str):
    return mount_fs(f"s3://test/{prefix}", "-o", f"endpoint_url={endpoint}", *options)


def server_keys(client, prefix: str) -> dict[str, dict]:
    keys = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket="test",
                                                                 Prefix=prefix + "/"):
        for item in page.get("Contents", []):
            keys[item["Key"][len(prefix) + 1:]] = item
    return keys


def multipart_etag(data: bytes, part_size: int) -> str:
    if len(data) <= part_size:
        return hashlib.md5(data).hexdigest()
    parts = [data[i:i + part_size] for i in range(0, len(data), part_size)]
    digest = hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest()
    return f"{digest}-{len(parts)}"


def test_listing_10000_objects_costs_its_pages_and_reads_verify(mount_fs, s3_server):
    prefix = unique("many")
    objects = {f"obj{i:05d}.dat": f"object {i}\n".encode() * (i % 7 + 1) for i in range(10_000)}
    s3_server.seed(prefix, objects)
    mnt = mount_s3(mount_fs, s3_server.endpoint, prefix)
    before = mnt.stats()["backend_counters"]["api_requests"]
    names = sorted(os.listdir(mnt.path))
    assert names == sorted(objects)
    sizes = {name: os.stat(mnt.path / name).st_size for name in names}
    assert sizes == {name: len(data) for name, data in objects.items()}
    requests = mnt.stats()["backend_counters"]["api_requests"] - before
    assert requests == 10, f"10 pages of 1,000 keys, no HEAD per entry (made {requests})"
    for name in random.Random(1).sample(names, 25):
        assert (mnt.path / name).read_bytes() == objects[name]



@pytest.mark.parametrize("write_back", ["sync", "async"])
def test_a_written_file_keeps_the_time_of_its_last_write_through_its_upload(
        mount_fs, s3_server, write_back):
    """Promise: a file written through the mount shows the time of its last write, to the
    nanosecond and on the mount's clock, before its upload, after it, and on a new mount (the
    PUT stores it: x-amz-meta-mtime). The server's own time is whole seconds on its clock: a
    rewrite within that second looked older than the index git wrote after it, and
    ``git status`` missed the change (test_git_clone_then_status_after_a_remount, 1 run in 6)."""
    prefix = unique("mtime")
    mnt = mount_s3(mount_fs, s3_server.endpoint, prefix, "--write-back", write_back)
    path = mnt.path / "notes.txt"
    path.write_text("first\n")
    written = os.stat(path).st_mtime_ns
    run_cli("uploads", "--wait", str(mnt.path))
    assert os.stat(path).st_mtime_ns == written
    mnt.unmount(check=True)
    again = mount_s3(mount_fs, s3_server.endpoint, prefix)
    assert os.stat(again.path / "notes.txt").st_mtime_ns == written


def logged_requests(server) -> list[tuple[str, str]]:
    """(operation, request URI unquoted) of every request in versitygw's access log."""
    requests = []
    for line in Path(server.env["VGW_ACCESS_LOG"]).read_text(errors="replace").splitlines():
        fields = line.split()
        ops = [i for i, field in enumerate(fields) if field.startswith("s3_")]
        if ops and ops[0] + 2 < len(fields):
            requests.append((fields[ops[0]], unquote(fields[ops[0] + 2])))
    return requests


def test_a_cold_cat_asks_one_list_per_name_and_one_get(mount_fs, s3_server):
    """The first-byte design (docs/reading.md), counted in the server's own access log: on a
    fresh mount, ``cat dir/small.dat`` is, per name looked up, one LIST (the object and
    ``name/`` in one answer) with a HEAD of the key beside it (its stored attributes; one
    round trip), and for the directory a HEAD of its marker; nothing at open, one GET."""
    prefix = unique("first-byte")
    data = random.Random(4).randbytes(4096)
    s3_server.seed(prefix, {"dir/small.dat": data})
    mnt = mount_s3(mount_fs, s3_server.endpoint, prefix)

    def ours() -> list[tuple[str, str]]:
        return [(op, uri) for op, uri in logged_requests(s3_server)
                if f"/test/{prefix}/" in uri or f"prefix={prefix}/" in uri]

    before = len(ours())
    shown = subprocess.run(["cat", str(mnt.path / "dir" / "small.dat")], check=True,
                           capture_output=True).stdout
    assert shown == data
    wait_for(lambda: len(ours()) >= before + 6)
    time.sleep(0.3)  # anything more would be logged by now
    asked = [(op, next((p for p in uri.partition("?")[2].split("&") if p.startswith("prefix=")),
                       uri.partition("?")[0])) for op, uri in ours()[before:]]
    at_once = [("s3_ListObjectsV2", f"prefix={prefix}/dir"),
               ("s3_HeadObject", f"/test/{prefix}/dir")]
    file_at_once = [("s3_ListObjectsV2", f"prefix={prefix}/dir/small.dat"),
                    ("s3_HeadObject", f"/test/{prefix}/dir/small.dat")]
    assert len(asked) == 6, asked
    assert sorted(asked[:2]) == sorted(at_once), asked
    assert asked[2] == ("s3_HeadObject", f"/test/{prefix}/dir/"), asked
    assert sorted(asked[3:5]) == sorted(file_at_once), asked
    assert asked[5] == ("s3_GetObject", f"/test/{prefix}/dir/small.dat"), asked

@pytest.mark.parametrize("size", [0, 1, 5 * MiB - 1, 5 * MiB + 1, 200 * MiB],
                         ids=["0B", "1B", "5MiB-1", "5MiB+1", "200MiB"])
def test_written_files_read_back_identical_with_s3_etags(mount_fs, s3_server, tmp_path, size):
    prefix = unique("sizes")
    mnt = mount_s3(mount_fs, s3_server.endpoint, prefix, "-o", "part_size=5M")
    data = random.Random(size).randbytes(size)
    source = tmp_path / "source"
    source.write_bytes(data)
    subprocess.run(["cp", str(source), str(mnt.path / "file")], check=True)
    head = s3_server.client().head_object(Bucket="test", Key=f"{prefix}/file")
    assert head["ContentLength"] == size
    assert head["ETag"].strip('"') == multipart_etag(data, 5 * MiB)
    body = s3_server.client().get_object(Bucket="test", Key=f"{prefix}/file")["Body"].read()
    assert body == data
    mnt.drop()
    assert (mnt.path / "file").read_bytes() == data
    assert os.stat(mnt.path / "file").st_size == size
    if size > 5 * MiB:
        assert mnt.backend_calls("write_part") == (size + 5 * MiB - 1) // (5 * MiB)


def test_cp_r_of_500_files_then_rm_r_match_the_server(mount_fs, s3_server, tmp_path):
    prefix = unique("tree")
    tree = tmp_path / "tree"
    expected = {}
    rng = random.Random(5)
    for i in range(500):
        rel = f"d{i % 10}/e{i % 3}/f{i:03d}.txt"
        data = rng.randbytes(rng.randrange(0, 4000))
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_bytes(data)
        expected[f"tree/{rel}"] = hashlib.md5(data).hexdigest()
    mnt = mount_s3(mount_fs, s3_server.endpoint, prefix)
    subprocess.run(["cp", "-r", str(tree), str(mnt.path)], check=True)
    files = {k: v["ETag"].strip('"') for k, v in server_keys(s3_server.client(), prefix).items()
             if not k.endswith("/")}
    assert files == expected
    listed = sorted(str(p.relative_to(mnt.path)) for p in mnt.path.rglob("*") if p.is_file())
    assert listed == sorted(expected)
    before = [mnt.backend_calls(call) for call in ("rmdir", "remove_many", "unlink")]
    subprocess.run(["rm", "-r", str(mnt.path / "tree")], check=True)
    assert server_keys(s3_server.client(), prefix) == {}
    assert os.listdir(mnt.path) == []
    # The mount's first removal waits for the server; the others run ahead of rm and go with
    # the rmdir of their directory: each of the 41 directories rm -r emptied (having listed
    # it, with nothing hidden) goes in one request with its files, with no listing of its
    # keys first (a batch goes early, split, only when the mount is idle for a moment).
    assert mnt.backend_calls("rmdir") == before[0]
    assert mnt.backend_calls("unlink") - before[2] == 1
    assert 41 <= mnt.backend_calls("remove_many") - before[1] < 2 * 41


def fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def test_a_time_and_mode_set_on_a_stored_file_are_held_for_its_rename(mount_fs, s3_server,
                                                                       tmp_path):
    """The promise of a time or mode set with synchronous write-back: the mount shows it at
    once; the server has it within a few seconds, at the file's rename (which carries it: no
    request of its own), at ``fsync``, at unmount, or after a crash at the next mount; a
    removal makes it moot; new content written after it keeps its mode and takes the
    write's time. (`rsync -a`: temporary file, its time and mode, rename.)"""
    prefix = unique("held")
    client = s3_server.client()
    staging = ("--staging-dir", str(tmp_path / "staging"))
    mnt = mount_s3(mount_fs, s3_server.endpoint, prefix, *staging)
    root = mnt.path
    past = 1_300_000_000 * 10**9

    def stored(name: str) -> dict[str, str]:
        return client.head_object(Bucket="test", Key=f"{prefix}/{name}")["Metadata"]

    def calls(name: str) -> int:
        return mnt.backend_calls(name)

    for name in ("tmp", "kept", "synced", "gone", "rewritten", "crashed"):
        (root / name).write_bytes(name.encode())
    before = (calls("set_attributes"), calls("rename"))
    os.utime(root / "tmp", ns=(past, past))
    os.chmod(root / "tmp", 0o600)
    shown = os.stat(root / "tmp")
    assert (shown.st_mtime_ns, stat.S_IMODE(shown.st_mode)) == (past, 0o600)
    os.rename(root / "tmp", root / "final")
    assert stored("final") == {"mtime": "1300000000", "mode": str(stat.S_IFREG | 0o600)}
    assert (calls("set_attributes"), calls("rename")) == (before[0], before[1] + 1)
    assert "tmp" not in server_keys(client, prefix)

    os.chmod(root / "synced", 0o640)
    fsync(root / "synced")
    assert stored("synced")["mode"] == str(stat.S_IFREG | 0o640)

    os.chmod(root / "gone", 0o600)
    os.unlink(root / "gone")
    fsync(root)  # (a removal may run ahead of unlink: on the server once its directory is)
    assert "gone" not in server_keys(client, prefix)

    os.utime(root / "rewritten", ns=(past, past))
    os.chmod(root / "rewritten", 0o700)
    started = time.time_ns()
    with open(root / "rewritten", "ab") as f:
        f.write(b" again")
    fsync(root / "rewritten")
    rewritten = stored("rewritten")
    assert rewritten["mode"] == str(stat.S_IFREG | 0o700)
    assert float(rewritten["mtime"]) >= started / 1e9  # the write's time, not the one held
    mnt.drop()
    assert os.stat(root / "rewritten").st_mtime_ns >= started

    os.chmod(root / "kept", 0o604)
    wait_for(lambda: stored("kept").get("mode") == str(stat.S_IFREG | 0o604), timeout=10)
    assert calls("set_attributes") == before[0] + 2  # kept's and synced's own requests

    os.chmod(root / "crashed", 0o606)
    pid = mnt.stats()["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not os.path.exists(f"/proc/{pid}"))
    subprocess.run(["fusermount3", "-u", "-z", str(root)], capture_output=True)
    again = mount_s3(mount_fs, s3_server.endpoint, prefix, *staging)
    wait_for(lambda: stored("crashed").get("mode") == str(stat.S_IFREG | 0o606), timeout=10)
    assert stat.S_IMODE(os.stat(again.path / "crashed").st_mode) == 0o606


def test_a_walk_completes_the_names_ahead_of_its_lookups(mount_fs, s3_server):
    """`rsync` into a tree on a new mount looks its names up one at a time, and each needs a
    HEAD (a listing carries no stored attributes). While the mount answers one lookup it asks
    for the next names: every name shows what it stores, each is asked for once, and several
    are asked for at a time."""
    prefix = unique("ahead")
    client = s3_server.client()
    names = [f"f{i:02d}" for i in range(40)]
    for i, name in enumerate(names):
        client.put_object(Bucket="test", Key=f"{prefix}/d/{name}", Body=b"x",
                          Metadata={"mode": str(stat.S_IFREG | 0o600 | (i % 4) << 3)})
    mnt = mount_s3(mount_fs, s3_server.endpoint, prefix)
    before = mnt.backend_calls("stat")
    for i, name in enumerate(names):
        assert stat.S_IMODE(os.lstat(mnt.path / "d" / name).st_mode) == 0o600 | (i % 4) << 3
    stats = mnt.stats()["backend"]["stat"]
    assert stats["latency"]["count"] - before == 1 + len(names)  # d, then each name once
    assert stats["peak"] > 1


def test_namespace_operations(mount_fs, s3_server):
    prefix = unique("ops")
    mnt = mount_s3(mount_fs, s3_server.endpoint, prefix, "--xattrs")
    root = mnt.path
    (root / "dir").mkdir()
    (root / "dir" / "a").write_bytes(b"alpha")
    with pytest.raises(OSError) as exc:
        (root / "dir").rmdir()
    assert exc.value.errno == errno.ENOTEMPTY
    os.rename(root / "dir" / "a", root / "b")
    assert (root / "b").read_bytes() == b"alpha"
    assert not (root / "dir" / "a").exists()
    (root / "dir").rmdir()
    assert sorted(server_keys(s3_server.client(), prefix)) == ["b"]
    # Directories cannot be renamed in place: EXDEV, and mv copies instead.
    (root / "d2").mkdir()
    (root / "d2" / "x").write_bytes(b"x")
    with pytest.raises(OSError) as exc:
        os.rename(root / "d2", root / "d3")
    assert exc.value.errno == errno.EXDEV
    subprocess.run(["mv", str(root / "d2"), str(root / "d3")], check=True)
    assert (root / "d3" / "x").read_bytes() == b"x"
    # Truncate and append rewrite the object.
    os.truncate(root / "b", 2)
    assert (root / "b").read_bytes() == b"al"
    with open(root / "b", "ab") as f:
        f.write(b"pine")
    assert (root / "b").read_bytes() == b"alpine"
    mnt.drop()
    assert (root / "b").read_bytes() == b"alpine"
    # Mode and times are stored in s3fs's metadata headers, and read back after a remount.
    os.chmod(root / "b", 0o600)
    os.utime(root / "b", ns=(1_000_000_123_456_789, 1_000_000_123_456_789))
    fsync(root / "b")  # what is held back for a rename goes to the server now
    metadata = s3_server.client().head_object(Bucket="test", Key=f"{prefix}/b")["Metadata"]
    assert metadata == {"mode": str(stat.S_IFREG | 0o600), "mtime": "1000000.123456789"}
    mnt.drop()
    shown = os.stat(root / "b")
    assert stat.S_IMODE(shown.st_mode) == 0o600 and shown.st_mtime_ns == 1_000_000_123_456_789
    os.chmod(root / "b", 0o644)
    before = os.stat(root / "b").st_mtime
    os.utime(root / "b")  # touch: now
    assert os.stat(root / "b").st_mtime > before
    # Symbolic links are s3fs's: the target as content, S_IFLNK in the mode.
    os.symlink("../elsewhere/target", root / "ln")
    assert os.readlink(root / "ln") == "../elsewhere/target"
    assert stat.S_ISLNK(os.lstat(root / "ln").st_mode)
    head = s3_server.client().head_object(Bucket="test", Key=f"{prefix}/ln")
    assert head["Metadata"]["mode"] == str(stat.S_IFLNK | 0o777)
    os.unlink(root / "ln")
    fsync(root)
    assert "ln" not in server_keys(s3_server.client(), prefix)
    # xattrs: etag, storage class, user metadata written back.
    etag = os.getxattr(root / "b", "user.s3.etag").decode()
    assert etag == hashlib.md5(b"alpine").hexdigest()
    assert os.getxattr(root / "b", "user.s3.storage_class") == b"STANDARD"
    os.setxattr(root / "b", "user.s3.meta.experiment", b"ligo")
    head = s3_server.client().head_object(Bucket="test", Key=f"{prefix}/b")
    assert head["Metadata"]["experiment"] == "ligo"
    assert os.getxattr(root / "b", "user.s3.meta.experiment") == b"ligo"
    os.removexattr(root / "b", "user.s3.meta.experiment")
    assert "user.s3.meta.experiment" not in os.listxattr(root / "b")
    with pytest.raises(OSError) as exc:
        os.setxattr(root / "b", "user.s3.etag", b"x")
    assert exc.value.errno == errno.EPERM
    assert (root / "b").read_bytes() == b"alpine"


def test_odd_keys_follow_the_documented_rule_on_moto(mount_fs, s3_server):
    prefix = unique("odd")
    client = s3_server.client(s3_server.moto)
    keys = {"a//b": b"1", "x/../y": b"2", "./dot": b"3", "k": b"object k",
            "k/child": b"child", "sp ace+plus%25\u00e9": b"odd name", "ok": b"fine"}
    for key, body in keys.items():
        client.put_object(Bucket="test", Key=f"{prefix}/{key}", Body=body)
    mnt = mount_s3(mount_fs, s3_server.moto, prefix)
    assert sorted(os.listdir(mnt.path)) == sorted(["a", "x", "k", "ok", "sp ace+plus%25\u00e9"])
    assert (mnt.path / "k").is_dir() and (mnt.path / "k" / "child").read_bytes() == b"child"
    assert os.listdir(mnt.path / "a") == [] and os.listdir(mnt.path / "x") == []
    assert (mnt.path / "sp ace+plus%25\u00e9").read_bytes() == b"odd name"
    assert not (mnt.path / "y").exists()
    assert mnt.stats()["backend_counters"]["hidden_keys"] >= 3
    assert "cannot be shown as POSIX names" in mnt.log_text()
    (mnt.path / "new +%é").write_bytes(b"written")
    body = client.get_object(Bucket="test", Key=f"{prefix}/new +%é")["Body"].read()
    assert body == b"written"


def test_stat_by_one_listing_with_many_siblings_before_the_directory(mount_fs, s3_server):
    """A lookup lists the keys starting with the name: the object of that key is the file,
    the prefix ``name/`` the directory (which wins). Siblings that sort between the two
    (``k-000`` … more than one page of the stat's LIST) must not hide either."""
    prefix = unique("stat")
    client = s3_server.client(s3_server.moto)
    keys = {"k": b"object k", "k/child": b"child", "f": b"file f", "f.txt": b"t"}
    for stem in ("k", "f", "g"):
        keys.update({f"{stem}-{i:03d}": b"s" for i in range(STAT_KEYS + 20)})
    for key, body in keys.items():
        client.put_object(Bucket="test", Key=f"{prefix}/{key}", Body=body)
    mnt = mount_s3(mount_fs, s3_server.moto, prefix)
    assert (mnt.path / "k").is_dir() and (mnt.path / "k" / "child").read_bytes() == b"child"
    assert (mnt.path / "f").is_file() and (mnt.path / "f").stat().st_size == len(b"file f")
    assert (mnt.path / "f").read_bytes() == b"file f"
    assert not (mnt.path / "g").exists() and not (mnt.path / "k-999").exists()
    assert (mnt.path / f"g-{STAT_KEYS + 19:03d}").read_bytes() == b"s"


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_rmdir_never_destroys_data_in_a_marker_or_writes_one(mount_fs, s3_server, tmp_path,
                                                             mode):
    """moto keeps ``dir/`` keys with data: a directory operation never deletes or rewrites
    them; a directory holding only hidden keys fails rmdir without writing a marker. With
    async write-back too, whose removals delete markers without looking below them."""
    prefix = unique("markers")
    client = s3_server.client(s3_server.moto)
    keys = {"t/": b"data in a marker", "t2/": b"more data", "t2/x": b"x", "a//b": b"hidden",
            "e/": b""}
    for key, body in keys.items():
        client.put_object(Bucket="test", Key=f"{prefix}/{key}", Body=body)
    mnt = mount_s3(mount_fs, s3_server.moto, prefix, "--write-back", mode,
                   "--staging-dir", str(tmp_path / "staging"))
    for name in ("t", "t2", "a"):
        with pytest.raises(OSError) as exc:
            os.rmdir(mnt.path / name)
        assert exc.value.errno == errno.ENOTEMPTY, name
    os.rmdir(mnt.path / "e")  # an empty marker of an empty directory goes
    assert run_cli("uploads", "--wait", str(mnt.path)).returncode == 0
    after = {item["Key"][len(prefix) + 1:]: item["Size"] for item in
             client.list_objects_v2(Bucket="test", Prefix=prefix + "/")["Contents"]}
    assert after == {"t/": 16, "t2/": 9, "t2/x": 1, "a//b": 6}
    for key in ("t/", "t2/"):
        body = client.get_object(Bucket="test", Key=f"{prefix}/{key}")["Body"].read()
        assert body == keys[key]


def test_wrong_credentials_and_missing_bucket_are_one_line_errors(s3_server, tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    env = {**os.environ, "AWS_SECRET_ACCESS_KEY": "wrong"}
    result = run_cli("mount", "s3://test", str(mnt), "-o", f"endpoint_url={s3_server.endpoint}",
                     env=env)
    assert result.returncode == 1
    assert len(result.stderr.strip().splitlines()) == 1
    assert "denied" in result.stderr and "Traceback" not in result.stderr
    result = run_cli("mount", "s3://no-such-bucket", str(mnt), "-o",
                     f"endpoint_url={s3_server.endpoint}")
    assert result.returncode == 1
    assert "does not exist" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert os.listdir(mnt) == []


def test_throttling_is_backed_off_and_retried(mount_fs, s3_server):
    prefix = unique("slow")
    s3_server.seed(prefix, {"f": b"throttled but fine"})
    with fault_proxy(s3_server.endpoint) as proxy:
        mnt = mount_s3(mount_fs, proxy.url, prefix)
        proxy.inject("slowdown", "list-type=2", times=2)
        assert sorted(os.listdir(mnt.path)) == ["f"]
        assert not (mnt.path / "g").exists()
        proxy.inject("slowdown", f"/test/{prefix}/g", times=2)
        (mnt.path / "g").write_bytes(b"written while throttled")
        assert mnt.stats()["backend_counters"]["api_retries"] >= 4
    body = s3_server.client().get_object(Bucket="test", Key=f"{prefix}/g")["Body"].read()
    assert body == b"written while throttled"


def test_server_down_gives_eio_then_recovers_and_failed_uploads_are_kept(mount_fs, s3_server):
    prefix = unique("down")
    mnt = mount_s3(mount_fs, s3_server.endpoint, prefix, "--timeout", "10")
    (mnt.path / "before").write_bytes(b"up")
    f = open(mnt.path / "late", "wb")  # noqa: SIM115 - close is what is tested
    with s3_server.gateway_down():
        run_cli("cache", "drop", str(mnt.path), check=True)  # "/" was listed for a lookup
        start = time.monotonic()
        with pytest.raises(OSError) as exc:
            os.stat(mnt.path / "unknown-name")
        assert exc.value.errno == errno.EIO and time.monotonic() - start < 10
        # A write whose upload fails: close reports it, the data stays staged.
        f.write(b"must not be lost")
        with pytest.raises(OSError) as exc:
            f.close()
        assert exc.value.errno == errno.EIO
        assert (mnt.path / "late").read_bytes() == b"must not be lost"
        listed = run_cli("uploads", str(mnt.path))
        assert listed.returncode == 1 and "pending /late" in listed.stdout
    assert (mnt.path / "before").read_bytes() == b"up"
    retried = run_cli("uploads", str(mnt.path), "--retry")
    assert retried.returncode == 0, retried.stdout + retried.stderr
    body = s3_server.client().get_object(Bucket="test", Key=f"{prefix}/late")["Body"].read()
    assert body == b"must not be lost"
    wait_for(lambda: "no pending uploads" in run_cli("uploads", str(mnt.path)).stdout)


def test_pending_upload_can_be_discarded(mount_fs, s3_server):
    prefix = unique("discard")
    mnt = mount_s3(mount_fs, s3_server.endpoint, prefix, "--timeout", "10")
    assert os.listdir(mnt.path) == []  # cached: the name is created without the server
    with s3_server.gateway_down():
        # Opened only now: the stopping of the gateway forks, and the child's exec closes a
        # copy of every descriptor open then, which uploads a new file (empty, here).
        f = open(mnt.path / "doomed", "wb")  # noqa: SIM115 - close is what is tested
        f.write(b"x")
        with pytest.raises(OSError):
            f.close()
        result = run_cli("uploads", str(mnt.path), "--discard", str(mnt.path / "doomed"))
        assert "discarded /doomed" in result.stdout and result.returncode == 0
    assert not (mnt.path / "doomed").exists()


def test_unmount_keeps_what_could_not_be_uploaded(mount_fs, s3_server, tmp_path):
    prefix = unique("kept")
    staging = tmp_path / "staging"
    mnt = mount_s3(mount_fs, s3_server.endpoint, prefix, "--timeout", "5",
                   "--staging-dir", str(staging))
    f = open(mnt.path / "kept", "wb")  # noqa: SIM115 - close is what is tested
    with s3_server.gateway_down():
        f.write(b"keep me")
        with pytest.raises(OSError):
            f.close()
        assert run_cli("unmount", str(mnt.path)).returncode == 0
    records = journal_records(staging)
    assert [r["path"] for r in records] == ["/kept"]
    assert staged_bytes(staging, records[0]) == b"keep me"


def test_credentials_from_a_shared_file_and_profile(mount_fs, s3_server, tmp_path):
    prefix = unique("profile")
    s3_server.seed(prefix, {"f": b"via profile"})
    credentials = tmp_path / "credentials"
    credentials.write_text(f"[lab]\naws_access_key_id = {s3_server.env['AWS_ACCESS_KEY_ID']}\n"
                           f"aws_secret_access_key = {s3_server.env['AWS_SECRET_ACCESS_KEY']}\n")
    saved = {k: os.environ.pop(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    os.environ["AWS_SHARED_CREDENTIALS_FILE"] = str(credentials)
    os.environ["AWS_CONFIG_FILE"] = str(tmp_path / "no-config")
    try:
        mnt = mount_s3(mount_fs, s3_server.endpoint, prefix, "-o", "profile=lab")
        assert (mnt.path / "f").read_bytes() == b"via profile"
    finally:
        os.environ.update(saved)
        del os.environ["AWS_SHARED_CREDENTIALS_FILE"], os.environ["AWS_CONFIG_FILE"]


def test_a_missing_aws_profile_is_one_line(s3_server, tmp_path):
    """(Bad URLs and option values: the conformance suite, in-process.)"""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    result = run_cli("mount", "s3://test", str(mnt), "-o", "profile=missing")
    assert result.returncode == 1
    assert "AWS configuration" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_failed_streamed_part_falls_back_to_a_whole_upload(mount_fs, s3_server, tmp_path):
    prefix = unique("fallback")
    data = random.Random(7).randbytes(18 * MiB)
    with fault_proxy(s3_server.endpoint) as proxy:
        mnt = mount_s3(mount_fs, proxy.url, prefix, "-o", "part_size=5M")
        # Part 2 of the streamed upload fails every attempt; the staged copy goes up whole.
        proxy.inject("error", "partNumber=2&", times=4)
        source = tmp_path / "source"
        source.write_bytes(data)
        subprocess.run(["cp", str(source), str(mnt.path / "f")], check=True)
        assert "uploading the staged file whole" in mnt.log_text()
    client = s3_server.client()
    assert client.get_object(Bucket="test", Key=f"{prefix}/f")["Body"].read() == data
    head = client.head_object(Bucket="test", Key=f"{prefix}/f")
    assert head["ETag"].strip('"') == multipart_etag(data, 5 * MiB)
    # The abandoned upload was aborted: nothing is left behind on the server.
    uploads = client.list_multipart_uploads(Bucket="test", Prefix=prefix).get("Uploads", [])
    assert uploads == []


def test_random_writes_and_in_place_edits_are_staged_then_uploaded(mount_fs, s3_server):
    prefix = unique("random")
    mnt = mount_s3(mount_fs, s3_server.endpoint, prefix, "-o", "part_size=5M")
    expected = bytearray(random.Random(3).randbytes(12 * MiB))
    with open(mnt.path / "f", "wb") as f:
        f.write(expected)  # streams parts...
        f.seek(MiB)
        f.write(b"X" * 100)  # ...until a write lands below them
    expected[MiB:MiB + 100] = b"X" * 100
    with open(mnt.path / "f", "r+b") as f:  # an existing object edited in place
        f.seek(7 * MiB)
        f.write(b"Y" * 10)
        f.seek(0, os.SEEK_END)
        f.write(b"tail")
    expected[7 * MiB:7 * MiB + 10] = b"Y" * 10
    expected += b"tail"
    body = s3_server.client().get_object(Bucket="test", Key=f"{prefix}/f")["Body"].read()
    assert body == bytes(expected)
    mnt.drop()
    assert (mnt.path / "f").read_bytes() == bytes(expected)


def test_the_odd_names_round_trip(mount_fs, s3_server):
    """Through the kernel; every backend round-trips them in-process (the conformance suite)."""
    endpoint = s3_server.endpoint
    prefix = unique("oddnames")
    client = s3_server.client(endpoint)
    check_round_trip(
        mount_s3(mount_fs, endpoint, prefix).path,
        lambda: mount_s3(mount_fs, endpoint, prefix).path,
        lambda name: client.get_object(Bucket="test", Key=f"{prefix}/{name}")["Body"].read())


def test_large_parts_stay_within_the_memory_limit(mount_fs, s3_server):
    """Parts of 32 MiB: the daemon's peak stays near the uploads' share of the memory limit
    (it reached 600 MB when httpx kept every sent part until the garbage collector ran)."""
    prefix = unique("memory")
    mnt = mount_s3(mount_fs, s3_server.endpoint, prefix, "-o", "part_size=32M",
                   "--memory-limit", "128M")
    pid = mnt.stats()["pid"]
    subprocess.run(["dd", "if=/dev/zero", f"of={mnt.path / 'big'}", "bs=1M", "count=640"],
                   check=True, capture_output=True, timeout=300)
    with open(f"/proc/{pid}/status") as f:
        peak_mb = int(next(x for x in f if x.startswith("VmHWM:")).split()[1]) / 1024
    assert peak_mb < 50 + 128, f"daemon peaked at {peak_mb:.0f} MB"
    head = s3_server.client().head_object(Bucket="test", Key=f"{prefix}/big")
    assert head["ContentLength"] == 640 * MiB
