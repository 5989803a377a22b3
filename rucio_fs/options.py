"""Parsing what users type: a mount URL's ``?key=value`` options, durations and sizes.

Every backend and the command line parse through here, so ``20ms`` and ``256M`` mean the same
everywhere and a bad value is one :class:`~rucio_fs.errors.InvalidInput` line.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from rucio_fs.errors import InvalidInput

_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ns|us|ms|s|m|h|d)?\s*$")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0,
                   "d": 86400.0}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def url_option_values(query: str, known: tuple[str, ...],
                      scheme: str) -> dict[str, list[str]]:
    """Every value of each ``?key=value`` option of a mount URL, in order (a key may be
    given more than once); InvalidInput naming unknown ones."""
    from urllib.parse import parse_qsl

    options: dict[str, list[str]] = {}
    for key, value in parse_qsl(query, keep_blank_values=True):
        options.setdefault(key, []).append(value)
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise InvalidInput(f"unknown {scheme} option(s) {', '.join(unknown)} "
                           f"(known: {', '.join(known)})")
    return options


def url_options(query: str, known: tuple[str, ...], scheme: str) -> dict[str, str]:
    """The ``?key=value`` options of a mount URL (the last value of a repeated key);
    InvalidInput naming unknown ones."""
    return {key: values[-1] for key, values in url_option_values(query, known, scheme).items()}


def parse_duration(text: str) -> float:
    """``"20ms"`` → 0.02 seconds; a bare number is seconds. InvalidInput otherwise."""
    match = _DURATION.match(str(text))
    if not match:
        raise InvalidInput(f"invalid duration {text!r} (examples: 0, 1.5, 20ms, 5m, 30d)")
    return float(match.group(1)) * _DURATION_UNITS[match.group(2) or "s"]


def parse_size(text: str) -> int:
    """``"256M"``/``"256MiB"`` → bytes (binary units); a bare number is bytes."""
    match = _SIZE.match(str(text))
    if not match:
        raise InvalidInput(f"invalid size {text!r} (examples: 4096, 64K, 256M, 2G)")
    unit = (match.group(2) or "").lower().rstrip("b").rstrip("i")
    if unit not in _SIZE_UNITS:
        raise InvalidInput(f"invalid size unit in {text!r}")
    return int(float(match.group(1)) * _SIZE_UNITS[unit])


def without_password(url: str) -> str:
    """``url`` with the password of its user part replaced by ``***`` (for messages, logs and
    ``stats``)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=f"{parts.username}:***@{host}").geturl()
