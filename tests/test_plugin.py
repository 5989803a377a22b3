"""The extension path: an out-of-tree package registers a backend through the entry-point
group ``rucio_fs.backends`` and is mounted like a built-in one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_cli

from rucio_fs.observe.mounts import find_mount

PLUGIN = Path(__file__).parent / "plugin_example"


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The example plugin pip-installed into its own directory, put on PYTHONPATH."""
    target = tmp_path_factory.mktemp("plugin-site")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--no-build-isolation", "--target", str(target), str(PLUGIN)],
                   check=True, capture_output=True)
    return {**os.environ, "PYTHONPATH": str(target)}


def test_backends_lists_builtin_and_plugin(plugin_env):
    listed = run_cli("backends", env=plugin_env, check=True).stdout
    assert "demo://" in listed and "rucio_fs.backends.demo:DemoBackend" in listed
    assert "notes://" in listed and "rucio_fs_notes:NotesBackend" in listed
    assert "notes://" not in run_cli("backends", check=True).stdout


def test_mount_plugin_backend(plugin_env, tmp_path):
    mp = tmp_path / "notes"
    mp.mkdir()
    run_cli("mount", "notes://?n=4", str(mp), "--log-file", str(tmp_path / "log"),
            env=plugin_env, check=True)
    try:
        assert sorted(os.listdir(mp)) == [f"note-{i}.txt" for i in range(4)]
        assert (mp / "note-2.txt").read_text() == "note number 2\n"
        assert find_mount(str(mp)).source == "notes://?n=4"
    finally:
        run_cli("unmount", str(mp), check=True)


def test_plugin_url_errors_are_one_line(plugin_env, tmp_path):
    result = run_cli("mount", "notes://?n=many", str(tmp_path), env=plugin_env)
    assert result.returncode == 1
    assert result.stderr == "rucio-fs: notes: n must be a number, not 'many'\n"


def test_the_plugin_passes_the_conformance_suite(plugin_env):
    """What a plugin author runs: the suite, imported by the plugin's own test module."""
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             "--rootdir", str(PLUGIN), "--confcutdir", str(PLUGIN),
                             str(PLUGIN / "test_notes.py")],
                            capture_output=True, text=True, env=plugin_env, timeout=300)
    summary = result.stdout.strip().splitlines()[-1]
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert " passed" in summary and "skipped" not in summary and "failed" not in summary
