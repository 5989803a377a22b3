"""iRODS HTTP API bearer tokens: from a password (``POST /authenticate`` with Basic auth) or
given (an OpenID Connect access token, from a file or the environment).

The HTTP API does not extend a token when it is used and does not say when it expires, so a
token is renewed when the server refuses it (HTTP 401), once per refusal: a password logs in
again; a token file is read again (a refreshed token may have been written there). Tokens and
passwords stay in memory; they are never logged or put in an error message.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Awaitable, Callable
from pathlib import Path

from rucio_fs.errors import PermissionDenied
from rucio_fs.http import TokenAuth

from .settings import IrodsSettings

#: ``login(authorization_header) -> token`` (the backend's unauthenticated POST /authenticate).
Login = Callable[[str], Awaitable[str]]


class IrodsAuth(TokenAuth):
    """The bearer token of an iRODS mount: from a password login (again on a 401), or given
    (``token_file`` is read again on a 401, for tokens renewed outside the mount)."""

    def __init__(self, settings: IrodsSettings, login: Login) -> None:
        super().__init__(settings.token or "")
        self.settings = settings
        self._login = login

    def header(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    async def obtain(self, refused: bool) -> tuple[str, float]:
        settings = self.settings
        if settings.password is not None:
            basic = base64.b64encode(f"{settings.user}:{settings.password}".encode()).decode()
            return await self._login(f"Basic {basic}"), math.inf
        if settings.token_file:
            fresh = Path(settings.token_file).expanduser().read_text().strip()
            if fresh and fresh != self.token:
                return fresh, math.inf
        raise PermissionDenied("the iRODS HTTP API refused the bearer token "
                               "(expired or not valid for this server)")
