"""DIDs, and the path components that name them.

A child in its parent's scope appears under its name; a child from another scope as
``scope:name``. Rucio allows ``/`` in names, so in a path component ``%``, ``/`` and ``:``
appear as ``%25``, ``%2F`` and ``%3A``: every path names exactly one DID and every DID has
exactly one path under a given parent.
"""

from __future__ import annotations

import re
from typing import NamedTuple
from urllib.parse import quote

from rucio_fs.errors import NotFound

_ESCAPES = {"%": "%25", "/": "%2F", ":": "%3A"}
_ESCAPE_TABLE = str.maketrans(_ESCAPES)
_UNESCAPES = {v: k for k, v in _ESCAPES.items()}
_BAD_ESCAPE = re.compile(r"%(?!25|2F|3A)")


class Did(NamedTuple):
    scope: str
    name: str

    def __str__(self) -> str:
        return f"{self.scope}:{self.name}"

    def url(self) -> str:
        return f"/dids/{quote(self.scope, safe='')}/{quote(self.name, safe='')}"


def component_for(did: Did, parent_scope: str) -> str:
    """The path component naming ``did`` inside a directory of ``parent_scope``."""
    name = did.name
    if "%" in name or "/" in name or ":" in name:
        name = name.translate(_ESCAPE_TABLE)
    return name if did.scope == parent_scope else f"{did.scope}:{name}"


def did_for(component: str, parent_scope: str) -> Did:
    """The DID a path component names (the inverse of :func:`component_for`)."""
    scope, sep, name = component.partition(":")
    if not sep:
        scope, name = parent_scope, component
    if not scope or not name or _BAD_ESCAPE.search(name):
        raise NotFound(component)
    return Did(scope, re.sub(r"%(25|2F|3A)", lambda m: _UNESCAPES[m.group(0)], name))


__all__ = ["Did", "component_for", "did_for"]
