"""The backend conformance suite: one set of tests that every backend passes, in-process.

It checks the contract of :mod:`rucio_fs.backend` against a live backend, without a mount
or a kernel, in the style of fsspec's reusable abstract tests. To run it against a backend,
subclass the classes that apply in a pytest module and give the fixtures they ask for::

    from rucio_fs.testing.conformance import BackendConformance, Sample

    class TestMyCatalog(BackendConformance):
        @pytest.fixture
        def url(self):
            return "mycat://127.0.0.1:8080/"

        @pytest.fixture
        def sample(self):  # files that exist there (a read-only catalog must say which)
            return Sample("/data", {"a.dat": SampleFile(4096, "<md5 hex>")}, subdirs=("sub",))

* :class:`BackendConformance`: URLs, listing with attributes, stat, errors, ranged reads,
  attributes set (read back by a new client) or left out of the returned entry;
  a backend that declares ``WRITE`` must also be tested with :class:`WritableConformance`
  (a test says so), whose default ``sample`` is written by the suite itself.
* :class:`WritableConformance`: puts, uploads in parts, odd names, and each namespace change;
  an operation whose capability is not declared must refuse with ``NotSupported`` (the core
  never calls it, and a backend that does more than it declares is probably mistaken). A
  ``write_once`` backend (files immutable, names permanent) is held to that instead: a second
  put of other content is ``AlreadyExists``, a rename ``CrossDevice``, an rmdir
  ``PermissionDenied``; what its ``check_new`` refuses (a name, a directory in some kinds of
  directory) the suite does not try.
* :class:`BigFileConformance`: sizes past 4 GiB (give ``big_file``).
* :class:`CutListingConformance`: a listing cut short is an error, never a shorter listing.
* :class:`DeadServerConformance`: a dead server is ``Unavailable`` in bounded time.

Why one module of this size: a plugin author imports one suite.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest
import trio

from rucio_fs import errors
from rucio_fs.backend import Attributes, Backend, Capability, Entry, Kind, usable_name
from rucio_fs.registry import open_backend

T = TypeVar("T")

#: Names that have broken some file system client; a writable backend round-trips them all.
ODD_NAMES = (
    "with space.dat",
    "unicod\u00e9-\u6587.dat",
    "100%.dat",
    "50%25.dat",
    "tab\there.dat",
    "-leading-dash.dat",
    "back\\slash.dat",
    "plus+and&amp;?q=1#frag.dat",
    "L" * 246 + ".dat",  # 250 bytes
)

#: How long one backend call of the suite may take before it counts as a hang.
CALL_SECONDS = 60.0


@dataclass(frozen=True)
class SampleFile:
    size: int
    md5: str

    @classmethod
    def of(cls, data: bytes) -> SampleFile:
        return cls(len(data), hashlib.md5(data).hexdigest())


@dataclass(frozen=True)
class Sample:
    """Known content of one directory of the catalog."""

    directory: str
    files: dict[str, SampleFile]
    subdirs: tuple[str, ...] = ()
    #: Whether ``files`` and ``subdirs`` are all of the directory's entries.
    complete: bool = True


@dataclass(frozen=True)
class BigFile:
    """A file past 4 GiB and a way to know some of its bytes."""

    path: str
    size: int
    expected: Callable[[int, int], bytes] = field(repr=False)


def run_with(url: str, work: Callable[[Backend], Awaitable[T]]) -> T:
    """Start the backend of ``url`` in a trio loop of its own, run ``work(backend)``, close."""

    async def main() -> T:
        backend = open_backend(url)
        with trio.fail_after(CALL_SECONDS):
            await backend.start()
        try:
            with trio.fail_after(CALL_SECONDS * 5):
                return await work(backend)
        finally:
            with trio.move_on_after(CALL_SECONDS):
                await backend.aclose()

    return trio.run(main)


async def listed(backend: Backend, path: str) -> dict[str, Entry]:
    """The listing of ``path`` by name; a name listed twice fails the test."""
    entries: dict[str, Entry] = {}
    async for entry in backend.list(path):
        assert entry.name not in entries, f"{path}: {entry.name!r} listed twice"
        entries[entry.name] = entry
    return entries


async def read_all(backend: Backend, path: str, entry: Entry) -> bytes:
    handle = await backend.open(path, entry)
    try:
        return bytes(await backend.read(handle, 0, entry.size)) if entry.size else b""
    finally:
        await backend.close(handle)


async def _read_at_once(backend: Backend, handle: Any, offsets: range,
                        length: int) -> dict[int, bytes]:
    """Reads of one handle at several offsets at once, as the core sends them."""
    results: dict[int, bytes] = {}

    async def one(offset: int) -> None:
        results[offset] = bytes(await backend.read(handle, offset, length))

    async with trio.open_nursery() as nursery:
        for offset in offsets:
            nursery.start_soon(one, offset)
    return results


def child(directory: str, name: str) -> str:
    return ("" if directory == "/" else directory) + "/" + name


async def allows(backend: Backend, path: str, kind: Kind) -> bool:
    """Whether ``backend.check_new`` lets a ``kind`` be made at ``path``; a refusal must be
    a one-line error."""
    parent = path.rpartition("/")[0] or "/"
    try:
        backend.check_new(path, kind, await backend.stat(parent))
    except errors.RucioFsError as refused:
        _one_line(refused)
        return False
    return True


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    assert text and "\n" not in text and "Traceback" not in text, repr(text)
    return text


class BackendConformance:
    """The contract every backend keeps. Fixtures to give: ``url``, and ``sample`` unless the
    class is also a :class:`WritableConformance`; optionally ``bad_urls``."""

    @pytest.fixture
    def url(self) -> str:
        raise NotImplementedError("give the `url` fixture: the mount URL of the backend")

    @pytest.fixture
    def bad_urls(self) -> list[str]:
        """Backend-specific URLs that must be refused (bad host, bad option value, ...)."""
        return []

    def test_a_writable_backend_is_tested_as_one(self, url: str) -> None:
        backend = open_backend(url)
        if backend.capabilities & Capability.WRITE:
            assert isinstance(self, WritableConformance), (
                f"{backend.scheme} declares WRITE: test it with WritableConformance too")
        else:
            assert not backend.capabilities, "namespace changes without WRITE"

    def test_bad_urls_are_refused_in_one_line(self, url: str, bad_urls: list[str]) -> None:
        unknown_option = url + ("&" if "?" in url else "?") + "no_such_option=1"
        for bad in [unknown_option, *bad_urls]:
            with pytest.raises(errors.InvalidInput) as caught:
                open_backend(bad)
            _one_line(caught.value)
            if bad == unknown_option:
                assert "no_such_option" in str(caught.value)

    @pytest.fixture
    def secrets(self) -> list[str]:
        """Credentials the mount of ``url`` uses (passwords, secret keys, tokens): its shared
        identity must contain none of them."""
        return []

    def test_the_shared_identity_is_stable_and_names_no_secret(self, url: str,
                                                               secrets: list[str]) -> None:
        async def identity(backend: Backend) -> str | None:
            return backend.shared_identity()

        first, second = run_with(url, identity), run_with(url, identity)
        assert first == second, "two mounts of one URL must share under one identity"
        if first is not None:
            assert first and "\n" not in first, repr(first)
            for secret in secrets:
                assert secret not in first, "the shared identity names a secret"

    def test_the_root_is_a_directory(self, url: str) -> None:
        root = run_with(url, lambda backend: backend.stat("/"))
        assert root.kind is Kind.DIR

    def test_a_listing_carries_every_entry_with_its_attributes(self, url: str,
                                                               sample: Sample) -> None:
        entries = run_with(url, lambda backend: listed(backend, sample.directory))
        for name, expected in sample.files.items():
            assert name in entries, f"{name!r} missing from the listing of {sample.directory}"
            entry = entries[name]
            assert entry.kind is Kind.FILE and entry.size == expected.size, entry
            assert entry.mtime_ns >= 0
        for name in sample.subdirs:
            assert entries[name].kind is Kind.DIR, entries.get(name)
        assert all(usable_name(name) for name in entries)
        if sample.complete:
            assert set(entries) == set(sample.files) | set(sample.subdirs)

    def test_stat_agrees_with_the_listing(self, url: str, sample: Sample) -> None:
        async def compare(backend: Backend) -> None:
            entries = await listed(backend, sample.directory)
            for name in [*list(sample.files)[:20], *sample.subdirs]:
                entry = await backend.stat(child(sample.directory, name))
                listed_entry = entries[name]
                assert (entry.name, entry.kind) == (name, listed_entry.kind)
                if entry.kind is Kind.FILE:
                    assert entry.size == listed_entry.size
                    assert entry.version == listed_entry.version

        run_with(url, compare)

    def test_completing_a_listed_entry_gives_what_stat_gives(self, url: str,
                                                             sample: Sample) -> None:
        """``complete`` (asked for a listed name the listing could not tell all of) shows
        the same entry as ``stat``."""
        async def compare(backend: Backend) -> None:
            entries = await listed(backend, sample.directory)
            for name in [*list(sample.files)[:5], *sample.subdirs[:5]]:
                path = child(sample.directory, name)
                completed = await backend.complete(path, entries[name])
                stated = await backend.stat(path)
                assert (completed.name, completed.kind, completed.mode, completed.uid,
                        completed.mtime_ns) == (stated.name, stated.kind, stated.mode,
                                                stated.uid, stated.mtime_ns), (completed,
                                                                               stated)
                if completed.kind is Kind.FILE:
                    assert (completed.size, completed.version) == (stated.size, stated.version)

        run_with(url, compare)

    def test_missing_paths_are_not_found(self, url: str, sample: Sample) -> None:
        missing = child(sample.directory, f"no-such-{uuid.uuid4().hex[:8]}")
        a_file = child(sample.directory, next(iter(sample.files)))

        async def check(backend: Backend) -> None:
            with pytest.raises(errors.NotFound):
                await backend.stat(missing)
            # Where directories are only prefixes of keys (S3), a missing one lists empty.
            with contextlib.suppress(errors.NotFound):
                assert await listed(backend, missing) == {}
            with pytest.raises((errors.NotADirectory, errors.NotFound)):
                await backend.stat(a_file + "/below")

        run_with(url, check)

    def test_a_file_is_never_listed_as_a_directory(self, url: str, sample: Sample) -> None:
        """Listing a file's path is NotADirectory (or NotFound), never a listing: an empty
        one would show the file as an empty directory."""
        a_file = child(sample.directory, next(iter(sample.files)))

        async def check(backend: Backend) -> None:
            assert (await backend.stat(a_file)).kind is Kind.FILE
            try:
                entries = await listed(backend, a_file)
            except (errors.NotADirectory, errors.NotFound):
                return
            raise AssertionError(f"{a_file} is a file, yet it was listed as a directory of "
                                 f"{len(entries)} entries")

        run_with(url, check)

    def test_attributes_are_stored_or_left_out(self, url: str, sample: Sample) -> None:
        """Each attribute set is either stored — a new client's stat shows it (and its
        listing, where the backend's listings carry stored attributes) — or left out of the
        returned entry, the server keeping what it had; the content never changes."""
        name = next((n for n, f in sample.files.items() if f.size), next(iter(sample.files)))
        path = child(sample.directory, name)
        wanted = Attributes(mtime_ns=1_000_000_000 * 10**9, mode=0o640)  # whole seconds

        async def set_them(backend: Backend) -> tuple[Entry, Entry]:
            before = await backend.stat(path)
            return before, await backend.set_attributes(path, before, wanted)

        async def read_back(backend: Backend) -> tuple[Entry, Entry, bytes]:
            stat = await backend.stat(path)
            return (stat, (await listed(backend, sample.directory))[name],
                    await read_all(backend, path, stat))

        before, after = run_with(url, set_them)
        for field_name in ("mtime_ns", "mode"):
            assert getattr(after, field_name) in (getattr(wanted, field_name),
                                                  getattr(before, field_name)), field_name
        stat, in_listing, content = run_with(url, read_back)  # a new client: the server's
        assert (stat.mtime_ns, stat.mode) == (after.mtime_ns, after.mode)
        if in_listing.complete:
            assert (in_listing.mtime_ns, in_listing.mode) == (after.mtime_ns, after.mode)
        assert hashlib.md5(content).hexdigest() == sample.files[name].md5

    def test_reads_at_any_offset_give_the_files_bytes(self, url: str, sample: Sample) -> None:
        names = sorted(sample.files, key=lambda n: -sample.files[n].size)[:4]

        async def check(backend: Backend) -> None:
            for name in names:
                path = child(sample.directory, name)
                entry = await backend.stat(path)
                whole = await read_all(backend, path, entry)
                assert hashlib.md5(whole).hexdigest() == sample.files[name].md5, name
                size = len(whole)
                handle = await backend.open(path, entry)
                try:
                    spans = [(0, 1), (size // 2, 4096), (size - 1, 1), (1, size - 1),
                             (size // 3, size - size // 3)]
                    for offset, length in spans:
                        length = min(length, size - offset)
                        if 0 <= offset < size and length > 0:
                            data = await backend.read(handle, offset, length)
                            assert bytes(data) == whole[offset:offset + length], (name, offset)
                    results = await _read_at_once(backend, handle,
                                                  range(0, size - 1000, max(1, size // 8)), 1000)
                    for offset, data in results.items():
                        assert data == whole[offset:offset + 1000], (name, offset)
                finally:
                    await backend.close(handle)

        run_with(url, check)


class WritableConformance(BackendConformance):
    """Writes and namespace changes, each where its capability is declared. The suite works
    in a fresh directory it makes below the URL's root. Optional fixture: ``xattr_name``,
    a settable extended attribute name (without ``user.``)."""

    @pytest.fixture
    def xattr_name(self) -> str | None:
        return None

    @pytest.fixture
    def scratch(self, url: str) -> str:
        """A fresh empty directory for one test."""
        path = f"/conformance-{uuid.uuid4().hex[:10]}"
        run_with(url, lambda backend: backend.mkdir(path))
        return path

    @pytest.fixture
    def sample(self, url: str, scratch: str) -> Sample:
        rng = random.Random(scratch)
        contents = {"empty.dat": b"", "one.dat": b"1", "small.dat": rng.randbytes(4096),
                    "medium.dat": rng.randbytes(300_000)}

        async def write(backend: Backend) -> tuple[str, ...]:
            for name, data in contents.items():
                await backend.put(child(scratch, name), data)
            if not await allows(backend, child(scratch, "sub"), Kind.DIR):
                return ()
            await backend.mkdir(child(scratch, "sub"))
            return ("sub",)

        subdirs = run_with(url, write)
        return Sample(scratch, {n: SampleFile.of(d) for n, d in contents.items()}, subdirs)

    @staticmethod
    def _declares(url: str, capability: Capability) -> bool:
        return bool(open_backend(url).capabilities & capability)

    @staticmethod
    def _write_once(url: str) -> bool:
        return open_backend(url).write_once

    def test_a_put_is_confirmed_listed_and_read_back(self, url: str, scratch: str) -> None:
        path = child(scratch, "new.dat")
        first, second = b"first version\n", b"second, longer version\n"

        async def check(backend: Backend) -> None:
            sent = await backend.put(path, first)
            assert (sent.kind, sent.size) == (Kind.FILE, len(first))
            stored = await backend.confirm(path, sent)
            assert stored.size == len(first)
            assert "new.dat" in await listed(backend, scratch)
            assert await read_all(backend, path, await backend.stat(path)) == first
            if backend.write_once:
                with pytest.raises(errors.AlreadyExists) as refused:
                    await backend.put(path, second)
                _one_line(refused.value)
                await backend.confirm(path, await backend.put(path, first))  # the same: ok
                assert await read_all(backend, path, await backend.stat(path)) == first
                return
            again = await backend.put(path, second)
            await backend.confirm(path, again)
            entry = await backend.stat(path)
            if sent.version and entry.version:
                assert entry.version != sent.version
            assert await read_all(backend, path, entry) == second

        run_with(url, check)

    def test_an_upload_in_parts_makes_one_file(self, url: str, scratch: str) -> None:
        path = child(scratch, "parts.dat")

        async def check(backend: Backend) -> None:
            part = backend.upload_part_size
            data = random.Random(7).randbytes(2 * part + 1234)
            upload = await backend.begin_upload(path)
            offsets = [0, part, 2 * part]
            parts = [(number, offset, data[offset:offset + part if number < 3 else None])
                     for number, offset in enumerate(offsets, 1)]
            if backend.upload_parallelism == 1:  # the core sends such parts in order
                for number, offset, chunk in parts:
                    await upload.write_part(number, offset, chunk)
            else:
                async with trio.open_nursery() as nursery:  # the core sends parts at once
                    for number, offset, chunk in parts:
                        nursery.start_soon(upload.write_part, number, offset, chunk)
            sent = await upload.commit(len(data))
            stored = await backend.confirm(path, sent)
            assert stored.size == len(data)
            got = await read_all(backend, path, stored)
            assert hashlib.md5(got).digest() == hashlib.md5(data).digest()

        run_with(url, check)

    def test_an_aborted_upload_leaves_the_file_as_it_was(self, url: str, scratch: str) -> None:
        """Unless the backend declares that its uploads write in place
        (``atomic_uploads = False``): then the upload can be made again over the remains.
        A ``write_once`` backend leaves no file, and the name can be written afterwards."""
        path = child(scratch, "kept.dat")

        async def check(backend: Backend) -> None:
            if backend.write_once:
                upload = await backend.begin_upload(path)
                await upload.write_part(1, 0, b"x" * backend.upload_part_size)
                await upload.abort()
                with pytest.raises(errors.NotFound):
                    await backend.stat(path)
                await backend.confirm(path, await backend.put(path, b"after"))
                assert await read_all(backend, path, await backend.stat(path)) == b"after"
                return
            await backend.put(path, b"kept")
            upload = await backend.begin_upload(path)
            await upload.write_part(1, 0, b"x" * backend.upload_part_size)
            await upload.abort()
            if backend.atomic_uploads:
                assert await read_all(backend, path, await backend.stat(path)) == b"kept"
            again = await backend.put(path, b"again")
            await backend.confirm(path, again)
            assert await read_all(backend, path, await backend.stat(path)) == b"again"

        run_with(url, check)

    def test_odd_names_round_trip(self, url: str, scratch: str) -> None:
        """Every odd name the backend's ``check_new`` accepts (at least one of them)."""
        async def check(backend: Backend) -> None:
            names = [name for name in ODD_NAMES
                     if await allows(backend, child(scratch, name), Kind.FILE)]
            assert names, "check_new refuses every odd name"
            for name in names:
                await backend.put(child(scratch, name), name.encode())
            entries = await listed(backend, scratch)
            assert sorted(entries) == sorted(names)
            for name in names:
                path = child(scratch, name)
                assert await read_all(backend, path, await backend.stat(path)) == name.encode()

        run_with(url, check)

    def test_mkdir_and_rmdir(self, url: str, scratch: str) -> None:
        if not self._declares(url, Capability.MKDIR):
            self._refuses(url, lambda backend: backend.mkdir(child(scratch, "d")))
            return

        async def check(backend: Backend) -> None:
            # In the scratch directory, or beside it where directories hold no directories.
            path = child(scratch, "d")
            if not await allows(backend, path, Kind.DIR):
                path = scratch + "-d"
            parent, _, name = path.rpartition("/")
            made = await backend.mkdir(path)
            assert made.kind is Kind.DIR
            assert (await backend.stat(path)).is_dir
            assert await listed(backend, path) == {}
            assert (await listed(backend, parent or "/"))[name].is_dir
            await backend.put(child(path, "f"), b"f")
            if backend.write_once:  # directories are kept
                await backend.unlink(child(path, "f"))
                with pytest.raises(errors.PermissionDenied):
                    await backend.rmdir(path)
                assert await listed(backend, path) == {}
                return
            with pytest.raises(errors.NotEmpty):
                await backend.rmdir(path)
            await backend.unlink(child(path, "f"))
            await backend.rmdir(path)
            with pytest.raises(errors.NotFound):
                await backend.stat(path)
            assert name not in await listed(backend, parent or "/")

        run_with(url, check)

    def test_unlink(self, url: str, sample: Sample) -> None:
        path = child(sample.directory, "small.dat")
        if not self._declares(url, Capability.UNLINK):
            self._refuses(url, lambda backend: backend.unlink(path))
            return

        async def check(backend: Backend) -> None:
            await backend.unlink(path)
            with pytest.raises(errors.NotFound):
                await backend.stat(path)
            assert "small.dat" not in await listed(backend, sample.directory)

        run_with(url, check)

    def test_rename_moves_a_file_and_replaces_the_target(self, url: str,
                                                         sample: Sample) -> None:
        old, new = child(sample.directory, "small.dat"), child(sample.directory, "one.dat")
        if not self._declares(url, Capability.RENAME):
            self._refuses(url, lambda backend: backend.rename(old, new, Entry("x", Kind.FILE)))
            return

        async def check(backend: Backend) -> None:
            if backend.write_once:  # names are permanent: mv copies, then unlinks
                with pytest.raises(errors.CrossDevice):
                    await backend.rename(old, new, await backend.stat(old))
                assert hashlib.md5(await read_all(backend, old, await backend.stat(old))
                                   ).hexdigest() == sample.files["small.dat"].md5
                assert (await backend.stat(new)).size == 1
                return
            moved = await backend.rename(old, new, await backend.stat(old))
            assert (moved.name, moved.size) == ("one.dat", 4096)
            with pytest.raises(errors.NotFound):
                await backend.stat(old)
            entry = await backend.stat(new)
            assert hashlib.md5(await read_all(backend, new, entry)).hexdigest() == \
                sample.files["small.dat"].md5
            names = await listed(backend, sample.directory)
            assert "small.dat" not in names and names["one.dat"].size == 4096

        run_with(url, check)

    def test_truncate(self, url: str, sample: Sample) -> None:
        path = child(sample.directory, "small.dat")
        if not self._declares(url, Capability.TRUNCATE):
            self._refuses(url, lambda backend: backend.truncate(path, 10))
            return

        async def check(backend: Backend) -> None:
            before = await read_all(backend, path, await backend.stat(path))
            cut = await backend.truncate(path, 10)
            assert cut.size == 10
            assert await read_all(backend, path, await backend.stat(path)) == before[:10]
            grown = await backend.truncate(path, 20)
            assert grown.size == 20
            assert await read_all(backend, path, await backend.stat(path)) == \
                before[:10] + b"\0" * 10

        run_with(url, check)

    def test_extended_attributes(self, url: str, sample: Sample,
                                 xattr_name: str | None) -> None:
        path = child(sample.directory, "small.dat")
        if not self._declares(url, Capability.SETXATTR):
            self._refuses(url, lambda backend: backend.set_xattr(
                path, Entry("small.dat", Kind.FILE), "anything", b"1"))
            return
        assert xattr_name, "SETXATTR is declared: give the `xattr_name` fixture"

        async def check(backend: Backend) -> None:
            entry = await backend.stat(path)
            entry = await backend.set_xattr(path, entry, xattr_name, b"blue")
            assert (await backend.xattrs(path, await backend.stat(path)))[xattr_name] == b"blue"
            await backend.set_xattr(path, entry, xattr_name, None)
            assert xattr_name not in await backend.xattrs(path, await backend.stat(path))
            with pytest.raises(errors.NotSupported):
                await backend.set_xattr(path, entry, "no-such-namespace.key", b"1")

        run_with(url, check)

    def test_symbolic_links(self, url: str, scratch: str) -> None:
        """A link's target comes back as given (never resolved); a new client's stat
        shows a link; it is removed like a file."""
        path, target = child(scratch, "link"), "../somewhere/else with space.dat"
        if not self._declares(url, Capability.SYMLINK):
            self._refuses(url, lambda backend: backend.symlink(path, target))
            return

        async def make(backend: Backend) -> Entry:
            made = await backend.symlink(path, target)
            with pytest.raises(errors.AlreadyExists):
                await backend.symlink(path, "other")
            return made

        async def check(backend: Backend) -> None:
            entry = await backend.stat(path)
            assert (entry.kind, entry.size) == (Kind.SYMLINK, len(target.encode()))
            assert await backend.readlink(path, entry) == target
            in_listing = (await listed(backend, scratch))["link"]
            assert in_listing.kind is Kind.SYMLINK or not in_listing.complete
            await backend.unlink(path)
            with pytest.raises(errors.NotFound):
                await backend.stat(path)

        assert run_with(url, make).kind is Kind.SYMLINK
        run_with(url, check)

    def test_a_put_carries_its_attributes(self, url: str, scratch: str) -> None:
        """What a put stores of the attributes it is given, a new client's stat shows."""
        path = child(scratch, "with-attributes.dat")
        wanted = Attributes(mtime_ns=1_200_000_000 * 10**9, mode=0o600)

        async def put(backend: Backend) -> Entry:
            sent = await backend.put(path, b"content", wanted)
            return await backend.confirm(path, sent)

        stored = run_with(url, put)
        stat = run_with(url, lambda backend: backend.stat(path))
        assert (stat.mtime_ns, stat.mode) == (stored.mtime_ns, stored.mode)
        assert stat.mode in (0o600, None) or stored.mode != 0o600  # stored, or not at all

    @staticmethod
    def _refuses(url: str, call: Callable[[Backend], Awaitable[Any]]) -> None:
        async def check(backend: Backend) -> None:
            with pytest.raises(errors.NotSupported):
                await call(backend)

        run_with(url, check)


class BigFileConformance:
    """Sizes past 4 GiB (the old prototype kept sizes in a 32-bit int). Give ``url`` and
    ``big_file``."""

    def test_sizes_past_4_gib_and_reads_beyond(self, url: str, big_file: BigFile) -> None:
        assert big_file.size > 1 << 32

        async def check(backend: Backend) -> None:
            entry = await backend.stat(big_file.path)
            assert entry.size == big_file.size
            parent, _, name = big_file.path.rpartition("/")
            assert (await listed(backend, parent or "/"))[name].size == big_file.size
            handle = await backend.open(big_file.path, entry)
            try:
                for offset in ((1 << 32) - 10, big_file.size - 4096):
                    data = await backend.read(handle, offset, 4096)
                    assert bytes(data) == big_file.expected(offset, 4096), offset
            finally:
                await backend.close(handle)

        run_with(url, check)


class CutListingConformance:
    """A listing the server cuts off mid-answer is an error, never a shorter listing. Give
    ``broken_listing``: a URL and a directory whose listing its server will cut short."""

    def test_a_listing_cut_short_is_an_error(self, broken_listing: tuple[str, str]) -> None:
        url, path = broken_listing

        async def check(backend: Backend) -> None:
            with pytest.raises(errors.RucioFsError) as caught:
                await listed(backend, path)
            assert not isinstance(caught.value, errors.NotFound)
            _one_line(caught.value)

        run_with(url, check)


class DeadServerConformance:
    """Nobody answering is :class:`~rucio_fs.errors.Unavailable` (EIO through the mount) in
    bounded time, never NotFound and never a hang. Give ``dead_url``: the backend's URL
    with nobody listening."""

    def test_a_dead_server_is_unavailable_in_bounded_time(self, dead_url: str) -> None:
        async def check(backend: Backend) -> None:
            await backend.stat("/anything")

        with pytest.raises((errors.Unavailable, trio.TooSlowError)) as caught:
            run_with(dead_url, check)
        assert isinstance(caught.value, errors.Unavailable), "a dead server hung the backend"
        _one_line(caught.value)
