"""Typed errors shared by the core and every backend, each with its errno.

Backends raise these (never OSError with a guessed errno, never pyfuse3 errors). Each class
carries the errno it stands for (``errno``); the FUSE layer (``fs.fuse_op``) replies with it,
and with EIO for anything untyped, in one place.
"""

from __future__ import annotations

import errno


class RucioFsError(Exception):
    """Base of every error rucio-fs raises on purpose. ``str(err)`` is a one-line message."""

    errno: int = errno.EIO


class InvalidInput(RucioFsError):
    """Bad user input: malformed URL, unknown option, bad mountpoint. Reported before mounting."""

    errno = errno.EINVAL


class MissingCredentials(InvalidInput):
    """No usable credentials where the catalog's own client would look (no password, no
    proxy file, ...). Fails a mount; in a per-user mount it is the caller's EACCES."""


class NotFound(RucioFsError):
    errno = errno.ENOENT


class PermissionDenied(RucioFsError):
    errno = errno.EACCES


class NoCredentials(PermissionDenied):
    """A per-user mount's caller has no usable credentials (logged once where found out)."""


class Unauthorized(PermissionDenied):
    """The server refused the credentials (HTTP 401): worth renewing them once."""


class Unavailable(RucioFsError):
    """The catalog or storage cannot be reached or answered badly (timeout, 5xx, broken stream)."""

    errno = errno.EIO


class IntegrityError(Unavailable):
    """Data or a listing failed verification (checksum mismatch, truncated response)."""


class Unconfirmed(Unavailable):
    """A write whose outcome the server did not prove (the object is missing, or has another
    size or version than what was sent): the data stays pending, never assumed stored."""


class BadRequestTarget(Unavailable):
    """A URL that cannot be sent as an HTTP request: a permanent error, never retried."""


class NotADirectory(RucioFsError):
    errno = errno.ENOTDIR


class IsADirectory(RucioFsError):
    errno = errno.EISDIR


class AlreadyExists(RucioFsError):
    errno = errno.EEXIST


class NotEmpty(RucioFsError):
    errno = errno.ENOTEMPTY


class CrossDevice(RucioFsError):
    """A rename the backend cannot do in place (e.g. an S3 directory); ``mv`` then copies."""

    errno = errno.EXDEV


class NoSpace(RucioFsError):
    """No room left where the data must go (the staging disk, the server's storage)."""

    errno = errno.ENOSPC


class QuotaExceeded(RucioFsError):
    """The server refuses the data: the user's or the collection's quota is spent."""

    errno = errno.EDQUOT


class NotPermitted(RucioFsError):
    """An operation this mount never does (a hard link), or a read-only attribute."""

    errno = errno.EPERM


class NoSuchAttribute(RucioFsError):
    """An extended attribute that is not there (ENOATTR, which Linux spells ENODATA)."""

    errno = errno.ENODATA


class NotSupported(RucioFsError):
    """The backend cannot express this operation (it did not declare the capability)."""

    errno = errno.ENOTSUP

