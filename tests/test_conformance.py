"""The backend conformance suite (:mod:`rucio_fs.testing.conformance`) against every built-in
backend, in-process, on the real servers: demo, memory, S3 on versitygw and on moto, the
iRODS fake (or a real server), Rucio. The example plugin runs it against itself
(``tests/test_plugin.py``)."""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path

import pytest
from conftest import free_ports
from fault_proxy import fault_proxy
from rucio_fs.backends.demo.content import BIG_SIZE, big_file_range, small_file

from rucio_fs.testing.conformance import (
    BackendConformance,
    BigFile,
    BigFileConformance,
    CutListingConformance,
    DeadServerConformance,
    Sample,
    SampleFile,
    WritableConformance,
)

BIG_NAME = "frame-4509715660.gwf"


def dead_endpoint() -> str:
    return f"http://127.0.0.1:{free_ports(1)[0]}"


class TestDemo(BackendConformance, BigFileConformance, CutListingConformance):
    @pytest.fixture
    def url(self) -> str:
        return "demo://"

    @pytest.fixture
    def bad_urls(self) -> list[str]:
        return ["demo://?latency=soon", "demo:///some/path"]

    @pytest.fixture
    def sample(self) -> Sample:
        files = {f"file-{n:06d}.dat": SampleFile.of(small_file(n)) for n in range(1, 4)}
        return Sample("/datasets/O3a/H1", files, complete=False)

    @pytest.fixture
    def big_file(self) -> BigFile:
        return BigFile(f"/big/{BIG_NAME}", BIG_SIZE, big_file_range)

    @pytest.fixture
    def broken_listing(self) -> tuple[str, str]:
        return "demo://?faults=1", "/faults/broken-listing"


class TestMemory(WritableConformance):
    @pytest.fixture
    def url(self) -> str:
        return f"memory://conformance-{uuid.uuid4().hex[:8]}"

    @pytest.fixture
    def bad_urls(self) -> list[str]:
        return ["memory://name/a/path"]

    @pytest.fixture
    def xattr_name(self) -> str:
        return "memory.color"


class S3Conformance(WritableConformance, CutListingConformance, DeadServerConformance):
    endpoint_name = ""

    @pytest.fixture
    def endpoint(self, s3_server) -> str:
        return s3_server.env[self.endpoint_name]

    @pytest.fixture
    def url(self, endpoint) -> str:
        return f"s3://test/conformance-{uuid.uuid4().hex[:8]}?endpoint_url={endpoint}"

    @pytest.fixture
    def bad_urls(self, endpoint) -> list[str]:
        return ["s3://Bad_Bucket", f"s3://test?endpoint_url={endpoint}&part_size=1M",
                "s3://test?endpoint_url=ftp://x"]

    @pytest.fixture
    def xattr_name(self) -> str:
        return "s3.meta.color"

    @pytest.fixture
    def secrets(self) -> list[str]:
        return [os.environ["AWS_SECRET_ACCESS_KEY"]]

    @pytest.fixture
    def broken_listing(self, url, endpoint, sample):
        with fault_proxy(endpoint) as proxy:
            # Only the listing of the sample's directory (start-up lists the bucket too).
            proxy.inject("drop", match=sample.directory.rpartition("/")[2])
            yield url.replace(endpoint, proxy.url), sample.directory

    @pytest.fixture
    def dead_url(self) -> str:
        return f"s3://test?endpoint_url={dead_endpoint()}"


class TestS3Versity(S3Conformance, BigFileConformance):
    endpoint_name = "VGW_ENDPOINT"

    @pytest.fixture
    def big_file(self, s3_server, url) -> BigFile:
        """A sparse 5 GiB object put straight into versitygw's store (uploading one would
        take a minute of the suite)."""
        prefix = url.split("?")[0].removeprefix("s3://test/")
        path = Path(s3_server.env["VGW_DATA"]) / "test" / prefix / "big.dat"
        path.parent.mkdir(parents=True, exist_ok=True)
        size = 5 << 30
        with open(path, "wb") as f:
            f.truncate(size)
            f.seek(size - 4096)
            f.write(b"end!" * 1024)
        os.setxattr(path, "user.etag", f'"{hashlib.md5(b"sparse").hexdigest()}"'.encode())

        def expected(offset: int, length: int) -> bytes:
            end = size - 4096
            return (b"\0" * max(0, min(end - offset, length))
                    + (b"end!" * 1024)[max(0, offset - end):offset + length - end])

        return BigFile("/big.dat", size, expected)


class TestS3Moto(S3Conformance):
    endpoint_name = "MOTO_ENDPOINT"


class TestIrods(WritableConformance, CutListingConformance, DeadServerConformance):
    @pytest.fixture
    def url(self, irods_server) -> str:
        return irods_server.url(irods_server.collection("conformance"))

    @pytest.fixture
    def bad_urls(self, irods_server) -> list[str]:
        good = irods_server.url(irods_server.home)
        return [good + "&part_size=lots", good + "&genquery=7",
                good.split("/tempZone")[0], "irods://host:notaport/tempZone"]

    @pytest.fixture
    def xattr_name(self) -> str:
        return "irods.meta.color"

    @pytest.fixture
    def secrets(self, irods_server) -> list[str]:
        return [irods_server.password]

    @pytest.fixture
    def broken_listing(self, irods_server, url, sample):
        with fault_proxy(f"http://{irods_server.netloc}") as proxy:
            proxy.inject("drop", match=sample.directory.rpartition("/")[2])
            yield url.replace(irods_server.netloc, f"127.0.0.1:{proxy.port}"), sample.directory

    @pytest.fixture
    def dead_url(self, irods_server) -> str:
        return irods_server.url(irods_server.home).replace(
            irods_server.netloc, f"127.0.0.1:{free_ports(1)[0]}")


class TestRucio(BackendConformance, BigFileConformance, CutListingConformance,
                DeadServerConformance):
    @pytest.fixture
    def url(self, rucio_server) -> str:
        return "rucio:///bench?schemes=http"

    @pytest.fixture
    def secrets(self) -> list[str]:
        return ["secret"]  # the password of the test server's rucio.cfg

    @pytest.fixture
    def bad_urls(self) -> list[str]:
        return ["rucio:///bench?schemes=gopher", "rucio:///bench?auth=magic",
                "rucio://host:notaport/bench"]

    @pytest.fixture
    def sample(self, rucio_server) -> Sample:
        files = {f["name"]: SampleFile(f["bytes"], f["md5"])
                 for f in rucio_server.catalog["ds500"]}
        return Sample("/ds500", files)

    @pytest.fixture
    def big_file(self, rucio_server) -> BigFile:
        return BigFile(f"/big/{BIG_NAME}", BIG_SIZE, big_file_range)

    @pytest.fixture
    def broken_listing(self, rucio_server):
        with fault_proxy(rucio_server.env["RUCIO_HOST"]) as proxy:
            proxy.inject("drop", match="/dids/bench/ds500/dids")
            yield f"rucio://127.0.0.1:{proxy.port}/bench?api=http&schemes=http", "/ds500"

    @pytest.fixture
    def dead_url(self, rucio_server) -> str:
        return f"rucio://127.0.0.1:{free_ports(1)[0]}/bench?api=http&timeout=2"


class TestRucioRoot(TestRucio):
    """The same catalog read over root:// only (RSE XRD)."""

    @pytest.fixture
    def url(self, rucio_server) -> str:
        return "rucio:///bench?schemes=root"

    @pytest.fixture
    def sample(self, rucio_server) -> Sample:
        files = {f["name"]: SampleFile(f["bytes"], f["md5"])
                 for f in rucio_server.catalog["xrd"] if f["name"].startswith("xrd.f")
                 or f["name"] == "xrd-big.dat"}
        return Sample("/xrdonly", files)


class TestRucioWritable(WritableConformance):
    """Writing into Rucio (``upload_rse``), a write-once catalog: each test in a scope of
    its own, as file names are the scope's for ever."""

    #: The RSE written to, and the scheme it is read over.
    rse, scheme = "DAV", "http"

    @pytest.fixture
    def url(self, rucio_server) -> str:
        scope = f"conf{uuid.uuid4().hex[:12]}"
        with rucio_server.admin() as admin:
            admin.post(f"/scopes/root/{scope}").raise_for_status()
        return f"rucio:///{scope}?upload_rse={self.rse}&schemes={self.scheme}"

    @pytest.fixture
    def secrets(self) -> list[str]:
        return ["secret"]


class TestRucioRootWritable(TestRucioWritable):
    """Writing into Rucio on an RSE written over root:// (XRD)."""

    rse, scheme = "XRD", "root"
