"""Rucio tokens: obtained with userpass or X.509, or taken as given (an OIDC token, a token file).

A token is fetched before its expiry (``REFRESH_MARGIN`` ahead) and once more after a 401.
Tokens stay in memory: they are never logged, never put in an error message, never written
to disk.
"""

from __future__ import annotations

import getpass
import logging
import os
import time
from email.utils import parsedate_to_datetime

import httpx

from rucio_fs.errors import PermissionDenied, Unavailable
from rucio_fs.http import TokenAuth, tls_context

from .settings import RucioSettings

log = logging.getLogger(__name__)

#: Renew a token this long before the server says it expires.
REFRESH_MARGIN = 300.0
#: Lifetime assumed when the server does not say (Rucio's default is one hour).
DEFAULT_LIFETIME = 3600.0


def default_token_file(account: str, user: str | None = None) -> str:
    """Where the Rucio CLI of local ``user`` (default: this process's) keeps the token of
    ``account`` (``rucio whoami`` leaves one there)."""
    return (f"/tmp/{user or getpass.getuser()}/.rucio_{account}/"
            f"auth_token_for_account_{account}")


def describe(response: httpx.Response) -> str:
    """Rucio's own one-line explanation of an error answer."""
    cls = response.headers.get("ExceptionClass", "")
    msg = response.headers.get("ExceptionMessage", "")
    return f"{cls}: {msg}".strip(": ")


class RucioAuth(TokenAuth):
    """The token of a Rucio mount: fetched (userpass, x509, x509 proxy) or given
    (``RUCIO_AUTH_TOKEN``, or the token file, read again after a 401)."""

    margin = REFRESH_MARGIN

    def __init__(self, settings: RucioSettings) -> None:
        super().__init__()
        self.settings = settings
        self._token_file_mtime = 0.0

    def header(self) -> dict[str, str]:
        headers = {"X-Rucio-Auth-Token": self.token}
        if self.settings.vo:
            headers["X-Rucio-VO"] = self.settings.vo
        return headers

    async def obtain(self, refused: bool) -> tuple[str, float]:
        if self.settings.auth_type == "token":
            return self._given_token(refused)
        return await self._fetch_token()

    def _given_token(self, after_401: bool) -> tuple[str, float]:
        s = self.settings
        if s.token:
            if after_401:
                raise PermissionDenied("Rucio refused the token in RUCIO_AUTH_TOKEN "
                                       "(expired?): renew it")
            return s.token, time.time() + DEFAULT_LIFETIME
        path = s.token_file or default_token_file(s.account)
        try:
            mtime = os.stat(path).st_mtime
            with open(path) as f:
                token = f.read().strip()
        except OSError:
            token, mtime = "", 0.0
        if not token or (after_401 and mtime == self._token_file_mtime):
            why = "was refused (expired?)" if after_401 else "is missing"
            raise PermissionDenied(f"Rucio token {why}: set RUCIO_AUTH_TOKEN or renew {path}")
        self._token_file_mtime = mtime
        return token, time.time() + DEFAULT_LIFETIME

    async def _fetch_token(self) -> tuple[str, float]:
        s = self.settings
        headers = {"X-Rucio-Account": s.account}
        if s.vo:
            headers["X-Rucio-VO"] = s.vo
        cert: tuple[str, str] | None = None
        if s.auth_type == "userpass":
            endpoint = "/auth/userpass"
            headers.update({"X-Rucio-Username": s.username, "X-Rucio-Password": s.password})
        elif s.auth_type == "x509":
            endpoint, cert = "/auth/x509", (s.client_cert, s.client_key)
        else:
            endpoint, cert = "/auth/x509_proxy", (s.client_proxy, s.client_proxy)
        verify = tls_context(s.ca_cert or None, *(cert or (None, None)))
        try:
            async with httpx.AsyncClient(verify=verify, timeout=s.timeout) as client:
                response = await client.get(s.auth_host + endpoint, headers=headers)
        except httpx.TransportError as exc:
            raise Unavailable(f"Rucio auth server {s.auth_host}: {type(exc).__name__}") from None
        token = response.headers.get("X-Rucio-Auth-Token", "")
        status = response.status_code
        if 400 <= status < 500 or (status == 200 and not token):
            # nginx answers 400 to a client certificate it cannot verify.
            raise PermissionDenied(f"Rucio refused {s.auth_type} authentication of account "
                                   f"{s.account!r}: {describe(response) or f'HTTP {status}'}")
        if response.status_code != 200:
            raise Unavailable(f"Rucio auth {endpoint}: HTTP {response.status_code} "
                              f"{describe(response)}".strip())
        try:
            expires = parsedate_to_datetime(
                response.headers["X-Rucio-Auth-Token-Expires"]).timestamp()
        except (KeyError, TypeError, ValueError):
            expires = time.time() + DEFAULT_LIFETIME
        log.info("obtained a Rucio token for %s (%s), valid until %s", s.account, s.auth_type,
                 time.strftime("%H:%M:%S", time.localtime(expires)))
        return token, expires
