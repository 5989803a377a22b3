"""Where an S3 mount's settings come from: the AWS configuration, then the mount URL.

::

    s3://BUCKET[/PREFIX][?option=value&...]      (or rucio-fs mount -o option=value)

Options: ``endpoint_url`` (default: ``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``, the
profile's ``endpoint_url``, else AWS itself), ``region`` (default: the AWS configuration's,
else ``us-east-1``), ``profile`` (an AWS profile; default ``AWS_PROFILE``), ``addressing``
(``path`` or ``virtual``; default ``path`` for a custom endpoint, ``virtual`` for AWS),
``timeout`` (per request stall limit, default 30 s), ``part_size`` (multipart part size,
at least 5M, default 8M), ``anonymous`` (``1``: unsigned requests to a public bucket).

Credentials come from botocore's standard chain (environment, shared credentials and config
files with profiles, SSO, container and instance roles); they are never logged.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from rucio_fs.errors import InvalidInput
from rucio_fs.options import parse_duration, parse_size, url_options

OPTIONS = ("endpoint_url", "region", "profile", "addressing", "timeout", "part_size",
           "anonymous")
#: S3's rules for bucket names (3-63 of lowercase letters, digits, dots and hyphens).
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
MIN_PART = 5 << 20


@dataclass(frozen=True)
class S3Settings:
    bucket: str
    #: Key prefix of the mount's root: "" or ending in "/".
    prefix: str
    endpoint_url: str
    region: str
    profile: str | None
    path_style: bool
    timeout: float = 30.0
    part_size: int = 8 << 20
    anonymous: bool = False


def parse_url(url: str) -> S3Settings:
    """Settings for ``url``; InvalidInput with a one-line reason."""
    parts = urlsplit(url)
    bucket = parts.netloc
    if not bucket:
        raise InvalidInput(f"malformed URL {url!r}: expected s3://BUCKET[/PREFIX]")
    if not _BUCKET.match(bucket):
        raise InvalidInput(f"{bucket!r} is not a valid S3 bucket name")
    prefix = unquote(parts.path).strip("/")
    if prefix and any(seg in ("", ".", "..") for seg in prefix.split("/")):
        raise InvalidInput(f"prefix {prefix!r} has an empty, '.' or '..' component")
    options = url_options(parts.query, OPTIONS, "s3")
    profile = options.get("profile") or os.environ.get("AWS_PROFILE") or None
    config = _profile_config(profile)
    endpoint = (options.get("endpoint_url") or os.environ.get("AWS_ENDPOINT_URL_S3")
                or os.environ.get("AWS_ENDPOINT_URL") or config.get("endpoint_url") or "")
    region = (options.get("region") or os.environ.get("AWS_REGION")
              or os.environ.get("AWS_DEFAULT_REGION") or config.get("region") or "us-east-1")
    if endpoint:
        endpoint_parts = urlsplit(endpoint)
        if endpoint_parts.scheme not in ("http", "https") or not endpoint_parts.hostname:
            raise InvalidInput(f"endpoint_url {endpoint!r} is not an http(s) URL")
        endpoint = endpoint.rstrip("/")
    else:
        endpoint = f"https://s3.{region}.amazonaws.com"
    addressing = options.get("addressing") or ("path" if _custom(endpoint) else "virtual")
    if addressing not in ("path", "virtual"):
        raise InvalidInput(f"addressing must be path or virtual, not {addressing!r}")
    if addressing == "virtual" and "." in bucket and endpoint.startswith("https"):
        addressing = "path"  # a dotted bucket name does not match the wildcard certificate
    part_size = parse_size(options.get("part_size", "8M"))
    if part_size < MIN_PART:
        raise InvalidInput("part_size must be at least 5M (S3's smallest part)")
    anonymous = options.get("anonymous", "0").lower() in ("1", "true", "yes")
    return S3Settings(bucket=bucket, prefix=prefix + "/" if prefix else "",
                      endpoint_url=endpoint, region=region, profile=profile,
                      path_style=addressing == "path",
                      timeout=parse_duration(options.get("timeout", "30")),
                      part_size=part_size, anonymous=anonymous)


def _custom(endpoint: str) -> bool:
    return not (urlsplit(endpoint).hostname or "").endswith(".amazonaws.com")


def _profile_config(profile: str | None) -> dict[str, str]:
    """The named (or default) profile's settings from the AWS config file."""
    import botocore.session  # imported late: a second of start-up only s3:// mounts pay

    try:
        session = botocore.session.Session(profile=profile)
        return {k: v for k, v in session.get_scoped_config().items() if isinstance(v, str)}
    except Exception as exc:  # botocore.exceptions.ProfileNotFound and config parse errors
        raise InvalidInput(f"AWS configuration: {exc}") from None
