"""Real mounts through the kernel. Nothing here skips: a machine that cannot mount FUSE fails
these tests (CI installs fuse3 and runs as root)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from rucio_fs.cli.daemon import process_running
from rucio_fs.observe.mounts import FSTYPE, find_mount
from rucio_fs.testing import irods_fake
from rucio_fs.testing.mount import RUCIO_FS, Mount
from rucio_fs.write import journal as journals
from rucio_fs.write.arena import read_slot

#: The example plugin's own tests run where it is installed (tests/test_plugin.py).
collect_ignore = ["plugin_example"]


def run_cli(*args: str, check: bool = False, env: dict[str, str] | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([*RUCIO_FS, *args], capture_output=True, text=True,
                            timeout=timeout, env=env)
    if check and result.returncode != 0:
        raise AssertionError(f"rucio-fs {' '.join(args)} failed ({result.returncode}): "
                             f"{result.stderr.strip()}")
    return result


@pytest.fixture(scope="session", autouse=True)
def runtime_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Keep this run's control sockets and logs apart from any real mount on the machine."""
    path = tmp_path_factory.mktemp("runtime")
    os.environ["RUCIO_FS_RUNTIME_DIR"] = str(path)
    return path


def _unmount(path: Path) -> None:
    if find_mount(str(path)) is None:
        return
    result = run_cli("unmount", str(path))
    if result.returncode != 0 and find_mount(str(path)) is not None:
        subprocess.run(["fusermount3", "-u", "-z", str(path)], capture_output=True)


@pytest.fixture
def mount_fs(tmp_path: Path) -> Iterator:
    """``mount_fs(url="demo://", *options)`` mounts any URL and returns a :class:`Mount`."""
    mounted: list[Path] = []

    def mount(url: str = "demo://", *options: str) -> Mount:
        path = tmp_path / f"mnt{len(mounted)}"
        path.mkdir()
        log = tmp_path / f"mnt{len(mounted)}.log"
        try:
            made = Mount.start(url, path, *options, log=log)
        except subprocess.CalledProcessError as exc:
            raise AssertionError(f"rucio-fs mount {url} failed ({exc.returncode}): "
                                 f"{exc.stderr.strip()}") from None
        mounted.append(path)
        info = find_mount(str(path))
        assert info is not None and info.fstype == FSTYPE
        return made

    yield mount
    for path in mounted:
        _unmount(path)


@contextmanager
def overlayfs(tmp_path: Path) -> Iterator[Path]:
    """An overlayfs (a container's root file system) mounted below ``tmp_path``, unmounted
    at the end: the kernel refuses its files as FUSE backing files (stacking too deep)."""
    layers = {name: tmp_path / name for name in ("lower", "upper", "work", "merged")}
    for layer in layers.values():
        layer.mkdir()
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                    f"lowerdir={layers['lower']},upperdir={layers['upper']},"
                    f"workdir={layers['work']}", str(layers["merged"])], check=True)
    try:
        yield layers["merged"]
    finally:
        subprocess.run(["umount", str(layers["merged"])], check=True)


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.02):
    """Poll ``predicate`` until it returns a truthy value; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(interval)


def journal_records(staging: Path, op: str = "stage") -> list[dict]:
    """The pending ``op`` records of every journal in ``staging`` (what a next mount replays)."""
    pending: dict[tuple[str, int], dict] = {}
    for journal in staging.glob("journal-*.log"):
        done: set[int] = set()
        for record in journals.read_records(str(journal)):
            if "done" in record or "cancelled" in record:
                done.update(record.get("done", record.get("cancelled", [])))
            else:
                pending[(journal.name, record["n"])] = record
        for n in done:
            pending.pop((journal.name, n), None)
    return [r for r in pending.values() if r["op"] == op]


def staged_bytes(staging: Path, record: dict) -> bytes:
    """The content a pending ``stage`` record (from :func:`journal_records`) stands for."""
    if "inline" in record:
        return journals.inline_content(record)
    path = staging / record["file"]
    if "slot" in record:
        fd = os.open(path, os.O_RDONLY)
        try:
            return read_slot(fd, record["slot"])
        finally:
            os.close(fd)
    return path.read_bytes()


def adler32(data: bytes) -> str:
    """A checksum as Rucio writes it: 8 lower-case hex digits."""
    return f"{zlib.adler32(data):08x}"


def dump(obj: object) -> str:
    return json.dumps(obj, indent=1)[:2000]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """In CI a skipped test is a failure: a missing server or FUSE must not pass silently."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = len(reporter.stats.get("skipped", [])) if reporter else 0
    if os.environ.get("CI") and skipped:
        reporter.write_line(f"CI: {skipped} skipped test(s) count as failures", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@dataclass
class RucioServer:
    """A running server started by ``scripts/servers/rucio.sh`` (see its ``server.env``)."""

    base: Path
    env: dict[str, str]
    catalog: dict[str, list[dict]]

    def access_log_lines(self, needle: str) -> int:
        text = Path(self.env["ACCESS_LOG"]).read_text(errors="replace")
        return sum(needle in line for line in text.splitlines())

    def control(self, command: str) -> None:
        subprocess.run(["bash", str(SERVER_SCRIPT), command, str(self.base)], check=True,
                       capture_output=True, timeout=60)

    def admin(self):
        """The server's REST API as its root account (an httpx client)."""
        import httpx

        host = self.env["RUCIO_HOST"]
        answer = httpx.get(host + "/auth/userpass", headers={
            "X-Rucio-Account": "root", "X-Rucio-Username": "ddmlab",
            "X-Rucio-Password": "secret"})
        answer.raise_for_status()
        return httpx.Client(base_url=host, timeout=30, headers={
            "X-Rucio-Auth-Token": answer.headers["X-Rucio-Auth-Token"]})


def free_ports(count: int) -> list[int]:
    """Ports nobody listens on right now (so a test server never meets a running one)."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


REPO = Path(__file__).resolve().parent.parent
SERVER_SCRIPT = REPO / "scripts" / "servers" / "rucio.sh"


@pytest.fixture(scope="session")
def rucio_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RucioServer]:
    """The real Rucio server of the tests, started once per session and stopped by PID.

    ``RUCIO_FS_TEST_RUCIO_DIR`` names the directory of a server already started with
    ``rucio.sh start DIR`` (quicker when iterating); it is then left running.
    """
    reuse = os.environ.get("RUCIO_FS_TEST_RUCIO_DIR")
    base = Path(reuse) if reuse else tmp_path_factory.mktemp("rucio-server")
    if not reuse:
        names = ("RUCIO_PORT", "DAV_HTTP", "DAV_HTTPS", "MC_PORT", "AUTH_TLS", "XRD_PORT")
        ports = {name: str(port) for name, port in zip(names, free_ports(6), strict=True)}
        result = subprocess.run(["bash", str(SERVER_SCRIPT), "start", str(base)],
                                capture_output=True, text=True, timeout=1200,
                                env={**os.environ, **ports})
        if result.returncode != 0:
            subprocess.run(["bash", str(SERVER_SCRIPT), "stop", str(base)])
            raise RuntimeError(f"Rucio server did not start:\n{result.stderr[-3000:]}")
    env = dict(line.split("=", 1) for line in
               (base / "server.env").read_text().splitlines() if "=" in line)
    catalog = json.loads((base / "catalog.json").read_text())
    previous = os.environ.get("RUCIO_CONFIG")
    os.environ["RUCIO_CONFIG"] = env["RUCIO_CONFIG"]  # the mount daemons inherit it
    try:
        yield RucioServer(base, env, catalog)
    finally:
        if previous is None:
            os.environ.pop("RUCIO_CONFIG", None)
        else:
            os.environ["RUCIO_CONFIG"] = previous
        if not reuse:
            subprocess.run(["bash", str(SERVER_SCRIPT), "stop", str(base)], timeout=120)


S3_SCRIPT = REPO / "scripts" / "servers" / "s3.sh"


@dataclass
class S3Server:
    """versitygw and moto started by ``scripts/servers/s3.sh`` (see its ``server.env``).
    Both serve bucket ``test``; the credentials are in the environment of the tests."""

    base: Path
    env: dict[str, str]

    @property
    def endpoint(self) -> str:
        return self.env["VGW_ENDPOINT"]

    @property
    def moto(self) -> str:
        return self.env["MOTO_ENDPOINT"]

    def client(self, endpoint: str | None = None):
        """A botocore client: the tests' independent view of what the server holds."""
        import botocore.session

        return botocore.session.get_session().create_client(
            "s3", endpoint_url=endpoint or self.endpoint, region_name="us-east-1")

    def control(self, command: str) -> None:
        subprocess.run(["bash", str(S3_SCRIPT), command, str(self.base)], check=True,
                       capture_output=True, timeout=60,
                       env={**os.environ, "VGW_PORT": self.env["VGW_PORT"]})

    @contextmanager
    def gateway_down(self) -> Iterator[None]:
        """versitygw stopped for the block, started again after it (even on failure)."""
        self.control("stop-gw")
        try:
            yield
        finally:
            self.control("start-gw")

    def seed(self, prefix: str, objects: dict[str, bytes]) -> None:
        """Store objects straight into versitygw's posix store, as versitygw itself does
        (file plus ETag xattr): 10,000 PUTs would take a minute of the suite on 2 cores."""
        import hashlib

        root = Path(self.env["VGW_DATA"]) / "test"
        for name, data in objects.items():
            path = root / prefix / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            os.setxattr(path, "user.etag", f'"{hashlib.md5(data).hexdigest()}"'.encode())


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """The real S3 servers of the tests, started once per session and stopped by PID.

    ``RUCIO_FS_TEST_S3_DIR`` names the directory of servers already started with
    ``s3.sh start DIR``; they are then left running.
    """
    reuse = os.environ.get("RUCIO_FS_TEST_S3_DIR")
    base = Path(reuse) if reuse else tmp_path_factory.mktemp("s3-server")
    if not reuse:
        ports = dict(zip(("VGW_PORT", "MOTO_PORT"), map(str, free_ports(2)), strict=True))
        result = subprocess.run(["bash", str(S3_SCRIPT), "start", str(base)],
                                capture_output=True, text=True, timeout=1200,
                                env={**os.environ, **ports, "PYTHON": sys.executable})
        if result.returncode != 0:
            subprocess.run(["bash", str(S3_SCRIPT), "stop", str(base)])
            raise RuntimeError(f"S3 servers did not start:\n{result.stderr[-3000:]}")
    env = dict(line.split("=", 1) for line in
               (base / "server.env").read_text().splitlines() if "=" in line)
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                            "AWS_REGION", "AWS_EC2_METADATA_DISABLED")}
    os.environ.update({k: env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                           "AWS_REGION")})
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"  # never look beyond 127.0.0.1
    try:
        yield S3Server(base, env)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if not reuse:
            subprocess.run(["bash", str(S3_SCRIPT), "stop", str(base)], timeout=120)


class IrodsServer:
    """The iRODS HTTP API of the tests: the fake (:mod:`rucio_fs.testing.irods_fake`) started
    here, or a real server when ``RUCIO_FS_TEST_IRODS_URL`` is set (``http://HOST:PORT/irods-
    http-api/VERSION``, with ``RUCIO_FS_TEST_IRODS_USER``, ``RUCIO_FS_TEST_IRODS_PASSWORD`` and
    ``RUCIO_FS_TEST_IRODS_HOME``, a collection the user may write in).

    Tests talk to it through the HTTP API itself (an independent view of what it holds);
    the fake's test controls (request counts, token expiry, faults) only exist on the fake.
    """

    def __init__(self, api: str, user: str, password: str, home: str, fake: bool,
                 process: subprocess.Popen | None = None) -> None:
        import httpx

        self.api = api.rstrip("/")
        self.user, self.password, self.home, self.fake = user, password, home, fake
        self.process = process
        parts = api.split("/")
        self.netloc = parts[2]
        self.zone = home.split("/")[1]
        self._http = httpx.Client(timeout=60)
        self._token = ""

    # -- mounting ---------------------------------------------------------------------------

    def url(self, collection: str) -> str:
        api_path = "/" + "/".join(self.api.split("/")[3:])
        return f"irods://{self.user}@{self.netloc}{collection}?api_path={api_path}"

    def collection(self, name: str) -> str:
        """A fresh, empty collection for one test."""
        path = f"{self.home}/{name}-{uuid.uuid4().hex[:8]}"
        self.call("POST", "/collections", op="create", lpath=path)
        return path

    # -- the HTTP API -----------------------------------------------------------------------

    def token(self) -> str:
        if not self._token:
            response = self._http.post(self.api + "/authenticate",
                                       auth=(self.user, self.password))
            response.raise_for_status()
            self._token = response.text.strip()
        return self._token

    def call(self, method: str, endpoint: str, *, content: bytes | None = None,
             headers: dict[str, str] | None = None, **params: str):
        for _ in range(2):
            auth = {"Authorization": f"Bearer {self.token()}", **(headers or {})}
            if method == "GET":
                response = self._http.get(self.api + endpoint, params=params, headers=auth)
            elif content is not None:
                response = self._http.post(self.api + endpoint, content=content, headers=auth)
            else:
                response = self._http.post(self.api + endpoint, data=params, headers=auth)
            if response.status_code != 401:
                return response
            self._token = ""
        return response

    def read(self, lpath: str) -> bytes | None:
        response = self.call("GET", "/data-objects", op="read", lpath=lpath)
        return response.content if response.status_code == 200 else None

    def write(self, lpath: str, data: bytes) -> None:
        response = self.call("POST", "/data-objects", content=data, headers={
            "irods-api-request-op": "write", "irods-api-request-lpath": lpath,
            "Content-Type": "application/octet-stream"})
        assert response.json()["irods_response"]["status_code"] == 0, response.text

    def kind(self, lpath: str) -> str | None:
        """``"collection"``, ``"data_object"`` or None."""
        for endpoint in ("/collections", "/data-objects"):
            body = self.call("GET", endpoint, op="stat", lpath=lpath).json()
            if body.get("irods_response", {}).get("status_code") == 0:
                return body["type"]
        return None

    def query(self, text: str) -> list[list[str]]:
        body = self.call("GET", "/query", op="execute_genquery", parser="genquery2",
                         query=text).json()
        assert body["irods_response"]["status_code"] == 0, body
        return body["rows"]

    def avus(self, lpath: str) -> list[tuple[str, str, str]]:
        parent, _, name = lpath.rpartition("/")
        rows = self.query("select META_DATA_ATTR_NAME, META_DATA_ATTR_VALUE, "
                          f"META_DATA_ATTR_UNITS where COLL_NAME = '{parent}' and "
                          f"DATA_NAME = '{name}'")
        return sorted((a, v, u) for a, v, u in rows)

    def seed(self, collection: str, files: dict[str, bytes], **extra) -> None:
        """Store files under ``collection`` (created as needed; ``extra``: fake-only
        settings such as ``stale`` replicas, ``avus``, ``checksums``, ``owner``, ``acl``)."""
        import base64

        if self.fake:
            body = {"collection": collection, "owner": self.user,
                    "files": {k: base64.b64encode(v).decode() for k, v in files.items()},
                    **extra}
            self._http.post(self.netloc_url("/_fake/seed"), json=body).raise_for_status()
            return
        assert not extra, "fake-only seed options"
        from concurrent.futures import ThreadPoolExecutor

        for sub in sorted({f"{collection}/{k}".rpartition("/")[0] for k in files}):
            self.call("POST", "/collections", op="create", lpath=sub,
                      **{"create-intermediates": "1"})
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda kv: self.write(f"{collection}/{kv[0]}", kv[1]),
                          files.items()))

    # -- the fake's controls ----------------------------------------------------------------

    def netloc_url(self, path: str) -> str:
        return f"http://{self.netloc}{path}"

    def require_fake(self) -> None:
        if not self.fake:
            pytest.skip("needs the fake server's test controls")

    def stats(self) -> dict:
        return self._http.get(self.netloc_url("/_fake/stats")).json()

    def stored(self, lpath: str) -> dict | None:
        """What the fake holds at ``lpath``, whoever may read it: ``data`` (bytes), ``acl``
        (user -> permission), ``avus``, ``mtime``; None when there is no such object."""
        import base64

        response = self._http.get(self.netloc_url("/_fake/object"), params={"lpath": lpath})
        if response.status_code != 200:
            return None
        return {**response.json(), "data": base64.b64decode(response.json()["data"])}

    def reset_stats(self) -> None:
        self._http.post(self.netloc_url("/_fake/reset-stats")).raise_for_status()

    def configure(self, **settings) -> None:
        self._http.post(self.netloc_url("/_fake/config"), json=settings).raise_for_status()

    def requests(self, key: str) -> int:
        return self.stats()["counts"].get(key, 0)


def start_irods_fake(port: int) -> subprocess.Popen:
    return irods_fake.start(port)[0]


@pytest.fixture(scope="session")
def irods_server() -> Iterator[IrodsServer]:
    """The fake iRODS HTTP API (stopped by PID at the end), or the real server named by
    ``RUCIO_FS_TEST_IRODS_URL``. The mount daemons get the password from the environment."""
    real = os.environ.get("RUCIO_FS_TEST_IRODS_URL")
    if real:
        server = IrodsServer(real, os.environ["RUCIO_FS_TEST_IRODS_USER"],
                             os.environ["RUCIO_FS_TEST_IRODS_PASSWORD"],
                             os.environ["RUCIO_FS_TEST_IRODS_HOME"], fake=False)
    else:
        from rucio_fs.testing.irods_fake import API, PASSWORD, USER

        port = free_ports(1)[0]
        process = start_irods_fake(port)
        server = IrodsServer(f"http://127.0.0.1:{port}{API}", USER, PASSWORD,
                             f"/tempZone/home/{USER}", fake=True, process=process)
    saved = os.environ.get("IRODS_PASSWORD")
    os.environ["IRODS_PASSWORD"] = server.password
    os.environ["IRODS_ENVIRONMENT_FILE"] = "/nonexistent/irods_environment.json"
    try:
        yield server
    finally:
        if saved is None:
            os.environ.pop("IRODS_PASSWORD", None)
        else:
            os.environ["IRODS_PASSWORD"] = saved
        os.environ.pop("IRODS_ENVIRONMENT_FILE", None)
        if server.process is not None:
            server.process.terminate()
            server.process.wait(timeout=10)


REDIS_SCRIPT = REPO / "scripts" / "servers" / "redis.sh"


@dataclass
class RedisServer:
    """A Redis started by ``scripts/servers/redis.sh`` (stopped by PID, restartable)."""

    base: Path
    port: int
    env: dict[str, str]

    @property
    def url(self) -> str:
        """The URL a mount takes (its password and CA included)."""
        return self._server_env()["REDIS_URL"]

    def _server_env(self) -> dict[str, str]:
        return dict(line.split("=", 1) for line in
                    (self.base / "server.env").read_text().splitlines() if "=" in line)

    def start(self) -> None:
        result = subprocess.run(["bash", str(REDIS_SCRIPT), "start", str(self.base)],
                                capture_output=True, text=True, timeout=300,
                                env={**os.environ, "REDIS_PORT": str(self.port), **self.env})
        if result.returncode != 0:
            raise RuntimeError(f"Redis did not start:\n{result.stderr[-3000:]}")

    def stop(self) -> None:
        subprocess.run(["bash", str(REDIS_SCRIPT), "stop", str(self.base)], timeout=60)

    def kill(self) -> None:
        """SIGKILL, as a crashed Redis."""
        pid = int((self.base / "redis.pid").read_text())
        os.kill(pid, 9)
        while process_running(pid):
            time.sleep(0.01)
        (self.base / "redis.pid").unlink()

    def cli(self, *args: str, input: str | None = None) -> str:
        connect = self._server_env()["REDIS_CLI"].split()
        return subprocess.run(["redis-cli", *connect, *args], check=True,
                              capture_output=True, text=True, timeout=30, input=input).stdout


@contextmanager
def redis_instance(base: Path, **env: str) -> Iterator[RedisServer]:
    server = RedisServer(base, free_ports(1)[0], env)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """The shared tier's Redis for the whole session (tests use their own key identities or
    flush it)."""
    with redis_instance(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis only this test uses (to kill, fill or restart)."""
    with redis_instance(tmp_path / "redis") as server:
        yield server


PROXY_SCRIPT = REPO / "scripts" / "servers" / "proxy.sh"


@dataclass
class DataProxy:
    """The data proxy (``containers/data-proxy/nginx.conf``) started by ``proxy.sh``."""

    base: Path
    url: str

    def log_lines(self) -> list[str]:
        return (self.base / "access.log").read_text().splitlines()


@pytest.fixture
def data_proxy(tmp_path: Path) -> Iterator[DataProxy]:
    """A data proxy with an empty cache, for one test."""
    base = tmp_path / "proxy"
    port = free_ports(1)[0]
    result = subprocess.run(["bash", str(PROXY_SCRIPT), "start", str(base)], capture_output=True,
                            text=True, timeout=300, env={**os.environ, "PROXY_PORT": str(port)})
    if result.returncode != 0:
        raise RuntimeError(f"the data proxy did not start:\n{result.stderr[-3000:]}")
    try:
        yield DataProxy(base, f"http://127.0.0.1:{port}")
    finally:
        subprocess.run(["bash", str(PROXY_SCRIPT), "stop", str(base)], timeout=60)
