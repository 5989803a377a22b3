"""Request paths are encoded in one place (``rucio_fs.http``) for every backend: a PFN or key
with odd characters reads back its own bytes from a real server (the Rucio test server's
nginx WebDAV storage), and a URL that cannot be sent fails at once, never retried."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio
from odd_names import ODD_NAMES
from rucio_fs.backends.rucio.replicas import readable_url
from rucio_fs.backends.rucio.settings import RucioSettings

from rucio_fs.errors import BadRequestTarget
from rucio_fs.http import RangeReader, tls_context


def _settings(**fields) -> RucioSettings:
    return RucioSettings(rucio_host="http://127.0.0.1:1", auth_host="http://127.0.0.1:1",
                         account="root", auth_type="userpass", **fields)


def _read(reader: RangeReader, url: str, size: int) -> bytes:
    return bytes(trio.run(reader.read, url, 0, size))


@pytest.fixture(scope="module")
def odd_files(rucio_server) -> dict[str, bytes]:
    root = Path(rucio_server.env["DAV_ROOT"]) / "rucio" / "oddnames"
    root.mkdir(parents=True, exist_ok=True)
    files = {}
    for i, name in enumerate(ODD_NAMES):
        data = f"{i}:{name}\n".encode() * 50
        (root / name).write_bytes(data)
        files[name] = data
    return files


@pytest.mark.parametrize("scheme", ["davs", "https", "http"])
def test_every_odd_pfn_reads_its_own_bytes(rucio_server, odd_files, scheme):
    env = rucio_server.env
    port = env["DAV_HTTP"] if scheme == "http" else env["DAV_HTTPS"]
    reader = RangeReader(context=tls_context(env["CA_CERT"]), timeout=10)
    try:
        for name, data in odd_files.items():
            url, local = readable_url(f"{scheme}://127.0.0.1:{port}/rucio/oddnames/{name}",
                                       _settings())
            assert not local
            assert _read(reader, url, len(data)) == data, name
    finally:
        reader.close()
    assert reader.counters["retries"] == 0


def test_odd_pfns_through_local_and_redirect_mappings(rucio_server, odd_files):
    env = rucio_server.env
    prefix = f"https://127.0.0.1:{env['DAV_HTTPS']}/rucio/"
    local = _settings(local=((prefix, env["DAV_ROOT"] + "/rucio"),))
    redirect = _settings(redirect=((prefix, f"http://127.0.0.1:{env['DAV_HTTP']}/rucio/"),))
    reader = RangeReader(context=tls_context(env["CA_CERT"]), timeout=10)
    try:
        for name, data in odd_files.items():
            for settings in (local, redirect):
                url, _ = readable_url(prefix + "oddnames/" + name, settings)
                assert _read(reader, url, len(data)) == data, (name, url)
    finally:
        reader.close()


@pytest.mark.parametrize("url", ["http://127.0.0.1:9/with space", "http://127.0.0.1:9/t\tab",
                                 "http://127.0.0.1:9/unicod\u00e9"])
def test_a_url_that_cannot_be_sent_is_a_permanent_error(url):
    reader = RangeReader(timeout=1)
    with pytest.raises(BadRequestTarget):
        _read(reader, url, 10)
    assert reader.counters["requests"] == 0 and reader.counters["retries"] == 0


def test_a_keep_alive_connection_the_server_closed_is_not_reused():
    """A server may close an idle keep-alive connection without saying so in its answer: the
    next read opens a new connection instead of failing once and waiting out a retry."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    body = b"bytes of the object\n" * 100

    class ClosesQuietly(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            self.close_connection = True  # closed after answering, no "Connection: close"

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), ClosesQuietly)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    reader = RangeReader(timeout=5)
    try:
        url = f"http://127.0.0.1:{server.server_port}/object"
        for _ in range(3):
            assert _read(reader, url, len(body)) == body
            time.sleep(0.05)  # the server's FIN arrives
    finally:
        reader.close()
        server.shutdown()
        server.server_close()
    assert reader.counters["retries"] == 0
