"""Who is asking, and the credentials that user's own tools would use (``--identity per-user``).

A request's caller is the uid, gid and pid the kernel gives with it. Its credentials are found
the way the catalog's own client finds them, from the caller's point of view:

* the calling process's environment (``/proc/<pid>/environ``; only the names the backend
  declares in ``credential_env`` are ever kept);
* files named there or in the user's default places (``~/.aws``, ``/tmp/x509up_u<uid>``,
  ...), resolved inside the process's root (``/proc/<pid>/root``: a container's files);
* read **as that user** — a helper process with the user's uid, gid and groups opens them —
  never by the daemon as root on the user's behalf. A file the user cannot read is refused
  even though root could read it.

A request with no pid (pid 0: the kernel's own, or a process in a pid namespace the daemon
cannot see) has no environment: only the user's default places count. Nothing here ever
falls back to the mounting user's credentials. Contents read are kept in memory (a private
copy on disk, mode 0600 in a directory only root can enter, when a library needs a path) and
never logged; what was read is remembered so a changed file (a renewed proxy) is noticed.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rucio_fs.errors import NotFound, PermissionDenied

#: The largest credential file read (a proxy with its chain is a few KiB).
MAX_CREDENTIAL_BYTES = 1 << 20
#: How long a credential helper may take before the request fails.
HELPER_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class Caller:
    """The process a request comes from, as the kernel names it."""

    uid: int
    gid: int
    pid: int


def process_environ(pid: int, names: Iterable[str]) -> dict[str, str] | None:
    """The values of ``names`` in process ``pid``'s environment (as it was at exec), or None
    when there is no such process to ask (pid 0, gone, or not visible)."""
    if pid <= 0:
        return None
    wanted = set(names)
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    found: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        name = key.decode(errors="replace")
        if sep and name in wanted:
            found[name] = value.decode(errors="surrogateescape")
    return found


def process_uid(pid: int) -> int | None:
    """The real uid of process ``pid`` (None when it cannot be seen)."""
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


@dataclass
class CallerCredentials:
    """What a backend may use to act as one local user (see the module docstring).

    ``environ`` holds only the backend's ``credential_env`` names (empty without a pid);
    ``read`` and ``private_copy`` open files as the user. ``fingerprint`` names the
    credentials read so far (environment and file contents), never showing them.
    """

    uid: int
    gid: int
    pid: int
    environ: Mapping[str, str]
    home: str
    user: str
    groups: tuple[int, ...] = ()
    #: Where the caller's paths are resolved ("" : the daemon's own root).
    root: str = ""
    private_dir: str = ""
    _read: dict[str, tuple[tuple[int, int, int], bytes]] = field(default_factory=dict)

    @classmethod
    def of(cls, caller: Caller, names: Iterable[str], private_dir: str,
           mapped: Mapping[str, str] | None = None) -> CallerCredentials:
        """The credentials of ``caller`` (its environment restricted to ``names``, with
        ``mapped`` settings of the site's identity map in place of its own)."""
        try:
            entry = pwd.getpwuid(caller.uid)
            home, user = entry.pw_dir, entry.pw_name
            groups = tuple(os.getgrouplist(user, caller.gid))
        except KeyError:  # a uid with no passwd entry: no home, no extra groups
            home, user, groups = "", str(caller.uid), (caller.gid,)
        environ = process_environ(caller.pid, names)
        # Only a process of this very user speaks for it (a pid reused by another user's
        # process between the request and now is not asked).
        if environ is not None and process_uid(caller.pid) != caller.uid:
            environ = None
        root = f"/proc/{caller.pid}/root" if environ is not None else ""
        return cls(caller.uid, caller.gid, caller.pid, {**(environ or {}), **(mapped or {})},
                   home, user, groups, root, private_dir)

    def expand(self, path: str) -> str:
        """``~`` and ``$VAR`` (from the caller's environment, then ``HOME``) expanded."""
        if path.startswith("~"):
            path = self.home + path[1:]
        for name, value in {"HOME": self.home, **self.environ}.items():
            path = path.replace(f"${{{name}}}", value).replace(f"${name}", value)
        return path

    def read(self, path: str) -> bytes:
        """The content of the caller's file ``path``, read as the caller. NotFound when it
        does not exist; PermissionDenied (naming the uid, never the content) when the caller
        may not read it."""
        real = self._resolve(path)
        try:
            info = os.stat(real)
        except FileNotFoundError:
            raise NotFound(f"uid {self.uid}: {path} does not exist") from None
        except OSError as exc:
            raise PermissionDenied(f"uid {self.uid}: {path}: {exc.strerror}") from None
        result = subprocess.run(
            ["head", "-c", str(MAX_CREDENTIAL_BYTES), "--", real], capture_output=True,
            user=self.uid, group=self.gid, extra_groups=list(self.groups), env={}, cwd="/",
            timeout=HELPER_TIMEOUT, check=False)
        if result.returncode != 0:
            raise PermissionDenied(f"uid {self.uid} cannot read its credential file {path}")
        self._read[path] = ((info.st_ino, info.st_size, info.st_mtime_ns), result.stdout)
        return result.stdout

    def readable(self, path: str) -> bool:
        """Whether ``path`` exists for the caller (read as the caller; an unreadable file
        raises PermissionDenied: the user named a credential it cannot use)."""
        try:
            self.read(path)
        except NotFound:
            return False
        return True

    def private_copy(self, path: str) -> str:
        """A copy of the caller's file ``path`` (read as the caller) that only the daemon
        can open, for libraries that take a path (TLS client certificates)."""
        data = self._read[path][1] if path in self._read else self.read(path)
        digest = hashlib.sha256(f"{self.uid}\0{path}\0".encode() + data).hexdigest()[:24]
        copy = os.path.join(self.private_dir, f"u{self.uid}-{digest}")
        if not os.path.exists(copy):
            fd, tmp = tempfile.mkstemp(dir=self.private_dir)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, copy)
        return copy

    def fingerprint(self) -> str:
        """A digest of everything read (environment and files): equal exactly when the
        credentials are."""
        h = hashlib.sha256(f"{self.uid}\0".encode())
        for name in sorted(self.environ):
            h.update(f"{name}={self.environ[name]}\0".encode())
        for path in sorted(self._read):
            h.update(path.encode() + b"\0" + self._read[path][1] + b"\0")
        return h.hexdigest()

    def changed(self, now: CallerCredentials | None = None) -> bool:
        """Whether a file read since has changed or gone (its inode, size or time), as seen
        by ``now`` (the same user's current caller: the process that first read them may
        be gone, and with it its root)."""
        view = now or self
        for path, (version, _) in self._read.items():
            try:
                info = os.stat(view._resolve(path))
            except OSError:
                return True
            if (info.st_ino, info.st_size, info.st_mtime_ns) != version:
                return True
        return False

    def _resolve(self, path: str) -> str:
        path = self.expand(path)
        if not os.path.isabs(path):
            raise PermissionDenied(f"uid {self.uid}: credential path {path!r} is not absolute")
        return self.root + path if self.root else path


@dataclass(frozen=True)
class Source:
    """Whose environment and files a backend's settings come from: the daemon's own
    (:func:`own_source`), or one local user's (:func:`caller_source`: files read as that
    user). Backends read their configuration only through it, so one loader serves both."""

    environ: Mapping[str, str]
    uid: int
    home: str
    #: The text of a file (OSError, NotFound or PermissionDenied when it cannot be had).
    read_text: Callable[[str], str]
    exists: Callable[[str], bool]
    #: ``~`` and ``$VAR`` expanded from this environment.
    expand: Callable[[str], str]
    #: A path the daemon can open holding the file's content (for libraries taking paths).
    localize: Callable[[str], str]
    #: Whether this is the daemon's own (then paths are used as they are).
    own: bool = False


def own_source() -> Source:
    """The daemon's own environment and files (an ordinary mount)."""
    return Source(os.environ, os.getuid(), str(Path.home()),
                  lambda p: Path(p).read_text(), os.path.isfile,
                  lambda p: os.path.expandvars(os.path.expanduser(p)), lambda p: p, own=True)


def caller_source(credentials: CallerCredentials) -> Source:
    """One caller's environment and files, read as that user (a per-user mount)."""
    return Source(credentials.environ, credentials.uid, credentials.home,
                  lambda p: credentials.read(p).decode(errors="replace"),
                  credentials.readable, credentials.expand, credentials.private_copy)


def private_directory(base: str) -> str:
    """A directory only the daemon's user may enter, for :meth:`CallerCredentials.private_copy`."""
    path = os.path.join(base, "credentials")
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)
    return path
