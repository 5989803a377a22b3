"""The disk layer through real mounts of the demo catalog: its size limit, reuse across
remounts, and detection of damaged blocks; in-process, the limit under concurrent writers."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

from conftest import run_cli
from rucio_fs.backends.demo.content import big_file_range

from rucio_fs.cache.disk_cache import HEADER, DiskCache
from rucio_fs.observe.stats import Stats

BIG = "big/frame-4509715660.gwf"
MiB = 1 << 20


def cache_bytes(directory: Path) -> int:
    """Bytes of the block files, from a scan that saw no change.

    A walk is not a snapshot: while read-ahead still stores blocks, it can count a block in
    one subdirectory before its eviction and the block that replaced it in another after, so
    the walk is repeated until two agree.
    """
    def scan() -> dict[Path, int]:
        sizes = {}
        for f in directory.rglob("*"):
            with contextlib.suppress(FileNotFoundError):  # a writer's temporary file, renamed
                if f.is_file():
                    sizes[f] = f.stat().st_size
        return sizes

    before = scan()
    for _ in range(100):
        after = scan()
        if after == before:
            break
        before = after
        time.sleep(0.05)
    return sum(after.values())


def read_range(path: Path, offset: int, size: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(size)


def test_size_limit_holds_under_a_larger_workload(mount_fs, tmp_path):
    cache = tmp_path / "cache"
    m = mount_fs("demo://", "--cache-dir", str(cache), "--cache-size", "8M",
                 "--cache-free-floor", "0")
    for step in range(6):  # 48 MiB through an 8 MiB cache, checking the limit as we go
        assert read_range(m.path / BIG, step * 8 * MiB, 8 * MiB) == \
            big_file_range(step * 8 * MiB, 8 * MiB)
        assert cache_bytes(cache) <= 8 * MiB
    snap = m.stats()
    assert snap["cache"]["disk"]["stores"] >= 12
    assert snap["events"]["disk_cache_evicted"] >= 4


def test_blocks_survive_a_remount_and_damage_is_detected(mount_fs, tmp_path):
    cache = tmp_path / "cache"
    # No read-ahead by the daemon: how far it runs ahead depends on timing, and a block it
    # fetches beyond what the first mount stored would be one more backend read.
    options = ("--cache-dir", str(cache), "--cache-free-floor", "0", "--prefetch-max", "0")
    m = mount_fs("demo://", *options)
    first = read_range(m.path / BIG, 0, 4 * MiB)
    assert first == big_file_range(0, 4 * MiB)
    small = (m.path / "ls/files-500/file-000007.dat").read_bytes()
    run_cli("unmount", str(m.path), check=True)
    blocks = sorted(cache.rglob("*"), key=lambda f: f.stat().st_mtime_ns)
    blocks = [f for f in blocks if f.is_file()]
    assert len(blocks) >= 5

    # Served from disk after a remount: the backend is not asked for any byte.
    m = mount_fs("demo://", *options)
    assert read_range(m.path / BIG, 0, 4 * MiB) == first
    assert (m.path / "ls/files-500/file-000007.dat").read_bytes() == small
    assert m.backend_calls("read") == 0
    assert m.stats()["cache"]["disk"]["hits"] >= 5
    run_cli("unmount", str(m.path), check=True)

    # One byte flipped in a block, one header truncated: neither is ever served.
    victim = blocks[0]
    data = bytearray(victim.read_bytes())
    data[-100] ^= 0xFF
    victim.write_bytes(bytes(data))
    broken = blocks[1]
    broken.write_bytes(broken.read_bytes()[:20])
    m = mount_fs("demo://", *options)
    assert m.stats()["events"]["disk_cache_damaged"] == 1  # found at mount
    assert read_range(m.path / BIG, 0, 4 * MiB) == first
    assert (m.path / "ls/files-500/file-000007.dat").read_bytes() == small
    snap = m.stats()
    assert snap["events"]["disk_cache_corrupt"] == 1  # found on read
    assert m.backend_calls("read") == 2  # exactly the two bad blocks were fetched again
    assert "is damaged: deleted, fetching it again" in m.log_text()


def test_drop_empties_the_disk_layer_and_cold_turns_it_off(mount_fs, tmp_path):
    cache = tmp_path / "cache"
    m = mount_fs("demo://", "--cache-dir", str(cache), "--cache-free-floor", "0")
    read_range(m.path / BIG, 0, 3 * MiB)
    assert cache_bytes(cache) >= 3 * MiB
    run_cli("cache", "drop", str(m.path), "--layer", "disk", check=True)
    assert cache_bytes(cache) == 0
    cold = mount_fs("demo://", "--cold", "--cache-dir", str(tmp_path / "unused"))
    read_range(cold.path / BIG, 0, MiB)
    assert not (tmp_path / "unused").exists()
    assert cold.stats()["config"]["disk_dir"] == ""


def test_an_evicted_block_is_gone_from_disk_before_its_space_is_reused(tmp_path, monkeypatch):
    """The limit holds on disk at every instant, not only in the cache's own count: while one
    writer is still removing the block it evicted, another writer must not fill that space."""
    block = HEADER.size + MiB
    cache = DiskCache(str(tmp_path), 2 * block, "test://", Stats(), free_floor=0,
                      block_size=MiB)
    cache.load()
    data = bytes(MiB)
    cache._write(cache.digest(("a", 1, 0)), data)
    cache._write(cache.digest(("a", 1, 1)), data)
    victim = cache._file(cache.digest(("a", 1, 0)))

    real_unlink = Path.unlink
    unlinking = threading.Event()

    def slow_unlink(self, missing_ok=False):
        if self == victim:
            unlinking.set()
            time.sleep(0.5)
        return real_unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", slow_unlink)
    # A file's small last block evicts a whole block; the space it leaves over fits another
    # block without any eviction, so nothing but the order of steps keeps the limit.
    first = threading.Thread(target=cache._write,
                             args=(cache.digest(("b", 1, 0)), bytes(1000)))
    first.start()
    assert unlinking.wait(5)
    second = threading.Thread(target=cache._write,
                              args=(cache.digest(("c", 1, 0)), bytes(MiB - 2000)))
    second.start()
    second.join(0.3)  # with the bug, it writes its block into space the victim still holds
    assert cache_bytes(tmp_path) <= 2 * block
    first.join()
    second.join()
    assert cache_bytes(tmp_path) <= 2 * block
    assert cache.currsize == cache_bytes(tmp_path)
