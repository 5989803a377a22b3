"""Writing into Rucio through a mount (``upload_rse=``), against the real Rucio server and its
nginx WebDAV storage, checked with the real ``rucio`` CLI and the catalog's REST API.

The promise: a ``close`` that returned 0 (sync write-back) means the replica is on the
storage with the file's size and checksum, registered AVAILABLE and attached to its dataset.
Whatever fails or answers falsely, at no moment is a replica AVAILABLE whose bytes are not at
its PFN, nor a file attached whose replica is not AVAILABLE; what failed is stored by the
next try (``rucio-fs uploads --retry``, or the next mount after a crash).
"""

from __future__ import annotations

import errno
import hashlib
import os
import random
import signal
import subprocess
import uuid
import zlib
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import trio
from conftest import run_cli, wait_for
from fault_proxy import fault_proxy
from rucio_fs.backends.rucio.upload import GroupCommit
from trio.testing import MockClock

from rucio_fs.errors import AlreadyExists, Unavailable

SYNC, ASYNC = (), ("--write-back", "async")


class Catalog:
    """The catalog's own view (REST, as root): what the tests check the mount against."""

    def __init__(self, server) -> None:
        self.server = server
        self.host = server.env["RUCIO_HOST"]
        answer = httpx.get(self.host + "/auth/userpass", headers={
            "X-Rucio-Account": "root", "X-Rucio-Username": "ddmlab",
            "X-Rucio-Password": "secret"})
        self.headers = {"X-Rucio-Auth-Token": answer.headers["X-Rucio-Auth-Token"]}

    def request(self, method: str, path: str, **kwargs) -> httpx.Response:
        return httpx.request(method, self.host + path, headers=self.headers, timeout=30,
                             **kwargs)

    def replicas(self, scope: str, names: list[str]) -> dict[str, dict]:
        """Each file's record with the state of its replica on each RSE (all states)."""
        answer = self.request("POST", "/replicas/list", json={
            "dids": [{"scope": scope, "name": name} for name in names], "all_states": True,
            "ignore_availability": True})
        lines = [httpx.Response(200, content=line).json()
                 for line in answer.content.splitlines() if line.strip()]
        return {line["name"]: line for line in lines}

    def replica(self, scope: str, name: str) -> dict | None:
        return self.replicas(scope, [name]).get(name)

    def files(self, scope: str, dataset: str) -> set[str]:
        answer = self.request("GET", f"/dids/{scope}/{dataset}/dids")
        if answer.status_code == 404:
            return set()
        return {httpx.Response(200, content=line).json()["name"]
                for line in answer.content.splitlines() if line.strip()}

    def add_rse_behind(self, rse: str, port: int) -> None:
        """An RSE whose storage is the test nginx reached through ``port`` (a proxy)."""
        domains = {"lan": {"read": 1, "write": 1, "delete": 1},
                   "wan": {"read": 1, "write": 1, "delete": 1}}
        self.request("POST", f"/rses/{rse}", json={})
        # The name comes from the port, which an earlier test's proxy may have had: its RSE
        # was then left out of reads (see ``proxied``), and replicas on it list as unavailable.
        self.request("PUT", f"/rses/{rse}", json={"availability_read": True})
        self.request("POST", f"/rses/{rse}/protocols/http", json={
            "scheme": "http", "hostname": "127.0.0.1", "port": port, "prefix": "/rucio/",
            "impl": "rucio.rse.protocols.webdav.NoRename", "domains": domains})
        self.request("POST", f"/accounts/root/limits/local/{rse}", json={"bytes": -1})


def stored_bytes(server, pfn: str) -> bytes | None:
    """What the WebDAV or XRootD storage holds at ``pfn`` (read from its directory)."""
    root = server.env["XRD_ROOT"] if pfn.startswith("root://") else server.env["DAV_ROOT"]
    path = Path(root) / urlsplit(pfn).path.lstrip("/")
    return path.read_bytes() if path.is_file() else None


def consistent(server, catalog: Catalog, scope: str, name: str, dataset: str, rse: str,
               data: bytes) -> str:
    """:func:`consistent_files` of one file."""
    return consistent_files(server, catalog, scope, {name: data}, dataset, rse)[name]


def consistent_files(server, catalog: Catalog, scope: str, files: dict[str, bytes],
                     dataset: str, rse: str) -> dict[str, str]:
    """Check the invariant for each file (name -> content); return each one's state:
    ``absent`` (not attached, no AVAILABLE replica), ``partial`` (AVAILABLE, not attached
    yet) or ``stored`` (AVAILABLE with the right bytes, attached)."""
    records = catalog.replicas(scope, list(files))
    attached = catalog.files(scope, dataset)
    states = {}
    for name, data in files.items():
        record = records.get(name) or {}
        available = record.get("states", {}).get(rse) == "AVAILABLE"
        if available:
            pfn = record["rses"][rse][0]
            assert stored_bytes(server, pfn) == data, f"{name}: AVAILABLE without its bytes"
            assert int(record["bytes"]) == len(data)
            assert record["adler32"].lstrip("0") == f"{zlib.adler32(data):08x}".lstrip("0")
        else:
            assert name not in attached, f"{name}: attached while its replica is " \
                f"{record.get('states', {}).get(rse)}"
        states[name] = ("stored" if name in attached else "partial") if available else "absent"
    return states


def cli(server, *args: str, cwd: Path | None = None) -> str:
    """The real ``rucio`` CLI (41.5.1) as the test server's root account."""
    env = {**os.environ, "RUCIO_CONFIG": server.env["RUCIO_CONFIG"],
           "X509_USER_PROXY": server.env["CLI_X509_PROXY"]}
    result = subprocess.run([server.env["RUCIO_CLI"], *args], capture_output=True,
                            text=True, env=env, cwd=cwd, timeout=300)
    assert result.returncode == 0, f"rucio {' '.join(args)}: {result.stderr[-2000:]}"
    return result.stdout


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def writer(mount_fs, tmp_path: Path, url: str, *options: str):
    """A writable mount with a staging directory of its own (what a failed upload leaves
    is this test's)."""
    return mount_fs(url, "--staging-dir", str(tmp_path / "staging"), *options)


def copy_into(mnt, tmp_path: Path, dataset: str, files: dict[str, bytes]) -> None:
    """``mkdir`` of a new dataset in the mount, then ``cp`` of each file into it from local
    disk."""
    os.mkdir(mnt.path / dataset)
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        subprocess.run(["cp", str(tmp_path / name), str(mnt.path / dataset / name)],
                       check=True)


def drained(mnt) -> None:
    result = run_cli("uploads", "--wait", str(mnt.path), timeout=600)
    assert result.returncode == 0 and "no pending uploads" in result.stdout, result.stdout


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_cp_into_a_new_dataset_is_what_rucio_upload_makes(mount_fs, rucio_server, tmp_path,
                                                          mode):
    """`mkdir` makes a dataset with a rule on the RSE; `cp` of a small and of a streamed
    (larger than one request) file registers each with its checksums, AVAILABLE on the RSE
    and attached; the real CLI lists, locates and downloads them byte for byte."""
    m = writer(mount_fs, tmp_path, "rucio:///bench?upload_rse=DAV",
               *(ASYNC if mode == "async" else SYNC))
    rng = random.Random(mode)
    dataset = unique(f"written-{mode}")
    # (File names are DIDs of the scope, for ever: every run writes new ones.)
    small, streamed = f"{dataset}.small.dat", f"{dataset}.streamed.dat"
    files = {small: rng.randbytes(5000), streamed: rng.randbytes(20 << 20)}
    copy_into(m, tmp_path, dataset, files)
    if mode == "async":
        drained(m)
    assert sorted(os.listdir(m.path / dataset)) == sorted(files)
    catalog = Catalog(rucio_server)
    for name, data in files.items():
        assert (m.path / dataset / name).read_bytes() == data
        assert consistent(rucio_server, catalog, "bench", name, dataset, "DAV",
                          data) == "stored"
    listed = cli(rucio_server, "list-files", f"bench:{dataset}")
    for name, data in files.items():
        assert f"bench:{name}" in listed and f"ad:{zlib.adler32(data):08x}" in listed
    assert "DAV: https://" in cli(rucio_server, "list-file-replicas", f"bench:{small}")
    rules = cli(rucio_server, "list-rules", f"bench:{dataset}")
    assert f"bench:{dataset}" in rules and " DAV " in rules
    download = tmp_path / "download"
    cli(rucio_server, "download", "--dir", str(download), f"bench:{dataset}")
    for name, data in files.items():
        assert (download / dataset / name).read_bytes() == data
    assert hashlib.md5(files[streamed]).hexdigest() in catalog.request(
        "GET", f"/dids/bench/{streamed}/meta").text


def test_a_file_over_4_gib_is_stored_whole(mount_fs, rucio_server, tmp_path):
    """The prototype's `cp` of a 4.2 GB file stopped at 205 MB (a 32-bit size): a sparse
    4.3 GB file is streamed to the storage and registered with its full size and adler32,
    computed as it passed (the staged file is never read a second time for them)."""
    size = (4 << 30) + 12345
    source = tmp_path / "big.dat"
    with open(source, "wb") as f:
        f.truncate(size)
        f.seek(size // 2)
        f.write(b"the middle")
    m = writer(mount_fs, tmp_path, "rucio:///bench?upload_rse=DAV")
    dataset = unique("big")
    name = f"{dataset}.dat"
    os.mkdir(m.path / dataset)
    subprocess.run(["cp", str(source), str(m.path / dataset / name)], check=True,
                   timeout=900)
    checksum = 1
    with open(source, "rb") as f:
        while chunk := f.read(64 << 20):
            checksum = zlib.adler32(chunk, checksum)
    record = Catalog(rucio_server).replica("bench", name)
    assert int(record["bytes"]) == size
    assert record["adler32"] == f"{checksum:08x}" and record["states"]["DAV"] == "AVAILABLE"
    stored = Path(rucio_server.env["DAV_ROOT"]) / urlsplit(
        record["rses"]["DAV"][0]).path.lstrip("/")
    assert stored.stat().st_size == size
    stored.unlink()  # (4 GiB of test storage)


def test_a_file_rucio_upload_wrote_appears_in_the_mount(mount_fs, rucio_server, tmp_path):
    m = writer(mount_fs, tmp_path, "rucio:///bench?upload_rse=DAV")
    dataset = unique("cli")
    os.mkdir(m.path / dataset)
    data = random.Random(3).randbytes(7000)
    name = unique("by-cli") + ".dat"
    (tmp_path / name).write_bytes(data)
    cli(rucio_server, "upload", "--rse", "DAV", "--scope", "bench", str(tmp_path / name),
        f"bench:{dataset}", cwd=tmp_path)
    run_cli("cache", "drop", str(m.path), check=True)
    assert wait_for(lambda: name in os.listdir(m.path / dataset))
    assert (m.path / dataset / name).read_bytes() == data


def test_files_are_immutable_and_the_namespace_says_what_it_refuses(mount_fs, rucio_server,
                                                                    tmp_path):
    m = writer(mount_fs, tmp_path, "rucio:///bench?upload_rse=DAV")
    catalog = Catalog(rucio_server)
    dataset = unique("rules")
    os.mkdir(m.path / dataset)
    data, other = random.Random(1).randbytes(3000), random.Random(2).randbytes(3000)
    name = unique("once") + ".dat"
    (tmp_path / "data").write_bytes(data)
    (tmp_path / "other").write_bytes(other)
    target = m.path / dataset / name
    subprocess.run(["cp", str(tmp_path / "data"), str(target)], check=True)
    # Other content under a stored name: refused at close, nothing overwritten.
    result = subprocess.run(["cp", str(tmp_path / "other"), str(target)], capture_output=True,
                            text=True)
    assert result.returncode == 1 and "File exists" in result.stderr
    run_cli("uploads", "--discard", str(target), str(m.path))
    assert consistent(rucio_server, catalog, "bench", name, dataset, "DAV", data) == "stored"
    # The same content again: nothing to do, no second copy.
    subprocess.run(["cp", str(tmp_path / "data"), str(target)], check=True)
    # A shell's `>` closes a duplicate of the new file before writing: it is stored once.
    echoed = f"{dataset}.echoed.txt"
    subprocess.run(["sh", "-c", f"echo hello > {m.path / dataset / echoed}"], check=True)
    assert (m.path / dataset / echoed).read_text() == "hello\n"

    def refused(*command: str) -> str:
        result = subprocess.run(command, capture_output=True, text=True)
        assert result.returncode != 0, command
        return result.stderr

    assert "Operation not permitted" in refused("touch", str(m.path / unique("loose")))
    assert "Operation not permitted" in refused("mkdir", str(m.path / dataset / "sub"))
    assert "Invalid argument" in refused("touch", str(m.path / dataset / ".hidden"))
    # Rucio names are permanent: mv copies under the new name and detaches the old one.
    renamed = unique("renamed") + ".dat"
    subprocess.run(["mv", str(target), str(m.path / dataset / renamed)], check=True)
    assert (m.path / dataset / renamed).read_bytes() == data
    assert catalog.files("bench", dataset) == {renamed, echoed}
    subprocess.run(["rm", str(m.path / dataset / echoed)], check=True)
    assert catalog.files("bench", dataset) == {renamed}
    assert "Permission denied" in refused("rmdir", str(m.path / dataset))
    closed = rucio_server.catalog["ds1000"][0]["name"]  # ds1000 is closed
    assert "Permission denied" in refused("rm", str(m.path / "ds1000" / closed))
    assert closed in catalog.files("bench", "ds1000")
    read_only = mount_fs("rucio:///bench")
    assert "Read-only file system" in refused("mkdir", str(read_only.path / unique("ro")))


# -- every step failing, answering falsely, or the daemon dying in it --------------------------

#: (server, method, what the request holds): each request of one file's upload.
STEPS = {
    "storage path": ("api", "GET", "lfns2pfns"),
    "bytes": ("storage", "PUT", ".rucio.upload"),
    "claim": ("api", "POST", '"state":"C"'),
    "claim check": ("api", "POST", "/dids/bulkmeta"),
    "move": ("storage", "MOVE", ".rucio.upload"),
    "size check": ("storage", "HEAD", "/rucio/"),
    "available": ("api", "PUT", '"state":"A"'),
    "available check": ("api", "POST", "rucio-fs-states-only"),
    "attach": ("api", "POST", "/dids/attachments"),
}
CASES = ([(step, "error") for step in STEPS]
         + [(step, "lost-ok") for step in ("bytes", "claim", "move", "available", "attach")]
         + [(step, "fake-ok") for step in ("bytes", "available", "attach")])


@pytest.fixture()
def proxied(rucio_server):
    """The catalog and a storage (RSE ``FAULTY``: the test nginx) each behind a fault
    proxy."""
    with (fault_proxy(rucio_server.env["RUCIO_HOST"]) as api,
          fault_proxy(f"http://127.0.0.1:{rucio_server.env['DAV_HTTP']}") as storage):
        catalog = Catalog(rucio_server)
        rse = f"FAULTY{storage.port}"
        catalog.add_rse_behind(rse, storage.port)
        try:
            yield {"api": api, "storage": storage}, rse, catalog
        finally:  # out of the RSE list first reads guess on (other tests count them)
            catalog.request("PUT", f"/rses/{rse}", json={"availability_read": False})


@pytest.mark.parametrize("step,kind", CASES)
def test_every_step_of_an_upload_may_fail(mount_fs, rucio_server, tmp_path, proxied, step,
                                          kind):
    proxies, rse, catalog = proxied
    m = writer(mount_fs, tmp_path,
               f"rucio://127.0.0.1:{proxies['api'].port}/bench?api=http&upload_rse={rse}")
    dataset = unique("faults")
    os.mkdir(m.path / dataset)
    name = unique("f") + ".dat"
    data = random.Random(step + kind).randbytes(6000)
    (tmp_path / name).write_bytes(data)
    server, method, match = STEPS[step]
    proxies[server].inject(kind, match=match, method=method,
                           times=-1 if kind == "error" else 1)
    result = subprocess.run(["cp", str(tmp_path / name), str(m.path / dataset / name)],
                            capture_output=True, text=True)
    state = consistent(rucio_server, catalog, "bench", name, dataset, rse, data)
    if result.returncode == 0:
        assert state == "stored", f"close returned 0 but the file is {state}"
    else:
        assert kind == "error" or kind == "fake-ok", result.stderr
        proxies[server].clear()
        run_cli("uploads", "--retry", str(m.path))
        assert consistent(rucio_server, catalog, "bench", name, dataset, rse,
                          data) == "stored"


def test_an_upload_to_an_rse_whose_reads_are_switched_off_is_stored(mount_fs, rucio_server,
                                                                      tmp_path, proxied):
    """Sites switch an RSE's reads off for maintenance and keep writing to it: the upload's
    read-back still finds its replica AVAILABLE, and ``close`` returns 0."""
    proxies, rse, catalog = proxied
    catalog.request("PUT", f"/rses/{rse}", json={"availability_read": False})
    m = writer(mount_fs, tmp_path,
               f"rucio://127.0.0.1:{proxies['api'].port}/bench?api=http&upload_rse={rse}")
    dataset = unique("readsoff")
    os.mkdir(m.path / dataset)
    name = unique("f") + ".dat"
    data = random.Random(name).randbytes(6000)
    (tmp_path / name).write_bytes(data)
    result = subprocess.run(["cp", str(tmp_path / name), str(m.path / dataset / name)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert consistent(rucio_server, catalog, "bench", name, dataset, rse, data) == "stored"


@pytest.mark.parametrize("step", ["bytes", "claim", "move", "available", "attach"])
def test_a_daemon_killed_in_any_step_leaves_nothing_false_and_the_next_mount_finishes(
        mount_fs, rucio_server, tmp_path, proxied, step):
    """The daemon dies (``kill -9``) while a step's request hangs: no AVAILABLE replica
    without its bytes, no attachment without an AVAILABLE replica; the next mount replays
    the upload from its journal and stores the file."""
    proxies, rse, catalog = proxied
    url = f"rucio://127.0.0.1:{proxies['api'].port}/bench?api=http&upload_rse={rse}"
    staging = ("--staging-dir", str(tmp_path / "staging"))
    m = mount_fs(url, *ASYNC, *staging)
    dataset = unique("crash")
    os.mkdir(m.path / dataset)
    drained(m)
    name = unique("f") + ".dat"
    data = random.Random(step).randbytes(6000)
    server, method, match = STEPS[step]
    fault = proxies[server].inject("stall", match=match, method=method, times=1)
    (m.path / dataset / name).write_bytes(data)
    wait_for(lambda: fault.hits, timeout=30)
    pid = m.stats()["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not os.path.exists(f"/proc/{pid}"))
    subprocess.run(["fusermount3", "-u", "-z", str(m.path)], capture_output=True)
    consistent(rucio_server, catalog, "bench", name, dataset, rse, data)  # whatever state
    again = mount_fs(url, *ASYNC, *staging)
    drained(again)
    assert consistent(rucio_server, catalog, "bench", name, dataset, rse, data) == "stored"
    assert (again.path / dataset / name).read_bytes() == data


def test_kill_9_during_an_async_copy_then_the_next_mount_stores_every_file(
        mount_fs, rucio_server, tmp_path):
    """150 files copied with async write-back, the daemon killed while their uploads run:
    the next mount replays the rest, and the catalog and the storage agree file by file."""
    catalog = Catalog(rucio_server)
    staging = ("--staging-dir", str(tmp_path / "staging"))
    url = "rucio:///bench?upload_rse=DAV"
    m = mount_fs(url, *ASYNC, *staging)
    dataset = unique("killed")
    source = tmp_path / "source"
    source.mkdir()
    prefix = unique("k")
    rng = random.Random(9)
    files = {f"{prefix}-{i:03d}.dat": rng.randbytes(4096) for i in range(150)}
    for name, data in files.items():
        (source / name).write_bytes(data)
    subprocess.run(["cp", "-r", str(source), str(m.path / dataset)], check=True)
    wait_for(lambda: len(catalog.files("bench", dataset)) >= 20, timeout=120, interval=0.1)
    pid = m.stats()["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not os.path.exists(f"/proc/{pid}"))
    subprocess.run(["fusermount3", "-u", "-z", str(m.path)], capture_output=True)
    states = consistent_files(rucio_server, catalog, "bench", files, dataset, "DAV")
    assert list(states.values()).count("stored") < len(files)
    again = mount_fs(url, *ASYNC, *staging)
    drained(again)
    assert catalog.files("bench", dataset) == set(files)
    states = consistent_files(rucio_server, catalog, "bench", files, dataset, "DAV")
    assert set(states.values()) == {"stored"}
    assert not list(Path(rucio_server.env["DAV_ROOT"]).rglob(f"{prefix}-*.rucio.upload"))


def test_writing_needs_an_upload_rse(mount_fs, rucio_server):
    m = mount_fs("rucio:///bench")
    with pytest.raises(OSError) as raised:
        os.mkdir(m.path / unique("nowhere"))
    assert raised.value.errno == errno.EROFS


# -- group commit (in-process) -----------------------------------------------------------------

def test_one_file_written_into_several_datasets_at_once_is_one_file_in_each(rucio_server):
    """`cp` of the same results into several datasets with async write-back: uploads of
    one name and content meet in one registration; the file is stored once and attached to
    every dataset (a DID twice in one request was a database error on the server)."""
    from rucio_fs.testing.conformance import run_with

    datasets = [unique("same-file") for _ in range(8)]
    name, data = f"{datasets[0]}.shared.dat", b"the same bytes\n"

    async def write(backend) -> None:
        for dataset in datasets:
            await backend.mkdir(f"/{dataset}")
        async with trio.open_nursery() as nursery:
            for dataset in datasets:
                nursery.start_soon(backend.put, f"/{dataset}/{name}", data)
        assert backend.uploads._claims.calls < len(datasets)  # some went together

    run_with("rucio:///bench?upload_rse=DAV&schemes=http", write)
    catalog = Catalog(rucio_server)
    for dataset in datasets:
        assert consistent(rucio_server, catalog, "bench", name, dataset, "DAV",
                          data) == "stored"


def test_uploads_at_the_same_time_share_each_catalog_request():
    """Items arriving while a call is on its way go together in the next one; a call's
    failure per item fails that item only, and an error of the call fails its whole batch."""
    calls: list[list[int]] = []

    async def send(items: list[int]) -> dict:
        calls.append(sorted(items))
        await trio.sleep(1)
        if 63 in items:
            raise Unavailable("the catalog is down")
        return {i: AlreadyExists(f"{i} taken") for i in items if i % 2}

    group = GroupCommit(send, most=50)
    outcomes: dict[int, str] = {}

    async def one(i: int) -> None:
        try:
            await group.run(i)
            outcomes[i] = "ok"
        except (AlreadyExists, Unavailable) as exc:
            outcomes[i] = type(exc).__name__

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(one, 0)
            await trio.sleep(0.1)  # 0 goes alone; the next 100 wait for it, then 50 and 50
            for i in range(1, 101):
                nursery.start_soon(one, i)

    trio.run(main, clock=MockClock(autojump_threshold=0))
    assert [len(c) for c in calls] == [1, 50, 50]
    # trio starts tasks in no fixed order: which items share 63's batch differs run to run
    batch_of_63 = next(c for c in calls if 63 in c)
    assert all(outcomes[i] == "Unavailable" for i in batch_of_63)
    others = [i for i in range(101) if i not in batch_of_63]
    assert len(others) == 51
    assert all(outcomes[i] == ("AlreadyExists" if i % 2 else "ok") for i in others)
    assert {outcomes[i] for i in others} == {"AlreadyExists", "ok"}
