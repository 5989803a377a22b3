"""One mount, many users (``--identity per-user``), through the kernel, against real servers.

Local users are made for the tests (and removed afterwards); each runs its commands as
itself with its own credentials in its own environment and home. The daemon itself runs with
the test session's credentials in its environment (``RUCIO_CONFIG``, ``IRODS_PASSWORD``):
a user without credentials of its own must still get EACCES, never those.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import RUCIO_FS, adler32, run_cli, wait_for
from fault_proxy import fault_proxy

from rucio_fs.observe.mounts import find_mount

USERS = ("rfs-pu-a", "rfs-pu-b", "rfs-pu-c", "rfs-pu-d", "rfs-pu-e")


@pytest.fixture(scope="module")
def users() -> Iterator[dict[str, pwd.struct_passwd]]:
    """Local users with homes of their own, removed when the module ends."""
    for name in USERS:
        subprocess.run(["userdel", "-r", "-f", name], capture_output=True)
        subprocess.run(["useradd", "-m", "-s", "/bin/sh", name], check=True,
                       capture_output=True)
    try:
        yield {name: pwd.getpwnam(name) for name in USERS}
    finally:
        for name in USERS:
            subprocess.run(["userdel", "-r", "-f", name], capture_output=True)


@pytest.fixture
def per_user_mount() -> Iterator:
    """``mount(url, *options)``: a per-user mount on a mountpoint every user can reach."""
    base = Path(tempfile.mkdtemp(prefix="rucio-fs-per-user-"))
    base.chmod(0o755)
    mounted: list[Path] = []

    def mount(url: str, *options: str) -> tuple[Path, Path]:
        path = base / f"m{len(mounted)}"
        path.mkdir()
        path.chmod(0o755)
        log = base / f"m{len(mounted)}.log"
        if "--staging-dir" not in options:  # what a test leaves pending goes with it
            options = (*options, "--staging-dir", str(base / f"staging{len(mounted)}"))
        run_cli("mount", url, str(path), "--allow-other", "--identity", "per-user",
                "--log-file", str(log), *options, check=True)
        mounted.append(path)
        return path, log

    yield mount
    for path in mounted:
        if find_mount(str(path)) is not None:
            result = run_cli("unmount", str(path))
            if result.returncode != 0:
                subprocess.run(["fusermount3", "-u", "-z", str(path)], capture_output=True)
    shutil.rmtree(base, ignore_errors=True)


def as_user(user: pwd.struct_passwd, *command: str, env: dict[str, str] | None = None,
            text: bool = True) -> subprocess.CompletedProcess:
    """``command`` run as ``user`` (its uid, gid and groups) with only ``env`` set."""
    return subprocess.run(list(command), user=user.pw_uid, group=user.pw_gid,
                          extra_groups=os.getgrouplist(user.pw_name, user.pw_gid),
                          env={"PATH": "/usr/bin:/bin", "HOME": user.pw_dir, **(env or {})},
                          cwd="/", capture_output=True, text=text, timeout=60)


def owned_file(user: pwd.struct_passwd, path: Path, data: str | bytes, mode: int = 0o600):
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    os.chown(path, user.pw_uid, user.pw_gid)
    path.chmod(mode)
    return path


def rucio_cfg(server, user: pwd.struct_passwd, **client: str) -> Path:
    """A rucio.cfg in ``user``'s home: the server's, with ``client`` settings replaced."""
    lines = []
    for line in Path(server.env["RUCIO_CONFIG"]).read_text().splitlines():
        key = line.split("=", 1)[0].strip()
        if key not in client:
            lines.append(line)
        if line.strip() == "[client]":
            lines += [f"{k} = {v}" for k, v in client.items()]
    return owned_file(user, Path(user.pw_dir) / "rucio.cfg", "\n".join(lines) + "\n")


def account_of(user, path: Path, env: dict[str, str]) -> str:
    result = as_user(user, "getfattr", "--only-values", "-n", "user.rucio.account", str(path),
                     env=env)
    return result.stdout if result.returncode == 0 else f"error: {result.stderr.strip()}"


# -- Rucio ---------------------------------------------------------------------------------

def test_each_rucio_user_reads_as_its_own_account(rucio_server, users, per_user_mount):
    a, b, e = users["rfs-pu-a"], users["rfs-pu-b"], users["rfs-pu-e"]
    env_a = {"RUCIO_CONFIG": str(rucio_cfg(rucio_server, a))}  # account root
    env_b = {"RUCIO_CONFIG": str(rucio_cfg(rucio_server, b, username="alice",
                                           password="alicepw", account="alice"))}
    mnt, log = per_user_mount("rucio:///bench", "--xattrs")
    assert account_of(a, mnt, env_a) == "root"
    assert account_of(b, mnt, env_b) == "alice"
    f = rucio_server.catalog["ds500"][7]
    for user, env in ((a, env_a), (b, env_b)):
        result = as_user(user, "cat", str(mnt / "ds500" / f["name"]), env=env, text=False)
        assert result.returncode == 0 and adler32(result.stdout) == f["adler32"]
    # The root directory and statfs do not depend on the caller: `df` works without any.
    result = as_user(e, "stat", "-f", "-c", "%l", str(mnt), env={})
    assert (result.returncode, result.stdout.strip()) == (0, "255"), result.stderr
    # A user with no credentials of its own gets EACCES, never the daemon's (it has some).
    result = as_user(e, "ls", str(mnt), env={})
    assert result.returncode != 0 and "Permission denied" in result.stderr
    assert f"uid {e.pw_uid}: no usable credentials" in log.read_text()
    # Credentials unchanged: a later process of the user, past the recheck, logs in no
    # more (its first process, whose root the files were found under, is gone).
    logins = rucio_server.access_log_lines("GET /auth/userpass")
    time.sleep(2.5)
    assert account_of(a, mnt, env_a) == "root"
    assert rucio_server.access_log_lines("GET /auth/userpass") == logins
    stats = json.loads(run_cli("stats", str(mnt), "--format", "json", check=True).stdout)
    assert stats["identities"][str(a.pw_uid)]["catalogs"] == 1
    assert {str(a.pw_uid), str(b.pw_uid), str(e.pw_uid)} <= set(stats["identities"])
    assert stats["identities"][str(e.pw_uid)]["refused"] >= 1
    text = log.read_text()
    assert "alicepw" not in text and "secret" not in text  # no password is ever logged


def test_each_rucio_user_writes_into_its_own_scopes_only(rucio_server, users, per_user_mount):
    """Two accounts without privileges (alice, bob), each with a scope of its own, write
    through one writable per-user mount: each makes a dataset and uploads into its own
    scope as itself, and Rucio refuses each one the other's scope (EACCES)."""
    admin = rucio_server.admin()
    # Rucio lets accounts without privileges write only to a *SCRATCHDISK (or USERDISK): one
    # on the test storage.
    rse = "USERS-SCRATCHDISK"
    admin.post(f"/rses/{rse}", json={})
    admin.post(f"/rses/{rse}/protocols/https", json={
        "scheme": "https", "hostname": "127.0.0.1", "port": int(rucio_server.env["DAV_HTTPS"]),
        "prefix": "/rucio/", "impl": "rucio.rse.protocols.webdav.NoRename",
        "domains": {"lan": {"read": 1, "write": 1, "delete": 1},
                    "wan": {"read": 1, "write": 1, "delete": 1}}})
    for account, password in (("alice", "alicepw"), ("bob", "bobpw")):
        if account == "bob":
            admin.post("/accounts/bob", json={"type": "USER", "email": "bob@localhost"})
            admin.post("/accounts/bob/identities", json={
                "identity": "bob", "authtype": "USERPASS", "email": "bob@localhost",
                "password": password})
        admin.post(f"/scopes/{account}/user.{account}")
        admin.post(f"/accounts/{account}/limits/local/{rse}", json={"bytes": -1})
    try:
        write_as_each(rucio_server, admin, users, per_user_mount, rse)
    finally:  # out of the RSE list first reads guess on (other tests count them)
        admin.put(f"/rses/{rse}", json={"availability_read": False})


def write_as_each(rucio_server, admin, users, per_user_mount, rse: str) -> None:
    a, b = users["rfs-pu-a"], users["rfs-pu-b"]
    envs = {account: {"RUCIO_CONFIG": str(rucio_cfg(rucio_server, user, username=account,
                                                     password=f"{account}pw",
                                                     account=account))}
            for account, user in (("alice", a), ("bob", b))}
    mnt, log = per_user_mount(f"rucio:///?upload_rse={rse}")
    run = os.urandom(4).hex()
    for account, user in (("alice", a), ("bob", b)):
        env = envs[account]
        dataset = mnt / f"user.{account}" / f"user.{account}.out-{run}"
        assert as_user(user, "mkdir", str(dataset), env=env).returncode == 0
        result = as_user(user, "sh", "-c", f"echo {account} > {dataset}/{account}-{run}.txt",
                         env=env)
        assert result.returncode == 0, result.stderr
        meta = admin.get(f"/dids/user.{account}/{account}-{run}.txt/meta").json()
        assert meta.get("account") == account, (meta, log.read_text()[-3000:])
        assert meta["bytes"] == len(account) + 1
        other = "bob" if account == "alice" else "alice"
        refused = as_user(user, "mkdir", str(mnt / f"user.{other}" / f"theirs-{run}"),
                          env=env)
        assert refused.returncode != 0 and "Permission denied" in refused.stderr
    assert "alicepw" not in log.read_text() and "bobpw" not in log.read_text()


def test_one_users_answers_teach_where_files_lie_never_what_they_hold(rucio_server, users,
                                                                     per_user_mount):
    """The users of a per-user mount share what they learn of RSE layouts (hints), never
    answers: a's first read guesses on the RSEs the mount discovered (DAV, DAV2, DEAD, XRD),
    and its verified copy
    confirms DAV; b's first read of another file is then read at its computed PFN on DAV
    alone, with no replica request of anyone's — and served only because the bytes match
    b's own catalog entry, fetched with b's credentials."""
    a, b = users["rfs-pu-a"], users["rfs-pu-b"]
    env_a = {"RUCIO_CONFIG": str(rucio_cfg(rucio_server, a))}
    env_b = {"RUCIO_CONFIG": str(rucio_cfg(rucio_server, b, username="alice",
                                           password="alicepw", account="alice"))}
    mnt, _ = per_user_mount("rucio:///bench")
    first, second = rucio_server.catalog["ds500"][40:42]
    lookups = rucio_server.access_log_lines("POST /replicas/list")
    result = as_user(a, "cat", str(mnt / "ds500" / first["name"]), env=env_a, text=False)
    assert result.returncode == 0 and adler32(result.stdout) == first["adler32"]
    stat_b = rucio_server.access_log_lines(f"GET /dids/bench/{second['name']}")
    result = as_user(b, "cat", str(mnt / "ds500" / second["name"]), env=env_b, text=False)
    assert result.returncode == 0 and adler32(result.stdout) == second["adler32"]
    assert rucio_server.access_log_lines("POST /replicas/list") == lookups
    # b's catalog entry (its checksums) came from b's own lookup
    assert rucio_server.access_log_lines(f"GET /dids/bench/{second['name']}") > stat_b
    counters = json.loads(run_cli("stats", str(mnt), "--format", "json",
                                  check=True).stdout)["backend_counters"]
    assert counters["rse_lists"] == 1  # once for both users
    assert (counters["speculative_reads"], counters["speculative_hits"]) == (4 + 1, 2)
    assert counters.get("replica_requests", 0) == 0


def test_a_renewed_proxy_is_picked_up_and_an_unreadable_one_refused(rucio_server, users,
                                                                   per_user_mount):
    c, d = users["rfs-pu-c"], users["rfs-pu-d"]
    env = rucio_server.env
    proxy = owned_file(c, Path(c.pw_dir) / "x509up", "not a certificate\n")
    env_c = {"RUCIO_CONFIG": str(rucio_cfg(rucio_server, c, auth_type="x509_proxy",
                                           auth_host=env["AUTH_TLS_URL"])),
             "X509_USER_PROXY": str(proxy)}
    mnt, log = per_user_mount("rucio:///bench")
    result = as_user(c, "ls", str(mnt / "ds500"), env=env_c)
    assert result.returncode != 0 and "Permission denied" in result.stderr
    assert "Traceback" not in log.read_text()
    # The proxy is renewed in place: the next requests use it, without a remount.
    owned_file(c, proxy, Path(env["USER_PROXY"]).read_bytes())
    listed = None
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        listed = as_user(c, "ls", str(mnt / "ds500"), env=env_c)
        if listed.returncode == 0:
            break
        time.sleep(0.5)
    assert listed is not None and listed.returncode == 0, listed.stderr
    assert len(listed.stdout.split()) == 500
    # A proxy the user cannot read is refused, though the daemon (root) could read it.
    root_only = Path(tempfile.mkdtemp(prefix="rucio-fs-proxy-")) / "x509up"
    root_only.write_bytes(Path(env["USER_PROXY"]).read_bytes())
    root_only.chmod(0o600)
    root_only.parent.chmod(0o755)
    try:
        env_d = {**env_c, "RUCIO_CONFIG": str(rucio_cfg(rucio_server, d,
                                                         auth_type="x509_proxy",
                                                         auth_host=env["AUTH_TLS_URL"])),
                 "X509_USER_PROXY": str(root_only)}
        result = as_user(d, "ls", str(mnt / "ds500"), env=env_d)
        assert result.returncode != 0 and "Permission denied" in result.stderr
        assert f"uid {d.pw_uid} cannot read its credential file {root_only}" in log.read_text()
    finally:
        shutil.rmtree(root_only.parent)


def test_the_sites_identity_map_decides_each_users_account(rucio_server, users,
                                                           per_user_mount, tmp_path):
    c, d = users["rfs-pu-c"], users["rfs-pu-d"]
    # c holds alice's password and says account root; the map makes it alice.
    env_c = {"RUCIO_CONFIG": str(rucio_cfg(rucio_server, c, username="alice",
                                           password="alicepw", account="root")),
             "RUCIO_ACCOUNT": "root"}
    # d holds root's login: the map's default (alice) is not d's to take.
    env_d = {"RUCIO_CONFIG": str(rucio_cfg(rucio_server, d)), "RUCIO_ACCOUNT": "root"}
    mapping = tmp_path / "identities"
    mapping.write_text("# the site's accounts\nrfs-pu-c  RUCIO_ACCOUNT=alice\n"
                       "*  RUCIO_ACCOUNT='alice'\n")
    mnt, log = per_user_mount("rucio:///bench", "--xattrs", "--identity-map", str(mapping))
    assert account_of(c, mnt, env_c) == "alice"
    assert "Permission denied" in account_of(d, mnt, env_d)
    # The site changes the map: read again without a remount.
    mapping.write_text(mapping.read_text() + f"{d.pw_uid}  RUCIO_ACCOUNT=root\n")
    deadline = time.monotonic() + 15
    while account_of(d, mnt, env_d) != "root" and time.monotonic() < deadline:
        time.sleep(0.5)
    assert account_of(d, mnt, env_d) == "root"
    assert account_of(c, mnt, env_c) == "alice"
    assert "identity map" in log.read_text() and "alicepw" not in log.read_text()


@pytest.mark.parametrize("content, mode, message", [
    ("root RUCIO_ACCOUNT=x\n", 0o666, "writable by no one else"),
    ("root AWS_PROFILE=x\n", 0o644, "line 1: AWS_PROFILE is not a setting this catalog reads"),
    ("nosuchuser-xyz RUCIO_ACCOUNT=x\n", 0o644, "line 1: no local user 'nosuchuser-xyz'"),
    ("# fine\nroot RUCIO_ACCOUNT\n", 0o644, "line 2: expected VARIABLE=value"),
    ("root RUCIO_ACCOUNT='x\n", 0o644, "line 1: No closing quotation"),
    ("root RUCIO_ACCOUNT=x\n0 RUCIO_ACCOUNT=y\n", 0o644, "line 2: 0 is named twice"),
])
def test_a_bad_identity_map_is_one_line(rucio_server, tmp_path, content, mode, message):
    mapping = tmp_path / "identities"
    mapping.write_text(content)
    mapping.chmod(mode)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    result = subprocess.run([*RUCIO_FS, "mount", "rucio:///bench", str(mnt), "--allow-other",
                             "--identity", "per-user", "--identity-map", str(mapping)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and result.stdout == ""
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, \
        result.stderr
    assert find_mount(str(mnt)) is None


def test_an_identity_map_is_read_again_and_a_broken_change_kept_out(tmp_path):
    from rucio_fs.errors import InvalidInput
    from rucio_fs.users.identity_map import IdentityMap

    path = tmp_path / "identities"
    path.write_text("root  RUCIO_ACCOUNT=ops  X509_USER_PROXY=/proxies/{user}-{uid}\n"
                    "*  RUCIO_ACCOUNT=guest\n")
    mapping = IdentityMap.load(str(path), ("RUCIO_ACCOUNT", "X509_USER_PROXY"))
    assert mapping.for_user(0) == {"RUCIO_ACCOUNT": "ops",
                                   "X509_USER_PROXY": "/proxies/root-0"}
    assert mapping.for_user(54321) == {"RUCIO_ACCOUNT": "guest"}
    path.write_text("root  RUCIO_ACCOUNT=ops2\n")
    assert mapping.for_user(0) == {"RUCIO_ACCOUNT": "ops2"}
    assert mapping.for_user(54321) == {}  # no default any more
    path.write_text("root  NOT_A_SETTING=1\n")  # broken: the version before stays
    assert mapping.for_user(0) == {"RUCIO_ACCOUNT": "ops2"}
    with pytest.raises(InvalidInput, match="NOT_A_SETTING is not a setting"):
        IdentityMap.load(str(path), ("RUCIO_ACCOUNT",))


def test_an_identity_map_needs_a_per_user_mount(tmp_path):
    mapping = tmp_path / "identities"
    mapping.write_text("")
    result = subprocess.run([*RUCIO_FS, "mount", "demo://", str(tmp_path),
                             "--identity-map", str(mapping)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "needs --identity per-user" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_per_user_needs_allow_other_and_refuses_shared_layers(rucio_server, tmp_path):
    for extra, message in ((["--identity", "per-user"], "needs --allow-other"),
                           (["--identity", "per-user", "--allow-other", "--cache-dir",
                             str(tmp_path)], "cannot be combined with --cache-dir")):
        result = subprocess.run([*RUCIO_FS, "mount", "rucio:///bench", str(tmp_path), *extra],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode != 0
        assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


# -- iRODS -----------------------------------------------------------------------------------

def test_each_irods_user_sees_what_its_grants_allow(irods_server, users, per_user_mount):
    irods_server.require_fake()
    from rucio_fs.testing.irods_fake import OTHER, OTHER_PASSWORD, PASSWORD, USER

    a, b = users["rfs-pu-a"], users["rfs-pu-b"]
    private = irods_server.collection("private")
    irods_server.write(f"{private}/mine.dat", b"alice's data")
    envs = irods_users(irods_server, {a: (USER, PASSWORD), b: (OTHER, OTHER_PASSWORD)})
    mnt, _ = per_user_mount(irods_url(irods_server))
    mine = mnt / USER / private.rsplit("/", 1)[1] / "mine.dat"
    result = as_user(a, "cat", str(mine), env=envs[a.pw_name])
    assert result.returncode == 0 and result.stdout == "alice's data"
    result = as_user(b, "cat", str(mine), env=envs[b.pw_name])
    assert result.returncode != 0 and result.stdout == ""
    assert "Permission denied" in result.stderr or "No such file" in result.stderr



def test_each_irods_user_writes_as_itself(irods_server, users, per_user_mount):
    """A returned close means the object is on the server, written by the caller's own
    account: where the caller may not write, nothing reaches the server and the write fails."""
    irods_server.require_fake()
    from rucio_fs.testing.irods_fake import OTHER, OTHER_PASSWORD, PASSWORD, USER

    a, b, e = users["rfs-pu-a"], users["rfs-pu-b"], users["rfs-pu-e"]
    shared = f"/{irods_server.zone}/home/public/both-{os.urandom(4).hex()}"
    irods_server.seed(shared, {"readme": b"both may write here"},
                      acl={"readers": "modify_object"})
    private = irods_server.collection("alone")  # alice's own
    envs = irods_users(irods_server, {a: (USER, PASSWORD), b: (OTHER, OTHER_PASSWORD)})
    mnt, log = per_user_mount(irods_url(irods_server))
    here = mnt / "public" / shared.rsplit("/", 1)[1]
    alone = mnt / USER / private.rsplit("/", 1)[1]
    # Every user may try (the kernel checks these bits); the catalog decides per user.
    result = as_user(a, "stat", "-c", "%a", str(here), env=envs[a.pw_name])
    assert result.stdout.strip() == "777", result.stderr
    data = {a: os.urandom(300_000), b: os.urandom(70_000)}
    for user in (a, b):
        source = owned_file(user, Path(user.pw_dir) / "src.bin", data[user])
        result = as_user(user, "cp", str(source), str(here / f"{user.pw_name}.bin"),
                         env=envs[user.pw_name])
        assert result.returncode == 0, result.stderr
        stored = irods_server.stored(f"{shared}/{user.pw_name}.bin")
        assert stored is not None and stored["data"] == data[user]
        # Made by the caller's own account, which owns it.
        assert stored["acl"].get({a: USER, b: OTHER}[user]) == "own", stored["acl"]
    # Each reads back its own; a new object is its owner's alone (no ACL inherited), so the
    # other user is answered by its own catalog: no such file, although the kernel was shown
    # the name.
    for user, other in ((a, b), (b, a)):
        mine = here / f"{user.pw_name}.bin"
        result = as_user(user, "cat", str(mine), env=envs[user.pw_name], text=False)
        assert result.returncode == 0 and result.stdout == data[user]
        result = as_user(other, "cat", str(mine), env=envs[other.pw_name], text=False)
        assert result.returncode != 0 and result.stdout == b""
    # bob does not even see alice's own collection; he sees `public` but may not write
    # there (the server refuses the upload: close fails); without credentials, nothing.
    result = as_user(b, "ls", str(alone), env=envs[b.pw_name])
    assert result.returncode != 0 and "No such file" in result.stderr
    for user, where in ((b, mnt / "public" / "b.txt"), (e, here / "e.txt")):
        source = owned_file(user, Path(user.pw_dir) / "src.bin", b"refused")
        result = as_user(user, "cp", str(source), str(where), env=envs.get(user.pw_name, {}))
        assert result.returncode != 0 and "Permission denied" in result.stderr, result.stderr
    assert irods_server.stored(f"/{irods_server.zone}/home/public/b.txt") is None
    assert irods_server.stored(f"{shared}/e.txt") is None
    assert irods_server.stored(f"{private}/b.txt") is None
    # bob's refused file is pending, his alone; he lets go of it with rm.
    listed = run_cli("uploads", str(mnt)).stdout
    assert f"pending /public/b.txt of uid {b.pw_uid}" in listed, listed
    assert "b.txt" not in as_user(a, "ls", str(mnt / "public"), env=envs[a.pw_name]).stdout
    result = as_user(b, "rm", str(mnt / "public" / "b.txt"), env=envs[b.pw_name])
    assert result.returncode == 0, result.stderr
    assert "no pending uploads" in run_cli("uploads", str(mnt)).stdout
    assert OTHER_PASSWORD not in log.read_text() and PASSWORD not in log.read_text()


def test_the_kernel_keeps_a_listing_only_for_the_user_it_came_from(irods_server, users,
                                                                   per_user_mount):
    """The kernel's listing cache on a per-user mount: a user's repeated ``ls`` is answered
    by the kernel; another user's ``ls`` right after is that user's own listing (the daemon
    is asked), and the first user's next ``ls`` its own again; where the two users' own
    listings are the same, the kernel's copy answers both."""
    irods_server.require_fake()
    from rucio_fs.testing.irods_fake import OTHER, OTHER_PASSWORD, PASSWORD, USER
    from rucio_fs.testing.mount import Mount

    a, b = users["rfs-pu-a"], users["rfs-pu-b"]
    shared = f"/{irods_server.zone}/home/public/ls-{os.urandom(4).hex()}"
    irods_server.seed(shared, {"both.txt": b"for both"}, acl={"readers": "read_object"})
    irods_server.seed(shared, {"alices.txt": b"hers"})  # alice's alone
    irods_server.seed(f"{shared}/same", {"x.txt": b"x", "y.txt": b"y"},
                      acl={"readers": "read_object"})
    envs = irods_users(irods_server, {a: (USER, PASSWORD), b: (OTHER, OTHER_PASSWORD)})
    mnt, _ = per_user_mount(irods_url(irods_server))
    mount = Mount(mnt)
    here = mnt / "public" / shared.rsplit("/", 1)[1]

    def ls(user) -> list[str]:
        result = as_user(user, "ls", str(here), env=envs[user.pw_name])
        assert result.returncode == 0, result.stderr
        return result.stdout.split()

    assert ls(a) == ["alices.txt", "both.txt", "same"]
    readdirs = mount.fuse_calls("readdir")
    assert ls(a) == ["alices.txt", "both.txt", "same"]
    assert mount.fuse_calls("readdir") == readdirs  # the kernel answered
    assert ls(b) == ["both.txt", "same"]
    assert mount.fuse_calls("readdir") > readdirs  # bob's own listing, from the daemon
    assert ls(a) == ["alices.txt", "both.txt", "same"]
    assert ls(b) == ["both.txt", "same"]
    # Both may read everything in `same`, but iRODS shows each its own permissions there:
    # attributes differ, so each user's listing is read for that user.
    result = as_user(a, "ls", str(here / "same"), env=envs[a.pw_name])
    readdirs = mount.fuse_calls("readdir")
    assert as_user(b, "ls", str(here / "same"), env=envs[b.pw_name]).stdout == result.stdout
    assert mount.fuse_calls("readdir") > readdirs


def test_the_kernels_copy_serves_users_whose_listings_are_the_same(rucio_server, users,
                                                                    per_user_mount):
    """Rucio shows every account the same dataset: once one user's `ls` filled the
    kernel's copy, another user's own (identical) listing lets the kernel answer it."""
    from rucio_fs.testing.mount import Mount

    a, b = users["rfs-pu-a"], users["rfs-pu-b"]
    env_a = {"RUCIO_CONFIG": str(rucio_cfg(rucio_server, a))}
    env_b = {"RUCIO_CONFIG": str(rucio_cfg(rucio_server, b, username="alice",
                                           password="alicepw", account="alice"))}
    # A kernel TTL far longer than the test: the kernel's copy is dropped below on purpose,
    # never because the `ls` of a loaded machine came late.
    mnt, _ = per_user_mount("rucio:///bench", "--kernel-ttl", "10m")
    mount = Mount(mnt)
    first = as_user(a, "ls", str(mnt / "ds500"), env=env_a)  # a's catalog has its listing
    as_user(b, "ls", str(mnt / "ds500"), env=env_b)  # b's catalog has its listing too
    mount.drop("kernel")  # the next `ls` has the kernel read b's listing
    readdirs = mount.fuse_calls("readdir")
    as_user(b, "ls", str(mnt / "ds500"), env=env_b)
    assert mount.fuse_calls("readdir") > readdirs
    readdirs = mount.fuse_calls("readdir")
    for user, env in ((a, env_a), (b, env_b), (a, env_a)):
        result = as_user(user, "ls", str(mnt / "ds500"), env=env)
        assert result.returncode == 0 and result.stdout == first.stdout
    assert len(first.stdout.split()) == 500
    assert mount.fuse_calls("readdir") == readdirs  # the kernel answered all three


def irods_users(irods_server, accounts: dict) -> dict[str, dict[str, str]]:
    """Give each local user its iRODS environment file (as that user's own, 0600) for the
    account it is mapped to; returns each user's process environment (its password)."""
    host, port = irods_server.netloc.split(":")
    envs = {}
    for user, (irods_user, password) in accounts.items():
        home = Path(user.pw_dir) / ".irods"
        home.mkdir(exist_ok=True)
        os.chown(home, user.pw_uid, user.pw_gid)
        owned_file(user, home / "irods_environment.json", json.dumps(
            {"irods_host": host, "irods_port": int(port), "irods_user_name": irods_user,
             "irods_zone_name": irods_server.zone}))
        envs[user.pw_name] = {"IRODS_PASSWORD": password}
    return envs


def irods_url(irods_server) -> str:
    api_path = "/" + "/".join(irods_server.api.split("/")[3:])
    return f"irods://{irods_server.netloc}/{irods_server.zone}/home?api_path={api_path}"


# -- S3 ----------------------------------------------------------------------------------------

class S3Accounts:
    """Two versitygw accounts for users a and b, and a bucket only a's account owns: a keeps
    its key in ``~/.aws/credentials`` (read as a), b in its environment (:attr:`env_b`)."""

    def __init__(self, s3_server, a: pwd.struct_passwd, b: pwd.struct_passwd) -> None:
        import uuid

        import botocore.session

        env = s3_server.env
        self.endpoint = env["VGW_ENDPOINT"]
        admin = [env["VGW_BIN"], "admin", "-a", env["AWS_ACCESS_KEY_ID"], "-s",
                 env["AWS_SECRET_ACCESS_KEY"], "--er", self.endpoint]
        tag = uuid.uuid4().hex[:8]
        self.keys = {user.pw_name: (f"pu-{tag}-{i}", f"secret-{tag}-{i}")
                     for i, user in enumerate((a, b))}
        for access, secret in self.keys.values():
            subprocess.run([*admin, "create-user", "--access", access, "--secret", secret,
                            "--role", "user"], check=True, capture_output=True)
        self.bucket = f"pu-{tag}"
        subprocess.run([*admin, "create-bucket", "--owner", self.keys[a.pw_name][0],
                        "--bucket", self.bucket], check=True, capture_output=True)
        #: A client of a's account: the tests' own view of the bucket.
        self.owner = botocore.session.get_session().create_client(
            "s3", endpoint_url=self.endpoint, region_name="us-east-1",
            aws_access_key_id=self.keys[a.pw_name][0],
            aws_secret_access_key=self.keys[a.pw_name][1])
        aws = Path(a.pw_dir) / ".aws"
        aws.mkdir(exist_ok=True)
        os.chown(aws, a.pw_uid, a.pw_gid)
        access, secret = self.keys[a.pw_name]
        owned_file(a, aws / "credentials", f"[default]\naws_access_key_id = {access}\n"
                   f"aws_secret_access_key = {secret}\n")
        self.env_b = {"AWS_ACCESS_KEY_ID": self.keys[b.pw_name][0],
                      "AWS_SECRET_ACCESS_KEY": self.keys[b.pw_name][1]}

    def stored(self, key: str) -> bytes | None:
        try:
            return self.owner.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        except self.owner.exceptions.NoSuchKey:
            return None

    def secrets(self) -> list[str]:
        return [secret for _access, secret in self.keys.values()]


def test_each_s3_user_reads_only_what_its_account_may(s3_server, users, per_user_mount):
    a, b, e = users["rfs-pu-a"], users["rfs-pu-b"], users["rfs-pu-e"]
    accounts = S3Accounts(s3_server, a, b)
    accounts.owner.put_object(Bucket=accounts.bucket, Key="run/data.txt", Body=b"a's data")
    env_b = accounts.env_b
    mnt, log = per_user_mount(f"s3://{accounts.bucket}", "-o",
                              f"endpoint_url={accounts.endpoint}")
    result = as_user(a, "cat", str(mnt / "run" / "data.txt"))
    assert result.returncode == 0 and result.stdout == "a's data", result.stderr
    for user, user_env in ((b, env_b), (e, {})):  # another account; no credentials at all
        result = as_user(user, "cat", str(mnt / "run" / "data.txt"), env=user_env)
        assert result.returncode != 0 and "Permission denied" in result.stderr
        assert result.stdout == ""
    text = log.read_text()
    assert not any(secret in text for secret in accounts.secrets())


def test_each_s3_user_writes_only_where_its_account_may(s3_server, users, per_user_mount):
    a, b, e = users["rfs-pu-a"], users["rfs-pu-b"], users["rfs-pu-e"]
    accounts = S3Accounts(s3_server, a, b)
    mnt, log = per_user_mount(f"s3://{accounts.bucket}", "-o",
                              f"endpoint_url={accounts.endpoint}")
    data = os.urandom(9 << 20)  # more than one part
    source = owned_file(a, Path(a.pw_dir) / "src.bin", data)
    result = as_user(a, "sh", "-c", f"mkdir {mnt}/out && cp {source} {mnt}/out/new.bin")
    assert result.returncode == 0, result.stderr
    assert accounts.stored("out/new.bin") == data
    for user, user_env in ((b, accounts.env_b), (e, {})):  # another account; none at all
        source = owned_file(user, Path(user.pw_dir) / "src.bin", b"refused")
        result = as_user(user, "cp", str(source), f"{mnt}/b.bin", env=user_env)
        assert result.returncode != 0 and "Permission denied" in result.stderr, result.stderr
        assert accounts.stored("b.bin") is None
    # a's own listing shows what a wrote; nothing another user tried.
    result = as_user(a, "ls", "-R", str(mnt))
    assert "new.bin" in result.stdout and "b.bin" not in result.stdout, result.stdout
    assert not any(secret in log.read_text() for secret in accounts.secrets())


def test_pending_writes_follow_the_users_renewed_credentials(s3_server, users, per_user_mount):
    """A file pending under a user's old credentials is still that user's after they change:
    shown to them, and uploaded with the new ones."""
    a, b = users["rfs-pu-a"], users["rfs-pu-b"]
    accounts = S3Accounts(s3_server, a, b)
    source = owned_file(a, Path(a.pw_dir) / "src.bin", b"pending across a renewal")
    with fault_proxy(accounts.endpoint) as proxy:
        mnt, log = per_user_mount(f"s3://{accounts.bucket}", "-o", f"endpoint_url={proxy.url}",
                                  "--option", "timeout=1s")
        proxy.inject("error", "/kept.bin", method="PUT")
        result = as_user(a, "cp", str(source), f"{mnt}/kept.bin")
        assert result.returncode != 0  # sync: close reports the refused upload
        # The same key, now given in a's environment: a new credential set, a new catalog.
        access, secret = accounts.keys[a.pw_name]
        renewed = {"AWS_ACCESS_KEY_ID": access, "AWS_SECRET_ACCESS_KEY": secret}
        time.sleep(2.2)  # credentials are looked at again after 2 s
        result = as_user(a, "cat", f"{mnt}/kept.bin", env=renewed)
        assert result.stdout == "pending across a renewal", result.stderr
        assert "credentials changed" in log.read_text()
        proxy.clear()
        assert run_cli("uploads", str(mnt), "--retry").returncode == 0
        assert accounts.stored("kept.bin") == b"pending across a renewal"


def test_a_users_write_survives_a_killed_daemon(s3_server, users, per_user_mount):
    """Async write-back: a close that returned 0 reaches the server although the daemon is
    killed before the upload could succeed. The next mount takes the user's staged file over
    when that user comes back (its upload needs the user's credentials), never for another
    user, and uploads it as that user."""
    a, b = users["rfs-pu-a"], users["rfs-pu-b"]
    accounts = S3Accounts(s3_server, a, b)
    data = os.urandom(200_000)
    source = owned_file(a, Path(a.pw_dir) / "src.bin", data)
    staging = Path(tempfile.mkdtemp(prefix="rucio-fs-pu-staging-"))
    try:
        with fault_proxy(accounts.endpoint) as proxy:
            options = ("-o", f"endpoint_url={proxy.url}", "--option", "timeout=1s",
                       "--write-back", "async", "--staging-dir", str(staging))
            url = f"s3://{accounts.bucket}"
            first, _ = per_user_mount(url, *options)
            proxy.inject("error", "/late.bin", method="PUT")
            result = as_user(a, "cp", str(source), f"{first}/late.bin")
            assert result.returncode == 0, result.stderr
            listed = run_cli("uploads", str(first)).stdout
            assert f"late.bin of uid {a.pw_uid}" in listed, listed
            pid = json.loads(run_cli("stats", str(first), "--format", "json").stdout)["pid"]
            os.kill(pid, signal.SIGKILL)
            wait_for(lambda: not os.path.exists(f"/proc/{pid}"))
            subprocess.run(["fusermount3", "-u", "-z", str(first)], capture_output=True)
            assert accounts.stored("late.bin") is None
            proxy.clear()
            second, _ = per_user_mount(url, *options)
            # Another user's first request takes over nothing of a's.
            as_user(b, "ls", str(second), env=accounts.env_b)
            assert "no pending uploads" in run_cli("uploads", str(second)).stdout
            result = as_user(a, "ls", str(second))
            assert "late.bin" in result.stdout, result.stderr
            wait_for(lambda: accounts.stored("late.bin") == data, timeout=30, interval=0.3)
            wait_for(lambda: "no pending uploads" in run_cli("uploads", str(second)).stdout,
                     timeout=10, interval=0.2)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


# -- finding a caller's credentials (in-process) --------------------------------------------

def test_only_declared_variables_of_the_callers_own_process_are_kept(users, tmp_path):
    from rucio_fs.identity import Caller, CallerCredentials

    a = users["rfs-pu-a"]
    proc = subprocess.Popen(["sleep", "30"], user=a.pw_uid, group=a.pw_gid,
                            env={"X509_USER_PROXY": "/p", "UNRELATED_SECRET": "s"})
    try:
        mine = CallerCredentials.of(Caller(a.pw_uid, a.pw_gid, proc.pid),
                                    ("X509_USER_PROXY", "RUCIO_ACCOUNT"), str(tmp_path))
        assert dict(mine.environ) == {"X509_USER_PROXY": "/p"}
        assert mine.root == f"/proc/{proc.pid}/root" and mine.home == a.pw_dir
        # pid 0 (the kernel's own request): no environment, only the user's own places.
        kernel = CallerCredentials.of(Caller(a.pw_uid, a.pw_gid, 0), ("X509_USER_PROXY",),
                                      str(tmp_path))
        assert dict(kernel.environ) == {} and kernel.root == ""
        # A pid that is not the user's (reused meanwhile): its environment is not asked.
        other = CallerCredentials.of(Caller(users["rfs-pu-b"].pw_uid, a.pw_gid, proc.pid),
                                     ("X509_USER_PROXY",), str(tmp_path))
        assert dict(other.environ) == {}
    finally:
        proc.kill()
        proc.wait()


def test_credential_files_are_read_as_the_caller_and_renewals_noticed(users, tmp_path):
    from rucio_fs.errors import NotFound, PermissionDenied
    from rucio_fs.identity import Caller, CallerCredentials, private_directory

    a = users["rfs-pu-a"]
    private = private_directory(str(tmp_path))
    creds = CallerCredentials.of(Caller(a.pw_uid, a.pw_gid, 0), (), private)
    mine = owned_file(a, Path(a.pw_dir) / "token", "t1")
    assert creds.read("~/token") == b"t1"
    copy = creds.private_copy("~/token")
    assert Path(copy).read_bytes() == b"t1" and os.stat(copy).st_mode & 0o077 == 0
    assert not creds.changed()
    time.sleep(0.01)
    owned_file(a, mine, "t2-renewed")
    assert creds.changed()
    root_only = tmp_path / "root-only"
    root_only.write_text("secret")
    root_only.chmod(0o600)
    tmp_path.chmod(0o755)
    with pytest.raises(PermissionDenied, match=f"uid {a.pw_uid} cannot read"):
        creds.read(str(root_only))
    with pytest.raises(NotFound):
        creds.read("~/nothing-here")
    with pytest.raises(PermissionDenied, match="not absolute"):
        creds.read("relative/path")
