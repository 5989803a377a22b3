"""``notes://?n=3``: a catalog of n small text notes, kept in memory. The smallest complete
rucio-fs backend: a plugin author's starting point."""

from __future__ import annotations

from collections.abc import AsyncIterator
from urllib.parse import parse_qs, urlsplit

from rucio_fs.backend import Backend, Entry, Kind
from rucio_fs.errors import InvalidInput, NotADirectory, NotFound


class NotesBackend(Backend):
    scheme = "notes"
    description = "in-memory notes (example plugin): notes://?n=3"

    def __init__(self, count: int) -> None:
        self.notes = {f"note-{i}.txt": f"note number {i}\n".encode() for i in range(count)}

    @classmethod
    def from_url(cls, url: str) -> NotesBackend:
        values = parse_qs(urlsplit(url).query).get("n", ["3"])
        if not values[0].isdigit():
            raise InvalidInput(f"notes: n must be a number, not {values[0]!r}")
        return cls(int(values[0]))

    def _entry(self, name: str) -> Entry:
        if name not in self.notes:
            raise NotFound(name)
        return Entry(name=name, kind=Kind.FILE, size=len(self.notes[name]), immutable=True)

    async def stat(self, path: str) -> Entry:
        return Entry(name="", kind=Kind.DIR) if path == "/" else self._entry(path[1:])

    async def list(self, path: str) -> AsyncIterator[Entry]:
        if path != "/":
            raise NotADirectory(path)
        for name in self.notes:
            yield self._entry(name)

    async def open(self, path: str, entry: Entry) -> bytes:
        return self.notes[path[1:]]

    async def read(self, handle: bytes, offset: int, size: int) -> bytes:
        return handle[offset:offset + size]
