"""Register the test catalog in a fresh Rucio server (run by rucio.sh with Rucio's own client).

Files are written straight under the nginx WebDAV root at the path of Rucio's deterministic
``hash`` lfn2pfn layout and registered as replicas; one file goes through a real
``rucio upload``. What is registered (scope ``bench`` unless said)::

    ds500 ds1000 ds5000 ds10000   datasets of N 4 KiB random files ("<ds>.f<NNNNNN>.dat")
    ds50000                       only with --bench
    cont                          container: ds500, ds1000 and other:ds-other (another scope)
    slashes                       files whose names contain "/" ("dir/sub/file1.dat", ...)
    big                           frame-4509715660.gwf, the demo catalog's generated big file
                                  (on DAV, and on XRD: the same bytes)
    faults                        short.dat (catalog says more bytes than storage has),
                                  fallback.dat (first replica on a dead RSE), dead.dat (only there)
    uploaded                      one file uploaded with the rucio CLI
    loose.dat                     a file attached to nothing (a top-level DID of the scope)
    longnames                     names of 250 characters, one with "/"s in it (its path
                                  component is longer than 255 bytes)
    xrd                           files whose only replica is on RSE XRD (root://): 20 of
                                  4 KiB, one of 20 MiB and xrd-sparse.dat (4 GiB + 1 MiB of
                                  zeros but for a mark past 4 GiB); xrd-damaged.dat, whose
                                  XRD copy is damaged and whose DAV copy is sound
    xrdonly                       the 4 KiB and 20 MiB files of xrd

Also writes ``<base>/catalog.json``: every dataset's files with sizes and checksums, what the
tests compare the mount against.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
import zlib

from rucio.client import Client

SMALL = 4096
BATCH = 500  # SQLite rejects add_replicas of 999 or more files
BIG_SIZE = 4_509_715_660


def pfn_path(base: str, scope: str, name: str, prefix: str = "rucio",
             webdav: str = "webdav") -> str:
    """Where the file is, below the WebDAV root in ``base`` (``webdav=""``: below ``base``)."""
    digest = hashlib.md5(f"{scope}:{name}".encode()).hexdigest()
    root = f"{base}/{webdav}" if webdav else base
    return f"{root}/{prefix}/{scope}/{digest[0:2]}/{digest[2:4]}/{name}"


def put_file(base: str, scope: str, name: str, data: bytes, prefix: str = "rucio",
             webdav: str = "webdav") -> dict:
    path = pfn_path(base, scope, name, prefix, webdav)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return {"scope": scope, "name": name, "bytes": len(data),
            "adler32": f"{zlib.adler32(data):08x}", "md5": hashlib.md5(data).hexdigest()}


def add_replicas(client: Client, rse: str, files: list[dict]) -> None:
    for k in range(0, len(files), BATCH):
        client.add_replicas(rse=rse, files=files[k:k + BATCH])


def make_dataset(client: Client, scope: str, name: str, files: list[dict],
                 close: bool = True) -> None:
    client.add_dataset(scope, name)
    for k in range(0, len(files), BATCH):
        client.attach_dids(scope, name, [{"scope": f["scope"], "name": f["name"]}
                                         for f in files[k:k + BATCH]])
    if close:
        client.close(scope, name)


def small_dataset(client: Client, base: str, scope: str, name: str, n: int) -> list[dict]:
    rng = __import__("random").Random(f"{scope}:{name}")
    files = [put_file(base, scope, f"{name}.f{i:06d}.dat", rng.randbytes(SMALL))
             for i in range(n)]
    add_replicas(client, "DAV", files)
    make_dataset(client, scope, name, files)
    return files


#: The longest names the generic schema allows (250 characters); Rucio refuses a space, %,
#: unicode or a leading "-" in a name, so odd characters are tested on the read path itself.
LONG_NAMES = ["L" * 246 + ".dat", "s/" * 121 + "end.dat"]


def long_names(client: Client, base: str) -> list[dict]:
    """Dataset ``bench:longnames``: one small file per long name."""
    rng = __import__("random").Random("longnames")
    files = [put_file(base, "bench", name, rng.randbytes(2000 + i))
             for i, name in enumerate(LONG_NAMES)]
    add_replicas(client, "DAV", files)
    make_dataset(client, "bench", "longnames", files)
    return files


def add_storage(client: Client, rse: str, prefix: str, http: int, https: int,
                deterministic: bool = True) -> None:
    """An RSE on the test nginx under ``/<prefix>/`` (https preferred, as for DAV)."""
    client.add_rse(rse, deterministic=deterministic)
    for scheme, port, priority in (("https", https, 1), ("http", http, 2)):
        domains = {"lan": {"read": priority, "write": priority, "delete": priority},
                   "wan": {"read": priority, "write": priority, "delete": priority,
                           "third_party_copy_read": priority,
                           "third_party_copy_write": priority}}
        client.add_protocol(rse, {"scheme": scheme, "hostname": "127.0.0.1", "port": port,
                                  "prefix": f"/{prefix}/",
                                  "impl": "rucio.rse.protocols.webdav.NoRename",
                                  "domains": domains})
    client.set_local_account_limit("root", rse, -1)


def xrootd_files(client: Client, base: str, root: str, host: str, port: int) -> list[dict]:
    """RSE ``XRD`` (root:// on the test xrootd, deterministic, ``hash`` layout under
    ``//rucio/``) and dataset ``bench:xrd`` (see the module's docstring)."""
    domains = {"lan": {"read": 1, "write": 1, "delete": 1},
               "wan": {"read": 1, "write": 1, "delete": 1,
                       "third_party_copy_read": 1, "third_party_copy_write": 1}}
    client.add_rse("XRD")
    client.add_protocol("XRD", {"scheme": "root", "hostname": host, "port": port,
                                "prefix": "//rucio/", "impl": "rucio.rse.protocols.xrootd.Default",
                                "domains": domains})
    client.set_local_account_limit("root", "XRD", -1)
    rng = __import__("random").Random("xrd")
    files = [put_file(root, "bench", f"xrd.f{i:06d}.dat", rng.randbytes(SMALL), webdav="")
             for i in range(20)]
    files.append(put_file(root, "bench", "xrd-big.dat", rng.randbytes(20 << 20), webdav=""))
    add_replicas(client, "XRD", files)
    sound = rng.randbytes(SMALL)
    damaged = put_file(root, "bench", "xrd-damaged.dat", sound, webdav="")
    with open(pfn_path(root, "bench", "xrd-damaged.dat", webdav=""), "r+b") as f:
        f.seek(100)
        f.write(b"\0" * 8)  # same size, other bytes: only the checksum tells
    put_file(base, "bench", "xrd-damaged.dat", sound)
    add_replicas(client, "XRD", [damaged])
    add_replicas(client, "DAV", [damaged])
    sparse = sparse_file(root, "bench", "xrd-sparse.dat")
    add_replicas(client, "XRD", [sparse])
    make_dataset(client, "bench", "xrd", [*files, damaged, sparse])
    make_dataset(client, "bench", "xrdonly", files)  # the sound ones: conformance's sample
    return [*files, damaged, sparse]


#: A file past 4 GiB (sizes that overflow 32 bits) that takes no space: zeros, with
#: ``SPARSE_MARK`` at ``SPARSE_MARK_AT``, past 4 GiB.
SPARSE_SIZE = (4 << 30) + (1 << 20)
SPARSE_MARK = b"past 4 GiB"
SPARSE_MARK_AT = (4 << 30) + 12345


def sparse_file(root: str, scope: str, name: str) -> dict:
    path = pfn_path(root, scope, name, webdav="")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(SPARSE_SIZE)
        f.seek(SPARSE_MARK_AT)
        f.write(SPARSE_MARK)
    zeros, adler, done = bytes(64 << 20), 1, 0
    while done < SPARSE_MARK_AT:
        step = min(len(zeros), SPARSE_MARK_AT - done)
        adler = zlib.adler32(memoryview(zeros)[:step], adler)
        done += step
    adler = zlib.adler32(SPARSE_MARK, adler)
    adler = zlib.adler32(bytes(SPARSE_SIZE - SPARSE_MARK_AT - len(SPARSE_MARK)), adler)
    return {"scope": scope, "name": name, "bytes": SPARSE_SIZE, "adler32": f"{adler:08x}"}


def first_reads(client: Client, base: str, http: int, https: int) -> list[dict]:
    """Dataset ``bench:guess``: files whose copy at the computed PFN is missing, damaged, or
    on an RSE without a computed layout (a second deterministic RSE DAV2 under /rucio2/, and
    NONDET under /nondet/, whose PFNs were chosen at registration)."""
    add_storage(client, "DAV2", "rucio2", http, https)
    add_storage(client, "NONDET", "nondet", http, https, deterministic=False)
    rng = __import__("random").Random("guess")

    def damaged(info: dict) -> None:
        path = pfn_path(base, "bench", info["name"])
        with open(path, "r+b") as f:
            f.write(b"\0" * 16)  # same size, other bytes

    both = {name: rng.randbytes(SMALL) for name in ("moved.dat", "corrupt.dat")}
    moved, corrupt = (put_file(base, "bench", name, data, prefix="rucio2")
                      for name, data in both.items())
    for name, data in both.items():
        put_file(base, "bench", name, data)
    os.unlink(pfn_path(base, "bench", "moved.dat"))  # registered on DAV, gone from it
    damaged(corrupt)
    bad = put_file(base, "bench", "bad.dat", rng.randbytes(SMALL))
    damaged(bad)
    add_replicas(client, "DAV", [moved, corrupt, bad])
    add_replicas(client, "DAV2", [moved, corrupt])
    data = rng.randbytes(SMALL)
    path = "nondet/chosen/at/registration/nondet.dat"
    os.makedirs(os.path.dirname(f"{base}/webdav/{path}"), exist_ok=True)
    with open(f"{base}/webdav/{path}", "wb") as f:
        f.write(data)
    # A decoy where a hash layout would put it on NONDET: never read, never served.
    nondet = dict(put_file(base, "bench", "nondet.dat", b"decoy" + data[5:], prefix="nondet"),
                  adler32=f"{zlib.adler32(data):08x}", md5=hashlib.md5(data).hexdigest())
    add_replicas(client, "NONDET", [dict(nondet, pfn=f"https://127.0.0.1:{https}/{path}")])
    files = [moved, corrupt, bad, nondet]
    make_dataset(client, "bench", "guess", files)
    return files


def write_big(base: str, writer: str, scope: str, name: str) -> dict:
    """The demo catalog's big file, generated by rucio-fs's own venv (same bytes, same sums)."""
    path = pfn_path(base, scope, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    code = ("import sys\n"
            "from rucio_fs.backends.demo.content import BIG_SIZE, big_file_range as r\n"
            "step = 64 << 20\n"
            "with open(sys.argv[1], 'wb') as f:\n"
            "    for off in range(0, BIG_SIZE, step):\n"
            "        f.write(r(off, step))\n"
            "from rucio_fs.backends.demo.content import BIG_ADLER32, BIG_MD5\n"
            "print(BIG_ADLER32, BIG_MD5)\n")
    if not (os.path.exists(path) and os.path.getsize(path) == BIG_SIZE):
        out = subprocess.run([writer, "-c", code, path], check=True, capture_output=True,
                             text=True).stdout
    else:
        out = subprocess.run([writer, "-c", code.split("step")[0] + "from rucio_fs.backends."
                              "demo.content import BIG_ADLER32, BIG_MD5\n"
                              "print(BIG_ADLER32, BIG_MD5)\n"],
                             check=True, capture_output=True, text=True).stdout
    adler, md5 = out.split()
    return {"scope": scope, "name": name, "bytes": BIG_SIZE, "adler32": adler, "md5": md5}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("--dav-http", type=int, required=True)
    ap.add_argument("--dav-https", type=int, required=True)
    ap.add_argument("--rucio", required=True, help="the rucio CLI")
    ap.add_argument("--big-writer", required=True, help="a python with rucio_fs installed")
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--xrd-host", required=True)
    ap.add_argument("--xrd-port", type=int, required=True)
    ap.add_argument("--xrd-root", required=True, help="the xrootd storage's local root")
    args = ap.parse_args()
    base, t0 = args.base, time.monotonic()

    def lap(what: str) -> None:
        print(f"rucio_populate: {what} at {time.monotonic() - t0:.1f} s", file=sys.stderr)

    client = Client()
    domains = {"lan": {"read": 1, "write": 1, "delete": 1},
               "wan": {"read": 1, "write": 1, "delete": 1,
                       "third_party_copy_read": 1, "third_party_copy_write": 1}}
    client.add_rse("DAV")
    # The write protocol must be https with NoRename (rucio upload's webdav quirks).
    client.add_protocol("DAV", {"scheme": "https", "hostname": "127.0.0.1",
                                "port": args.dav_https, "prefix": "/rucio/",
                                "impl": "rucio.rse.protocols.webdav.NoRename",
                                "domains": domains})
    lower = {d: {k: 2 for k in v} for d, v in domains.items()}
    client.add_protocol("DAV", {"scheme": "http", "hostname": "127.0.0.1",
                                "port": args.dav_http, "prefix": "/rucio/",
                                "impl": "rucio.rse.protocols.webdav.NoRename",
                                "domains": lower})
    client.add_rse("DEAD")  # its storage never answers: port 9 (discard) is closed here
    for scheme in ("https", "http"):
        client.add_protocol("DEAD", {"scheme": scheme, "hostname": "127.0.0.1", "port": 9,
                                     "prefix": "/rucio/",
                                     "impl": "rucio.rse.protocols.webdav.NoRename",
                                     "domains": domains})
    for rse in ("DAV", "DEAD"):
        client.set_local_account_limit("root", rse, -1)
    client.add_identity("root", "/CN=rucio-fs-test-user", "X509", "user@localhost")
    # A second account for per-user mounts (tests/test_per_user.py).
    client.add_account("alice", "USER", "alice@localhost")
    client.add_identity("alice", "alice", "USERPASS", "alice@localhost", password="alicepw")
    client.add_scope("root", "bench")
    client.add_scope("root", "other")
    lap("rse and scopes")

    catalog: dict[str, list[dict]] = {}
    sizes = [500, 1000, 5000, 10000] + ([50000] if args.bench else [])
    for n in sizes:
        catalog[f"ds{n}"] = small_dataset(client, base, "bench", f"ds{n}", n)
        lap(f"ds{n}")
    catalog["other:ds-other"] = small_dataset(client, base, "other", "ds-other", 20)
    client.add_container("bench", "cont")
    client.attach_dids("bench", "cont", [{"scope": "bench", "name": "ds500"},
                                         {"scope": "bench", "name": "ds1000"},
                                         {"scope": "other", "name": "ds-other"}])

    rng = __import__("random").Random("slashes")
    slashed = [put_file(base, "bench", name, rng.randbytes(1000 + 7 * i))
               for i, name in enumerate(["dir/sub/file1.dat", "dir/file2.dat", "top.dat",
                                         "/leading.dat"])]
    add_replicas(client, "DAV", slashed)
    make_dataset(client, "bench", "slashes", slashed)
    catalog["slashes"] = slashed

    big = write_big(base, args.big_writer, "bench", f"frame-{BIG_SIZE}.gwf")
    add_replicas(client, "DAV", [big])
    make_dataset(client, "bench", "big", [big])
    catalog["big"] = [big]
    lap("big file")

    short = put_file(base, "bench", "short.dat", rng.randbytes(SMALL))
    short_claim = dict(short, bytes=2 * SMALL)  # storage has half of what the catalog says
    fallback = put_file(base, "bench", "fallback.dat", rng.randbytes(SMALL))
    dead = dict(put_file(base, "bench", "dead.dat", rng.randbytes(SMALL)))
    add_replicas(client, "DAV", [short_claim, fallback])
    add_replicas(client, "DEAD", [fallback, dead])
    make_dataset(client, "bench", "faults", [short_claim, fallback, dead])
    catalog["faults"] = [short_claim, fallback, dead]

    catalog["longnames"] = long_names(client, base)

    loose = put_file(base, "bench", "loose.dat", rng.randbytes(SMALL))
    add_replicas(client, "DAV", [loose])
    catalog["loose"] = [loose]

    upload = os.path.join(base, "upload.dat")
    with open(upload, "wb") as f:
        f.write(rng.randbytes(100_000))
    env = dict(os.environ, X509_USER_PROXY=os.path.join(base, "x509up.pem"))
    result = subprocess.run([args.rucio, "upload", "--rse", "DAV", "--scope", "bench", upload,
                             "bench:uploaded"], capture_output=True, text=True, env=env)
    if result.returncode != 0:
        sys.exit(f"rucio upload failed: {result.stdout}{result.stderr}")
    with open(upload, "rb") as f:
        data = f.read()
    catalog["uploaded"] = [{"scope": "bench", "name": "upload.dat", "bytes": len(data),
                            "adler32": f"{zlib.adler32(data):08x}",
                            "md5": hashlib.md5(data).hexdigest()}]
    client.set_metadata("bench", "ds500", "project", "rucio-fs-tests")
    lap("faults, loose file, upload")
    catalog["guess"] = first_reads(client, base, args.dav_http, args.dav_https)
    lap("first reads")
    catalog["xrd"] = xrootd_files(client, base, args.xrd_root, args.xrd_host, args.xrd_port)
    # The big file on XRD too (the same bytes, linked): root:// and https reads side by side.
    linked = pfn_path(args.xrd_root, "bench", big["name"], webdav="")
    os.makedirs(os.path.dirname(linked), exist_ok=True)
    os.link(pfn_path(base, "bench", big["name"]), linked)
    add_replicas(client, "XRD", [big])
    lap("xrootd files")

    with open(os.path.join(base, "catalog.json"), "w") as f:
        json.dump(catalog, f)


if __name__ == "__main__":
    main()
