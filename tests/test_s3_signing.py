"""SigV4 as computed by ``backends/s3/signing.py`` equals botocore's, byte for byte.

The reference is botocore's own S3 signer (header signing without a payload hash, query
presigning) at the same instant; the requests are the ones the backend makes (LIST with its
query, HEAD, PUT with Content-MD5, Range reads, DeleteObjects), with keys of any characters,
with and without a session token. The real servers of the other tests check the signatures
end to end.
"""

from __future__ import annotations

import datetime
from unittest import mock
from urllib.parse import parse_qsl, urlsplit

import botocore.credentials
import httpx
import pytest
from botocore.auth import S3SigV4Auth, S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from hypothesis import given, settings
from hypothesis import strategies as st
from rucio_fs.backends.s3.backend import S3Backend
from rucio_fs.backends.s3.signing import SIGNED, SigV4

from rucio_fs.http import quote_path

WHEN = datetime.datetime(2026, 11, 25, 16, 59, 7, tzinfo=datetime.timezone.utc)
CREDENTIALS = {
    "plain": botocore.credentials.Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfi"),
    "session": botocore.credentials.Credentials("ASIAEXAMPLE", "c2VjcmV0+/=", "tok/en+=="),
}
BASE = "http://127.0.0.1:17070"


class _Unhashed(S3SigV4Auth):
    def _should_sha256_sign_payload(self, request: object) -> bool:
        return False


def botocore_headers(creds, method: str, url: str, headers: dict[str, str]) -> dict[str, str]:
    """What botocore signs for the same request: the headers the backend signs (host,
    Content-MD5/-Type, Range, x-amz-*), no payload hash."""
    signed = {k: v for k, v in headers.items() if k.lower() in SIGNED
              or k.lower().startswith("x-amz-")}
    request = AWSRequest(method=method, url=url, headers=signed)
    with mock.patch("botocore.auth.get_current_datetime", return_value=WHEN.replace(tzinfo=None)):
        _Unhashed(creds.get_frozen_credentials(), "s3", "us-east-1").add_auth(request)
    return {k: request.headers[k] for k in ("Authorization", "X-Amz-Date",
                                            "X-Amz-Content-SHA256", "X-Amz-Security-Token")
            if k in request.headers}


def ours(creds, method: str, url: str, headers: dict[str, str]) -> dict[str, str]:
    parts = urlsplit(url)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    return SigV4(creds, "us-east-1").sign_headers(method, parts.netloc, target, headers,
                                                  now=WHEN)


names = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                min_size=1, max_size=40)


@pytest.mark.parametrize("which", sorted(CREDENTIALS))
@settings(max_examples=150, deadline=None)
@given(key=names)
def test_request_signatures_equal_botocores(which, key):
    creds = CREDENTIALS[which]
    backend = S3Backend.from_url(f"s3://bucket?endpoint_url={BASE}")
    list_query = backend._query({"list-type": "2", "prefix": key, "encoding-type": "url",
                                 "max-keys": "2", "delimiter": "/"})
    object_url = f"{BASE}/bucket/{quote_path(key)}"
    cases = [
        ("GET", f"{BASE}/bucket/{list_query}", {}),
        ("HEAD", object_url, {"User-Agent": "ignored"}),
        ("PUT", object_url, {"Content-MD5": "1B2M2Y8AsgTpgAmY7PhCfg==",
                             "Content-Type": "application/octet-stream",
                             "x-amz-meta-note": "  two   spaces "}),
        ("GET", object_url, {"Range": "bytes=0-4095"}),
        ("POST", f"{BASE}/bucket/?delete", {"Content-MD5": "abc=", "Content-Type": "x"}),
        ("POST", f"{object_url}?uploads", {}),
        ("PUT", object_url + backend._query({"partNumber": "3", "uploadId": key}), {}),
    ]
    for method, url, headers in cases:
        assert ours(creds, method, url, headers) == botocore_headers(creds, method, url,
                                                                     headers), (method, url)


@pytest.mark.parametrize("which", sorted(CREDENTIALS))
@settings(max_examples=150, deadline=None)
@given(key=names)
def test_presigned_urls_equal_botocores(which, key):
    creds = CREDENTIALS[which]
    url = f"{BASE}/bucket/{quote_path(key)}"
    request = AWSRequest(method="GET", url=url)
    with mock.patch("botocore.auth.get_current_datetime", return_value=WHEN.replace(tzinfo=None)):
        S3SigV4QueryAuth(creds.get_frozen_credentials(), "s3", "us-east-1",
                         expires=3600).add_auth(request)
    theirs, mine = urlsplit(request.url), urlsplit(SigV4(creds, "us-east-1").presign(
        url, 3600, now=WHEN))
    assert (mine.scheme, mine.netloc, mine.path) == (theirs.scheme, theirs.netloc, theirs.path)
    assert dict(parse_qsl(mine.query)) == dict(parse_qsl(theirs.query))


def test_the_auth_flow_signs_what_httpx_sends():
    creds = CREDENTIALS["session"]
    request = httpx.Request("PUT", f"{BASE}/bucket/a%20b", content=b"x",
                            headers={"Content-MD5": "dzLt9p9z9l7bODQ4lXXMaQ=="})
    with mock.patch("rucio_fs.backends.s3.signing._now", return_value=WHEN):
        signed = next(SigV4(creds, "us-east-1").auth_flow(request))
    expected = botocore_headers(creds, "PUT", f"{BASE}/bucket/a%20b",
                                {"Content-MD5": "dzLt9p9z9l7bODQ4lXXMaQ=="})
    assert {k: signed.headers[k] for k in expected} == expected
