"""Read-ahead of strided reads: where a reader that jumps in a repeating pattern reads next.

A columnar reader (uproot, ROOT) taking some branches of a tree reads, per cluster of
entries, one basket of each branch it wants and jumps over the others: from one reader
thread the reads form *spans* (runs of contiguous reads) whose starts repeat with a period
(the number of branches read) and a stride (the size of a cluster on disk). Such a reader
asks for one span at a time and waits for it, so without help each span costs a round trip.

:func:`find_pattern` recognises the repetition in a thread's recent spans; :class:`StrideReader`
then fetches the next predicted spans (*pieces*) before the thread asks for them, as many
ahead as its predictions have been right. Pieces live in a :class:`PieceStore` of the mount,
any reader of the same content may take them, and they count against their own share of the
memory limit. Nothing is fetched twice in one pass: a predicted piece that another reader
already read, or that is already held, is skipped.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import trio
from cachetools import TTLCache

from rucio_fs.background import start_guarded
from rucio_fs.errors import RucioFsError
from rucio_fs.observe.stats import Stats

log = logging.getLogger(__name__)

#: Spans remembered per reader thread and file.
HISTORY = 12
#: The longest period looked for (branches read at once by one thread).
MAX_PERIOD = 4
#: Pieces fetched ahead after a first prediction, and at most after predictions held.
FIRST_AHEAD, MAX_AHEAD = 2, 8
#: A reader's page: a buffered reader may read this much past a span it was given.
PAGE = 4096
#: Intervals remembered as read per file (beyond this the record starts over).
READ_INTERVALS = 1024
#: Contents whose reads are remembered, and for how long after their last read.
READ_FILES, PASS_IDLE = 256, 5.0
#: The shortest part of a predicted span fetched beside pieces already asked for.
MIN_GAP = 16 << 10
#: Seconds after which a piece no reader took may make room for another.
UNUSED_FOR = 2.0

Span = tuple[int, int]  # [start, end)


@dataclass(frozen=True, slots=True)
class Pattern:
    """The next spans: each ``deltas[i % period]`` bytes after the one before and
    ``lengths[i % period]`` long, within ``slack``."""

    deltas: tuple[int, ...]
    lengths: tuple[int, ...]
    slack: int

    @property
    def period(self) -> int:
        return len(self.deltas)

    def following(self, spans: Sequence[Span], count: int) -> list[Span]:
        """The ``count`` spans predicted after ``spans`` (each widened by the slack)."""
        start = spans[-1][0]
        out: list[Span] = []
        for i in range(count):
            start += self.deltas[i % self.period]
            out.append((start - self.slack, start + self.lengths[i % self.period] + self.slack))
        return out


def _agreed(seen: list[int], allowed: int) -> tuple[int, int, int, int] | None:
    """What ``seen`` (newest first, one to three values) agree on within ``allowed``: the
    value to expect, the largest agreeing one, their difference, and how many values disagree; None
    when none agree. Of three, two agreeing outvote the third (a one-off shift, such as
    metadata written between two clusters, does not end a pattern)."""
    if len(seen) == 1:
        return seen[0], seen[0], 0, 0
    for a, b in ((0, 1), (1, 2), (0, 2))[:1 if len(seen) == 2 else 3]:
        if abs(seen[a] - seen[b]) <= allowed:
            outvoted = sum(abs(v - seen[a]) > allowed for v in seen)
            # Of three, the median: the value a one-off shift or jitter moves least.
            value = sorted(seen)[1] if len(seen) == 3 else seen[a]
            return value, max(seen[a], seen[b]), abs(seen[a] - seen[b]), outvoted
    return None


def find_pattern(spans: Sequence[Span]) -> Pattern | None:
    """The period that best explains the last spans, or None.

    The gap from one span's start to the next and the spans' lengths repeat every
    ``period`` spans; each phase is judged by its last three repetitions (at least
    ``period + 1`` gaps in all, so one phase at least is seen twice); the newest span's length
    counts only where nothing else tells its phase's (its reader may read on). Deviations up to an
    eighth of the shortest span are allowed (compressed baskets vary): a phase's longest
    agreeing length is predicted, and the largest deviation of a gap becomes the pattern's
    slack, by which predictions are widened on both sides. Of the periods whose every
    phase agrees, the one with the fewest outvoted values wins (a phase seen once counts
    half: it is unconfirmed), then the shortest. A cycle must skip a page at least: nearly
    contiguous reads are the sequential read-ahead's business.
    """
    starts = [start for start, _ in spans]
    lengths = [end - start for start, end in spans]
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    best: tuple[float, Pattern] | None = None
    for period in range(1, MAX_PERIOD + 1):
        if len(gaps) < period + 1:
            break
        shortest = min(lengths[-period:])
        allowed = shortest // 8
        deltas, sizes, slack, doubt = [], [], 0, 0.0
        for phase in range(period):
            # Gap i leads to span i + 1; newest first.
            indices = list(range(len(gaps) - period + phase, -1, -period))[:3]
            gap = _agreed([gaps[i] for i in indices], allowed)
            # The newest span may still grow (its reader reads on): its length is a guess.
            sizes_seen = [lengths[i + 1] for i in indices if i + 1 < len(lengths) - 1]
            size = _agreed(sizes_seen or [lengths[-1]], allowed)
            if gap is None or size is None:
                break
            deltas.append(gap[0])
            sizes.append(size[1])  # the longest: a span that varies in length varies at its end
            slack = max(slack, gap[2])
            doubt += gap[3] + size[3] + (0.5 if len(indices) == 1 else 0.0)
        else:
            skipped = abs(sum(deltas)) - sum(sizes)
            if skipped >= PAGE and (best is None or doubt < best[0]):
                best = (doubt, Pattern(tuple(deltas), tuple(sizes), slack))
    return None if best is None else best[1]


@dataclass(eq=False, slots=True)
class Piece:
    """A predicted range of one content: on its way until ``ready`` is set; then ``data`` holds
    its bytes, or None when the fetch failed."""

    start: int
    end: int
    ready: trio.Event = field(default_factory=trio.Event)
    data: bytes | memoryview | None = None
    #: When it arrived, and when a read last took from it (None: not yet).
    arrived_at: float = 0.0
    used_at: float | None = None

    def covers(self, start: int, end: int) -> bool:
        return self.start <= start and end <= self.end


class _Intervals:
    """Disjoint, sorted ranges of one content read in the current pass (a bounded record:
    beyond :data:`READ_INTERVALS` it starts over)."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []

    def add(self, start: int, end: int) -> None:
        lo = hi = bisect.bisect_left(self.starts, start)
        if lo and self.ends[lo - 1] >= start:
            lo -= 1
        while hi < len(self.starts) and self.starts[hi] <= end:
            hi += 1
        if lo < hi:
            start, end = min(start, self.starts[lo]), max(end, self.ends[hi - 1])
        self.starts[lo:hi], self.ends[lo:hi] = [start], [end]
        if len(self.starts) > READ_INTERVALS:
            self.starts, self.ends = [start], [end]

    def overlaps(self, start: int, end: int) -> bool:
        # Ranges are disjoint and sorted, so the last one starting before ``end`` ends last.
        i = bisect.bisect_left(self.starts, end)
        return i > 0 and self.ends[i - 1] > start


class PieceStore:
    """Predicted pieces of every content the mount reads, within ``max_bytes`` in all (on
    their way or held). Room for new pieces is made by dropping held pieces a reader took from
    (longest unused first), then pieces no reader took within :data:`UNUSED_FOR` seconds of
    their arrival (a wrong prediction); a piece waiting for its reader is never dropped for a
    prediction further ahead."""

    def __init__(self, max_bytes: int, stats: Stats) -> None:
        self.max_bytes = max_bytes
        self.stats = stats
        self.used = 0
        self._pieces: dict[tuple[str, str], list[Piece]] = {}
        #: What was read of each content in the current pass: a pass ends when the content
        #: has not been read for :data:`PASS_IDLE` seconds.
        self._read: TTLCache[tuple[str, str], _Intervals] = TTLCache(READ_FILES, PASS_IDLE)
        self._held: list[tuple[tuple[str, str], Piece]] = []

    def cover(self, key: tuple[str, str], start: int, end: int) -> list[Piece] | None:
        """Pieces of content ``key`` (path, version) that together cover ``[start, end)``, in
        order, or None."""
        used, at = [], start
        for piece in sorted(self._pieces.get(key, ()), key=lambda p: p.start):
            if piece.end <= at:
                continue
            if piece.start > at:
                break
            used.append(piece)
            at = piece.end
            if at >= end:
                return used
        return None

    def note_read(self, key: tuple[str, str], start: int, end: int) -> None:
        """``[start, end)`` of ``key`` was read (no prediction fetches it again)."""
        record = self._read.get(key) or _Intervals()
        record.add(start, end)
        self._read[key] = record  # (stored again: the pass goes on)

    def claim(self, key: tuple[str, str], start: int, end: int) -> list[Piece]:
        """New pieces to fetch for what of ``[start, end)`` no piece holds or brings: none when
        another reader already read some of it (the range is theirs, not a prediction's to
        fetch again) or there is no room."""
        read = self._read.get(key)
        if read is not None and read.overlaps(start, end):
            return []
        pieces = self._pieces.setdefault(key, [])
        gaps, at = [], start
        for piece in sorted(pieces, key=lambda p: p.start):
            if piece.end <= at or piece.start >= end:
                continue
            if piece.start > at:
                gaps.append((at, piece.start))
            at = max(at, piece.end)
        if at < end:
            gaps.append((at, end))
        claimed = []
        for gap_start, gap_end in gaps:
            if gap_end - gap_start < MIN_GAP < end - start:
                continue  # a sliver beside pieces already asked for: not worth a request
            size = gap_end - gap_start
            if self.used + size > self.max_bytes:
                self._make_room(size)
            if self.used + size > self.max_bytes:
                self.stats.events["stride_budget_full"] += 1
                break
            self.used += size
            piece = Piece(gap_start, gap_end)
            pieces.append(piece)
            claimed.append(piece)
        if not pieces:
            del self._pieces[key]
        return claimed

    def _make_room(self, size: int) -> None:
        now = time.monotonic()
        spare = [h for h in self._held
                 if h[1].used_at is not None or now - h[1].arrived_at > UNUSED_FOR]
        spare.sort(key=lambda h: h[1].used_at or h[1].arrived_at)
        for key, piece in spare:
            if self.used + size <= self.max_bytes:
                break
            self._drop(key, piece)
        if spare:
            self._held = [h for h in self._held if h[1].ready.is_set() and
                          h[1] in self._pieces.get(h[0], ())]

    def took(self, piece: Piece) -> None:
        """A read took bytes from ``piece``."""
        piece.used_at = time.monotonic()

    def arrived(self, key: tuple[str, str], piece: Piece, data: bytes | memoryview | None) -> None:
        piece.data, piece.arrived_at = data, time.monotonic()
        piece.ready.set()
        if data is None:
            self._drop(key, piece)
        else:
            self._held.append((key, piece))

    def _drop(self, key: tuple[str, str], piece: Piece) -> None:
        pieces = self._pieces.get(key)
        if pieces is not None and piece in pieces:
            pieces.remove(piece)
            self.used -= piece.end - piece.start
            if not pieces:
                del self._pieces[key]

    def discard(self, path: str) -> None:
        """Forget every piece of ``path`` (e.g. after it failed verification)."""
        for key in [k for k in self._pieces if k[0] == path]:
            for piece in list(self._pieces[key]):
                self._drop(key, piece)
        self._held = [h for h in self._held if h[0][0] != path]
        for key in [k for k in self._read if k[0] == path]:
            del self._read[key]

    def drop(self) -> None:
        for key in list(self._pieces):
            for piece in list(self._pieces[key]):
                self._drop(key, piece)
        self._held.clear()
        self._read.clear()


#: ``fetch(handle, offset, size)``: exactly those bytes from the backend, timed and counted.
Fetch = Callable[[object, int, int], Awaitable[bytes | memoryview]]


class StrideReader:
    """The spans one reader thread read of one content, and the pieces fetched ahead of it.

    ``note`` each read (:class:`~rucio_fs.data.datapath.ReadStream` serves it from the pieces
    that cover it, when some do), then ``predict``. While the thread's
    spans follow a :class:`Pattern`, the next ``ahead`` predicted spans are claimed and
    fetched in the background; ``ahead`` doubles each time the thread finds a piece it was
    given still on its way, from :data:`FIRST_AHEAD` to :data:`MAX_AHEAD` (on a fast link
    pieces arrive in time and few are in flight), and starts over on a miss.
    """

    def __init__(self, key: tuple[str, str], size: int, store: PieceStore, stats: Stats) -> None:
        self.key = key
        self.size = size
        self.store = store
        self.stats = stats
        self.spans: deque[Span] = deque(maxlen=HISTORY)
        self.ahead = FIRST_AHEAD
        self._predicted = False

    def note(self, offset: int, size: int, served: bool, late: bool = False) -> bool:
        """Record a read (``served``: from pieces; ``late``: one was still on its way);
        whether it started a new span (then predictions may follow)."""
        end = offset + size
        self.store.note_read(self.key, offset, end)
        if self.spans and self.spans[-1][1] == offset:
            self.spans[-1] = (self.spans[-1][0], end)
            return False
        if self._predicted:
            if served:
                if late:  # deeper only while the reader waits: on a fast link, no deeper
                    self.ahead = min(2 * self.ahead, MAX_AHEAD)
                self.stats.events["stride_hits"] += 1
            else:
                self.ahead = FIRST_AHEAD
                self.stats.events["stride_misses"] += 1
        self.spans.append((offset, end))
        return True

    def predict(self, fetch: Fetch, handle: object, nursery: trio.Nursery,
                users: HandleUsers) -> None:
        """Claim and start fetching the pieces predicted after the spans read so far."""
        spans = list(self.spans)
        pattern = find_pattern(spans)
        self._predicted = pattern is not None
        if pattern is None:
            return
        for start, end in pattern.following(spans, self.ahead):
            start, end = max(start, 0), min(end + PAGE, self.size)
            if start >= end:
                break
            claimed = self.store.claim(self.key, start, end)
            for piece in claimed:
                users.take(handle)
                self.stats.events["stride_fetches"] += 1
                start_guarded(nursery, self.stats.events, f"read-ahead of {self.key[0]}",
                              self._fetch, fetch, handle, piece, users)

    async def fetch_now(self, fetch: Fetch, handle: object, end: int) -> None:
        """Fetch ``[0, end)`` as pieces in the foreground (what no piece brings yet); a failure
        leaves the range to its reader."""
        for piece in self.store.claim(self.key, 0, end):
            await self._fill(fetch, handle, piece)

    async def _fetch(self, fetch: Fetch, handle: object, piece: Piece,
                     users: HandleUsers) -> None:
        try:
            await self._fill(fetch, handle, piece)
        finally:
            await users.give(handle)

    async def _fill(self, fetch: Fetch, handle: object, piece: Piece) -> None:
        """``piece``'s bytes from the backend; a failure leaves them to the reader, which
        fetches (and reports) them itself."""
        data = None
        try:
            data = await fetch(handle, piece.start, piece.end - piece.start)
        except RucioFsError as exc:
            log.debug("read-ahead of %s %d+%d failed: %s", self.key[0], piece.start,
                      piece.end - piece.start, exc)
        finally:
            self.store.arrived(self.key, piece, data)


class HandleUsers:
    """Backend handles that background fetches still use: closing one waits for them, in the
    background, so that the reader's ``close`` does not."""

    def __init__(self) -> None:
        self._count: dict[int, int] = {}
        self._closers: dict[int, list[Callable[[], Awaitable[None]]]] = {}

    def take(self, handle: object) -> None:
        self._count[id(handle)] = self._count.get(id(handle), 0) + 1

    async def give(self, handle: object) -> None:
        key = id(handle)
        self._count[key] -= 1
        if self._count[key]:
            return
        del self._count[key]
        for closer in self._closers.pop(key, []):
            await closer()

    async def close(self, handle: object, closer: Callable[[], Awaitable[None]]) -> None:
        """Run ``closer`` now, or when the last fetch using ``handle`` ends."""
        if id(handle) in self._count:
            self._closers.setdefault(id(handle), []).append(closer)
        else:
            await closer()
