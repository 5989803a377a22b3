"""The kernel's listing cache (FOPEN_CACHE_DIR, through the patched pyfuse3 scripts/install.sh
builds): a repeated ``ls`` asks the daemon nothing but open and release, and the listing TTL,
``cache drop`` and changes through the mount stay exact."""

from __future__ import annotations

import os
import time

from rucio_fs.fuse.fs import KERNEL_LISTINGS


def readdirs(m) -> int:
    return m.fuse_calls("readdir")


def test_the_installed_pyfuse3_can_ask_the_kernel_to_cache_listings():
    assert KERNEL_LISTINGS  # scripts/install.sh builds pyfuse3 with the patch


def test_a_repeated_ls_is_answered_by_the_kernel(mount_fs):
    m = mount_fs()
    names = os.listdir(m.path / "ls" / "files-10000")
    before = readdirs(m)
    for _ in range(3):
        assert os.listdir(m.path / "ls" / "files-10000") == names
    assert readdirs(m) == before
    assert m.fuse_calls("opendir") >= 4  # opens still reach the daemon: it decides


def test_the_listing_ttl_and_cache_drop_are_exact(mount_fs):
    """Within the listing TTL a repeated listing is the kernel's copy: the daemon sees the
    open (it decides to keep the copy) and no readdir. Past the TTL, and after ``cache
    drop``, the daemon lists again and the kernel reads that new listing."""
    # The kernel TTL is long: only the listing TTL ends the kernel's copy here.
    m = mount_fs("demo://", "--listing-ttl", "2s", "--kernel-ttl", "10m")
    path = m.path / "ls" / "files-500"
    assert len(os.listdir(path)) == 500
    cached, opened, lists = readdirs(m), m.fuse_calls("opendir"), backend_lists(m)
    assert len(os.listdir(path)) == 500
    assert readdirs(m) == cached
    assert m.fuse_calls("opendir") == opened + 1
    assert backend_lists(m) == lists
    time.sleep(2.5)  # the daemon's listing is gone: the kernel's copy is not kept
    assert len(os.listdir(path)) == 500
    assert readdirs(m) > cached and backend_lists(m) == lists + 1
    os.listdir(path)
    cached = readdirs(m)
    m.drop()
    assert len(os.listdir(path)) == 500
    assert readdirs(m) > cached


def backend_lists(m) -> int:
    return m.stats()["backend_counters"].get("list", 0)


def test_changes_through_the_mount_show_in_the_next_listing(mount_fs):
    m = mount_fs("memory://")
    (m.path / "d").mkdir()
    (m.path / "d" / "a.txt").write_text("a")
    assert os.listdir(m.path / "d") == ["a.txt"]
    assert os.listdir(m.path / "d") == ["a.txt"]  # now from the kernel
    (m.path / "d" / "b.txt").write_text("b")
    assert sorted(os.listdir(m.path / "d")) == ["a.txt", "b.txt"]
    (m.path / "d" / "a.txt").unlink()
    assert os.listdir(m.path / "d") == ["b.txt"]
    os.rename(m.path / "d" / "b.txt", m.path / "d" / "c.txt")
    assert os.listdir(m.path / "d") == ["c.txt"]


def test_ls_l_after_the_entries_expired_reads_the_listing_not_each_entry(mount_fs):
    """The kernel's copy of a listing is not used once the dentries and attributes its
    reading gave have (half) run out: `ls -l` would then cost a LOOKUP per entry (a storm of
    10,000 per user measured with 10 users at once); reading the listing again renews them."""
    m = mount_fs()
    path = m.path / "ls" / "files-500"

    def ls_l() -> None:
        for name in os.listdir(path):
            os.lstat(path / name)

    ls_l()
    time.sleep(1.2)  # past the kernel TTL (1 s) of every entry
    lookups, listed = m.fuse_calls("lookup"), readdirs(m)
    ls_l()
    assert readdirs(m) > listed
    assert m.fuse_calls("lookup") - lookups < 10
