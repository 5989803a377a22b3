"""The shared tier (Redis) — its promises, each step under them broken:

* a listing served from the tier is the backend's complete listing, never a shorter one
  (a publication without its end marker, with a wrong count, in another format, or evicted
  is not served; a dead lease holder's partial listing is completed and its phantoms dropped);
* N mounts listing one cold directory at once cost the catalog one listing;
* Redis down, slow, full or killed never fails or hangs a mount, and shared again once back;
* identities never see each other's entries; nothing secret is written.

In-process tests run the real :class:`~rucio_fs.catalog.catalog.Catalog` over real Redis; the rest
go through real mounts (the real Rucio server for the 8-mount test).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from types import SimpleNamespace

import pytest
import trio
from conftest import RedisServer, adler32, redis_instance, run_cli, wait_for
from hypothesis import given
from hypothesis import strategies as st
from rucio_fs.backends.demo import DemoBackend
from trio.testing import MockClock

from rucio_fs import redis_client
from rucio_fs.backend import Entry, Kind
from rucio_fs.catalog.catalog import Catalog
from rucio_fs.catalog.shared import FORMAT, _dumps, _loads, decode_chunk, encode_chunk
from rucio_fs.config import MountConfig
from rucio_fs.errors import InvalidInput
from rucio_fs.observe.stats import Stats
from rucio_fs.redis_client import Redis, RedisAddress

DIR = "/ls/files-3000"


class Paged(DemoBackend):
    """The demo catalog, listing in pages with a pause between them (a slow catalog)."""

    def __init__(self, pause: float = 0.0, faults: bool = False) -> None:
        super().__init__(faults=faults)
        self.pause = pause

    async def list(self, path: str) -> AsyncIterator[Entry]:
        number = 0
        async for entry in super().list(path):
            if number and number % 500 == 0:
                await trio.sleep(self.pause)
            number += 1
            yield entry


def catalog(redis_url: str, backend: DemoBackend | None = None, **config) -> Catalog:
    return Catalog(backend or DemoBackend(),
                   MountConfig(shared_cache=redis_url, **{"shared_timeout": 0.5, **config}),
                   Stats())


async def listed(cat: Catalog, path: str = DIR) -> list[Entry]:
    listing = await cat.list(path)
    while not listing.done:
        await listing.wait_beyond(len(listing.entries))
    if listing.error is not None:
        raise listing.error
    return [e for e in listing.entries if e is not None]


def expected(path: str = DIR) -> list[Entry]:
    """What the demo catalog lists at ``path``."""
    return list(DemoBackend()._children(path))


def shared(cat: Catalog) -> Counter[str]:
    return Counter(cat.stats.cache_layer("shared"))


@pytest.fixture
def redis(redis_server: RedisServer) -> Iterator[RedisServer]:
    redis_server.cli("FLUSHALL")
    yield redis_server


# -- in-process: the promises of a served listing ----------------------------------------------

_text = st.text(st.characters(blacklist_categories=()), max_size=20)  # surrogates included
_entries = st.builds(
    Entry, name=_text, kind=st.sampled_from(Kind), size=st.integers(0, 1 << 70),
    mtime_ns=st.integers(0, 1 << 63), checksums=st.dictionaries(_text, _text, max_size=2),
    immutable=st.booleans(), version=_text, metadata=st.dictionaries(_text, _text, max_size=2),
    mode=st.none() | st.integers(0, 0o7777))


@given(st.lists(_entries, max_size=30))
def test_any_entry_survives_the_tier_exactly(entries):
    """Whatever a backend lists (names that are not UTF-8, sizes past 2**64, any checksums and
    metadata) comes back from Redis's bytes as the same entries."""
    assert decode_chunk(_loads(_dumps(encode_chunk(entries)))) == entries


def test_a_second_mount_lists_from_the_tier_without_asking_the_catalog(redis):
    async def main() -> None:
        first, second = catalog(redis.url), catalog(redis.url)
        assert await listed(first) == expected()
        assert await listed(second) == expected()
        assert second.backend.requests["list"] == 0
        assert shared(second)["hits"] == 1 and shared(first)["misses"] == 1
        # stats and negative entries too
        await first.stat("/README.txt")
        with pytest.raises(Exception, match="nothing"):
            await first.stat("/nothing")
        assert (await second.stat("/README.txt")).size == (await first.stat("/README.txt")).size
        with pytest.raises(Exception, match="nothing"):
            await second.stat("/nothing")
        assert second.backend.requests["stat"] == 0
    trio.run(main)


def _corrupt(redis: RedisServer, how: str) -> None:
    """Break the one publication in Redis the way ``how`` says."""
    [pointer] = [k for k in redis.cli("--scan").split() if "|list|" in k]
    token = redis.cli("GET", pointer).strip()
    [chunks] = [k for k in redis.cli("--scan").split() if f"|chunks|{token}|" in k]
    if how == "no end marker":
        redis.cli("RPOP", chunks)
    elif how == "wrong count":
        redis.cli("RPOP", chunks)
        redis.cli("RPUSH", chunks, FORMAT.decode() + ':{"end":2999}')
    elif how == "a chunk lost":
        redis.cli("LPOP", chunks)
    elif how == "another format":
        redis.cli("LSET", chunks, "0", "rfs9:" + json.dumps(encode_chunk([])))
    elif how == "garbage":
        redis.cli("LSET", chunks, "0", FORMAT.decode() + ":{not json")
    elif how == "evicted":
        redis.cli("DEL", chunks)
    else:
        raise AssertionError(how)


@pytest.mark.parametrize("how", ["no end marker", "wrong count", "a chunk lost",
                                 "another format", "garbage", "evicted"])
def test_a_broken_publication_is_never_served_as_a_listing(redis, how):
    async def main() -> None:
        await listed(catalog(redis.url))
        _corrupt(redis, how)
        reader = catalog(redis.url)
        assert await listed(reader) == expected()
        assert reader.backend.requests["list"] == 1  # it listed again, and published anew
        assert await listed(catalog(redis.url)) == expected()
    trio.run(main)


def test_a_dead_holders_partial_listing_is_completed_and_its_phantoms_dropped(redis):
    """A lease whose holder died after publishing 500 entries and a name the catalog no
    longer has: the follower waits for the lease to expire, lists itself, and ends with
    exactly the catalog's listing."""
    async def main() -> None:
        reader = catalog(redis.url)
        tier = reader.shared
        assert tier is not None
        token = "0123456789abcdef"
        ghost = Entry("ghost.dat", Kind.FILE, 1)
        partial = [*expected()[:500], ghost]
        redis.cli("SET", tier.key("lease", DIR).decode(), token, "PX", "700")
        redis.cli("RPUSH", tier.chunks_key(token, DIR).decode(),
                  FORMAT.decode() + ":" + json.dumps(encode_chunk(partial)))
        start = time.monotonic()
        assert await listed(reader) == [e for e in expected()]
        assert "ghost.dat" not in (await reader.list(DIR)).by_name
        assert time.monotonic() - start >= 0.6  # it waited for the lease, not less
        assert shared(reader)["takeovers"] == 1 and reader.backend.requests["list"] == 1
    trio.run(main)


def test_concurrent_mounts_make_one_listing_and_stream_it(redis):
    """Eight catalogs (as eight mounts) list a cold, slow directory at once: the catalog is
    asked once; the others stream the holder's publication and see its first entries
    before the listing ends."""
    async def main() -> None:
        backends = [Paged(pause=0.05) for _ in range(8)]
        cats = [catalog(redis.url, b) for b in backends]
        early: list[int] = []
        results: list[list[Entry]] = []

        async def one(cat: Catalog) -> None:
            listing = await cat.list(DIR)
            early.append(int(not listing.done))
            results.append(await listed(cat))

        async with trio.open_nursery() as background, trio.open_nursery() as nursery:
            for cat in cats:
                cat.nursery = background  # as the daemon does: listings fill in the background
                nursery.start_soon(one, cat)
        assert all(r == expected() for r in results)
        assert sum(b.requests["list"] for b in backends) == 1
        assert sum(shared(c)["lease_waits"] for c in cats) == 7
        assert sum(early) == 8  # everyone had entries before the listing was complete
    trio.run(main)


def test_a_failing_listing_is_not_published(redis):
    """The holder's listing breaks mid-stream: it is an error there, nothing is published,
    and the next mount lists from the catalog (and gets the same error)."""
    async def main() -> None:
        first = catalog(redis.url, DemoBackend(faults=True))
        with pytest.raises(Exception, match="broken"):
            await listed(first, "/faults/broken-listing")
        assert not [k for k in redis.cli("--scan").split() if "|list|" in k]
        assert not [k for k in redis.cli("--scan").split() if "|lease|" in k]  # released
        second = catalog(redis.url, DemoBackend(faults=True))
        with pytest.raises(Exception, match="broken"):
            await listed(second, "/faults/broken-listing")
        assert second.backend.requests["list"] == 1
        counters = shared(second)  # it took the lease at once: no wait for it to expire
        assert counters["misses"] == 1 and not counters.get("lease_waits")
        assert not counters.get("takeovers")
    trio.run(main)


# -- in-process: Redis failing ------------------------------------------------------------------

@pytest.fixture
def silent_server() -> Iterator[int]:
    """A TCP server that accepts connections and never answers (a hung Redis)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join()
    for sock in held:
        sock.close()
    listener.close()


@pytest.mark.parametrize("where", ["nothing listening", "never answers"])
def test_an_unusable_redis_costs_at_most_its_timeout_once(where, silent_server, monkeypatch):
    """Two listings (3,500 entries) and a stat with Redis unusable: one call fails, within
    its timeout, and the breaker sends the rest straight to the catalog. The time waited is
    measured on trio's clock, here a mock one that moves only by jumping to the next
    deadline once every task waits: it is the time spent waiting, whatever the machine's
    load. The breaker runs on that clock too, so it stays open for the whole test."""
    port = silent_server if where == "never answers" else _closed_port()
    monkeypatch.setattr(redis_client, "time", SimpleNamespace(monotonic=trio.current_time))
    timeout = 0.05

    async def main() -> None:
        cat = catalog(f"redis://127.0.0.1:{port}/0", shared_timeout=timeout)
        start = trio.current_time()
        assert await listed(cat) == expected()
        assert (await cat.stat("/README.txt")).size > 0
        assert await listed(cat, "/ls/files-500") == expected("/ls/files-500")
        waited = trio.current_time() - start
        counters = shared(cat)
        assert counters["errors"] == 1  # the first call failed; the breaker spared the rest
        assert counters["bypassed"] >= 2
        assert waited <= timeout, waited  # one timeout at most, then straight to the catalog
    trio.run(main, clock=MockClock(autojump_threshold=0.1))


def test_a_large_send_to_a_redis_that_keeps_reading_is_not_silence():
    """A listing's chunks (megabytes) to a Redis that reads steadily but slowly (a loaded
    node): the send takes far longer than the timeout, yet Redis was never silent."""
    value = os.urandom(8 << 20)
    command = b"".join([b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n",
                        f"${len(value)}\r\n".encode(), value, b"\r\n"])
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    received = bytearray()

    def serve() -> None:
        peer, _ = listener.accept()
        with peer:
            while len(received) < len(command):
                time.sleep(0.002)  # ~32 MB/s: every step progresses, the whole takes long
                received.extend(peer.recv(64 << 10))
            peer.sendall(b"+OK\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()

    async def main() -> None:
        redis = Redis(RedisAddress.parse(f"redis://127.0.0.1:{listener.getsockname()[1]}/0"),
                      0.05)
        start = time.monotonic()
        assert await redis.run(("SET", "k", value)) == [b"OK"]
        assert time.monotonic() - start > 0.05 and redis.failures == 0
        await redis.aclose()

    try:
        trio.run(main)
    finally:
        thread.join(5)
        listener.close()
    assert bytes(received) == command


def _closed_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


def test_a_full_redis_only_costs_sharing(tmp_path):
    """Redis at its memory limit refuses writes (noeviction): every listing is still
    complete, straight from the catalog, and the failures are counted."""
    with redis_instance(tmp_path / "redis", REDIS_MAXMEMORY="1mb") as redis:
        # allowed once (Redis checks the limit before a write); now it is over its limit
        redis.cli("-x", "SET", "filler", input="x" * 2_000_000)

        async def main() -> None:
            first, second = catalog(redis.url), catalog(redis.url)
            assert await listed(first, "/ls/files-10000") == expected("/ls/files-10000")
            assert await listed(second, "/ls/files-10000") == expected("/ls/files-10000")
            assert second.backend.requests["list"] == 1
            assert shared(first)["errors"] >= 1
        trio.run(main)


# -- identities and secrets ----------------------------------------------------------------

def test_two_identities_never_share_entries(redis):
    """``demo faults=1`` lists a /faults directory that ``demo faults=0`` has not: the second
    identity lists from its own catalog and sees its own view."""
    async def main() -> None:
        plain, faulty = catalog(redis.url), catalog(redis.url, DemoBackend(faults=True))
        assert "faults" not in {e.name for e in await listed(plain, "/")}
        assert "faults" in {e.name for e in await listed(faulty, "/")}
        assert faulty.backend.requests["list"] == 1 and shared(faulty).get("hits", 0) == 0
        assert plain.shared and faulty.shared and plain.shared.key("list", "/") != \
            faulty.shared.key("list", "/")
    trio.run(main)


def test_a_backend_without_an_identity_is_refused():
    with pytest.raises(InvalidInput, match="no identity"):
        Catalog(open_memory(), MountConfig(shared_cache="redis://127.0.0.1:1/0"), Stats())


def open_memory():
    from rucio_fs.registry import open_backend
    return open_backend("memory://shared-test")


@pytest.mark.parametrize("url", ["http://127.0.0.1:6379", "redis://", "redis://h:port/0",
                                 "redis://127.0.0.1/x", "redis://127.0.0.1?db=1",
                                 "redis://127.0.0.1?ca=/etc/hostname",
                                 "rediss://127.0.0.1?ca=/no/such/ca.crt",
                                 "rediss://127.0.0.1?ca=/etc/hostname",  # not a certificate
                                 "redis://:hunter2@127.0.0.1/x"])
def test_bad_shared_cache_urls_are_one_line_errors(url, tmp_path):
    result = run_cli("mount", "demo://", str(tmp_path), "--shared-cache", url)
    assert result.returncode != 0
    assert result.stderr.count("\n") == 1 and "shared cache" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and "hunter2" not in result.stderr


def test_memory_backend_with_shared_cache_fails_the_mount_in_one_line(tmp_path, redis):
    result = run_cli("mount", "memory://x", str(tmp_path), "--shared-cache", redis.url)
    assert result.returncode != 0 and "no identity" in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr


# -- through the kernel --------------------------------------------------------------------

def test_eight_rucio_mounts_listing_one_cold_dataset_make_one_listing(mount_fs, rucio_server,
                                                                    redis):
    # CI's 2 cores run 8 daemons and 8 `ls -l` at once: Redis itself can wait 50 ms for a
    # core there, which would (rightly) send a mount to the catalog. Single flight is what
    # this test is about; the timeout's own behaviour is tested above.
    mounts = [mount_fs("rucio:///bench", "--shared-cache", redis.url, "--shared-timeout", "500ms")
              for _ in range(8)]
    request = "GET /dids/bench/ds10000/dids "
    before = rucio_server.access_log_lines(request)
    procs = [subprocess.Popen(["ls", "-l", str(m.path / "ds10000")], stdout=subprocess.PIPE)
             for m in mounts]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert all(out.count(b"\n") == 10_001 for out in outputs)  # "total" + 10,000 files
    assert all(out.split(b"\n")[1:] == outputs[0].split(b"\n")[1:] for out in outputs)
    assert wait_for(lambda: rucio_server.access_log_lines(request) > before)
    time.sleep(0.5)  # a second listing would have been logged by now
    assert rucio_server.access_log_lines(request) - before == 1
    # nothing secret went to Redis: no password, token or URL in any value
    for key in redis.cli("--scan").split():
        if "|value|" in key:
            continue  # shared replica locations hold PFNs (tested below)
        kind = redis.cli("TYPE", key).strip()
        values = (redis.cli("LRANGE", key, "0", "-1") if kind == "list"
                  else redis.cli("GET", key))
        for secret in ("secret", "ddmlab", "://", "token"):
            assert secret not in values, (key, secret)


def test_a_killed_lease_holder_is_replaced_and_nobody_gets_a_partial_listing(mount_fs, redis):
    holder = mount_fs("demo://?latency=300ms&page=1000", "--shared-cache", redis.url)
    follower = mount_fs("demo://", "--shared-cache", redis.url)
    target = "ls/files-10000"
    first = subprocess.Popen(["ls", str(holder.path / target)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    assert wait_for(lambda: any("|chunks|" in k for k in redis.cli("--scan").split()))
    second = subprocess.Popen(["ls", str(follower.path / target)], stdout=subprocess.PIPE)
    assert wait_for(lambda: follower.stats()["cache"]["shared"].get("lease_waits") == 1)
    os.kill(holder.stats()["pid"], 9)
    out, _ = second.communicate(timeout=60)
    first.communicate(timeout=60)
    names = out.split()
    assert second.returncode == 0 and len(names) == len(set(names)) == 10_000
    assert follower.stats()["cache"]["shared"]["takeovers"] == 1


def test_redis_killed_mid_run_then_back(mount_fs, own_redis):
    a = mount_fs("demo://", "--shared-cache", own_redis.url)
    b = mount_fs("demo://", "--shared-cache", own_redis.url)
    assert len(os.listdir(a.path / "ls/files-500")) == 500
    assert len(os.listdir(b.path / "ls/files-500")) == 500
    assert b.stats()["cache"]["shared"]["hits"] >= 1
    own_redis.kill()
    start = time.monotonic()
    for mount in (a, b):
        assert len(os.listdir(mount.path / "ls/files-1000")) == 1000
        assert len(os.listdir(mount.path / "datasets/O3a/H1")) == 100
    assert time.monotonic() - start < 5  # each mount paid one short timeout at most
    assert a.stats()["cache"]["shared"]["errors"] >= 1
    assert "shared cache" in a.log_text() and "working without it" in a.log_text()
    own_redis.start()

    def shared_again() -> bool:
        a.drop("metadata", "listing")
        os.listdir(a.path / "ls/files-3000")
        return a.stats()["cache"]["shared"].get("stores", 0) >= 1 and any(
            "files-3000" in k for k in own_redis.cli("--scan").split())
    assert wait_for(shared_again, timeout=20, interval=0.5)
    before = b.backend_calls("list")
    assert len(os.listdir(b.path / "ls/files-3000")) == 3000
    assert b.backend_calls("list") == before  # from the tier again
    assert "answers again" in a.log_text()


def test_cache_drop_shared_forgets_this_mounts_keys(mount_fs, redis):
    """``cache drop --layer shared`` deletes the keys this mount wrote and nothing else in
    the Redis it shares: what another mount of the same catalog wrote, another catalog's
    keys and keys that are not rucio-fs's stay (never a FLUSHDB)."""
    m = mount_fs("demo://", "--shared-cache", redis.url)
    same_catalog = mount_fs("demo://", "--shared-cache", redis.url)
    other_catalog = mount_fs("demo://?faults=1", "--shared-cache", redis.url)
    redis.cli("SET", "not-rucio-fs", "kept")
    for mount, listed in ((m, "files-500"), (same_catalog, "files-1000"),
                          (other_catalog, "files-500")):
        os.listdir(mount.path / "ls" / listed)
        wait_for(lambda mount=mount: mount.stats()["cache"]["shared"].get("stores", 0) >= 1)
    before = set(redis.cli("--scan").split())
    theirs = {k for k in before if "files-1000" in k or "faults=1" in k}
    assert any("faults=0|list|/ls/files-1000" in k for k in theirs)
    assert any("faults=1|list|/ls/files-500" in k for k in theirs)
    result = m.drop("shared")
    after = set(redis.cli("--scan").split())
    assert result["shared_keys_deleted"] == len(before - after) >= 2
    assert not [k for k in after if "faults=0|list|/ls/files-500" in k]
    assert theirs <= after, theirs - after
    assert redis.cli("GET", "not-rucio-fs").strip() == "kept"


def test_resolved_replicas_are_shared_and_each_mount_reads_the_right_bytes(mount_fs,
                                                                           rucio_server, redis):
    # Every read resolves its replicas (no guessed first reads), so each one is shared.
    first = mount_fs("rucio:///bench?schemes=http&speculate=off", "--shared-cache", redis.url)
    second = mount_fs("rucio:///bench?schemes=http&speculate=off", "--shared-cache", redis.url)
    files = rucio_server.catalog["ds500"][:3]
    for f in files:
        assert adler32((first.path / "ds500" / f["name"]).read_bytes()) == f["adler32"]
    assert first.stats()["backend_counters"]["replica_requests"] >= 1
    for f in files:
        assert adler32((second.path / "ds500" / f["name"]).read_bytes()) == f["adler32"]
    counters = second.stats()["backend_counters"]
    assert counters["replica_requests"] == 0 and counters["replica_shared_hits"] == 3
    assert "://" in "".join(redis.cli("GET", k) for k in redis.cli("--scan").split()
                            if "|value|replicas" in k)  # PFNs, never signed (no query)


def test_cold_turns_the_shared_tier_off_like_every_layer():
    url = "redis://127.0.0.1:6379/0"
    assert MountConfig.from_options({"shared_cache": url}).shared
    assert not MountConfig.from_options({"shared_cache": url}, cold=True).shared


@pytest.fixture
def tls_redis(tmp_path) -> Iterator[RedisServer]:
    """Redis over TLS only (a CA of its own) that requires a password."""
    with redis_instance(tmp_path / "redis-tls", REDIS_TLS="1",
                        REDIS_PASSWORD="rfs-test-pass") as server:
        yield server


def test_tls_and_a_password_share_and_the_password_is_shown_nowhere(mount_fs, tls_redis,
                                                                    monkeypatch):
    url = tls_redis.url
    assert url.startswith("rediss://:rfs-test-pass@") and "?ca=" in url
    first = mount_fs("demo://", "--shared-cache", url)
    assert len(os.listdir(first.path / "ls/files-500")) == 500
    # the password may also come from the environment (a command line is public in ps)
    monkeypatch.setenv("RUCIO_FS_SHARED_CACHE_PASSWORD", "rfs-test-pass")
    second = mount_fs("demo://", "--shared-cache", url.replace(":rfs-test-pass@", ""))
    assert len(os.listdir(second.path / "ls/files-500")) == 500
    assert second.backend_calls("list") == 0 and second.stats()["cache"]["shared"]["hits"] >= 1
    for mount in (first, second):
        assert "rfs-test-pass" not in json.dumps(mount.stats()) + mount.log_text()
    assert first.stats()["config"]["shared_cache"].startswith("rediss://:***@")


@pytest.mark.parametrize(("change", "logged"), [
    (lambda url: url.replace("rfs-test-pass", "wrong"), "WRONGPASS"),
    (lambda url: url.split("?")[0], "CERTIFICATE_VERIFY_FAILED"),  # not our CA
])
def test_a_refused_tls_or_password_costs_only_sharing(mount_fs, tls_redis, change, logged):
    # A generous deadline: what is tested is the reason logged, and a TLS handshake on a
    # loaded 2-core machine can take longer than the 50 ms default (a CI run saw it).
    m = mount_fs("demo://", "--shared-cache", change(tls_redis.url), "--shared-timeout", "2")
    assert len(os.listdir(m.path / "ls/files-500")) == 500
    assert m.stats()["cache"]["shared"]["errors"] >= 1
    assert logged in m.log_text() and "rfs-test-pass" not in m.log_text()
