"""The odd names every backend is tested with: each one has broken some file system client."""

from __future__ import annotations

ODD_NAMES = [
    "with space.dat",
    "unicod\u00e9-\u6587.dat",
    "100%.dat",
    "50%25.dat",
    "tab\there.dat",
    "-leading-dash.dat",
    "back\\slash.dat",
    "plus+and&amp;?q=1#frag.dat",
    "L" * 246 + ".dat",  # 250 bytes
]


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
