"""SigV4 for every request, done by botocore's signer (never hand-written)."""

from __future__ import annotations

from typing import Any

import httpx


class SigV4(httpx.Auth):
    """Signs each request with botocore's S3 SigV4 signer (payload not hashed: bodies carry
    Content-MD5, which S3 verifies)."""

    _SIGNED = ("content-md5", "content-type", "range")

    def __init__(self, credentials: Any, region: str) -> None:
        from botocore.auth import S3SigV4Auth
        from botocore.awsrequest import AWSRequest

        class _Unsigned(S3SigV4Auth):
            def _should_sha256_sign_payload(self, request: Any) -> bool:
                return False

        self._credentials = credentials
        self._signer_class = _Unsigned
        self._request_class = AWSRequest
        self._region = region

    def auth_flow(self, request: httpx.Request):  # type: ignore[no-untyped-def]
        url = f"{request.url.scheme}://{request.url.netloc.decode()}{request.url.raw_path.decode()}"
        headers = {k: v for k, v in request.headers.items()
                   if k.lower() in self._SIGNED or k.lower().startswith("x-amz-")}
        aws = self._request_class(method=request.method, url=url, headers=headers)
        signer = self._signer_class(self._credentials.get_frozen_credentials(), "s3",
                                    self._region)
        signer.add_auth(aws)
        for name in ("Authorization", "X-Amz-Date", "X-Amz-Content-SHA256",
                     "X-Amz-Security-Token"):
            if name in aws.headers:
                request.headers[name] = aws.headers[name]
        yield request
