"""The Rucio backend against a real Rucio server (scripts/servers/rucio.sh), through the kernel.

The server holds what ``rucio_populate.py`` registered; ``rucio_server.catalog`` is that
registration, the truth every listing and read is compared against.
"""

from __future__ import annotations

import errno
import hashlib
import os
import random
import socket
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import pytest
from conftest import RUCIO_FS, adler32, run_cli, wait_for

BIG = "frame-4509715660.gwf"


def test_listings_match_the_catalog(mount_fs, rucio_server):
    m = mount_fs("rucio:///bench")
    assert {"ds10000", "ds5000", "cont", "slashes", "big", "faults", "uploaded",
            "loose.dat"} <= set(os.listdir(m.path))
    for dataset in ("ds500", "ds1000", "ds5000", "ds10000"):
        expected = {f["name"]: f["bytes"] for f in rucio_server.catalog[dataset]}
        with os.scandir(m.path / dataset) as it:
            seen = {e.name: e.stat().st_size for e in it}
        assert seen == expected, dataset
    # ds500 is attached to cont, so the scope does not list it, yet its path works.
    assert "ds500" not in os.listdir(m.path)
    assert sorted(os.listdir(m.path / "cont")) == ["ds1000", "ds500", "other:ds-other"]
    other = {f["name"] for f in rucio_server.catalog["other:ds-other"]}
    assert set(os.listdir(m.path / "cont" / "other:ds-other")) == other
    assert m.backend_calls("stat") <= 3  # sizes came with the listings, not per file


def test_cat_is_verified_against_adler32_and_md5(mount_fs, rucio_server):
    m = mount_fs("rucio:///bench")
    files = random.Random(5).sample(rucio_server.catalog["ds1000"], 25)
    for f in files:
        data = (m.path / "ds1000" / f["name"]).read_bytes()
        assert (len(data), adler32(data)) == (f["bytes"], f["adler32"])
    uploaded = rucio_server.catalog["uploaded"][0]
    data = (m.path / "uploaded" / uploaded["name"]).read_bytes()
    assert hashlib.md5(data).hexdigest() == uploaded["md5"]  # written by `rucio upload`
    other = rucio_server.catalog["other:ds-other"][0]
    data = (m.path / "cont" / "other:ds-other" / other["name"]).read_bytes()
    assert adler32(data) == other["adler32"]
    # Verification completes on release, which the kernel sends after close() returns.
    assert wait_for(lambda: m.stats()["events"].get("checksum_verified", 0) >= 27)


def test_names_with_slashes_are_percent_encoded(mount_fs, rucio_server):
    m = mount_fs("rucio:///bench", "--xattrs")
    names = sorted(os.listdir(m.path / "slashes"))
    assert names == ["%2Fleading.dat", "dir%2Ffile2.dat", "dir%2Fsub%2Ffile1.dat", "top.dat"]
    for f in rucio_server.catalog["slashes"]:
        component = f["name"].replace("/", "%2F")
        data = (m.path / "slashes" / component).read_bytes()
        assert adler32(data) == f["adler32"]
        assert os.getxattr(m.path / "slashes" / component, "user.rucio.name") == \
            f["name"].encode()
    with pytest.raises(FileNotFoundError):  # an escape that is not one of ours names nothing
        os.stat(m.path / "slashes" / "dir%2ffile2.dat")


def test_xattrs(mount_fs, rucio_server):
    m = mount_fs("rucio:///bench", "--xattrs")
    f = rucio_server.catalog["ds500"][3]
    path = m.path / "ds500" / f["name"]
    expect = {"scope": "bench", "name": f["name"], "type": "FILE", "bytes": str(f["bytes"]),
              "adler32": f["adler32"], "md5": f["md5"], "replicas": "DAV"}
    for key, value in expect.items():
        assert os.getxattr(path, f"user.rucio.{key}").decode() == value
    assert os.getxattr(m.path / "ds500", "user.rucio.type") == b"DATASET"
    assert os.getxattr(m.path / "ds500", "user.rucio.meta.project") == b"rucio-fs-tests"
    assert "user.rucio.meta.created_at" in os.listxattr(path)
    with pytest.raises(OSError) as exc:
        os.getxattr(path, "user.rucio.nonexistent")
    assert exc.value.errno == errno.ENODATA


def test_big_file_copied_byte_identical(mount_fs, rucio_server, tmp_path):
    m = mount_fs("rucio:///bench/big?schemes=http")
    path = m.path / BIG
    big = rucio_server.catalog["big"][0]
    assert path.stat().st_size == big["bytes"] == 4_509_715_660  # past 4 GiB: 64-bit sizes
    copy = tmp_path / "copy.gwf"
    subprocess.run(["cp", str(path), str(copy)], check=True)
    source = Path(rucio_server.env["DAV_ROOT"]) / "rucio" / "bench"
    original = next(source.rglob(BIG))
    result = subprocess.run(["cmp", str(original), str(copy)], capture_output=True, text=True)
    copy.unlink()
    assert result.returncode == 0, result.stdout + result.stderr
    assert wait_for(lambda: m.stats()["events"].get("checksum_verified", 0) == 1)


def test_twenty_concurrent_cold_ls_make_one_content_request(mount_fs, rucio_server):
    m = mount_fs("rucio:///bench")
    request = "GET /dids/bench/ds10000/dids "
    before = rucio_server.access_log_lines(request)
    procs = [subprocess.Popen(["ls", "-l", str(m.path / "ds10000")], stdout=subprocess.PIPE)
             for _ in range(20)]
    outputs = [p.communicate()[0] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert all(out.count(b"\n") == 10_001 for out in outputs)  # "total" + 10,000 files
    # gunicorn writes its access log line when the response is done.
    assert wait_for(lambda: rucio_server.access_log_lines(request) > before) and \
        rucio_server.access_log_lines(request) - before == 1


def test_concurrent_first_reads_share_replica_requests(mount_fs, rucio_server):
    # Group commit alone: no guessed reads, no sibling batches (tested in
    # test_rucio_first_byte.py).
    m = mount_fs("rucio:///bench?speculate=off&replica_batch=0")
    files = rucio_server.catalog["ds5000"][:60]
    os.listdir(m.path / "ds5000")
    results: dict[str, str] = {}

    def read(name: str) -> None:
        results[name] = adler32((m.path / "ds5000" / name).read_bytes())

    threads = [threading.Thread(target=read, args=(f["name"],)) for f in files]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {f["name"]: f["adler32"] for f in files}
    counters = m.stats()["backend_counters"]
    assert counters["replica_dids"] == 60
    assert counters["replica_requests"] < 30  # they waited for each other, not one each


def test_replica_fallback_short_storage_and_dead_storage(mount_fs, rucio_server):
    m = mount_fs("rucio:///bench/faults?rses=DEAD,DAV&timeout=2s")
    fallback = next(f for f in rucio_server.catalog["faults"] if f["name"] == "fallback.dat")
    assert adler32((m.path / "fallback.dat").read_bytes()) == fallback["adler32"]
    for name in ("dead.dat", "short.dat"):
        start = time.monotonic()
        with pytest.raises(OSError) as exc:
            (m.path / name).read_bytes()
        assert exc.value.errno == errno.EIO
        assert time.monotonic() - start < 30
    assert "short.dat: no readable replica (DAV: storage holds fewer bytes" in m.log_text()
    assert "dead.dat: no readable replica (DEAD:" in m.log_text()


def test_storage_down_gives_eio_then_recovers(mount_fs, rucio_server):
    m = mount_fs("rucio:///bench/ds1000?schemes=http&timeout=2s", "--timeout", "20s")
    files = rucio_server.catalog["ds1000"]
    assert adler32((m.path / files[0]["name"]).read_bytes()) == files[0]["adler32"]
    rucio_server.control("stop-storage")
    try:
        start = time.monotonic()
        with pytest.raises(OSError) as exc:
            (m.path / files[1]["name"]).read_bytes()
        assert exc.value.errno == errno.EIO
        assert time.monotonic() - start < 20
    finally:
        rucio_server.control("start-storage")
    data = wait_for(lambda: _read_or_none(m.path / files[1]["name"]), timeout=20)
    assert adler32(data) == files[1]["adler32"]


def _read_or_none(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def test_token_expiry_mid_mount_is_handled(mount_fs, rucio_server):
    m = mount_fs("rucio:///bench")
    assert len(os.listdir(m.path / "ds500")) == 500
    assert m.stats()["backend_counters"]["token_fetches"] == 1
    _expire_tokens(rucio_server)
    refused = rucio_server.access_log_lines('" 401 ')
    assert len(os.listdir(m.path / "ds1000")) == 1000  # its token was refused, then renewed
    assert rucio_server.access_log_lines('" 401 ') > refused
    assert m.stats()["backend_counters"]["token_fetches"] == 2


def _expire_tokens(server) -> None:
    """Expire every token the server issued: in its database and in memcached's copies."""
    with sqlite3.connect(server.base / "rucio.db") as db:
        db.execute("UPDATE tokens SET expired_at = '2000-01-01 00:00:00'")
    port = int(next(line.split()[-1] for line in
                    (server.base / "etc" / "rucio.cfg").read_text().splitlines()
                    if line.startswith("url = ")).rpartition(":")[2])
    with socket.create_connection(("127.0.0.1", port)) as mc:
        mc.sendall(b"flush_all\r\n")
        assert mc.recv(100).startswith(b"OK")


def test_existing_token_from_the_environment(mount_fs, rucio_server, tmp_path):
    token = _userpass_token(rucio_server)
    env = dict(os.environ, RUCIO_AUTH_TOKEN=token)
    mnt = tmp_path / "tok"
    mnt.mkdir()
    result = subprocess.run([*RUCIO_FS, "mount", "rucio:///bench?auth=token", str(mnt),
                             "--log-file", str(tmp_path / "tok.log")], env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    try:
        assert len(os.listdir(mnt / "ds500")) == 500
        assert token not in (tmp_path / "tok.log").read_text()  # never logged
    finally:
        run_cli("unmount", str(mnt), check=True)
    env["RUCIO_AUTH_TOKEN"] = "root-ddmlab-unknown-" + "0" * 32
    result = subprocess.run([*RUCIO_FS, "mount", "rucio:///bench?auth=token", str(mnt)],
                            env=env, capture_output=True, text=True, timeout=120)
    if result.returncode == 0:
        run_cli("unmount", str(mnt))
    assert result.returncode == 1
    assert "Rucio refused the token in RUCIO_AUTH_TOKEN" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1

    # A token file, as `rucio whoami` or an OIDC agent leaves one: rucio.cfg names it.
    token_file = tmp_path / "token"
    token_file.write_text(token)
    cfg = tmp_path / "rucio.cfg"
    cfg.write_text(Path(rucio_server.env["RUCIO_CONFIG"]).read_text().replace(
        "[client]\n", f"[client]\nauth_token_file_path = {token_file}\n"))
    result = run_cli("mount", f"rucio:///bench?auth=token&config={cfg}", str(mnt))
    assert result.returncode == 0, result.stderr
    try:
        assert len(os.listdir(mnt / "ds1000")) == 1000
    finally:
        run_cli("unmount", str(mnt), check=True)


def _userpass_token(server) -> str:
    import httpx

    response = httpx.get(server.env["RUCIO_HOST"] + "/auth/userpass", headers={
        "X-Rucio-Account": "root", "X-Rucio-Username": "ddmlab", "X-Rucio-Password": "secret"})
    return response.headers["X-Rucio-Auth-Token"]


def test_local_mount_of_the_rse_is_read_directly(mount_fs, rucio_server):
    prefix = f"https://127.0.0.1:{rucio_server.env['DAV_HTTPS']}/rucio/"
    local = Path(rucio_server.env["DAV_ROOT"]) / "rucio"
    m = mount_fs(f"rucio:///bench/ds500?local={prefix}={local}")
    f = rucio_server.catalog["ds500"][7]
    assert adler32((m.path / f["name"]).read_bytes()) == f["adler32"]
    assert m.stats()["backend_counters"].get("storage_requests", 0) == 0


def test_read_only_and_missing(mount_fs, rucio_server):
    m = mount_fs("rucio:///bench")
    with pytest.raises(OSError) as exc:
        (m.path / "ds500" / "new.dat").write_bytes(b"x")
    assert exc.value.errno == errno.EROFS
    for missing in ("nope", "ds500/nope.dat", "other:nope"):
        assert not (m.path / missing).exists()
    assert not (m.path.parent / "x").exists()


@pytest.mark.parametrize(("url", "message"), [
    ("rucio:///nosuchscope", "no scope 'nosuchscope'"),
    ("rucio:///bench/nosuchdataset", "not found"),
    ("rucio:///bench/loose.dat", "is a file, not a collection"),
    ("rucio:///?auth=kerberos", "unsupported Rucio auth_type 'kerberos'"),
    ("rucio:///?colour=red", "unknown rucio option(s) colour"),
    ("rucio:///?config=/nonexistent.cfg", "does not exist"),
    ("rucio://127.0.0.1:1/?api=http", "ConnectError"),
])
def test_bad_input_is_one_line(rucio_server, tmp_path, url, message):
    mnt = tmp_path / "m"
    mnt.mkdir()
    result = run_cli("mount", url, str(mnt), timeout=120)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_wrong_password_is_refused(rucio_server, tmp_path):
    cfg = Path(rucio_server.env["RUCIO_CONFIG"]).read_text()
    bad = tmp_path / "rucio.cfg"
    bad.write_text(cfg.replace("password = secret", "password = wrong"))
    mnt = tmp_path / "m"
    mnt.mkdir()
    result = run_cli("mount", f"rucio:///?config={bad}", str(mnt))
    assert result.returncode == 1
    assert "Rucio refused userpass authentication of account 'root'" in result.stderr
    assert "wrong" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def _x509_config(server, tmp_path, auth_type: str, **client: str) -> Path:
    """A rucio.cfg for an X.509 login through the server's TLS auth port."""
    lines = [f"auth_type = {auth_type}", f"auth_host = {server.env['AUTH_TLS_URL']}",
             *(f"{key} = {value}" for key, value in client.items())]
    text = Path(server.env["RUCIO_CONFIG"]).read_text()
    text = "\n".join(line for line in text.splitlines()
                     if not line.startswith(("auth_type", "auth_host", "username", "password")))
    cfg = tmp_path / f"{auth_type}.cfg"
    cfg.write_text(text.replace("[client]", "[client]\n" + "\n".join(lines)))
    return cfg


@pytest.mark.parametrize("auth_type", ["x509", "x509_proxy"])
def test_x509_login(mount_fs, rucio_server, tmp_path, auth_type, monkeypatch):
    env = rucio_server.env
    if auth_type == "x509":
        cfg = _x509_config(rucio_server, tmp_path, "x509", client_cert=env["USER_CERT"],
                           client_key=env["USER_KEY"])
    else:
        cfg = _x509_config(rucio_server, tmp_path, "x509_proxy")
        monkeypatch.setenv("X509_USER_PROXY", env["USER_PROXY"])  # the mount daemon's env
    m = mount_fs(f"rucio:///bench?config={cfg}")
    assert len(os.listdir(m.path / "ds500")) == 500
    assert m.stats()["backend_counters"]["token_fetches"] == 1
    assert rucio_server.access_log_lines(f"GET /auth/{auth_type} ") >= 1


def test_x509_login_with_an_untrusted_certificate_is_refused(rucio_server, tmp_path):
    key, cert = tmp_path / "stranger.key", tmp_path / "stranger.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                    str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=stranger"],
                   check=True, capture_output=True)
    cfg = _x509_config(rucio_server, tmp_path, "x509", client_cert=str(cert),
                       client_key=str(key))
    mnt = tmp_path / "m"
    mnt.mkdir()
    result = run_cli("mount", f"rucio:///bench?config={cfg}", str(mnt))
    assert result.returncode == 1
    assert "Rucio refused x509 authentication of account 'root'" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_cache_drop_forgets_resolved_replicas_too(mount_fs, rucio_server):
    m = mount_fs("rucio:///bench/ds500?speculate=off")  # every first read asks the catalog
    f = rucio_server.catalog["ds500"][20]
    (m.path / f["name"]).read_bytes()
    assert m.stats()["backend_counters"]["replica_requests"] == 1
    run_cli("cache", "drop", str(m.path), check=True)
    assert adler32((m.path / f["name"]).read_bytes()) == f["adler32"]
    assert m.stats()["backend_counters"]["replica_requests"] == 2  # cold means cold


def test_a_path_exists_exactly_when_the_catalog_says_so(mount_fs, rucio_server):
    """A DID reached under a collection it is not attached to is no path: not on a fresh mount,
    not after listing, and no phantom tree below one (and a 10,000-file dataset is never
    listed to check a member)."""
    stranger = rucio_server.catalog["ds10000"][0]["name"]
    member = rucio_server.catalog["ds500"][0]["name"]
    for listed_first in (False, True):
        m = mount_fs("rucio:///bench")
        if listed_first:
            assert len(os.listdir(m.path / "ds500")) == 500
        with pytest.raises(FileNotFoundError):
            os.stat(m.path / "ds500" / stranger)
        with pytest.raises(FileNotFoundError):
            os.listdir(m.path / "faults" / "ds500")
        with pytest.raises(FileNotFoundError):
            os.stat(m.path / "cont" / "ds1000" / member)
        assert (m.path / "ds500" / member).stat().st_size == 4096
        assert (m.path / "cont" / "ds500" / member).stat().st_size == 4096
        assert (m.path / "cont" / "other:ds-other").is_dir()
        assert m.backend_calls("list") == (1 if listed_first else 0)


def test_a_file_listed_in_its_scope_is_verified_too(mount_fs, rucio_server):
    m = mount_fs("rucio:///bench", "--xattrs")
    names = os.listdir(m.path)
    assert "loose.dat" in names
    loose = rucio_server.catalog["loose"][0]
    assert os.getxattr(m.path / "loose.dat", "user.rucio.adler32") == loose["adler32"].encode()
    assert adler32((m.path / "loose.dat").read_bytes()) == loose["adler32"]
    wait_for(lambda: m.stats()["events"].get("checksum_verified") == 1)


def test_names_longer_than_255_bytes_are_left_out_and_counted(mount_fs, rucio_server):
    m = mount_fs("rucio:///bench")
    names = os.listdir(m.path / "longnames")
    assert names == ["L" * 246 + ".dat"]  # "s/"*121 + "end.dat" is 249 chars, 491 bytes escaped
    assert m.stats()["events"]["listing_names_rejected"] == 1
    assert "unusable or duplicate names left out" in m.log_text()
    assert len((m.path / "longnames" / names[0]).read_bytes()) == 2000


def test_xattrs_are_asked_once_per_file(mount_fs, rucio_server):
    m = mount_fs("rucio:///bench", "--xattrs")
    path = m.path / "ds500" / rucio_server.catalog["ds500"][0]["name"]
    for _ in range(2):
        dumped = subprocess.run(["getfattr", "-d", str(path)], capture_output=True, text=True,
                                check=True).stdout
        assert "user.rucio.adler32" in dumped
    assert m.backend_calls("xattrs") == 1
