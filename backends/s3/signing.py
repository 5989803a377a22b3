"""AWS Signature Version 4 for S3: signed request headers and presigned URLs.

Credentials come from botocore's chain (environment, shared files, profiles, roles); the
signatures are computed here. A cold ``cat`` pays two of them (the lookup's LIST, the open's
presigned GET), and after an idle pause botocore's signer took 0.5 ms each against 0.1 ms
here (``benchmarks/bench_http.py --signing 50 --idle 0.2``; the signing key is derived once
per day).
Every signature is tested byte for byte against botocore's for the same request and time
(``tests/test_s3_signing.py``), including odd names, query strings, session tokens and the
headers signed.

Payloads are not hashed (``UNSIGNED-PAYLOAD``): bodies carry ``Content-MD5``, which S3
verifies.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlsplit

import httpx

ALGORITHM = "AWS4-HMAC-SHA256"
UNSIGNED = "UNSIGNED-PAYLOAD"
#: Headers signed besides ``host`` and ``x-amz-*`` (others, such as ``user-agent``, may be
#: changed on the way without breaking the signature).
SIGNED = frozenset({"content-md5", "content-type", "range"})


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


class SigV4(httpx.Auth):
    """Signs requests (an httpx auth flow of one step) and presigns URLs for one region."""

    def __init__(self, credentials: Any, region: str, service: str = "s3") -> None:
        self._credentials = credentials
        self._region = region
        self._service = service
        #: (secret, day) -> the day's signing key.
        self._keys: dict[tuple[str, str], bytes] = {}

    def auth_flow(self, request: httpx.Request):  # type: ignore[no-untyped-def]
        request.headers.update(self.sign_headers(
            request.method, request.headers["host"], request.url.raw_path.decode(),
            request.headers))
        yield request

    def sign_headers(self, method: str, host: str, target: str, headers: Mapping[str, str],
                     now: datetime.datetime | None = None) -> dict[str, str]:
        """The headers that sign a request for ``target`` (path and query, as sent) on
        ``host`` (with its port when not the scheme's), given the request's ``headers``."""
        creds = self._credentials.get_frozen_credentials()
        stamp = (now or _now()).strftime("%Y%m%dT%H%M%SZ")
        added = {"X-Amz-Date": stamp, "X-Amz-Content-SHA256": UNSIGNED}
        if creds.token:
            added["X-Amz-Security-Token"] = creds.token
        signed = {"host": host}
        for name, value in (*headers.items(), *added.items()):
            lower = name.lower()
            if lower in SIGNED or lower.startswith("x-amz-"):
                signed[lower] = value
        order = sorted(signed)
        path, _, query = target.partition("?")
        canonical = "\n".join((
            method, path, _canonical_query(query),
            "".join(f"{k}:{' '.join(signed[k].split())}\n" for k in order),
            ";".join(order), UNSIGNED))
        signature = self._signature(creds.secret_key, stamp, canonical)
        return {**added,
                "Authorization": f"{ALGORITHM} Credential={creds.access_key}/"
                                 f"{self._scope(stamp)}, SignedHeaders={';'.join(order)}, "
                                 f"Signature={signature}"}

    def presign(self, url: str, expires: int, now: datetime.datetime | None = None) -> str:
        """``url`` (a GET of an object, path already quoted) with the query that signs it
        for ``expires`` seconds."""
        creds = self._credentials.get_frozen_credentials()
        stamp = (now or _now()).strftime("%Y%m%dT%H%M%SZ")
        parts = urlsplit(url)
        params = {"X-Amz-Algorithm": ALGORITHM,
                  "X-Amz-Credential": f"{creds.access_key}/{self._scope(stamp)}",
                  "X-Amz-Date": stamp, "X-Amz-Expires": str(expires),
                  "X-Amz-SignedHeaders": "host"}
        if creds.token:
            params["X-Amz-Security-Token"] = creds.token
        query = "&".join(f"{_encode(k)}={_encode(v)}" for k, v in params.items())
        if parts.query:
            query = f"{parts.query}&{query}"
        canonical = "\n".join(("GET", parts.path or "/", _canonical_query(query),
                               f"host:{parts.netloc}\n", "host", UNSIGNED))
        signature = self._signature(creds.secret_key, stamp, canonical)
        return f"{parts.scheme}://{parts.netloc}{parts.path}?{query}&X-Amz-Signature={signature}"

    def _scope(self, stamp: str) -> str:
        return f"{stamp[:8]}/{self._region}/{self._service}/aws4_request"

    def _signature(self, secret: str, stamp: str, canonical: str) -> str:
        day = stamp[:8]
        key = self._keys.get((secret, day))
        if key is None:
            key = ("AWS4" + secret).encode()
            for part in (day, self._region, self._service, "aws4_request"):
                key = hmac.new(key, part.encode(), hashlib.sha256).digest()
            if len(self._keys) > 4:  # old days and rotated secrets
                self._keys.clear()
            self._keys[(secret, day)] = key
        digest = hashlib.sha256(canonical.encode()).hexdigest()
        to_sign = f"{ALGORITHM}\n{stamp}\n{self._scope(stamp)}\n{digest}"
        return hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()


def _encode(text: str) -> str:
    return quote(text, safe="-_.~")


def _canonical_query(query: str) -> str:
    """The query's pairs sorted, each as sent (the backend encodes queries the canonical
    way, ``S3Backend._query``; a bare name is ``name=``), as botocore does for a URL."""
    if not query:
        return ""
    return "&".join(f"{k}={v}" for k, v in sorted(
        pair.partition("=")[::2] for pair in query.split("&")))

