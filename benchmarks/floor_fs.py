"""The pyfuse3 floor: a file system that keeps names and bytes in memory and does nothing else,
mounted with the kernel options rucio-fs uses, so that ``suite.py``'s ``mdtest`` experiment can
say how close rucio-fs comes to what pyfuse3 and the kernel cost by themselves.

    python benchmarks/floor_fs.py MOUNTPOINT     # serves until unmounted (fusermount3 -u)

Single-threaded, no checks beyond what a name lookup needs; not a file system to keep data in.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import time
from typing import Any

import pyfuse3
import trio


class FloorFs(pyfuse3.Operations):
    """Names, modes and bytes in dictionaries; every request answered at once."""

    def __init__(self) -> None:
        super().__init__()
        now = time.time_ns()
        self.attrs: dict[int, pyfuse3.EntryAttributes] = {
            pyfuse3.ROOT_INODE: self._attrs(pyfuse3.ROOT_INODE, stat.S_IFDIR | 0o755, now)}
        self.children: dict[int, dict[bytes, int]] = {pyfuse3.ROOT_INODE: {}}
        self.data: dict[int, bytearray] = {}
        self.next_inode = pyfuse3.ROOT_INODE + 1

    @staticmethod
    def _attrs(inode: int, mode: int, now: int) -> pyfuse3.EntryAttributes:
        attrs = pyfuse3.EntryAttributes()
        attrs.st_ino, attrs.st_mode, attrs.st_nlink = inode, mode, 1
        attrs.st_uid, attrs.st_gid = os.getuid(), os.getgid()
        attrs.st_atime_ns = attrs.st_mtime_ns = attrs.st_ctime_ns = now
        attrs.entry_timeout = attrs.attr_timeout = 1.0
        return attrs

    def _new(self, parent: int, name: bytes, mode: int) -> pyfuse3.EntryAttributes:
        inode, self.next_inode = self.next_inode, self.next_inode + 1
        attrs = self.attrs[inode] = self._attrs(inode, mode, time.time_ns())
        self.children[parent][name] = inode
        if stat.S_ISDIR(mode):
            self.children[inode] = {}
        else:
            self.data[inode] = bytearray()
        return attrs

    async def lookup(self, parent: int, name: bytes, ctx: Any = None) -> Any:
        inode = self.children.get(parent, {}).get(name)
        if inode is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return await self.getattr(inode)

    async def getattr(self, inode: int, ctx: Any = None) -> Any:
        attrs = self.attrs[inode]
        if inode in self.data:
            attrs.st_size = len(self.data[inode])
        return attrs

    async def setattr(self, inode: int, attr: Any, fields: Any, fh: Any, ctx: Any) -> Any:
        if fields.update_size:
            del self.data[inode][attr.st_size:]
        return await self.getattr(inode)

    async def mkdir(self, parent: int, name: bytes, mode: int, ctx: Any) -> Any:
        return self._new(parent, name, stat.S_IFDIR | stat.S_IMODE(mode))

    async def create(self, parent: int, name: bytes, mode: int, flags: int,
                     ctx: Any) -> Any:
        attrs = self._new(parent, name, stat.S_IFREG | stat.S_IMODE(mode))
        return pyfuse3.FileInfo(fh=attrs.st_ino), attrs

    async def open(self, inode: int, flags: int, ctx: Any) -> Any:
        if flags & os.O_TRUNC:
            self.data[inode].clear()
        return pyfuse3.FileInfo(fh=inode)

    async def read(self, fh: int, off: int, size: int) -> bytes:
        return bytes(self.data[fh][off:off + size])

    async def write(self, fh: int, off: int, buf: bytes) -> int:
        self.data[fh][off:off + len(buf)] = buf
        return len(buf)

    async def flush(self, fh: int) -> None:
        pass

    async def release(self, fh: int) -> None:
        pass

    async def opendir(self, inode: int, ctx: Any) -> int:
        return inode

    async def readdir(self, fh: int, start_id: int, token: Any) -> None:
        names = list(self.children[fh].items())
        for index, (name, inode) in enumerate(names[start_id:], start_id + 1):
            if not pyfuse3.readdir_reply(token, name, await self.getattr(inode), index):
                return

    async def releasedir(self, fh: int) -> None:
        pass

    async def unlink(self, parent: int, name: bytes, ctx: Any) -> None:
        inode = self.children[parent].pop(name)
        self.data.pop(inode, None)

    async def rmdir(self, parent: int, name: bytes, ctx: Any) -> None:
        inode = self.children[parent][name]
        if self.children[inode]:
            raise pyfuse3.FUSEError(errno.ENOTEMPTY)
        del self.children[parent][name], self.children[inode]

    async def forget(self, inode_list: Any) -> None:
        pass

    async def statfs(self, ctx: Any) -> Any:
        return pyfuse3.StatvfsData()


def main(mountpoint: str) -> None:
    options = set(pyfuse3.default_options)
    if os.geteuid() == 0:  # as rucio-fs mounts for root alone (see its kernel_checks_permissions)
        options.discard("default_permissions")
    options |= {"fsname=floor", "subtype=floor"}
    pyfuse3.init(FloorFs(), mountpoint, options)
    try:
        trio.run(pyfuse3.main, 4, 256)
    finally:
        pyfuse3.close()


if __name__ == "__main__":
    main(sys.argv[1])
