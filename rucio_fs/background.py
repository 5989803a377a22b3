"""Background tasks of a mount that never take it down.

Contract: a task started with :func:`start_guarded` (read-ahead, listing fills, part uploads,
notices to the shared tier, page invalidations) that fails with an error of any type is
logged with its traceback and counted in the mount's ``background_errors`` event; the error
never reaches the nursery, so the mount keeps serving. Cancellation passes through as usual.
A long-lived loop guards each of its steps with :func:`survive` instead, so that one failed
step does not end the loop.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import trio

log = logging.getLogger(__name__)

#: The stats event counting background failures.
EVENT = "background_errors"


def report_failure(events: Counter[str], what: str, exc: BaseException) -> None:
    """``what`` failed in the background with an unexpected ``exc``: logged with its
    traceback and counted; the caller goes on."""
    events[EVENT] += 1
    log.error("%s failed unexpectedly; the mount goes on", what, exc_info=exc)


@contextlib.contextmanager
def survive(events: Counter[str], what: str) -> Iterator[None]:
    """``with survive(events, "what"):`` an exception of any type raised in the block is
    :func:`report_failure` instead of propagating (``BaseException`` such as cancellation still
    propagates)."""
    try:
        yield
    except Exception as exc:
        report_failure(events, what, exc)


def start_guarded(nursery: trio.Nursery, events: Counter[str], what: str,
                  fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
    """Start ``fn(*args)`` in ``nursery``; an exception of any type it raises is logged and
    counted (see :func:`survive`), never raised into the nursery."""
    nursery.start_soon(_guarded, events, what, fn, *args)


async def _guarded(events: Counter[str], what: str, fn: Callable[..., Awaitable[Any]],
                   *args: Any) -> None:
    with survive(events, what):
        await fn(*args)
