"""``s3://``: an S3 bucket (see :mod:`.backend`; URL and endpoint in :mod:`.settings`,
listing pages in :mod:`.pages`, multipart uploads in :mod:`.upload`)."""

from .backend import S3Backend

__all__ = ["S3Backend"]
