"""The shared tier: one catalog's listings, stats and negative entries in Redis, for every
mount that names the same catalog identity (``--shared-cache redis://...``).

Promises (tested in ``tests/test_shared.py``; design in ``docs/shared.md``):

* **A listing served from the tier is complete.** A listing is a Redis list of chunks ended by
  a marker that carries the entry count; a reader that meets no marker, or a count that does
  not match, never finishes a listing from it.
* **Single flight across mounts.** The first mount that misses takes a *lease* (``SET NX PX``,
  renewed while it lists), lists from the backend and publishes chunk by chunk as the entries
  arrive; mounts that miss meanwhile stream those chunks. If the holder dies, the lease
  expires and a waiting mount takes over: it lists from the backend itself, keeps the entries
  it already had that the backend still names, and drops the others.
* **The tier can fail without the mount failing.** Every Redis call is bounded by
  ``shared_timeout`` and a failure opens a breaker (:mod:`rucio_fs.redis_client`): the mount
  then lists and stats straight from the backend, as without the tier.
* **Identities never mix, secrets never leave.** Keys start with the format version and the
  backend's :meth:`~rucio_fs.backend.Backend.shared_identity` (host, account or user, never a
  secret); values are entries as the backend listed them (names, sizes, times, checksums,
  versions, metadata), never tokens or URLs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

import orjson
import trio

from rucio_fs.backend import Entry, Kind
from rucio_fs.cache.caches import Listing
from rucio_fs.errors import Unavailable
from rucio_fs.observe.stats import Stats
from rucio_fs.redis_client import Redis, RedisDown

log = logging.getLogger(__name__)

#: Every key and value starts with this: a new layout gets a new prefix, never a misreading.
FORMAT = b"rfs1"
#: How long a lease lasts without renewal (a dead holder is replaced after at most this).
LEASE_SECONDS = 3.0
#: Most entries in one chunk, and how long the publisher gathers entries into one.
CHUNK_ENTRIES = 1000
GATHER_SECONDS = 0.005
#: Most chunks one read asks for (a short reply keeps every call within the tier's timeout).
READ_CHUNKS = 4
#: Longest pause between a follower's polls.
MAX_POLL = 0.01
#: Keys this mount remembers having written (for ``cache drop --layer shared``).
MAX_TRACKED_KEYS = 1_000_000

Sink = Callable[[Entry], None]

_CLAIM = """
local token = redis.call('GET', KEYS[1])
if token then return {'complete', token} end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then return {'lease', ARGV[1]} end
return {'follow', redis.call('GET', KEYS[2]) or ''}
"""
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
_DELETE_IF = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def encode_chunk(entries: Sequence[Entry]) -> dict[str, Any]:
    """Entries as columns, a list per attribute (10,000 Rucio entries: 4.6 ms to encode and
    write, 17 ms to parse and rebuild with orjson; a list per entry took twice as long)."""
    return {"name": [e.name for e in entries], "dir": [_KIND_CODES[e.kind] for e in entries],
            "size": [e.size for e in entries], "mtime": [e.mtime_ns for e in entries],
            "immutable": [int(e.immutable) for e in entries],
            "version": [e.version for e in entries], "mode": [e.mode for e in entries],
            "checksums": [e.checksums for e in entries],
            "metadata": [e.metadata for e in entries],
            "uid": [e.uid for e in entries], "gid": [e.gid for e in entries],
            "complete": [int(e.complete) for e in entries]}


def decode_chunk(columns: dict[str, Any]) -> list[Entry]:
    """The entries of :func:`encode_chunk`; ValueError, TypeError or KeyError when malformed."""
    unset = [None] * len(columns["name"])
    rows = zip(columns["name"], columns["dir"], columns["size"], columns["mtime"],
               columns["checksums"], columns["immutable"], columns["version"],
               columns["metadata"], columns["mode"], columns.get("uid", unset),
               columns.get("gid", unset), columns.get("complete", [1] * len(unset)),
               strict=True)
    kinds = _KINDS
    return [Entry(name, kinds[kind], size, mtime_ns, sums or {}, bool(immutable), version,
                  meta or {}, mode, uid, gid, bool(complete))
            for name, kind, size, mtime_ns, sums, immutable, version, meta, mode, uid, gid,
            complete in rows]


#: How a chunk's ``dir`` column names each kind (0 and 1: file and directory, as ever).
_KIND_CODES = {Kind.FILE: 0, Kind.DIR: 1, Kind.SYMLINK: 2}
_KINDS = {code: kind for kind, code in _KIND_CODES.items()}


def _dumps(value: Any) -> bytes:
    """``rfs1:`` and orjson's JSON; ``rfs1=`` and the json module's for what orjson cannot
    write exactly: names that are not UTF-8 (kept as surrogates, PEP 383) and integers past
    64 bits (orjson would read them back as floats)."""
    try:
        return FORMAT + b":" + orjson.dumps(value, default=dict)  # any Mapping as an object
    except TypeError:
        return FORMAT + b"=" + json.dumps(value, separators=(",", ":"), default=dict).encode()


def _loads(value: bytes | None) -> Any:
    """The decoded value; ``KeyError`` for a missing value or one of another format,
    ``ValueError`` for one that is not JSON."""
    if value is None or not value.startswith(FORMAT):
        raise KeyError(value)
    kind, text = value[len(FORMAT):len(FORMAT) + 1], value[len(FORMAT) + 1:]
    if kind == b":":
        return orjson.loads(text)
    if kind == b"=":
        return json.loads(text)
    raise KeyError(value)


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


class _Refill:
    """The sink of a listing that already holds entries from a publication that did not end:
    entries the backend names again are refreshed, new ones added, and at :meth:`finish` the
    ones the backend no longer names are removed (so nothing listed stays a phantom)."""

    def __init__(self, listing: Listing) -> None:
        self.listing = listing
        self.stale = set(listing.by_name)

    def add(self, entry: Entry) -> None:
        if entry.name in self.stale:
            self.stale.discard(entry.name)
            self.listing.upsert(entry)
        else:
            self.listing.add(entry)

    def finish(self) -> None:
        for name in self.stale:
            self.listing.remove(name)


class _Publication:
    """The lease holder's side of one listing: entries go to the local listing at once and
    to Redis in chunks (gathered for at most :data:`GATHER_SECONDS`) by :meth:`carry`, which
    runs in the background, renews the lease, and at the end marks the listing complete —
    or drops what it published when the backend listing failed or Redis did."""

    def __init__(self, tier: SharedTier, path: str, token: str, local: Sink,
                 ttl: float) -> None:
        self.tier = tier
        self.token = token
        self.pointer, self.lease = tier.key("list", path), tier.key("lease", path)
        self.chunks_key = tier.chunks_key(token, path)
        self.local = local
        self.ttl = ttl
        self.buffer: list[Entry] = []
        self.published = 0
        self.ok = True
        self.ended = False
        self.failed = False
        self._more = trio.Event()

    def add(self, entry: Entry) -> None:
        self.local(entry)
        self.buffer.append(entry)
        if len(self.buffer) == 1 or len(self.buffer) >= CHUNK_ENTRIES:
            self._more.set()

    def end(self, failed: bool = False) -> None:
        """The backend listing is over: complete, or (``failed``) not."""
        self.ended, self.failed = True, failed
        self._more.set()

    async def carry(self) -> None:
        tier = self.tier
        complete = False
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._renew)
                await self._flush_until_end()
                nursery.cancel_scope.cancel()
            if self.ok and not self.failed and self.ttl > 0:
                await tier.run(("RPUSH", self.chunks_key, _dumps({"end": self.published})),
                               ("PEXPIRE", self.chunks_key, _ms(self.ttl)),
                               ("SET", self.pointer, self.token, "PX", _ms(self.ttl)),
                               ("EVAL", _DELETE_IF, 1, self.lease, self.token))
                complete = True
                tier.counters["stores"] += 1
                tier.wrote(self.pointer)
        except RedisDown:
            pass
        finally:
            if not complete:  # failed, cancelled or Redis gone: let the next mount list
                with trio.CancelScope(shield=True), contextlib.suppress(RedisDown):
                    await tier.run(("DEL", self.chunks_key),
                                   ("EVAL", _DELETE_IF, 1, self.lease, self.token), force=True)

    async def _flush_until_end(self) -> None:
        keep = max(_ms(self.ttl), _ms(2 * LEASE_SECONDS))
        while True:
            await self._more.wait()
            if not self.ended and len(self.buffer) < CHUNK_ENTRIES:
                await trio.sleep(GATHER_SECONDS)
            self._more = trio.Event()
            rows, self.buffer = self.buffer, []
            if self.failed:
                return
            if rows and self.ok:
                chunks = [_dumps(encode_chunk(rows[i:i + CHUNK_ENTRIES]))
                          for i in range(0, len(rows), CHUNK_ENTRIES)]
                try:
                    await self.tier.run(("RPUSH", self.chunks_key, *chunks),
                                        ("PEXPIRE", self.chunks_key, keep))
                    self.published += len(rows)
                except RedisDown:
                    self.ok = False
            if self.ended and not self.buffer:
                return

    async def _renew(self) -> None:
        while self.ok:
            await trio.sleep(LEASE_SECONDS / 3)
            try:
                [renewed] = await self.tier.run(
                    ("EVAL", _RENEW, 1, self.lease, self.token, _ms(LEASE_SECONDS)))
            except RedisDown:
                renewed = 0
            if not renewed:
                self.ok = False  # another mount took over: stop publishing


class SharedTier:
    """The shared layer of one mount: see the module docstring for what it promises."""

    def __init__(self, redis: Redis, identity: str, stats: Stats) -> None:
        self.redis = redis
        self.identity = identity
        self.counters = stats.cache_layer("shared")
        self.counters["enabled"] = 1
        self._prefix = FORMAT + b"|" + quote(identity, safe=":/@=,").encode() + b"|"
        self._written: set[bytes] = set()

    def key(self, kind: str, path: str) -> bytes:
        return self._prefix + kind.encode() + b"|" + path.encode("utf-8", "surrogateescape")

    async def run(self, *commands: Any, force: bool = False) -> list[Any]:
        """Redis commands as one pipeline, counted; :class:`RedisDown` on any failure."""
        r, c = self.redis, self.counters
        before = (r.failures, r.bypassed, r.bytes_read, r.bytes_written)
        try:
            return await r.run(*commands, force=force)
        finally:
            c["errors"] += r.failures - before[0]
            c["bypassed"] += r.bypassed - before[1]
            c["bytes_read"] += r.bytes_read - before[2]
            c["bytes_written"] += r.bytes_written - before[3]

    def wrote(self, *keys: bytes) -> None:
        if len(self._written) < MAX_TRACKED_KEYS:
            self._written.update(keys)

    # -- stats and negative entries ------------------------------------------------------------

    async def get_entry(self, path: str) -> tuple[bool, Entry | None]:
        """``(True, entry)`` when the tier knows ``path`` (entry None: it does not exist),
        ``(False, None)`` on a miss or a failure."""
        try:
            [value] = await self.run(("GET", self.key("stat", path)))
            columns = _loads(value)
            entry = None if columns is None else decode_chunk(columns)[0]
        except (RedisDown, KeyError, ValueError, TypeError, AttributeError, IndexError):
            self.counters["misses"] += 1
            return False, None
        self.counters["hits"] += 1
        return True, entry

    async def put_entry(self, path: str, entry: Entry | None, ttl: float) -> None:
        """Publish what ``stat`` found at ``path`` (None: nothing) for ``ttl`` seconds."""
        key = self.key("stat", path)
        value = _dumps(None if entry is None else encode_chunk([entry]))
        try:
            await self.run(("SET", key, value, "PX", _ms(ttl)))
        except RedisDown:
            return
        self.counters["stores"] += 1
        self.wrote(key)

    async def forget(self, *paths: str, listings: tuple[str, ...] = ()) -> None:
        """Forget the stats of ``paths`` and the listings of ``listings`` (after a change made
        through this mount, so other mounts ask the backend rather than the tier)."""
        keys = [self.key("stat", p) for p in paths] + [self.key("list", p) for p in listings]
        if keys:
            with contextlib.suppress(RedisDown):
                await self.run(("DEL", *keys))

    # -- listings ------------------------------------------------------------------------------

    async def fill(self, path: str, listing: Listing,
                   list_backend: Callable[[Sink], Awaitable[None]], ttl: float,
                   timeout: float, nursery: trio.Nursery | None = None) -> None:
        """Fill ``listing`` with the complete listing of ``path``: from the tier, from the
        mount that holds its lease, or from ``list_backend`` (publishing it). Raises what
        ``list_backend`` raises; Redis failures only send it to the backend."""
        pointer, lease = self.key("list", path), self.key("lease", path)
        deadline = trio.current_time() + timeout
        while True:
            # Entries a publication that did not end gave us are reconciled, not added twice.
            refill = _Refill(listing) if listing.by_name else None
            sink = refill.add if refill is not None else listing.add
            token = secrets.token_hex(8)
            try:
                [[state, found]] = await self.run(
                    ("EVAL", _CLAIM, 2, pointer, lease, token, _ms(LEASE_SECONDS)))
            except RedisDown:
                break
            found = found.decode()
            if state == b"complete":
                if await self._read(found, path, sink, pointer):
                    self.counters["hits"] += 1
                    if refill is not None:
                        refill.finish()
                    return
            elif state == b"lease":
                self.counters["misses"] += 1
                await self._publish(path, found, listing, refill, list_backend, ttl, nursery)
                return
            elif not found:  # the lease ended between the script's two reads: claim again
                await trio.sleep(0.001)
            else:
                self.counters["lease_waits"] += 1
                try:
                    with trio.fail_at(deadline):
                        followed = await self._follow(path, found, sink, lease)
                except trio.TooSlowError:
                    raise Unavailable(f"listing {path}: the mount listing it for everyone did "
                                      f"not finish within {timeout:g} s") from None
                if followed:
                    if refill is not None:
                        refill.finish()
                    return
                self.counters["takeovers"] += 1
        # Redis failed: straight to the backend, as without the tier.
        await list_backend(sink)
        if refill is not None:
            refill.finish()

    def chunks_key(self, token: str, path: str) -> bytes:
        return self.key("chunks", token + "|" + path)

    def _consume(self, items: list[bytes], sink: Sink, seen: list[int]) -> bool | None:
        """Feed chunks to ``sink``; True at an end marker whose count matches, False at a
        broken one or a value it cannot read, None when the end is still to come. ``seen``
        counts the entries and chunks read so far."""
        for item in items:
            seen[1] += 1
            try:
                value = _loads(item)
                if "end" in value:
                    return value["end"] == seen[0]
                entries = decode_chunk(value)
            except (KeyError, ValueError, TypeError, AttributeError):
                return False
            for entry in entries:
                sink(entry)
            seen[0] += len(entries)
        return None

    async def _next_chunks(self, chunks_key: bytes, seen: list[int],
                           *also: Any) -> list[Any]:
        """The next chunks after the ``seen`` ones (at most :data:`READ_CHUNKS`), followed by
        the replies of ``also`` (commands sent in the same pipeline)."""
        return await self.run(("LRANGE", chunks_key, seen[1], seen[1] + READ_CHUNKS - 1),
                              *also)

    async def _read(self, token: str, path: str, sink: Sink, pointer: bytes) -> bool:
        """A completed listing, fed to ``sink`` once it proved complete; False (and the
        pointer forgotten) when its chunks are gone or do not end with a matching marker."""
        chunks_key = self.chunks_key(token, path)
        entries: list[Entry] = []
        seen = [0, 0]
        try:
            while True:
                [items] = await self._next_chunks(chunks_key, seen)
                done = self._consume(items, entries.append, seen)
                if done is not None or not items:
                    break
            if done:
                for entry in entries:
                    sink(entry)
                return True
            await self.run(("EVAL", _DELETE_IF, 1, pointer, token))
        except RedisDown:
            pass
        return False

    async def _follow(self, path: str, token: str, sink: Sink, lease: bytes) -> bool:
        """Stream the listing the lease holder publishes; False when it stopped without
        ending it (lease expired or released)."""
        chunks_key = self.chunks_key(token, path)
        seen = [0, 0]
        pause = 0.001
        try:
            while True:
                items, holder = await self._next_chunks(chunks_key, seen, ("GET", lease))
                done = self._consume(items, sink, seen)
                if done is not None:
                    return done
                if len(items) == READ_CHUNKS:
                    continue  # more may be there already
                if holder != token.encode():
                    # It may have ended between the two commands: read what is left.
                    while True:
                        [items] = await self._next_chunks(chunks_key, seen)
                        done = self._consume(items, sink, seen)
                        if done is not None or not items:
                            return bool(done)
                await trio.sleep(pause)
                pause = min(pause * 2, MAX_POLL)
        except RedisDown:
            return False

    async def _publish(self, path: str, token: str, listing: Listing, refill: _Refill | None,
                       list_backend: Callable[[Sink], Awaitable[None]], ttl: float,
                       nursery: trio.Nursery | None) -> None:
        """List from the backend as the lease holder; the publication goes on in ``nursery``
        (so this listing is done when the backend's is), else in line."""
        publication = _Publication(self, path, token,
                                   refill.add if refill is not None else listing.add, ttl)
        self.wrote(publication.chunks_key)
        async with trio.open_nursery() as local:
            (nursery or local).start_soon(publication.carry)
            try:
                await list_backend(publication.add)
            except BaseException:
                publication.end(failed=True)
                raise
            publication.end()
            if refill is not None:
                refill.finish()

    # -- values a backend shares (Backend.use_shared_values) -----------------------------------

    async def get(self, kind: str, key: str) -> Any | None:
        try:
            [value] = await self.run(("GET", self.key("value", f"{kind}|{key}")))
            found = _loads(value)
        except (RedisDown, KeyError, ValueError):
            self.counters["value_misses"] += 1
            return None
        self.counters["value_hits"] += 1
        return found

    async def put(self, kind: str, values: Mapping[str, Any], ttl: float) -> None:
        keys = {self.key("value", f"{kind}|{key}"): value for key, value in values.items()}
        if not keys:
            return
        try:
            await self.run(*(("SET", key, _dumps(value), "PX", _ms(ttl))
                             for key, value in keys.items()))
        except RedisDown:
            return
        self.counters["value_stores"] += len(keys)
        self.wrote(*keys)

    # -- cache drop ----------------------------------------------------------------------------

    async def forget_mine(self) -> int:
        """Delete every key this mount wrote (``cache drop --layer shared``); how many."""
        keys, self._written = list(self._written), set()
        deleted = 0
        for start in range(0, len(keys), 1000):
            try:
                [count] = await self.run(("DEL", *keys[start:start + 1000]))
            except RedisDown:
                break
            deleted += count
        self.counters["drops"] += 1
        return deleted

    async def aclose(self) -> None:
        await self.redis.aclose()

