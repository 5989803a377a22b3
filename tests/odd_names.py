"""The odd names through a mount: each one has broken some file system client."""

from __future__ import annotations

from rucio_fs.testing.conformance import ODD_NAMES  # one list for mounts and backends


def check_round_trip(mounted, remount, stored) -> None:
    """Write every odd name through ``mounted`` (a path), list it, and read each back through
    a fresh mount (``remount()`` returns its path) and from the server (``stored(name)``)."""
    import os

    for name in ODD_NAMES:
        (mounted / name).write_bytes(name.encode())
    assert sorted(os.listdir(mounted)) == sorted(ODD_NAMES)
    fresh = remount()
    for name in ODD_NAMES:
        assert (fresh / name).read_bytes() == name.encode(), name
        assert stored(name) == name.encode(), name
