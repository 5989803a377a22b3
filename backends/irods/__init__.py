"""``irods://``: iRODS through its HTTP API (see :mod:`.backend`; login in :mod:`.auth`,
GenQuery in :mod:`.query`, URL and environment in :mod:`.settings`)."""

from .backend import IrodsBackend

__all__ = ["IrodsBackend"]
