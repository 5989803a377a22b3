"""Cache layers, their switches, coalescing and cache drop, counted at the backend."""

from __future__ import annotations

import os
import subprocess
import time
import uuid

from conftest import run_cli, wait_for

TEN_K = ("ls", "files-10000")


def ls_l(path) -> int:
    out = subprocess.run(["ls", "-l", path], capture_output=True, text=True, check=True).stdout
    return len(out.splitlines()) - 1


def counters(m) -> dict:
    return m.stats()["backend_counters"]


def test_warm_ls_makes_zero_backend_requests(mount_fs):
    m = mount_fs()
    d = m.path.joinpath(*TEN_K)
    assert ls_l(d) == 10_000
    before = counters(m)
    assert ls_l(d) == 10_000
    assert counters(m) == before


def test_cold_ls_is_one_listing_without_per_entry_stats(mount_fs):
    m = mount_fs("demo://", "--cold")
    d = m.path / "ls" / "files-3000"  # every FUSE request reaches the daemon: not 10,000
    assert ls_l(d) == 3000
    c = counters(m)
    assert c["list"] == 1
    # Only the directory and its ancestors are re-validated (kernel TTL 0), never an entry.
    assert c.get("stat", 0) <= 20
    assert ls_l(d) == 3000
    again = counters(m)
    assert again["list"] == 2  # cold: the next ls lists again
    assert again["stat"] - c["stat"] <= 20


def test_attr_window_zero_reproduces_per_entry_stats(mount_fs):
    m = mount_fs("demo://", "--cold", "--attr-window", "0")
    assert ls_l(m.path / "ls" / "files-500") == 500
    assert counters(m)["stat"] >= 500


def test_cache_drop_makes_next_ls_cold(mount_fs):
    m = mount_fs()
    d = m.path.joinpath(*TEN_K)
    ls_l(d)
    lists = counters(m)["list"]
    ls_l(d)
    assert counters(m)["list"] == lists
    result = run_cli("cache", "drop", str(m.path), check=True)
    assert result.stdout.startswith("dropped kernel, metadata, listing, data")
    before_lookups = m.fuse_calls("lookup")
    ls_l(d)
    assert counters(m)["list"] == lists + 1
    assert m.fuse_calls("lookup") > before_lookups  # the kernel's dentries were dropped too


def test_cache_drop_single_layer(mount_fs):
    m = mount_fs()
    f = m.path / "ls" / "files-500" / "file-000001.dat"
    ls_l(f.parent)
    f.read_bytes()
    reads = counters(m)["read"]
    m.drop("data", "kernel")
    f.read_bytes()
    assert counters(m)["read"] == reads + 1
    lists = counters(m)["list"]
    ls_l(f.parent)
    assert counters(m)["list"] == lists  # listing layer kept


def test_data_cache_serves_second_open(mount_fs):
    m = mount_fs("demo://", "--no-kernel-cache")
    f = m.path / "ls" / "files-500" / "file-000003.dat"
    assert f.read_bytes() == f.read_bytes()
    assert counters(m)["read"] == 1
    layer = m.stats()["cache"]["data"]
    assert layer["hits"] >= 1 and layer["misses"] == 1


def test_page_cache_kept_for_immutable_files(mount_fs):
    m = mount_fs()
    f = m.path / "ls" / "files-500" / "file-000004.dat"
    f.read_bytes()
    reads = m.fuse_calls("read")
    f.read_bytes()
    assert m.fuse_calls("read") == reads  # served by the kernel's page cache


def test_negative_lookups_cached_in_kernel(mount_fs):
    on = mount_fs()
    off = mount_fs("demo://", "--no-kernel-cache")
    for m, expected in ((on, 1), (off, 3)):
        base = m.fuse_calls("lookup")
        for _ in range(3):
            assert not os.path.exists(m.path / "missing")
        assert m.fuse_calls("lookup") - base == expected


# Listings are never cached here, so every `ls` needs one; the path to the directory stays in
# the kernel's dentry cache, so all 20 listings start within the spawn time, far below 1 s.
COLD_LISTINGS = ("--no-listing-cache", "--no-metadata-cache", "--no-data-cache",
                 "--kernel-ttl", "10m")


def _concurrent_ls(m, users: int) -> None:
    d = m.path.joinpath(*TEN_K)
    os.stat(d)
    procs = [subprocess.Popen(["ls", d], stdout=subprocess.PIPE, text=True)
             for _ in range(users)]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert all(len(out.splitlines()) == 10_000 for out in outputs)


def test_concurrent_cold_listings_are_coalesced(mount_fs):
    m = mount_fs("demo://?latency=1s", *COLD_LISTINGS)
    _concurrent_ls(m, 20)
    snap = m.stats()
    assert snap["backend_counters"]["list"] == 1
    assert snap["coalesced"]["list"] == 19


def test_no_coalescing_makes_one_listing_per_user(mount_fs):
    m = mount_fs("demo://?latency=1s", *COLD_LISTINGS, "--no-coalescing")
    _concurrent_ls(m, 20)
    snap = m.stats()
    assert snap["backend_counters"]["list"] == 20
    assert not snap["coalesced"]


def test_listing_ttl_expires(mount_fs):
    """Within the listing TTL a repeated ``ls -l`` reaches the daemon (the kernel caches
    nothing here) and is served from its listing cache without a backend listing; past the
    TTL the next one lists again, and none does before."""
    ttl = 2.0
    m = mount_fs("demo://", "--listing-ttl", f"{ttl}s", "--no-kernel-cache")
    d = m.path / "ls" / "files-500"
    start = time.monotonic()
    assert ls_l(d) == 500
    lists, readdirs = counters(m)["list"], m.fuse_calls("readdir")
    assert ls_l(d) == 500
    assert m.fuse_calls("readdir") > readdirs  # the daemon answered it...
    assert counters(m)["list"] == lists  # ...from its listing cache

    def listed_again() -> bool:
        assert ls_l(d) == 500
        return counters(m)["list"] > lists

    wait_for(listed_again, timeout=ttl + 10, interval=0.1)
    assert counters(m)["list"] == lists + 1
    # Not before the TTL: the first listing began after `start` (load only makes it later).
    assert time.monotonic() - start >= ttl


def test_equal_entries_of_two_users_listings_become_one_object_and_only_equal_ones():
    """Per-user mounts: an entry of one user's listing is replaced by another user's only
    when every field is equal — a user is never shown a value its own catalog did not give
    (here: other checksums, other metadata, another size)."""
    from rucio_fs.backend import Entry, Kind
    from rucio_fs.cache.caches import EqualEntries

    equal = EqualEntries(max_entries=2)

    def entry(**changes) -> Entry:
        fields = {"name": "f", "kind": Kind.FILE, "size": 4, "mtime_ns": 1,
                  "checksums": {"adler32": "0001"}, "immutable": True, "metadata": {"k": "v"},
                  **changes}
        return Entry(**fields)

    first = entry()
    assert equal("/d", first) is first
    assert equal("/d", entry()) is first  # another user's equal entry: one object
    for changed in (entry(checksums={"adler32": "0002"}), entry(metadata={"k": "w"}),
                    entry(size=5)):
        assert equal("/d", changed) is changed  # its own values, never the other's
    assert equal("/e", entry()) is not first  # another directory's name is another file
    equal("/x", entry(name="x"))
    equal("/y", entry(name="y"))
    assert len(equal._entries) == 2  # bounded


def test_the_kernel_keeps_a_name_as_long_as_the_mount_would_answer_it_alike(mount_fs):
    """A name the mount's caches would answer without asking the server is kept by the
    kernel that long, not only for ``--kernel-ttl``: `rsync` and `make` stat it again for
    nothing. Once those caches expire, or are dropped, the kernel asks again (another
    client's change shows no later than it would without the kernel's cache)."""
    m = mount_fs(f"memory://kernel-keeps-{uuid.uuid4().hex[:6]}", "--kernel-ttl", "0.2",
                 "--metadata-ttl", "3", "--listing-ttl", "3")
    names = [m.path / f"f{i}" for i in range(20)]
    for path in names:
        path.write_bytes(b"x")
    for path in names:
        path.stat()
    time.sleep(0.5)  # past --kernel-ttl
    asked = m.fuse_calls("lookup") + m.fuse_calls("getattr")
    for path in names:
        path.stat()
    assert m.fuse_calls("lookup") + m.fuse_calls("getattr") == asked
    m.drop("metadata")  # dropping what the mount would answer drops the kernel's copy too
    for path in names:
        path.stat()
    dropped = m.fuse_calls("lookup") + m.fuse_calls("getattr")
    assert dropped >= asked + len(names)
    time.sleep(3.5)  # past the metadata and listing TTLs
    for path in names:
        path.stat()
    assert m.fuse_calls("lookup") + m.fuse_calls("getattr") >= dropped + len(names)
