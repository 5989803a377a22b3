"""Per-mount kernel settings raised after mounting (root only): the backing device's read-ahead
and the FUSE connection's queue depths. pyfuse3 negotiates neither at FUSE_INIT, so they are
written through sysfs, as gcsfuse does. What was found and what was set is reported in stats.
"""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

FUSECTL = Path("/sys/fs/fuse/connections")


def _set(path: Path, value: int) -> dict[str, Any]:
    try:
        before = int(path.read_text())
        if before != value:
            path.write_text(str(value))
        return {"was": before, "now": int(path.read_text())}
    except (OSError, ValueError) as exc:
        log.info("cannot set %s to %d: %s", path, value, exc)
        return {"error": str(exc)}


def tune(minor: int, read_ahead_kb: int, max_background: int) -> dict[str, Any]:
    """Apply the settings (0 leaves a setting at the kernel's default); returns what happened."""
    if minor < 0:
        return {}
    if os.geteuid() != 0:
        return {"tuning": "skipped (not root)"}
    report: dict[str, Any] = {}
    if read_ahead_kb:
        report["read_ahead_kb"] = _set(Path(f"/sys/class/bdi/0:{minor}/read_ahead_kb"),
                                       read_ahead_kb)
    if max_background:
        if not (FUSECTL / str(minor)).is_dir():
            subprocess.run(["mount", "-t", "fusectl", "none", str(FUSECTL)], capture_output=True)
        connection = FUSECTL / str(minor)
        report["max_background"] = _set(connection / "max_background", max_background)
        report["congestion_threshold"] = _set(connection / "congestion_threshold",
                                              max_background * 3 // 4)
    return report
