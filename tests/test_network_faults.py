"""Network faults between the mount and real servers: a fault-injecting proxy sits in front
of the Rucio server's storage (or the Rucio server itself) and drops, stalls or corrupts
answers. A read either retries to the right bytes or fails with EIO in bounded time; a listing
is complete or an error. Never wrong data, never a hang, never a short result."""

from __future__ import annotations

import errno
import os
import time

import pytest
from conftest import adler32
from fault_proxy import fault_proxy


@pytest.fixture
def storage_proxy(rucio_server):
    with fault_proxy(f"http://127.0.0.1:{rucio_server.env['DAV_HTTP']}") as proxy:
        yield proxy


def mount_through(mount_fs, rucio_server, proxy, dataset: str, *options: str,
                  timeout: str = "1s"):
    """A mount of ``dataset`` whose storage reads all go through ``proxy``. Reads follow the
    replica catalog (no guessed first reads: those are tested under faults in
    test_rucio_first_byte.py), so each read here meets the faults through the reader's
    retries."""
    storage = f"http://127.0.0.1:{rucio_server.env['DAV_HTTP']}/"
    url = (f"rucio:///bench/{dataset}?schemes=http&timeout={timeout}&speculate=off"
           f"&redirect={storage}={proxy.url}/")
    return mount_fs(url, *options)


def test_dropped_connections_are_retried_to_the_right_bytes(mount_fs, rucio_server,
                                                            storage_proxy):
    m = mount_through(mount_fs, rucio_server, storage_proxy, "ds1000")
    files = rucio_server.catalog["ds1000"][:5]
    storage_proxy.inject("drop", times=3)  # fewer than one read's 4 attempts
    for f in files:
        assert adler32((m.path / f["name"]).read_bytes()) == f["adler32"]
    counters = m.stats()["backend_counters"]
    assert counters["storage_retries"] == 3
    assert counters["replica_requests"] == 5  # no read failed over or gave up


def test_a_body_that_always_ends_early_is_eio_not_a_short_file(mount_fs, rucio_server,
                                                              storage_proxy):
    m = mount_through(mount_fs, rucio_server, storage_proxy, "ds1000")
    f = rucio_server.catalog["ds1000"][10]
    storage_proxy.inject("drop", match=f["name"])
    with pytest.raises(OSError) as exc:
        (m.path / f["name"]).read_bytes()
    assert exc.value.errno == errno.EIO
    assert "body ended after" in m.log_text() or "IncompleteRead" in m.log_text()


def test_a_stalled_server_gives_eio_in_bounded_time(mount_fs, rucio_server, storage_proxy):
    m = mount_through(mount_fs, rucio_server, storage_proxy, "ds1000", "--timeout", "30s")
    f = rucio_server.catalog["ds1000"][11]
    storage_proxy.inject("stall", match=f["name"])
    start = time.monotonic()
    with pytest.raises(OSError) as exc:
        (m.path / f["name"]).read_bytes()
    assert exc.value.errno == errno.EIO
    # 4 attempts of a 1 s stall limit, plus backoff: far below the 30 s call timeout.
    assert time.monotonic() - start < 15
    storage_proxy.clear()
    assert adler32((m.path / f["name"]).read_bytes()) == f["adler32"]


def test_a_corrupted_byte_fails_verification_then_a_clean_read_succeeds(
        mount_fs, rucio_server, storage_proxy):
    m = mount_through(mount_fs, rucio_server, storage_proxy, "ds1000")
    f = rucio_server.catalog["ds1000"][12]
    storage_proxy.inject("corrupt", match=f["name"], times=1)
    with pytest.raises(OSError) as exc:
        (m.path / f["name"]).read_bytes()
    assert exc.value.errno == errno.EIO
    assert "adler32 mismatch: the catalog says" in m.log_text()
    # Nothing of the bad pass is served again: the next open fetches and verifies anew.
    assert adler32((m.path / f["name"]).read_bytes()) == f["adler32"]


def test_a_truncated_listing_is_an_error_never_a_shorter_listing(mount_fs, rucio_server):
    with fault_proxy(rucio_server.env["RUCIO_HOST"]) as proxy:
        port = proxy.port
        m = mount_fs(f"rucio://127.0.0.1:{port}/bench?api=http")
        proxy.inject("drop", match="/dids/bench/ds5000/dids")
        with pytest.raises(OSError) as exc:
            os.listdir(m.path / "ds5000")
        assert exc.value.errno == errno.EIO
        assert "content of bench:ds5000: stream broken" in m.log_text()
        proxy.clear()
        assert len(os.listdir(m.path / "ds5000")) == 5000


def test_server_errors_are_retried_then_eio(mount_fs, rucio_server):
    with fault_proxy(rucio_server.env["RUCIO_HOST"]) as proxy:
        m = mount_fs(f"rucio://127.0.0.1:{proxy.port}/bench?api=http")
        proxy.inject("error", match="/dids/bench/ds1000/dids", times=2)
        assert len(os.listdir(m.path / "ds1000")) == 1000  # two 500s, then an answer
        assert m.stats()["backend_counters"]["api_retries"] >= 2
        proxy.inject("error", match="/dids/bench/ds500/dids")
        with pytest.raises(OSError) as exc:
            os.listdir(m.path / "ds500")
        assert exc.value.errno == errno.EIO
        assert "content of bench:ds500: HTTP 500 after 4 attempts" in m.log_text()


def test_a_token_is_renewed_before_it_expires(mount_fs, rucio_server):
    with fault_proxy(rucio_server.env["RUCIO_HOST"]) as proxy:
        proxy.inject("short-token", match="/auth/userpass", times=1)
        m = mount_fs(f"rucio://127.0.0.1:{proxy.port}/bench?api=http")
        assert len(os.listdir(m.path / "ds500")) == 500
        assert m.stats()["backend_counters"]["token_fetches"] == 1
        refused = rucio_server.access_log_lines('" 401 ')
        time.sleep(2.5)  # past half of the token's 4 s: renewed before use, not after a 401
        assert len(os.listdir(m.path / "ds1000")) == 1000
        assert m.stats()["backend_counters"]["token_fetches"] == 2
        assert rucio_server.access_log_lines('" 401 ') == refused


def test_an_untrusted_certificate_is_not_retried_and_says_how_to_trust_it(tmp_path, caplog):
    """A TLS certificate the client does not trust stays untrusted however often it is asked:
    the read fails at once (a replica read falls over to the next replica without waiting
    out the retries) with one line naming the fix, logged once."""
    import http.server
    import logging
    import ssl
    import subprocess
    import threading

    import trio

    from rucio_fs.errors import Unavailable
    from rucio_fs.http import ApiClient, RangeReader, RetryPolicy

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"https://127.0.0.1:{server.server_address[1]}"
    retry = RetryPolicy(attempts=4, backoff=1.0)

    async def main() -> tuple[float, float, int, int]:
        reader = RangeReader(timeout=5, retry=retry)
        api = ApiClient(url, timeout=5, retry=retry)
        start = trio.current_time()
        with pytest.raises(Unavailable, match=r"TLS certificate not trusted.*ca_cert"):
            await reader.read(url + "/file", 0, 10)
        read_took = trio.current_time() - start
        start = trio.current_time()
        with pytest.raises(Unavailable, match="TLS certificate not trusted"):
            await api.json("GET", "/catalog", what="a catalog request")
        return (read_took, trio.current_time() - start, reader.counters["retries"],
                api.counters["retries"])

    try:
        with caplog.at_level(logging.WARNING, logger="rucio_fs.http"):
            read_took, api_took, read_retries, api_retries = trio.run(main)
    finally:
        server.shutdown()
    assert read_retries == api_retries == 0 and read_took < 1.0 and api_took < 1.0
    warnings = [r for r in caplog.records if "not trusted" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
