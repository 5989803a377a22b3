"""Background tasks of a mount that never take it down.

Contract: a task started with :func:`start_guarded` (read-ahead, listing fills, part uploads,
notices to the shared tier, page invalidations) that fails with an error of any type is
logged with its traceback and counted in the mount's ``background_errors`` event; the error
never reaches the nursery, so the mount keeps serving. Cancellation passes through as usual.
A long-lived loop guards each of its steps with :func:`survive` instead, so that one failed
step does not end the loop.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import trio

log = logging.getLogger(__name__)

#: The stats event counting background failures.
EVENT = "background_errors"


def survive(events: Counter[str], what: str) -> _Survive:
    """``with survive(events, "what"):`` logs and counts an exception of any type raised in
    the block instead of letting it propagate (``BaseException`` such as cancellation still
    propagates)."""
    return _Survive(events, what)


class _Survive:
    __slots__ = ("events", "what")

    def __init__(self, events: Counter[str], what: str) -> None:
        self.events, self.what = events, what

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: Any) -> bool:
        if exc is None or not isinstance(exc, Exception):
            return False
        self.events[EVENT] += 1
        log.error("%s failed; the mount goes on", self.what, exc_info=exc)
        return True


def start_guarded(nursery: trio.Nursery, events: Counter[str], what: str,
                  fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
    """Start ``fn(*args)`` in ``nursery``; an exception of any type it raises is logged and
    counted (see :func:`survive`), never raised into the nursery."""
    nursery.start_soon(_guarded, events, what, fn, *args)


async def _guarded(events: Counter[str], what: str, fn: Callable[..., Awaitable[Any]],
                   *args: Any) -> None:
    with survive(events, what):
        await fn(*args)
