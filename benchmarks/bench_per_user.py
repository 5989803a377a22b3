"""What serving each user as themselves costs: a per-user mount against a single-identity one.

Against the real Rucio server of the tests, with ``--users`` local users made for the run
(removed afterwards), each with its own rucio.cfg. Both mounts use ``--allow-other``; the
single-identity one serves everyone with the mounting user's account. In the same run,
alternating the two mounts, for 1 user and for all users at once:

* warm ``ls -l`` of the 10,000-file dataset (each user's listing cached by a first one);
* cold ``cat`` of a 4 KiB file never read before (every layer dropped; on the per-user
  mount the user's credentials are already known: their first request, with its login, is
  reported apart).

Goal (issue): per-user ≤ 1.10 times the single-identity time for each. Prints Markdown, writes JSON.
"""

from __future__ import annotations

import json
import os
import pwd
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import Goal, add_goals, at_most, rucio_arguments, rucio_server

from rucio_fs.testing.mount import Mount

REPO = Path(__file__).resolve().parent.parent


def make_users(count: int, server: Path) -> list[tuple[pwd.struct_passwd, dict[str, str]]]:
    """``count`` local users, each with a rucio.cfg (the server's) in its home."""
    users = []
    cfg = Path(os.environ["RUCIO_CONFIG"]).read_text()
    for i in range(count):
        name = f"rfs-bench-{i}"
        subprocess.run(["userdel", "-r", "-f", name], capture_output=True)
        subprocess.run(["useradd", "-m", "-s", "/bin/sh", name], check=True)
        user = pwd.getpwnam(name)
        path = Path(user.pw_dir) / "rucio.cfg"
        path.write_text(cfg)
        os.chown(path, user.pw_uid, user.pw_gid)
        path.chmod(0o600)
        users.append((user, {"RUCIO_CONFIG": str(path), "PATH": "/usr/bin:/bin"}))
    return users


def remove_users(users: list) -> None:
    for user, _ in users:
        subprocess.run(["userdel", "-r", "-f", user.pw_name], capture_output=True)


def mount(root: Path, name: str, query: str, *options: str) -> Mount:
    """``rucio:///bench[?query]`` on a mountpoint every user can reach."""
    path = root / name
    path.mkdir(mode=0o755)
    return Mount.start("rucio:///bench" + (f"?{query}" if query else ""), path, *options)


def at_once(users: list, command: list[str], per_user: bool = False) -> list[float]:
    """Every user runs ``command`` at the same moment (``per_user``: the command with the
    i-th of its arguments for the i-th user); each one's seconds."""
    commands = ([[command[0], arg] for arg in command[1:]] if per_user
                else [command] * len(users))
    start = time.perf_counter()
    procs = [subprocess.Popen(c, user=u.pw_uid, group=u.pw_gid, env=env, cwd="/",
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
             for (u, env), c in zip(users, commands, strict=True)]
    times = []
    for proc in procs:
        _, err = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"{command}: {err.decode().strip()}")
        times.append(time.perf_counter() - start)
    return times


#: What each measured kind is, in a goal row.
KINDS = {"warm_ls_l_10k_s": "warm `ls -l` 10,000 files", "cold_cat_s": "cold `cat` 4 KiB"}


def goals(r: dict) -> list[Goal]:
    """The per-user issue's goal, from the measurements in ``r``: a per-user mount within
    1.10x of a single-identity one, for each measurement, one user and all at once."""
    rows = []
    for group in ("1 user", f"{r['users']} users"):
        for kind, what in KINDS.items():
            single, per_user = r[group][kind]["single"], r[group][kind]["per-user"]
            rows.append(Goal("bench_per_user", f"{what}, {group} at once",
                             f"per-user {1000 * per_user:.1f} ms",
                             f"single identity {1000 * single:.1f} ms", per_user / single,
                             "≤ 1.10x", at_most(per_user / single, 1.10)))
    return rows


def main() -> int:
    ap = rucio_arguments(__doc__, "per_user", repeat=7)
    ap.add_argument("--users", type=int, default=10)
    ap.add_argument("--url-options", default="", metavar="K=V[&K=V]",
                    help="backend options of both mounts (e.g. rses=DAV: the site's RSE, "
                         "whose first reads are guessed from the start)")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="rucio-fs-bench-per-user-"))
    root.chmod(0o755)
    results: dict = {"kernel": os.uname().release, "cpus": os.cpu_count(), "users": args.users,
                     "url_options": args.url_options}
    with rucio_server(args.server, root) as (server, _):
        catalog = json.loads((server / "catalog.json").read_text())
        users = make_users(args.users, server)
        mounts = {"single": mount(root, "single", args.url_options, "--allow-other"),
                  "per-user": mount(root, "per-user", args.url_options, "--allow-other",
                                    "--identity", "per-user")}
        try:
            first = at_once(users, ["ls", str(mounts["per-user"].path)])
            results["per_user_first_request_s"] = max(first)
            files = iter(catalog["ds5000"])
            for group, who in (("1 user", users[:1]), (f"{len(users)} users", users)):
                for m in mounts.values():  # caches of each user's listing filled
                    at_once(who, ["ls", "-l", str(m.path / "ds10000")])
                warm: dict[str, list[float]] = {k: [] for k in mounts}
                cold: dict[str, list[float]] = {k: [] for k in mounts}
                for _ in range(args.repeat):  # alternating: both see the same machine
                    for name, m in mounts.items():
                        warm[name].append(max(at_once(
                            who, ["ls", "-l", str(m.path / "ds10000")])))
                for _ in range(args.repeat):  # after the warm series: drops empty the caches
                    for name, m in mounts.items():
                        m.drop()
                        time.sleep(0.2)  # the kernel's forgets of the dropped inodes
                        # Each user its own file: no answer of one user serves another.
                        paths = [str(m.path / "ds5000" / next(files)["name"]) for _ in who]
                        cold[name].append(max(at_once(who, ["cat", *paths], per_user=True)))
                results[group] = {
                    kind: {name: statistics.median(v) for name, v in series.items()}
                    for kind, series in (("warm_ls_l_10k_s", warm), ("cold_cat_s", cold))}
        finally:
            for m in mounts.values():
                m.unmount()
            remove_users(users)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(add_goals(results, goals(results)), indent=1))
    print("| measurement | users at once | single identity | per-user | ratio | goal |")
    print("|---|---:|---:|---:|---:|---|")
    for group in ("1 user", f"{args.users} users"):
        for kind, label in (("warm_ls_l_10k_s", "warm `ls -l` 10,000"),
                            ("cold_cat_s", "cold `cat` 4 KiB")):
            r = results[group][kind]
            print(f"| {label} | {group} | {1000 * r['single']:.1f} ms | "
                  f"{1000 * r['per-user']:.1f} ms | {r['per-user'] / r['single']:.2f}x "
                  f"| ≤ 1.10x |")
    print(f"\nper-user: the first request of {args.users} new users at once (their logins): "
          f"{1000 * results['per_user_first_request_s']:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
