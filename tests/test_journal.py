"""The journal's replay rules (:mod:`rucio_fs.write.journal`), in-process: what a next mount takes
over from a journal a daemon left behind."""

from __future__ import annotations

import os

from rucio_fs.write import journal


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


def test_an_unmarked_record_is_a_fact_no_later_done_record_ends(tmp_path):
    def build(j):
        mkdir = j.append({"op": "mkdir", "path": "/d"})
        j.append({"op": "unmarked", "path": "/d"})  # its mkdir wrote no marker
        j.done(mkdir)
        put = j.append({"op": "stage", "path": "/d/f", "file": "4.data", "base": None})
        j.done(put)
        gone = j.append({"op": "unmarked", "path": "/e"})
        j.done(gone, carried_out=False)  # /e got its marker

    # The next mount still knows /d has no marker; the done upload below it implies only
    # that the steps before it were carried out.
    assert left_behind(tmp_path, build) == [("unmarked", "/d")]


def test_a_moved_staging_file_belongs_to_its_last_record(tmp_path):
    def build(j):
        j.append({"op": "stage", "path": "/a", "file": "3.data", "base": None})
        j.append({"op": "stage", "path": "/b", "file": "3.data", "base": None})

    assert left_behind(tmp_path, build) == [("stage", "/b")]


def test_a_torn_last_line_was_never_promised(tmp_path):
    def build(j):
        j.append({"op": "mkdir", "path": "/kept"})
        j._write(b'{"op":"unlink","path":"/torn","n":9')  # its end never reached the disk

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


def replayed(tmp_path) -> list[dict]:
    records, old = journal.replay(str(tmp_path), "catalog-1")
    contents = [journal.inline_content(r) if "inline" in r else None for r in records]
    journal.remove_journals(old)
    return [(r["path"], c) for r, c in zip(records, contents, strict=True)]


def test_inline_content_replays_from_a_preallocated_journal(tmp_path):
    j = journal.Journal(str(tmp_path), "catalog-1", preallocate=True)
    j.append({"op": "stage", "path": "/a"}, inline=b"alpha\n\x00bytes")
    j.append({"op": "stage", "path": "/empty"}, inline=b"")
    j.sync()
    assert os.path.getsize(j.path) >= journal.GROW_BYTES  # written in place: zeros follow
    os.close(j.fd)
    assert replayed(tmp_path) == [("/a", b"alpha\n\x00bytes"), ("/empty", b"")]


def test_a_torn_inline_frame_ends_the_journal(tmp_path):
    for tear in ("short", "crc"):
        j = journal.Journal(str(tmp_path), "catalog-1", preallocate=tear == "crc")
        j.append({"op": "stage", "path": "/kept"}, inline=b"kept")
        n = j.append({"op": "stage", "path": "/torn"}, inline=b"x" * 100)
        j.append({"op": "mkdir", "path": "/after"})
        record = j.pending[n]
        if tear == "short":  # the power cut came in the middle of the bytes
            os.ftruncate(j.fd, record["_at"] + 50)
        else:  # a page of the bytes never reached the disk
            os.pwrite(j.fd, b"\0" * 10, record["_at"] + 20)
        os.close(j.fd)
        assert replayed(tmp_path) == [("/kept", b"kept")], tear


def test_a_line_whose_end_never_reached_the_disk_ends_the_journal(tmp_path):
    j = journal.Journal(str(tmp_path), "catalog-1", preallocate=True)
    j.append({"op": "mkdir", "path": "/kept"})
    at = j._bytes
    j.append({"op": "mkdir", "path": "/torn-in-the-middle"})
    j.append({"op": "mkdir", "path": "/after"})
    os.pwrite(j.fd, b"\0" * 8, at + 10)
    os.close(j.fd)
    assert left_behind_of(tmp_path) == [("mkdir", "/kept")]


def left_behind_of(tmp_path) -> list[tuple[str, str]]:
    records, old = journal.replay(str(tmp_path), "catalog-1")
    journal.remove_journals(old)
    return [(r["op"], r["path"]) for r in records]


def test_a_rewrite_keeps_inline_content_and_copies_each_byte_a_bounded_number_of_times(
        tmp_path, monkeypatch):
    monkeypatch.setattr(journal, "REWRITE_BYTES", 64 << 10)
    j = journal.Journal(str(tmp_path), "catalog-1", preallocate=True)
    rewrites = 0
    rewrite = j._rewrite

    def counted() -> None:
        nonlocal rewrites
        rewrites += 1
        rewrite()

    monkeypatch.setattr(j, "_rewrite", counted)
    blob = bytes(range(256)) * 16  # 4 KiB
    kept = j.append({"op": "stage", "path": "/kept"}, inline=blob)
    numbers = [j.append({"op": "stage", "path": f"/f{i}"}, inline=blob) for i in range(400)]
    for n in numbers:  # uploaded one by one: the pending part shrinks by 4 KiB at a time
        j.done(n)
    # Rewritten each time the pending part halves (about log2(400) times), not at each done.
    assert 0 < rewrites <= 12, rewrites
    assert j.inline_bytes(j.pending[kept]) == blob
    j.sync()
    os.close(j.fd)
    assert replayed(tmp_path) == [("/kept", blob)]


def test_a_rewrite_holds_one_record_in_memory_not_the_pending_content(tmp_path, monkeypatch):
    """Thousands of queued small files can wait inline (async ``cp -r``): the rewrite that
    drops the done ones must not read them all into memory (it did: 267 MiB RSS)."""
    import tracemalloc

    monkeypatch.setattr(journal, "REWRITE_BYTES", 1 << 20)
    j = journal.Journal(str(tmp_path), "catalog-1", preallocate=True)
    blob = os.urandom(256 << 10)
    numbers = [j.append({"op": "stage", "path": f"/f{i}"}, inline=blob) for i in range(160)]
    j.done(*numbers[:79])  # 40 MiB written, more than half of it pending
    assert j._bytes > 40 << 20
    tracemalloc.start()
    j.done(*numbers[79:82])  # less than half pending: rewritten now
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert j._bytes < 25 << 20, "not rewritten"
    assert peak < 4 << 20, peak
    assert all(j.inline_bytes(j.pending[n]) == blob for n in numbers[82:])
    j.close()
