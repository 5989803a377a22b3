"""The client image (``containers/client/Dockerfile``) built with podman by
``scripts/containers.sh`` and run: it mounts a catalog inside its container, reads the test S3
server over the host's network, and shares its mount with the host. These are the container
claims docs/containers.md makes; each is tested here, and so is the S3 dev stack, started
from its compose file.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import REPO, free_ports, wait_for
from rucio_fs.backends.demo.backend import README
from test_containers import load_compose, mount_line, run_mount_line, unmount

SCRIPT = REPO / "scripts" / "containers.sh"
TAG = "rucio-fs:test"
S3_STACK = REPO / "containers" / "dev" / "s3" / "compose.yaml"


@pytest.fixture(scope="module")
def podman() -> dict[str, str]:
    """The environment podman runs in, once the image is built (from a cached base)."""
    result = subprocess.run(["bash", str(SCRIPT), "build", TAG], capture_output=True,
                            text=True, timeout=1500)
    assert result.returncode == 0, f"the client image did not build:\n{result.stderr[-3000:]}"
    exports = subprocess.run(["bash", str(SCRIPT), "env"], capture_output=True, text=True,
                             check=True).stdout.split()
    env = dict(word.split("=", 1) for word in exports if "=" in word)
    return {**os.environ, **env}


def _podman(env: dict[str, str], *args: str, check: bool = True,
            timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], env=env, capture_output=True, text=True,
                          check=check, timeout=timeout)


@contextmanager
def container(env: dict[str, str], *args: str) -> Iterator[str]:
    """A running client container (FUSE device, SYS_ADMIN, the host's network), stopped and
    removed at the end, also when the test fails."""
    name = f"rucio-fs-test-{uuid.uuid4().hex[:8]}"
    _podman(env, "run", "-d", "--name", name, "--network", "host", "--device", "/dev/fuse",
            "--cap-add", "SYS_ADMIN", *args, TAG)
    try:
        yield name
    finally:
        _podman(env, "stop", "-t", "30", name, check=False, timeout=90)
        _podman(env, "rm", "-f", name, check=False)


def _in(env: dict[str, str], name: str, command: str) -> subprocess.CompletedProcess:
    return _podman(env, "exec", name, "sh", "-c", command, check=False)


def _mounted(env: dict[str, str], name: str, path: str = "/mnt/catalog") -> bool:
    return _in(env, name, f"grep -q ' {path} fuse' /proc/self/mounts").returncode == 0


def test_the_image_mounts_the_demo_catalog_inside_its_container(podman):
    with container(podman, "-e", "RUCIO_FS_URL=demo://") as name:
        wait_for(lambda: _mounted(podman, name), timeout=60)
        listed = _in(podman, name, "ls /mnt/catalog/ls/files-10000 | wc -l")
        assert listed.stdout.strip() == "10000", listed.stderr
        assert _in(podman, name, "cat /mnt/catalog/README.txt").stdout.encode() == README
    size = int(_podman(podman, "image", "inspect", "--format", "{{.Size}}", TAG).stdout)
    print(f"client image: {size / 1e6:.0f} MB")


def test_the_image_reads_the_test_s3_server_over_the_hosts_network(podman, s3_server):
    prefix = f"ctr-{uuid.uuid4().hex[:8]}"
    body = os.urandom(3 << 20)
    s3_server.client().put_object(Bucket="test", Key=f"{prefix}/data.bin", Body=body)
    credentials = [f"-e{k}={os.environ[k]}" for k in
                   ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION")]
    with container(podman, "-e", f"RUCIO_FS_URL=s3://test/{prefix}", "-e",
                   f"RUCIO_FS_OPTIONS=-o endpoint_url={s3_server.endpoint}",
                   *credentials) as name:
        wait_for(lambda: _mounted(podman, name), timeout=60)
        digest = _in(podman, name, "md5sum /mnt/catalog/data.bin").stdout.split()
        assert digest and digest[0] == hashlib.md5(body).hexdigest()


def test_a_mount_made_in_the_container_shows_on_the_host(podman, tmp_path):
    """The host directory is a shared mount, bound into the container with rshared
    propagation; the container mounts below it, and the host sees the catalog there until
    the container stops."""
    share = tmp_path / "share"
    share.mkdir()
    subprocess.run(["mount", "--bind", str(share), str(share)], check=True)
    try:
        subprocess.run(["mount", "--make-shared", str(share)], check=True)
        readme = share / "catalog" / "README.txt"
        with container(podman, "--mount",
                       f"type=bind,source={share},target=/srv/share,bind-propagation=rshared",
                       "-e", "RUCIO_FS_URL=demo://",
                       "-e", "RUCIO_FS_MOUNTPOINT=/srv/share/catalog"):
            wait_for(readme.exists, timeout=60)
            assert readme.read_bytes() == README
            assert len(os.listdir(share / "catalog" / "ls" / "files-10000")) == 10000
        wait_for(lambda: not _fuse_below(share), timeout=30)
    finally:
        subprocess.run(["umount", "-R", "-l", str(share)], check=False)


def _fuse_below(path: Path) -> bool:
    with open("/proc/self/mounts") as f:
        return any(line.split()[1].startswith(f"{path}/") for line in f)


def test_the_s3_dev_stack_starts_from_its_compose_file(podman, tmp_path):
    """``podman-compose up`` of ``containers/dev/s3/compose.yaml``, its servers image built by
    ``scripts/containers.sh servers s3`` (from a golang:1.26-bookworm made of the base image
    and this machine's Go), on ports and in a state directory of the test's own: the stack
    reports ready, the compose file's mount line mounts it, and a file written through the
    mount is on its server md5-identical. ``down`` stops it, also when the test fails."""
    built = subprocess.run(["bash", str(SCRIPT), "servers", "s3"], capture_output=True,
                           text=True, timeout=2400, env=podman)
    assert built.returncode == 0, f"the servers image did not build:\n{built.stderr[-3000:]}"
    vgw, moto = free_ports(2)
    state = tmp_path / "dev"
    env = {**podman, "VGW_PORT": str(vgw), "MOTO_PORT": str(moto),
           "RUCIO_FS_DEV_DIR": str(state)}
    compose = [str(Path(sys.executable).parent / "podman-compose"), "-f", str(S3_STACK)]
    try:
        up = subprocess.run([*compose, "up", "-d"], env=env, capture_output=True, text=True,
                            timeout=300)
        assert up.returncode == 0, up.stderr[-3000:]
        # the stack's health check (podman 4.3 does not wait for it)
        wait_for((state / "s3" / "ready").exists, timeout=180, interval=0.5)
        line = mount_line(load_compose(S3_STACK))
        mountpoint = tmp_path / "mnt"
        run_mount_line(line, mountpoint, {}, url=f"{line.url}/stack",
                       options=["-o", f"endpoint_url=http://127.0.0.1:{vgw}"])
        try:
            body = os.urandom(1 << 20)
            (mountpoint / "data.bin").write_bytes(body)
        finally:
            unmount(mountpoint)
        stored = state / "s3" / "vgw-data" / "test" / "stack" / "data.bin"
        assert hashlib.md5(stored.read_bytes()).hexdigest() == hashlib.md5(body).hexdigest()
    finally:
        down = subprocess.run([*compose, "down", "-t", "30"], env=env, capture_output=True,
                              text=True, timeout=180)
    assert down.returncode == 0, down.stderr[-3000:]
    assert not (state / "s3" / "ready").exists()
    size = int(_podman(podman, "image", "inspect", "--format", "{{.Size}}",
                       "rucio-fs-dev-servers-s3").stdout)
    print(f"S3 dev stack servers image: {size / 1e6:.0f} MB")
