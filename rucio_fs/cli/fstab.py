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
* else ``KEY=VALUE``: a backend option, the same as ``?KEY=VALUE`` in the URL (a bare word
  right after one continues its value: ``rses=A,B``);
* anything else: a one-line error.

``rucio-fs mount URL MOUNTPOINT -o OPTIONS`` takes the same words. A backend option whose
name a mount option has (``timeout``) is given with ``--option KEY=VALUE`` or in the URL.
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
    lists: list[str] = []
    while rest:
        flag = rest.pop(0)
        if flag == "-o" and rest:
            lists.append(rest.pop(0))
        elif flag.startswith("-o") and len(flag) > 2:
            lists.append(flag[2:])
        else:
            raise click.UsageError(f"mount helper: unexpected argument {flag!r} "
                                   "(expected URL MOUNTPOINT -o OPTIONS)")
    return ["mount", url, mountpoint, *expand_options(lists, mount)]


def with_expanded_options(argv: Sequence[str], mount: click.Command) -> list[str]:
    """``rucio-fs mount`` arguments whose ``-o`` lists are spelled out as
    :func:`expand_options` does: ``-o`` means on the command line what it means in fstab."""
    args: list[str] = []
    rest = list(argv)
    while rest:
        arg = rest.pop(0)
        if arg == "--":
            args += [arg, *rest]
            break
        if arg == "-o" and rest:
            args += expand_options([rest.pop(0)], mount)
        elif arg.startswith("-o") and len(arg) > 2:
            args += expand_options([arg[2:]], mount)
        else:
            args.append(arg)
    return args


def expand_options(lists: Sequence[str], mount: click.Command) -> list[str]:
    """The ``rucio-fs mount`` arguments that the comma-separated ``-o`` ``lists`` mean (see
    the module docstring). A bare word that is none of the known ones, right after a
    backend ``KEY=VALUE``, continues that value: ``rses=A,B`` is one option."""
    flags, valued = _mount_options(mount)
    args: list[str] = []
    backend_value = False  # whether the last word was a backend KEY=VALUE
    for option in (word for words in lists for word in words.split(",") if word):
        key, sep, value = option.partition("=")
        name = key.replace("_", "-")
        ignored = option in IGNORED or option.startswith(IGNORED_PREFIXES)
        known = ignored or option in KERNEL_FLAGS or (not sep and name in flags)
        if not sep and not known and backend_value:
            args[-1] += "," + option
            continue
        backend_value = False
        if ignored:
            continue
        if option in KERNEL_FLAGS:
            args += ["--kernel-flag", option]
        elif not sep and name in flags:
            args.append(flags[name])
        elif sep and name in valued:
            args += [valued[name], value]
        elif sep and key:
            args += ["--option", option]
            backend_value = True
        else:
            raise click.UsageError(f"unknown option {option!r} in -o (a rucio-fs mount "
                                   "option, a kernel flag, or a backend KEY=VALUE)")
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
