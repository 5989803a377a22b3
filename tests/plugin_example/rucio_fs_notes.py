"""``notes://?n=3``: a catalog of n small text notes, kept in memory. The smallest complete
rucio-fs backend: a plugin author's starting point. ``test_notes.py`` beside it runs rucio-fs's
backend conformance suite against it (``pytest test_notes.py`` once it is installed)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from urllib.parse import urlsplit

from rucio_fs.backend import Backend, Entry, Kind
from rucio_fs.errors import InvalidInput, NotADirectory, NotFound
from rucio_fs.options import url_options


class NotesBackend(Backend):
    scheme = "notes"
    description = "in-memory notes (example plugin): notes://?n=3"

    def __init__(self, count: int) -> None:
        self.notes = {f"note-{i}.txt": f"note number {i}\n".encode() for i in range(count)}

    @classmethod
    def from_url(cls, url: str) -> NotesBackend:
        count = url_options(urlsplit(url).query, ("n",), cls.scheme).get("n", "3")
        if not count.isdigit():
            raise InvalidInput(f"notes: n must be a number, not {count!r}")
        return cls(int(count))

    def _entry(self, name: str) -> Entry:
        if name not in self.notes:
            raise NotFound(name)
        return Entry(name=name, kind=Kind.FILE, size=len(self.notes[name]), immutable=True)

    async def stat(self, path: str) -> Entry:
        return Entry(name="", kind=Kind.DIR) if path == "/" else self._entry(path[1:])

    async def list(self, path: str) -> AsyncIterator[Entry]:
        if path != "/":
            raise NotADirectory(path) if path[1:] in self.notes else NotFound(path)
        for name in self.notes:
            yield self._entry(name)

    async def open(self, path: str, entry: Entry) -> bytes:
        return self.notes[path[1:]]

    async def read(self, handle: bytes, offset: int, size: int) -> bytes:
        return handle[offset:offset + size]
