"""A site's identity map for a per-user mount (``--identity-map FILE``).

Sites that map local users to catalog accounts centrally (as NFSRODS maps each Unix user to
an iRODS user) name, per local user, settings that take the place of what the user's own
environment says: the account, the profile, where the user's proxy lives. Format, one line
per user (``#`` starts a comment, words split as by a shell)::

    # user or uid   VARIABLE=value ...
    alice           RUCIO_ACCOUNT=alice_prod
    1005            RUCIO_ACCOUNT=bob X509_USER_PROXY=/var/lib/proxies/x509up_u{uid}
    *               RUCIO_ACCOUNT=guest

Contract:

* Only the variables the backend reads for a caller (its ``credential_env``) may be set; a
  line naming another, an unknown user, or a malformed word is a one-line error at mount.
* ``*`` gives the settings of users the map does not name; ``{uid}`` and ``{user}`` in a
  value are the caller's.
* A mapped setting wins over the caller's own environment: the site decides, and a user
  cannot pick another account by setting the variable. What a mapped value names (a proxy
  path, a token file) is still read *as the user*, never by the daemon on its behalf.
* The map decides whom each user acts as, so it must be owned by root (or the daemon's
  user) and writable by no one else; otherwise the mount is refused.
* A changed file is read again when a user's credentials are next looked at (every few
  seconds per user); a broken new version is logged and the previous one kept.
"""

from __future__ import annotations

import logging
import os
import pwd
import shlex
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field

from rucio_fs.errors import InvalidInput

log = logging.getLogger(__name__)

#: The key of the settings for users the map does not name.
ANYONE = "*"


@dataclass
class IdentityMap:
    """The parsed map (see the module docstring), read again when its file changes."""

    path: str
    allowed: frozenset[str]
    #: uid (or :data:`ANYONE`) -> the settings of that user.
    settings: dict[int | str, dict[str, str]] = field(default_factory=dict)
    _version: tuple[int, int, int] = (0, 0, 0)

    @classmethod
    def load(cls, path: str, allowed: Iterable[str]) -> IdentityMap:
        """Read ``path``; InvalidInput (one line, naming the file and line) if it is unsafe
        or malformed."""
        found = cls(os.path.abspath(path), frozenset(allowed))
        found._read()
        return found

    def for_user(self, uid: int) -> dict[str, str]:
        """The settings the map gives ``uid`` (empty: none), from the file's current
        version."""
        self._refresh()
        settings = self.settings.get(uid, self.settings.get(ANYONE))
        if not settings:
            return {}
        try:
            user = pwd.getpwuid(uid).pw_name
        except KeyError:
            user = str(uid)
        return {k: v.replace("{uid}", str(uid)).replace("{user}", user)
                for k, v in settings.items()}

    def _refresh(self) -> None:
        try:
            info = os.stat(self.path)
        except OSError as exc:
            log.warning("identity map %s: %s; keeping the version read before", self.path,
                        exc.strerror)
            return
        if (info.st_ino, info.st_size, info.st_mtime_ns) == self._version:
            return
        try:
            self._read()
        except InvalidInput as exc:
            log.warning("%s; keeping the version read before", exc)
        else:
            log.info("identity map %s read again", self.path)

    def _read(self) -> None:
        try:
            with open(self.path, encoding="utf-8") as f:
                info = os.fstat(f.fileno())
                text = f.read()
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            raise InvalidInput(f"identity map {self.path}: {reason}") from None
        if info.st_uid not in (0, os.geteuid()) or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise InvalidInput(f"identity map {self.path}: must be owned by root and "
                               "writable by no one else (it decides whom each user acts as)")
        self.settings = self._parse(text)
        self._version = (info.st_ino, info.st_size, info.st_mtime_ns)

    def _parse(self, text: str) -> dict[int | str, dict[str, str]]:
        settings: dict[int | str, dict[str, str]] = {}
        for number, line in enumerate(text.splitlines(), 1):
            where = f"identity map {self.path}, line {number}"
            try:
                words = shlex.split(line, comments=True)
            except ValueError as exc:
                raise InvalidInput(f"{where}: {exc}") from None
            if not words:
                continue
            who, *assignments = words
            key = who if who == ANYONE else _uid_of(who, where)
            if key in settings:
                raise InvalidInput(f"{where}: {who} is named twice")
            values: dict[str, str] = {}
            for word in assignments:
                name, sep, value = word.partition("=")
                if not sep or not name:
                    raise InvalidInput(f"{where}: expected VARIABLE=value, got {word!r}")
                if name not in self.allowed:
                    raise InvalidInput(f"{where}: {name} is not a setting this catalog reads "
                                       f"(one of: {', '.join(sorted(self.allowed))})")
                values[name] = value
            settings[key] = values
        return settings


def _uid_of(who: str, where: str) -> int:
    if who.isdigit():
        return int(who)
    try:
        return pwd.getpwnam(who).pw_uid
    except KeyError:
        raise InvalidInput(f"{where}: no local user {who!r}") from None
