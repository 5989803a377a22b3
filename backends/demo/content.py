"""Deterministic content of the demo catalog, generated on the fly (nothing is stored).

Small files: file number ``n`` holds ``f"{n:07d}\\n"`` repeated 512 times (4096 bytes), so
``head -1`` shows its number. The big file is 64 KiB chunks, each a 16-byte header with its own
offset in hex followed by the same pseudo-random 65,520 bytes: any misplaced, shifted or
dropped range changes what a reader sees, yet generating it is a bytes join.
"""

from __future__ import annotations

import random
import zlib
from functools import lru_cache

SMALL_SIZE = 4096
BIG_SIZE = 4_509_715_660
#: Checksums of the big file, computed once with :func:`big_file_checksums` (takes ~10 s).
BIG_ADLER32 = "0c89ec6a"
BIG_MD5 = "2a674cbcf7681798296b6f993516ca8a"

CHUNK = 1 << 16
_HEADER = 16
_TAIL = random.Random(20190401).randbytes(CHUNK - _HEADER)


def small_file(n: int) -> bytes:
    return (f"{n:07d}\n" * (SMALL_SIZE // 8)).encode()


@lru_cache(maxsize=65536)
def small_file_adler32(n: int) -> str:
    return f"{zlib.adler32(small_file(n)):08x}"


def _chunk(index: int) -> bytes:
    return b"%016x" % (index * CHUNK) + _TAIL


def big_file_range(offset: int, size: int) -> bytes:
    """Bytes ``[offset, offset+size)`` of the big file, clamped to its end."""
    end = min(offset + size, BIG_SIZE)
    if offset >= end:
        return b""
    first, last = offset // CHUNK, (end - 1) // CHUNK
    blob = b"".join(_chunk(i) for i in range(first, last + 1))
    start = offset - first * CHUNK
    return blob[start:start + end - offset]


#: ``faults/corrupt-big.dat``: the big file's first 24 MiB, one byte flipped past 20 MiB.
CORRUPT_BIG_SIZE = 24 << 20
CORRUPT_BIG_FLIP = (20 << 20) + 12345


def corrupt_big_range(offset: int, size: int) -> bytes:
    """Bytes of ``faults/corrupt-big.dat`` as its storage holds them (one byte is wrong)."""
    end = min(offset + size, CORRUPT_BIG_SIZE)
    data = big_file_range(offset, end - offset) if offset < end else b""
    if offset <= CORRUPT_BIG_FLIP < end:
        flipped = bytearray(data)
        flipped[CORRUPT_BIG_FLIP - offset] ^= 0xFF
        data = bytes(flipped)
    return data


@lru_cache(maxsize=1)
def corrupt_big_adler32() -> str:
    """What the catalog says ``faults/corrupt-big.dat`` holds: the checksum of the unflipped
    bytes."""
    return f"{zlib.adler32(big_file_range(0, CORRUPT_BIG_SIZE)):08x}"


def big_file_checksums(step: int = 16 << 20) -> tuple[str, str]:
    """(adler32, md5) of the whole big file, computed from the generator."""
    import hashlib

    md5, adler = hashlib.md5(), 1
    for offset in range(0, BIG_SIZE, step):
        data = big_file_range(offset, step)
        md5.update(data)
        adler = zlib.adler32(data, adler)
    return f"{adler:08x}", md5.hexdigest()
