"""The ``rucio-fs`` command line. Errors are one line on stderr and a non-zero exit code:
2 for usage errors, 1 for everything else, never a traceback."""

from __future__ import annotations

import json
import os
import signal
import sys
from dataclasses import fields, replace
from typing import Any
from urllib.parse import urlencode

import click

from rucio_fs import __version__
from rucio_fs.cli import fstab
from rucio_fs.cli import warm_client as warming
from rucio_fs.config import LAYERS, MountConfig
from rucio_fs.errors import InvalidInput, RucioFsError
from rucio_fs.observe import control, report
from rucio_fs.options import parse_duration, parse_size


class _Duration(click.ParamType):
    name = "duration"

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        try:
            return value if isinstance(value, float) else parse_duration(value)
        except InvalidInput as exc:
            self.fail(str(exc), param, ctx)


class _Size(click.ParamType):
    name = "size"

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        try:
            return value if isinstance(value, int) else parse_size(value)
        except InvalidInput as exc:
            self.fail(str(exc), param, ctx)


DURATION, SIZE = _Duration(), _Size()
_KINDS: dict[str, Any] = {"duration": DURATION, "size": SIZE, "count": int,
                          "path": click.Path(file_okay=False), "text": str}


def config_options(command: Any) -> Any:
    """Add a ``mount`` option for every field of :class:`MountConfig`, from its metadata
    (name, help, kind, default): the configuration is declared once."""
    for spec in reversed(fields(MountConfig)):
        flag, *aliases = spec.metadata["option"]
        kind, text = spec.metadata["kind"], spec.metadata["help"]
        if kind in ("flag", "layer", "switch"):
            option = click.option(flag, *aliases, spec.name, is_flag=True, help=text)
        else:
            default = spec.default if kind not in ("path", "text") else None
            option = click.option(flag, *aliases, spec.name, type=_KINDS[kind],
                                  default=default, show_default=default is not None,
                                  help=text)
        command = option(command)
    return command


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="rucio-fs")
def cli() -> None:
    """Mount data catalogs (Rucio, iRODS, S3, ...) as ordinary directories."""


@cli.command()
@click.argument("url")
@click.argument("mountpoint")
@click.option("-f", "--foreground", is_flag=True, help="Stay in the foreground (log to stderr).")
@click.option("--debug", is_flag=True, help="Debug logging (and libfuse debug output).")
@click.option("--allow-other", is_flag=True, help="Let other users access the mount.")
@click.option("--identity", type=click.Choice(["mount", "per-user"]), default="mount",
              show_default=True,
              help="Whose credentials serve a request: the mounting user's, or each calling "
                   "user's own, found as their own client would (needs root and "
                   "--allow-other; docs/per-user.md).")
@click.option("--identity-map", type=click.Path(dir_okay=False), metavar="FILE",
              help="Per-user mounts: the site's settings per local user (account, profile, "
                   "proxy path), in place of the user's own (docs/per-user.md).")
@click.option("--log-file", type=click.Path(dir_okay=False),
              help="Daemon log (default: <runtime dir>/mount-<pid>.log).")
@click.option("--cold", is_flag=True, help="Turn every cache layer off.")
@click.option("--no-disk-cache", is_flag=True, help="Ignore --cache-dir (no disk layer).")
@config_options
@click.option("--xattrs/--no-xattrs", default=False, show_default=True,
              help="Expose checksums and metadata as user.* xattrs. Off by default: `ls -l` "
                   "asks two xattrs per file, each a FUSE round trip.")
@click.option("--read-ahead-kb", type=click.IntRange(0, 1 << 20), default=1024,
              show_default=True,
              help="Kernel read-ahead of the mount (root only; 0 keeps the kernel default).")
@click.option("--max-background", type=click.IntRange(0, 65535), default=64, show_default=True,
              help="FUSE background requests in flight (root only; 0 keeps the default).")
@click.option("--max-tasks", type=click.IntRange(1, 10_000), default=256, show_default=True,
              help="Most FUSE requests served concurrently.")
@click.option("--kernel-flag", "kernel_flags", multiple=True, hidden=True,
              type=click.Choice(sorted(fstab.KERNEL_FLAGS)),
              help="A kernel mount flag (nosuid, nodev, ro, ...), as the mount helper passes.")
@click.option("-o", "fstab_words", multiple=True, metavar="OPTION[,OPTION...]",
              help="Options as fstab spells them: mount options (allow_other, listing_ttl=5m), "
                   "kernel flags (nosuid, noatime) and backend KEY=VALUE, the same as "
                   "?KEY=VALUE in the URL (endpoint_url=https://s3.example.org); repeatable.")
@click.option("--option", "options", multiple=True, metavar="KEY=VALUE",
              help="A backend option, also one whose name a mount option has (timeout=1s: "
                   "the backend's per-request timeout); repeatable.")
def mount(url: str, mountpoint: str, foreground: bool, debug: bool, allow_other: bool,
          identity: str, identity_map: str | None, log_file: str | None, cold: bool,
          no_disk_cache: bool, xattrs: bool, read_ahead_kb: int, max_background: int,
          max_tasks: int, kernel_flags: tuple[str, ...], fstab_words: tuple[str, ...],
          options: tuple[str, ...], **config: Any) -> int:
    """Mount the catalog at URL (demo://, ...) on MOUNTPOINT.

    Returns once the mount is ready, leaving the daemon in the background (unless -f).
    """
    from .daemon import MountRequest
    from .daemon import mount as do_mount

    if fstab_words:  # main() spells -o out before click parses (rucio_fs.cli.fstab)
        raise click.UsageError("-o is read by the rucio-fs command itself: run rucio-fs")
    cache = MountConfig.from_options(config, cold=cold, no_disk_cache=no_disk_cache)
    if cache.passthrough:
        from rucio_fs.fuse.passthrough import refusal

        reason = refusal(cache.write_back, identity, disk=cache.disk)
        if reason:  # the mount goes on without it
            click.echo(f"rucio-fs: {reason}: mounting without it", err=True)
            cache = replace(cache, passthrough=False)
    url = with_options(url, options)
    return do_mount(MountRequest(url, mountpoint, cache, foreground, debug, allow_other,
                                 log_file, max_tasks, xattrs, read_ahead_kb, max_background,
                                 identity, kernel_flags, identity_map))


def with_options(url: str, options: tuple[str, ...]) -> str:
    """``url`` with ``-o KEY=VALUE`` options appended to its query string."""
    pairs = []
    for option in options:
        key, sep, value = option.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{option!r} is not KEY=VALUE", param_hint="-o")
        pairs.append((key, value))
    if not pairs:
        return url
    return url + ("&" if "?" in url else "?") + urlencode(pairs)


@cli.command()
@click.argument("mountpoint")
@click.option("--retry", is_flag=True, help="Try every pending upload again now.")
@click.option("--wait", is_flag=True,
              help="Wait until everything queued (async write-back) is on the server.")
@click.option("--discard", "discard", multiple=True, metavar="PATH",
              help="Throw away the pending content of PATH (a path inside the mount).")
def uploads(mountpoint: str, retry: bool, wait: bool, discard: tuple[str, ...]) -> int:
    """What the server does not have yet: queued changes (async write-back) and files whose
    upload failed, whose data waits in the staging directory. Exit 1 if there is any."""
    root = os.path.abspath(mountpoint)
    paths = []
    for path in discard:
        full = os.path.abspath(path)
        if full != root and not full.startswith(root + os.sep):
            raise click.BadParameter(f"{path} is not inside {mountpoint}", param_hint="--discard")
        rel = os.path.relpath(full, root)
        paths.append("/" if rel == "." else "/" + rel)
    result = control.request(mountpoint, "uploads", retry=retry, wait=wait, discard=paths,
                             timeout=None if wait else 60.0)
    for path in result["discarded"]:
        click.echo(f"discarded {path}")
    for item in result["pending"]:
        click.echo(f"pending {item['path']}{_of_user(item)} ({item['size']} bytes, staged in "
                   f"{item['staged']})" + (f": {item['error']}" if item["error"] else ""))
    queued = result.get("queued", [])
    for item in queued:
        state = "running" if item["running"] else f"try {item['attempts'] + 1}"
        click.echo(f"queued {item['op']} {item['path']}{_of_user(item)} ({state})"
                   + (f": {item['error']}" if item["error"] else ""))
    for item in result.get("dropped", []):
        click.echo(f"given up {item['op']} {item['path']}: {item['error']}")
    for path, error in result["failed"]:
        if path == "/":
            click.echo(f"failed: {error}")
    if not (result["pending"] or queued or result["discarded"] or result.get("dropped")):
        click.echo("no pending uploads")
    return 1 if result["pending"] or queued or result.get("dropped") else 0


def _of_user(item: dict) -> str:
    """`` of uid N`` for a per-user mount's file, else nothing."""
    return f" of uid {item['uid']}" if "uid" in item else ""


@cli.command()
@click.argument("mountpoint")
def unmount(mountpoint: str) -> None:
    """Unmount MOUNTPOINT and wait for its daemon to exit."""
    from .daemon import unmount as do_unmount

    do_unmount(mountpoint)


@cli.group()
def cache() -> None:
    """Cache control of a live mount."""


@cache.command("drop")
@click.argument("mountpoint")
@click.option("--layer", "layers", multiple=True, type=click.Choice([*LAYERS, "all"]),
              help="Layer to drop (repeatable; default: all, the kernel's included).")
def cache_drop(mountpoint: str, layers: tuple[str, ...]) -> None:
    """Drop cached data of a live mount so the next access is cold."""
    chosen = list(LAYERS) if not layers or "all" in layers else list(layers)
    result = control.request(mountpoint, "drop", layers=chosen)
    click.echo(f"dropped {', '.join(result['layers'])}"
               + (f" ({result['kernel_inodes_invalidated']} kernel inodes invalidated)"
                  if "kernel" in result["layers"] else ""))


@cli.command(context_settings={"ignore_unknown_options": False})
@click.argument("args", nargs=-1)
@click.option("--format", "fmt", type=click.Choice(report.FORMATS), default="table",
              show_default=True)
@click.option("--reset", is_flag=True, help="Zero the counters after reading them.")
@click.option("--all", "everything", is_flag=True, help="diff: list unchanged metrics too.")
@click.option("--serve", metavar="HOST:PORT",
              help="Serve every mount's metrics (Prometheus) at http://HOST:PORT/metrics.")
def stats(args: tuple[str, ...], fmt: str, reset: bool, everything: bool,
          serve: str | None) -> None:
    """Counters and latency histograms of a mount.

    \b
    rucio-fs stats MOUNTPOINT [--format table|csv|json|prometheus] [--reset]
    rucio-fs stats diff A.csv B.csv
    rucio-fs stats --serve HOST:PORT    (every mount, labelled, until Ctrl-C)
    """
    if serve is not None:
        if args:
            raise click.UsageError("stats --serve takes no MOUNTPOINT: it serves every mount")
        from rucio_fs.observe import metrics

        metrics.serve(serve, lambda line: click.echo(line, err=True))
        return
    if not args:
        raise click.UsageError("stats takes a MOUNTPOINT (or: stats diff A.csv B.csv, "
                               "stats --serve HOST:PORT)")
    if args[0] == "diff":
        if len(args) != 3:
            raise click.UsageError("stats diff takes two CSV files: stats diff A.csv B.csv")
        click.echo(report.diff(args[1], args[2], everything))
        return
    if len(args) != 1:
        raise click.UsageError("stats takes one MOUNTPOINT (or: stats diff A.csv B.csv)")
    click.echo(report.render(control.request(args[0], "stats", reset=reset), fmt))


@cli.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("-r", "--recursive", is_flag=True, help="Every directory below PATHS too.")
@click.option("--data", is_flag=True,
              help="Read every file's data too (into the data and disk layers).")
@click.option("-j", "--jobs", type=click.IntRange(1, 256), default=8, show_default=True,
              help="Directories or files worked on at once.")
def warm(paths: tuple[str, ...], recursive: bool, data: bool, jobs: int) -> int:
    """Fill a mount's caches for PATHS before a job reads them: listings and metadata, and
    with --data file contents. Progress on stderr; Ctrl-C or SIGTERM stops it, in the daemon
    too, with its summary (exit 128 + the signal's number)."""
    mountpoint, roots = warming.catalog_paths(paths)
    summary = warming.follow(mountpoint, roots, recursive, data, jobs)
    click.echo(summary["line"], err=True)
    for message in summary["messages"]:
        click.echo(f"  {message}", err=True)
    if summary["cancelled"]:
        return 128 + (summary["signal"] or signal.SIGINT)
    return 1 if summary["errors"] else 0


@cli.command()
@click.argument("mountpoint")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.option("--duration", type=DURATION, help="Trace for this long (default: until Ctrl-C).")
@click.option("--format", "fmt", type=click.Choice(("table", "csv", "json")), default="table",
              show_default=True)
@click.option("--buffer-mb", type=click.IntRange(1, 4096), default=64, show_default=True,
              help="Kernel trace buffer per CPU.")
@click.option("--mount-tracefs", is_flag=True, help="Mount tracefs if it is not mounted.")
def trace(mountpoint: str, command: tuple[str, ...], duration: float | None, fmt: str,
          buffer_mb: int, mount_tracefs: bool) -> int:
    """Trace a mount's FUSE requests in the kernel and in the daemon, joined.

    \b
    rucio-fs trace MOUNTPOINT --duration 10
    rucio-fs trace MOUNTPOINT -- ls -l MOUNTPOINT/some/dir   (the command's output goes to stderr)
    """
    argv = list(command[1:] if command[:1] == ("--",) else command)
    from rucio_fs.observe import tracing

    code, result = tracing.run_trace(mountpoint, argv, duration, buffer_mb, mount_tracefs)
    if fmt == "json":
        click.echo(json.dumps(result, indent=2))
    elif fmt == "csv":
        click.echo(report.to_csv(tracing.flatten(result)))
    else:
        click.echo(tracing.render_table(result))
    return code


@cli.command()
def backends() -> None:
    """List the installed backends (entry-point group rucio_fs.backends)."""
    from rucio_fs.registry import available  # importlib.metadata: only this command needs it

    for scheme, ep in sorted(available().items()):
        try:
            cls = ep.load()
            line = f"{scheme + '://':<12} {ep.value:<45} {getattr(cls, 'description', '')}"
        except Exception as exc:
            line = f"{scheme + '://':<12} {ep.value:<45} (fails to load: {exc})"
        click.echo(line.rstrip())


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: click without its multi-line error output. Called as the
    mount helper (``rucio-fs URL MOUNTPOINT -o OPTIONS``, by ``mount -t fuse.rucio-fs`` and
    fstab), it mounts (see :mod:`rucio_fs.cli.fstab`)."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        if fstab.is_helper_call(argv):
            argv = fstab.as_mount_command(argv, mount)
        elif argv[:1] == ["mount"]:
            argv = fstab.with_expanded_options(argv, mount)
        code = cli.main(args=argv, prog_name="rucio-fs", standalone_mode=False)
    except click.ClickException as exc:
        click.echo(f"rucio-fs: error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except click.Abort:
        click.echo("rucio-fs: aborted", err=True)
        sys.exit(130)
    except RucioFsError as exc:
        click.echo(f"rucio-fs: {exc}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)
