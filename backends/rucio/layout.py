"""Where a file lies on a deterministic RSE, computed from its DID: Rucio's ``lfn2pfn``.

A deterministic RSE places every file at a path that follows from ``scope:name`` alone
(``hash``: ``scope/md5[0:2]/md5[2:4]/name``; ``identity``: ``scope/name``; ``user.*`` and
``group.*`` scopes become directories), under the prefix of one of its protocols. So a
reader can compute a PFN before the replica catalog has answered — a guess, never a proof:
the bytes read there count only once they match the catalog's checksum (see
:mod:`.speculation`).

An RSE is described by one ``GET /rses/{rse}`` (its ``deterministic`` flag, resolved
``lfn2pfn_algorithm``, type, read availability and protocols). A layout is used only when
every part of it is one this module knows to compute exactly as the server does; anything
else (a non-deterministic RSE, tape, a signed-URL RSE, an algorithm of a site's policy
package) gives no PFN at all.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rucio_fs.http import url_from_literal

#: The lfn2pfn algorithms computed here (Rucio's built-in ones without site code).
ALGORITHMS = ("hash", "identity")


def lfn2pfn_path(algorithm: str, scope: str, name: str) -> str | None:
    """The path of ``scope:name`` below a protocol's prefix (no leading ``/``), as Rucio's
    built-in algorithm computes it; None for an algorithm not computed here."""
    directory = scope.replace(".", "/") if scope.startswith(("user", "group")) else scope
    if algorithm == "identity":
        return f"{directory}/{name}"
    if algorithm == "hash":
        digest = hashlib.md5(f"{scope}:{name}".encode()).hexdigest()
        return f"{directory}/{digest[0:2]}/{digest[2:4]}/{name}"
    return None


@dataclass(frozen=True, slots=True)
class Protocol:
    scheme: str
    hostname: str
    port: int
    prefix: str
    #: The RSE's wan read priority for this protocol (1 is best; 0/None: not for reading).
    read_priority: int

    def pfn(self, path: str) -> str:
        """``scheme://host:port/prefix/path``, the way Rucio joins a protocol and a path
        (the prefix always between two slashes)."""
        prefix = self.prefix if self.prefix.startswith("/") else "/" + self.prefix
        prefix = prefix if prefix.endswith("/") else prefix + "/"
        return f"{self.scheme}://{self.hostname}:{self.port}{prefix}{path}"


@dataclass(frozen=True, slots=True)
class RseDescription:
    """What ``GET /rses/{rse}`` says about one RSE, as far as computing PFNs goes."""

    rse: str
    deterministic: bool
    algorithm: str
    readable: bool
    protocols: tuple[Protocol, ...]
    #: Why no PFN can be computed here ("" when one can).
    refusal: str = ""

    @classmethod
    def parse(cls, rse: str, info: Mapping[str, Any]) -> RseDescription:
        protocols = []
        for p in info.get("protocols") or ():
            try:
                domains = p.get("domains") or {}
                priority = int((domains.get("wan") or {}).get("read") or 0)
                protocols.append(Protocol(str(p["scheme"]), str(p["hostname"]), int(p["port"]),
                                          str(p.get("prefix") or "/"), priority))
            except (KeyError, TypeError, ValueError):
                continue
        deterministic = info.get("deterministic") is True
        algorithm = str(info.get("lfn2pfn_algorithm") or "")
        readable = info.get("availability_read", True) is not False
        refusal = ""
        if not deterministic:
            refusal = "not deterministic"
        elif algorithm not in ALGORITHMS:
            refusal = f"lfn2pfn algorithm {algorithm or '(none)'!r} is not computed here"
        elif str(info.get("rse_type") or "DISK").upper() != "DISK":
            refusal = "not a disk RSE"  # a read from tape could ask for a recall
        elif info.get("sign_url"):
            refusal = "its URLs must be signed"
        elif not readable:
            refusal = "not available for reading"
        return cls(rse, deterministic, algorithm, readable, tuple(protocols), refusal)

    def pfn(self, scope: str, name: str, schemes: Sequence[str]) -> str | None:
        """The PFN of ``scope:name`` in the best readable protocol (``schemes`` order, then
        the RSE's read priority), or None when no PFN can be computed."""
        if self.refusal:
            return None
        path = lfn2pfn_path(self.algorithm, scope, name)
        usable = [p for p in self.protocols if p.read_priority > 0 and p.scheme in schemes]
        if path is None or not usable:
            return None
        best = min(usable, key=lambda p: (schemes.index(p.scheme), p.read_priority))
        return best.pfn(path)

    def pfns(self, scope: str, name: str) -> set[str]:
        """Every PFN of ``scope:name`` this RSE's protocols give (to check a catalog's)."""
        path = None if self.refusal else lfn2pfn_path(self.algorithm, scope, name)
        return {p.pfn(path) for p in self.protocols} if path is not None else set()


def pfn_url(pfn: str) -> str:
    """The URL a PFN is read and written at: ``davs``/``dav`` are WebDAV over https/http, and
    PFNs are literal (a name's space or ``%`` is not encoded in them), so the URL is
    encoded here."""
    if pfn.startswith(("root://", "roots://")):
        return pfn  # XRootD takes the path as it is
    if pfn.startswith("davs://"):
        pfn = "https://" + pfn[len("davs://"):]
    elif pfn.startswith("dav://"):
        pfn = "http://" + pfn[len("dav://"):]
    return url_from_literal(pfn)
