"""Mounting without root, as a user on a login node does: a user made by the test mounts the
demo catalog in its home through libfuse's setuid ``fusermount3``, reads, asks for stats and
unmounts. Where that user cannot open ``/dev/fuse`` (neither can ``fusermount3``, which opens
it as the user) the mount is refused in one line."""

from __future__ import annotations

import contextlib
import os
import pwd
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO, find_mount
from rucio_fs.backends.demo.content import small_file

USER = "rfs-nonroot"


@pytest.fixture
def user() -> Iterator[pwd.struct_passwd]:
    subprocess.run(["userdel", "-r", "-f", USER], capture_output=True)
    subprocess.run(["useradd", "-m", "-s", "/bin/sh", USER], check=True, capture_output=True)
    account = pwd.getpwnam(USER)
    mountpoint = Path(account.pw_dir) / "mnt"
    try:
        yield account
    finally:
        if find_mount(str(mountpoint)) is not None:
            subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], capture_output=True)
        subprocess.run(["userdel", "-r", "-f", USER], capture_output=True)


@contextlib.contextmanager
def reachable_by_all(*paths: Path) -> Iterator[None]:
    """Every directory above ``paths`` searchable by other users for the test (the
    interpreter may live under ``/root``); the modes are put back afterwards."""
    changed: dict[Path, int] = {}
    for path in paths:
        for directory in [*Path(path).resolve().parents]:
            mode = directory.stat().st_mode
            if not mode & stat.S_IXOTH and directory not in changed:
                changed[directory] = stat.S_IMODE(mode)
                directory.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)
    try:
        yield
    finally:
        for directory, mode in changed.items():
            directory.chmod(mode)


@contextlib.contextmanager
def fuse_device_mode(mode: int) -> Iterator[None]:
    before = stat.S_IMODE(os.stat("/dev/fuse").st_mode)
    os.chmod("/dev/fuse", mode)
    try:
        yield
    finally:
        os.chmod("/dev/fuse", before)


def as_user(account: pwd.struct_passwd, *command: str,
            text: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(command), user=account.pw_uid, group=account.pw_gid,
                          extra_groups=[], cwd=account.pw_dir, capture_output=True, text=text,
                          timeout=120, env={"PATH": "/usr/bin:/bin", "HOME": account.pw_dir})


def test_a_user_without_root_mounts_reads_and_unmounts(user: pwd.struct_passwd) -> None:
    cli = (sys.executable, "-m", "rucio_fs")
    mountpoint = Path(user.pw_dir) / "mnt"
    assert as_user(user, "mkdir", str(mountpoint)).returncode == 0
    with reachable_by_all(Path(sys.executable), REPO / "rucio_fs"):
        with fuse_device_mode(0o600):
            refused = as_user(user, *cli, "mount", "demo://", str(mountpoint))
            assert refused.returncode == 1, refused
            assert refused.stderr.count("\n") == 1 and "/dev/fuse" in refused.stderr
            assert "Traceback" not in refused.stderr and find_mount(str(mountpoint)) is None
        with fuse_device_mode(0o666):  # as distributions ship it
            mounted = as_user(user, *cli, "mount", "demo://", str(mountpoint))
            assert mounted.returncode == 0, mounted.stderr
            info = find_mount(str(mountpoint))
            assert info is not None and info.fstype == "fuse.rucio-fs"
            line = next(line for line in Path("/proc/mounts").read_text().splitlines()
                        if line.split()[1] == str(mountpoint))
            assert f"user_id={user.pw_uid}" in line
            # Another user's mount: the kernel checks the bits (not only root's are lifted).
            assert "default_permissions" in line.split()[3].split(",")
            read = as_user(user, "cat", str(mountpoint / "datasets/O3a/H1/file-000001.dat"),
                           text=False)
            assert read.returncode == 0 and read.stdout == small_file(1)
            stats = as_user(user, *cli, "stats", str(mountpoint))
            assert stats.returncode == 0 and "lookup" in stats.stdout, stats.stderr
            gone = as_user(user, *cli, "unmount", str(mountpoint))
            assert gone.returncode == 0, gone.stderr
            assert find_mount(str(mountpoint)) is None
