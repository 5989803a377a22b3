"""The core without a kernel: the one door (:class:`~rucio_fs.catalog.catalog.Catalog`) over
scripted backends and the memory reference backend, in-process. Every backend call is bounded,
counted and shared; a listing is complete or an error; a change made through the mount is
known to the caches without asking the backend again."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
import trio
from model_kernel import ScriptedBackend, ScriptedFile
from trio.testing import MockClock

from rucio_fs.backend import Entry, Kind
from rucio_fs.catalog.catalog import LOOKUP_LISTING_MAX, Catalog
from rucio_fs.config import MountConfig
from rucio_fs.errors import IntegrityError, NotFound, Unavailable
from rucio_fs.http import TokenAuth
from rucio_fs.observe.stats import Stats
from rucio_fs.registry import open_backend


def catalog_of(backend, makes_names: bool = False, **config) -> Catalog:
    catalog = Catalog(backend, MountConfig(**config), Stats())
    catalog.makes_names = makes_names
    return catalog


def errors(catalog: Catalog, call: str) -> dict[str, int]:
    return dict(catalog.stats.backend_call(call).errors)


class Hanging(ScriptedBackend):
    async def stat(self, path: str) -> Entry:
        await trio.sleep(math.inf)
        raise AssertionError("unreachable")


class Buggy(ScriptedBackend):
    async def stat(self, path: str) -> Entry:
        raise RuntimeError("a bug in the backend")


class Counting(ScriptedBackend):
    def __init__(self) -> None:
        super().__init__({"a.dat": ScriptedFile(b"a" * 100)})
        self.stats = 0

    async def stat(self, path: str) -> Entry:
        self.stats += 1
        await trio.sleep(0.05)
        return await super().stat(path)


class BreaksMidListing(ScriptedBackend):
    async def list(self, path: str) -> AsyncIterator[Entry]:
        yield Entry(name="first", kind=Kind.FILE)
        yield Entry(name="second", kind=Kind.FILE)
        raise Unavailable("the connection dropped mid-listing")


class ShortReads(ScriptedBackend):
    async def read(self, handle: str, offset: int, size: int) -> bytes:
        return (await super().read(handle, offset, size))[:-1]


def test_a_hanging_backend_call_is_unavailable_in_bounded_time_and_counted():
    catalog = catalog_of(Hanging({}), backend_timeout=0.2)

    async def main() -> None:
        with trio.fail_after(5), pytest.raises(Unavailable, match=r"timed out after 0\.2 s"):
            await catalog.stat("/x")

    trio.run(main)
    assert errors(catalog, "stat") == {"ETIMEDOUT": 1}


def test_a_backend_bug_becomes_eio_not_a_crash():
    catalog = catalog_of(Buggy({}))
    with pytest.raises(Unavailable, match="failed unexpectedly"):
        trio.run(catalog.stat, "/x")
    assert errors(catalog, "stat") == {"EIO": 1}


@pytest.mark.parametrize("coalescing", [True, False])
def test_concurrent_identical_calls_share_one_backend_call(coalescing):
    backend = Counting()
    catalog = catalog_of(backend, coalescing=coalescing, metadata=False)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(10):
                nursery.start_soon(catalog.stat, "/a.dat")

    trio.run(main)
    assert backend.stats == (1 if coalescing else 10)


def test_a_listing_that_breaks_midway_is_an_error_and_never_cached():
    catalog = catalog_of(BreaksMidListing({}))

    async def main() -> None:
        listing = await catalog.list("/")
        await listing.wait_beyond(len(listing) + 10)  # returns when it is done
        assert listing.done and isinstance(listing.error, Unavailable)
        assert catalog.listing.get("/") is None  # a partial listing is never served as whole

    trio.run(main)
    assert errors(catalog, "list") == {"EIO": 1}


def test_a_short_backend_read_is_an_integrity_error_never_a_short_file():
    backend = ShortReads({"f": ScriptedFile(b"x" * 5000)})
    catalog = catalog_of(backend)

    async def main() -> None:
        entry = await catalog.stat("/f")
        handle = await catalog.open("/f", entry)
        with pytest.raises(IntegrityError, match="returned 4999 of 5000 bytes"):
            await catalog.data_path.read("/f", entry, handle, 0, 5000)

    trio.run(main)


def test_changes_through_the_door_are_known_without_asking_again():
    backend = open_backend("memory://core-bookkeeping")
    catalog = catalog_of(backend)

    async def main() -> None:
        await catalog.list("/")
        await catalog.mkdir("/d")
        sent = await catalog.put("/d/f", b"content")
        catalog.note_entry("/d/f", await catalog.confirm("/d/f", sent))
        before = backend.requests
        assert (await catalog.stat("/d")).is_dir
        assert (await catalog.stat("/d/f")).size == 7
        assert "d" in (await catalog.list("/")).by_name
        assert backend.requests == before  # all from the caches the changes updated
        moved = await catalog.stat("/d")
        await catalog.rename("/d", "/e", moved)
        with pytest.raises(NotFound):
            await catalog.stat("/d/f")  # the old tree is forgotten
        assert (await catalog.stat("/e/f")).size == 7
        await catalog.unlink("/e/f")
        before = backend.requests
        with pytest.raises(NotFound):
            await catalog.stat("/e/f")  # a negative entry, from the change itself
        assert backend.requests == before

    trio.run(main)


class CountingToken(TokenAuth):
    def __init__(self) -> None:
        super().__init__()
        self.issued = 0

    def header(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    async def obtain(self, refused: bool) -> tuple[str, float]:
        self.issued += 1
        await trio.sleep(0.01)  # a login round trip
        return f"token-{self.issued}", math.inf


def test_requests_refused_together_renew_the_token_once():
    """Two requests sent with one token, both refused (401): one login, not two (the second
    refresh renewed the token the first had just obtained: an iRODS test saw 4 logins for 3)."""
    auth = CountingToken()

    async def main() -> None:
        sent = await auth.headers()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(auth.refresh, sent)
            await trio.sleep(0.02)  # the second 401 arrives after the first renewal
            nursery.start_soon(auth.refresh, sent)
        assert auth.token == "token-2"

    trio.run(main)
    assert auth.issued == 2  # the first login and one renewal


class CallLog(ScriptedBackend):
    """Logs each stat and listing; ``broken_listings`` makes every listing fail midway."""

    def __init__(self, names: list[str], broken_listings: bool = False) -> None:
        super().__init__({name: ScriptedFile(name.encode()) for name in names})
        self.calls: list[str] = []
        self.broken_listings = broken_listings

    async def stat(self, path: str) -> Entry:
        self.calls.append("stat")
        return await super().stat(path)

    async def list(self, path: str) -> AsyncIterator[Entry]:
        self.calls.append("list")
        async for entry in super().list(path):
            yield entry
            if self.broken_listings:
                raise Unavailable("the connection dropped mid-listing")


def test_after_a_lookup_miss_a_directory_is_listed_once_not_stat_per_name():
    """Creating names (cp -r, untar, mdtest) looks up one absent name after another: after the
    first miss, the directory is listed once and every later name, absent or present, is
    answered from that listing, with the same answers stat gives."""
    names = [f"f{i}" for i in range(20)]
    backend = CallLog(names)
    catalog = catalog_of(backend, makes_names=True)

    async def main() -> None:
        with pytest.raises(NotFound):
            await catalog.stat("/new0")
        assert backend.calls == ["stat"]
        for i in range(1, 10):
            with pytest.raises(NotFound):
                await catalog.stat(f"/new{i}")
        assert (await catalog.stat("/f7")).size == 2
        assert backend.calls == ["stat", "list"]

    trio.run(main)


class TwoLevels(CallLog):
    """``/d0`` … ``/d9``, each holding ``f0`` … ``f7``; logs each call with its path."""

    def __init__(self) -> None:
        super().__init__([])
        self.dirs = {f"d{i}": [f"f{j}" for j in range(8)] for i in range(10)}

    async def stat(self, path: str) -> Entry:
        self.calls.append(f"stat {path}")
        parent, _, name = path.rpartition("/")
        if (path == "/" or (parent == "" and name in self.dirs)):
            return Entry(name=name, kind=Kind.DIR)
        if name in self.dirs.get(parent[1:], ()):
            return Entry(name=name, kind=Kind.FILE, size=1)
        raise NotFound(path)

    async def list(self, path: str) -> AsyncIterator[Entry]:
        self.calls.append(f"list {path}")
        for name in self.dirs[path[1:]]:
            yield Entry(name=name, kind=Kind.FILE, size=1)


def test_once_names_are_being_made_a_new_directory_is_listed_not_stat_first():
    """mdtest and ``cp -r`` into an existing tree make names in one directory after another:
    after a miss in one, the first lookup in each other directory lists it (one request)
    rather than stat the name and then list (S3: three requests)."""
    backend = TwoLevels()
    catalog = catalog_of(backend, makes_names=True)

    async def main() -> None:
        with pytest.raises(NotFound):
            await catalog.stat("/d0/new")
        for i in range(1, 10):
            with pytest.raises(NotFound):
                await catalog.stat(f"/d{i}/new")
            assert (await catalog.stat(f"/d{i}/f3")).size == 1
        assert backend.calls == ["stat /d0/new"] + [f"list /d{i}" for i in range(1, 10)]
        catalog.drop(["metadata", "listing"])  # cold again: the first miss is a stat again
        backend.calls.clear()
        with pytest.raises(NotFound):
            await catalog.stat("/d5/new")
        assert backend.calls == ["stat /d5/new"]

    trio.run(main)


class Incomplete(TwoLevels):
    """:class:`TwoLevels` whose listings, like S3's, cannot carry the stored attributes: a
    listed entry is incomplete, and ``complete`` (one request) gives the stored mode."""

    async def list(self, path: str) -> AsyncIterator[Entry]:
        async for entry in super().list(path):
            yield replace(entry, complete=False)

    async def stat(self, path: str) -> Entry:
        return replace(await super().stat(path), mode=0o600)

    async def complete(self, path: str, listed: Entry) -> Entry:
        self.calls.append(f"complete {path}")
        return replace(listed, mode=0o600, complete=True)


def test_a_walk_lists_each_directory_once_and_completes_the_listed_names():
    """`rsync` into a tree that exists stats name after name, every one found: on a mount
    that creates names, the second uncached name of a directory lists it; each later name
    is answered from the listing, completed with one request where the listing could not
    carry its stored attributes, never a stat apiece. One name per directory (a path
    resolved) lists nothing."""
    backend = Incomplete()
    catalog = catalog_of(backend, makes_names=True)

    async def main() -> None:
        for i in range(3):
            assert (await catalog.stat(f"/d{i}/f0")).mode == 0o600
        assert backend.calls == [f"stat /d{i}/f0" for i in range(3)]
        backend.calls.clear()
        for name in ("f1", "f2", "f3"):
            assert (await catalog.stat(f"/d0/{name}")).mode == 0o600
        assert (await catalog.stat("/d0/f2")).mode == 0o600  # completed once, then cached
        assert backend.calls == ["list /d0", "complete /d0/f1", "complete /d0/f2",
                                 "complete /d0/f3"]

    trio.run(main)


class SlowComplete(Incomplete):
    """:class:`Incomplete` whose ``complete`` answers only once :attr:`answer` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.answer = trio.Event()

    async def complete(self, path: str, listed: Entry) -> Entry:
        await self.answer.wait()
        return await super().complete(path, listed)


def test_a_name_completed_ahead_never_hides_a_change_made_meanwhile():
    """A name of a walk completed in the background (``rsync``, ``git status``) whose answer
    comes after the mount changed that name (a write, a chmod) shows the change, never the
    older answer (``git status`` would miss the write)."""
    backend = SlowComplete()
    catalog = catalog_of(backend, makes_names=True)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            catalog.nursery = nursery
            await catalog.stat("/d0/f0")  # a path resolved: no walk yet
            # The next lookup walks: /d0 is listed, and the names after f1 completed ahead.
            nursery.start_soon(catalog.stat, "/d0/f1")
            await trio.testing.wait_all_tasks_blocked()
            written = Entry(name="f3", kind=Kind.FILE, size=99, mode=0o644)
            catalog.note_entry("/d0/f3", written)  # changed through the mount meanwhile
            backend.answer.set()
            await trio.testing.wait_all_tasks_blocked()
            assert (await catalog.stat("/d0/f3")).size == 99
            nursery.cancel_scope.cancel()

    trio.run(main)


#: Every path of :class:`Tree` in the order a walk (`rsync`) looks them up.
WALK = [f"/a{i}" + rest for i in range(4) for rest in
        ["", *[f"/b{j}" + leaf for j in range(4) for leaf in ["", *[f"/f{k}" for k in range(3)]]]]]


class Tree(CallLog):
    """``/a0`` … ``/a3``, each holding directories ``b0`` … ``b3``, each holding files ``f0`` …
    ``f2``; logs each call with its path."""

    NAMES = ([f"a{i}" for i in range(4)], [f"b{i}" for i in range(4)], [f"f{i}" for i in range(3)])

    def __init__(self) -> None:
        super().__init__([])

    async def stat(self, path: str) -> Entry:
        self.calls.append(f"stat {path}")
        parts = path.strip("/").split("/") if path != "/" else []
        if len(parts) > 3 or any(p not in self.NAMES[d] for d, p in enumerate(parts)):
            raise NotFound(path)
        return Entry(name=path.rpartition("/")[2],
                     kind=Kind.FILE if len(parts) == 3 else Kind.DIR, size=1)

    async def list(self, path: str) -> AsyncIterator[Entry]:
        self.calls.append(f"list {path}")
        depth = 0 if path == "/" else path.count("/")
        for name in self.NAMES[depth]:
            yield Entry(name=name, kind=Kind.FILE if depth == 2 else Kind.DIR, size=1)


def test_below_a_directory_listed_for_a_walk_each_directory_is_listed_at_its_first_lookup():
    """`rsync` into a tree that exists (a walk) stats path after path: once a directory was
    listed for the walk, the first lookup in each directory below it lists that directory,
    instead of a stat of the name and a listing at the second: one request per directory."""
    backend = Tree()
    catalog = catalog_of(backend, makes_names=True)

    async def main() -> None:
        for path in WALK:
            await catalog.stat(path)

    trio.run(main)
    # The first path costs a stat per level before any walk shows; then a listing each.
    assert backend.calls[:3] == ["stat /a0", "stat /a0/b0", "stat /a0/b0/f0"]
    directories = ["/", *[f"/a{i}" + b for i in range(4)
                          for b in ["", *[f"/b{j}" for j in range(4)]]]]
    assert sorted(backend.calls[3:]) == sorted(f"list {d}" for d in directories)


class MarkedTree(Tree):
    """:class:`Tree` whose listings, like S3's, cannot carry a directory's stored attributes
    (its marker's): a listed directory is completed with one request. Completing a
    directory waits (up to a minute) until its own listing has begun."""

    def __init__(self) -> None:
        super().__init__()
        self.listing_began: dict[str, trio.Event] = {}

    def began(self, path: str) -> trio.Event:
        return self.listing_began.setdefault(path, trio.Event())

    async def list(self, path: str) -> AsyncIterator[Entry]:
        self.began(path).set()
        async for entry in super().list(path):
            yield replace(entry, complete=not entry.is_dir)

    async def complete(self, path: str, listed: Entry) -> Entry:
        self.calls.append(f"complete {path}")
        with trio.move_on_after(60):
            await self.began(path).wait()
        self.calls.append(f"completed {path}")
        return replace(listed, complete=True)


def test_a_walk_lists_a_directory_while_its_attributes_are_asked():
    """`rsync` into a tree that exists looks up a directory (its attributes: the marker's
    HEAD on S3), then the names in it (its listing): during a walk the two requests are out
    at once, each directory still listed and completed once."""
    backend = MarkedTree()
    catalog = catalog_of(backend, makes_names=True)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            catalog.nursery = nursery
            await catalog.stat("/a0/b0/f0")  # a path resolved: no walk yet
            for path in WALK:
                await catalog.stat(path)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=MockClock(autojump_threshold=0))
    calls = backend.calls
    walked = [f"/a{i}" for i in range(1, 4)] + [
        f"/a{i}/b{j}" for i in range(4) for j in range(4) if (i, j) != (0, 0)]
    for directory in walked:
        # Its listing began while its completion waited (not a minute later, after it).
        assert calls.index(f"list {directory}") < calls.index(f"completed {directory}")
    listed = [c for c in calls if c.startswith("list ")]
    completed = [c for c in calls if c.startswith("complete ")]
    assert len(listed) == len(set(listed)) == 1 + 4 + 16
    assert len(completed) == len(set(completed)) == len(walked)


@pytest.mark.parametrize("case", ["listing layer off", "listing breaks", "too many entries",
                                  "read-only mount"])
def test_lookups_stat_each_name_when_the_listing_cannot_answer(case):
    """With the listing layer switched off, a listing that fails or has too many entries, or
    on a mount that creates no names, a miss changes nothing: each name is asked with stat
    (never answered from a partial listing), and a big directory is listed at most once."""
    backend = CallLog(["present"] + [f"f{i}" for i in range(LOOKUP_LISTING_MAX + 1)
                                     if case == "too many entries"],
                      broken_listings=case == "listing breaks")
    catalog = catalog_of(backend, makes_names=case != "read-only mount",
                         listing=case != "listing layer off")

    async def main() -> None:
        for name in ("gone0", "gone1", "gone2"):
            with pytest.raises(NotFound):
                await catalog.stat(f"/{name}")
        assert (await catalog.stat("/present")).size == len(b"present")
        stats = backend.calls.count("stat")
        assert stats == 4 and set(backend.calls) <= {"stat", "list"}
        assert backend.calls.count("list") == (case in ("listing breaks", "too many entries"))

    trio.run(main)
