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

import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from rucio_fs.errors import InvalidInput
from rucio_fs.identity import Source, own_source
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


def parse_url(url: str, source: Source | None = None) -> S3Settings:
    """Settings for ``url`` from ``source``'s environment and AWS files (default: the
    daemon's own); InvalidInput with a one-line reason."""
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
    source = source or own_source()
    environ = source.environ
    profile = options.get("profile") or environ.get("AWS_PROFILE") or None
    config = _profile_config(profile) if source.own else _caller_profile(profile, source)
    endpoint = (options.get("endpoint_url") or environ.get("AWS_ENDPOINT_URL_S3")
                or environ.get("AWS_ENDPOINT_URL") or config.get("endpoint_url") or "")
    region = (options.get("region") or environ.get("AWS_REGION")
              or environ.get("AWS_DEFAULT_REGION") or config.get("region") or "us-east-1")
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


#: What a caller's environment may say about its AWS credentials (per-user mounts).
CREDENTIAL_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                  "AWS_SECURITY_TOKEN", "AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE",
                  "AWS_CONFIG_FILE", "AWS_REGION", "AWS_DEFAULT_REGION",
                  "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")


def caller_aws_file(source: Source, kind: str) -> str | None:
    """A private copy of the caller's AWS ``credentials`` or ``config`` file (read as the
    caller), or None when it has none."""
    variable = "AWS_SHARED_CREDENTIALS_FILE" if kind == "credentials" else "AWS_CONFIG_FILE"
    path = source.expand(source.environ.get(variable) or f"~/.aws/{kind}")
    return source.localize(path) if source.exists(path) else None


def _caller_profile(profile: str | None, source: Source) -> dict[str, str]:
    """The named (or default) profile's settings from the caller's AWS config file."""
    import botocore.configloader

    path = caller_aws_file(source, "config")
    if path is None:
        return {}
    try:
        profiles = botocore.configloader.load_config(path).get("profiles", {})
    except Exception as exc:  # botocore's parse errors
        raise InvalidInput(f"AWS configuration of uid {source.uid}: {exc}") from None
    section = profiles.get(profile or "default", {})
    return {k: v for k, v in section.items() if isinstance(v, str)}
