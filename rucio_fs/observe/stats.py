"""Always-on instrumentation of a live mount: counters and log2 latency histograms.

Recording is a few integer operations per event so it can stay on (CernVM-FS style).
``Stats.snapshot()`` returns plain JSON-able data; formatting lives in
:mod:`rucio_fs.observe.report`.
"""

from __future__ import annotations

import errno as errno_names
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

#: Bin ``k`` counts durations ``d`` with ``d.bit_length() == k``, i.e. ``2**(k-1) <= d < 2**k`` ns.
#: 41 bins reach 2**40 ns (about 18 minutes); longer durations land in the last bin.
N_BINS = 41


class Log2Histogram:
    """Latency histogram with power-of-two nanosecond bins."""

    __slots__ = ("bins", "count", "max_ns", "total_ns")

    def __init__(self) -> None:
        self.bins = [0] * N_BINS
        self.count = 0
        self.total_ns = 0
        self.max_ns = 0

    def add(self, ns: int) -> None:
        k = ns.bit_length()
        self.bins[k if k < N_BINS else N_BINS - 1] += 1
        self.count += 1
        self.total_ns += ns
        if ns > self.max_ns:
            self.max_ns = ns

    def as_dict(self) -> dict[str, Any]:
        return {"count": self.count, "total_ns": self.total_ns, "max_ns": self.max_ns,
                "bins": list(self.bins)}


def quantile(hist: Mapping[str, Any], q: float) -> float:
    """Estimate the ``q`` quantile (0..1) in ns from a histogram dict, interpolating in a bin."""
    count = hist["count"]
    if not count:
        return 0.0
    rank = q * count
    seen = 0
    for k, n in enumerate(hist["bins"]):
        if n and seen + n >= rank:
            low = 0 if k == 0 else 1 << (k - 1)
            high = min(1 << k, hist["max_ns"] + 1) if k else 1
            return low + (high - low) * max(0.0, rank - seen) / n
        seen += n
    return float(hist["max_ns"])


class OpStats:
    """One kind of call (a FUSE op or a backend call): count, errors by errno, latency, bytes,
    and the most under way at once (``peak``: e.g. whether the kernel sent lookups together)."""

    __slots__ = ("bytes", "errors", "latency", "peak", "running")

    def __init__(self) -> None:
        self.latency = Log2Histogram()
        self.errors: Counter[str] = Counter()
        self.bytes = 0
        self.running = 0
        self.peak = 0

    def begin(self) -> None:
        """One more call of this kind under way; :meth:`end` when it is over."""
        self.running += 1
        if self.running > self.peak:
            self.peak = self.running

    def end(self) -> None:
        self.running -= 1

    def as_dict(self) -> dict[str, Any]:
        return {"latency": self.latency.as_dict(), "errors": dict(self.errors),
                "bytes": self.bytes, "peak": self.peak}


def errno_name(code: int) -> str:
    return errno_names.errorcode.get(code, str(code))


class Stats:
    """Every counter of one mount. Single-threaded (the trio loop), so no locks."""

    def __init__(self) -> None:
        self.static: dict[str, Any] = {}
        self.started = time.time()
        self.fuse: dict[str, OpStats] = {}
        self.backend: dict[str, OpStats] = {}
        self.cache: dict[str, Counter[str]] = {}
        self.coalesced: Counter[str] = Counter()
        self.events: Counter[str] = Counter()

    def reset(self) -> None:
        """Zero every counter in place (the layers hold references to their counters)."""
        self.started = time.time()
        self.fuse.clear()
        self.backend.clear()
        for layer in self.cache.values():
            enabled = layer.get("enabled")
            layer.clear()
            if enabled is not None:
                layer["enabled"] = enabled
        self.coalesced.clear()
        self.events.clear()

    def _op(self, table: dict[str, OpStats], name: str) -> OpStats:
        op = table.get(name)
        if op is None:
            op = table[name] = OpStats()
        return op

    def fuse_op(self, name: str) -> OpStats:
        return self._op(self.fuse, name)

    def backend_call(self, name: str) -> OpStats:
        return self._op(self.backend, name)

    def cache_layer(self, name: str) -> Counter[str]:
        layer = self.cache.get(name)
        if layer is None:
            layer = self.cache[name] = Counter()
        return layer

    def snapshot(self, live: Mapping[str, Callable[[], Any]] | None = None) -> dict[str, Any]:
        """Plain data for the control channel. ``live`` adds values computed on demand."""
        snap: dict[str, Any] = dict(self.static)
        snap.update({
            "since": self.started,
            "now": time.time(),
            "fuse": {k: v.as_dict() for k, v in sorted(self.fuse.items())},
            "backend": {k: v.as_dict() for k, v in sorted(self.backend.items())},
            "cache": {k: dict(v) for k, v in sorted(self.cache.items())},
            "coalesced": dict(self.coalesced),
            "events": dict(self.events),
        })
        for key, fn in (live or {}).items():
            snap[key] = fn()
        return snap


def summarize(prefix: str, hist: Mapping[str, Any]) -> dict[str, float]:
    """``prefix.mean/p50/p90/p99/max`` of a histogram dict (nothing when it is empty)."""
    if not hist["count"]:
        return {}
    flat = {f"{prefix}.mean": round(hist["total_ns"] / hist["count"])}
    for q in (0.5, 0.9, 0.99):
        flat[f"{prefix}.p{round(q * 100)}"] = round(quantile(hist, q))
    flat[f"{prefix}.max"] = hist["max_ns"]
    return flat


def flatten(snap: Mapping[str, Any]) -> dict[str, float | str]:
    """One flat ``metric -> value`` mapping of a snapshot: the CSV rows and the diff's input."""
    flat: dict[str, float | str] = {}
    for section in ("fuse", "backend"):
        for op, data in snap.get(section, {}).items():
            hist = data["latency"]
            prefix = f"{section}.{op}"
            flat[f"{prefix}.count"] = hist["count"]
            flat[f"{prefix}.errors"] = sum(data["errors"].values())
            for name, n in sorted(data["errors"].items()):
                flat[f"{prefix}.errno.{name}"] = n
            if data.get("bytes"):
                flat[f"{prefix}.bytes"] = data["bytes"]
            if data.get("peak"):
                flat[f"{prefix}.peak"] = data["peak"]
            flat.update(summarize(f"{prefix}.latency_ns", hist))
            for k, n in enumerate(hist["bins"]):
                if n:
                    flat[f"{prefix}.latency_ns.bin{k:02d}"] = n
    for layer, counters in snap.get("cache", {}).items():
        for name, n in sorted(counters.items()):
            flat[f"cache.{layer}.{name}"] = n
    for section in ("coalesced", "events", "backend_counters"):
        for name, n in sorted(snap.get(section, {}).items()):
            flat[f"{section}.{name}"] = n
    for section in ("config", "kernel"):
        for name, value in sorted(snap.get(section, {}).items()):
            flat[f"{section}.{name}"] = value if isinstance(value, (int, float)) else str(value)
    return flat
