"""The plugin proves itself against rucio-fs's backend conformance suite: one import, two
fixtures. Run with ``pytest test_notes.py`` where the plugin is installed."""

from __future__ import annotations

import pytest

from rucio_fs.testing.conformance import BackendConformance, Sample, SampleFile


class TestNotes(BackendConformance):
    @pytest.fixture
    def url(self) -> str:
        return "notes://?n=4"

    @pytest.fixture
    def bad_urls(self) -> list[str]:
        return ["notes://?n=many"]

    @pytest.fixture
    def sample(self) -> Sample:
        notes = {f"note-{i}.txt": f"note number {i}\n".encode() for i in range(4)}
        return Sample("/", {name: SampleFile.of(text) for name, text in notes.items()})
