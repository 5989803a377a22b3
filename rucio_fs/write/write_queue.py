"""Asynchronous write-back: the changes a mount has promised, carried out in the background.

Contract:

* An :class:`Op` carries out one journal record: ``put`` (upload a closed file's staged
  content), ``mkdir``, ``unlink``, ``rmdir`` or ``attrs`` (store attributes set on a path
  with no pending content: a directory's times once what was queued in it is there). Ops run
  concurrently, at most ``parallelism`` at a time, except that an op waits for every earlier
  op on an overlapping path (the same path, one above it or one below it): a file's upload
  waits for the ``mkdir`` of its directory, a directory's removal for the removals of what
  was in it, and a change of a path for the earlier changes of it. Only the first
  :data:`WINDOW` ops that may be ready are considered at a time, which bounds the work of
  each scheduling pass.
* An op waiting for its retry time (*in backoff*) is out of that window, so failing ops never
  stall the others; it still blocks every op queued on an overlapping path. It has been
  tried, so no earlier op on an overlapping path is queued: what it blocks is exactly the
  later ones (unless a rename moved a queued upload meanwhile: then an earlier op may wait
  for it).
* Removals go to the backend together, at most ``Backend.remove_batch_max`` names per call
  (S3: one DeleteObjects request): while :data:`REMOVAL_BATCHES` calls are on their way, the
  removals that become ready gather for the next one.
* A removal the server answers with NotFound, a ``mkdir`` answered with AlreadyExists, or an
  ``attrs`` of a path gone meanwhile, is done. An upload, or any step that fails with a
  transient error (unavailable, timed out, unconfirmed), stays queued and is tried again
  with backoff (:data:`RETRY_FIRST` doubling to :data:`RETRY_MAX`); the failure is logged,
  counted (``write_back_errors``) and kept on the op until a try succeeds (``rucio-fs
  uploads`` shows it). An upload the server refuses (permission, quota: any error but a
  transient one) is never dropped, as ``close`` promised its content: it stays queued and
  listed, tried again every :data:`RETRY_REFUSED` seconds. Any other error of a namespace
  step (permission, not empty) ends that op: it is dropped, kept in
  :attr:`WriteQueue.failed`, and the mount's overlay forgets it, so the mount shows what the
  server holds.
* A try that fails with an error of any other type (a bug, an OSError of a staging file or of
  the journal) is logged with its traceback, counted (``background_errors``) and tried again
  like a transient failure; the queue goes on.
* :meth:`WriteQueue.wait` returns once the ops it covers (queued when it was called) are
  carried out, and starts their next try at once. It raises the error of a try that failed
  meanwhile (the op stays queued) or of an op dropped; a failure of a try before a later one
  succeeded is no error.
* The queue's bound is :data:`QUEUE_MAX_OPS` ops or :data:`QUEUE_MAX_BYTES` staged bytes.
  :meth:`WriteQueue.add` never waits; a writer awaits :meth:`WriteQueue.room` before it
  queues a change: it waits while the queue is full, at most the mount's ``--timeout``, and
  then refuses the change with :class:`QueueFull` (ENOBUFS) rather than hang.
* The queue yields to the mount's own requests: while FUSE requests keep coming (no pause of
  :data:`QUIET` seconds), no new op starts unless the backlog is large (:data:`BACKLOG_OPS`
  ops or :data:`BACKLOG_BYTES` staged bytes queued), so ``cp -r`` gets the daemon's one
  thread and the queue catches up in the pauses. Anyone waiting (``fsync``, ``uploads
  --wait``, unmount) lifts it. (One op at a time beside ``cp -r`` of small files still took
  two thirds of the loop: 5.7 s instead of 2.7 s for 1,600 files.)
"""

from __future__ import annotations

import bisect
import errno
import heapq
import itertools
import logging
import math
import operator
from collections import Counter
from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass, field
from typing import Protocol

import trio

from rucio_fs.backend import Attributes, Kind
from rucio_fs.background import report_failure, survive
from rucio_fs.catalog.catalog import Catalog
from rucio_fs.errors import AlreadyExists, NotFound, RucioFsError, Unavailable

from .journal import ancestors, overlaps

log = logging.getLogger(__name__)

#: Ops considered per scheduling pass.
WINDOW = 2048
#: Seconds before a failed op is tried again: the first wait, and the longest (doubling).
RETRY_FIRST, RETRY_MAX = 2.0, 120.0
#: Seconds before an upload the server refused is tried again (it is never dropped).
RETRY_REFUSED = 600.0
#: Batched removal requests in flight at once: removals ready while they are on their way
#: gather into the next batch (one request for all that ``rm -r`` removed meanwhile).
REMOVAL_BATCHES = 2
#: Seconds without a FUSE request after which the queue runs at full parallelism.
QUIET = 0.002
#: With this many ops, or staged bytes, queued the queue no longer yields. A queued file
#: costs about 3.5 KB of memory and a directory 2.7 KB (measured with 20,000 queued): 30,000
#: keep the daemon within 150 MB, and hold mdtest ``-z 4``'s 26,000 changes (with 10,000, its
#: markers went out during the copy, and every rmdir then had to list its directory).
BACKLOG_OPS, BACKLOG_BYTES = 30_000, 1 << 30
#: The most ops, and staged bytes, the queue holds before a writer waits (about 210 MB of
#: queued files; staged bytes are on the staging disk).
QUEUE_MAX_OPS, QUEUE_MAX_BYTES = 2 * BACKLOG_OPS, 4 * BACKLOG_BYTES
#: How many failed ops ``uploads`` keeps.
FAILED_KEPT = 1000

REMOVALS = ("unlink", "rmdir")


class QueueFull(RucioFsError):
    """The queue stayed full for the mount's ``--timeout``: a change is refused (ENOBUFS: no
    room in the write-back's buffer, which is not a full disk)."""

    errno = errno.ENOBUFS


class Staged(Protocol):
    """The staged content an upload op carries (:class:`~rucio_fs.write.writeback.DirtyFile`)."""

    size: int
    #: The last failure of its upload that no ``close`` or ``fsync`` has reported yet.
    unreported: str

    def park(self) -> None:
        """Let go of the file descriptor until the next try."""


class Owner(Protocol):
    """What carries the queue's ops out and learns their ends
    (:class:`~rucio_fs.write.writeback.WriteBack`)."""

    catalog: Catalog

    async def carry_out(self, op: Op) -> None:
        """One try of a single op (not a removal); raises what failed."""

    def op_done(self, op: Op, dropped: RucioFsError | None) -> None:
        """``op`` left the queue: carried out, or dropped with the error ``dropped``."""


@dataclass(eq=False, slots=True)
class Op:
    """One queued change: its journal number, what it does, and how its tries went."""

    #: The journal number of the record it carries out (a staged file's may change).
    n: int
    kind: str
    path: str
    dirty: Staged | None = None
    #: What an ``attrs`` op stores.
    attributes: Attributes | None = None
    #: The queue's own key of the op (fixed), and the staged bytes it had when queued.
    key: int = 0
    size: int = 0
    running: bool = False
    done: bool = False
    error: str = ""
    attempts: int = 0
    not_before: float = 0.0
    #: Whether a daemon before this one may have sent it (replayed from a killed daemon's
    #: journal): what it makes may be on the server already.
    maybe_sent: bool = False
    #: The path it blocks while in backoff (its path then; "": not in backoff).
    held: str = ""
    #: Set after each try (then replaced): what :meth:`WriteQueue.wait` waits on.
    tried: trio.Event = field(default_factory=trio.Event)

    def as_dict(self) -> dict[str, object]:
        size = self.dirty.size if self.dirty is not None else 0
        return {"op": self.kind, "path": self.path, "size": size, "error": self.error,
                "attempts": self.attempts, "running": self.running}


class WriteQueue:
    """The ops of one mount, in the order they were promised."""

    def __init__(self, writeback: Owner, parallelism: int, remove_batch_max: int,
                 implied_directories: bool = False) -> None:
        self.wb = writeback
        self.parallelism = parallelism
        self.remove_batch_max = max(1, remove_batch_max)
        #: Whether an ``rmdir`` may go in one batch with the removals below it, after them
        #: (a catalog whose directories are implied by the keys below them: a key a failed
        #: removal leaves keeps its directory). Never beside a batch that holds one of them:
        #: a server that keeps directories on disk (versitygw) refuses the marker of a
        #: directory that still holds a file.
        self.rmdir_joins_batch = implied_directories
        #: Queued ops by their queue key (insertion order is the order they run in).
        self.ops: dict[int, Op] = {}
        #: Namespace ops given up after a permanent error (newest last), until shown.
        self.failed: list[dict[str, object]] = []
        self._free = parallelism
        self._wake = trio.Event()
        self._keys = itertools.count(1)
        #: Set when nothing runs and nothing may start (see :meth:`drain`).
        self._idle = trio.Event()
        self._draining = False
        self._removal_batches = 0
        #: Seconds since the mount's last FUSE request ended (0 while one runs); set by the
        #: FUSE layer (by default the mount is always quiet).
        self.quiet_for: Callable[[], float] = lambda: float("inf")
        self._waiters = 0
        #: Staged bytes of the queued uploads (as they were when queued).
        self.queued_bytes = 0
        #: The queued ops not in backoff, by key: what a scheduling pass looks at.
        self._ready: list[Op] = []
        #: The ops in backoff: (retry time, key, attempts, op), soonest first. An entry whose
        #: op left backoff since (``wait``, ``drain``, a later try) is skipped.
        self._backoff: list[tuple[float, int, int, Op]] = []
        #: What the ops in backoff block: their paths, and every ancestor of those (counted
        #: per op).
        self._held_paths: Counter[str] = Counter()
        self._held_above: Counter[str] = Counter()
        #: Set when an op leaves while a writer waits for room (see :meth:`room`).
        self._left: trio.Event | None = None
        #: Whether the scheduler yields to a busy mount and looks again within QUIET: an op
        #: added meanwhile waits for that pass instead of waking it (one per FUSE request).
        self._looking_again = False

    def add(self, op: Op, not_before: float = 0.0) -> None:
        """Queue ``op`` after everything queued before it; ``not_before`` (trio time): it
        waits until then, as an op in backoff does (a change held back for a later one to
        carry, see ``WriteBack.queue_attributes``). Never waits: a writer awaits
        :meth:`room` first."""
        op.key = next(self._keys)
        op.size = op.dirty.size if op.dirty is not None else 0
        self.queued_bytes += op.size
        self.ops[op.key] = op
        self._ready.append(op)  # the newest key: the order holds
        if not_before > trio.current_time():
            op.not_before = not_before
            self._hold(op)
        if not self._looking_again:
            self._wake.set()

    @property
    def full(self) -> bool:
        return len(self.ops) >= QUEUE_MAX_OPS or self.queued_bytes >= QUEUE_MAX_BYTES

    async def room(self) -> None:
        """Returns once the queue may take another op: at once unless it is :attr:`full`,
        else when ops have left it. Raises :class:`QueueFull` when none left within the
        mount's ``--timeout`` (nothing is queued then: the caller refuses its change)."""
        if not self.full:
            return  # (no deadline to set up: every create and close asks)
        timeout = self.wb.catalog.config.backend_timeout
        with trio.move_on_after(timeout):
            while self.full:
                if self._left is None:
                    self._left = trio.Event()
                await self._left.wait()
            return
        raise QueueFull(f"the write-back queue is full ({len(self.ops)} changes, "
                        f"{self.queued_bytes} staged bytes) and the server took none of them "
                        f"within {timeout:g} s")

    @property
    def waited_on(self) -> bool:
        """Whether a caller of :meth:`wait` is waiting (for ops it saw queued)."""
        return self._waiters > 0

    def untried(self, op: Op) -> bool:
        """Whether ``op`` may still be taken over by its caller (:meth:`cancel`, then done
        another way): never tried, not running, and no :meth:`wait` waiting (which may wait
        for exactly that op)."""
        return not (op.running or op.done or op.attempts or self.waited_on)

    def cancel(self, op: Op) -> bool:
        """Take ``op`` out before it started (it has nothing left to do); False if too late."""
        if op.running or op.done:
            return False
        self._retire(op)
        _tried(op)
        return True

    def _retire(self, op: Op) -> None:
        """``op`` leaves the queue (carried out, cancelled or dropped)."""
        op.done = True
        op.error = ""
        del self.ops[op.key]
        if op.held:
            self._unhold(op)
        else:
            del self._ready[self._ready_at(op)]
        self.queued_bytes -= op.size
        if self._left is not None:
            self._left.set()
            self._left = None

    def _ready_at(self, op: Op) -> int:
        at = bisect.bisect_left(self._ready, op.key, key=_KEY)
        assert self._ready[at] is op
        return at

    def _hold(self, op: Op) -> None:
        """``op`` waits for its retry time (:attr:`Op.not_before`) out of the window, and
        blocks the ops on overlapping paths meanwhile."""
        del self._ready[self._ready_at(op)]
        op.held = op.path
        self._held_paths[op.held] += 1
        self._held_above.update(ancestors(op.held))
        heapq.heappush(self._backoff, (op.not_before, op.key, op.attempts, op))

    def _unhold(self, op: Op) -> None:
        _discount(self._held_paths, [op.held])
        _discount(self._held_above, ancestors(op.held))
        op.held = ""

    def _release(self, op: Op) -> None:
        """``op`` leaves backoff: back into the window, in its place."""
        self._unhold(op)
        bisect.insort(self._ready, op, key=_KEY)

    def _release_due(self, now: float) -> None:
        """The ops in backoff whose retry time has come go back into the window. A removal
        due takes every removal in backoff with it: removals that failed in several requests
        (``rm -r`` outpacing the queue) are tried again in one."""
        backoff = self._backoff
        removal_due = False
        while backoff and backoff[0][0] <= now:
            _time, _key, attempts, op = heapq.heappop(backoff)
            if op.held and op.attempts == attempts:
                self._release(op)
                removal_due = removal_due or op.kind in REMOVALS
        if removal_due and self.remove_batch_max > 1:
            for op in [op for op in self.ops.values() if op.held and op.kind in REMOVALS]:
                op.not_before = now
                self._release(op)

    def queued(self, covers: Callable[[Op], bool]) -> list[Op]:
        return [op for op in self.ops.values() if covers(op)]

    async def wait(self, covers: Callable[[Op], bool]) -> None:
        """Until every op queued now that ``covers`` selects is carried out (tried now);
        raises the error of one whose try failed meanwhile (it stays queued) or that was
        dropped."""
        ops = self.queued(covers)
        self._try_now(ops)
        self._waiters += 1
        try:
            for op in ops:
                while not op.done:
                    await op.tried.wait()
                    if op.error:
                        raise Unavailable(f"{op.path}: {op.kind} failed: {op.error}")
        finally:
            self._waiters -= 1

    async def drain(self) -> None:
        """Try every queued op once more now, and no more after it fails (at unmount):
        returns when the queue is empty or what is left failed or waits behind a failure."""
        self._draining = True
        self._try_now(list(self.ops.values()))
        self._idle = trio.Event()
        self._wake.set()
        await self._idle.wait()

    def _try_now(self, ops: list[Op]) -> None:
        """Their retry time is now: ``ops`` in backoff go back into the window."""
        for op in ops:
            op.not_before = 0.0
            if op.held:
                self._release(op)
        self._wake.set()

    async def run(self) -> None:
        """Start ops as they become ready, for the life of the mount (a task of the daemon's
        nursery, which also runs the ops)."""
        async with trio.open_nursery() as nursery:
            while True:
                wake = self._wake
                delay = self._schedule(nursery)
                with trio.move_on_after(delay):
                    await wake.wait()
                if self._wake is wake:
                    self._wake = trio.Event()

    def _schedule(self, nursery: trio.Nursery) -> float:
        """One pass over the first ops not in backoff: start those that may run. Returns how
        long until the retry time of an op in backoff comes."""
        now = trio.current_time()
        self._release_due(now)
        yielding = (not self._draining and not self._waiters and len(self.ops) < BACKLOG_OPS
                    and self.queued_bytes < BACKLOG_BYTES and self.quiet_for() < QUIET)
        slots = 0 if yielding else self._free
        blocked_paths: set[str] = set()
        blocked_above: set[str] = set()  # every ancestor of a path in blocked_paths
        # the same, of the ops not in the batch being gathered (what an rmdir that may join
        # the batch of the removals below it waits for)
        outside_paths: set[str] = set()
        outside_above: set[str] = set()
        batch: list[Op] = []
        started = False
        for op in itertools.islice(self._ready, WINDOW):
            if slots <= 0:
                break
            path = op.path
            above = ancestors(path)
            batched = op.kind in REMOVALS and self.remove_batch_max > 1
            joins = batched and op.kind == "rmdir" and self.rmdir_joins_batch
            free = not (op.running
                        or (_blocked(path, above, outside_paths, outside_above) if joins
                            else _blocked(path, above, blocked_paths, blocked_above))
                        or _blocked(path, above, self._held_paths, self._held_above))
            if free and batched and not batch and self._removal_batches >= REMOVAL_BATCHES:
                free = False  # gathers for the next batch
            blocked_paths.add(path)
            blocked_above.update(above)
            if not (free and batched):
                outside_paths.add(path)
                outside_above.update(above)
            if not free:
                continue
            op.running = started = True
            if batched:
                batch.append(op)
                if len(batch) >= self.remove_batch_max:
                    self._start(nursery, batch)
                    slots -= 1
                    # on its way beside the next batch: an rmdir of that one waits for it
                    for sent in batch:
                        outside_paths.add(sent.path)
                        outside_above.update(ancestors(sent.path))
                    batch = []
            else:
                self._start(nursery, [op])
                slots -= 1
        if batch:
            self._start(nursery, batch)
        if not started and self._free >= self.parallelism:
            self._idle.set()
        next_retry = self._backoff[0][0] if self._backoff else math.inf
        self._looking_again = yielding and bool(self._ready)
        if self._looking_again:
            next_retry = min(next_retry, now + QUIET)  # look again after a pause
        return max(0.0, next_retry - now)

    def _start(self, nursery: trio.Nursery, ops: list[Op]) -> None:
        self._free -= 1
        if ops[0].kind in REMOVALS and self.remove_batch_max > 1:
            self._removal_batches += 1
        nursery.start_soon(self._carry_out, ops)

    async def _carry_out(self, ops: list[Op]) -> None:
        """One try of ``ops`` (one op, or a batch of removals). Whatever it raises, each op
        ends the try carried out, dropped or in backoff, and the queue goes on."""
        try:
            await self._try(ops)
        except RucioFsError as exc:
            self._finish_running(ops, exc)
        except Exception as exc:  # a bug, a staging file or journal failing: tried again
            more = f" (and {len(ops) - 1} more)" if len(ops) > 1 else ""
            report_failure(self.wb.catalog.stats.events, f"{ops[0].kind} {ops[0].path}{more}", exc)
            self._finish_running(ops, Unavailable(f"failed unexpectedly: {exc!r}"))
        finally:
            self._finish_running(ops, Unavailable("interrupted"))  # cancelled
            self._free += 1
            if ops[0].kind in REMOVALS and self.remove_batch_max > 1:
                self._removal_batches -= 1
            self._wake.set()

    async def _try(self, ops: list[Op]) -> None:
        if ops[0].kind in REMOVALS:
            failures = await self.wb.catalog.remove_many(
                [(op.path, Kind.DIR if op.kind == "rmdir" else Kind.FILE) for op in ops])
            for op in ops:
                self._finish(op, failures.get(op.path))
        else:
            await self.wb.carry_out(ops[0])
            self._finish(ops[0], None)

    def _finish_running(self, ops: list[Op], error: RucioFsError) -> None:
        """Each of ``ops`` whose try has no outcome yet failed with ``error``."""
        for op in ops:
            if op.running:
                self._finish(op, error)

    def _finish(self, op: Op, error: RucioFsError | None) -> None:
        """The outcome of a try of ``op``: it leaves the queue (carried out, or dropped: the
        write-back learns it), or it waits in backoff for its next try."""
        op.running = False
        try:
            if error is not None and _counts_as_done(op, error):
                error = None
            if error is not None and (op.kind == "put" or isinstance(error, Unavailable)):
                self._back_off(op, error)
                return
            self._retire(op)
            if error is not None:
                self._drop(op, error)
            with survive(self.wb.catalog.stats.events, f"{op.path}: recording its {op.kind}"):
                self.wb.op_done(op, error)
        finally:
            _tried(op)

    def _drop(self, op: Op, error: RucioFsError) -> None:
        op.error = str(error)
        self.failed = [*self.failed[-FAILED_KEPT + 1:], op.as_dict()]
        self.wb.catalog.stats.events["write_back_dropped"] += 1
        log.error("%s: %s given up: %s (the mount shows the server's state again)",
                  op.path, op.kind, error)

    def _back_off(self, op: Op, error: RucioFsError) -> None:
        """A try of ``op`` failed: it stays queued, in backoff until its next try — soon
        after a transient error (doubling), long after a refused upload (its content was
        promised: never dropped), none while draining (the unmount's last try)."""
        op.attempts += 1
        op.error = str(error)
        refused = not isinstance(error, Unavailable)
        delay = (RETRY_REFUSED if refused
                 else min(RETRY_FIRST * 2 ** (op.attempts - 1), RETRY_MAX))
        op.not_before = math.inf if self._draining else trio.current_time() + delay
        self.wb.catalog.stats.events["write_back_errors"] += 1
        if op.dirty is not None:
            op.dirty.unreported = op.error
            op.dirty.park()  # waiting for its next try holds no descriptor
        (log.error if op.attempts == 1 else log.info)(
            "%s: %s failed (try %d%s): %s", op.path, op.kind, op.attempts,
            f", refused: next try in {delay:g} s" if refused else "", error)
        self._hold(op)

    def take_failed(self) -> list[dict[str, object]]:
        """The ops given up since the last call (each is shown once)."""
        failed, self.failed = self.failed, []
        return failed

    def covering(self, paths: Iterable[str]) -> Callable[[Op], bool]:
        """Selects the ops on a path overlapping any of ``paths``."""
        paths = list(paths)
        return lambda op: any(overlaps(op.path, p) for p in paths)


_KEY = operator.attrgetter("key")


def _blocked(path: str, above: list[str], paths: Container[str], below: Container[str]
             ) -> bool:
    """Whether an op on ``path`` (whose ancestors are ``above``) overlaps one of ``paths``
    (whose ancestors are ``below``): the same path, one above it or one below it."""
    return path in paths or path in below or any(a in paths for a in above)


def _discount(counter: Counter[str], keys: Iterable[str]) -> None:
    """Count ``keys`` once less, forgetting those no longer counted."""
    for key in keys:
        left = counter[key] - 1
        if left:
            counter[key] = left
        else:
            del counter[key]


def _tried(op: Op) -> None:
    """Wake whoever waits for this try of ``op`` (the next try gets a new event)."""
    tried, op.tried = op.tried, trio.Event()
    tried.set()


def _counts_as_done(op: Op, error: RucioFsError) -> bool:
    """A removal of a name already gone, a directory made already: the goal is reached."""
    return ((op.kind in REMOVALS and isinstance(error, NotFound))
            or (op.kind == "mkdir" and isinstance(error, AlreadyExists))
            or (op.kind == "attrs" and isinstance(error, NotFound)))
