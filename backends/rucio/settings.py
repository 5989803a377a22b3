"""Where a Rucio mount's settings come from: ``rucio.cfg``, the environment, then the URL.

The configuration is the one Rucio users already have. ``rucio.cfg`` is found like the Rucio
client finds it (``RUCIO_CONFIG``, ``$RUCIO_HOME/etc``, ``$VIRTUAL_ENV/etc``,
``/opt/rucio/etc``); its ``[client]`` section gives ``rucio_host``, ``auth_host``,
``auth_type``, ``account``, ``vo``, ``username``/``password``, ``client_cert``/``client_key``,
``client_x509_proxy``, ``auth_token_file_path`` and ``ca_cert``. The environment overrides it
(``RUCIO_ACCOUNT``, ``RUCIO_VO``, ``RUCIO_AUTH_TYPE``, ``RUCIO_CLIENT_CERT``/``_KEY``,
``RUCIO_CLIENT_PROXY``, ``X509_USER_PROXY``, ``X509_CERT_DIR``, ``RUCIO_AUTH_TOKEN``), and the
mount URL overrides both::

    rucio://[account@][host[:port]]/[scope[/did...]][?option=value&...]

URL options: ``config`` (a rucio.cfg path), ``auth`` (userpass, x509, x509_proxy, token),
``api`` (``http`` to talk plain http to a host named in the URL; https otherwise),
``schemes`` (PFN schemes in order of preference, default ``https,davs,http,root,roots,file``),
``rses`` (RSEs in order of preference), ``local`` (``PFN-prefix=directory``: read PFNs under the
prefix from a local mount of that RSE), ``redirect`` (``PFN-prefix=URL-prefix``: read them through
another endpoint, e.g. a caching proxy), ``timeout`` (per request stall limit, default 30 s).

First reads (see :mod:`.speculation`): ``speculate`` (``auto``, ``off`` or RSEs to read small
files from at their computed PFN before the replica catalog answers), ``speculate_max``
(largest file guessed, default 1 MiB), ``speculate_hedge`` (how long a guess runs alone
before the replica lookup is sent beside it, default 50 ms), ``replica_batch`` (most
siblings resolved with a file once its dataset's files are being read one after another,
default 256; 0: none).

Writing (see :mod:`.upload`): ``upload_rse`` (the RSE files written through the mount are
stored on; without it the mount is read-only), ``upload_rule_lifetime`` (lifetime of the rule
a dataset made through the mount gets, e.g. ``30d``; default none: permanent).
"""

from __future__ import annotations

import configparser
import dataclasses
import os
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from rucio_fs.errors import InvalidInput, MissingCredentials
from rucio_fs.identity import Source, own_source
from rucio_fs.options import parse_duration, parse_size, url_option_values

AUTH_TYPES = ("userpass", "x509", "x509_proxy", "token")
READABLE_SCHEMES = ("https", "davs", "http", "dav", "root", "roots", "file")
#: DIDs per ``POST /replicas/list`` (the server refuses more).
MAX_DIDS_PER_REQUEST = 1000
OPTIONS = ("config", "auth", "api", "schemes", "rses", "local", "redirect", "timeout",
           "speculate", "speculate_max", "speculate_hedge", "replica_batch", "upload_rse",
           "upload_rule_lifetime")


@dataclass(frozen=True)
class RucioSettings:
    rucio_host: str
    auth_host: str
    account: str
    auth_type: str
    vo: str = ""
    username: str = ""
    password: str = field(default="", repr=False)
    client_cert: str = ""
    client_key: str = ""
    client_proxy: str = ""
    token: str = field(default="", repr=False)
    token_file: str = ""
    ca_cert: str = ""
    root: tuple[str, ...] = ()
    schemes: tuple[str, ...] = ("https", "davs", "http", "root", "roots", "file")
    rses: tuple[str, ...] = ()
    local: tuple[tuple[str, str], ...] = ()
    redirect: tuple[tuple[str, str], ...] = ()
    timeout: float = 30.0
    speculate: tuple[str, ...] = ("auto",)
    speculate_max: int = 1 << 20
    speculate_hedge: float = 0.05
    replica_batch: int = 256
    upload_rse: str = ""
    #: Seconds; None: rules made for uploads are permanent.
    upload_rule_lifetime: float | None = None


#: What a caller's environment may say about its Rucio credentials (per-user mounts).
CREDENTIAL_ENV = ("RUCIO_CONFIG", "RUCIO_HOME", "VIRTUAL_ENV", "RUCIO_ACCOUNT", "RUCIO_VO",
                  "RUCIO_AUTH_TYPE", "RUCIO_CLIENT_CERT", "RUCIO_CLIENT_KEY",
                  "RUCIO_CLIENT_PROXY", "X509_USER_PROXY", "X509_CERT_DIR", "RUCIO_AUTH_TOKEN")


def find_config(explicit: str | None, source: Source | None = None) -> str | None:
    """The rucio.cfg to read: an explicit path must exist; the usual places may not."""
    source = source or own_source()
    if explicit:
        if not source.exists(explicit):
            raise InvalidInput(f"rucio config {explicit!r} does not exist")
        return explicit
    named = source.environ.get("RUCIO_CONFIG")
    if named:
        if not source.exists(named):
            raise InvalidInput(f"RUCIO_CONFIG={named!r} does not exist")
        return named
    candidates = [os.path.join(source.environ[var], "etc", "rucio.cfg")
                  for var in ("RUCIO_HOME", "VIRTUAL_ENV") if source.environ.get(var)]
    candidates.append("/opt/rucio/etc/rucio.cfg")
    return next((c for c in candidates if source.exists(c)), None)


def _read_client_section(path: str | None, source: Source) -> dict[str, str]:
    if path is None:
        return {}
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(source.read_text(path), path)
    except configparser.Error as exc:
        first = exc.message.splitlines()[0]
        raise InvalidInput(f"{path}: not a valid rucio.cfg: {first}") from None
    except OSError as exc:
        raise InvalidInput(f"{path}: {exc.strerror}") from None
    return {k: source.expand(v)
            for k, v in parser["client"].items()} if parser.has_section("client") else {}


def _host_url(netloc_host: str, port: int | None, api: str) -> str:
    host = f"[{netloc_host}]" if ":" in netloc_host else netloc_host
    return f"{api}://{host}" + (f":{port}" if port else "")


def load_settings(url: str, source: Source | None = None) -> RucioSettings:
    """Settings for a ``rucio://`` mount URL, from ``source``'s environment and files;
    InvalidInput (MissingCredentials when only credentials lack) with a one-line reason."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise InvalidInput(f"malformed rucio URL {url!r}: {exc}") from None
    options = url_option_values(parts.query, OPTIONS, "rucio")
    source = source or own_source()

    def option(key: str) -> str | None:
        return options[key][-1] if key in options else None

    cfg = _read_client_section(find_config(option("config"), source), source)
    env = source.environ

    def pick(env_name: str | None, cfg_key: str, default: str = "") -> str:
        if env_name and env.get(env_name):
            return env[env_name]
        return cfg.get(cfg_key, default)

    api = option("api") or "https"
    if api not in ("http", "https"):
        raise InvalidInput(f"rucio option api must be http or https, not {api!r}")
    if parts.hostname:
        rucio_host = auth_host = _host_url(parts.hostname, port, api)
    else:
        rucio_host = cfg.get("rucio_host", "")
        auth_host = cfg.get("auth_host", rucio_host)
    if not rucio_host:
        raise MissingCredentials("no Rucio server: name one in the URL (rucio://HOST/) or "
                                 "set rucio_host in rucio.cfg (RUCIO_CONFIG)")
    account = unquote(parts.username) if parts.username else pick("RUCIO_ACCOUNT", "account")
    if not account:
        raise MissingCredentials("no Rucio account: use rucio://ACCOUNT@.../ or set account "
                                 "in rucio.cfg or RUCIO_ACCOUNT")
    auth_type = option("auth") or pick("RUCIO_AUTH_TYPE", "auth_type", "userpass")
    if auth_type == "oidc":
        auth_type = "token"  # the OIDC flow is interactive: use the token it left behind
    if auth_type not in AUTH_TYPES:
        raise InvalidInput(f"unsupported Rucio auth_type {auth_type!r} "
                           f"(supported: {', '.join(AUTH_TYPES)}, oidc via its token)")

    schemes = tuple(s for s in (option("schemes") or "https,davs,http,root,roots,file")
                    .split(",") if s)
    unknown = [s for s in schemes if s not in READABLE_SCHEMES]
    if unknown or not schemes:
        raise InvalidInput(f"unreadable PFN scheme(s) {unknown or schemes}: "
                           f"choose from {', '.join(READABLE_SCHEMES)}")
    local = []
    for spec in options.get("local", []):
        prefix, sep, directory = spec.partition("=")
        if not sep or not prefix or not os.path.isdir(directory):
            raise InvalidInput(f"rucio option local={spec!r}: expected PFN-PREFIX=EXISTING-DIR")
        local.append((prefix, directory))
    redirect = []
    for spec in options.get("redirect", []):
        prefix, sep, target = spec.partition("=")
        if not sep or not prefix or urlsplit(target).scheme not in ("http", "https"):
            raise InvalidInput(f"rucio option redirect={spec!r}: expected PFN-PREFIX=URL-PREFIX")
        redirect.append((prefix, target))
    try:
        timeout = parse_duration(option("timeout") or "30s")
    except ValueError as exc:
        raise InvalidInput(f"rucio option: {exc}") from None
    if timeout <= 0:
        raise InvalidInput("rucio option timeout must be positive")
    speculate = tuple(r for r in (option("speculate") or "auto").split(",") if r)
    if not speculate or (len(speculate) > 1 and {"auto", "off"} & set(speculate)):
        raise InvalidInput("rucio option speculate must be auto, off or a list of RSEs")
    try:
        speculate_max = parse_size(option("speculate_max") or "1M")
        hedge = parse_duration(option("speculate_hedge") or "50ms")
        replica_batch = int(option("replica_batch") or "256")
    except ValueError:
        raise InvalidInput("rucio option replica_batch must be a whole number") from None
    except InvalidInput as exc:
        raise InvalidInput(f"rucio option: {exc}") from None
    lifetime_text = option("upload_rule_lifetime")
    try:
        lifetime = (None if lifetime_text in (None, "", "none")
                    else parse_duration(lifetime_text))
    except InvalidInput as exc:
        raise InvalidInput(f"rucio option upload_rule_lifetime: {exc}") from None
    if lifetime is not None and lifetime < 1:
        raise InvalidInput("rucio option upload_rule_lifetime must be at least 1 s (or none)")
    if not 0 <= replica_batch <= MAX_DIDS_PER_REQUEST:
        raise InvalidInput(f"rucio option replica_batch must be 0 to {MAX_DIDS_PER_REQUEST}")

    settings = RucioSettings(
        rucio_host=rucio_host.rstrip("/"), auth_host=auth_host.rstrip("/"), account=account,
        auth_type=auth_type, vo=pick("RUCIO_VO", "vo"),
        username=cfg.get("username", ""), password=cfg.get("password", ""),
        client_cert=pick("RUCIO_CLIENT_CERT", "client_cert"),
        client_key=pick("RUCIO_CLIENT_KEY", "client_key"),
        client_proxy=(env.get("RUCIO_CLIENT_PROXY") or cfg.get("client_x509_proxy")
                      or env.get("X509_USER_PROXY") or f"/tmp/x509up_u{source.uid}"),
        token=env.get("RUCIO_AUTH_TOKEN", ""), token_file=cfg.get("auth_token_file_path", ""),
        ca_cert=pick("X509_CERT_DIR", "ca_cert"),
        root=tuple(p for p in unquote(parts.path).split("/") if p),
        schemes=schemes, rses=tuple(r for r in (option("rses") or "").split(",") if r),
        local=tuple(local), redirect=tuple(redirect), timeout=timeout, speculate=speculate,
        speculate_max=speculate_max, speculate_hedge=hedge, replica_batch=replica_batch,
        upload_rse=option("upload_rse") or "", upload_rule_lifetime=lifetime)
    _check_credentials(settings, source)
    if source.own:
        return settings
    # The files the credentials are in, as copies the daemon may open (read as the caller).
    return dataclasses.replace(settings, **{
        name: source.localize(getattr(settings, name))
        for name in _CREDENTIAL_FILES[settings.auth_type]})


#: The settings naming a credential file, per auth type.
_CREDENTIAL_FILES = {"userpass": (), "x509": ("client_cert", "client_key"),
                     "x509_proxy": ("client_proxy",), "token": ()}


def _check_credentials(s: RucioSettings, source: Source) -> None:
    """Fail before mounting when the chosen auth type lacks what it needs."""
    if s.auth_type == "userpass" and not (s.username and s.password):
        raise MissingCredentials("auth_type userpass needs username and password in "
                                 "rucio.cfg")
    if s.auth_type == "x509":
        for what, path in (("client_cert", s.client_cert), ("client_key", s.client_key)):
            if not path or not source.exists(path):
                raise MissingCredentials(f"auth_type x509 needs a readable {what} "
                                         f"(got {path!r})")
    if s.auth_type == "x509_proxy" and not (s.client_proxy and source.exists(s.client_proxy)):
        raise MissingCredentials(f"auth_type x509_proxy needs X509_USER_PROXY or "
                                 f"client_x509_proxy to name a file (got {s.client_proxy!r})")
    if s.ca_cert and not os.path.exists(s.ca_cert):
        raise InvalidInput(f"ca_cert {s.ca_cert!r} does not exist")
