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
