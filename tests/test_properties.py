"""Property tests of the bookkeeping that a kernel mount exercises only partly: the inode table's
lookup counts, the cache layers' accounting and bounds, histograms, parsing, single-flight."""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rucio_fs.backend import Entry, Kind
from rucio_fs.cache.caches import CacheLayer, Listing, byte_cache, ttl_cache
from rucio_fs.cache.singleflight import SingleFlight
from rucio_fs.errors import InvalidInput, Unavailable
from rucio_fs.fuse.inodes import ROOT_INO, InodeTable
from rucio_fs.observe.stats import N_BINS, Log2Histogram, Stats, quantile
from rucio_fs.options import parse_duration, parse_size

NAMES = st.sampled_from(["a", "b", "c", "d"])
KINDS = st.sampled_from([Kind.FILE, Kind.DIR])


class InodeTableMachine(RuleBasedStateMachine):
    """The kernel's view (a lookup count per inode number) against the table's."""

    def __init__(self) -> None:
        super().__init__()
        self.table = InodeTable(Entry(name="", kind=Kind.DIR))
        self.kernel: Counter[int] = Counter()  # what the kernel holds, by inode number
        self.seen: dict[int, str] = {ROOT_INO: "/"}

    def _dirs(self) -> list[int]:
        return [ROOT_INO] + [ino for ino in self.kernel
                             if self.table.get(ino) and self.table[ino].entry.is_dir]

    @rule(data=st.data(), name=NAMES, kind=KINDS)
    def lookup(self, data: st.DataObject, name: str, kind: Kind) -> None:
        parent = self.table[data.draw(st.sampled_from(self._dirs()))]
        inode = self.table.lookup(parent, name, Entry(name=name, kind=kind), now=0.0)
        assert self.seen.setdefault(inode.ino, inode.path) == inode.path  # numbers never reused
        assert inode.path == ("/" if parent.path == "/" else parent.path + "/") + name
        self.kernel[inode.ino] += 1

    @precondition(lambda self: self.kernel)
    @rule(data=st.data())
    def forget(self, data: st.DataObject) -> None:
        # The kernel forgets children before their parents (a dentry pins its parent).
        leaves = [ino for ino in self.kernel
                  if not any(self.table.get(c) and self.table[c].parent == ino and c != ino
                             for c in self.kernel)]
        ino = data.draw(st.sampled_from(sorted(leaves)))
        count = data.draw(st.integers(1, self.kernel[ino]))
        self.table.forget(ino, count)
        self.kernel[ino] -= count
        if not self.kernel[ino]:
            del self.kernel[ino]

    @invariant()
    def counts_agree(self) -> None:
        assert self.table[ROOT_INO].path == "/"
        assert len(self.table) == 1 + len(self.kernel)
        for ino, count in self.kernel.items():
            assert self.table[ino].lookups == count
        for inode in self.table:
            # A name points at a live inode of that name; a replaced one lives on detached.
            for name, child in inode.children.items():
                assert self.table.get(child.ino) is child
                assert child.name == name and child.parent == inode.ino


TestInodeTable = InodeTableMachine.TestCase
TestInodeTable.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


@given(st.lists(st.tuples(st.integers(0, 20), st.binary(max_size=40)), max_size=60),
       st.integers(1, 200), st.booleans())
def test_byte_cache_respects_budget_and_counts(ops, budget, enabled):
    stats = Stats()
    layer: CacheLayer[bytes] = CacheLayer("data", enabled, byte_cache(budget), stats)
    gets = 0
    for key, value in ops:
        if layer.get(key) is None:
            layer.put(key, value or b"x")
        gets += 1
        assert layer.currsize <= budget
        if not enabled:
            assert len(layer) == 0
    counters = stats.cache["data"]
    assert counters["hits"] + counters["misses"] == gets
    assert counters["enabled"] == int(enabled)


def test_ttl_cache_expires_per_item():
    now = [0.0]
    cache = ttl_cache(10, lambda ttl: ttl, timer=lambda: now[0])
    layer: CacheLayer[float] = CacheLayer("metadata", True, cache, Stats())
    layer.put("short", 1.0)
    layer.put("long", 100.0)
    assert layer.get("short") == 1.0
    now[0] = 50.0
    assert layer.get("short") is None and layer.get("long") == 100.0


@given(st.lists(st.integers(0, 2**45), min_size=1, max_size=200))
def test_histogram_bins_and_quantiles(values):
    hist = Log2Histogram()
    for v in values:
        hist.add(v)
    data = hist.as_dict()
    assert len(data["bins"]) == N_BINS and sum(data["bins"]) == len(values)
    assert data["max_ns"] == max(values) and data["total_ns"] == sum(values)
    p50, p99 = quantile(data, 0.5), quantile(data, 0.99)
    assert 0 <= p50 <= p99 <= max(values) + 1
    ordered = sorted(values)
    median = ordered[(len(ordered) - 1) // 2]
    assert p50 <= max(2 * median + 1, 1) or median >= 2**39  # right power-of-two bin


@given(st.lists(st.text(min_size=0, max_size=4), max_size=30))
def test_listing_keeps_only_posix_names(names):
    listing = Listing([Entry(name=n, kind=Kind.FILE) for n in names])
    kept = [e.name for e in listing.entries]
    assert len(kept) == len(set(kept))
    assert all(n and n not in (".", "..") and "/" not in n and "\0" not in n for n in kept)
    assert len(kept) + listing.rejected == len(names)
    assert listing.names == [n.encode("utf-8", "surrogateescape") for n in kept]


@pytest.mark.parametrize(("text", "seconds"), [
    ("0", 0.0), ("1.5", 1.5), ("20ms", 0.02), ("5m", 300.0), ("2h", 7200.0), ("250us", 250e-6)])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(("text", "size"), [
    ("4096", 4096), ("64K", 65536), ("256M", 256 << 20), ("256MiB", 256 << 20), ("2G", 2 << 30)])
def test_parse_size(text, size):
    assert parse_size(text) == size


@given(st.text(alphabet="abcxyz!-. ", max_size=6))
def test_parse_rejects_garbage(text):
    with pytest.raises(InvalidInput):
        parse_duration(text + "q")
    with pytest.raises(InvalidInput):
        parse_size(text + "q")


@given(st.integers(1, 30), st.booleans(), st.booleans())
def test_single_flight_shares_one_call(callers, enabled, fail):
    counter: Counter[str] = Counter()
    flight = SingleFlight(enabled, counter)
    calls = []
    results: list[object] = []

    async def backend_call() -> int:
        calls.append(1)
        await trio.sleep(0.01)
        if fail:
            raise Unavailable("down")
        return 42

    async def caller() -> None:
        try:
            results.append(await flight.run(("list", "/x"), backend_call))
        except Unavailable as exc:
            results.append(exc)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(callers):
                nursery.start_soon(caller)

    trio.run(main)
    assert len(calls) == (1 if enabled else callers)
    assert counter["list"] == (callers - 1 if enabled else 0)
    assert len(results) == callers
    assert all(isinstance(r, Unavailable) if fail else r == 42 for r in results)


@given(st.binary(min_size=2, max_size=3000), st.data(), st.booleans())
def test_stream_verifier_any_read_order(content, data, corrupt):
    import zlib

    from rucio_fs.data.integrity import verifier_for
    from rucio_fs.errors import IntegrityError

    expected = f"{zlib.adler32(content):08x}"
    served = bytearray(content)
    if corrupt:
        served[data.draw(st.integers(0, len(content) - 1))] ^= 0xFF
    cuts = sorted(set(data.draw(st.lists(st.integers(1, len(content) - 1), max_size=8))))
    bounds = zip([0, *cuts], [*cuts, len(content)], strict=True)
    chunks = [(a, bytes(served[a:b])) for a, b in bounds]
    chunks += data.draw(st.lists(st.sampled_from(chunks), max_size=3))  # kernel re-reads
    order = data.draw(st.permutations(chunks))
    verifier = verifier_for("/f", len(content), {"adler32": expected, "md5": "ignored"})
    assert verifier is not None and verifier.algorithm == "adler32"
    raised = False

    async def read_all() -> None:
        nonlocal raised
        async with trio.open_nursery() as nursery:
            nursery.start_soon(verifier.run)
            for offset, chunk in order:
                try:
                    await verifier.feed(offset, chunk)
                except IntegrityError:
                    raised = True
            await verifier.close()

    trio.run(read_all)
    assert verifier.state == ("mismatch" if corrupt else "verified")
    assert raised == corrupt


def _s3_page(prefix: str, items: list[tuple[str, bool]]) -> bytes:
    """A ListObjectsV2 page body for (name, is_prefix) items, as S3 would send it."""
    contents = "".join(f"<Contents><Key>{prefix}{n}</Key><Size>1</Size>"
                       f"<LastModified>2026-01-01T00:00:00.000Z</LastModified>"
                       f"<ETag>&quot;e&quot;</ETag></Contents>" for n, d in items if not d)
    prefixes = "".join(f"<CommonPrefixes><Prefix>{prefix}{n}/</Prefix></CommonPrefixes>"
                       for n, d in items if d)
    return (f'<?xml version="1.0"?><ListBucketResult><Prefix>{prefix}</Prefix>{contents}'
            f"{prefixes}</ListBucketResult>").encode()


@given(names=st.lists(st.tuples(st.text("k-.a", min_size=1, max_size=3), st.booleans()),
                      max_size=20, unique=True),
       cuts=st.lists(st.integers(0, 20), max_size=4))
def test_s3_listing_pages_fold_to_the_whole_listing_rule(names, cuts):
    """However a sorted listing is cut into pages, the entries given out are the same: every
    directory, and every file not shadowed by a directory of the same name."""
    from rucio_fs.backends.s3.pages import PageFolder

    from rucio_fs.backend import Entry, Kind

    items = sorted({(n, d) for n, d in names},
                   key=lambda item: item[0] + ("/" if item[1] else ""))
    dirs = {n for n, d in items if d and n not in (".", "..")}
    files = {n for n, d in items if not d and n not in (".", "..")} - dirs
    # Every single cut, and the drawn set of cuts together.
    for chosen in [*([c] for c in range(len(items) + 1)), cuts]:
        bounds = sorted({min(c, len(items)) for c in chosen} | {0, len(items)})
        pages = [items[a:b] for a, b in itertools.pairwise(bounds)] or [[]]
        folder = PageFolder("p/", lambda name, item: Entry(name=name, kind=Kind.FILE),
                             Entry(name="", kind=Kind.DIR))
        out: list[Entry] = []
        for i, page in enumerate(pages):
            out.extend(folder.fold(_s3_page("p/", page), last=i == len(pages) - 1))
        assert sorted(e.name for e in out if e.is_dir) == sorted(dirs)
        assert sorted(e.name for e in out if not e.is_dir) == sorted(files)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=6, unique=True), st.integers(0, 5))
def test_a_group_flight_never_takes_over_a_flight_already_under_way(group, single):
    """A read-ahead group covering a block a reader is already fetching: both finish, each
    caller gets its own key's value, and no flight is left behind (it was a KeyError)."""
    flight = SingleFlight(True, Counter())
    results: dict[str, object] = {}

    async def one() -> None:
        async def fetch() -> str:
            await trio.sleep(0.03)  # still under way when the group's call has finished
            return f"single-{single}"
        results["single"] = await flight.run(("read", single), fetch)

    async def many() -> None:
        async def fetch() -> list[str]:
            await trio.sleep(0.01)
            return [f"group-{k}" for k in group]
        results["group"] = await flight.run_group([("read", k) for k in group], fetch)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(one)
            await trio.sleep(0.001)
            nursery.start_soon(many)

    trio.run(main)
    assert results["single"] == f"single-{single}"
    assert results["group"] == [f"group-{k}" for k in group]
    assert not any(flight.in_flight(("read", k)) for k in range(6))


PATHS = st.sampled_from(["/a", "/b", "/a/x", "/a/y", "/a/x/z", "/b/x"])


@settings(max_examples=200)
@given(st.lists(st.tuples(st.sampled_from(["set", "del", "pop", "clear"]), PATHS),
                max_size=30))
def test_write_back_files_by_directory_match_a_scan(steps):
    """The write-back's per-directory index of local files says what a scan of every path
    says, after any sequence of adds, removals and clears."""
    from rucio_fs.write.writeback import FilesByPath

    files, plain = FilesByPath(), {}
    for i, (op, path) in enumerate(steps):
        if op == "set":
            files[path] = plain[path] = i  # type: ignore[assignment]
        elif op == "del" and path in plain:
            del files[path], plain[path]
        elif op == "pop":
            assert files.pop(path, None) == plain.pop(path, None)
        elif op == "clear":
            files.clear(), plain.clear()
        for directory in ("/", "/a", "/b", "/a/x"):
            prefix = directory.rstrip("/") + "/"
            scan = sorted(v for p, v in plain.items()
                          if p.startswith(prefix) and "/" not in p[len(prefix):])
            assert sorted(files.in_directory(directory)) == scan  # type: ignore[type-var]
    assert dict(files) == plain


@given(st.builds(Entry, name=st.text(min_size=1), kind=st.sampled_from(Kind),
                 size=st.integers(0, 2**64), mtime_ns=st.integers(0, 2**63),
                 checksums=st.dictionaries(st.text(), st.text(), max_size=2),
                 immutable=st.booleans(), version=st.text(),
                 metadata=st.dictionaries(st.text(), st.text(), max_size=2),
                 mode=st.none() | st.integers(0, 0o7777), uid=st.none() | st.integers(0, 2**32),
                 gid=st.none() | st.integers(0, 2**32), complete=st.booleans()),
       st.integers(0, 2**63))
def test_an_entry_at_another_time_is_the_entry_with_that_time_and_nothing_else(entry, when):
    """``Entry.at_time`` (built by hand for speed) keeps every other field, also one added
    to ``Entry`` later."""
    assert entry.at_time(when) == dataclasses.replace(entry, mtime_ns=when)
