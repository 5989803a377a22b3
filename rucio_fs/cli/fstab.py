"""``mount -t fuse.rucio-fs`` and fstab: the mount helper's command line as ``rucio-fs mount``.

mount(8) hands a ``fuse.rucio-fs`` line to ``mount.fuse3``, which runs::

    rucio-fs URL MOUNTPOINT -o OPTION[,OPTION...]

(``rucio-fs`` found on mount's own PATH, e.g. ``/usr/local/bin``). Each ``-o`` option is:

* a ``rucio-fs mount`` option in its ``-o`` spelling: ``allow_other``, ``cold``,
  ``listing_ttl=30s``, ``identity=per-user``, ``no_xattrs`` (``_`` or ``-`` alike);
* a kernel mount flag (``ro``, ``nosuid``, ``nodev``, ``noexec``, ``noatime``, ``sync``, ...),
  handed to the kernel as mount(8) would;
* one of mount(8)'s own (``defaults``, ``auto``, ``noauto``, ``user``, ``users``, ``_netdev``,
  ``nofail``, ``x-systemd.*``, ``x-*``, ``comment=``, ``rw``, ``relatime``, ...): accepted and
  ignored, as mount(8) expects of a helper;
* else ``KEY=VALUE``: a backend option, as ``-o KEY=VALUE`` of ``rucio-fs mount``;
* anything else: a one-line error.
"""

from __future__ import annotations

from collections.abc import Sequence

import click

#: Flags the kernel applies to the mount (libfuse passes them on).
KERNEL_FLAGS = frozenset({"ro", "suid", "nosuid", "dev", "nodev", "exec", "noexec", "async",
                          "sync", "dirsync", "noatime"})
#: mount(8)'s own options and access-time policies libfuse does not take: ignored.
IGNORED = frozenset({"defaults", "auto", "noauto", "user", "nouser", "users", "owner",
                     "group", "_netdev", "nofail", "rw", "atime", "relatime", "strictatime",
                     "lazytime", "nodiratime", "diratime", "loud", "silent"})
IGNORED_PREFIXES = ("x-", "comment=", "context=", "fscontext=", "defcontext=", "rootcontext=")


def is_helper_call(argv: Sequence[str]) -> bool:
    """Whether ``argv`` is the mount helper's ``URL MOUNTPOINT [-o OPTIONS]``."""
    return len(argv) >= 2 and "://" in argv[0] and not argv[0].startswith("-")


def as_mount_command(argv: Sequence[str], mount: click.Command) -> list[str]:
    """``argv`` (``URL MOUNTPOINT -o A,B=C ...``) as arguments of ``rucio-fs mount``;
    click.UsageError (one line) for an option that is none of the above."""
    url, mountpoint, *rest = argv
    options: list[str] = []
    while rest:
        flag = rest.pop(0)
        if flag == "-o" and rest:
            options += [o for o in rest.pop(0).split(",") if o]
        elif flag.startswith("-o") and len(flag) > 2:
            options += [o for o in flag[2:].split(",") if o]
        else:
            raise click.UsageError(f"mount helper: unexpected argument {flag!r} "
                                   "(expected URL MOUNTPOINT -o OPTIONS)")
    flags, valued = _mount_options(mount)
    args = ["mount", url, mountpoint]
    for option in options:
        key, sep, value = option.partition("=")
        name = key.replace("_", "-")
        if option in IGNORED or option.startswith(IGNORED_PREFIXES):
            continue
        if option in KERNEL_FLAGS:
            args += ["--kernel-flag", option]
        elif not sep and name in flags:
            args.append(flags[name])
        elif sep and name in valued:
            args += [valued[name], value]
        elif sep and key:
            args += ["-o", option]
        else:
            raise click.UsageError(f"mount helper: unknown option {option!r} (a rucio-fs "
                                   "mount option, a kernel flag, or a backend KEY=VALUE)")
    return args


def _mount_options(mount: click.Command) -> tuple[dict[str, str], dict[str, str]]:
    """The mount command's flags (``name`` -> ``--name``) and valued options, by the names
    an ``-o`` list spells them."""
    flags: dict[str, str] = {}
    valued: dict[str, str] = {}
    for param in mount.params:
        if not isinstance(param, click.Option):
            continue
        for spelling in (*param.opts, *param.secondary_opts):
            if not spelling.startswith("--") or spelling in ("--help", "--option"):
                continue
            name = spelling[2:]
            (flags if param.is_flag else valued)[name] = spelling
    return flags, valued
