"""Mounts' statistics in the Prometheus text format, through prometheus_client.

One collector turns stats snapshots (see :mod:`rucio_fs.observe.stats`) into metric families: it
renders one mount for ``rucio-fs stats --format prometheus``, and every rucio-fs mount of the
machine, labelled ``mount``, for ``rucio-fs stats --serve HOST:PORT`` (asked on each scrape
through each mount's control channel; a mount that does not answer is ``rucio_fs_up 0``).
Latency histograms keep the log2 bins of the snapshot (bucket ``le`` = 2^k ns), the
non-empty ones: a cumulative bucket of an empty bin says nothing its neighbour does not.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from rucio_fs.errors import InvalidInput, RucioFsError
from rucio_fs.observe import control

from .mounts import FSTYPE, read_mounts

#: ``() -> [(labels, snapshot or None)]``: the snapshots to show, each with its labels.
Snapshots = Callable[[], Iterable[tuple[dict[str, str], Mapping[str, Any] | None]]]


class SnapshotCollector:
    """A prometheus_client collector over stats snapshots; ``label_names`` name the labels
    each snapshot comes with (``("mount",)`` for the exporter, none for one mount)."""

    def __init__(self, snapshots: Snapshots, label_names: tuple[str, ...] = ()) -> None:
        self.snapshots = snapshots
        self.label_names = label_names

    def collect(self) -> Iterator[Metric]:
        names = list(self.label_names)
        up = GaugeMetricFamily("rucio_fs_up", "Whether the mount's daemon answered", labels=names)
        latency = {section: HistogramMetricFamily(
            f"rucio_fs_{section}_latency_seconds", f"Latency of {section} operations",
            labels=[*names, "op"]) for section in ("fuse", "backend")}
        errors = {section: CounterMetricFamily(
            f"rucio_fs_{section}_errors", f"Failed {section} operations by errno",
            labels=[*names, "op", "errno"]) for section in ("fuse", "backend")}
        sizes = {section: CounterMetricFamily(
            f"rucio_fs_{section}_bytes", f"Bytes moved by {section} operations",
            labels=[*names, "op"]) for section in ("fuse", "backend")}
        peaks = {section: GaugeMetricFamily(
            f"rucio_fs_{section}_at_once_max", f"Most {section} operations under way at once",
            labels=[*names, "op"]) for section in ("fuse", "backend")}
        cache = CounterMetricFamily("rucio_fs_cache_events", "Cache layer events",
                                    labels=[*names, "layer", "event"])
        coalesced = CounterMetricFamily("rucio_fs_coalesced_calls",
                                        "Backend calls shared by concurrent callers",
                                        labels=[*names, "call"])
        backend = CounterMetricFamily("rucio_fs_backend_events", "The backend's own counters",
                                      labels=[*names, "name"])
        identities = CounterMetricFamily("rucio_fs_identity_events",
                                         "Per-user mounts: requests, refusals, catalogs by uid",
                                         labels=[*names, "uid", "event"])
        for labels, snap in self.snapshots():
            values = [labels[n] for n in names]
            up.add_metric(values, 0 if snap is None else 1)
            if snap is None:
                continue
            for section in ("fuse", "backend"):
                for op, data in snap.get(section, {}).items():
                    hist = data["latency"]
                    buckets, cumulative = [], 0
                    for k, n in enumerate(hist["bins"]):
                        cumulative += n
                        if n:  # empty bins add nothing a cumulative bucket does not say
                            buckets.append((f"{(1 << k) / 1e9:.9g}", cumulative))
                    buckets.append(("+Inf", hist["count"]))
                    latency[section].add_metric([*values, op], buckets,
                                                hist["total_ns"] / 1e9)
                    for err, n in sorted(data["errors"].items()):
                        errors[section].add_metric([*values, op, err], n)
                    if data.get("bytes"):
                        sizes[section].add_metric([*values, op], data["bytes"])
                    if data.get("peak"):
                        peaks[section].add_metric([*values, op], data["peak"])
            for layer, counters in snap.get("cache", {}).items():
                for event, n in sorted(counters.items()):
                    cache.add_metric([*values, layer, event], n)
            for call, n in sorted(snap.get("coalesced", {}).items()):
                coalesced.add_metric([*values, call], n)
            for name, n in sorted((snap.get("backend_counters") or {}).items()):
                backend.add_metric([*values, name], n)
            for uid, counters in (snap.get("identities") or {}).items():
                for event, n in sorted(counters.items()):
                    identities.add_metric([*values, uid, event], n)
        yield up
        yield from latency.values()
        yield from errors.values()
        yield from sizes.values()
        yield from peaks.values()
        yield from (cache, coalesced, backend, identities)


def render(snap: Mapping[str, Any]) -> str:
    """One mount's snapshot in the Prometheus text format."""
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(lambda: [({}, snap)]))  # type: ignore[arg-type]
    return generate_latest(registry).decode()


def every_mount() -> list[tuple[dict[str, str], Mapping[str, Any] | None]]:
    """Every rucio-fs mount of this machine with its snapshot (None: it did not answer)."""
    found = []
    for mount in read_mounts():
        if mount.fstype != FSTYPE:
            continue
        try:
            snap = control.request(mount.mountpoint, "stats")
        except (RucioFsError, OSError):
            snap = None
        found.append(({"mount": mount.mountpoint}, snap))
    return found


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6); InvalidInput with a one-line reason."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidInput(f"--serve {text!r}: expected HOST:PORT, e.g. 127.0.0.1:9108")
    return host, int(port)


def serve(address: str, announce: Callable[[str], None]) -> None:
    """Serve every mount's metrics at ``http://ADDRESS/metrics`` until SIGINT or SIGTERM."""
    host, port = parse_address(address)
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(every_mount, ("mount",)))  # type: ignore[arg-type]
    stop = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)  # the server's threads never take them
    try:
        server, _ = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise InvalidInput(f"--serve {address}: {exc.strerror or exc}") from None
    announce(f"serving the metrics of every rucio-fs mount on http://{host}:{port}/metrics")
    try:
        signal.sigwait(stop)
    finally:
        server.shutdown()
        server.server_close()
