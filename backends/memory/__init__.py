"""``memory://``: the reference backend (see :mod:`.backend`)."""

from .backend import MemoryBackend

__all__ = ["MemoryBackend"]
