"""``rucio://``: a Rucio server's namespace (see :mod:`.backend`; tokens in :mod:`.auth`,
URL and ``rucio.cfg`` in :mod:`.settings`)."""

from .backend import RucioBackend

__all__ = ["RucioBackend"]
