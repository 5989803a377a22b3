"""First reads on Rucio: guessed PFNs on deterministic RSEs, and sibling batches.

The promise under test: a read that returns bytes returns the catalog's bytes. A guess is
broken at every step — the copy missing (``moved.dat``), damaged (``corrupt.dat``,
``bad.dat``), short (``short.dat``), its storage refusing connections (``DEAD``), the RSE
not deterministic (``nondet.dat``, with a decoy where a hash layout would put it), the
replica catalog failing or answering late — and the bytes are checked every time. Request
counts come from the servers' own access logs and the mount's counters.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path

import pytest
import trio
from conftest import adler32, run_cli, wait_for
from rucio_fs.backends.rucio.backend import RucioBackend
from rucio_fs.backends.rucio.layout import RseDescription, lfn2pfn_path

from rucio_fs.backend import Entry, Kind
from rucio_fs.errors import Unavailable


def log_lines(path: str) -> list[str]:
    return Path(path).read_text(errors="replace").splitlines()


def nginx_log(server) -> str:
    return str(server.base / "logs" / "nginx-access.log")


def requests_since(path: str, start: int) -> list[str]:
    """The request lines (``METHOD /path``) logged after line ``start``."""
    return [line.split('"')[1].rsplit(" ", 1)[0] for line in log_lines(path)[start:]
            if '"' in line]


def logged_since(path: str, start: int, count: int) -> list[str]:
    """:func:`requests_since`, once it holds ``count`` lines (nginx logs a request after
    its answer is sent: a loaded machine may run the client first), then a moment more."""
    wait_for(lambda: len(requests_since(path, start)) >= count, timeout=10)
    time.sleep(0.2)
    return requests_since(path, start)


def counters(m) -> dict:
    return m.stats()["backend_counters"]


def by_name(server, dataset: str, name: str) -> dict:
    return next(f for f in server.catalog[dataset] if f["name"] == name)


def test_a_cold_cat_reads_the_computed_pfn_and_asks_no_replica_catalog(mount_fs,
                                                                     rucio_server):
    # A long hedge: the count does not depend on how fast a loaded machine answers.
    m = mount_fs("rucio:///bench?rses=DAV&speculate_hedge=30s")
    api, storage = rucio_server.env["ACCESS_LOG"], nginx_log(rucio_server)
    api_start, storage_start = len(log_lines(api)), len(log_lines(storage))
    f = rucio_server.catalog["ds5000"][4321]
    data = (m.path / "ds5000" / f["name"]).read_bytes()
    assert (len(data), adler32(data)) == (f["bytes"], f["adler32"])
    asked = requests_since(api, api_start)
    assert sorted(asked) == sorted(["GET /dids/bench/ds5000",
                                    f"GET /dids/bench/{f['name']}",
                                    f"GET /dids/bench/{f['name']}/parents"]), asked
    got = logged_since(storage, storage_start, 1)
    assert got == [f"GET /rucio/{lfn2pfn_path('hash', 'bench', f['name'])}"], got
    c = counters(m)
    assert (c["speculative_reads"], c["speculative_hits"], c["replica_requests"]) == (1, 1, 0)


def test_with_no_hedge_the_replica_lookup_goes_out_beside_the_guess(mount_fs, rucio_server):
    m = mount_fs("rucio:///bench/ds1000?rses=DAV&speculate_hedge=0")
    f = rucio_server.catalog["ds1000"][77]
    assert adler32((m.path / f["name"]).read_bytes()) == f["adler32"]
    c = counters(m)
    assert c["speculative_hedged"] == 1 and c["replica_requests"] == 1
    assert c["speculative_hits"] + c.get("speculative_misses", 0) == 1


def test_every_broken_guess_falls_back_to_the_catalogs_bytes(mount_fs, rucio_server):
    m = mount_fs("rucio:///bench/guess?rses=DAV&speculate_hedge=30s&timeout=2s")
    for name in ("moved.dat", "corrupt.dat"):  # missing / damaged on DAV, good on DAV2
        f = by_name(rucio_server, "guess", name)
        data = (m.path / name).read_bytes()
        assert (len(data), adler32(data)) == (f["bytes"], f["adler32"]), name
    with pytest.raises(OSError) as exc:  # damaged on DAV, its only RSE: no bytes at all
        (m.path / "bad.dat").read_bytes()
    assert exc.value.errno == errno.EIO
    c = counters(m)
    assert c["speculative_reads"] == 3 and c.get("speculative_hits", 0) == 0
    assert c["speculative_misses"] == 1 and c["speculative_mismatches"] == 2
    assert c["replica_requests"] == 3
    # corrupt.dat's damaged copy was tried last: its good one on DAV2 served the read.
    assert "corrupt.dat: no readable replica" not in m.log_text()


def test_short_and_unreachable_guesses_fall_back(mount_fs, rucio_server):
    m = mount_fs("rucio:///bench/faults?speculate=DEAD&timeout=2s")
    f = by_name(rucio_server, "faults", "fallback.dat")  # on DEAD (refuses) and on DAV
    assert adler32((m.path / "fallback.dat").read_bytes()) == f["adler32"]
    assert counters(m)["speculative_misses"] == 1
    m2 = mount_fs("rucio:///bench/faults?rses=DAV&timeout=2s")
    with pytest.raises(OSError) as exc:  # the catalog says 8 KiB, storage holds 4 KiB
        (m2.path / "short.dat").read_bytes()
    assert exc.value.errno == errno.EIO
    assert counters(m2)["speculative_misses"] == 1


@pytest.mark.parametrize("option", ["speculate=NONDET", "rses=NONDET"])
def test_a_non_deterministic_rse_is_never_guessed(mount_fs, rucio_server, option):
    m = mount_fs(f"rucio:///bench/guess?{option}")
    storage = nginx_log(rucio_server)
    start = len(log_lines(storage))
    f = by_name(rucio_server, "guess", "nondet.dat")
    assert adler32((m.path / "nondet.dat").read_bytes()) == f["adler32"]
    assert counters(m).get("speculative_reads", 0) == 0
    got = logged_since(storage, start, 1)
    assert got == ["GET /nondet/chosen/at/registration/nondet.dat"], got  # never the decoy


def test_a_fresh_default_mount_guesses_on_the_rses_it_discovers(mount_fs, rucio_server):
    """No option: the mount lists the catalog's RSEs and describes the deterministic disk
    ones (DAV, DAV2, DEAD and the root:// XRD; never NONDET). The first read of a
    never-listed file guesses on all four at once and asks no replica catalog; the verified
    copy confirms DAV, so the next first read is one storage GET. A cache drop forgets the
    confirmation."""
    m = mount_fs("rucio:///bench?speculate_hedge=30s")
    api, storage = rucio_server.env["ACCESS_LOG"], nginx_log(rucio_server)
    c = counters(m)
    assert (c["rse_lists"], c["rse_descriptions"]) == (1, 4)
    first, second, third = (rucio_server.catalog["ds5000"][i] for i in (11, 12, 13))
    assert adler32((m.path / "ds5000" / first["name"]).read_bytes()) == first["adler32"]
    c = counters(m)
    assert (c["speculative_reads"], c["speculative_hits"]) == (4, 1)
    assert c.get("replica_requests", 0) == 0
    api_start, storage_start = len(log_lines(api)), len(log_lines(storage))
    assert adler32((m.path / "ds5000" / second["name"]).read_bytes()) == second["adler32"]
    assert logged_since(storage, storage_start, 1) == [
        f"GET /rucio/{lfn2pfn_path('hash', 'bench', second['name'])}"]
    assert not [r for r in requests_since(api, api_start) if "replicas" in r or "rses" in r]
    run_cli("cache", "drop", str(m.path), check=True)
    assert adler32((m.path / "ds5000" / third["name"]).read_bytes()) == third["adler32"]
    c = counters(m)
    assert (c["speculative_reads"], c.get("replica_requests", 0)) == (4 + 1 + 4, 0)


def test_a_discovered_guess_is_still_checked(mount_fs, rucio_server):
    """On a default mount, a damaged copy at the computed PFN is never served: bad.dat
    (damaged on DAV, its only RSE) fails with EIO, corrupt.dat comes from DAV2."""
    m = mount_fs("rucio:///bench/guess?speculate_hedge=30s&timeout=2s")
    f = by_name(rucio_server, "guess", "corrupt.dat")
    data = (m.path / "corrupt.dat").read_bytes()
    assert (len(data), adler32(data)) == (f["bytes"], f["adler32"])
    with pytest.raises(OSError) as exc:
        (m.path / "bad.dat").read_bytes()
    assert exc.value.errno == errno.EIO
    assert counters(m)["speculative_reads"] >= 4


def test_learned_layouts_are_kept_in_the_cache_dir(mount_fs, rucio_server, tmp_path):
    """A mount with --cache-dir keeps what it learned: the next mount there lists and
    describes no RSE, and its first read is one storage GET on the confirmed RSE."""
    cache = str(tmp_path / "cache")
    files = rucio_server.catalog["ds1000"]
    first = mount_fs("rucio:///bench", "--cache-dir", cache)
    assert adler32((first.path / "ds1000" / files[3]["name"]).read_bytes()) == files[3][
        "adler32"]
    first.unmount(check=True)
    again = mount_fs("rucio:///bench", "--cache-dir", cache)
    assert adler32((again.path / "ds1000" / files[4]["name"]).read_bytes()) == files[4][
        "adler32"]
    c = counters(again)
    assert (c["rse_layouts_restored"], c.get("rse_lists", 0), c.get("rse_descriptions", 0)) \
        == (1, 0, 0)
    assert (c["speculative_reads"], c["speculative_hits"], c.get("replica_requests", 0)) \
        == (1, 1, 0)


def test_a_mount_on_the_same_redis_learns_without_its_own_rse_requests(mount_fs,
                                                                        rucio_server,
                                                                        own_redis):
    shared = ("--shared-cache", own_redis.url, "--shared-timeout", "500ms")
    files = rucio_server.catalog["ds1000"]
    teacher = mount_fs("rucio:///bench", *shared)
    assert adler32((teacher.path / "ds1000" / files[5]["name"]).read_bytes()) == files[5][
        "adler32"]
    pupil = mount_fs("rucio:///bench", *shared)
    api = rucio_server.env["ACCESS_LOG"]
    start = len(log_lines(api))
    assert adler32((pupil.path / "ds1000" / files[6]["name"]).read_bytes()) == files[6][
        "adler32"]
    c = counters(pupil)
    assert (c["rse_layouts_restored"], c.get("rse_descriptions", 0)) == (1, 0)
    assert (c["speculative_reads"], c.get("replica_requests", 0)) == (1, 0)
    assert not [r for r in requests_since(api, start) if "/rses" in r or "replicas" in r]


def test_an_unknown_rse_to_speculate_on_fails_the_mount(rucio_server, tmp_path):
    result = run_cli("mount", "rucio:///bench?speculate=NOPE", str(tmp_path))
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        "rucio-fs: rucio option speculate: the catalog has no RSE 'NOPE'"]


def test_a_loop_over_a_listed_dataset_resolves_siblings_in_growing_batches(mount_fs,
                                                                          rucio_server):
    m = mount_fs("rucio:///bench/ds1000?speculate=off")
    files = rucio_server.catalog["ds1000"][:100]
    os.listdir(m.path)
    for f in files:
        assert adler32((m.path / f["name"]).read_bytes()) == f["adler32"]
    c = counters(m)
    # 1 file, then 1+16, 1+64, 1+256: the 100 files cost 4 requests, not 100.
    assert (c["replica_requests"], c["replica_dids"]) == (4, 1 + 17 + 65 + 257)


def test_a_never_listed_dataset_without_guesses_resolves_file_by_file(mount_fs,
                                                                     rucio_server):
    m = mount_fs("rucio:///bench/ds1000?speculate=off")
    for f in rucio_server.catalog["ds1000"][500:505]:
        assert adler32((m.path / f["name"]).read_bytes()) == f["adler32"]
    assert counters(m)["replica_requests"] == 5  # nothing known to batch with


def test_a_burst_of_1000_opens_costs_batched_replica_requests(mount_fs, rucio_server):
    m = mount_fs("rucio:///bench/ds1000?speculate=off")
    files = rucio_server.catalog["ds1000"]
    os.listdir(m.path)
    bad: list[str] = []
    work = iter(files)
    lock = threading.Lock()

    def reader() -> None:
        while True:
            with lock:
                f = next(work, None)
            if f is None:
                return
            if adler32((m.path / f["name"]).read_bytes()) != f["adler32"]:
                bad.append(f["name"])

    threads = [threading.Thread(target=reader) for _ in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad
    c = counters(m)
    assert c["replica_dids"] == 1000  # each file asked once, none twice
    assert c["replica_requests"] <= 12, c["replica_requests"]


# -- in-process: the race between a guess and the replica catalog ---------------------------

class FailingCatalog:
    """A replica catalog that answers every request with an error, after ``delay``."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.calls = 0

    async def ndjson(self, method: str, path: str, *, json: dict, what: str = ""):
        self.calls += 1
        await trio.sleep(self.delay)
        raise Unavailable("replica catalog down")
        yield  # pragma: no cover - an async generator


class SlowCatalog:
    """Answers like Rucio, but only after ``delay``."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.calls = 0
        #: When each answer began (trio's clock), once its delay was over.
        self.answered: list[float] = []

    async def ndjson(self, method: str, path: str, *, json: dict, what: str = ""):
        self.calls += 1
        await trio.sleep(self.delay)
        self.answered.append(trio.current_time())
        for did in json["dids"]:
            yield {"scope": did["scope"], "name": did["name"], "pfns": {}}


def _backend(url: str) -> RucioBackend:
    return RucioBackend.from_url(url)


def _entry(f: dict) -> Entry:
    return Entry(name=f["name"], kind=Kind.FILE, size=f["bytes"],
                 checksums={"adler32": f["adler32"], "md5": f["md5"]}, immutable=True)


def test_a_failing_replica_catalog_leaves_the_guess_to_answer(rucio_server):
    good = rucio_server.catalog["ds500"][9]
    bad = by_name(rucio_server, "guess", "bad.dat")
    results: dict[str, object] = {}

    async def main() -> None:
        backend = _backend("rucio:///bench?rses=DAV&speculate_hedge=0")
        await backend.start()
        catalog = FailingCatalog()
        backend.resolver.api = catalog  # type: ignore[assignment]
        try:
            handle = await backend.open(f"/ds500/{good['name']}", _entry(good))
            results["good"] = bytes(await backend.read(handle, 0, good["bytes"]))
            handle = await backend.open(f"/guess/{bad['name']}", _entry(bad))
            try:
                await backend.read(handle, 0, bad["bytes"])
            except Unavailable as exc:
                results["bad"] = str(exc)
        finally:
            await backend.aclose()
        results["calls"] = catalog.calls

    trio.run(main)
    assert adler32(results["good"]) == good["adler32"]  # type: ignore[arg-type]
    assert results["bad"] == "replica catalog down"
    assert results["calls"] == 2


def test_a_guess_that_wins_withdraws_its_replica_lookup(rucio_server):
    f = rucio_server.catalog["ds500"][11]
    results: dict[str, object] = {}

    async def main() -> None:
        backend = _backend("rucio:///bench?rses=DAV&speculate_hedge=0")
        await backend.start()
        backend.resolver.api = SlowCatalog(delay=5.0)  # type: ignore[assignment]
        try:
            handle = await backend.open(f"/ds500/{f['name']}", _entry(f))
            with trio.fail_after(3):  # the guess answers; the lookup is not waited for
                results["data"] = bytes(await backend.read(handle, 0, f["bytes"]))
            results["pending"] = len(backend.resolver._pending)
        finally:
            await backend.aclose()

    trio.run(main)
    assert adler32(results["data"]) == f["adler32"]  # type: ignore[arg-type]
    assert results["pending"] == 0  # nothing left queued for a caller that went away


def test_concurrent_reads_of_one_handle_wait_for_its_guess(rucio_server):
    f = rucio_server.catalog["ds500"][13]
    parts: list[bytes] = [b"", b""]
    catalog = SlowCatalog(delay=5.0)

    async def main() -> None:
        backend = _backend("rucio:///bench?rses=DAV&speculate_hedge=30s")
        await backend.start()
        backend.resolver.api = catalog  # type: ignore[assignment]
        try:
            handle = await backend.open(f"/ds500/{f['name']}", _entry(f))

            async def read(i: int) -> None:
                parts[i] = bytes(await backend.read(handle, 2048 * i, 2048))

            with trio.fail_after(3):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(read, 0)
                    nursery.start_soon(read, 1)
        finally:
            await backend.aclose()

    trio.run(main)
    assert adler32(parts[0] + parts[1]) == f["adler32"]
    assert catalog.calls == 0  # the second read took the guessed bytes, asked nothing


def test_the_computed_layout_is_the_servers(rucio_server):
    """The PFNs this mount computes for DAV are the ones the catalog lists, file by file."""
    files = rucio_server.catalog["ds500"][:50] + rucio_server.catalog["slashes"]
    answers: dict[str, set[str]] = {}

    async def main() -> None:
        backend = _backend("rucio:///bench?rses=DAV")
        await backend.start()
        try:
            body = {"dids": [{"scope": f["scope"], "name": f["name"]} for f in files],
                    "schemes": ["https", "http"]}
            async for line in backend.api.ndjson("POST", "/replicas/list", json=body):
                answers[line["name"]] = {p for p, i in line["pfns"].items()
                                         if i["rse"] == "DAV"}
            info = await backend.api.json("GET", "/rses/DAV")
            results.append(RseDescription.parse("DAV", info))
        finally:
            await backend.aclose()

    results: list[RseDescription] = []
    trio.run(main)
    (dav,) = results
    assert len(answers) == len(files)
    for f in files:
        assert dav.pfns(f["scope"], f["name"]) == answers[f["name"]], f["name"]


def test_user_and_group_scopes_become_directories():
    assert lfn2pfn_path("identity", "user.jdoe", "f.root") == "user/jdoe/f.root"
    assert lfn2pfn_path("hash", "group.phys", "x").startswith("group/phys/")
    assert lfn2pfn_path("hash", "data18", "x").count("/") == 3
    assert lfn2pfn_path("site-policy", "data18", "x") is None
    refused = RseDescription.parse("T", {"deterministic": True, "lfn2pfn_algorithm": "hash",
                                         "rse_type": "TAPE", "protocols": []})
    assert refused.refusal == "not a disk RSE" and refused.pfn("s", "n", ("https",)) is None


class HashDescriber:
    """Describes every RSE as one deterministic https RSE of the ``hash`` layout."""

    async def json(self, method: str, path: str, what: str = ""):
        return {"deterministic": True, "lfn2pfn_algorithm": "hash", "rse_type": "DISK",
                "protocols": [{"scheme": "https", "hostname": "h", "port": 443,
                               "prefix": "/p/", "domains": {"wan": {"read": 1}}}]}


def test_an_rse_whose_catalog_pfns_differ_from_the_computed_ones_is_no_longer_guessed():
    from rucio_fs.backends.rucio.settings import RucioSettings
    from rucio_fs.backends.rucio.speculation import Speculator

    settings = RucioSettings(rucio_host="http://x", auth_host="http://x", account="a",
                             auth_type="token", rses=("SITE",))
    speculator = Speculator(HashDescriber(), settings)  # type: ignore[arg-type]
    guesses: list = []

    async def main() -> None:
        guesses.append(await speculator.guesses("s", "f1"))
        speculator.observe("s", "f1", {"https://h:443/p/s/f1": {"rse": "SITE"}})  # identity
        guesses.append(await speculator.guesses("s", "f2"))

    trio.run(main)
    assert guesses[0] == [("SITE", f"https://h:443/p/{lfn2pfn_path('hash', 's', 'f1')}")]
    assert guesses[1] == []
    assert speculator.counters["speculative_layout_rejected"] == 1


def test_discovered_rses_that_hold_none_of_the_files_are_no_longer_guessed_on():
    """Blind guesses cost a GET per candidate: once the catalog has answered for three files
    and placed none at a candidate's computed PFN, first reads stop guessing there."""
    from rucio_fs.backends.rucio.settings import RucioSettings
    from rucio_fs.backends.rucio.speculation import BLIND_GIVE_UP, Speculator

    settings = RucioSettings(rucio_host="http://x", auth_host="http://x", account="a",
                             auth_type="token")
    speculator = Speculator(HashDescriber(), settings)  # type: ignore[arg-type]
    found: list = []

    async def main() -> None:
        await speculator._describe("SITE")
        speculator.layouts.candidates = ["SITE"]
        found.append(await speculator.guesses("s", "f0"))
        for i in range(BLIND_GIVE_UP):
            speculator.observe("s", f"f{i}", {f"https://tape:1/x/f{i}": {"rse": "ELSEWHERE"}})
            found.append(await speculator.guesses("s", "f9"))

    trio.run(main)
    assert [len(g) for g in found] == [1] * BLIND_GIVE_UP + [0]
    assert speculator.layouts.candidates == [] and speculator.layouts.changed


async def _two_users() -> tuple[RucioBackend, RucioBackend]:
    """Two started backends sharing their hints, as two users' of one per-user mount, of a
    catalog with too many RSEs to guess on before one is confirmed (the discovered
    candidates are cleared: layouts are learned from the catalog's answers)."""
    hints: dict = {}
    backends = _backend("rucio:///bench"), _backend("rucio:///bench")
    for backend in backends:
        backend.use_hints(hints)
        await backend.start()
    backends[0].speculator.layouts.candidates.clear()
    return backends


def test_a_read_waiting_for_its_replicas_guesses_on_a_layout_another_user_taught(rucio_server):
    """The backends of a per-user mount share what they learn of RSE layouts — where to look,
    never what is there. User b's first read, waiting for its own (slow) replica lookup,
    starts its guess once user a's answer shows where the files lie, and serves the bytes
    only because they match b's own catalog entry: with another checksum in b's entry the
    same copy is refused and b gets its own catalog's answer."""
    taught, waiting, distrusted = rucio_server.catalog["ds500"][15:18]
    results: dict[str, object] = {}
    slow = SlowCatalog(delay=3.0)

    async def main() -> None:
        a, b = await _two_users()
        b.resolver.api = slow  # type: ignore[assignment]
        try:
            handle = await b.open(f"/ds500/{waiting['name']}", _entry(waiting))
            wrong = {**_entry(distrusted).checksums, "adler32": "00000001"}
            refused = await b.open(f"/ds500/{distrusted['name']}",
                                   Entry(name=distrusted["name"], kind=Kind.FILE,
                                         size=distrusted["bytes"], checksums=wrong))

            async def read_b() -> None:
                results["b"] = bytes(await b.read(handle, 0, waiting["bytes"]))
                results["b_at"] = trio.current_time()

            async def read_refused() -> None:
                try:
                    await b.read(refused, 0, distrusted["bytes"])
                except Unavailable as exc:
                    results["refused"] = str(exc)

            with trio.fail_after(8):
                async with trio.open_nursery() as nursery:
                    results["b_started"] = trio.current_time()
                    nursery.start_soon(read_b)
                    nursery.start_soon(read_refused)
                    await trio.sleep(0.3)
                    results["b_before_a"] = "b" in results  # nothing to guess on yet
                    start = trio.current_time()
                    handle_a = await a.open(f"/ds500/{taught['name']}", _entry(taught))
                    results["a"] = bytes(await a.read(handle_a, 0, taught["bytes"]))
                    results["a_at"] = trio.current_time()
                    results["start"] = start
        finally:
            for backend in (a, b):
                await backend.aclose()
        results["a_counters"] = dict(a.speculator.counters)
        results["b_counters"] = dict(b.speculator.counters)

    trio.run(main)
    assert results["b_before_a"] is False
    assert adler32(results["a"]) == taught["adler32"]  # type: ignore[arg-type]
    assert adler32(results["b"]) == waiting["adler32"]  # type: ignore[arg-type]
    # b was served by its guess, taught by a's answer, before its own lookup answered (a
    # waited up to LESSON_WAIT for b's lookup, the first since the start, then asked); that
    # lookup did answer (b's refused read waited for it).
    assert slow.answered
    assert all(results["b_at"] < answered for answered in slow.answered)  # type: ignore[operator]
    assert "no available replica" in str(results["refused"])  # b's own (empty) answer
    b_counters = results["b_counters"]
    assert b_counters["speculative_late"] == 2  # type: ignore[index]
    assert b_counters["speculative_hits"] == 1  # type: ignore[index]
    assert b_counters["speculative_mismatches"] == 1  # type: ignore[index]
    assert results["a_counters"].get("speculative_reads", 0) == 0  # type: ignore[union-attr]


class DelayedCatalog:
    """The real replica catalog, answering only after ``delay`` (and counting requests)."""

    def __init__(self, api, delay: float) -> None:
        self.api = api
        self.delay = delay
        self.calls = 0

    async def ndjson(self, method: str, path: str, **kwargs):
        self.calls += 1
        await trio.sleep(self.delay)
        async for line in self.api.ndjson(method, path, **kwargs):
            yield line


def test_first_reads_wait_for_the_first_lookup_since_a_drop_and_then_guess(rucio_server):
    """Right after a drop nothing is known of layouts: the first read asks the replica
    catalog, and first reads arriving meanwhile (here another user's, sharing layouts) wait
    for that answer rather than send lookups of their own beside it — then guess, and ask
    nothing."""
    first, second = rucio_server.catalog["ds500"][20:22]
    results: dict[str, object] = {}

    async def main() -> None:
        a, b = await _two_users()
        a.resolver.api = DelayedCatalog(a.resolver.api, 0.5)  # type: ignore[assignment]
        b.resolver.api = catalog_b = DelayedCatalog(b.resolver.api, 0)  # type: ignore[assignment]
        try:
            for backend in (a, b):
                backend.drop_caches()
            handle_a = await a.open(f"/ds500/{first['name']}", _entry(first))
            handle_b = await b.open(f"/ds500/{second['name']}", _entry(second))

            async def read(name: str, backend: RucioBackend, handle, f: dict) -> None:
                results[name] = bytes(await backend.read(handle, 0, f["bytes"]))
                results[f"{name}_at"] = trio.current_time()

            with trio.fail_after(10):
                async with trio.open_nursery() as nursery:
                    start = trio.current_time()
                    nursery.start_soon(read, "a", a, handle_a, first)
                    await trio.sleep(0.1)
                    nursery.start_soon(read, "b", b, handle_b, second)
            results["start"] = start
        finally:
            for backend in (a, b):
                await backend.aclose()
        results["b_catalog_calls"] = catalog_b.calls
        results["b_counters"] = dict(b.speculator.counters)

    trio.run(main)
    assert adler32(results["a"]) == first["adler32"]  # type: ignore[arg-type]
    assert adler32(results["b"]) == second["adler32"]  # type: ignore[arg-type]
    assert results["b_at"] - results["start"] >= 0.5  # type: ignore[operator]
    assert results["b_catalog_calls"] == 0
    b_counters = results["b_counters"]
    assert b_counters["speculative_waited"] == 1 and b_counters["speculative_hits"] == 1  # type: ignore[index]
