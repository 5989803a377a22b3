"""ROOT files for the analysis tests and benchmark: a generated TTree, and a local file that
counts what a reader reads from it (the bytes "needed"). Needs uproot and numpy."""

from __future__ import annotations

import io
from pathlib import Path

#: The TTree's branches: b0-b4 float64, b5-b9 float32.
BRANCHES = [f"b{i}" for i in range(10)]


class CountingFile(io.RawIOBase):
    """A local file that counts the bytes read from it (what a reader asks for)."""

    def __init__(self, path: Path) -> None:
        self._file = open(path, "rb", buffering=0)  # noqa: SIM115 (closed by close())
        self.bytes = 0

    def readinto(self, buffer) -> int:  # type: ignore[override]
        count = self._file.readinto(buffer) or 0
        self.bytes += count
        return count

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._file.seek(offset, whence)

    def tell(self) -> int:
        return self._file.tell()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def close(self) -> None:
        self._file.close()
        super().close()


def make_tree(path: Path, entries: int, clusters: int) -> None:
    """One TTree ``tree`` of :data:`BRANCHES` written in ``clusters`` clusters, uncompressed,
    so its baskets are as big as the data they hold."""
    import numpy as np
    import uproot

    rng = np.random.default_rng(1)
    per = entries // clusters
    with uproot.recreate(path, compression=None) as f:
        for cluster in range(clusters):
            data = {name: rng.random(per) if i < 5 else rng.random(per).astype(np.float32)
                    for i, name in enumerate(BRANCHES)}
            if cluster == 0:
                tree = f.mktree("tree", {name: a.dtype for name, a in data.items()})
            tree.extend(data)
