"""Coalescing: concurrent identical backend calls share one call (a "single flight")."""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Any, TypeVar

import trio

from rucio_fs.errors import Unavailable

T = TypeVar("T")


class _Flight:
    __slots__ = ("done", "error", "value")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.value: Any = None
        self.error: BaseException | None = None


class SingleFlight:
    """Runs ``fn`` once per key at a time; callers arriving meanwhile wait for its result.

    Followers get the leader's result or its exception. If the leader is cancelled (its FUSE
    request was interrupted), followers get :class:`Unavailable` rather than a foreign
    cancellation. With ``enabled=False`` every caller runs its own call (naive behaviour).
    """

    def __init__(self, enabled: bool, counter: Counter[str]) -> None:
        self.enabled = enabled
        self._counter = counter
        self._flights: dict[Hashable, _Flight] = {}

    async def run(self, key: tuple[str, Hashable], fn: Callable[[], Awaitable[T]]) -> T:
        if not self.enabled:
            return await fn()
        flight = self._flights.get(key)
        if flight is not None:
            self._counter[key[0]] += 1
            await flight.done.wait()
            if flight.error is not None:
                raise flight.error
            return flight.value
        flight = self._flights[key] = _Flight()
        try:
            flight.value = await fn()
            return flight.value
        except trio.Cancelled:
            flight.error = Unavailable("the shared backend call was cancelled")
            raise
        except BaseException as exc:
            flight.error = exc
            raise
        finally:
            if self._flights.get(key) is flight:
                del self._flights[key]
            flight.done.set()

    def in_flight(self, key: tuple[str, Hashable]) -> bool:
        return key in self._flights

    async def run_group(self, keys: Sequence[tuple[str, Hashable]],
                        fn: Callable[[], Awaitable[Sequence[T]]]) -> Sequence[T]:
        """One call producing the values of several keys.

        A caller of any of these keys arriving meanwhile waits for this call and gets its
        own key's value: e.g. one ranged request fetching several cache blocks. A key that
        is already in flight keeps its own flight (this call still produces its value).
        """
        if not self.enabled:
            return await fn()
        flights = [None if key in self._flights else _Flight() for key in keys]
        for key, flight in zip(keys, flights, strict=True):
            if flight is not None:
                self._flights[key] = flight
        error: BaseException | None = None
        values: Sequence[T] = ()
        try:
            values = await fn()
            return values
        except trio.Cancelled:
            error = Unavailable("the shared backend call was cancelled")
            raise
        except BaseException as exc:
            error = exc
            raise
        finally:
            for i, (key, flight) in enumerate(zip(keys, flights, strict=True)):
                if flight is None:
                    continue
                if self._flights.get(key) is flight:
                    del self._flights[key]
                flight.error = error
                flight.value = values[i] if error is None else None
                flight.done.set()
