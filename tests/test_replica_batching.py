"""Replica resolution in shared batches, in-process with a scripted catalog: the batch limit,
and followers surviving a leader that goes away. (The mount-level behaviour is tested
against the real server in test_rucio.py.)"""

from __future__ import annotations

import trio
from rucio_fs.backends.rucio.names import Did
from rucio_fs.backends.rucio.replicas import ReplicaResolver
from rucio_fs.backends.rucio.settings import MAX_DIDS_PER_REQUEST, RucioSettings

SETTINGS = RucioSettings(rucio_host="http://x", auth_host="http://x", account="a",
                         auth_type="token", schemes=("http",))


class ScriptedCatalog:
    """Answers ``POST /replicas/list`` like Rucio, after ``delay``, recording each batch."""

    def __init__(self, delay: float = 0.01) -> None:
        self.delay = delay
        self.batches: list[int] = []

    async def ndjson(self, method: str, path: str, *, json: dict, what: str = ""):
        self.batches.append(len(json["dids"]))
        await trio.sleep(self.delay)
        for did in json["dids"]:
            pfn = f"http://storage/{did['scope']}/{did['name']}"
            yield {"scope": did["scope"], "name": did["name"],
                   "pfns": {pfn: {"rse": "DAV", "priority": 1}}}


def test_concurrent_opens_share_requests_of_at_most_1000_dids():
    catalog = ScriptedCatalog()
    resolver = ReplicaResolver(catalog, SETTINGS)  # type: ignore[arg-type]
    results: dict[Did, str] = {}

    async def resolve(did: Did) -> None:
        results[did] = (await resolver.resolve(did))[0].url

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for i in range(2500):
                nursery.start_soon(resolve, Did("s", f"f{i}"))

    trio.run(main)
    assert len(results) == 2500
    assert all(url == f"http://storage/s/{did.name}" for did, url in results.items())
    assert max(catalog.batches) == MAX_DIDS_PER_REQUEST
    assert sum(catalog.batches) == 2500 and len(catalog.batches) <= 4


def test_followers_are_served_when_the_leader_is_cancelled():
    catalog = ScriptedCatalog(delay=0.2)
    resolver = ReplicaResolver(catalog, SETTINGS)  # type: ignore[arg-type]
    got: list[str] = []

    async def follower(name: str) -> None:
        got.append((await resolver.resolve(Did("s", name)))[0].url)

    async def main() -> None:
        leader_scope = trio.CancelScope()

        async def leader() -> None:
            with leader_scope:
                await resolver.resolve(Did("s", "lead"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(leader)
            await trio.sleep(0.05)  # the leader's request is on its way
            nursery.start_soon(follower, "lead")
            nursery.start_soon(follower, "other")
            await trio.sleep(0.05)
            leader_scope.cancel()

    trio.run(main)
    assert sorted(got) == ["http://storage/s/lead", "http://storage/s/other"]


def test_a_did_asked_for_while_its_request_is_under_way_waits_for_that_answer():
    catalog = ScriptedCatalog(delay=0.2)
    resolver = ReplicaResolver(catalog, SETTINGS)  # type: ignore[arg-type]
    got: list[str] = []

    async def resolve() -> None:
        got.append((await resolver.resolve(Did("s", "same")))[0].url)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(resolve)
            await trio.sleep(0.05)  # the first request is under way
            nursery.start_soon(resolve)

    trio.run(main)
    assert got == ["http://storage/s/same"] * 2
    assert catalog.batches == [1]  # asked once, not once per caller
