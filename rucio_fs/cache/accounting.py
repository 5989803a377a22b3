"""Call accounting: every backend call of a mount bounded, counted, timed, and shared.

A call that outlives the backend timeout becomes :class:`~rucio_fs.errors.Unavailable` (EIO),
never a hung FUSE request; each failure is counted under its errno; each call's latency goes
into the ``backend`` histograms of ``stats``; concurrent identical calls (same name and key)
share one flight when coalescing is on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import TypeVar

import trio

from rucio_fs.errors import RucioFsError, Unavailable
from rucio_fs.observe.stats import Stats, errno_name

from .singleflight import SingleFlight

log = logging.getLogger(__name__)
T = TypeVar("T")


class BackendCalls:
    def __init__(self, stats: Stats, timeout: float, coalescing: bool) -> None:
        self.stats = stats
        self.timeout = timeout
        self.flight = SingleFlight(coalescing, stats.coalesced)

    async def shared(self, call: str, key: Hashable, fn: Callable[[], Awaitable[T]]) -> T:
        """``fn()`` as :meth:`timed`, shared with everyone asking ``(call, key)`` meanwhile."""
        return await self.flight.run((call, key), lambda: self.timed(call, fn))

    async def timed(self, call: str, fn: Callable[[], Awaitable[T]],
                    extra_seconds: float = 0.0) -> T:
        """``fn()`` bounded by the backend timeout (plus ``extra_seconds``), counted and timed
        under ``call``; any failure is a typed error."""
        op = self.stats.backend_call(call)
        start = time.perf_counter_ns()
        limit = self.timeout + extra_seconds
        op.begin()
        try:
            with trio.fail_after(limit):
                return await fn()
        except trio.TooSlowError:
            op.errors["ETIMEDOUT"] += 1
            raise Unavailable(f"backend {call} timed out after {limit:g} s") from None
        except RucioFsError as exc:
            op.errors[errno_name(exc.errno)] += 1
            raise
        except (trio.Cancelled, KeyboardInterrupt):
            raise
        except Exception as exc:
            # A backend bug must not take the mount down: it becomes EIO, logged once by the
            # FUSE layer; the traceback is there with --debug.
            op.errors["EIO"] += 1
            log.debug("backend %s call failed unexpectedly", call, exc_info=True)
            raise Unavailable(f"backend {call} failed unexpectedly: {exc!r}") from exc
        finally:
            op.end()
            op.latency.add(time.perf_counter_ns() - start)
