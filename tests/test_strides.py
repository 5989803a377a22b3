"""Strided read-ahead (:mod:`rucio_fs.data.strides`), in-process.

The promises: a reader thread whose spans repeat with a period of up to four is told its next
spans exactly (and a one-off shift costs one miss, not the pattern); nearly contiguous reads
are no pattern. Through :class:`~rucio_fs.data.datapath.DataPath`, whatever the pieces fetched
ahead do -- fail, arrive late, arrive after their reader asked -- every read returns the bytes
of the file at its offset, and a clean strided pass fetches each byte about once.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from rucio_fs.backend import Entry, Kind
from rucio_fs.cache.accounting import BackendCalls
from rucio_fs.config import MountConfig
from rucio_fs.data import strides
from rucio_fs.data.datapath import DataPath
from rucio_fs.data.strides import HandleUsers, PieceStore, find_pattern
from rucio_fs.errors import Unavailable
from rucio_fs.observe.stats import Stats

periodic = st.integers(1, strides.MAX_PERIOD).flatmap(lambda period: st.tuples(
    st.lists(st.integers(1, 50_000), min_size=period, max_size=period),  # lengths
    st.lists(st.integers(0, 200_000), min_size=period, max_size=period),  # holes after them
    st.integers(0, 10**9)))  # where the first span starts


def spans_of(lengths: list[int], holes: list[int], first: int, count: int) -> list[tuple[int, int]]:
    spans, start = [], first
    for i in range(count):
        length = lengths[i % len(lengths)]
        spans.append((start, start + length))
        start += length + holes[i % len(holes)]
    return spans


@given(periodic)
def test_a_repeating_pattern_is_told_its_next_spans(pattern):
    lengths, holes, first = pattern
    period = len(lengths)
    # A cycle that skips less than a page is nearly contiguous: not a pattern.
    if sum(holes) < strides.PAGE + sum(lengths) // 8:
        return
    spans = spans_of(lengths, holes, first, 3 * period + 4 + period)
    seen = spans[:3 * period + 4]
    found = find_pattern(seen)
    assert found is not None
    predicted = found.following(seen, period)
    # The period found may be a multiple of the true one, or a shorter one within the
    # tolerance of an eighth of a span: each span told holds the true one, and not much more.
    for (start, end), (low, high) in zip(spans[3 * period + 4:], predicted, strict=True):
        assert low <= start and end <= high, (found, predicted)
        assert high - low <= 1.25 * (end - start) + 2 * found.slack + 1, (found, predicted)


@pytest.mark.parametrize("shift", [60_000, 23_000], ids=["outvoted", "within-tolerance"])
def test_a_one_off_shift_costs_one_miss_not_the_pattern(shift):
    """A columnar file's baskets of two branches, with metadata written once in between: a
    shift beyond the tolerance is outvoted (the next spans are told exactly); one within it
    widens the spans told until it is forgotten."""
    spans = spans_of([400_000, 200_000], [2_000_000, 400_000], 1000, 6)
    shifted = [(s + shift, e + shift) for s, e in spans_of(
        [400_000, 200_000], [2_000_000, 400_000], spans[-1][1] + 400_000, 6)]
    seen = spans + shifted[:1]  # the first span after the shift was a miss
    found = find_pattern(seen)
    assert found is not None
    told = found.following(seen, 4)
    if shift > 200_000 // 8:
        assert told == shifted[1:5]
    for (start, end), (low, high) in zip(shifted[1:5], told, strict=True):
        assert low <= start and end <= high and high - low <= end - start + 2 * shift


def test_contiguous_reads_are_no_pattern():
    spans = [(i * 4096, (i + 1) * 4096) for i in range(12)]
    assert find_pattern(spans) is None
    assert find_pattern([(0, 100), (150, 250), (300, 400), (450, 550)]) is None


def test_no_prediction_fetches_what_a_reader_read_in_this_pass():
    store = PieceStore(1 << 20, Stats())
    key = ("f", "v1")
    store.note_read(key, 1000, 2000)
    assert store.claim(key, 1500, 3000) == []
    assert store.claim(("f", "v2"), 1500, 3000) != []  # another content: another pass


def test_a_claim_asks_only_for_what_no_piece_brings():
    store = PieceStore(1 << 20, Stats())
    key = ("f", "v")
    [first] = store.claim(key, 0, 100_000)
    pieces = store.claim(key, 50_000, 200_000)
    assert [(p.start, p.end) for p in pieces] == [(100_000, 200_000)]
    # A sliver beside pieces already asked for is not worth a request.
    assert store.claim(key, 190_000, 200_000 + strides.MIN_GAP - 1) == []
    assert store.cover(key, 10, 150_000) == [first, pieces[0]]
    assert store.cover(key, 10, 250_000) is None


def test_a_piece_waiting_for_its_reader_is_not_dropped_for_one_further_ahead():
    store = PieceStore(300_000, Stats())
    key = ("f", "v")
    a, b = store.claim(key, 0, 100_000)[0], store.claim(key, 200_000, 300_000)[0]
    store.arrived(key, a, b"a" * 100_000)
    store.arrived(key, b, b"b" * 100_000)
    assert store.claim(key, 400_000, 600_000) == []  # no room: both wait for their reader
    store.took(a)
    [c] = store.claim(key, 400_000, 600_000)  # a was read: it makes room
    assert store.cover(key, 0, 10) is None and store.cover(key, 200_000, 200_010) == [b]
    assert c.start == 400_000


def test_closing_a_handle_waits_for_the_fetches_that_use_it():
    async def main() -> None:
        users, closed = HandleUsers(), []
        handle = object()

        async def closer() -> None:
            closed.append(handle)

        users.take(handle)
        users.take(handle)
        await users.close(handle, closer)
        await users.give(handle)
        assert closed == []
        await users.give(handle)
        assert closed == [handle]
        await users.close(object(), closer)  # unused: closed at once
        assert len(closed) == 2

    trio.run(main)


FILE = bytes(random.Random(7).randbytes(3_000_000))


@settings(max_examples=25, deadline=None)
@given(pattern=st.tuples(st.lists(st.integers(1_000, 40_000), min_size=1, max_size=3),
                         st.lists(st.integers(1, 90_000), min_size=1, max_size=3)),
       readers=st.integers(1, 3), failing=st.sets(st.integers(0, 60), max_size=20),
       late=st.sets(st.integers(0, 60), max_size=20))
def test_every_read_returns_the_file_whatever_the_pieces_do(pattern, readers, failing, late):
    """Reader threads each read a strided run of the file, one handle per span (uproot through
    fsspec); the n-th piece fetched ahead fails when n is in ``failing`` and answers after a
    pause when in ``late``. Every read returns the file's bytes; a pass with no failure fetches
    at most 1.2 times the bytes read (plus one page per span and the last predictions)."""
    lengths, holes = pattern
    holes = holes[:len(lengths)] + [holes[0]] * (len(lengths) - len(holes))
    stats = Stats()
    calls = BackendCalls(stats, timeout=30, coalescing=True)
    fetched = Counter()

    async def fetch(handle, offset, size):
        fetched["bytes"] += size
        return FILE[offset:offset + size]

    config = MountConfig(block_size=1 << 20, memory_limit=64 << 20)
    entry = Entry(name="f", kind=Kind.FILE, size=len(FILE), version="e1")
    read_bytes = Counter()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            data_path = DataPath(config, stats, calls, fetch)
            plain = data_path.fetch_piece
            pieces = Counter()

            async def piece(handle, offset, size):
                n = pieces["n"]
                pieces["n"] += 1
                if n in late:
                    await trio.sleep(0.01)
                if n in failing:
                    raise Unavailable("injected")
                return await plain(handle, offset, size)

            data_path.fetch_piece = piece

            async def reader(thread: int) -> None:
                first = thread * len(FILE) // readers
                limit = (thread + 1) * len(FILE) // readers
                for start, end in spans_of(lengths, holes, first, 40):
                    end = min(end, len(FILE))
                    if start >= limit or start >= end:
                        break
                    stream = data_path.stream("/f", entry, object(), nursery, reader=thread)
                    data = await stream.read(start, end - start)
                    assert bytes(data) == FILE[start:end], (start, end)
                    read_bytes["bytes"] += end - start
                    await stream.close()

            async with trio.open_nursery() as readers_nursery:
                for thread in range(readers):
                    readers_nursery.start_soon(reader, thread)
            nursery.cancel_scope.cancel()

    trio.run(main)
    if not failing:
        spans = 40 * readers
        slack = spans * strides.PAGE + readers * strides.MAX_AHEAD * (max(lengths)
                                                                     + strides.PAGE)
        assert fetched["bytes"] <= 1.2 * read_bytes["bytes"] + slack


@pytest.mark.parametrize("pieces_fail", [False, True], ids=["clean", "every-piece-fails"])
def test_a_strided_pass_is_served_ahead(pieces_fail):
    """Two branches' baskets of a cluster, 20 clusters: after the first few spans, the reader
    finds each span fetched before it asked; when every piece fails, it reads them itself."""
    stats = Stats()
    calls = BackendCalls(stats, timeout=30, coalescing=True)
    failed = Counter()

    async def fetch(handle, offset, size):
        await trio.sleep(0.005)  # a round trip
        return FILE[offset:offset + size]

    entry = Entry(name="f", kind=Kind.FILE, size=len(FILE), version="e1")

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            data_path = DataPath(MountConfig(memory_limit=64 << 20), stats, calls, fetch)
            if pieces_fail:
                async def broken(handle, offset, size):
                    failed["pieces"] += 1
                    raise Unavailable("injected")

                data_path.fetch_piece = broken
            for start, end in spans_of([40_000, 20_000], [60_000, 30_000], 1000, 40):
                stream = data_path.stream("/f", entry, object(), nursery, reader=1)
                assert bytes(await stream.read(start, end - start)) == FILE[start:end]
                await stream.close()
            nursery.cancel_scope.cancel()

    trio.run(main)
    if pieces_fail:
        assert failed["pieces"] >= 30 and not stats.events["stride_served_reads"], stats.events
    else:
        assert stats.events["stride_served_reads"] >= 34, stats.events
        assert stats.events["stride_misses"] == 0, stats.events


def test_a_header_read_brings_what_the_reader_asks_next():
    """uproot through fsspec opens the file for each read: the header (a page at offset 0),
    then the top directory right after it, through another handle. The header's read fetches
    ``HEAD_PIECE`` bytes, so the second read costs no request."""
    from rucio_fs.data.datapath import HEAD_PIECE

    stats = Stats()
    calls = BackendCalls(stats, timeout=30, coalescing=True)
    requests = []

    async def fetch(handle, offset, size):
        requests.append((offset, size))
        return FILE[offset:offset + size]

    entry = Entry(name="f", kind=Kind.FILE, size=len(FILE), version="e1")

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            data_path = DataPath(MountConfig(memory_limit=64 << 20), stats, calls, fetch)
            for start, size in ((0, 4096), (1306, 4096)):
                stream = data_path.stream("/f", entry, object(), nursery, direct=True,
                                          reader=1)
                assert bytes(await stream.read(start, size)) == FILE[start:start + size]
                await stream.close()
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert requests == [(0, HEAD_PIECE)]
