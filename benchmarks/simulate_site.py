"""Past one machine, on paper: N nodes listing one cold directory at once, with and without the
shared tier — a discrete-event model fed with what one run of the ``mounts`` experiment measured.

    python benchmarks/simulate_site.py RESULTS_DIR [--nodes 1000] [--catalog-workers 2,16]

``RESULTS_DIR`` is a ``benchmarks/suite.py --experiments mounts`` result (its ``results.json``).
The model has three kinds of resources, each a processor-sharing server:

* the **catalog**: ``w`` workers (the test server runs gunicorn with 2); one content listing
  costs it ``L`` seconds of work (measured: one mount's cold ``ls -l`` minus its warm one);
* each **client**: the work of ``ls -l`` once the entries are in the daemon (measured: warm
  ``ls -l``, ``C``), plus, with the tier, reading the listing from Redis (measured: a fresh
  mount whose listing is in Redis, minus warm: ``R``);
* **Redis**: one thread; a follower's read of the listing costs it ``r`` (measured in the run),
  and every poll while it waits costs ``p`` (polls every 1, 2, 4, ... up to 10 ms).

On the test machine every one of them shares the same ``cpus`` cores (the catalog, Redis and
all the daemons ran on one machine): that is how the model is checked against the measured
1...N points (p95 within 25 % is the goal). At site scale each node has its own cores, the
catalog its ``w`` workers and Redis its thread: the model then predicts catalog listings and
p95 ``ls`` for ``--nodes`` nodes. Writes ``simulation.json``, ``simulation.md`` and
``simulation.png`` into RESULTS_DIR.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

POLLS = [0.001 * 2**k for k in range(4)]  # then every MAX_POLL
MAX_POLL = 0.01


@dataclass
class Job:
    work: float
    done: Callable[[float], None]
    kind: str = ""
    remaining: float = field(init=False)

    def __post_init__(self) -> None:
        self.remaining = self.work


class Pool:
    """A processor-sharing server: ``cores`` of capacity, each job at most at rate 1; at most
    ``limits[kind]`` jobs of a kind at once (the rest wait in FIFO order), e.g. the catalog's
    workers on a machine whose cores the clients share too."""

    def __init__(self, name: str, cores: float, limits: dict[str, int] | None = None) -> None:
        self.name, self.cores, self.limits = name, cores, limits or {}
        self.active: list[Job] = []
        self.waiting: dict[str, list[Job]] = {}

    def rate(self) -> float:
        return min(1.0, self.cores / len(self.active)) if self.active else 0.0

    def start(self, job: Job) -> None:
        limit = self.limits.get(job.kind)
        if limit is not None and sum(j.kind == job.kind for j in self.active) >= limit:
            self.waiting.setdefault(job.kind, []).append(job)
        else:
            self.active.append(job)

    def finished(self, job: Job) -> None:
        self.active.remove(job)
        queue = self.waiting.get(job.kind)
        if queue:
            self.active.append(queue.pop(0))


class Simulation:
    """Event-driven: jobs arrive at pools at given times, run under processor sharing, and
    their ``done`` callbacks may submit more jobs."""

    def __init__(self) -> None:
        self.now = 0.0
        self.pools: list[Pool] = []
        self._arrivals: list[tuple[float, int, Pool, Job]] = []
        self._seq = 0
        self._busy: set[Pool] = set()

    def pool(self, pool: Pool) -> Pool:
        self.pools.append(pool)
        return pool

    def submit(self, pool: Pool, work: float, done: Callable[[float], None],
               at: float | None = None, kind: str = "") -> None:
        self._seq += 1
        heapq.heappush(self._arrivals, (self.now if at is None else at, self._seq, pool,
                                        Job(max(work, 0.0), done, kind)))

    def run(self) -> None:
        while True:
            finish, finishing = math.inf, None
            busy = list(self._busy)
            for pool in busy:
                rate = pool.rate()
                for job in pool.active:
                    t = self.now + job.remaining / rate
                    if t < finish:
                        finish, finishing = t, (pool, job)
            arrival = self._arrivals[0][0] if self._arrivals else math.inf
            if finishing is None and arrival == math.inf:
                return
            step = min(finish, arrival)
            for pool in busy:
                rate = pool.rate()
                for job in pool.active:
                    job.remaining -= (step - self.now) * rate
            self.now = step
            if arrival <= finish:
                _, _, pool, job = heapq.heappop(self._arrivals)
                pool.start(job)
                self._busy.add(pool)
                continue
            assert finishing is not None
            pool, job = finishing
            pool.finished(job)
            if not pool.active:
                self._busy.discard(pool)
            job.done(self.now)


@dataclass
class Costs:
    """What the model is fed (seconds), all measured in one run of the mounts experiment."""

    listing: float     # L: the catalog's work for one content listing
    client: float      # C: ls -l once the entries are in the daemon
    redis_read: float  # R: a fresh mount reading the listing from Redis (its own side)
    redis_serve: float  # r: Redis's side of one follower's read of the whole listing
    redis_poll: float  # p: one poll


def simulate(nodes: int, shared: bool, costs: Costs, machine_cores: float | None,
             catalog_workers: int) -> list[float]:
    """Each node's ``ls`` time. ``machine_cores``: everything on one machine with that many
    cores (the test); None: every node, the catalog and Redis on their own hardware."""
    sim = Simulation()
    if machine_cores is not None:
        machine = sim.pool(Pool("machine", machine_cores, {"catalog": catalog_workers}))
        catalog = redis = machine

        def client_pool(_node: int) -> Pool:
            return machine
    else:
        catalog = sim.pool(Pool("catalog", catalog_workers, {"catalog": catalog_workers}))
        redis = sim.pool(Pool("redis", 1.0))
        own = [sim.pool(Pool(f"node{n}", 1.0)) for n in range(nodes)]

        def client_pool(node: int) -> Pool:
            return own[node]

    times = [0.0] * nodes

    def finish(node: int) -> Callable[[float], None]:
        def done(t: float) -> None:
            times[node] = t
        return done

    def then_client(node: int, extra: float = 0.0) -> Callable[[float], None]:
        return lambda t: sim.submit(client_pool(node), costs.client + extra, finish(node))

    if not shared:
        for node in range(nodes):
            sim.submit(catalog, costs.listing, then_client(node), kind="catalog")
        sim.run()
        return times

    listed = {"at": math.inf}

    def holder_listed(t: float) -> None:
        listed["at"] = t
        sim.submit(client_pool(0), costs.client, finish(0))
        for node in range(1, nodes):  # followers read what is published, then ls
            sim.submit(redis, costs.redis_serve, lambda _t, n=node: sim.submit(
                client_pool(n), costs.redis_read + costs.client, finish(n)))

    sim.submit(catalog, costs.listing, holder_listed, kind="catalog")
    # Followers poll Redis while the holder lists: 1, 2, 4, 8 ms, then every 10 ms.
    horizon = costs.listing
    for _node in range(1, nodes):
        t = 0.0
        for gap in _poll_gaps(horizon):
            t += gap
            sim.submit(redis, costs.redis_poll, lambda _t: None, at=t)
    sim.run()
    return times


def _poll_gaps(horizon: float) -> list[float]:
    gaps, t = [], 0.0
    for gap in POLLS:
        gaps.append(gap)
        t += gap
    while t < horizon:
        gaps.append(MAX_POLL)
        t += MAX_POLL
    return gaps


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(0.95 * len(ordered)) - 1))]


def costs_from(results: dict) -> tuple[Costs, list[dict], float]:
    exp = results["experiments"]
    single = exp["mounts_single"]
    median = {w: statistics.median(r["seconds"] for r in single if r["what"] == w)
              for w in {r["what"] for r in single}}
    warm = median["warm ls -l"]
    redis = exp.get("mounts_redis", [{}])[0]
    costs = Costs(listing=median["cold ls -l, tier off"] - warm, client=warm,
                  redis_read=max(0.0, median["fresh mount, listing in Redis"] - warm),
                  redis_serve=float(redis.get("read_s", 0.005)),
                  redis_poll=float(redis.get("poll_s", 0.0001)))
    return costs, exp["mounts"], float(results["machine"]["cpus"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--catalog-workers", default="2,16",
                    help="catalog workers at site scale, comma-separated (default 2,16)")
    args = ap.parse_args()
    path = args.results / "results.json"
    if not path.is_file():
        ap.error(f"{args.results}: no results.json (run benchmarks/suite.py --experiments mounts)")
    results = json.loads(path.read_text())
    if "mounts" not in results["experiments"]:
        ap.error(f"{args.results}: the run has no mounts experiment")
    try:
        workers = [int(w) for w in args.catalog_workers.split(",")]
    except ValueError:
        ap.error(f"--catalog-workers {args.catalog_workers!r}: expected numbers, e.g. 2,16")
    costs, measured, cpus = costs_from(results)
    server_workers = 2
    checks = []
    for row in measured:
        times = simulate(row["mounts"], row["shared"], costs, cpus, server_workers)
        predicted = p95(times)
        checks.append({"mounts": row["mounts"], "shared": row["shared"],
                       "measured_p95_s": row["p95_s"], "model_p95_s": predicted,
                       "error": predicted / row["p95_s"] - 1})
    scale = [n for n in (1, 10, 30, 100, 300, 1000, 3000) if n <= args.nodes]
    if args.nodes not in scale:
        scale.append(args.nodes)
    site = []
    for w in workers:
        for shared in (False, True):
            for n in scale:
                times = simulate(n, shared, costs, None, w)
                site.append({"nodes": n, "shared": shared, "catalog_workers": w,
                             "catalog_listings": 1 if shared else n,
                             "p50_s": statistics.median(times), "p95_s": p95(times)})
    out = {"costs": costs.__dict__, "validation": checks, "site": site}
    (args.results / "simulation.json").write_text(json.dumps(out, indent=1))
    _plot(args.results / "simulation.png", checks, site, measured)
    lines = ["# Site-scale model of the mounts experiment", "",
             "Fed with (s): " + ", ".join(f"{k} {v:.4f}" for k, v in costs.__dict__.items()),
             "", "## Validation against the measured points (same machine, same run)", "",
             "| mounts | shared tier | measured p95 s | model p95 s | error |",
             "|---:|---|---:|---:|---:|"]
    lines += [f"| {c['mounts']} | {'on' if c['shared'] else 'off'} | {c['measured_p95_s']:.3f} "
              f"| {c['model_p95_s']:.3f} | {100 * c['error']:+.0f} % |" for c in checks]
    worst = max(abs(c["error"]) for c in checks)
    lines += ["", f"Largest error: {100 * worst:.0f} % (goal: within 25 %).", "",
              f"## Prediction: up to {args.nodes} nodes, each with its own cores", "",
              "| nodes | catalog workers | shared tier | catalog listings | p50 s | p95 s |",
              "|---:|---:|---|---:|---:|---:|"]
    lines += [f"| {r['nodes']} | {r['catalog_workers']} | {'on' if r['shared'] else 'off'} | "
              f"{r['catalog_listings']} | {r['p50_s']:.3f} | {r['p95_s']:.3f} |" for r in site]
    (args.results / "simulation.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def _plot(path: Path, checks: list[dict], site: list[dict], measured: list[dict]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for shared in (False, True):
        label = "tier on" if shared else "tier off"
        rows = [c for c in checks if c["shared"] == shared]
        left.plot([c["mounts"] for c in rows], [c["measured_p95_s"] for c in rows], "o",
                  label=f"measured, {label}")
        left.plot([c["mounts"] for c in rows], [c["model_p95_s"] for c in rows], "-",
                  label=f"model, {label}")
        for w in sorted({r["catalog_workers"] for r in site}):
            rows = [r for r in site if r["shared"] == shared and r["catalog_workers"] == w]
            right.plot([r["nodes"] for r in rows], [r["p95_s"] for r in rows], marker="o",
                       label=f"{label}, {w} catalog workers")
    left.set(title="one machine: measured vs model", xlabel="mounts", ylabel="p95 ls -l (s)")
    right.set(title="site scale (model)", xlabel="nodes", ylabel="p95 ls -l (s)",
              xscale="log", yscale="log")
    for ax in (left, right):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
