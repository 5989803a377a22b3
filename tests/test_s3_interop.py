"""rucio-fs and s3fs-fuse on the same bucket and prefix: the times, modes, owners and symbolic
links one of them writes, the other shows.

s3fs 1.90 (Debian's; scripts/install.sh installs it) runs in the background as it does for its
users, against versitygw of the ``s3_server`` fixture. Nothing here skips: a machine without
s3fs fails these tests. Every value written differs from what a client shows for an object
without attributes (the upload time, the default mode, the mounting user, a regular file), so
a client that ignored the stored metadata fails.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import run_cli, wait_for

#: Regular files: name -> (content, mode, modification time for ``touch -d``).
FILES = {
    "f.txt": (b"plain text\n", 0o640, "@1234567890.987654321"),
    "run.sh": (b"#!/bin/sh\necho hi\n", 0o755, "@1111111111"),
    "dir/inner.dat": (bytes(range(256)) * 4, 0o600, "@1222222222.5"),
}
#: The directory's mode and time, set once its file is in it.
DIR = ("dir", 0o750, "@1333333333")
#: Symbolic links: name -> target (one resolves, one dangles).
LINKS = {"link": "dir/inner.dat", "dangling": "../elsewhere/missing"}
#: The owner of f.txt (neither root nor the mounting user).
OWNER = (1234, 99)


def run(*args: object, cwd: Path | None = None) -> None:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, cwd=cwd,
                          timeout=120)
    assert done.returncode == 0, f"{' '.join(map(str, args))}: {done.stderr.strip()}"


def build(root: Path) -> None:
    """The tree of FILES, DIR and LINKS under ``root``, made with the tools people use."""
    (root / DIR[0]).mkdir()
    for name, (content, mode, when) in FILES.items():
        (root / name).write_bytes(content)
        run("chmod", f"{mode:o}", root / name)
        if name == "f.txt":
            run("chown", f"{OWNER[0]}:{OWNER[1]}", root / name)
        run("touch", "-d", when, root / name)
    for name, target in LINKS.items():
        run("ln", "-s", target, root / name)
    run("chmod", f"{DIR[1]:o}", root / DIR[0])
    run("touch", "-d", DIR[2], root / DIR[0])


def seconds(when: str) -> int:
    return int(float(when.lstrip("@")))


@dataclass(frozen=True)
class Shown:
    """What ``lstat`` (and ``readlink``) shows of one name: times to the second."""

    type: int
    mode: int
    mtime: int
    uid: int | None = None
    gid: int | None = None
    target: str | None = None


def shown(root: Path, name: str, owner: bool = False) -> Shown:
    st = os.lstat(root / name)
    link = os.readlink(root / name) if stat.S_ISLNK(st.st_mode) else None
    return Shown(stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_mtime_ns // 10**9,
                 st.st_uid if owner else None, st.st_gid if owner else None, link)


def wanted() -> dict[str, Shown]:
    """What every client should show of the tree :func:`build` makes (link times aside)."""
    result = {name: Shown(stat.S_IFREG, mode, seconds(when))
              for name, (_, mode, when) in FILES.items()}
    result["f.txt"] = Shown(stat.S_IFREG, FILES["f.txt"][1], seconds(FILES["f.txt"][2]),
                            *OWNER)
    result[DIR[0]] = Shown(stat.S_IFDIR, DIR[1], seconds(DIR[2]))
    return result


def check(root: Path, who: str) -> None:
    """``root`` shows the tree of :func:`build`: each file's type, mode, time (to the second),
    f.txt's owner, the contents, and each link as a link to its target."""
    got = {name: shown(root, name, owner=name == "f.txt") for name in wanted()}
    assert got == wanted(), f"{who} shows other attributes"
    for name, target in LINKS.items():
        st = os.lstat(root / name)
        assert stat.S_ISLNK(st.st_mode), f"{who}: {name} is not a symlink ({st.st_mode:o})"
        assert os.readlink(root / name) == target, who
    for name, (content, _, _) in FILES.items():
        assert (root / name).read_bytes() == content, f"{who}: {name}"
    assert (root / "link").read_bytes() == FILES["dir/inner.dat"][0], who


def s3fs_pids(path: Path) -> list[int]:
    """The s3fs processes serving ``path`` (each test's mount point is its own)."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"s3fs") and str(path).encode() in argv:
            pids.append(int(cmdline.parent.name))
    return pids


class S3fs:
    """s3fs-fuse mounts of prefixes of bucket ``test`` (versitygw), in the background."""

    def __init__(self, endpoint: str, base: Path) -> None:
        self.endpoint, self.base = endpoint, base
        self.mounted: list[Path] = []
        self.passwd = base / "s3fs.passwd"
        self.passwd.write_text(
            f"{os.environ['AWS_ACCESS_KEY_ID']}:{os.environ['AWS_SECRET_ACCESS_KEY']}\n")
        self.passwd.chmod(0o600)

    def mount(self, prefix: str) -> Path:
        path = self.base / f"s3fs{len(self.mounted)}"
        path.mkdir()
        self.mounted.append(path)
        run("s3fs", f"test:/{prefix}", path, "-o",
            f"url={self.endpoint},use_path_request_style,passwd_file={self.passwd},"
            "endpoint=us-east-1")
        wait_for(lambda: os.path.ismount(path))
        return path

    def unmount(self, path: Path) -> None:
        """``fusermount3 -u``; the daemon killed by its PID if it has not gone in 30 s."""
        pids = s3fs_pids(path)
        subprocess.run(["fusermount3", "-u", str(path)], capture_output=True)
        deadline = time.monotonic() + 30
        while any(Path(f"/proc/{pid}").exists() for pid in pids) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
        if os.path.ismount(path):
            subprocess.run(["fusermount3", "-u", "-z", str(path)], capture_output=True)


@pytest.fixture
def s3fs(s3_server, tmp_path: Path) -> Iterator[S3fs]:
    assert shutil.which("s3fs"), "s3fs is not installed (scripts/install.sh installs it)"
    mounts = S3fs(s3_server.endpoint, tmp_path)
    try:
        yield mounts
    finally:
        for path in mounts.mounted:
            mounts.unmount(path)


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def test_what_s3fs_writes_a_fresh_rucio_fs_mount_shows(s3fs, mount_fs, s3_server):
    prefix = unique("from-s3fs")
    written = s3fs.mount(prefix)
    build(written)
    check(written, "s3fs itself")
    s3fs.unmount(written)

    mnt = mount_fs(f"s3://test/{prefix}", "-o", f"endpoint_url={s3_server.endpoint}")
    check(mnt.path, "rucio-fs")


@pytest.mark.parametrize("write_back", ["sync", "async"])
def test_what_cp_a_writes_through_rucio_fs_s3fs_shows(s3fs, mount_fs, s3_server, tmp_path,
                                                      write_back):
    source = tmp_path / "source"
    source.mkdir()
    build(source)
    check(source, "the local disk")
    prefix = unique(f"from-rucio-fs-{write_back}")
    mnt = mount_fs(f"s3://test/{prefix}", "-o", f"endpoint_url={s3_server.endpoint}",
                   "--write-back", write_back)
    run("cp", "-a", source, mnt.path / "tree")
    check(mnt.path / "tree", "rucio-fs")
    run_cli("uploads", "--wait", str(mnt.path), check=True)
    mnt.unmount(check=True)

    tree = s3fs.mount(prefix) / "tree"
    check(tree, "s3fs")
    assert shown(tree.parent, "tree") == shown(source.parent, "source"), \
        "s3fs: the copied directory itself"
