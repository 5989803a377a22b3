"""``demo://`` — a deterministic in-process catalog reproducing the published experiments.

Tree::

    /README.txt
    /ls/files-{500,1000,3000,5000,6000,10000,50000}/file-NNNNNN.dat   4 KiB, content = number
    /datasets/O3{a,b}/{H1,L1,V1}/file-NNNNNN.dat           a container of datasets, 100 files each
    /big/frame-4509715660.gwf                              4,509,715,660 bytes, generated
    /faults/...                                            only with ?faults=1 (see FAULTS)

URL options: ``latency=20ms`` sleeps that long in every request but open (a network round
trip); ``page=1000`` lists in pages of that many entries, each page a request (as paged
catalogs such as S3 and iRODS do);
``faults=1`` adds ``/faults`` whose files fail in typed (and one untyped) ways, and makes
``statfs`` hang. The backend
counts its requests by kind (``counters()``) so tests can assert what an operation cost.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping
from typing import ClassVar
from urllib.parse import urlsplit

import trio

from rucio_fs.backend import Backend, Entry, FsUsage, Kind
from rucio_fs.errors import InvalidInput, NotADirectory, NotFound, PermissionDenied, Unavailable
from rucio_fs.options import parse_duration, url_options

from .content import (
    BIG_ADLER32,
    BIG_MD5,
    BIG_SIZE,
    CORRUPT_BIG_SIZE,
    SMALL_SIZE,
    big_file_range,
    corrupt_big_adler32,
    corrupt_big_range,
    small_file,
    small_file_adler32,
)

MTIME_NS = 1_554_076_800 * 10**9  # 2019-04-01T00:00:00Z, the start of O3
LS_SIZES = (500, 1000, 3000, 5000, 6000, 10000, 50000)  # RucioFS + NFSRODS sizes
DATASET_FILES = 100
BIG_NAME = f"frame-{BIG_SIZE}.gwf"
README = (b"rucio-fs demo catalog: a deterministic tree for trying and benchmarking rucio-fs.\n"
          b"ls/files-N      N files of 4 KiB whose content is the file number\n"
          b"datasets/       a container of datasets, like a Rucio scope\n"
          b"big/            one 4.2 GB file (> 4 GiB) with verifiable generated content\n")

#: name -> (what fails, the error). "crash" raises an untyped exception, as a buggy backend would.
FAULTS: Mapping[str, tuple[str, Callable[[], Exception]]] = {
    "eacces.dat": ("open", lambda: PermissionDenied("demo: permission denied (injected)")),
    "eio.dat": ("read", lambda: Unavailable("demo: storage unavailable (injected)")),
    "crash.dat": ("read", lambda: RuntimeError("demo: backend bug (injected)")),
    "broken-listing": ("list", lambda: Unavailable("demo: listing stream broken (injected)")),
    "hang.dat": ("read", lambda: _Hang()),
}
#: Listed with file 1's checksum, holds file 2's bytes: fails checksum verification.
CORRUPT = "corrupt.dat"
#: 24 MiB whose stored bytes differ from the catalog checksum in one byte past 20 MiB: a
#: partial read (``head``) succeeds, a whole read never does.
CORRUPT_BIG = "corrupt-big.dat"


class _Hang(Exception):
    """Not raised: makes the request hang, as a server that never answers."""


def _dir(name: str) -> Entry:
    return Entry(name=name, kind=Kind.DIR, mtime_ns=MTIME_NS)


def _small(n: int) -> Entry:
    adler = small_file_adler32(n)
    return Entry(name=f"file-{n:06d}.dat", kind=Kind.FILE, size=SMALL_SIZE, mtime_ns=MTIME_NS,
                 checksums={"adler32": adler}, immutable=True, version=adler,
                 metadata={"number": str(n)})


def _file(name: str, size: int, **checksums: str) -> Entry:
    return Entry(name=name, kind=Kind.FILE, size=size, mtime_ns=MTIME_NS, checksums=checksums,
                 immutable=True, version=checksums.get("adler32", ""))


def _file_number(name: str) -> int:
    if not (name.startswith("file-") and name.endswith(".dat") and name[5:-4].isdigit()):
        raise NotFound(name)
    return int(name[5:-4])


class DemoBackend(Backend):
    scheme: ClassVar[str] = "demo"
    description: ClassVar[str] = "deterministic demo catalog (no server): demo://[?latency=20ms]"

    def __init__(self, latency: float = 0.0, faults: bool = False, page: int = 0) -> None:
        self.latency = latency
        self.faults = faults
        self.page = page
        self.requests: Counter[str] = Counter()
        self._listings: dict[str, tuple[Entry, ...]] = {}

    @classmethod
    def from_url(cls, url: str) -> DemoBackend:
        parts = urlsplit(url)
        if parts.netloc or parts.path not in ("", "/"):
            raise InvalidInput(f"demo URL takes no host or path: {url!r} (use demo://)")
        options = url_options(parts.query, ("latency", "faults", "page"), cls.scheme)
        latency = parse_duration(options.get("latency", "0"))
        faults = options.get("faults", "").lower() in ("1", "true", "yes", "on")
        page = options.get("page", "0")
        if not page.isdigit():
            raise InvalidInput(f"demo option page={page!r}: expected a number of entries")
        return cls(latency, faults, int(page))

    async def _request(self, kind: str, round_trip: bool = True) -> None:
        self.requests[kind] += 1
        if self.latency and round_trip:
            await trio.sleep(self.latency)

    # -- the tree ----------------------------------------------------------------------------

    def _children(self, path: str) -> tuple[Entry, ...]:
        """All entries of directory ``path`` (memoised: the demo's "database")."""
        cached = self._listings.get(path)
        if cached is not None:
            return cached
        parts = [p for p in path.split("/") if p]
        if not parts:
            names = ["datasets", "ls", "big"] + (["faults"] if self.faults else [])
            entries = [_file("README.txt", len(README))] + [_dir(n) for n in names]
        elif parts == ["ls"]:
            entries = [_dir(f"files-{n}") for n in LS_SIZES]
        elif len(parts) == 2 and parts[0] == "ls" and parts[1] in {f"files-{n}" for n in LS_SIZES}:
            entries = [_small(n) for n in range(1, int(parts[1][6:]) + 1)]
        elif parts == ["datasets"]:
            entries = [_dir("O3a"), _dir("O3b")]
        elif len(parts) == 2 and parts[0] == "datasets" and parts[1] in ("O3a", "O3b"):
            entries = [_dir(d) for d in ("H1", "L1", "V1")]
        elif (len(parts) == 3 and parts[0] == "datasets" and parts[1] in ("O3a", "O3b")
              and parts[2] in ("H1", "L1", "V1")):
            entries = [_small(n) for n in range(1, DATASET_FILES + 1)]
        elif parts == ["big"]:
            entries = [_file(BIG_NAME, BIG_SIZE, adler32=BIG_ADLER32, md5=BIG_MD5)]
        elif parts == ["faults"] and self.faults:
            entries = [_file(n, SMALL_SIZE) if n.endswith(".dat") else _dir(n) for n in FAULTS]
            entries.append(_file(CORRUPT, SMALL_SIZE, adler32=small_file_adler32(1)))
            entries.append(_file(CORRUPT_BIG, CORRUPT_BIG_SIZE, adler32=corrupt_big_adler32()))
        else:
            self._entry(path)  # raises NotFound / NotADirectory as appropriate
            entries = []
        result = self._listings[path] = tuple(entries)
        return result

    def _entry(self, path: str) -> Entry:
        if path == "/":
            return _dir("")
        parent, _, name = path.rpartition("/")
        parent_entry = self._entry(parent or "/")
        if not parent_entry.is_dir:
            raise NotADirectory(path)
        for entry in self._children(parent or "/"):
            if entry.name == name:
                return entry
        raise NotFound(path)

    def _inject(self, path: str, operation: str) -> None:
        if self.faults and path.startswith("/faults/"):
            what, error = FAULTS.get(path[len("/faults/"):], ("", None))
            if what == operation and error is not None:
                raise error()

    # -- the Backend contract ------------------------------------------------------------

    async def stat(self, path: str) -> Entry:
        await self._request("stat")
        return self._entry(path)

    async def list(self, path: str) -> AsyncIterator[Entry]:
        await self._request("list")
        if not self._entry(path).is_dir:
            raise NotADirectory(path)
        entries = self._children(path)
        if self.faults and path == "/faults/broken-listing":
            entries = (_small(1), _small(2))
        for number, entry in enumerate(entries):
            if self.page and number and number % self.page == 0:
                await self._request("list_page")
            yield entry
        self._inject(path, "list")  # fails after some entries: a stream broken mid-way

    async def open(self, path: str, entry: Entry) -> str:
        # Counted but local, like opening an S3 object or a Rucio file with lazy replicas:
        # the first byte costs exactly the read's round trip.
        await self._request("open", round_trip=False)
        self._inject(path, "open")
        return path

    async def read(self, handle: str, offset: int, size: int) -> bytes:
        await self._request("read")
        try:
            self._inject(handle, "read")
        except _Hang:
            await trio.sleep_forever()
        self.requests["read_bytes"] += size
        if handle == f"/big/{BIG_NAME}":
            return big_file_range(offset, size)
        if handle == "/README.txt":
            return README[offset:offset + size]
        if handle == f"/faults/{CORRUPT_BIG}":
            return corrupt_big_range(offset, size)
        if handle == f"/faults/{CORRUPT}":
            return small_file(2)[offset:offset + size]
        return small_file(_file_number(handle.rpartition("/")[2]))[offset:offset + size]

    async def usage(self) -> FsUsage:
        if self.faults:  # with the faults tree, statfs hangs as a dead server would
            await trio.sleep_forever()
        total = sum(LS_SIZES) * SMALL_SIZE + 6 * DATASET_FILES * SMALL_SIZE + BIG_SIZE
        return FsUsage(total_bytes=total, free_bytes=0, files=sum(LS_SIZES) + 601)

    def shared_identity(self) -> str:
        return f"demo faults={int(self.faults)}"

    def counters(self) -> Mapping[str, int]:
        return dict(self.requests)
