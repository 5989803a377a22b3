"""Real mounts through the kernel. Nothing here skips: a machine that cannot mount FUSE fails
these tests (CI installs fuse3 and runs as root)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from rucio_fs import control
from rucio_fs.mounts import FSTYPE, find_mount

RUCIO_FS = [sys.executable, "-m", "rucio_fs"]


def run_cli(*args: str, check: bool = False, env: dict[str, str] | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([*RUCIO_FS, *args], capture_output=True, text=True,
                            timeout=timeout, env=env)
    if check and result.returncode != 0:
        raise AssertionError(f"rucio-fs {' '.join(args)} failed ({result.returncode}): "
                             f"{result.stderr.strip()}")
    return result


@dataclass
class Mount:
    path: Path
    log: Path

    def stats(self, reset: bool = False) -> dict:
        return control.request(str(self.path), "stats", reset=reset)

    def backend_calls(self, call: str) -> int:
        return self.stats()["backend"].get(call, {"latency": {"count": 0}})["latency"]["count"]

    def fuse_calls(self, op: str, snap: dict | None = None) -> int:
        snap = snap or self.stats()
        return snap["fuse"].get(op, {"latency": {"count": 0}})["latency"]["count"]

    def drop(self, *layers: str) -> dict:
        return control.request(str(self.path), "drop", layers=list(layers) or None)

    def log_text(self) -> str:
        return self.log.read_text()


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
        run_cli("mount", url, str(path), "--log-file", str(log), *options, check=True)
        mounted.append(path)
        info = find_mount(str(path))
        assert info is not None and info.fstype == FSTYPE
        return Mount(path, log)

    yield mount
    for path in mounted:
        _unmount(path)


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
        names = ("RUCIO_PORT", "DAV_HTTP", "DAV_HTTPS", "MC_PORT", "AUTH_TLS")
        ports = {name: str(port) for name, port in zip(names, free_ports(5), strict=True)}
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
