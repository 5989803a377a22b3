"""uproot, the Python ROOT reader, through a real S3 mount: a columnar read fetches what the
reader reads.

The promise: reading some branches of a TTree, or the first entries of one, costs the
server at most 1.2 times the bytes uproot reads (counted on a local copy), with uproot's
default way of opening a path; every array read through the mount equals the local one.
"""

from __future__ import annotations

import io
import uuid
from pathlib import Path

import numpy as np
import pytest
import uproot

BRANCHES = [f"b{i}" for i in range(10)]
#: The baskets of the issue's 331 MB file (50,000 entries: 400 KB and 200 KB), fewer clusters.
ENTRIES, CLUSTERS = 2_000_000, 40


class CountingFile(io.RawIOBase):
    """A local file that counts the bytes read from it (what a reader asks for)."""

    def __init__(self, path: Path) -> None:
        self._file = open(path, "rb", buffering=0)  # noqa: SIM115 (closed by close())
        self.bytes = 0

    def readinto(self, buffer) -> int:  # type: ignore[override]
        count = self._file.readinto(buffer)
        self.bytes += count or 0
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


def make_tree(path: Path) -> None:
    """One TTree of 10 branches (5 float64, 5 float32) written in 40 clusters, uncompressed,
    so its baskets are as big as the data they hold."""
    rng = np.random.default_rng(1)
    per = ENTRIES // CLUSTERS
    with uproot.recreate(path, compression=None) as f:
        for cluster in range(CLUSTERS):
            data = {name: rng.random(per) if i < 5 else rng.random(per).astype(np.float32)
                    for i, name in enumerate(BRANCHES)}
            if cluster == 0:
                tree = f.mktree("tree", {name: a.dtype for name, a in data.items()})
            tree.extend(data)


def read(source, branches: list[str], entry_stop: int | None) -> dict:
    with uproot.open(source) as f:
        return f["tree"].arrays(branches, entry_stop=entry_stop, library="np")


@pytest.mark.parametrize(("branches", "entry_stop"), [(["b0", "b7"], None), (["b3"], 10_000)],
                         ids=["two-of-ten-branches", "first-entries"])
def test_columnar_reads_fetch_what_uproot_reads(mount_fs, s3_server, tmp_path,
                                                branches, entry_stop):
    local = tmp_path / "events.root"
    make_tree(local)
    url = f"s3://test/analysis-{uuid.uuid4().hex[:8]}"
    options = ("-o", f"endpoint_url={s3_server.endpoint}", "--no-disk-cache")
    writer = mount_fs(url, *options)
    (writer.path / "events.root").write_bytes(local.read_bytes())
    writer.unmount(check=True)

    counting = CountingFile(local)
    expected = read(counting, branches, entry_stop)
    m = mount_fs(url, *options)  # nothing of the file in any cache
    got = read(str(m.path / "events.root"), branches, entry_stop)
    for name in branches:
        assert np.array_equal(got[name], expected[name])
    fetched = m.stats()["backend"]["read"]["bytes"]
    assert counting.bytes <= fetched <= 1.2 * counting.bytes, (fetched, counting.bytes)
