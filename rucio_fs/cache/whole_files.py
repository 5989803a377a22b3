"""Whole files of the disk layer: a file read whole and verified, kept as one plain file
whose bytes are the file's bytes and nothing else, so that the kernel may read it itself
(FUSE passthrough, :mod:`rucio_fs.fuse.passthrough`).

Layout, under the disk layer's directory: ``whole/<digest>`` holds the bytes;
``whole/<digest>.meta`` (JSON) holds the digest, the size and block size, the CRC-32 of each
block, the checksums the file was verified against when it was sealed (empty when the catalog
gave none), and the data file's *identity* when it was sealed: inode, size, modification and
change times. A data file without its record, or a record without its data file, is
deleted when the layer is loaded.

Promises:

* The daemon serves a block of a whole file only if its CRC matches the record.
* :func:`check` lets the kernel have a whole file only if its identity is the one
  recorded — nothing wrote it through the file system since it was sealed, which changes its
  change time — or, when it is not, every block's CRC matches again (the identity is then
  recorded anew). The kernel's passthrough reads are not checked block by block: what was
  sealed is protected from then on by the local file system, as any local file is.
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

#: The record format.
FORMAT = 1


class Digest(Protocol):
    """A running hash (hashlib's interface)."""

    def update(self, data: bytes, /) -> None: ...

    def hexdigest(self) -> str: ...


def normal_checksums(checksums: Mapping[str, str]) -> dict[str, str]:
    """Checksums as compared: lower case, adler32 as 8 hex digits, empty values left out."""
    return {name: value.lower().zfill(8) if name == "adler32" else value.lower()
            for name, value in checksums.items() if value}


@dataclass(slots=True)
class WholeFile:
    """The record of one whole file."""

    digest: bytes
    size: int
    block_size: int
    #: CRC-32 of each block, in order.
    crcs: list[int]
    #: The checksums the file was verified against (algorithm -> value), maybe none.
    checksums: dict[str, str]
    #: ``(st_ino, st_size, st_mtime_ns, st_ctime_ns)`` of the data file when last checked.
    identity: tuple[int, int, int, int]

    @property
    def blocks(self) -> int:
        return len(self.crcs)

    def covers(self, checksums: Mapping[str, str]) -> bool:
        """Whether the file's content is what ``checksums`` (the catalog's, now) name: it
        gives none, or the record was verified against one of them and holds no other
        value for any of them."""
        given = normal_checksums(checksums)
        if not given:
            return True
        shared = [name for name in given if name in self.checksums]
        return bool(shared) and all(self.checksums[name] == given[name] for name in shared)

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, "digest": self.digest.hex(), "size": self.size,
                           "block_size": self.block_size, "crcs": self.crcs,
                           "checksums": self.checksums, "identity": list(self.identity)})

    @classmethod
    def from_json(cls, text: str) -> WholeFile:
        """The record in ``text``; ValueError (or KeyError, TypeError) when it is not one."""
        raw = json.loads(text)
        if raw["format"] != FORMAT:
            raise ValueError("unknown format")
        identity = tuple(int(n) for n in raw["identity"])
        if len(identity) != 4:
            raise ValueError("identity")
        record = cls(bytes.fromhex(raw["digest"]), int(raw["size"]), int(raw["block_size"]),
                     [int(c) for c in raw["crcs"]],
                     {str(k): str(v) for k, v in raw["checksums"].items()},
                     identity)  # type: ignore[arg-type]
        if record.blocks != -(-record.size // record.block_size):
            raise ValueError("block count")
        return record


def identity_of(file: Path | str) -> tuple[int, int, int, int]:
    st = os.stat(file)
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def data_file(directory: Path, digest: bytes) -> Path:
    return directory / digest.hex()


def record_file(directory: Path, digest: bytes) -> Path:
    return directory / f"{digest.hex()}.meta"


def write_record(directory: Path, record: WholeFile) -> int:
    """Write ``record`` atomically; its size in bytes."""
    text = record.to_json().encode()
    target = record_file(directory, record.digest)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_bytes(text)
    os.replace(tmp, target)
    return len(text)


def load(directory: Path) -> Iterable[tuple[int, WholeFile, int]]:
    """The sound whole files in ``directory`` as ``(last access ns, record, bytes on disk)``;
    everything else there (leftovers of an interrupted seal, a record without its data or
    the other way round, a record that does not match its data file's size) is deleted."""
    if not directory.is_dir():
        return []
    found = []
    names = {p.name for p in directory.iterdir()}
    for name in names:
        path = directory / name
        if name.endswith(".tmp"):
            path.unlink(missing_ok=True)
            continue
        if name.endswith(".meta"):
            if name[:-5] not in names:
                path.unlink(missing_ok=True)
            continue
        record = _sound_record(directory, name)
        if record is None:
            path.unlink(missing_ok=True)
            (directory / f"{name}.meta").unlink(missing_ok=True)
            continue
        st = path.stat()
        meta_size = (directory / f"{name}.meta").stat().st_size
        found.append((st.st_atime_ns, record, st.st_size + meta_size))
    return found


def _sound_record(directory: Path, name: str) -> WholeFile | None:
    try:
        record = WholeFile.from_json((directory / f"{name}.meta").read_text())
        size = (directory / name).stat().st_size
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if record.digest.hex() != name or record.size != size:
        return None
    return record


def read_block(directory: Path, record: WholeFile, index: int) -> bytes | None:
    """Block ``index`` if its CRC matches the record, else None."""
    offset = index * record.block_size
    length = min(record.block_size, record.size - offset)
    try:
        with open(data_file(directory, record.digest), "rb") as f:
            data = os.pread(f.fileno(), length, offset)
    except OSError:
        return None
    if len(data) != length or zlib.crc32(data) != record.crcs[index]:
        return None
    return data


def check(directory: Path, record: WholeFile) -> bool:
    """Whether the kernel may read the data file itself (see the module's promises); a
    file checked again whose blocks all match gets its new identity recorded."""
    file = data_file(directory, record.digest)
    try:
        if identity_of(file) == record.identity:
            return True
        with open(file, "rb") as f:
            for index, crc in enumerate(record.crcs):
                length = min(record.block_size, record.size - index * record.block_size)
                data = f.read(length)
                if len(data) != length or zlib.crc32(data) != crc:
                    return False
            if f.read(1):
                return False
        record.identity = identity_of(file)
        write_record(directory, record)
    except OSError:
        return False
    return True
