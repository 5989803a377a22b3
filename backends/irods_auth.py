"""iRODS HTTP API bearer tokens: from a password (``POST /authenticate`` with Basic auth) or
given (an OpenID Connect access token, from a file or the environment).

The HTTP API does not extend a token when it is used and does not say when it expires, so a
token is renewed when the server refuses it (HTTP 401), once per refusal: a password logs in
again; a token file is read again (a refreshed token may have been written there). Tokens and
passwords stay in memory; they are never logged or put in an error message.
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

from rucio_fs.errors import PermissionDenied

from .irods_settings import IrodsSettings

#: ``login(authorization_header) -> token`` (the backend's unauthenticated POST /authenticate).
Login = Callable[[str], Awaitable[str]]


class IrodsAuth:
    """The :class:`~rucio_fs.http.Authenticator` of an iRODS mount."""

    def __init__(self, settings: IrodsSettings, login: Login) -> None:
        self.settings = settings
        self.logins = 0
        self._login = login
        self._token = settings.token or ""
        self._lock = trio.Lock()

    @property
    def token(self) -> str:
        return self._token

    def header(self) -> dict[str, str]:
        """The current bearer header (for the data reader's worker threads)."""
        return {"Authorization": f"Bearer {self._token}"}

    async def headers(self) -> dict[str, str]:
        if not self._token:
            await self._renew(stale="")
        return self.header()

    async def refresh(self) -> None:
        """The server refused the token (401): get a new one, once."""
        await self._renew(stale=self._token)

    async def refresh_if(self, stale: str) -> None:
        """Renew unless somebody already replaced token ``stale``."""
        await self._renew(stale=stale)

    async def _renew(self, stale: str) -> None:
        async with self._lock:
            if self._token != stale:  # renewed while we waited
                return
            settings = self.settings
            if settings.password is not None:
                basic = base64.b64encode(f"{settings.user}:{settings.password}".encode()).decode()
                self.logins += 1
                self._token = await self._login(f"Basic {basic}")
                return
            if settings.token_file:
                fresh = Path(settings.token_file).expanduser().read_text().strip()
                if fresh and fresh != stale:
                    self._token = fresh
                    return
            raise PermissionDenied("the iRODS HTTP API refused the bearer token "
                                   "(expired or not valid for this server)")
