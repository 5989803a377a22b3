"""The write promise, under every fault of every upload request.

Promise: a ``close`` that returned 0 means the object is on the server, byte-identical; a
``close`` that failed leaves the data pending and listed by ``rucio-fs uploads`` (or already
uploaded by a later try); once the server behaves, every pending file reaches it on its own.
A daemon killed with data pending loses nothing: the next mount adopts and uploads it.

Each S3 upload request (single PUT; create, part, complete, abort of a multipart upload; the
HEAD that confirms) fails, times out, answers late, answers a retry with a success that was
never done, or does the work and answers with an error, through a fault proxy in front of
versitygw; the server's own view (botocore, straight to versitygw) is the judge.

A single PUT answered on its first send with the MD5 of its body as ETag is proved by that
answer (the server computed it from the bytes it stored, after checking ``Content-MD5``): no
HEAD follows it, and a server that lies there is outside the promise, so the PUT's
``fake-success`` is not in the matrix. A retried PUT is not proved by its answer: its HEAD is
tried under every fault (after a first send that failed).
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import time

import pytest
from conftest import journal_records, run_cli, wait_for
from fault_proxy import fault_proxy
from test_s3 import mount_s3, unique

MiB = 1 << 20
SMALL = 100 << 10
LARGE = 11 * MiB  # three parts of 5 MiB

#: request -> (method, path substring, file size that makes the request happen, faults armed
#: first so that it happens: (proxy fault, times, method))
REQUESTS = {
    "put": ("PUT", "/f", SMALL, []),
    "create": ("POST", "?uploads", LARGE, []),
    "part": ("PUT", "partNumber=2", LARGE, []),
    "complete": ("POST", "uploadId=", LARGE, []),
    "confirm-retried-small": ("HEAD", "/f", SMALL, [("error", 1, "PUT")]),
    "confirm-large": ("HEAD", "/f", LARGE, []),
}
#: fault -> [(proxy fault, times)], applied in order
FAULTS = {
    "fails": [("error", -1)],
    "fails-once": [("error", 1)],
    "times-out": [("stall", 1)],
    "retry-fake-success": [("error", 1), ("fake-ok", 1)],
    "fake-success": [("fake-ok", 1)],
    "success-reported-as-failure": [("lost-ok", 1)],
}


def _content(size: int) -> bytes:
    seed = hashlib.sha256(str(size).encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def _stored(s3_server, key: str) -> bytes | None:
    client = s3_server.client()
    try:
        return client.get_object(Bucket="test", Key=key)["Body"].read()
    except client.exceptions.NoSuchKey:
        return None


def _write(path, data: bytes, after_open=lambda: None) -> int:
    """Write ``data`` to a new file and close it: 0, or the errno close failed with."""
    f = open(path, "wb")  # noqa: SIM115 - close is what is tested
    after_open()
    try:
        f.write(data)
    finally:
        try:
            f.close()
        except OSError as exc:
            return exc.errno or -1
    return 0


#: Every request under every fault, but for the first send of a PUT answered with the body's
#: MD5 (the server's proof, see above).
CASES = [(request, fault) for request in sorted(REQUESTS) for fault in sorted(FAULTS)
         if (request, fault) != ("put", "fake-success")]


@pytest.mark.parametrize("request_name, fault", CASES)
def test_close_returns_zero_only_for_a_byte_identical_object(mount_fs, s3_server, request_name,
                                                             fault):
    method, match, size, first = REQUESTS[request_name]
    data = _content(size)
    prefix = unique(f"wf-{request_name}-{fault}")
    key = f"{prefix}/f"
    with fault_proxy(s3_server.endpoint) as proxy:
        mnt = mount_s3(mount_fs, proxy.url, prefix, "--option", "timeout=1s", "-o", "part_size=5M",
                       "--timeout", "8")
        def arm() -> None:  # after the open: its lookup is no upload request
            for kind, times, before in first:
                proxy.inject(kind, match, times=times, method=before)
            for kind, times in FAULTS[fault]:
                proxy.inject(kind, match, times=times, method=method)

        closed = _write(mnt.path / "f", data, arm)
        stored = _stored(s3_server, key)
        if closed == 0:
            assert stored == data, "close returned 0 but the object is not what was written"
        else:  # pending once the kernel has sent RELEASE (after close returned)
            wait_for(lambda: _stored(s3_server, key) == data
                     or "pending /f" in run_cli("uploads", str(mnt.path)).stdout,
                     timeout=30, interval=0.2)
        proxy.clear()
        # Whatever happened, the data reaches the server on its own once it behaves.
        wait_for(lambda: _stored(s3_server, key) == data, timeout=40, interval=0.5)
        # On its own: by the retry loop, whose backoff may have grown to 32 s meanwhile.
        wait_for(lambda: "no pending uploads" in run_cli("uploads", str(mnt.path)).stdout,
                 timeout=70, interval=0.5)


def test_a_killed_daemon_loses_no_pending_data(mount_fs, s3_server, tmp_path):
    """kill -9 with a file open and written: the next mount (same URL and staging directory)
    lists the staged file as queued, and uploads it once the server takes it."""
    prefix = unique("killed")
    staging = tmp_path / "staging"
    options = ["--option", "timeout=1s", "--timeout", "5", "--staging-dir", str(staging)]
    with fault_proxy(s3_server.endpoint) as proxy:
        url = f"s3://test/{prefix}"
        first = mount_fs(url, "-o", f"endpoint_url={proxy.url}", *options)
        pid = first.stats()["pid"]
        f = open(first.path / "open-file", "wb")  # noqa: SIM115 - the daemon dies under it
        f.write(b"written, never closed")
        f.flush()
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not os.path.exists(f"/proc/{pid}"))
        subprocess.run(["fusermount3", "-u", "-z", str(first.path)], capture_output=True)
        with pytest.raises(OSError):
            f.close()
        assert [r["path"] for r in journal_records(staging)] == ["/open-file"], \
            "no record of the staged data"
        proxy.inject("error", "/open-file", method="PUT")
        second = mount_fs(url, "-o", f"endpoint_url={proxy.url}", *options)
        listed = run_cli("uploads", str(second.path))
        assert "put /open-file" in listed.stdout and listed.returncode == 1, listed.stdout
        assert (second.path / "open-file").read_bytes() == b"written, never closed"
        proxy.clear()
        wait_for(lambda: _stored(s3_server, f"{prefix}/open-file") == b"written, never closed",
                 timeout=40, interval=0.5)
        wait_for(lambda: not journal_records(staging), timeout=10)


def test_pending_uploads_are_retried_on_their_own(mount_fs, s3_server):
    prefix = unique("auto-retry")
    with fault_proxy(s3_server.endpoint) as proxy:
        mnt = mount_s3(mount_fs, proxy.url, prefix, "--option", "timeout=1s", "--timeout", "5")
        proxy.inject("error", "/late", method="PUT")
        assert _write(mnt.path / "late", b"arrives later") != 0
        assert "pending /late" in run_cli("uploads", str(mnt.path)).stdout
        time.sleep(1)
        proxy.clear()
        wait_for(lambda: _stored(s3_server, f"{prefix}/late") == b"arrives later", timeout=40,
                 interval=0.5)


#: iRODS: request -> (match in the request, file size that makes the request happen). A
#: write sends its op in a header, the bytes as the body; the others are forms.
IRODS_REQUESTS = {
    "write": ("irods-api-request-op: write", SMALL),
    "init": ("parallel_write_init", LARGE),
    "shutdown": ("parallel_write_shutdown", LARGE),
}


@pytest.mark.parametrize("fault", ["fails", "times-out", "retry-fake-success", "fake-success",
                                   "success-reported-as-failure"])
@pytest.mark.parametrize("request_name", sorted(IRODS_REQUESTS))
def test_irods_close_returns_zero_only_for_a_byte_identical_object(mount_fs, irods_server,
                                                                   request_name, fault):
    irods_server.require_fake()
    match, size = IRODS_REQUESTS[request_name]
    data = _content(size)
    collection = irods_server.collection(f"wf-{request_name}-{fault}")
    with fault_proxy(f"http://{irods_server.netloc}") as proxy:
        url = irods_server.url(collection).replace(irods_server.netloc,
                                                   f"127.0.0.1:{proxy.port}")
        mnt = mount_fs(url, "--option", "timeout=1s", "-o", "part_size=5M", "--timeout", "8")

        def arm() -> None:
            for kind, times in FAULTS[fault]:
                proxy.inject(kind, match, times=times, method="POST")

        closed = _write(mnt.path / "f", data, arm)
        if closed == 0:
            assert irods_server.read(f"{collection}/f") == data, "close returned 0, data differs"
        else:
            wait_for(lambda: irods_server.read(f"{collection}/f") == data
                     or "pending /f" in run_cli("uploads", str(mnt.path)).stdout,
                     timeout=30, interval=0.2)
        proxy.clear()
        wait_for(lambda: irods_server.read(f"{collection}/f") == data, timeout=40, interval=0.5)
        # On its own: by the retry loop, whose backoff may have grown to 32 s meanwhile.
        wait_for(lambda: "no pending uploads" in run_cli("uploads", str(mnt.path)).stdout,
                 timeout=70, interval=0.5)


@pytest.mark.parametrize("request_name, fault", CASES)
def test_async_uploads_wait_returns_zero_only_for_a_byte_identical_object(
        mount_fs, s3_server, request_name, fault):
    """``--write-back async``: a queued upload goes through the same confirmation; once
    ``uploads --wait`` returned 0, the object is byte-identical, whichever request under it
    failed, timed out or was answered with a success that never happened."""
    method, match, size, first_faults = REQUESTS[request_name]
    data = _content(size)
    prefix = unique(f"wfa-{request_name}-{fault}")
    key = f"{prefix}/f"
    with fault_proxy(s3_server.endpoint) as proxy:
        mnt = mount_s3(mount_fs, proxy.url, prefix, "--option", "timeout=1s", "-o", "part_size=5M",
                       "--timeout", "8", "--write-back", "async")

        def arm() -> None:
            for kind, times, before in first_faults:
                proxy.inject(kind, match, times=times, method=before)
            for kind, times in FAULTS[fault]:
                proxy.inject(kind, match, times=times, method=method)

        assert _write(mnt.path / "f", data, arm) == 0  # staged durably: the upload is queued
        first = run_cli("uploads", "--wait", str(mnt.path))
        if first.returncode == 0:
            assert _stored(s3_server, key) == data, "drained, but the object differs"
        proxy.clear()
        wait_for(lambda: run_cli("uploads", "--wait", str(mnt.path)).returncode == 0,
                 timeout=60, interval=0.5)
        assert _stored(s3_server, key) == data
        assert (mnt.path / "f").read_bytes() == data
