"""Asynchronous write-back: the changes a mount has promised, carried out in the background.

Contract:

* An :class:`Op` carries out one journal record: ``put`` (upload a closed file's staged
  content), ``mkdir``, ``unlink`` or ``rmdir``. Ops run concurrently, at most
  ``parallelism`` at a time, except that an op waits for every earlier op on an overlapping
  path (the same path, one above it or one below it): a file's upload waits for the ``mkdir``
  of its directory, a directory's removal for the removals of what was in it, and a change
  of a path for the earlier changes of it. Only the first :data:`WINDOW` waiting ops are
  considered at a time, which bounds the work of each scheduling pass.
* Removals go to the backend together, at most ``Backend.remove_batch_max`` names per call
  (S3: one DeleteObjects request): while :data:`REMOVAL_BATCHES` calls are on their way, the
  removals that become ready gather for the next one.
* A removal the server answers with NotFound, or a ``mkdir`` answered with AlreadyExists, is
  done. An upload, or any step that fails with a transient error (unavailable, timed out,
  unconfirmed), stays queued and is tried again with backoff (:data:`RETRY_FIRST` doubling to
  :data:`RETRY_MAX`); the failure is logged, counted (``write_back_errors``) and kept on the
  op (``rucio-fs uploads`` shows it), and :meth:`WriteQueue.wait` raises it. Any other error
  of a namespace step (permission, not empty) ends that op: it is dropped, kept in
  :attr:`WriteQueue.failed`, and the mount's overlay forgets it, so the mount shows what the
  server holds.
* :meth:`WriteQueue.wait` returns once the ops it covers (queued when it was called) are
  carried out, and starts their next try at once.
* The queue yields to the mount's own requests: while FUSE requests keep coming (no pause of
  :data:`QUIET` seconds), no new op starts unless the backlog is large (:data:`BACKLOG_OPS`
  ops or :data:`BACKLOG_BYTES` staged bytes queued), so ``cp -r`` gets the daemon's one
  thread and the queue catches up in the pauses. Anyone waiting (``fsync``, ``uploads
  --wait``, unmount) lifts it. (One op at a time beside ``cp -r`` of small files still took
  two thirds of the loop: 5.7 s instead of 2.7 s for 1,600 files.)
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from .backend import Kind
from .errors import AlreadyExists, NotFound, RucioFsError, Unavailable
from .journal import ancestors, overlaps

if TYPE_CHECKING:
    from .writeback import DirtyFile, WriteBack

log = logging.getLogger(__name__)

#: Ops considered per scheduling pass.
WINDOW = 2048
#: Seconds before a failed op is tried again: the first wait, and the longest (doubling).
RETRY_FIRST, RETRY_MAX = 2.0, 120.0
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
#: How many failed ops ``uploads`` keeps.
FAILED_KEPT = 1000

REMOVALS = ("unlink", "rmdir")


@dataclass(eq=False, slots=True)
class Op:
    """One queued change: its journal number, what it does, and how its tries went."""

    #: The journal number of the record it carries out (a staged file's may change).
    n: int
    kind: str
    path: str
    dirty: DirtyFile | None = None
    #: The queue's own key of the op (fixed), and the staged bytes it had when queued.
    key: int = 0
    size: int = 0
    running: bool = False
    done: bool = False
    error: str = ""
    attempts: int = 0
    not_before: float = 0.0
    #: Set after each try (then replaced): what :meth:`WriteQueue.wait` waits on.
    tried: trio.Event = field(default_factory=trio.Event)

    def as_dict(self) -> dict[str, object]:
        size = self.dirty.size if self.dirty is not None else 0
        return {"op": self.kind, "path": self.path, "size": size, "error": self.error,
                "attempts": self.attempts, "running": self.running}


class WriteQueue:
    """The ops of one mount, in the order they were promised."""

    def __init__(self, writeback: WriteBack, parallelism: int, remove_batch_max: int) -> None:
        self.wb = writeback
        self.parallelism = parallelism
        self.remove_batch_max = max(1, remove_batch_max)
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

    def add(self, op: Op) -> None:
        op.key = next(self._keys)
        op.size = op.dirty.size if op.dirty is not None else 0
        self.queued_bytes += op.size
        self.ops[op.key] = op
        self._wake.set()

    def cancel(self, op: Op) -> bool:
        """Take ``op`` out before it started (it has nothing left to do); False if too late."""
        if op.running or op.done:
            return False
        self._retire(op)
        _tried(op)
        return True

    def _retire(self, op: Op) -> None:
        op.done = True
        del self.ops[op.key]
        self.queued_bytes -= op.size

    def queued(self, covers: Callable[[Op], bool]) -> list[Op]:
        return [op for op in self.ops.values() if covers(op)]

    async def wait(self, covers: Callable[[Op], bool]) -> None:
        """Until every op queued now that ``covers`` selects is carried out (tried now);
        raises the error of one whose try failed meanwhile (it stays queued) or that was
        dropped."""
        ops = self.queued(covers)
        for op in ops:
            op.not_before = 0.0
        self._wake.set()
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
        for op in self.ops.values():
            op.not_before = 0.0
        self._idle = trio.Event()
        self._wake.set()
        await self._idle.wait()

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
        """One pass over the first ops: start those that may run. Returns how long until a
        waiting op's retry time comes."""
        now = trio.current_time()
        yielding = (not self._draining and not self._waiters and len(self.ops) < BACKLOG_OPS
                    and self.queued_bytes < BACKLOG_BYTES and self.quiet_for() < QUIET)
        slots = 0 if yielding else self._free
        blocked_paths: set[str] = set()
        blocked_above: set[str] = set()  # every ancestor of a path in blocked_paths
        batch: list[Op] = []
        next_retry = float("inf")
        started = False
        for op in itertools.islice(self.ops.values(), WINDOW):
            if slots <= 0:
                break
            path = op.path
            above = ancestors(path)
            free = not (op.running or path in blocked_paths or path in blocked_above
                        or any(a in blocked_paths for a in above))
            if free and op.not_before > now:
                next_retry = min(next_retry, op.not_before)
                free = False
            batched = op.kind in REMOVALS and self.remove_batch_max > 1
            if free and batched and not batch and self._removal_batches >= REMOVAL_BATCHES:
                free = False  # gathers for the next batch
            blocked_paths.add(path)
            blocked_above.update(above)
            if not free:
                continue
            op.running = started = True
            if batched:
                batch.append(op)
                if len(batch) >= self.remove_batch_max:
                    self._start(nursery, batch)
                    slots -= 1
                    batch = []
            else:
                self._start(nursery, [op])
                slots -= 1
        if batch:
            self._start(nursery, batch)
        if not started and self._free >= self.parallelism:
            self._idle.set()
        if yielding and self.ops:
            next_retry = min(next_retry, now + QUIET)  # look again after a pause
        return max(0.0, next_retry - now) if next_retry != float("inf") else float("inf")

    def _start(self, nursery: trio.Nursery, ops: list[Op]) -> None:
        self._free -= 1
        if ops[0].kind in REMOVALS and self.remove_batch_max > 1:
            self._removal_batches += 1
        nursery.start_soon(self._carry_out, ops)

    async def _carry_out(self, ops: list[Op]) -> None:
        try:
            if ops[0].kind in REMOVALS:
                failures = await self.wb.catalog.remove_many(
                    [(op.path, Kind.DIR if op.kind == "rmdir" else Kind.FILE) for op in ops])
                for op in ops:
                    self._finish(op, failures.get(op.path))
            else:
                await self.wb.carry_out(ops[0])
                self._finish(ops[0], None)
        except RucioFsError as exc:
            for op in ops:
                if op.running:
                    self._finish(op, exc)
        finally:
            for op in ops:
                if op.running:  # cancelled, or a bug: tried again later
                    self._finish(op, Unavailable("interrupted"))
            self._free += 1
            if ops[0].kind in REMOVALS and self.remove_batch_max > 1:
                self._removal_batches -= 1
            self._wake.set()

    def _finish(self, op: Op, error: RucioFsError | None) -> None:
        op.running = False
        if error is not None and _counts_as_done(op, error):
            error = None
        if error is None or (op.kind != "put" and not isinstance(error, Unavailable)):
            self._retire(op)
            self.wb.op_done(op, error)
            if error is not None:
                op.error = str(error)
                self.failed = [*self.failed[-FAILED_KEPT + 1:], op.as_dict()]
                self.wb.catalog.stats.events["write_back_dropped"] += 1
                log.error("%s: %s given up: %s (the mount shows the server's state again)",
                          op.path, op.kind, error)
        else:
            op.attempts += 1
            op.error = str(error)
            op.not_before = (float("inf") if self._draining else trio.current_time()
                             + min(RETRY_FIRST * 2 ** (op.attempts - 1), RETRY_MAX))
            self.wb.catalog.stats.events["write_back_errors"] += 1
            if op.dirty is not None:
                op.dirty.unreported = op.error
            (log.error if op.attempts == 1 else log.info)(
                "%s: %s failed (try %d): %s", op.path, op.kind, op.attempts, error)
        _tried(op)

    def take_failed(self) -> list[dict[str, object]]:
        """The ops given up since the last call (each is shown once)."""
        failed, self.failed = self.failed, []
        return failed

    def covering(self, paths: Iterable[str]) -> Callable[[Op], bool]:
        """Selects the ops on a path overlapping any of ``paths``."""
        paths = list(paths)
        return lambda op: any(overlaps(op.path, p) for p in paths)


def _tried(op: Op) -> None:
    """Wake whoever waits for this try of ``op`` (the next try gets a new event)."""
    tried, op.tried = op.tried, trio.Event()
    tried.set()


def _counts_as_done(op: Op, error: RucioFsError) -> bool:
    """A removal of a name already gone, a directory made already: the goal is reached."""
    return ((op.kind in REMOVALS and isinstance(error, NotFound))
            or (op.kind == "mkdir" and isinstance(error, AlreadyExists)))
