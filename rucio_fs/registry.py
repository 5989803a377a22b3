"""Backend discovery through the ``rucio_fs.backends`` entry-point group (fsspec-style).

The built-in backends register in this package's own metadata exactly as a third-party plugin
does in its own, so there is one way in: ``name = "package.module:BackendClass"`` where the
entry-point name is the URL scheme.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points
from urllib.parse import urlsplit

from rucio_fs.backend import Backend
from rucio_fs.errors import InvalidInput

GROUP = "rucio_fs.backends"


def available() -> dict[str, EntryPoint]:
    """Installed backends by scheme (the first registration of a scheme wins)."""
    found: dict[str, EntryPoint] = {}
    for ep in entry_points(group=GROUP):
        found.setdefault(ep.name, ep)
    return found


def load(scheme: str) -> type[Backend]:
    eps = available()
    ep = eps.get(scheme)
    if ep is None:
        known = ", ".join(sorted(eps)) or "none"
        raise InvalidInput(f"unknown URL scheme {scheme!r} (installed backends: {known})")
    try:
        cls = ep.load()
    except Exception as exc:  # a broken plugin must not produce a traceback
        raise InvalidInput(f"backend {scheme!r} ({ep.value}) failed to load: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise InvalidInput(f"backend {scheme!r} ({ep.value}) is not a rucio_fs Backend")
    return cls


def open_backend(url: str) -> Backend:
    """The backend for ``url`` (not yet started); InvalidInput with a one-line reason."""
    return backend_class(url).from_url(url)


def backend_class(url: str) -> type[Backend]:
    """The backend class of ``url``'s scheme; InvalidInput with a one-line reason."""
    if "://" not in url:
        raise InvalidInput(f"malformed URL {url!r}: expected SCHEME://... (e.g. demo://)")
    try:
        scheme = urlsplit(url).scheme
    except ValueError as exc:
        raise InvalidInput(f"malformed URL {url!r}: {exc}") from None
    if not scheme:
        raise InvalidInput(f"malformed URL {url!r}: missing scheme")
    return load(scheme.lower())
