"""A hypothesis state machine drives create/write/rename/unlink/mkdir/rmdir through a real S3
mount (versitygw) and compares the mount, and the server's own listing, with a model tree."""

from __future__ import annotations

import errno
import itertools
import os
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

NAMES = st.sampled_from(["a", "b", "c", "d e", "é"])
DATA = st.binary(max_size=3000)
DIR = None  # the model's marker for a directory

runs = itertools.count()


class S3Tree(RuleBasedStateMachine):
    """``model`` maps relative paths (``""`` is the root) to bytes or :data:`DIR`."""

    mount: Path
    client = None
    prefix = ""

    @initialize()
    def fresh_root(self) -> None:
        self.name = f"run{next(runs)}"
        self.root = self.mount / self.name
        self.root.mkdir()
        self.model: dict[str, bytes | None] = {"": DIR}

    def dirs(self) -> list[str]:
        return sorted(p for p, v in self.model.items() if v is DIR)

    def files(self) -> list[str]:
        return sorted(p for p, v in self.model.items() if v is not DIR)

    def _join(self, parent: str, name: str) -> str:
        return f"{parent}/{name}" if parent else name

    def _expect(self, code: int | None, call) -> None:
        if code is None:
            call()
            return
        with pytest.raises(OSError) as exc:
            call()
        assert exc.value.errno == code

    @rule(data=st.data(), name=NAMES, content=DATA)
    def write_file(self, data, name: str, content: bytes) -> None:
        parent = data.draw(st.sampled_from(self.dirs()))
        path = self._join(parent, name)
        if self.model.get(path, b"") is DIR:
            self._expect(errno.EISDIR, lambda: (self.root / path).write_bytes(content))
            return
        (self.root / path).write_bytes(content)
        self.model[path] = content

    @rule(data=st.data(), content=DATA)
    def append(self, data, content: bytes) -> None:
        if not self.files():
            return
        path = data.draw(st.sampled_from(self.files()))
        with open(self.root / path, "ab") as f:
            f.write(content)
        self.model[path] += content  # type: ignore[operator]

    @rule(data=st.data(), name=NAMES)
    def mkdir(self, data, name: str) -> None:
        path = self._join(data.draw(st.sampled_from(self.dirs())), name)
        if path in self.model:
            self._expect(errno.EEXIST, lambda: (self.root / path).mkdir())
            return
        (self.root / path).mkdir()
        self.model[path] = DIR

    @rule(data=st.data())
    def unlink(self, data) -> None:
        if not self.files():
            return
        path = data.draw(st.sampled_from(self.files()))
        (self.root / path).unlink()
        del self.model[path]

    @rule(data=st.data())
    def rmdir(self, data) -> None:
        dirs = [d for d in self.dirs() if d]
        if not dirs:
            return
        path = data.draw(st.sampled_from(dirs))
        if any(p.startswith(path + "/") for p in self.model):
            self._expect(errno.ENOTEMPTY, lambda: (self.root / path).rmdir())
            return
        (self.root / path).rmdir()
        del self.model[path]

    @rule(data=st.data(), name=NAMES)
    def rename_file(self, data, name: str) -> None:
        if not self.files():
            return
        source = data.draw(st.sampled_from(self.files()))
        target = self._join(data.draw(st.sampled_from(self.dirs())), name)
        if target == source or source.startswith(target + "/"):
            return
        if self.model.get(target, b"") is DIR:
            self._expect(errno.EISDIR, lambda: os.rename(self.root / source, self.root / target))
            return
        os.rename(self.root / source, self.root / target)
        self.model[target] = self.model.pop(source)

    @rule(data=st.data(), name=NAMES)
    def rename_dir(self, data, name: str) -> None:
        dirs = [d for d in self.dirs() if d]
        if not dirs:
            return
        source = data.draw(st.sampled_from(dirs))
        target = self._join("", name)
        if target == source or source.startswith(target + "/"):
            return
        # The documented limit: S3 directories are not renamed in place (mv copies them).
        if target in self.model and self.model[target] is not DIR:
            self._expect(errno.ENOTDIR,
                         lambda: os.rename(self.root / source, self.root / target))
            return
        self._expect(errno.EXDEV, lambda: os.rename(self.root / source, self.root / target))

    @invariant()
    def mount_matches_model(self) -> None:
        if not hasattr(self, "model"):
            return
        seen: dict[str, bytes | None] = {"": DIR}
        for dirpath, dirnames, filenames in os.walk(self.root):
            rel = os.path.relpath(dirpath, self.root)
            rel = "" if rel == "." else rel
            for d in dirnames:
                seen[self._join(rel, d)] = DIR
            for f in filenames:
                seen[self._join(rel, f)] = Path(dirpath, f).read_bytes()
        assert seen == self.model

    def teardown(self) -> None:
        if not hasattr(self, "model"):
            return
        # The server's own view: every file is an object with its content; nothing else
        # (once an fsync of the tree settled the removals that ran ahead of unlink).
        fd = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        keys = {}
        base = f"{self.prefix}/{self.name}/"
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket="test",
                                                                          Prefix=base):
            for item in page.get("Contents", []):
                keys[item["Key"][len(base):]] = item["Size"]
        files = {k: v for k, v in keys.items() if k and not k.endswith("/")}
        assert files == {p: len(v) for p, v in self.model.items() if v is not DIR}


def test_operations_match_a_model_tree(mount_fs, s3_server):
    prefix = f"model-{uuid.uuid4().hex[:8]}"
    mnt = mount_fs(f"s3://test/{prefix}", "-o", f"endpoint_url={s3_server.endpoint}")
    S3Tree.mount = mnt.path
    S3Tree.client = s3_server.client()
    S3Tree.prefix = prefix
    S3Tree.TestCase.settings = settings(
        max_examples=int(os.environ.get("RUCIO_FS_MODEL_EXAMPLES", "12")),
        stateful_step_count=25, deadline=None,
        suppress_health_check=list(HealthCheck))
    S3Tree.TestCase().runTest()
