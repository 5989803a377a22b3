"""The disk layer through real mounts of the demo catalog: its size limit, reuse across
remounts, and detection of damaged blocks."""

from __future__ import annotations

import contextlib
from pathlib import Path

from conftest import run_cli
from rucio_fs.backends.demo.content import big_file_range

BIG = "big/frame-4509715660.gwf"
MiB = 1 << 20


def cache_bytes(directory: Path) -> int:
    """Bytes of the block files (a writer's temporary file may vanish while we look)."""
    total = 0
    for f in directory.rglob("*"):
        with contextlib.suppress(FileNotFoundError):
            total += f.stat().st_size if f.is_file() else 0
    return total


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
