"""Finding rucio-fs mounts: /proc/self/mountinfo, the FUSE connection id and the control socket.

A live mount is identified by its FUSE connection (the device minor in mountinfo, the same
number as ``/sys/fs/fuse/connections/<minor>``); its control socket lives in the runtime
directory under that number. Nothing here touches the mounted filesystem itself, so a hung
mount can still be inspected and unmounted.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from rucio_fs.errors import InvalidInput

FSTYPE = "fuse.rucio-fs"


@dataclass(frozen=True)
class MountInfo:
    mountpoint: str
    fstype: str
    source: str
    major: int
    minor: int


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo octal.
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and len(field[i + 1:i + 4]) == 3 and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def read_mounts(path: str = "/proc/self/mountinfo") -> list[MountInfo]:
    mounts = []
    with open(path) as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, tail = left.split(), right.split()
            if len(fields) < 5 or len(tail) < 2:
                continue
            major, _, minor = fields[2].partition(":")
            mounts.append(MountInfo(_unescape(fields[4]), tail[0], _unescape(tail[1]),
                                    int(major), int(minor)))
    return mounts


def find_mount(mountpoint: str) -> MountInfo | None:
    """The topmost mount at ``mountpoint`` (any filesystem type), or None."""
    target = os.path.abspath(mountpoint)
    found = None
    for mount in read_mounts():
        if mount.mountpoint == target:
            found = mount
    return found


def require_rucio_fs(mountpoint: str) -> MountInfo:
    """The rucio-fs mount at ``mountpoint``; InvalidInput with a one-line reason otherwise."""
    mount = find_mount(mountpoint)
    if mount is None:
        raise InvalidInput(f"{mountpoint}: not a mountpoint")
    if mount.fstype != FSTYPE:
        raise InvalidInput(f"{mountpoint}: not a rucio-fs mount (it is {mount.fstype})")
    return mount


def runtime_dir() -> Path:
    """Where control sockets and logs live: $RUCIO_FS_RUNTIME_DIR, /run/rucio-fs for root,
    else $XDG_RUNTIME_DIR/rucio-fs or /tmp/rucio-fs-<uid>."""
    override = os.environ.get("RUCIO_FS_RUNTIME_DIR")
    if override:
        return Path(override)
    if os.geteuid() == 0:
        return Path("/run/rucio-fs")
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    return Path(xdg, "rucio-fs") if xdg else Path(f"/tmp/rucio-fs-{os.geteuid()}")


def socket_path(minor: int) -> Path:
    return runtime_dir() / f"conn-{minor}.sock"
