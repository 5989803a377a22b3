"""The data proxy (``--data-proxy``, ``containers/data-proxy``): every HTTP backend's ranged
reads through one caching nginx. Promises: N mounts reading one file cost the storage about
one copy; what comes through the proxy is the file's bytes, and a new version of an S3 object
is never served from the old one's cached slices; a backend whose reads must not be shared
refuses the option in one line."""

from __future__ import annotations

import hashlib
import os
import threading
import uuid
from pathlib import Path

import pytest
from conftest import run_cli

from rucio_fs.http import through_proxy

MiB = 1 << 20
BIG = "frame-4509715660.gwf"


@pytest.mark.parametrize(("url", "routed"), [
    ("http://store:8000/a/b.dat", "http://p:1/http/store:8000/a/b.dat"),
    ("https://store/a%20b?x=1&y=2", "http://p:1/https/store:443/a%20b?x=1&y=2"),
    ("http://[::1]/a", "http://p:1/http/[::1]:80/a"),
    ("file:///data/a", "file:///data/a"),
])
def test_reads_are_routed_by_origin(url, routed):
    assert through_proxy("http://p:1/", url) == routed


def _storage_bytes(log: Path, start: int, needle: str) -> int:
    """Bytes the storage's nginx sent for requests naming ``needle`` after line ``start``."""
    total = 0
    for line in log.read_text().splitlines()[start:]:
        if needle in line:
            total += int(line.split('"')[2].split()[1])
    return total


def test_four_rucio_mounts_reading_one_file_cost_the_storage_one_copy(mount_fs, rucio_server,
                                                                      data_proxy):
    size = 160 * MiB
    mounts = [mount_fs("rucio:///bench/big?schemes=http", "--data-proxy", data_proxy.url)
              for _ in range(4)]
    log = Path(rucio_server.env["ACCESS_LOG"]).parent / "nginx-access.log"
    start = len(log.read_text().splitlines())
    digests: list[str] = []

    def read(mount) -> None:
        with open(mount.path / BIG, "rb") as f:
            digests.append(hashlib.sha256(f.read(size)).hexdigest())

    threads = [threading.Thread(target=read, args=(m,)) for m in mounts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    [stored] = Path(rucio_server.env["DAV_ROOT"]).rglob(BIG)
    with open(stored, "rb") as f:
        truth = hashlib.sha256(f.read(size)).hexdigest()
    assert digests == [truth] * 4
    served = _storage_bytes(log, start, BIG)
    read_ahead = 32 * MiB  # each reader's read-ahead past what it asked for
    assert size <= served <= 1.1 * (size + read_ahead), served / MiB
    assert any("cache=HIT" in line for line in data_proxy.log_lines())


def test_s3_reads_are_cached_and_a_new_version_is_never_served_stale(mount_fs, s3_server,
                                                                     data_proxy):
    prefix = f"proxied-{uuid.uuid4().hex[:8]}"
    old, new = os.urandom(6 * MiB), os.urandom(6 * MiB)
    client = s3_server.client()
    client.put_object(Bucket="test", Key=f"{prefix}/f.dat", Body=old)

    def mounted():
        return mount_fs(f"s3://test/{prefix}", "-o", f"endpoint_url={s3_server.endpoint}",
                        "--data-proxy", data_proxy.url)

    assert (mounted().path / "f.dat").read_bytes() == old
    assert (mounted().path / "f.dat").read_bytes() == old
    lines = data_proxy.log_lines()
    assert sum("cache=MISS" in line for line in lines) >= 1
    assert sum("cache=HIT" in line for line in lines) >= 1
    client.put_object(Bucket="test", Key=f"{prefix}/f.dat", Body=new)
    assert (mounted().path / "f.dat").read_bytes() == new


@pytest.mark.parametrize("url", ["demo://", "memory://proxy"])
def test_backends_without_cacheable_reads_refuse_the_proxy_in_one_line(url, tmp_path):
    result = run_cli("mount", url, str(tmp_path), "--data-proxy", "http://127.0.0.1:9")
    assert result.returncode != 0 and "data proxy" in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_irods_refuses_the_proxy_in_one_line(irods_server, tmp_path):
    result = run_cli("mount", irods_server.url(irods_server.home), str(tmp_path),
                     "--data-proxy", "http://127.0.0.1:9",
                     env={**os.environ, "IRODS_PASSWORD": irods_server.password})
    assert result.returncode != 0 and "not cacheable" in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr


@pytest.mark.parametrize("proxy", ["ftp://x", "http://", "http://h:1/?a=1"])
def test_bad_proxy_urls_are_one_line_errors(proxy, tmp_path):
    result = run_cli("mount", "demo://", str(tmp_path), "--data-proxy", proxy)
    assert result.returncode != 0 and "data proxy" in result.stderr
    assert result.stderr.count("\n") == 1
