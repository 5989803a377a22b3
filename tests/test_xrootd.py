"""root:// (XRootD) replicas of Rucio storage, through real mounts of the real Rucio server and
a real xrootd (RSE ``XRD`` of ``scripts/servers/rucio.sh``).

The promises: a file whose only replica is root:// lists and reads as the catalog says,
byte for byte (verified against its checksum), also past 4 GiB; a storage that dies mid-read
fails the read with EIO in bounded time, never a short read, and serves again once it is
back; a root:// copy that does not match the catalog's checksum fails that read, and the
file's next reads come from its other copy. A file written into a mount whose upload RSE is
written over root:// is stored there as ``rucio upload`` stores it.
"""

from __future__ import annotations

import errno
import hashlib
import os
import subprocess
import time

import pytest
from conftest import adler32, wait_for
from test_rucio_write import (
    ASYNC,
    SYNC,
    Catalog,
    cli,
    consistent,
    copy_into,
    drained,
    unique,
    writer,
)

SPARSE_SIZE = (4 << 30) + (1 << 20)
SPARSE_MARK, SPARSE_MARK_AT = b"past 4 GiB", (4 << 30) + 12345


def _files(rucio_server) -> dict[str, dict]:
    return {f["name"]: f for f in rucio_server.catalog["xrd"]}


def _counters(mnt) -> dict[str, int]:
    return mnt.stats()["backend_counters"]


def test_files_whose_only_replica_is_root_list_and_read_as_the_catalog_says(
        mount_fs, rucio_server, tmp_path):
    files = _files(rucio_server)
    mnt = mount_fs("rucio:///bench/xrd?speculate=off")
    assert sorted(os.listdir(mnt.path)) == sorted(files)
    for name, info in files.items():
        if name in ("xrd-sparse.dat", "xrd-damaged.dat"):
            continue
        assert os.stat(mnt.path / name).st_size == info["bytes"]
        data = (mnt.path / name).read_bytes()
        assert hashlib.md5(data).hexdigest() == info["md5"], name
    copy = tmp_path / "copy"
    subprocess.run(["cp", str(mnt.path / "xrd-big.dat"), str(copy)], check=True)
    assert hashlib.md5(copy.read_bytes()).hexdigest() == files["xrd-big.dat"]["md5"]
    counters = _counters(mnt)
    assert counters["xroot_requests"] >= 1 and counters.get("storage_requests", 0) == 0
    assert mnt.stats()["events"]["checksum_verified"] >= 21


def test_a_file_past_4_gib_reads_at_its_offsets(mount_fs, rucio_server):
    mnt = mount_fs("rucio:///bench/xrd?speculate=off")
    path = mnt.path / "xrd-sparse.dat"
    assert os.stat(path).st_size == SPARSE_SIZE
    with open(path, "rb") as f:
        f.seek(SPARSE_MARK_AT - 5)
        assert f.read(len(SPARSE_MARK) + 10) == bytes(5) + SPARSE_MARK + bytes(5)
        f.seek(SPARSE_SIZE - 100)
        assert f.read() == bytes(100)
        f.seek(0)
        assert f.read(4096) == bytes(4096)


def test_the_storage_killed_mid_read_is_eio_in_bounded_time_then_serves_again(
        mount_fs, rucio_server):
    files = _files(rucio_server)
    # Every read reaches the storage (--cold): none is served from what came before.
    mnt = mount_fs("rucio:///bench/xrd?speculate=off&timeout=2s", "--cold")
    path = mnt.path / "xrd-big.dat"
    expected_at = files["xrd-big.dat"]
    with open(path, "rb") as f:
        assert len(os.pread(f.fileno(), 4096, 0)) == 4096
    rucio_server.control("stop-xrootd")
    try:
        start = time.monotonic()
        with open(path, "rb") as f, pytest.raises(OSError) as exc:
            os.pread(f.fileno(), 4096, 15 << 20)
        assert exc.value.errno == errno.EIO
        assert time.monotonic() - start < 30
    finally:
        rucio_server.control("start-xrootd")
    data = wait_for(lambda: _read_or_none(path), timeout=30)
    assert hashlib.md5(data).hexdigest() == expected_at["md5"]


def _read_or_none(path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def test_a_damaged_root_copy_fails_its_read_and_the_next_reads_use_the_other_copy(
        mount_fs, rucio_server):
    damaged = _files(rucio_server)["xrd-damaged.dat"]
    mnt = mount_fs("rucio:///bench/xrd?schemes=root,https&speculate=off")
    path = mnt.path / "xrd-damaged.dat"
    with pytest.raises(OSError) as exc:
        path.read_bytes()
    assert exc.value.errno == errno.EIO
    for _ in range(2):
        assert adler32(path.read_bytes()) == damaged["adler32"]
    assert "the copy on XRD does not match the catalog's checksum" in mnt.log_text()
    events = mnt.stats()["events"]
    assert events["checksum_mismatch"] == 1 and events["checksum_verified"] >= 1


def test_a_first_read_guessed_on_a_root_rse_is_served_from_it(mount_fs, rucio_server):
    """The deterministic XRD RSE's layout is learned like a DAV one's: a cold cat reads the
    guessed root:// PFN while the replica lookup runs. The mount logs in to the storage its
    first guesses go to when it starts, so the first read pays no connection."""
    files = _files(rucio_server)
    mnt = mount_fs("rucio:///bench/xrd")
    assert _counters(mnt)["xroot_logins_ahead"] == 1
    names = sorted(n for n in files if n.startswith("xrd.f"))
    for name in names[:5]:
        assert adler32((mnt.path / name).read_bytes()) == files[name]["adler32"]
    assert _counters(mnt)["speculative_hits"] >= 1


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_files_written_to_a_root_rse_are_what_rucio_upload_makes(mount_fs, rucio_server,
                                                                 tmp_path, mode):
    """A small file (one write) and a streamed one, into a new dataset on XRD: each
    AVAILABLE there with its bytes at its PFN and attached; the real CLI downloads them
    (over root://, with xrdcp) byte for byte."""
    m = writer(mount_fs, tmp_path, "rucio:///bench?upload_rse=XRD",
               *(ASYNC if mode == "async" else SYNC))
    dataset = unique(f"xrd-written-{mode}")
    files = {f"{dataset}.small.dat": os.urandom(5000),
             f"{dataset}.streamed.dat": os.urandom(20 << 20)}
    copy_into(m, tmp_path, dataset, files)
    if mode == "async":
        drained(m)
    catalog = Catalog(rucio_server)
    for name, data in files.items():
        assert consistent(rucio_server, catalog, "bench", name, dataset, "XRD",
                          data) == "stored"
    assert "XRD: root://" in cli(rucio_server, "list-file-replicas", f"bench:{dataset}")
    download = tmp_path / "download"
    cli(rucio_server, "download", "--dir", str(download), f"bench:{dataset}")
    for name, data in files.items():
        assert (download / dataset / name).read_bytes() == data
