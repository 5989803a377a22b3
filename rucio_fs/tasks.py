"""Concurrent steps of one operation: a trio nursery that fails with the typed error itself.

trio wraps a child task's exception in an ``ExceptionGroup``; a backend that sends two requests
at once (a stat and a membership check, a listing page and the next) must still fail with the
:mod:`~rucio_fs.errors` type of what went wrong (ENOENT stays ENOENT), not an untyped group.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator

import trio

from rucio_fs.errors import RucioFsError

if sys.version_info < (3, 11):  # pragma: no cover - the builtin from 3.11 on
    from exceptiongroup import BaseExceptionGroup


def _first_typed(group: BaseExceptionGroup) -> RucioFsError | None:
    for exc in group.exceptions:
        if isinstance(exc, RucioFsError):
            return exc
        if isinstance(exc, BaseExceptionGroup):
            found = _first_typed(exc)
            if found is not None:
                return found
    return None


@contextlib.asynccontextmanager
async def open_nursery() -> AsyncIterator[trio.Nursery]:
    """``trio.open_nursery()``, except that a failure holding a typed error raises that error
    (the first one); anything else propagates as trio raised it."""
    try:
        async with trio.open_nursery() as nursery:
            yield nursery
    except BaseExceptionGroup as group:
        typed = _first_typed(group)
        if typed is None:
            raise
        raise typed from None
