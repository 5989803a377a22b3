"""Where an iRODS mount's settings come from: ``~/.irods/irods_environment.json``, then the URL.

::

    irods://[USER@]HOST[:PORT]/ZONE[/PATH][?option=value&...]   (or -o option=value)
    irods:///ZONE/PATH    irods://    (host, user, zone and home from the iRODS environment)

``HOST:PORT`` is the iRODS HTTP API (default port 9000), not the iRODS server's 1247.

Options: ``api_path`` (the API's base path, e.g. ``/irods-http-api/0.7.0``; default:
discovered by asking ``/info`` under the known versions), ``tls`` (``1``: https),
``ca`` (CA file or directory for https), ``password_file`` (default: ``IRODS_PASSWORD`` in
the environment), ``token_file`` (an OpenID Connect access token used as the bearer token;
default: ``IRODS_HTTP_API_TOKEN`` in the environment), ``timeout`` (per request, default
30 s), ``part_size`` (upload part, default 8M, at most the server's request body limit),
``page_rows`` (GenQuery2 rows per listing query, default 100,000), ``genquery``
(``auto``, ``2`` or ``1``), ``no_trash`` (``1``: ``rm`` deletes instead of moving to the
trash). Secrets are read, never logged or echoed.
"""

from __future__ import annotations

import json
import os
import posixpath
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from rucio_fs.errors import InvalidInput, MissingCredentials, NotFound
from rucio_fs.identity import Source, own_source
from rucio_fs.options import parse_duration, parse_size, url_options

OPTIONS = ("api_path", "tls", "ca", "password_file", "token_file", "timeout", "part_size",
           "page_rows", "genquery", "no_trash")
DEFAULT_PORT = 9000
#: HTTP API versions whose base path ``/irods-http-api/<version>`` is tried, newest first.
KNOWN_VERSIONS = ("0.7.0", "0.6.0", "0.5.0", "0.4.0", "0.3.0", "0.2.0", "0.1.0")


@dataclass(frozen=True)
class IrodsSettings:
    host: str
    port: int
    user: str
    zone: str
    #: Logical path of the mount's root collection (``/zone/...``, no trailing slash).
    root: str
    tls: bool = False
    ca: str | None = None
    api_path: str | None = None
    password: str | None = None
    token: str | None = None
    token_file: str | None = None
    timeout: float = 30.0
    part_size: int = 8 << 20
    page_rows: int = 100_000
    genquery: str = "auto"
    no_trash: bool = False

    @property
    def server(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"


#: What a caller's environment may say about its iRODS credentials (per-user mounts).
CREDENTIAL_ENV = ("IRODS_ENVIRONMENT_FILE", "IRODS_PASSWORD", "IRODS_HTTP_API_TOKEN")


def environment_file(source: Source | None = None) -> str:
    source = source or own_source()
    return (source.environ.get("IRODS_ENVIRONMENT_FILE")
            or os.path.join(source.home, ".irods", "irods_environment.json"))


def _environment(source: Source) -> dict[str, object]:
    path = environment_file(source)
    try:
        data = json.loads(source.read_text(path))
    except (FileNotFoundError, NotFound):
        return {}
    except (OSError, ValueError) as exc:
        raise InvalidInput(f"{path}: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidInput(f"{path}: not a JSON object")
    return data


def _read_secret(path: str, what: str, source: Source) -> str:
    try:
        text = source.read_text(source.expand(path)).strip()
    except OSError as exc:
        raise InvalidInput(f"{what} {path}: {exc.strerror}") from None
    except NotFound:
        raise MissingCredentials(f"{what} {path} does not exist") from None
    if not text:
        raise InvalidInput(f"{what} {path} is empty")
    return text


def parse_url(url: str, source: Source | None = None) -> IrodsSettings:
    """Settings for ``url`` from ``source``'s environment and files (default: the daemon's
    own); InvalidInput (MissingCredentials when only credentials lack) with a one-line
    reason."""
    source = source or own_source()
    parts = urlsplit(url)
    if parts.scheme != "irods":
        raise InvalidInput(f"malformed URL {url!r}: expected irods://[USER@]HOST[:PORT]/ZONE/PATH")
    options = url_options(parts.query, OPTIONS, "irods")
    env = _environment(source)
    try:
        port = parts.port or DEFAULT_PORT
    except ValueError:
        raise InvalidInput(f"malformed port in {url!r}") from None
    host = parts.hostname or str(env.get("irods_host") or "")
    if not host:
        raise MissingCredentials("no host: give irods://HOST/... or irods_host in "
                                 f"{environment_file(source)}")
    user = unquote(parts.username or "") or str(env.get("irods_user_name") or "")
    if not user:
        raise MissingCredentials(f"no user: give irods://USER@HOST/... or irods_user_name "
                                 f"in {environment_file(source)}")
    path = unquote(parts.path)
    if path in ("", "/"):
        path = str(env.get("irods_home") or "")
        if not path:
            zone = env.get("irods_zone_name")
            if not zone:
                raise MissingCredentials("no collection: give irods://HOST/ZONE/PATH")
            path = f"/{zone}/home/{user}"
    if "\0" in path or any(seg in (".", "..") for seg in path.split("/")):
        raise InvalidInput(f"collection {path!r} has a '.' or '..' component or a NUL")
    root = posixpath.normpath("/" + path.strip("/"))
    zone = root.split("/")[1]
    password = token = token_file = None
    environ = source.environ
    if options.get("token_file"):
        token_file = options["token_file"]
        token = _read_secret(token_file, "token_file", source)
        token_file = source.localize(source.expand(token_file))
    elif environ.get("IRODS_HTTP_API_TOKEN"):
        token = environ["IRODS_HTTP_API_TOKEN"].strip()
    elif options.get("password_file"):
        password = _read_secret(options["password_file"], "password_file", source)
    elif environ.get("IRODS_PASSWORD") is not None:
        password = environ["IRODS_PASSWORD"]
    else:
        raise MissingCredentials("no iRODS credentials: set IRODS_PASSWORD or "
                                 "IRODS_HTTP_API_TOKEN, or give -o password_file=PATH or "
                                 "-o token_file=PATH")
    api_path = options.get("api_path") or None
    if api_path is not None:
        api_path = "/" + api_path.strip("/")
    tls = options.get("tls", "0").lower() in ("1", "true", "yes")
    page_rows = _positive_int(options.get("page_rows", "100000"), "page_rows")
    genquery = options.get("genquery", "auto")
    if genquery not in ("auto", "1", "2"):
        raise InvalidInput(f"genquery must be auto, 1 or 2, not {genquery!r}")
    part_size = parse_size(options.get("part_size", "8M"))
    if part_size < 64 << 10:
        raise InvalidInput("part_size must be at least 64K")
    return IrodsSettings(host=host, port=port, user=user, zone=zone, root=root, tls=tls,
                         ca=options.get("ca") or None, api_path=api_path, password=password,
                         token=token, token_file=token_file,
                         timeout=parse_duration(options.get("timeout", "30")),
                         part_size=part_size, page_rows=page_rows, genquery=genquery,
                         no_trash=options.get("no_trash", "0").lower() in ("1", "true", "yes"))


def _positive_int(text: str, name: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise InvalidInput(f"{name} must be a positive integer, not {text!r}")
    return value
