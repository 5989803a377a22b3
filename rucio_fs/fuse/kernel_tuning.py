"""Per-mount kernel settings raised after mounting (root only): the backing device's read-ahead
and the FUSE connection's queue depths. pyfuse3 negotiates neither at FUSE_INIT, so they are
written through sysfs, as gcsfuse does. What was found and what was set is reported in stats.

One setting is made at FUSE_INIT: parallel directory operations (see
:func:`ask_parallel_dirops`).
"""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path
from typing import Any

import pyfuse3

log = logging.getLogger(__name__)

FUSECTL = Path("/sys/fs/fuse/connections")

#: ``RUCIO_FS_PARALLEL_DIROPS=0`` leaves the kernel sending the lookups of one directory one at
#: a time. It exists only so that benchmarks/ can measure the difference.
PARALLEL_DIROPS = os.environ.get("RUCIO_FS_PARALLEL_DIROPS", "1") != "0"


def ask_parallel_dirops() -> None:
    """Before ``pyfuse3.init``: have FUSE_INIT tell the kernel that lookups and readdirs in one
    directory may run at once. libfuse wants this but, before 3.17, never says so, and the
    kernel then sends the lookups of a directory one after the other (ten cold ``cat``s of one
    dataset pay ten catalog round trips end to end). A pyfuse3 built with
    scripts/pyfuse3-kernel-io.patch (scripts/install.sh) says it; stock pyfuse3 cannot.
    """
    setter = getattr(pyfuse3, "set_parallel_dirops", None)
    if setter is not None:
        setter(PARALLEL_DIROPS)


def parallel_dirops() -> bool | None:
    """After FUSE_INIT: whether the kernel was told; None when this build cannot know (stock
    pyfuse3, or a libfuse from 3.17 on, which tells the kernel itself)."""
    state = getattr(pyfuse3, "parallel_dirops", None)
    return state() if state is not None else None


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
