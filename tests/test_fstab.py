"""Mounting as the system does: ``mount -t fuse.rucio-fs``, an fstab line, systemd units.

mount(8) runs ``mount.fuse3``, which runs ``rucio-fs URL MOUNTPOINT -o OPTIONS`` found on
mount's own PATH: the tests put the installed ``rucio-fs`` in ``/usr/local/bin`` for their
duration (whatever was there is put back).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO, wait_for

from rucio_fs.cli.daemon import process_running
from rucio_fs.observe import control
from rucio_fs.observe.mounts import find_mount

HELPER = Path("/usr/local/bin/rucio-fs")


@pytest.fixture(scope="module")
def on_mount_path() -> Iterator[None]:
    """The installed ``rucio-fs`` where mount(8) looks for it."""
    saved = HELPER.with_name("rucio-fs.saved-by-tests")
    if HELPER.exists() or HELPER.is_symlink():
        HELPER.rename(saved)
    HELPER.symlink_to(Path(sys.executable).parent / "rucio-fs")
    try:
        yield
    finally:
        HELPER.unlink()
        if saved.exists() or saved.is_symlink():
            saved.rename(HELPER)


@pytest.fixture
def mountpoint(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "mnt"
    path.mkdir()
    yield path
    if find_mount(str(path)) is not None:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def umount_and_wait(path: Path) -> None:
    pid = control.request(str(path), "info")["pid"]
    subprocess.run(["umount", str(path)], check=True, capture_output=True)
    assert find_mount(str(path)) is None
    wait_for(lambda: not process_running(pid))


def test_mount_t_fuse_rucio_fs_takes_every_kind_of_option(on_mount_path, mountpoint):
    result = subprocess.run(
        ["mount", "-t", "fuse.rucio-fs", "demo://", str(mountpoint), "-o",
         "cold,listing_ttl=30s,allow_other,nosuid,nodev,_netdev,noauto,nofail,"
         "x-systemd.automount,x-systemd.requires=network-online.target"],
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    info = find_mount(str(mountpoint))
    assert info is not None and info.fstype == "fuse.rucio-fs"
    line = next(row for row in Path("/proc/self/mountinfo").read_text().splitlines()
                if f" {mountpoint} " in row)
    assert "nosuid" in line and "nodev" in line and "allow_other" in line
    config = control.request(str(mountpoint), "stats")["config"]
    assert config["listing"] is False and config["listing_ttl"] == 30.0  # cold, and the TTL
    assert "files-500" in {p.name for p in (mountpoint / "ls").iterdir()}
    umount_and_wait(mountpoint)


def test_an_fstab_line_mounts_with_backend_options(on_mount_path, mountpoint, tmp_path):
    fstab = tmp_path / "fstab"
    fstab.write_text(f"# a test fstab\ndemo://?latency=1ms {mountpoint} fuse.rucio-fs "
                     "noauto,_netdev,allow_other,xattrs,metadata_ttl=5m 0 0\n")
    result = subprocess.run(["mount", "-T", str(fstab), str(mountpoint)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    snap = control.request(str(mountpoint), "stats")
    assert snap["config"]["metadata_ttl"] == 300.0 and snap["kernel"]["xattrs"] is True
    assert "latency=1ms" in snap["url"]
    umount_and_wait(mountpoint)


def test_an_unknown_option_is_one_line_and_nothing_is_mounted(on_mount_path, mountpoint):
    result = subprocess.run(["mount", "-t", "fuse.rucio-fs", "demo://", str(mountpoint),
                             "-o", "colder"], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "unknown option 'colder'" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert find_mount(str(mountpoint)) is None


def test_rucio_fs_mount_o_takes_the_words_fstab_takes(mountpoint):
    """One meaning for -o: mount options, kernel flags, mount(8)'s own words and backend
    KEY=VALUE, as in fstab; an unknown word is one line and nothing is mounted."""
    from conftest import run_cli

    run_cli("mount", "demo://", str(mountpoint), "-o", "cold,listing_ttl=30s,nosuid,_netdev",
            "-o", "latency=1ms", check=True)
    try:
        snap = control.request(str(mountpoint), "stats")
        assert snap["config"]["listing"] is False and snap["config"]["listing_ttl"] == 30.0
        assert "latency=1ms" in snap["url"]
        line = next(row for row in Path("/proc/self/mountinfo").read_text().splitlines()
                    if f" {mountpoint} " in row)
        assert "nosuid" in line
    finally:
        umount_and_wait(mountpoint)
    refused = run_cli("mount", "demo://", str(mountpoint), "-o", "cold,colder")
    assert refused.returncode == 2 and "unknown option 'colder'" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert find_mount(str(mountpoint)) is None


def test_o_keeps_the_commas_of_a_backend_list_and_option_is_always_the_backends():
    from rucio_fs.cli.commands import mount
    from rucio_fs.cli.fstab import with_expanded_options

    assert with_expanded_options(
        ["mount", "rucio:///", "/m", "-o", "rses=A,B,nosuid,allow_other,timeout=1m",
         "-oschemes=https,http", "--option", "timeout=5s"], mount) == [
        "mount", "rucio:///", "/m", "--option", "rses=A,B", "--kernel-flag", "nosuid",
        "--allow-other", "--timeout", "1m", "--option", "schemes=https,http",
        "--option", "timeout=5s"]


def test_the_systemd_units_in_the_docs_verify(tmp_path):
    units = sorted((REPO / "docs" / "systemd").glob("*.*mount"))
    assert {u.name for u in units} == {"mnt-rucio.mount", "mnt-rucio.automount"}
    for unit in units:
        shutil.copy(unit, tmp_path / unit.name)
    result = subprocess.run(["systemd-analyze", "verify", "--man=no",
                             *(str(tmp_path / u.name) for u in units)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    # verify is not blind: a unit whose name does not match its mountpoint is refused.
    (tmp_path / "mnt-other.mount").write_text((tmp_path / "mnt-rucio.mount").read_text())
    result = subprocess.run(["systemd-analyze", "verify", "--man=no",
                             str(tmp_path / "mnt-other.mount")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "doesn't match unit name" in result.stderr
