"""The journal's replay rules (:mod:`rucio_fs.journal`), in-process: what a next mount takes
over from a journal a daemon left behind."""

from __future__ import annotations

import os

from rucio_fs import journal


def left_behind(tmp_path, build) -> list[dict]:
    """The records a next mount replays from a journal ``build(j)`` filled and left."""
    j = journal.Journal(str(tmp_path), "catalog-1")
    build(j)
    os.close(j.fd)  # the daemon is gone: its lock with it
    records, old = journal.replay(str(tmp_path), "catalog-1")
    journal.remove_journals(old)
    return [(r["op"], r["path"]) for r in records]


def test_pending_records_replay_in_order_and_done_ones_do_not(tmp_path):
    def build(j):
        j.append({"op": "mkdir", "path": "/d"})
        put = j.append({"op": "stage", "path": "/d/f", "file": "1.data", "base": None})
        j.append({"op": "unlink", "path": "/old"})
        j.done(put)

    # The upload of /d/f ran after the mkdir of /d (they overlap): that one is done too,
    # whatever a power cut did to its own done record.
    assert left_behind(tmp_path, build) == [("unlink", "/old")]


def test_a_cancelled_record_implies_nothing_about_earlier_ones(tmp_path):
    def build(j):
        j.append({"op": "mkdir", "path": "/d2"})
        staged = j.append({"op": "stage", "path": "/d2/f", "file": "2.data", "base": None})
        j.done(staged, carried_out=False)  # removed before its upload

    assert left_behind(tmp_path, build) == [("mkdir", "/d2")]


def test_a_moved_staging_file_belongs_to_its_last_record(tmp_path):
    def build(j):
        j.append({"op": "stage", "path": "/a", "file": "3.data", "base": None})
        j.append({"op": "stage", "path": "/b", "file": "3.data", "base": None})

    assert left_behind(tmp_path, build) == [("stage", "/b")]


def test_a_torn_last_line_was_never_promised(tmp_path):
    def build(j):
        j.append({"op": "mkdir", "path": "/kept"})
        os.write(j.fd, b'{"op":"unlink","path":"/torn","n":9')

    assert left_behind(tmp_path, build) == [("mkdir", "/kept")]


def test_a_live_daemons_journal_and_another_catalogs_are_left_alone(tmp_path):
    live = journal.Journal(str(tmp_path), "catalog-1")
    live.append({"op": "mkdir", "path": "/live"})
    other = journal.Journal(str(tmp_path), "catalog-2")
    other.append({"op": "mkdir", "path": "/other"})
    os.close(other.fd)
    records, old = journal.replay(str(tmp_path), "catalog-1")
    assert records == [] and old == []
    live.close()
    assert os.path.exists(other.path)
