"""The demo catalog through a real kernel mount: listing, stat, cat, cp of a > 4 GiB file."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import subprocess
import threading

import pytest
from conftest import wait_for
from rucio_fs.backends.demo.content import BIG_MD5, BIG_SIZE, big_file_range, small_file

from rucio_fs.data import strides


def test_ls_stat_cat(mount_fs):
    m = mount_fs()
    assert sorted(os.listdir(m.path)) == ["README.txt", "big", "datasets", "ls"]
    assert sorted(os.listdir(m.path / "ls")) == sorted(
        f"files-{n}" for n in (500, 1000, 3000, 5000, 6000, 10000, 50000))
    names = os.listdir(m.path / "ls" / "files-500")
    assert len(names) == 500 and "file-000500.dat" in names and "file-000501.dat" not in names

    out = subprocess.run(["ls", "-l", m.path / "ls" / "files-1000"], capture_output=True,
                         text=True, check=True).stdout.splitlines()
    assert out[0] == "total 4000"
    assert len(out) == 1001
    assert all(line.startswith("-r--r--r-- 1 ") and " 4096 Apr  1  2019 file-" in line
               for line in out[1:])

    st = os.stat(m.path / "ls" / "files-1000" / "file-000042.dat")
    assert st.st_size == 4096 and st.st_mtime == 1_554_076_800
    content = (m.path / "ls" / "files-1000" / "file-000042.dat").read_bytes()
    assert content == small_file(42)
    assert content.splitlines()[0] == b"0000042"
    nested = m.path / "datasets" / "O3b" / "L1" / "file-000100.dat"
    assert nested.read_bytes() == small_file(100)


def test_big_file_size_is_64_bit_and_random_reads_match(mount_fs):
    m = mount_fs()
    big = m.path / "big" / f"frame-{BIG_SIZE}.gwf"
    assert os.stat(big).st_size == BIG_SIZE > 2**32
    with open(big, "rb") as f:
        for offset in (0, 65_520, 2**31 - 7, 2**32 - 3, 2**32 + 12_345, BIG_SIZE - 100):
            f.seek(offset)
            assert f.read(4096) == big_file_range(offset, 4096), offset
        f.seek(BIG_SIZE)
        assert f.read(10) == b""


@pytest.mark.slow
def test_cp_big_file_byte_for_byte(mount_fs, tmp_path):
    """The prototype's cp stopped at 205 MB (32-bit sizes); all 4,509,715,660 bytes arrive."""
    m = mount_fs()
    target = tmp_path / "copy.gwf"
    subprocess.run(["cp", m.path / "big" / f"frame-{BIG_SIZE}.gwf", target], check=True)
    assert target.stat().st_size == BIG_SIZE
    md5 = hashlib.md5()
    with open(target, "rb") as f:
        while chunk := f.read(16 << 20):
            md5.update(chunk)
    assert md5.hexdigest() == BIG_MD5
    target.unlink()


def test_read_only_and_missing(mount_fs):
    m = mount_fs()
    with pytest.raises(OSError) as exc:
        (m.path / "README.txt").write_text("x")
    assert exc.value.errno == errno.EROFS
    with pytest.raises(FileNotFoundError):
        os.stat(m.path / "ls" / "no-such-file")
    with pytest.raises(NotADirectoryError):
        os.listdir(m.path / "README.txt")


def test_xattrs_expose_checksums(mount_fs):
    m = mount_fs("demo://", "--xattrs")
    big = m.path / "big" / f"frame-{BIG_SIZE}.gwf"
    assert os.getxattr(big, "user.demo.checksum.md5") == BIG_MD5.encode()
    assert set(os.listxattr(big)) == {"user.demo.checksum.adler32", "user.demo.checksum.md5"}
    small = m.path / "ls" / "files-500" / "file-000007.dat"
    assert os.getxattr(small, "user.demo.number") == b"7"
    with pytest.raises(OSError) as exc:
        os.getxattr(small, "user.nope")
    assert exc.value.errno == errno.ENODATA


def test_xattrs_off_by_default(mount_fs):
    m = mount_fs()
    with pytest.raises(OSError) as exc:
        os.getxattr(m.path / "README.txt", "user.demo.checksum.adler32")
    assert exc.value.errno in (errno.ENOTSUP, errno.ENODATA)


def test_statfs(mount_fs):
    m = mount_fs()
    usage = shutil.disk_usage(m.path)
    assert usage.total > BIG_SIZE
    assert os.statvfs(m.path).f_namemax == 255


def test_kernel_read_ahead_is_raised_and_reported(mount_fs):
    from rucio_fs.observe.mounts import find_mount

    raised = mount_fs()
    minor = find_mount(str(raised.path)).minor
    bdi = f"/sys/class/bdi/0:{minor}/read_ahead_kb"
    with open(bdi) as f:
        assert f.read().strip() == "1024"
    kernel = raised.stats()["kernel"]
    assert kernel["read_ahead_kb"]["now"] == 1024 and kernel["max_background"]["now"] == 64
    kept = mount_fs("demo://", "--read-ahead-kb", "0", "--max-background", "0")
    kernel = kept.stats()["kernel"]
    assert "read_ahead_kb" not in kernel and "max_background" not in kernel
    with open(f"/sys/class/bdi/0:{find_mount(str(kept.path)).minor}/read_ahead_kb") as f:
        assert f.read().strip() != "1024"


def test_small_random_reads_fetch_little(mount_fs):
    """Random 4 KiB reads cost at most twice what the kernel asked for, not whole blocks."""
    import random

    m = mount_fs()
    big = m.path / "big" / f"frame-{BIG_SIZE}.gwf"
    rng = random.Random(7)
    offsets = [rng.randrange(0, BIG_SIZE - 4096) for _ in range(200)]
    fd = os.open(big, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # as a random-access reader would
        os.pread(fd, 4096, 0)
        before = m.stats()
        for offset in offsets:
            assert os.pread(fd, 4096, offset) == big_file_range(offset, 4096)
    finally:
        os.close(fd)
    after = m.stats()
    asked = after["fuse"]["read"]["bytes"] - before["fuse"]["read"]["bytes"]
    fetched = after["backend"]["read"]["bytes"] - before["backend"]["read"]["bytes"]
    assert asked >= 200 * 4096
    assert fetched <= 2 * asked, (fetched, asked)
    assert after["events"].get("prefetched_blocks", 0) <= 2  # only around the first read


def test_a_columnar_reader_gets_what_the_kernel_asks_and_no_read_ahead(mount_fs):
    """The pattern of uproot reading 2 of 10 branches (no fadvise): in each 3 MiB cluster
    one basket of 400 KiB at its start and one of 200 KiB further on, the jumps between them
    longer than a block. The kernel reads around each basket; the daemon fetches what the
    kernel asks (not whole blocks), reads no block ahead, and fetches the next baskets of the
    pattern before they are asked: beyond what was asked, only the last predictions (at most
    ``MAX_AHEAD`` spans). A stream on another handle that reads on past the baskets' size is
    read ahead again."""
    m = mount_fs()
    big = m.path / "big" / f"frame-{BIG_SIZE}.gwf"
    cluster, baskets = 3 << 20, ((0, 400 << 10), (2_400 << 10, 200 << 10))
    fd = os.open(big, os.O_RDONLY)
    try:
        before = m.stats()
        for start in range(8 << 20, (8 << 20) + 40 * cluster, cluster):
            for offset, size in baskets:
                assert os.pread(fd, size, start + offset) == big_file_range(start + offset,
                                                                            size)
    finally:
        os.close(fd)
    after = m.stats()
    asked = after["fuse"]["read"]["bytes"] - before["fuse"].get("read", {}).get("bytes", 0)
    fetched = after["backend"]["read"]["bytes"] - before["backend"].get("read", {}).get(
        "bytes", 0)
    assert asked >= 40 * (600 << 10)
    assert fetched <= asked * 1.05 + strides.MAX_AHEAD * (512 << 10), (fetched, asked)
    assert after["events"]["stride_served_reads"] >= 60, after["events"]
    assert after["events"].get("prefetched_blocks", 0) == before["events"].get(
        "prefetched_blocks", 0)
    with open(big, "rb") as f:  # a stream: from the first read on
        assert f.read(16 << 20) == big_file_range(0, 16 << 20)
    assert m.stats()["events"]["prefetched_blocks"] > 0


def test_buffered_readers_fetch_what_they_read(mount_fs):
    """Python's ``open`` buffers by ``st_blksize``: a stored file says a page, so a reader
    that opens the file per basket and reads it (fsspec's ``cat_file``, which uproot uses by
    default) makes the mount fetch what it read, not a buffer of a block per basket. Its
    first read, a small header at offset 0, is fetched as asked too. Such a file's later
    opens are direct (``--no-direct-sparse``: never)."""
    import random

    m = mount_fs()
    big = m.path / "big" / f"frame-{BIG_SIZE}.gwf"
    assert os.stat(big).st_blksize == 4096
    rng = random.Random(3)
    reads = [(0, 403)] + [(rng.randrange(8 << 20, BIG_SIZE - (1 << 20)),
                           rng.randrange(100 << 10, 700 << 10)) for _ in range(60)]
    before = m.stats()
    for offset, size in reads:
        with open(big, "rb") as f:
            f.seek(offset)
            assert f.read(size) == big_file_range(offset, size)
    after = m.stats()
    wanted = sum(size for _, size in reads)
    fetched = after["backend"]["read"]["bytes"] - before["backend"].get("read", {}).get(
        "bytes", 0)
    assert wanted <= fetched <= 1.2 * wanted, (fetched, wanted)
    # A file opened at an offset past 0 is read sparsely: its later opens are direct.
    assert after["events"]["opened_direct"] >= len(reads) - 3
    kept = mount_fs("demo://", "--no-direct-sparse")
    for offset, size in reads[:5]:
        with open(kept.path / "big" / f"frame-{BIG_SIZE}.gwf", "rb") as f:
            f.seek(offset)
            assert f.read(size) == big_file_range(offset, size)
    assert "opened_direct" not in kept.stats()["events"]


def test_a_file_being_written_is_written_in_blocks(mount_fs):
    """Content being written says a block as ``st_blksize``: Python's buffered writer sends
    it in block-sized writes, not one request per page. Stored, it says a page again."""
    m = mount_fs("memory://blksize")
    path = m.path / "out.bin"
    before = m.fuse_calls("write")
    with open(path, "wb") as f:
        assert os.fstat(f.fileno()).st_blksize == 1 << 20
        for _ in range(16 << 10):
            f.write(b"x" * 1024)
    writes = m.fuse_calls("write") - before
    assert 16 <= writes <= 20, writes
    wait_for(lambda: os.stat(path).st_blksize == 4096, timeout=30)


def test_sequential_reads_are_prefetched_in_parallel(mount_fs):
    m = mount_fs("demo://?latency=5ms")
    big = m.path / "big" / f"frame-{BIG_SIZE}.gwf"
    size = 48 << 20
    with open(big, "rb") as f:
        data = f.read(size)
    assert data == big_file_range(0, size)
    snap = m.stats()
    assert snap["events"]["prefetched_blocks"] >= 40
    assert snap["cache"]["data"]["hits"] > 0
    off = mount_fs("demo://?latency=5ms", "--prefetch-max", "0")
    with open(off.path / "big" / f"frame-{BIG_SIZE}.gwf", "rb") as f:
        assert f.read(4 << 20) == big_file_range(0, 4 << 20)
    assert "prefetched_blocks" not in off.stats()["events"]


def _peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        line = next(x for x in f if x.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def test_memory_budget_holds_under_eight_parallel_readers(mount_fs):
    """8 readers at different offsets: the daemon stays within its data budget."""
    m = mount_fs("demo://", "--data-cache-size", "64M", "--no-verify")
    big = m.path / "big" / f"frame-{BIG_SIZE}.gwf"
    pid = m.stats()["pid"]
    baseline = _peak_rss_mb(pid)
    readers = [subprocess.Popen(["dd", f"if={big}", "of=/dev/null", "bs=1M", "count=160",
                                 f"skip={i * 500}"], stderr=subprocess.DEVNULL)
               for i in range(8)]
    assert all(r.wait(timeout=300) == 0 for r in readers)
    grown = _peak_rss_mb(pid) - baseline
    # One 64 MiB budget for cached and in-flight blocks, plus allocator slack.
    assert grown < 64 + 64, f"daemon grew by {grown:.0f} MB"
    assert m.stats()["sizes"]["data_bytes"] <= 64 << 20


@pytest.mark.parametrize("write_back", ["sync", "async"])
def test_holes_and_extensions_read_as_zeros_in_reused_staging_slots(mount_fs, write_back):
    """New files are staged in reused arena slots: what an earlier file left there must
    never show through a hole or an extension by truncate."""
    mnt = mount_fs(f"memory://holes-{write_back}", "--write-back", write_back)
    for i in range(20):  # the earlier files, gone once uploaded: their slots are reused
        (mnt.path / f"old{i}").write_bytes(b"\xff" * 4096)
    for i in range(20):
        with open(mnt.path / f"hole{i}", "wb") as f:
            f.seek(1000)
            f.write(b"end")
        with open(mnt.path / f"grown{i}", "wb") as f:
            f.write(b"start")
            f.truncate(3000)
    for i in range(20):
        assert (mnt.path / f"hole{i}").read_bytes() == bytes(1000) + b"end"
        assert (mnt.path / f"grown{i}").read_bytes() == b"start" + bytes(2995)


def stat_together(paths: list) -> None:
    """``os.stat`` of every path at once, one thread each, started together."""
    barrier = threading.Barrier(len(paths))

    def one(path) -> None:
        barrier.wait()
        os.stat(path)

    threads = [threading.Thread(target=one, args=(p,)) for p in paths]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


@pytest.mark.parametrize("parallel", [True, False], ids=["told", "libfuse-default"])
def test_lookups_in_one_directory_reach_the_daemon_together(mount_fs, monkeypatch, parallel):
    """libfuse before 3.17 never tells the kernel that lookups in one directory may run at
    once, so the kernel sends them one after the other; the mount tells it
    (scripts/pyfuse3-kernel-io.patch). Eight cold stats of eight names in one directory
    (each lookup waits 0.5 s for the catalog) are then in the daemon together, not in turn."""
    if not parallel:
        monkeypatch.setenv("RUCIO_FS_PARALLEL_DIROPS", "0")
    # Directories' entries outlive the test (--kernel-ttl), so only the files are looked up.
    m = mount_fs("demo://?latency=500ms", "--kernel-ttl", "60")
    directory = m.path / "ls" / "files-500"
    os.stat(directory)
    stat_together([directory / f"file-{n:06d}.dat" for n in range(1, 9)])
    snap = m.stats()
    assert snap["kernel"]["parallel_dirops"] is parallel
    peak = snap["fuse"]["lookup"]["peak"]
    assert (peak >= 4) if parallel else (peak == 1), peak
