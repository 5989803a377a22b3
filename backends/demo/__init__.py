"""``demo://``: the built-in catalog that needs no server (see :mod:`.backend`)."""

from .backend import DemoBackend

__all__ = ["DemoBackend"]
