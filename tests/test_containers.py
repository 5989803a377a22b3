"""containers/: the client image and the dev stacks, checked without a container engine.

What needs no container engine (tests/test_container_image.py builds and runs the client
image and the S3 dev stack): every compose file and Dockerfile parses, and everything they
name exists (build contexts, Dockerfiles, copied files, scripts, bind-mounted config); ports
and settings agree across the files of a stack and with the test scripts; each stack's
``rucio-fs mount`` line mounts the server the test suite itself runs (same script, same
configuration, ports and directories swapped for the test's); and the two entry points (the
client's and the servers image's) run for real on this machine, including their SIGTERM
handling.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from conftest import REPO, free_ports, wait_for

from rucio_fs.cli.daemon import process_running
from rucio_fs.observe.mounts import find_mount

CONTAINERS = REPO / "containers"
COMPOSE_FILES = sorted(CONTAINERS.glob("**/compose.yaml"))
DOCKERFILES = sorted(CONTAINERS.glob("**/Dockerfile"))
STACKS = {path.parent.name: path for path in COMPOSE_FILES}
CLIENT_ENTRYPOINT = CONTAINERS / "client" / "entrypoint.sh"
SERVE = CONTAINERS / "dev" / "servers" / "serve.sh"
VENV_BIN = str(Path(sys.executable).parent)


# ---- parsing -------------------------------------------------------------------------------

def load_compose(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


@dataclass
class Instruction:
    keyword: str
    args: str

    def exec_form(self) -> list[str] | None:
        return json.loads(self.args) if self.args.startswith("[") else None


def parse_dockerfile(path: Path) -> list[Instruction]:
    """Instructions with continuation lines joined; comments and blank lines dropped."""
    instructions: list[Instruction] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, args = (pending + line).partition(" ")
        instructions.append(Instruction(keyword.upper(), " ".join(args.split())))
        pending = ""
    assert not pending, f"{path}: a continuation line ends the file"
    return instructions


@functools.cache
def build_contexts() -> dict[Path, Path]:
    """Dockerfile -> build context, from the compose files; the client image builds from the
    repository root (as its header says)."""
    contexts = {CONTAINERS / "client" / "Dockerfile": REPO}
    for compose in COMPOSE_FILES:
        for service in load_compose(compose)["services"].values():
            build = service.get("build")
            if build is None:
                continue
            if isinstance(build, str):
                build = {"context": build}
            context = (compose.parent / build["context"]).resolve()
            contexts[(context / build.get("dockerfile", "Dockerfile")).resolve()] = context
    return contexts


@dataclass
class MountLine:
    env: dict[str, str]
    url: str
    mountpoint: str
    options: list[str]


def mount_line(compose: dict) -> MountLine:
    words = shlex.split(compose["x-rucio-fs"]["mount"])
    env = {}
    while "=" in words[0] and not words[0].startswith("-"):
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    assert words[:2] == ["rucio-fs", "mount"], words
    url, mountpoint, *options = words[2:]
    return MountLine(env, url, mountpoint, options)


def script_default(script: Path, name: str) -> str:
    """The default a test-server script gives a setting: ``NAME=${NAME:-default}``."""
    match = re.search(rf"\b{name}=\$\{{{name}:-([^}}]*)\}}", script.read_text())
    assert match, f"{script.name} has no default for {name}"
    return match.group(1)


def compose_default(value: str) -> str:
    """A compose value as it reads with nothing set in the environment: ``${NAME:-default}``
    gives ``default``."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", value)


def script_constant(script: Path, name: str) -> str:
    match = re.search(rf"(?:^|[;\s]){name}=([^\s;]+)", script.read_text(), re.MULTILINE)
    assert match, f"{script.name} sets no {name}"
    return match.group(1)


# ---- every file parses and everything it names exists -------------------------------------

def test_every_stack_is_here_and_parses():
    assert set(STACKS) == {"rucio", "s3", "irods"}
    assert {p.relative_to(CONTAINERS).as_posix() for p in DOCKERFILES} == {
        "client/Dockerfile", "dev/servers/Dockerfile", "dev/irods/provider/Dockerfile"}
    for path in COMPOSE_FILES:
        compose = load_compose(path)
        assert compose["name"].startswith("rucio-fs-")
        assert compose["services"], path
        mount_line(compose)


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: p.parent.name)
def test_compose_references_exist(path: Path):
    compose = load_compose(path)
    services = compose["services"]
    named_volumes = set(compose.get("volumes") or {})
    contexts = build_contexts()
    for name, service in services.items():
        assert ("image" in service) or ("build" in service), name
        image = service.get("image", "")
        if "build" not in service:
            assert re.fullmatch(r"[\w./-]+:[\w.-]+", image) and not image.endswith(":latest"), \
                f"{name}: pin the image's version ({image!r})"
        build = service.get("build")
        if build is not None:
            context = path.parent / (build if isinstance(build, str) else build["context"])
            dockerfile = context / ("Dockerfile" if isinstance(build, str)
                                    else build.get("dockerfile", "Dockerfile"))
            assert dockerfile.resolve() in contexts and dockerfile.is_file(), dockerfile
        for volume in service.get("volumes", []):
            source, target = compose_default(volume).split(":")[:2]
            if source.startswith("."):
                assert (path.parent / source).exists(), f"{name}: {source} is missing"
            elif not source.startswith("/"):
                assert source in named_volumes, f"{name}: volume {source} is not declared"
            assert target.startswith("/")
        for dependency in service.get("depends_on", {}):
            assert dependency in services, f"{name} depends on unknown {dependency}"
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name}: {port} must stay on 127.0.0.1"
        if "network_mode" in service:
            assert service["network_mode"] == "host" and "ports" not in service


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.parent.relative_to(CONTAINERS)
                         .as_posix())
def test_dockerfile_references_exist(path: Path):
    context = build_contexts()[path.resolve()]
    instructions = parse_dockerfile(path)
    assert instructions[0].keyword in ("FROM", "ARG")
    workdir = "/"
    copied: dict[str, Path] = {}  # path in the image -> its source
    for ins in instructions:
        if ins.keyword == "FROM":
            image = ins.args.split()[0]
            assert re.fullmatch(r"[\w./-]+:[\w.-]+", image) and not image.endswith(":latest"), \
                f"{path}: pin the base image's version ({image})"
        elif ins.keyword == "WORKDIR":
            workdir = ins.args
        elif ins.keyword in ("COPY", "ADD"):
            *sources, destination = [word for word in ins.args.split()
                                     if not word.startswith("--")]
            for source in sources:
                assert (context / source).exists(), f"{path}: COPY {source}: not in {context}"
                target = destination if destination.startswith("/") else \
                    f"{workdir}/{destination}"
                if target.endswith("/") or target.rstrip("/") in (workdir, f"{workdir}/."):
                    target = f"{workdir.rstrip('/')}/" + ("" if source == "." else source)
                copied[os.path.normpath(target)] = context / source
        elif ins.keyword == "RUN":
            for script in re.findall(r"(?:bash|sh) \"?(\S+?\.sh)", ins.args):
                for name in stack_scripts(script, instructions):
                    assert (context / name).is_file() or name.startswith("/"), \
                        f"{path}: RUN {name}: not in the build context"
        elif ins.keyword == "ENTRYPOINT":
            program = ins.exec_form()[0]
            source = resolve_in_image(program, copied)
            assert source is not None and source.is_file(), \
                f"{path}: the entry point {program} is not copied into the image"
            assert os.access(source, os.X_OK), f"{source} must be executable"


def stack_scripts(script: str, instructions: list[Instruction]) -> list[str]:
    """``script`` as a RUN names it, a ``$stack`` in it taken over every stack of the
    Dockerfile's default ``STACKS`` argument (``ARG STACKS="rucio s3"``)."""
    if "$stack" not in script:
        return [script]
    (stacks,) = [ins.args.split("=", 1)[1].strip('"').split() for ins in instructions
                 if ins.keyword == "ARG" and ins.args.startswith("STACKS=")]
    return [script.replace("$stack", stack) for stack in stacks]


def resolve_in_image(path: str, copied: dict[str, Path]) -> Path | None:
    """Where a path inside the image comes from, given what was copied where."""
    for target, source in sorted(copied.items(), key=lambda item: -len(item[0])):
        if path == target:
            return source
        if path.startswith(target + "/"):
            return source / path[len(target) + 1:]
    return None


def test_images_hold_every_file_the_install_script_reads():
    """install.sh reads files beside it (the pyfuse3 patch): an image that runs it must copy
    them in first, or its build fails (nothing here builds images)."""
    needed = set(re.findall(r"(scripts/[\w./-]+)", (REPO / "scripts" / "install.sh").read_text()))
    assert {"scripts/pyfuse3-cache-readdir.patch",
            "scripts/pyfuse3-kernel-io.patch"} <= needed
    for name in ("client/Dockerfile", "dev/servers/Dockerfile"):
        instructions = parse_dockerfile(CONTAINERS / name)
        copied: set[str] = set()
        for ins in instructions:
            if ins.keyword == "COPY":
                words = [w for w in ins.args.split() if not w.startswith("--")]
                copied |= set(words[:-1])  # the last word is the destination
            if ins.keyword == "RUN" and "scripts/install.sh" in ins.args:
                break
        for path in needed:
            assert "." in copied or path in copied, \
                f"{name}: {path} is not copied before install.sh"


def test_images_install_with_the_script_ci_runs():
    ci = (REPO / ".ci" / "run").read_text()
    assert "scripts/test.sh" in ci
    assert re.search(r"^bash scripts/install\.sh$", (REPO / "scripts" / "test.sh").read_text(),
                     re.MULTILINE)
    for name in ("client/Dockerfile", "dev/servers/Dockerfile"):
        runs = [ins.args for ins in parse_dockerfile(CONTAINERS / name) if ins.keyword == "RUN"]
        assert any(re.match(r"bash scripts/install\.sh\b", run) for run in runs), name
    servers = parse_dockerfile(CONTAINERS / "dev/servers/Dockerfile")
    run = " ".join(ins.args for ins in servers if ins.keyword == "RUN")
    assert 'for stack in $STACKS; do bash "scripts/servers/$stack.sh" install' in run
    assert stack_scripts("scripts/servers/$stack.sh", servers) == [
        "scripts/servers/rucio.sh", "scripts/servers/s3.sh"]
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {".git", ".venv"} <= set(ignored)


def test_shell_scripts_parse():
    for script in [*CONTAINERS.glob("**/*.sh"), *(REPO / "scripts").glob("**/*.sh")]:
        result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert result.returncode == 0, f"{script}: {result.stderr}"
        if script.parent.is_relative_to(CONTAINERS):
            assert os.access(script, os.X_OK), f"{script} must be executable"


# ---- each stack agrees with the test scripts and with itself -------------------------------

@pytest.mark.parametrize("kind", ["rucio", "s3"])
def test_server_stacks_match_the_test_scripts(kind: str):
    compose = load_compose(STACKS[kind])
    (service,) = compose["services"].values()
    assert service["build"]["dockerfile"] == "containers/dev/servers/Dockerfile"
    kind_arg, state = service["command"]
    assert kind_arg == kind
    assert compose_default(state) == f"/srv/rucio-fs-dev/{kind}"
    script = REPO / "scripts" / "servers" / f"{kind}.sh"
    # every port the script takes is pinned to the script's own default
    assert {name: compose_default(value) for name, value in service["environment"].items()} \
        == {name: script_default(script, name) for name in service["environment"]}
    ports = set(re.findall(r"\b([A-Z_]+(?:PORT|HTTP|HTTPS|TLS))=\$\{", script.read_text()))
    assert ports == set(service["environment"]), "a port of the script is not pinned"
    # the state directory has the same path inside and outside (the config in it names paths)
    assert service["volumes"] == [f"{state}:{state}"]
    assert service["healthcheck"]["test"] == ["CMD", "test", "-e", f"{state}/ready"]
    assert "touch \"$dir/ready\"" in SERVE.read_text()
    line = mount_line(compose)
    if kind == "rucio":
        assert line.env == {"RUCIO_CONFIG": f"{state}/etc/rucio.cfg"}
        assert 'cat >"$BASE/etc/rucio.cfg"' in script.read_text()
        assert line.url == "rucio:///bench"
    else:
        assert line.env == {"AWS_ACCESS_KEY_ID": script_constant(script, "ACCESS"),
                            "AWS_SECRET_ACCESS_KEY": script_constant(script, "SECRET")}
        assert line.url == "s3://test"
        assert line.options == ["-o", f"endpoint_url=http://127.0.0.1:"
                                      f"{compose_default(service['environment']['VGW_PORT'])}"]


def test_irods_stack_agrees_with_itself_and_the_fake():
    from rucio_fs.testing import irods_fake

    stack = STACKS["irods"].parent
    compose = load_compose(STACKS["irods"])
    services = compose["services"]
    api = json.loads((stack / "http_api_config.json").read_text())
    setup = json.loads((stack / "provider" / "setup.json").read_text())
    server = setup["server_config"]
    database = server["plugin_configuration"]["database"]["postgres"]
    init_sql = (stack / "catalog" / "init.sql").read_text()
    entrypoint = (stack / "provider" / "entrypoint.sh").read_text()

    # the HTTP API: its image version is the API path the tests and the fake speak
    version = services["http-api"]["image"].split(":")[1]
    assert f"/irods-http-api/{version}" == irods_fake.API
    test_env = compose["x-rucio-fs"]["test-env"]
    assert test_env["RUCIO_FS_TEST_IRODS_URL"].endswith(irods_fake.API)
    (published,) = services["http-api"]["ports"]
    _, host_port, container_port = published.split(":")
    assert int(container_port) == api["http_server"]["port"]
    assert test_env["RUCIO_FS_TEST_IRODS_URL"].startswith(f"http://127.0.0.1:{host_port}/")
    assert services["http-api"]["volumes"] == ["./http_api_config.json:/config.json:ro"]
    assert services["http-api"]["command"] == ["/config.json"]

    # the HTTP API reaches the provider by its compose hostname, as its rodsadmin
    provider = services["irods-provider"]
    client = api["irods_client"]
    assert client["host"] == provider["hostname"] == "irods-provider"
    assert provider["hostname"] in server["catalog_provider_hosts"]
    assert provider["hostname"] in server["host_resolution"]["host_entries"][0]["addresses"]
    assert client["port"] == server["zone_port"]
    assert client["zone"] == server["zone_name"]
    assert client["proxy_admin_account"] == {"username": server["zone_user"],
                                             "password": setup["admin_password"]}
    assert len(server["negotiation_key"]) == len(server["server_control_plane_key"]) == 32

    # the provider reaches the catalog database made by init.sql
    assert database["db_host"] in services and database["db_host"] in entrypoint
    assert f"CREATE ROLE {database['db_username']} LOGIN PASSWORD " \
           f"'{database['db_password']}';" in init_sql
    assert f'CREATE DATABASE "{database["db_name"]}" OWNER {database["db_username"]};' \
        in init_sql
    assert f"-d {database['db_name']} -U {database['db_username']}" in entrypoint

    # the mount line and the test switch name the stack's zone, user and home
    line = mount_line(compose)
    user, zone = server["zone_user"], server["zone_name"]
    assert line.url == f"irods://{user}@127.0.0.1:{host_port}/{zone}/home/{user}"
    assert line.env == {"IRODS_PASSWORD": setup["admin_password"]}
    assert test_env["RUCIO_FS_TEST_IRODS_USER"] == user
    assert test_env["RUCIO_FS_TEST_IRODS_PASSWORD"] == setup["admin_password"]
    assert test_env["RUCIO_FS_TEST_IRODS_HOME"] == f"/{zone}/home/{user}"
    # ... and the fake has that same account, so the line can be run against it
    fake = irods_fake.State(zone)
    assert fake.passwords[user] == setup["admin_password"]
    assert f"/{zone}/home/{user}" in fake.colls


def test_readme_shows_every_mount_line_and_what_is_built_and_what_is_not():
    readme = " ".join((CONTAINERS / "README.md").read_text().split())
    for path in COMPOSE_FILES:
        line = " ".join(load_compose(path)["x-rucio-fs"]["mount"].split())
        assert line in readme, f"containers/README.md lacks {path.parent.name}'s mount line"
        assert f"docker compose -f {path.relative_to(REPO).as_posix()} up" in readme
    assert "--device /dev/fuse --cap-add SYS_ADMIN" in readme
    assert "rshared" in readme
    assert "The client image is built and run in CI" in readme
    assert "tests/test_container_image.py" in readme
    assert "The S3 dev stack is built and started in CI" in readme
    assert "The Rucio and iRODS stacks are not built or started by the tests" in readme


# ---- the mount lines mount the test suite's own servers -----------------------------------

def run_mount_line(line: MountLine, mountpoint: Path, env: dict[str, str],
                   url: str | None = None, options: list[str] | None = None) -> None:
    mountpoint.mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "rucio_fs", "mount", url or line.url, str(mountpoint),
         "--log-file", str(mountpoint.with_suffix(".log")),
         *(line.options if options is None else options)],
        env={**os.environ, **line.env, **env}, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def unmount(mountpoint: Path) -> None:
    subprocess.run([sys.executable, "-m", "rucio_fs", "unmount", str(mountpoint)],
                   capture_output=True, timeout=60)


def test_rucio_mount_line(rucio_server, tmp_path: Path):
    line = mount_line(load_compose(STACKS["rucio"]))
    state = load_compose(STACKS["rucio"])["services"]["rucio"]["command"][1]
    config = line.env["RUCIO_CONFIG"].replace(state, str(rucio_server.base))
    assert config == rucio_server.env["RUCIO_CONFIG"]
    mnt = tmp_path / "rucio"
    run_mount_line(line, mnt, {"RUCIO_CONFIG": config})
    try:
        assert {"cont", "ds5000", "big"} <= set(os.listdir(mnt))
        first = rucio_server.catalog["ds500"][0]
        assert (mnt / "cont" / "ds500" / first["name"]).stat().st_size == first["bytes"]
    finally:
        unmount(mnt)


def test_s3_mount_line(s3_server, tmp_path: Path):
    line = mount_line(load_compose(STACKS["s3"]))
    assert line.env == {name: s3_server.env[name]
                        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    endpoint = line.options[1].replace(":17070", f":{s3_server.env['VGW_PORT']}")
    mnt = tmp_path / "s3"
    prefix = f"containers-{os.getpid()}"
    run_mount_line(line, mnt, {}, url=f"{line.url}/{prefix}", options=["-o", endpoint])
    try:
        (mnt / "hello.txt").write_bytes(b"from the s3 stack's mount line\n")
        body = s3_server.client().get_object(Bucket="test", Key=f"{prefix}/hello.txt")["Body"]
        assert body.read() == b"from the s3 stack's mount line\n"
    finally:
        unmount(mnt)


def test_irods_mount_line(irods_server, tmp_path: Path):
    irods_server.require_fake()  # the line's account is the fake's rods/rods
    line = mount_line(load_compose(STACKS["irods"]))
    port = irods_server.api.split("/")[2].split(":")[1]
    irods_server.seed("/tempZone/home/rods", {"stack.txt": b"rods was here\n"}, owner="rods")
    mnt = tmp_path / "irods"
    run_mount_line(line, mnt, {}, url=line.url.replace(":9000/", f":{port}/"))
    try:
        assert (mnt / "stack.txt").read_bytes() == b"rods was here\n"
    finally:
        unmount(mnt)


# ---- the entry points run here -------------------------------------------------------------

def entrypoint_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PATH": f"{VENV_BIN}:{os.environ['PATH']}", **extra}


def test_client_entrypoint_mounts_and_unmounts_on_sigterm(tmp_path: Path):
    mnt = tmp_path / "catalog"  # created by the entry point
    process = subprocess.Popen([str(CLIENT_ENTRYPOINT)], stderr=subprocess.PIPE, text=True,
                               env=entrypoint_env(RUCIO_FS_URL="demo://",
                                                  RUCIO_FS_MOUNTPOINT=str(mnt),
                                                  RUCIO_FS_OPTIONS="--xattrs --cold"))
    try:
        wait_for(lambda: find_mount(str(mnt)), timeout=30)
        assert (mnt / "ls" / "files-500" / "file-000042.dat").read_bytes()
        # with arguments, the entry point runs those instead (here: the mount's stats)
        stats = subprocess.run([str(CLIENT_ENTRYPOINT), "stats", str(mnt), "--format", "json"],
                               env=entrypoint_env(), capture_output=True, text=True)
        assert stats.returncode == 0, stats.stderr
        stats = json.loads(stats.stdout)  # RUCIO_FS_OPTIONS reached the mount:
        assert stats["kernel"]["xattrs"] is True and stats["config"]["kernel"] is False
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        assert find_mount(str(mnt)) is None
        assert "received SIGTERM, unmounting" in process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
        unmount(mnt)


def test_client_entrypoint_bad_settings_fail_in_one_line(tmp_path: Path):
    for env, message in (({}, "set RUCIO_FS_URL"),
                         ({"RUCIO_FS_URL": "nosuch://x"}, "unknown URL scheme")):
        result = subprocess.run([str(CLIENT_ENTRYPOINT)], capture_output=True, text=True,
                                timeout=60, env=entrypoint_env(
                                    RUCIO_FS_MOUNTPOINT=str(tmp_path / "m"), **env))
        assert result.returncode != 0
        assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr


def test_servers_entrypoint_runs_the_s3_script_and_stops_by_pid(s3_server, tmp_path: Path):
    """serve.sh s3, on other ports: ready, served, then SIGTERM stops every process it
    started; and when one of them dies, serve.sh stops the rest and fails."""
    import httpx

    for ending in ("sigterm", "server dies"):
        state = tmp_path / ending.replace(" ", "-")
        vgw, moto = free_ports(2)
        process = subprocess.Popen(
            ["bash", str(SERVE), "s3", str(state)], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
            env=entrypoint_env(VGW_PORT=str(vgw), MOTO_PORT=str(moto)))
        try:
            wait_for(lambda s=state, p=process: (s / "ready").exists() or p.poll() is not None,
                     timeout=300, interval=0.1)
            assert process.poll() is None, process.stderr.read()
            pids = {path.stem: int(path.read_text()) for path in state.glob("*.pid")}
            assert set(pids) == {"versitygw", "moto"}
            assert httpx.get(f"http://127.0.0.1:{vgw}/").status_code in (200, 403)
            if ending == "sigterm":
                process.send_signal(signal.SIGTERM)
                assert process.wait(timeout=60) == 0
            else:
                os.kill(pids["versitygw"], signal.SIGKILL)
                assert process.wait(timeout=60) == 1
                assert "versitygw is gone" in process.stderr.read()
            time.sleep(0.2)
            for pid in pids.values():
                assert not process_running(pid), f"pid {pid} still runs"
            assert not (state / "ready").exists()
        finally:
            if process.poll() is None:
                process.kill()
            subprocess.run(["bash", str(REPO / "scripts/servers/s3.sh"), "stop", str(state)],
                           capture_output=True)



