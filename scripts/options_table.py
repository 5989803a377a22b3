"""Print the table of ``rucio-fs mount`` options that docs/configuration.md carries, made from
the command itself (``tests/test_docs.py`` checks that the page holds exactly this table):

    .venv/bin/python scripts/options_table.py
"""

from __future__ import annotations

from dataclasses import fields

import click

from rucio_fs.cli.commands import cli
from rucio_fs.config import MountConfig

#: Defaults the command leaves to the configuration (text and path options).
CONFIG_DEFAULTS = {spec.metadata["option"][0]: spec.default for spec in fields(MountConfig)}

UNITS = {"_Duration": "duration (`30s`, `5m`, `2h`, `1d`)", "_Size": "size (`64M`, `1G`)",
         "IntParamType": "count", "IntRange": "count", "Path": "path",
         "BoolParamType": "switch", "Choice": "one of"}


def _default(param: click.Option) -> str:
    value = param.default
    if param.is_flag:
        return "on" if value is True else "off"
    if value is None:
        value = CONFIG_DEFAULTS.get(param.opts[0]) or None
    if value is None or value is click.core.UNSET or value == ():
        return "—"
    kind = type(param.type).__name__
    if kind == "_Duration":
        seconds = float(value)
        for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
            if seconds >= size and seconds % size == 0:
                return f"`{int(seconds // size)}{unit}`"
        return f"`{seconds:g}s`"
    if kind == "_Size":
        for unit, size in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
            if value >= size and value % size == 0:
                return f"`{value // size}{unit}`"
        return f"`{value}`"
    return f"`{value}`"


def options_table() -> str:
    rows = ["| option | takes | default | what it does |", "|---|---|---|---|"]
    for param in cli.commands["mount"].params:
        if not isinstance(param, click.Option) or param.hidden:
            continue
        names = ", ".join(f"`{n}`" for n in (*param.opts, *param.secondary_opts))
        kind = type(param.type).__name__
        takes = UNITS.get(kind, "text")
        if kind == "Choice":
            takes = "one of " + ", ".join(f"`{c}`" for c in param.type.choices)
        text = " ".join((param.help or "").split()).replace("|", "\\|")
        rows.append(f"| {names} | {takes} | {_default(param)} | {text} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(options_table(), end="")
