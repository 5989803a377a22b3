"""What a mount learned of RSE layouts, kept for the next mounts: in a file of the mount's
``--cache-dir`` (this node's later mounts) and in the shared tier (every mount of the same
catalog). A mount that finds a snapshot younger than :data:`KEPT_TTL` neither lists nor
describes RSEs, and guesses on the RSEs it confirms from its first read on.

A snapshot holds RSE descriptions as the catalog gave them and which RSEs the catalog's
answers confirmed or contradicted: where to look, never what is there. A guessed read is
served only when its bytes match the file's own catalog checksums, so a stale, damaged or
foreign snapshot costs at most a missed guess.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

import trio

from rucio_fs.backend import SharedValues
from rucio_fs.kept_file import KeptFile

#: How long a snapshot is used (seconds): as long as a fetched RSE description.
KEPT_TTL = 3600.0
#: The shared tier's kind of value.
KIND = "rucio-layouts"


class KeptLayouts:
    """Where this mount's snapshot is read from and written to: a file and/or the shared
    tier (neither: nothing is kept). Failures of either are logged misses, never errors."""

    def __init__(self, identity: str) -> None:
        self.identity = identity
        self.file: Path | None = None
        self.shared: SharedValues | None = None

    def keep_in(self, directory: Path) -> None:
        digest = hashlib.sha256(self.identity.encode()).hexdigest()[:16]
        self.file = directory / f"layouts-{digest}.json"

    async def load(self) -> dict[str, Any] | None:
        """The newest snapshot younger than :data:`KEPT_TTL` (the file's, else the shared
        tier's), or None."""
        found = [s for s in (await trio.to_thread.run_sync(self._read_file),
                             await self._read_shared()) if _fresh(s)]
        return max(found, key=lambda s: s["saved"]) if found else None

    async def save(self, snapshot: dict[str, Any]) -> None:
        snapshot = {**snapshot, "identity": self.identity, "saved": time.time()}
        if self.file is not None:
            await trio.to_thread.run_sync(self._write_file, snapshot)
        if self.shared is not None:
            await self.shared.put(KIND, {self.identity: snapshot}, KEPT_TTL)

    def _read_file(self) -> dict[str, Any] | None:
        snapshot = KeptFile(self.file).read() if self.file is not None else None
        return snapshot if isinstance(snapshot, dict) and snapshot.get(
            "identity") == self.identity else None

    async def _read_shared(self) -> dict[str, Any] | None:
        if self.shared is None:
            return None
        snapshot = await self.shared.get(KIND, self.identity)
        return snapshot if isinstance(snapshot, dict) else None

    def _write_file(self, snapshot: dict[str, Any]) -> None:
        assert self.file is not None
        KeptFile(self.file).write(snapshot)


def _fresh(snapshot: dict[str, Any] | None) -> bool:
    if snapshot is None:
        return False
    saved = snapshot.get("saved")
    return isinstance(saved, int | float) and 0 <= time.time() - saved < KEPT_TTL
