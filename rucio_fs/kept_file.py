"""A JSON file a backend keeps what it learned in, for the next mounts (``--cache-dir``).

What is kept there only ever saves requests: a file that is missing, unreadable, damaged or
from another version is a logged miss, never an error, and it is replaced whole (written
beside it, then renamed over it), so a crash leaves the old file or the new one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class KeptFile:
    """One kept JSON value at ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> Any | None:
        """The kept value, or None (no file, or one that cannot be read)."""
        try:
            return json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.info("%s: not read (%s)", self.path, exc)
            return None

    def write(self, value: Any) -> None:
        """Replace the kept value with ``value`` (a failure is logged)."""
        temporary = self.path.with_suffix(f".{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            temporary.write_text(json.dumps(value, separators=(",", ":")))
            temporary.replace(self.path)
        except OSError as exc:
            log.info("%s: not written (%s)", self.path, exc)
            with contextlib.suppress(OSError):
                temporary.unlink()
