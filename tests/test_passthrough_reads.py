"""FUSE passthrough for reads (``--passthrough`` with ``--cache-dir``), through real mounts:
a file the disk layer holds whole is read by the kernel itself, with no READ request reaching
the daemon.

The promise: a read through passthrough returns exactly what a read through the daemon
would: the bytes of the content the catalog names now. Only a whole file sealed from blocks
that each passed their CRC, of a content that passed the catalog's checksum (when it gives
one), keyed by the version the catalog gives now, is handed to the kernel; a whole file
changed on disk since it was sealed is checked block by block first and never handed over
if a block differs, nor served by the daemon. Where the kernel refuses the backing file, the
daemon serves the read.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import random
from pathlib import Path

from conftest import overlayfs, run_cli, wait_for
from test_s3 import mount_s3, unique

from rucio_fs.cache import whole_files
from rucio_fs.cache.disk_cache import DiskCache
from rucio_fs.observe import tracing
from rucio_fs.observe.stats import Stats

MiB = 1 << 20
DATASET = "datasets/O3a/H1"


def _events(mnt) -> dict[str, int]:
    return mnt.stats()["events"]


def _sealed(mnt, count: int) -> None:
    wait_for(lambda: _events(mnt).get("disk_cache_sealed", 0) >= count)


def _options(cache: Path, *more: str) -> tuple[str, ...]:
    return ("--cache-dir", str(cache), "--cache-free-floor", "0", *more)


def _whole_data_files(cache: Path) -> list[Path]:
    return sorted(p for p in (cache / "whole").iterdir() if "." not in p.name)


def test_files_read_whole_are_read_by_the_kernel_alone_after_a_remount(mount_fs, tmp_path):
    """Catalog checksums (demo: adler32): verified, sealed, then read after a remount with
    0 READ requests and 0 backend reads, also through mmap."""
    cache = tmp_path / "cache"
    names = [f"{DATASET}/file-{n:06d}.dat" for n in range(1, 6)]
    mnt = mount_fs("demo://", *_options(cache, "--passthrough"))
    first = {name: (mnt.path / name).read_bytes() for name in names}
    _sealed(mnt, len(names))
    assert _events(mnt)["checksum_verified"] == len(names)
    mnt.unmount(check=True)

    mnt = mount_fs("demo://", *_options(cache, "--passthrough"))
    for name in names:
        assert (mnt.path / name).read_bytes() == first[name]
    with open(mnt.path / names[0], "rb") as f, mmap.mmap(f.fileno(), 0,
                                                       prot=mmap.PROT_READ) as mapped:
        assert mapped[:] == first[names[0]]
    assert mnt.fuse_calls("read") == 0
    assert mnt.backend_calls("read") == 0
    events = _events(mnt)
    assert events["opened_passthrough"] == len(names) + 1
    assert events["passthrough_read_bytes"] == sum(map(len, first.values())) + len(first[names[0]])
    # What the kernel sent, seen from its tracepoints: an open, no READ.
    tracing.check_tracing(mount_tracefs=True)
    report = json.loads(run_cli("trace", str(mnt.path), "--format", "json", "--", "sh", "-c",
                                f"cat {mnt.path / names[1]} > /dev/null", check=True).stdout)
    assert report["ops"]["FUSE_OPEN"]["count"] == 1
    assert "FUSE_READ" not in report["ops"]
    # The first open passed the catalog's checksum already: nothing is hashed again.
    assert "checksum_verified" not in events


def test_a_whole_file_evicted_while_open_is_read_to_its_end(mount_fs, tmp_path):
    """The kernel holds the backing file of an open handle: evicting the whole file (its
    space counts as free at once) never cuts the reader short."""
    cache = tmp_path / "cache"
    options = _options(cache, "--passthrough", "--cache-size", "64K")
    name = f"{DATASET}/file-000001.dat"
    mnt = mount_fs("demo://", *options)
    expected = (mnt.path / name).read_bytes()
    _sealed(mnt, 1)
    mnt.unmount(check=True)
    mnt = mount_fs("demo://", *options)
    with open(mnt.path / name, "rb") as reader:
        assert reader.read(100) == expected[:100]
        for n in range(2, 40):
            (mnt.path / f"{DATASET}/file-{n:06d}.dat").read_bytes()
        wait_for(lambda: _events(mnt).get("disk_cache_evicted", 0) >= 1)
        wait_for(lambda: expected not in {p.read_bytes() for p in _whole_data_files(cache)})
        assert reader.read() == expected[100:]
    assert _events(mnt)["opened_passthrough"] == 1


def test_a_file_that_failed_its_checksum_is_never_sealed(mount_fs, tmp_path):
    cache = tmp_path / "cache"
    mnt = mount_fs("demo://?faults=1", *_options(cache, "--passthrough"))
    good = (mnt.path / DATASET / "file-000001.dat").read_bytes()
    try:
        (mnt.path / "faults/corrupt.dat").read_bytes()
        raise AssertionError("a corrupt file was read")
    except OSError:
        pass
    _sealed(mnt, 1)
    assert _events(mnt)["checksum_mismatch"] == 1
    mnt.unmount(check=True)
    assert len(_whole_data_files(cache)) == 1
    mnt = mount_fs("demo://?faults=1", *_options(cache, "--passthrough"))
    assert (mnt.path / DATASET / "file-000001.dat").read_bytes() == good
    assert _events(mnt)["opened_passthrough"] == 1


def test_a_whole_file_changed_on_disk_is_checked_and_never_served(mount_fs, tmp_path):
    """One byte flipped in each of two whole files: the passthrough open checks every block
    first and reads from the catalog; the daemon's block read (no --passthrough) checks the
    block's CRC. Neither serves the flipped byte, both delete the file."""
    cache = tmp_path / "cache"
    names = [f"{DATASET}/file-{n:06d}.dat" for n in (1, 2, 3)]
    mnt = mount_fs("demo://", *_options(cache, "--passthrough"))
    first = {name: (mnt.path / name).read_bytes() for name in names}
    _sealed(mnt, len(names))
    mnt.unmount(check=True)
    by_content = {path.read_bytes(): path for path in _whole_data_files(cache)}
    wholes = {name: by_content[first[name]] for name in names}
    for name in names[:2]:
        with open(wholes[name], "r+b") as f:
            f.seek(100)
            byte = f.read(1)
            f.seek(100)
            f.write(bytes([byte[0] ^ 0xFF]))

    mnt = mount_fs("demo://", *_options(cache, "--passthrough"))
    assert (mnt.path / names[0]).read_bytes() == first[names[0]]
    assert (mnt.path / names[2]).read_bytes() == first[names[2]]  # untouched: passed through
    events = _events(mnt)
    assert events["disk_cache_corrupt"] == 1 and events["opened_passthrough"] == 1
    assert mnt.backend_calls("read") == 1
    _sealed(mnt, 1)  # sealed again, from the blocks just fetched
    assert wholes[names[0]].read_bytes() == first[names[0]]
    mnt.unmount(check=True)

    mnt = mount_fs("demo://", *_options(cache))
    assert (mnt.path / names[1]).read_bytes() == first[names[1]]
    assert _events(mnt)["disk_cache_corrupt"] == 1
    assert mnt.backend_calls("read") == 1
    assert not wholes[names[1]].exists()


def test_multi_block_files_on_s3_pass_through_until_the_server_changes_them(
        mount_fs, s3_server, tmp_path):
    """S3 gives no checksum: blocks that passed their CRC are sealed. A new version on the
    server is read as that, and a file written through the mount reads back as written, also
    while a reader of the old content is open through its whole file: the kernel allows an
    inode open through a backing file no other open, so the name gets a new inode."""
    prefix = unique("ptr")
    client = s3_server.client()
    data = {"multi.bin": random.Random(7).randbytes(5 * MiB + 3), "one.bin": b"x"}
    for name, body in data.items():
        client.put_object(Bucket="test", Key=f"{prefix}/{name}", Body=body)
    cache = tmp_path / "cache"
    options = _options(cache, "--passthrough", "--metadata-ttl", "0", "--listing-ttl", "0",
                       "--kernel-ttl", "0", "--attr-window", "0")
    mnt = mount_s3(mount_fs, s3_server.endpoint, prefix, *options)
    for name, body in data.items():
        assert (mnt.path / name).read_bytes() == body
    _sealed(mnt, len(data))
    mnt.unmount(check=True)

    mnt = mount_s3(mount_fs, s3_server.endpoint, prefix, *options)
    with open(mnt.path / "multi.bin", "rb") as old_reader:
        assert old_reader.read(MiB) == data["multi.bin"][:MiB]
        assert mnt.fuse_calls("read") == 0
        new = random.Random(8).randbytes(2 * MiB)
        client.put_object(Bucket="test", Key=f"{prefix}/multi.bin", Body=new)
        assert (mnt.path / "multi.bin").read_bytes() == new
        # The reader open before the change goes on reading what it opened.
        assert old_reader.read() == data["multi.bin"][MiB:]
    with open(mnt.path / "one.bin", "rb") as old_reader:  # through its whole file
        (mnt.path / "one.bin").write_bytes(b"written")
        assert (mnt.path / "one.bin").read_bytes() == b"written"
        assert old_reader.read() == b"x"
    events = _events(mnt)
    assert events["opened_passthrough"] == 2
    # Each open that could not share a backing file gave the name a new inode.
    assert events["passthrough_gave_way"] == 2
    assert hashlib.md5(client.get_object(Bucket="test", Key=f"{prefix}/one.bin")["Body"]
                       .read()).hexdigest() == hashlib.md5(b"written").hexdigest()


def test_a_file_read_whole_partly_in_exact_ranges_is_completed_then_sealed(
        mount_fs, s3_server, tmp_path):
    """A reader that jumps first gets its first blocks' worth as exact ranges, which the
    disk layer does not keep: at its close the few blocks missing are fetched, and the file
    is sealed and read after a remount by the kernel alone."""
    prefix = unique("ptr-jump")
    body = random.Random(9).randbytes(6 * MiB + 17)
    s3_server.client().put_object(Bucket="test", Key=f"{prefix}/f", Body=body)
    cache = tmp_path / "cache"
    mnt = mount_s3(mount_fs, s3_server.endpoint, prefix, *_options(cache, "--passthrough"))
    with open(mnt.path / "f", "rb") as f:
        assert os.pread(f.fileno(), 4096, 5 * MiB) == body[5 * MiB:5 * MiB + 4096]
        assert f.read() == body
    _sealed(mnt, 1)
    assert _events(mnt)["disk_cache_completed_blocks"] >= 1
    mnt.unmount(check=True)
    mnt = mount_s3(mount_fs, s3_server.endpoint, prefix, *_options(cache, "--passthrough"))
    assert (mnt.path / "f").read_bytes() == body
    assert mnt.fuse_calls("read") == 0 and _events(mnt)["opened_passthrough"] == 1


def test_a_whole_file_the_kernel_refuses_to_back_is_read_through_the_daemon(
        mount_fs, tmp_path):
    """A cache directory on overlayfs: the kernel refuses its files as backing files
    (stacking too deep); reads are served by the daemon, from the whole file."""
    with overlayfs(tmp_path) as merged:
        cache = merged / "cache"
        name = f"{DATASET}/file-000004.dat"
        mnt = mount_fs("demo://", *_options(cache, "--passthrough"))
        first = (mnt.path / name).read_bytes()
        _sealed(mnt, 1)
        mnt.unmount(check=True)
        mnt = mount_fs("demo://", *_options(cache, "--passthrough"))
        try:
            assert (mnt.path / name).read_bytes() == first
            events = _events(mnt)
            assert events["passthrough_refused"] >= 1
            assert events.get("opened_passthrough", 0) == 0
            assert mnt.fuse_calls("read") >= 1 and mnt.backend_calls("read") == 0
        finally:
            mnt.unmount()


# -- the whole-file form in-process -----------------------------------------------------------

def _layer(tmp_path: Path, max_bytes: int = 64 * MiB) -> DiskCache:
    cache = DiskCache(str(tmp_path), max_bytes, "test://", Stats(), free_floor=0,
                      block_size=MiB)
    cache.load()
    return cache


def _on_disk(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def test_sealing_replaces_the_blocks_and_keeps_the_count_true(tmp_path):
    cache = _layer(tmp_path)
    data = random.Random(3).randbytes(3 * MiB + 5)
    for index in range(4):
        cache._write(cache.digest(("/f", "v1", index)), data[index * MiB:(index + 1) * MiB])
    assert not cache.seal("/f", "v1", len(data) + MiB)  # a block missing: nothing done
    assert cache.seal("/f", "v1", len(data), ("adler32", "1ABC", _Fixed("00001abc")))
    assert cache.currsize == _on_disk(tmp_path)
    assert len(cache) == 1 and cache.has(("/f", "v1", 3)) and not cache.has(("/f", "v1", 4))
    assert cache._read_whole_block(cache.whole("/f", "v1"), 2) == data[2 * MiB:3 * MiB]
    record = cache.whole("/f", "v1")
    assert record.covers({"adler32": "00001abc", "md5": "ff"})  # the md5 was not known
    assert record.covers({"adler32": "1abc"}) and not record.covers({"adler32": "1abd"})
    assert not record.covers({"md5": "aa"})  # verified against something else only

    fd = cache.backing_file("/f", "v1", {"adler32": "1abc"})
    assert fd is not None
    assert os.pread(fd, len(data) + 10, 0) == data
    os.close(fd)
    # A change of its identity alone (times set): checked again, passes, recorded anew.
    file = whole_files.data_file(tmp_path / "whole", record.digest)
    os.utime(file, ns=(1, 1))
    fd = cache.backing_file("/f", "v1", {})
    assert fd is not None
    os.close(fd)
    assert record.identity == whole_files.identity_of(file)
    assert _layer(tmp_path).whole("/f", "v1").identity == record.identity  # on disk too
    # Sealed unverified (--no-verify), verified by a later mount: the record says so.
    cache._write(cache.digest(("/g", "v1", 0)), b"g")
    assert cache.seal("/g", "v1", 1)
    assert cache.backing_file("/g", "v1", {"md5": "aa"}) is None
    cache.vouch("/g", "v1", {"md5": "AA"})
    assert _layer(tmp_path).whole("/g", "v1").checksums == {"md5": "aa"}
    fd = cache.backing_file("/g", "v1", {"md5": "aa"})
    assert fd is not None and os.pread(fd, 10, 0) == b"g"
    os.close(fd)
    cache.discard(("/g", "v1", 0))
    cache.discard(("/f", "v1", 1))
    assert len(cache) == 0 and cache.currsize == 0 and _on_disk(tmp_path) == 0

    # A copy that does not match the catalog's checksum: never sealed, its blocks deleted.
    for index in range(2):
        cache._write(cache.digest(("/h", "v1", index)), data[index * MiB:(index + 1) * MiB])
    assert not cache.seal("/h", "v1", 2 * MiB, ("md5", "ab" * 16, hashlib.md5()))
    assert cache.whole("/h", "v1") is None and not cache.has(("/h", "v1", 0))
    assert len(cache) == 0 and _on_disk(tmp_path) == 0


class _Fixed:
    """A hash that says ``value`` whatever it saw."""

    def __init__(self, value: str) -> None:
        self.value = value

    def update(self, data: bytes) -> None:
        pass

    def hexdigest(self) -> str:
        return self.value


def test_a_seal_cut_short_leaves_nothing_a_later_mount_serves(tmp_path):
    """A crash at any step of a seal: the leftovers are deleted when the layer is loaded."""
    cache = _layer(tmp_path)
    for name in ("a", "b", "c"):
        cache._write(cache.digest((f"/{name}", "v", 0)), name.encode() * 10)
        assert cache.seal(f"/{name}", "v", 10)
    whole = tmp_path / "whole"
    digest = {name: cache.whole(f"/{name}", "v").digest.hex() for name in "abc"}
    (whole / f"{digest['a']}.meta").unlink()         # data renamed in, record not yet
    (whole / digest["b"]).unlink()                    # only a record
    with open(whole / digest["c"], "ab") as f:        # a record that does not fit its data
        f.write(b"!")
    (whole / "0123.99.tmp").write_bytes(b"partial")   # a copy cut short
    reloaded = _layer(tmp_path)
    assert len(reloaded) == 0 and list(whole.iterdir()) == []
    assert reloaded.currsize == 0
