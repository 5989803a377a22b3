"""Running one piece of work in several threads at once (no dependencies: ``bench_http.py``
runs without rucio-fs installed)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


def in_threads(work: Callable[[], None], count: int) -> float:
    """Seconds for ``count`` threads each running ``work`` at once; the first error raised."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:  # re-raised in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(count)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - start
