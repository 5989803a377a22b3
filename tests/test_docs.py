"""The docs as a user meets them: the README's tour runs as printed (on the demo catalog),
every relative link points at a file that exists, every option a ``rucio-fs`` command line in
the docs uses exists, and every option of ``rucio-fs mount`` is documented."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import click
from conftest import REPO, find_mount

from rucio_fs.cli.commands import cli

DOCS = sorted([REPO / "README.md", REPO / "benchmarks" / "README.md",
               *(REPO / "docs").rglob("*.md")])
LINK = re.compile(r"\]\(([^)\s]+)\)")
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def code_blocks(text: str) -> list[list[str]]:
    blocks, current = [], None
    for line in text.splitlines():
        if line.startswith("```"):
            if current is None:
                current = []
            else:
                blocks.append(current)
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def options_of(command: click.Command) -> set[str]:
    return {spelling for param in command.params if isinstance(param, click.Option)
            for spelling in (*param.opts, *param.secondary_opts)} | {"--help"}


def test_every_relative_link_points_at_a_file():
    broken = []
    for doc in DOCS:
        for target in LINK.findall(doc.read_text()):
            if "://" in target or target.startswith(("#", "mailto:")):
                continue
            path = (doc.parent / target.split("#")[0]).resolve()
            if not path.exists():
                broken.append(f"{doc.relative_to(REPO)}: {target}")
    assert not broken, broken


def test_every_option_of_a_rucio_fs_command_line_in_the_docs_exists():
    unknown = []
    for doc in DOCS:
        for block in code_blocks(doc.read_text()):
            for line in block:
                words = line.split("#")[0].split()
                if len(words) < 2 or words[0] != "rucio-fs":
                    continue
                command = cli.commands.get(words[1])
                if command is None:
                    unknown.append(f"{doc.name}: rucio-fs {words[1]}")
                    continue
                if isinstance(command, click.Group):
                    command = command.commands.get(words[2], command) if len(words) > 2 \
                        else command
                for option in OPTION.findall(" ".join(words).split(" -- ")[0]):
                    if option not in options_of(command):
                        unknown.append(f"{doc.name}: {line.strip()}: {option}")
    assert not unknown, unknown


def commands(group: click.Group, prefix: str = "rucio-fs"):
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from commands(command, f"{prefix} {name}")
        else:
            yield f"{prefix} {name}", command


def test_every_option_of_every_command_is_documented():
    text = "\n".join(doc.read_text() for doc in DOCS)
    missing = [f"{name} {option}" for name, command in commands(cli)
               for param in command.params if isinstance(param, click.Option)
               and not param.hidden for option in (*param.opts, *param.secondary_opts)
               if option.startswith("--") and option != "--help" and option not in text]
    assert not missing, f"options no doc names: {missing}"


def test_the_readme_tour_runs_as_printed(tmp_path):
    readme = (REPO / "README.md").read_text()
    tour = readme.split("## A short tour", 1)[1]
    block = code_blocks(tour)[0]
    script = "\n".join(["set -e", *block])
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    try:
        done = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                              env=env, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "file-010000.dat" in done.stdout and "rucio://" in done.stdout
    finally:
        for name in ("demo", "cold"):
            if find_mount(str(home / name)) is not None:
                subprocess.run(["fusermount3", "-u", "-z", str(home / name)])


def test_the_configuration_page_lists_every_mount_option_as_the_command_has_it():
    import importlib.util

    spec = importlib.util.spec_from_file_location("options_table",
                                                  REPO / "scripts" / "options_table.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    table = module.options_table()
    assert table in (REPO / "docs" / "configuration.md").read_text(), (
        "docs/configuration.md: replace its options table with this (python "
        "scripts/options_table.py):\n" + table)
