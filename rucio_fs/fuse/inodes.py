"""The inode table: inode numbers for catalog paths, with the kernel's lookup counts.

Contract (libfuse low-level semantics): every successful lookup, create or readdirplus entry
adds one to an inode's lookup count; ``forget(ino, n)`` subtracts ``n``. An inode stays known
while its count is positive (the root always), so the kernel never sees a number change meaning
under it. Inode numbers are never reused within a mount.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from rucio_fs.backend import Entry, same_attributes

ROOT_INO = 1


@dataclass(slots=True, eq=False)
class Inode:
    ino: int
    parent: int
    name: str
    path: str
    entry: Entry
    #: When ``entry`` came from the backend (monotonic seconds), for the attribute window.
    fetched_at: float = 0.0
    lookups: int = 0
    #: The FUSE layer's reply attributes for ``entry``, rebuilt when ``entry`` changes.
    attrs: Any = None
    #: Content version the kernel page cache may hold for this inode (for keep_cache).
    cached_version: str | None = None
    #: The content version a complete pass verified against the catalog checksum.
    verified_version: str | None = None
    #: Files: the verifier every read of the open version feeds (see integrity.py).
    verifier: Any = None
    #: Files: open handles the kernel serves through its page cache, and open handles it
    #: serves from a backing file (passthrough); it refuses to mix the two on one inode.
    cached_opens: int = 0
    passthrough_opens: int = 0
    #: What the backing file of those passthrough opens is held under (one per inode).
    backing_key: Any = None
    #: Dirs: open directory handles, and when the newest of them fetched its listing.
    open_dirs: int = 0
    listed_at: float = -1.0
    listing_fresh_until: float = 0.0
    #: The serial of the listing the kernel may hold cached for this directory (see
    #: ``RucioFs.opendir``); 0: none.
    kernel_listing: int = 0
    #: The listing (object) the kernel's copy was read from, while it has that serial.
    kernel_listing_of: Any = None
    #: When (monotonic) the kernel last read that listing from the daemon: what its
    #: readdirplus gave the children's dentries and attributes is valid for the kernel TTL.
    kernel_listed_at: float = 0.0
    #: Children the kernel holds dentries for, by name (dirs only).
    children: dict[str, Inode] = field(default_factory=dict)

    def take(self, entry: Entry) -> None:
        """Hold ``entry`` as the catalog now describes this name; the reply attributes
        built for the old one stay when it shows the same file (``same_attributes``: an
        entry listed or stat'ed again, or another user's on a per-user mount)."""
        if entry is not self.entry:
            if not same_attributes(self.entry, entry):
                self.attrs = None
            self.entry = entry


class InodeTable:
    """Maps inode numbers ↔ paths. Single-threaded: used only from the trio loop."""

    def __init__(self, root_entry: Entry) -> None:
        root = Inode(ROOT_INO, ROOT_INO, "", "/", root_entry, lookups=1)
        self._by_ino: dict[int, Inode] = {ROOT_INO: root}
        self._next_ino = ROOT_INO + 1

    def __len__(self) -> int:
        return len(self._by_ino)

    def __iter__(self) -> Iterator[Inode]:
        return iter(list(self._by_ino.values()))

    def __getitem__(self, ino: int) -> Inode:
        """The inode ``ino``; KeyError if the kernel has forgotten it (a stale number)."""
        return self._by_ino[ino]

    def get(self, ino: int) -> Inode | None:
        return self._by_ino.get(ino)

    def find(self, path: str) -> Inode | None:
        """The inode the kernel knows for catalog ``path``, if any."""
        node = self._by_ino[ROOT_INO]
        for name in path.strip("/").split("/") if path != "/" else ():
            child = node.children.get(name)
            if child is None:
                return None
            node = child
        return node

    def child(self, parent: Inode, name: str) -> Inode | None:
        return parent.children.get(name)

    def lookup(self, parent: Inode, name: str, entry: Entry, now: float) -> Inode:
        """Record that the kernel now knows ``parent/name`` as ``entry``; counts one lookup.

        A name whose kind changed (file ↔ directory) gets a new inode: the kernel must not see
        an inode change type. The old one lives on, detached, until it is forgotten.
        """
        inode = self.child(parent, name)
        if inode is not None and inode.entry.kind is not entry.kind:
            inode = None
        if inode is None:
            path = "/" + name if parent.path == "/" else f"{parent.path}/{name}"
            inode = Inode(self._next_ino, parent.ino, name, path, entry)
            self._next_ino += 1
            self._by_ino[inode.ino] = inode
            parent.children[name] = inode
        inode.take(entry)
        inode.fetched_at = now
        inode.lookups += 1
        return inode

    def move(self, old_parent: Inode, old_name: str, new_parent: Inode, new_name: str) -> None:
        """A rename through the mount: the inode keeps its number, its subtree's paths follow.
        An inode that was at the target is detached (it lives on until forgotten)."""
        inode = old_parent.children.pop(old_name, None)
        replaced = new_parent.children.pop(new_name, None)
        if replaced is not None and replaced is not inode:
            replaced.parent = 0
        if inode is None:
            return
        inode.parent, inode.name = new_parent.ino, new_name
        new_parent.children[new_name] = inode
        stack = [(inode, new_parent.path)]
        while stack:
            node, parent_path = stack.pop()
            node.path = "/" + node.name if parent_path == "/" else f"{parent_path}/{node.name}"
            stack.extend((child, node.path) for child in node.children.values())

    def detach(self, parent: Inode, name: str) -> None:
        """``parent/name`` was removed: the kernel may still hold the inode (open files)."""
        inode = parent.children.pop(name, None)
        if inode is not None:
            inode.parent = 0

    def forget(self, ino: int, count: int) -> None:
        """The kernel dropped ``count`` references; an inode at zero is removed (root: never)."""
        inode = self._by_ino.get(ino)
        if inode is None or ino == ROOT_INO:
            return
        inode.lookups -= count
        if inode.lookups > 0:
            return
        del self._by_ino[ino]
        parent = self._by_ino.get(inode.parent)
        if parent is not None and parent.children.get(inode.name) is inode:
            del parent.children[inode.name]
