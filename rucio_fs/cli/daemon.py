"""Mount lifecycle: check the request, fork into the background, mount, serve, unmount.

Everything that can be wrong with a mount request (URL, mountpoint, /dev/fuse, an unreachable
catalog) is found before or while mounting and reported to the invoking process as one line;
nothing stays mounted after a failure.

Why one module of this size: a mount's lifecycle is one sequence (check, fork, mount, serve,
unmount), and each step's failure is handled where the step is.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyfuse3
import trio

from rucio_fs import __version__
from rucio_fs.backend import Backend, Capability, Entry, Kind
from rucio_fs.cache.caches import EqualEntries
from rucio_fs.cache.disk_cache import DiskCache
from rucio_fs.catalog.catalog import Catalog, Prepared, prepare_backend
from rucio_fs.config import LAYERS, MountConfig
from rucio_fs.errors import (
    InvalidInput,
    MissingCredentials,
    NotADirectory,
    PermissionDenied,
    RucioFsError,
    Unavailable,
)
from rucio_fs.fuse import kernel_tuning, passthrough
from rucio_fs.fuse.fs import RucioFs
from rucio_fs.identity import Caller, CallerCredentials, private_directory
from rucio_fs.observe import control
from rucio_fs.observe.mounts import find_mount, require_rucio_fs, runtime_dir, socket_path
from rucio_fs.observe.stats import Stats
from rucio_fs.observe.tracing import RequestRecorder
from rucio_fs.registry import backend_class, open_backend
from rucio_fs.users.identities import Identities
from rucio_fs.users.identity_map import IdentityMap
from rucio_fs.write.writeback import WriteBack

from .warm import Warmer

#: Tasks writing blocks to the disk layer in parallel.
DISK_WRITERS = 4

#: glibc mallopt() parameter (malloc.h).
M_ARENA_MAX = -8

log = logging.getLogger("rucio_fs")


@dataclass
class MountRequest:
    url: str
    mountpoint: str
    cache: MountConfig = field(default_factory=MountConfig)
    foreground: bool = False
    debug: bool = False
    allow_other: bool = False
    log_file: str | None = None
    max_tasks: int = 256
    xattrs: bool = False
    read_ahead_kb: int = 1024
    max_background: int = 64
    #: ``mount``: one identity, the mounting user's; ``per-user``: each caller's own.
    identity: str = "mount"
    #: Kernel mount flags (``nosuid``, ``ro``, ...), as mount(8) passes them to the helper.
    kernel_flags: tuple[str, ...] = ()
    #: A per-user mount's site identity map (:mod:`rucio_fs.users.identity_map`), if any.
    identity_map: str | None = None


def _daemon_gone(mountpoint: str) -> InvalidInput:
    return InvalidInput(f"{mountpoint} is a mount whose daemon is gone: run "
                        f"`rucio-fs unmount {mountpoint}` first")


def check_mountpoint(mountpoint: str) -> str:
    """The absolute mountpoint, or InvalidInput naming what is wrong with it."""
    path = os.path.abspath(mountpoint)
    try:
        os.stat(path)
    except FileNotFoundError:
        raise InvalidInput(f"mountpoint {mountpoint} does not exist") from None
    except OSError as exc:
        if exc.errno == errno.ENOTCONN and find_mount(path) is not None:
            raise _daemon_gone(mountpoint) from None
        raise InvalidInput(f"mountpoint {mountpoint}: {exc.strerror}") from None
    if not os.path.isdir(path):
        raise InvalidInput(f"mountpoint {mountpoint} is not a directory")
    mount = find_mount(path)
    if mount is not None:
        try:  # (the kernel may answer a stat from its cache; statfs always asks the daemon)
            os.statvfs(path)
        except OSError as exc:
            if exc.errno == errno.ENOTCONN:
                raise _daemon_gone(mountpoint) from None
        raise InvalidInput(f"{mountpoint} is already a mountpoint ({mount.fstype})")
    if os.listdir(path):
        raise InvalidInput(f"mountpoint {mountpoint} is not empty")
    if not os.path.exists("/dev/fuse"):
        raise InvalidInput("/dev/fuse is missing (load the fuse module or pass --device /dev/fuse)")
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        # fusermount3, which mounts for users, opens the device as the user too.
        raise InvalidInput("no permission to open /dev/fuse: mounting without root needs it "
                           "readable and writable by all (mode 0666, as distributions ship it)")
    return path


def claim_mountpoint(path: str) -> int:
    """Lock the (checked) mountpoint directory for this mount: a second ``rucio-fs mount`` on
    it fails instead of stacking. The lock lives as long as the returned descriptor, which the
    daemon inherits and keeps."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise InvalidInput(f"another rucio-fs is mounting on {path}") from None
    if find_mount(path) is not None:  # it finished mounting before we took the lock
        os.close(fd)
        raise InvalidInput(f"{path} is already a mountpoint")
    return fd


def mount(req: MountRequest) -> int:
    """Mount as requested; returns the process exit code. Background: returns once mounted."""
    check_per_user(req)
    backend = None if req.identity == "per-user" else open_backend(req.url)
    req.mountpoint = check_mountpoint(req.mountpoint)
    claim_mountpoint(req.mountpoint)  # held (inherited by the daemon) until it exits
    if req.foreground:
        _setup_logging(req, sys.stderr)
        return _run(req, backend, ready_fd=None)

    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the daemon
        os.close(read_fd)
        code = 1
        try:
            os.setsid()
            log_path = req.log_file or str(runtime_dir() / f"mount-{os.getpid()}.log")
            Path(log_path).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            log_stream = open(log_path, "a", buffering=1)  # noqa: SIM115 - lives as long as we do
            devnull = os.open(os.devnull, os.O_RDWR)
            os.dup2(devnull, 0)
            os.dup2(log_stream.fileno(), 1)
            os.dup2(log_stream.fileno(), 2)
            _setup_logging(req, log_stream)
            code = _run(req, backend, ready_fd=write_fd)
        finally:
            os._exit(code)
    os.close(write_fd)
    return _wait_ready(read_fd, pid)


def _wait_ready(read_fd: int, pid: int) -> int:
    with os.fdopen(read_fd, "rb") as pipe:
        message = pipe.read().decode(errors="replace").strip()
    if message == "ok":
        return 0
    if not message:
        _, status = os.waitpid(pid, 0)
        message = f"the mount daemon exited before mounting (status {status})"
    print(f"rucio-fs: {message}", file=sys.stderr)
    return 1


def _setup_logging(req: MountRequest, stream: Any) -> None:
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if req.debug else logging.INFO)


def _report(ready_fd: int | None, message: str) -> None:
    if ready_fd is not None:
        os.write(ready_fd, message.encode() + b"\n")
        os.close(ready_fd)
    elif message != "ok":
        print(f"rucio-fs: {message}", file=sys.stderr)


def _bound_malloc() -> None:
    """Keep glibc from growing one heap per worker thread.

    Data blocks are large buffers allocated in worker threads and freed on the event loop's
    thread. With glibc's default of up to 8 arenas per core each thread's heap kept freed
    blocks, and the daemon grew to 2.5x its data budget. One arena measured: peak RSS at the
    budget (262 MB for 256 MB of data) and no loss of speed; a fixed mmap threshold instead
    bounded memory too, but page faults on every new buffer cost 30 % of read throughput.
    """
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to tune
        ctypes.CDLL(None).mallopt(M_ARENA_MAX, 1)


def _run(req: MountRequest, backend: Backend | None, ready_fd: int | None) -> int:
    state: dict[str, int | None] = {"ready_fd": ready_fd}
    _bound_malloc()
    try:
        trio.run(_serve, req, backend, state)
    except RucioFsError as exc:
        if state["ready_fd"] is None and ready_fd is not None:
            log.error("%s", exc)  # already mounted: the invoking process is gone
        else:
            _report(state["ready_fd"], str(exc))
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        log.exception("mount daemon failed")
        if state["ready_fd"] is not None:
            _report(state["ready_fd"], f"mount failed: {exc!r}")
        return 1
    return 0


def check_per_user(req: MountRequest) -> None:
    """Refuse a per-user mount that could serve one user with another's view (one line)."""
    if req.identity != "per-user":
        if req.identity_map:
            raise InvalidInput("--identity-map maps each user's identity: it needs "
                               "--identity per-user")
        return
    if not req.allow_other:
        raise InvalidInput("--identity per-user needs --allow-other (other users must reach "
                           "the mount to be served as themselves)")
    if os.geteuid() != 0:
        raise InvalidInput("--identity per-user needs root: credential files are read as "
                           "each user, and only root can act as them")
    cache = req.cache
    for flag, used in (("--cache-dir", cache.disk), ("--shared-cache", cache.shared),
                       ("--data-proxy", bool(cache.data_proxy))):
        if used:
            raise InvalidInput(f"--identity per-user cannot be combined with {flag} (its "
                               "contents would be shared between users)")
    cls = backend_class(req.url)
    if cls.for_caller.__func__ is Backend.for_caller.__func__:  # type: ignore[attr-defined]
        raise InvalidInput(f"{cls.scheme}: this backend cannot serve each user as themselves")
    if req.identity_map:
        IdentityMap.load(req.identity_map, cls.credential_env)
    # The URL itself is checked now, with the mounting user's credentials (having none is
    # fine: this mount never uses them).
    mine = CallerCredentials.of(Caller(os.getuid(), os.getgid(), os.getpid()),
                                cls.credential_env, tempfile.mkdtemp(prefix="rucio-fs-"))
    try:
        cls.for_caller(req.url, mine)
    except (MissingCredentials, PermissionDenied):
        pass
    finally:
        shutil.rmtree(mine.private_dir, ignore_errors=True)


def _per_user(req: MountRequest, stats: Stats, ops_holder: list[RucioFs]) -> Identities:
    """The catalogs of a per-user mount: each caller's backend, started and checked on the
    caller's first request, with the core's layers above it (no disk layer) and, on a
    writable catalog, the user's own write-back (see :func:`_user_writeback`)."""
    cls = backend_class(req.url)
    config = req.cache
    writebacks: dict[int, WriteBack] = {}
    hints: dict[str, Any] = {}  # shared by every user's backend (Backend.use_hints)
    #: What each started backend was prepared with, until its catalog takes it.
    prepared: dict[int, Prepared] = {}
    equal_entries = EqualEntries(config.listing_max_entries)

    async def make_backend(credentials: CallerCredentials) -> Backend:
        backend = await trio.to_thread.run_sync(cls.for_caller, req.url, credentials)
        backend.use_hints(hints)
        try:
            prepared[id(backend)] = prepare_backend(backend, config, stats)
            with trio.fail_after(config.backend_timeout):
                await backend.start()
                root = await backend.stat("/")
        except trio.TooSlowError:
            prepared.pop(id(backend), None)
            await backend.aclose()
            raise Unavailable(f"{req.url}: the catalog did not answer in time") from None
        except RucioFsError:
            prepared.pop(id(backend), None)
            await backend.aclose()
            raise
        if not root.is_dir:
            prepared.pop(id(backend), None)
            await backend.aclose()
            raise NotADirectory(f"{req.url}: the catalog root is not a directory")
        return backend

    def make_catalog(backend: Backend, credentials: CallerCredentials) -> Catalog:
        catalog = Catalog(backend, config, stats, None, prepared.pop(id(backend)))
        catalog.equal_entries = equal_entries
        catalog.nursery = ops_holder[0].nursery if ops_holder else None
        if backend.capabilities & Capability.WRITE:
            _user_writeback(req, writebacks, credentials.uid, catalog, ops_holder[0])
        return catalog

    private = private_directory(str(runtime_dir() / f"per-user-{os.getpid()}"))
    mapping = (IdentityMap.load(req.identity_map, cls.credential_env)
               if req.identity_map else None)
    return Identities(make_backend, make_catalog, cls.credential_env, private, mapping)


def _user_writeback(req: MountRequest, writebacks: dict[int, WriteBack], uid: int,
                    catalog: Catalog, ops: RucioFs) -> None:
    """Give ``catalog`` its user's write-back: the one the user already has (its pending
    files are uploaded with the user's newest credentials), else a new one that first takes
    over what an earlier daemon left for this user (killed or unmounted with uploads
    failing). Each user's staging files and journal live in a directory of their own (mode
    0700, the daemon's), named by uid, so they are adopted by the same local user only."""
    writeback = writebacks.get(uid)
    if writeback is not None:
        writeback.serve(catalog)
        return
    staging = os.path.join(staging_dir(req.cache), "per-user", f"uid-{uid}")
    writeback = WriteBack(catalog, staging, req.url, req.cache.write_back == "async",
                          req.cache.write_back_parallelism, identity=f"uid {uid} {req.url}")
    writeback.uid = uid
    try:
        os.makedirs(staging, mode=0o700, exist_ok=True)
        writeback.adopt()
    except OSError as exc:
        raise Unavailable(f"staging directory {staging}: {exc.strerror}") from None
    ops.attach(writeback)
    assert ops.nursery is not None
    writeback.nursery = ops.nursery
    ops.nursery.start_soon(writeback.run_retries)
    ops.nursery.start_soon(writeback.queue.run)
    writebacks[uid] = writeback


async def _shutdown_writebacks(writebacks: list[WriteBack]) -> None:
    """At unmount: each write-back carries out what is queued and tries what is pending
    once more (see :meth:`WriteBack.shutdown`)."""
    async with trio.open_nursery() as nursery:
        for writeback in writebacks:
            writeback.nursery = nursery
            nursery.start_soon(writeback.shutdown)


async def _serve(req: MountRequest, backend: Backend | None,
                 state: dict[str, int | None]) -> None:
    stats = Stats()
    if backend is None:
        holder: list[RucioFs] = []
        identities = _per_user(req, stats, holder)
        root = Entry(name="", kind=Kind.DIR, mtime_ns=time.time_ns())
        cls = backend_class(req.url)
        writable = bool(cls.capabilities_for(req.url) & Capability.WRITE)
        ops = RucioFs(None, root, req.cache, stats,  # type: ignore[arg-type]
                      xattrs=req.xattrs, identities=identities, writable=writable)
        holder.append(ops)

        async def close_per_user() -> None:
            await _shutdown_writebacks(ops.writebacks())
            await identities.aclose()
            shutil.rmtree(identities.private_dir, ignore_errors=True)

        await _session(req, ops, stats, state, cls.scheme, not writable,
                       lambda nursery: None, close_per_user)
        return
    prepared = prepare_backend(backend, req.cache, stats)
    try:
        with trio.fail_after(120):
            await backend.start()
            root = await backend.stat("/")
    except trio.TooSlowError:
        raise Unavailable(f"{req.url}: the catalog did not answer within 120 s") from None
    if not root.is_dir:
        raise NotADirectory(f"{req.url}: the catalog root is not a directory")

    disk = None
    if req.cache.disk:
        disk = DiskCache(req.cache.disk_dir, req.cache.disk_max_bytes, req.url, stats,
                         req.cache.disk_free_floor, req.cache.block_size)
        try:
            await trio.to_thread.run_sync(disk.load)
        except OSError as exc:
            raise InvalidInput(f"cache directory {req.cache.disk_dir}: {exc.strerror}") from None
    catalog = Catalog(backend, req.cache, stats, disk, prepared)
    writeback = None
    if backend.capabilities & Capability.WRITE:
        writeback = WriteBack(catalog, staging_dir(req.cache), req.url,
                              asynchronous=req.cache.write_back == "async",
                              parallelism=req.cache.write_back_parallelism)
        try:
            writeback.adopt()
        except OSError as exc:
            raise InvalidInput(f"staging directory {writeback.staging_dir}: "
                               f"{exc.strerror}") from None
    ops = RucioFs(catalog, root, req.cache, stats, xattrs=req.xattrs, writeback=writeback)

    def background(nursery: trio.Nursery) -> None:
        catalog.nursery = nursery
        if writeback is not None:
            writeback.nursery = nursery
            nursery.start_soon(writeback.run_retries)
            nursery.start_soon(writeback.queue.run)
        if disk is not None:
            for _ in range(DISK_WRITERS):
                nursery.start_soon(catalog.data_path.run_disk_writer)

    async def close() -> None:
        if writeback is not None:
            async with trio.open_nursery() as nursery:
                writeback.nursery = nursery
                await writeback.shutdown()
        await catalog.data_path.flush_disk_writes()
        await catalog.aclose()

    await _session(req, ops, stats, state, backend.scheme,
                   not backend.capabilities & Capability.WRITE, background, close)


def kernel_checks_permissions(allow_other: bool, euid: int) -> bool:
    """Whether the kernel checks each request against the permission bits shown
    (``default_permissions``). Not on a mount of root's that only root can enter (no
    ``allow_other``: the kernel lets in no other user): root may read, write and search
    whatever the bits say, so the checks could refuse nothing, yet each one costs a GETATTR
    of the directory whenever a name in it changed, one more round trip per file created or
    removed. What root may still not do, execute a file with no x bit, the kernel checks
    without them, and ``access(X_OK)`` is answered by :meth:`RucioFs.access`."""
    return allow_other or euid != 0


async def _session(req: MountRequest, ops: RucioFs, stats: Stats,
                   state: dict[str, int | None], scheme: str, read_only: bool,
                   background: Callable[[trio.Nursery], None],
                   close: Callable[[], Awaitable[None]]) -> None:
    """Mount ``ops`` and serve the kernel until unmounted; ``background`` starts the mount's
    own tasks, ``close`` lets go of its catalogs afterwards."""
    options = set(pyfuse3.default_options)
    options.discard("default_permissions")
    options |= {f"fsname={_fsname(req.url)}", "subtype=rucio-fs"}
    if kernel_checks_permissions(req.allow_other, os.geteuid()):
        options.add("default_permissions")
    options |= set(req.kernel_flags)
    if read_only:
        options.add("ro")
    if req.allow_other:
        options.add("allow_other")
    if req.debug:
        options.add("debug")
    kernel_tuning.ask_parallel_dirops()
    passthrough.ask(req.cache.passthrough)
    try:
        pyfuse3.init(ops, req.mountpoint, options)
    except RuntimeError as exc:
        raise InvalidInput(f"cannot mount on {req.mountpoint}: {exc}") from None
    ops.watch_channel()
    unmount = True
    try:
        info = find_mount(req.mountpoint)
        minor = info.minor if info else -1
        stats.static.update({
            "version": __version__, "pid": os.getpid(), "url": req.url,
            "mountpoint": req.mountpoint, "backend": scheme,
            "config": {**req.cache.as_dict(), "identity": req.identity},
            "kernel": {"fuse_connection": minor, "max_tasks": req.max_tasks,
                       "xattrs": req.xattrs},
        })
        handler = _control_handler(ops, stats, req)
        async with trio.open_nursery() as nursery:
            await nursery.start(control.serve, socket_path(minor), handler)
            nursery.start_soon(_stop_on_signal, nursery.cancel_scope)
            nursery.start_soon(_finish_mount, req, minor, stats, state)
            ops.nursery = nursery
            background(nursery)
            await pyfuse3.main(min_tasks=4, max_tasks=req.max_tasks)
            # main() returns when the kernel ended the session (fusermount -u): already gone.
            unmount = False
            nursery.cancel_scope.cancel()
    finally:
        pyfuse3.close(unmount=unmount)
        await close()
        log.info("unmounted %s", req.mountpoint)


async def _finish_mount(req: MountRequest, minor: int, stats: Stats,
                        state: dict[str, int | None]) -> None:
    """Once the kernel has finished FUSE_INIT, tune the mount and tell the invoker it is ready.

    A stat of the mountpoint (from a worker thread: this loop must answer it) returns only
    after the kernel processed our INIT reply, which would otherwise reset the read-ahead.
    """
    await trio.to_thread.run_sync(os.stat, req.mountpoint)
    stats.static["kernel"].update(kernel_tuning.tune(minor, req.read_ahead_kb,
                                                     req.max_background))
    parallel = stats.static["kernel"]["parallel_dirops"] = kernel_tuning.parallel_dirops()
    stats.static["kernel"]["passthrough"] = passthrough.answer()
    if parallel is False:
        log.info("the kernel sends the lookups of one directory one at a time "
                 "(libfuse < 3.17; see docs/reading.md)")
    log.info("mounted %s on %s (fuse connection %d)", req.url, req.mountpoint, minor)
    _report(state["ready_fd"], "ok")
    state["ready_fd"] = None


async def _stop_on_signal(scope: trio.CancelScope) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for signum in signals:
            log.info("received %s, unmounting", signal.Signals(signum).name)
            scope.cancel()
            return


def staging_dir(config: MountConfig) -> str:
    if config.staging_dir:
        return config.staging_dir
    if config.disk_dir:
        return os.path.join(config.disk_dir, "staging")
    return os.path.join(tempfile.gettempdir(), f"rucio-fs-{os.getuid()}", "staging")


def _fsname(url: str) -> str:
    # fsname shows in `mount` and `df`; commas would split the option string.
    return url.replace(",", "%2C").replace(" ", "%20") or "rucio-fs"


def _control_handler(ops: RucioFs, stats: Stats, req: MountRequest) -> control.Handler:
    #: The backend's own counters at the last ``stats --reset`` (they cannot be zeroed).
    baseline: dict[str, int] = {}

    def all_counters() -> Counter[str]:
        total: Counter[str] = Counter()
        for catalog in ops.catalogs():  # a per-user mount: summed over its users' catalogs
            total.update(catalog.backend_counters())
        return total

    def backend_counters() -> dict[str, int]:
        return {key: value - baseline.get(key, 0) for key, value in all_counters().items()}

    def sizes() -> dict[str, int]:
        total: Counter[str] = Counter()
        for catalog in ops.catalogs():
            disk = catalog.data_path.disk
            total.update({"metadata_entries": len(catalog.metadata),
                          "listing_entries": catalog.listing.currsize,
                          "data_bytes": catalog.data_path.data.currsize,
                          **({"disk_bytes": disk.currsize, "disk_blocks": len(disk)}
                             if disk is not None else {})})
        return dict(total)

    live = {
        "backend_counters": backend_counters,
        "inodes": lambda: {"known": len(ops.inodes)},
        "sizes": sizes,
        **({"identities": ops.identities.snapshot} if ops.identities is not None else {}),
    }

    async def handle(message: dict[str, Any], peer: control.Peer) -> Any:
        op = message["op"]
        if op == "info":
            return {key: stats.static[key] for key in ("pid", "url", "mountpoint", "version")}
        if op == "stats":
            snap = stats.snapshot(live)
            if message.get("reset"):
                stats.reset()
                baseline.update(all_counters())
            return snap
        if op == "drop":
            layers = message.get("layers") or list(LAYERS)
            unknown = set(layers) - set(LAYERS)
            if unknown:
                raise InvalidInput(f"unknown cache layer(s): {', '.join(sorted(unknown))}")
            ops.drop_caches(layers)
            # The kernel keeps names and attributes as long as these layers answer them.
            invalidated = (await ops.drop_kernel_cache()
                           if {"kernel", "metadata", "listing"} & set(layers) else 0)
            forgotten = 0
            for catalog in ops.catalogs():
                if catalog.shared and "shared" in layers:
                    forgotten += await catalog.shared.forget_mine()
            return {"layers": layers, "kernel_inodes_invalidated": invalidated,
                    "shared_keys_deleted": forgotten}
        if op == "uploads":
            if not ops.writable:
                raise InvalidInput("this mount is read-only")
            if message.get("discard") and ops.identities is not None:
                raise InvalidInput("a per-user mount's pending files are each user's own: "
                                   "--discard is not offered there")
            if message.get("wait"):
                await ops.closes_arrived()  # (files closed without a FLUSH: see create)
            # A per-user mount: every user's write-back, its files named with the uid.
            result: dict[str, list] = {
                "pending": [], "queued": [], "dropped": [], "failed": [],
                "discarded": [p for p in message.get("discard", [])
                              if await ops.discard_pending(p)]}
            for writes in ops.writebacks():
                owner = {"uid": writes.uid} if writes.uid is not None else {}
                if message.get("retry"):
                    result["failed"] += await writes.retry()
                if message.get("wait"):
                    try:
                        await writes.settle("/")
                    except RucioFsError as exc:
                        result["failed"].append(("/", str(exc)))
                result["pending"] += [{"path": d.path, "size": d.size, "error": d.error,
                                       "staged": d.where, **owner} for d in writes.pending()]
                result["queued"] += [{**q, **owner} for q in writes.queued()]
                result["dropped"] += writes.queue.take_failed()
            return result
        if op == "warm":
            if ops.identities is not None:
                raise InvalidInput("warm: a per-user mount's caches are each user's own; run "
                                   "the job's reads as that user instead")
            warmer = Warmer(ops.catalog, [str(p) for p in message.get("paths", ["/"])],
                            bool(message.get("recursive")), bool(message.get("data")),
                            max(1, min(256, int(message.get("jobs", 8)))))
            # The walk runs in this connection's task, so it ends with it at the latest.
            progress = await warmer.converse(
                peer, max(0.05, min(10.0, float(message.get("every", 1.0)))))
            if warmer.abandoned:
                stats.events["warm_client_gone"] += 1
            return progress
        if op == "trace_start":
            if ops.recorder is not None:
                log.warning("a trace was still recording (its client is gone?); starting anew")
            ops.recorder = RequestRecorder(int(message.get("limit", 2_000_000)))
            return {"clock": "CLOCK_MONOTONIC"}
        if op == "trace_stop":
            recorder, ops.recorder = ops.recorder, None
            if recorder is None:
                raise InvalidInput("no trace is recording on this mount")
            return {"records": recorder.records, "dropped": recorder.dropped}
        raise InvalidInput(f"unknown control op {op!r}")

    return handle


def process_running(pid: int) -> bool:
    """Whether process ``pid`` is still running. A zombie has exited: the daemon is a child
    of init once its invoker is gone, and some inits (a container's PID 1) reap it only
    every second or so — ``unmount`` waited for that, 1.3 s per unmount."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(") ")[2][:1] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:
        return True


def unmount(mountpoint: str, timeout: float = 30.0) -> None:
    """Unmount a rucio-fs mount and wait for its daemon to exit."""
    mountpoint = os.path.abspath(mountpoint)
    require_rucio_fs(mountpoint)
    try:
        pid = int(control.request(mountpoint, "info", timeout=5)["pid"])
    except RucioFsError:
        pid = None  # the daemon is gone; the kernel mount is all that is left
    cmd = ["fusermount3", "-u", mountpoint] if pid else ["fusermount3", "-u", "-z", mountpoint]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        reason = (result.stderr.strip().splitlines() or ["fusermount3 failed"])[-1]
        raise Unavailable(f"cannot unmount {mountpoint}: {reason}")
    deadline = time.monotonic() + timeout
    while pid and time.monotonic() < deadline:
        if not process_running(pid):
            return
        time.sleep(0.02)
    if pid:
        raise Unavailable(f"unmounted {mountpoint}, but daemon {pid} is still running")
