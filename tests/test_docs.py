"""The docs as a user meets them: every block marked runnable (the README's tour, the
manual pages' examples on the demo and memory catalogs) runs as printed,
every relative link points at a file that exists, every option a ``rucio-fs`` command line in
the docs uses exists, and every option of ``rucio-fs mount`` is documented."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
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


RUNNABLE = "runnable"
FAILS = re.compile(r"^(?P<command>.+?)\s+# fails\b")


def runnable_blocks() -> list[tuple[str, list[str]]]:
    """Every code block of README.md and docs/ whose info string says ``runnable`` (```` ```sh
    runnable ````), named by file and line: blocks that run as printed on the demo or memory
    catalog, from an empty home directory."""
    found = []
    for doc in DOCS:
        lines = doc.read_text().splitlines()
        for number, line in enumerate(lines, 1):
            if line.startswith("```") and RUNNABLE in line.split()[1:]:
                block = lines[number:lines.index("```", number)]
                found.append((f"{doc.relative_to(REPO)}:{number}", block))
    return found


def as_script(block: list[str]) -> str:
    """The block as a ``set -e`` script in which a line whose comment begins ``# fails`` must
    fail (the docs show a refusal there) and every other line must succeed."""
    script = ["set -e"]
    for line in block:
        refused = FAILS.match(line)
        if refused:
            command = refused["command"]
            script.append(f"if {command}; then echo 'succeeded, the docs say it fails: "
                          f"{command}' >&2; exit 1; fi")
        else:
            script.append(line)
    return "\n".join(script)


def test_the_readme_tour_and_the_manual_pages_have_runnable_blocks():
    where = {name.split(":")[0] for name, _ in runnable_blocks()}
    assert {"README.md", "docs/usage.md", "docs/integrity.md",
            "docs/backends/memory.md"} <= where, where


@pytest.mark.parametrize("where, block", runnable_blocks(), ids=lambda v: v
                         if isinstance(v, str) else "")
def test_every_runnable_block_runs_as_printed(where, block, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    try:
        done = subprocess.run(["bash", "-c", as_script(block)], capture_output=True,
                              text=True, env=env, cwd=tmp_path, timeout=600)
        assert done.returncode == 0, f"{where}: {done.stderr[-3000:]}"
        assert done.stdout.strip() and "Traceback" not in done.stderr, where
        if where.startswith("README.md"):
            assert "file-010000.dat" in done.stdout and "rucio://" in done.stdout
    finally:
        for mountpoint in sorted(home.iterdir()):
            if find_mount(str(mountpoint)) is not None:
                subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)])


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
