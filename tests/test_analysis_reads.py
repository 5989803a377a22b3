"""uproot, the Python ROOT reader, through a real S3 mount: a columnar read fetches what the
reader reads.

The promise: reading some branches of a TTree, or the first entries of one, costs the
server at most 1.2 times the bytes uproot reads (counted on a local copy), with uproot's
default way of opening a path; every array read through the mount equals the local one.
Reading some branches of every entry, uproot's reader threads find most baskets fetched
before they ask (strided read-ahead).
"""

from __future__ import annotations

import uuid

import numpy as np
import pytest
import uproot

from rucio_fs.testing.root_files import CountingFile, make_tree

#: The baskets of the issue's 331 MB file (50,000 entries: 400 KB and 200 KB), fewer clusters.
ENTRIES, CLUSTERS = 2_000_000, 40


def read(source, branches: list[str], entry_stop: int | None) -> dict:
    with uproot.open(source) as f:
        return f["tree"].arrays(branches, entry_stop=entry_stop, library="np")


@pytest.mark.parametrize(("branches", "entry_stop"), [(["b0", "b7"], None), (["b3"], 10_000)],
                         ids=["two-of-ten-branches", "first-entries"])
def test_columnar_reads_fetch_what_uproot_reads(mount_fs, s3_server, tmp_path,
                                                branches, entry_stop):
    local = tmp_path / "events.root"
    make_tree(local, ENTRIES, CLUSTERS)
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
    stats = m.stats()
    fetched = stats["backend"]["read"]["bytes"]
    assert counting.bytes <= fetched <= 1.2 * counting.bytes, (fetched, counting.bytes)
    if entry_stop is None:
        events = stats["events"]
        # 2 x 40 baskets in three reader threads: each thread's first few are not foretold.
        assert events["stride_served_reads"] >= 40, events
