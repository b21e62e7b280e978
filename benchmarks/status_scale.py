"""Issue #18: `flow status` at 100,000 and 1,000,000 jobs, two source trees interleaved.

    python benchmarks/status_scale.py --base OLD_TREE --new NEW_TREE --tmp DIR \\
        [--sizes 100000 1000000] [--reps 5] [--keep]

Each workspace is made by `flow init` and a few real submissions (registered, so their
service class and group records exist), then filled with marker files written directly in
the layout the engine makes (`.flow/state/<kind>/jobs/<2 hex digits>/<marker>`, no job
directory: `flow status` reads names only; a ready marker of a class in its class
directory, `.../jobs/<2 hex digits>/@<class>/`, unless `--flat`). The mix: 85% ready,
4% submitted, 7% succeeded, 2% failed, 1% waiting, 1% cancelled; a fifth of the keys
tagged (tags ending in '-' or holding '--' among them), a tenth of ready markers of another
pool's class,
one in twenty with a not-before field (half of them in the future), half with a group
field; child jobs in a subdirectory of their parent's shard, a placement whose name holds
a dot, and stray names (an editor's temporary file, a `.birth.` name, a name holding a
newline) that are no markers.

Each repetition times `flow -w WS status` and `flow -w WS status --json` under each tree
(which tree goes first alternates), as whole commands, then `status --json` again once the
heartbeat of a live manager with an end is written (the time fit's sample of ready jobs);
reported are the medians per side and the median of the per-repetition ratios new/base,
so the shared machine's load cancels out, and the load average. The two trees' JSON
documents must agree (on the counts and what is blocked, with a live manager).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time

from httk_flow.protocol.names import to36

#: share of jobs per state kind (the rest of the million are ready)
MIX = {"submitted": 0.04, "succeeded": 0.07, "failed": 0.02, "waiting": 0.01, "cancelled": 0.01}
TAGS = ("run", "a-", "x--y", "sweep_1+2", "T" * 64, "n0")
#: far from any clock the benchmark runs at: the backoff count does not depend on when
FUTURE, PAST = 4_000_000_000, 1_000_000_000


#: where every Python the benchmark starts caches its bytecode (set by main)
PYCACHE: list[str] = []


def _env(tree: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
    if PYCACHE:
        # bytecode cached for both trees alike, out of the trees, even where the shell sets
        # PYTHONDONTWRITEBYTECODE (each start would compile every module otherwise)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = PYCACHE[0]
    return env


def _flow(*args: str) -> list[str]:
    # -P: the current directory never shadows the tree on PYTHONPATH
    return [sys.executable, "-P", "-m", "httk_flow", *args]


def _real_fields(ws: str, tree: str) -> tuple[str, str, str]:
    """(writer, class id, group digest) of real submissions: a pool's class and an
    array's group, so the markers made below name records that exist."""
    env = _env(tree)
    out = subprocess.DEVNULL
    sub = [*_flow("-w", ws, "submit"), "--array", "1-2"]
    subprocess.run([*sub, "/bin/true"], env=env, check=True, stdout=out)
    subprocess.run(
        [*sub, "--pool", "gpu", "--tag", "run", "/bin/true"], env=env, check=True, stdout=out
    )
    register = (
        "import sys\n"
        "from httk_flow.protocol.discovery import walk_all\n"
        "from httk_flow.protocol.jobs import register\n"
        "from httk_flow.protocol.states import State\n"
        "from httk_flow.protocol.workspace import Workspace\n"
        "ws = Workspace.open(sys.argv[1])\n"
        "for h in list(walk_all(ws, State.SUBMITTED)):\n"
        "    register(ws, h, actor='bench')\n"
        "ws.close()\n"
    )
    subprocess.run([sys.executable, "-P", "-c", register, ws], env=env, check=True)
    cls = grp = writer = ""
    for _, _, files in os.walk(os.path.join(ws, ".flow", "state", "ready")):
        for name in files:
            fields = name.split(".")
            writer = fields[-1].split("-")[0]
            for f in fields[1:-1]:
                if f[0] == "c":
                    cls = f[1:]
                elif f[0] == "s":
                    grp = f[1:]
    if not (cls and grp and writer):
        raise SystemExit(f"no class, group or writer among the real markers of {ws}")
    return writer, cls, grp


def _marker(rng: random.Random, kind: str, i: int, writer: str, cls: str, grp: str) -> str:
    key = f"{rng.getrandbits(128):032x}"
    if rng.random() < 0.2:
        key = f"{rng.choice(TAGS)}--{key}"
    prio = "p500" if rng.random() < 0.9 else f"p{rng.randrange(1000):03d}"
    gen = {"submitted": 0, "ready": 1}.get(kind, rng.randrange(2, 40))
    name = f"{key}.{prio}.g{to36(gen)}"
    if kind == "ready" and rng.random() < 0.05:
        name += f".t{to36(FUTURE if rng.random() < 0.5 else PAST)}"
    if kind != "submitted" and rng.random() < 0.1:
        name += f".c{cls}"
    if rng.random() < 0.5:
        name += f".s{grp}"
    if kind == "waiting" and rng.random() < 0.5:
        name += ".a"
    return f"{name}.{writer}-{to36(i // 4096)}-{to36(i % 4096 * 97)}"


def _touch(path: str) -> None:
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))


def build(ws: str, tree: str, n: int, seed: int = 18, *init: str) -> dict[str, int]:
    """A workspace of about `n` jobs (`flow init` given `init`); the marker count made per
    state kind. A ready marker of a class lies in its class directory where the policy
    says so (`class_dirs`, protocol revision 8)."""
    subprocess.run(_flow("init", *init, ws), env=_env(tree), check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(ws, ".flow", "format.json"), "rb") as f:
        class_dirs = json.load(f)["policy"].get("class_dirs", False)
    writer, cls, grp = _real_fields(ws, tree)
    rng = random.Random(seed)
    state = os.path.join(ws, ".flow", "state")
    made: dict[str, int] = {}
    kinds = [*MIX, "ready"]
    weights = [*MIX.values(), 1 - sum(MIX.values())]
    known: set[str] = set()
    for i in range(n - 4):
        kind = rng.choices(kinds, weights)[0]
        name = _marker(rng, kind, i, writer, cls, grp)
        key = name.split(".")[0]
        shard = key[-32:-30]
        if i % 1000 == 7:
            # a child job: its placement is <parent placement>/<parent key>
            parent = f"{rng.getrandbits(128):032x}"
            d = os.path.join(state, kind, "jobs", parent[:2], parent)
        elif i % 1000 == 11:
            d = os.path.join(state, kind, "runs", "v1.2")
        else:
            d = os.path.join(state, kind, "jobs", shard)
        if class_dirs and kind == "ready" and f".c{cls}." in name:
            d = os.path.join(d, f"@{cls}")
        if d not in known:
            os.makedirs(d, exist_ok=True)
            known.add(d)
        _touch(os.path.join(d, name))
        made[kind] = made.get(kind, 0) + 1
    # no markers: every kind's first shard gets an editor's file, a birth name, a name
    # with a newline between two marker names, and a directory named like a marker
    for kind in made:
        d = os.path.join(state, kind, "jobs", "00")
        os.makedirs(d, exist_ok=True)
        one = _marker(rng, kind, 0, writer, cls, grp)
        two = _marker(rng, kind, 1, writer, cls, grp)
        for stray in (f".{one}.swp", f"{one}~", f".birth.{one}", f"{one}\n{two}"):
            _touch(os.path.join(d, stray))
        os.mkdir(os.path.join(d, _marker(rng, kind, 2, writer, cls, grp)))
    made["ready"] = made.get("ready", 0) + 4  # the real submissions
    return made


def _live_manager(ws: str, tree: str) -> None:
    """A heartbeat of a manager on another host with an hour left: `flow status` then
    samples ready jobs for the time fit (ops/fit.py), the path a live allocation takes."""
    beat = (
        "import sys, time\n"
        "from httk_flow.protocol.leases import ManagerInfo, write_heartbeat\n"
        "from httk_flow.protocol.workspace import Workspace\n"
        "ws = Workspace.open(sys.argv[1])\n"
        "now = time.time()\n"
        "info = ManagerInfo('mbench', 'bench-elsewhere', 4242, now, ends_at=now + 3600,\n"
        "                   lease=3600.0, seq=1)\n"
        "write_heartbeat(ws, info)\n"
        "ws.close()\n"
    )
    subprocess.run([sys.executable, "-P", "-c", beat, ws], env=_env(tree), check=True)


def _same(doc: bytes) -> object:
    """What two trees' `status --json` must agree on (a manager's heartbeat age moves)."""
    d = json.loads(doc)
    return d["counts"], d["blocked"]


def _timed(argv: list[str], env: dict[str, str]) -> tuple[float, bytes]:
    t0 = time.perf_counter()
    p = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    if p.returncode not in (0, 4):
        raise SystemExit(f"failed ({p.returncode}): {' '.join(argv)}")
    return wall, p.stdout


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--base", required=True, help="source tree of the baseline")
    ap.add_argument("--new", required=True, help="source tree of the change")
    ap.add_argument("--tmp", required=True, help="where the workspaces are made (tmpfs: fast)")
    ap.add_argument("--sizes", type=int, nargs="*", default=[100_000, 1_000_000])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--keep", action="store_true", help="leave the workspaces behind")
    ap.add_argument(
        "--flat",
        action="store_true",
        help="make the workspaces with --no-class-dirs: a base tree before protocol "
        "revision 8 refuses one with class directories",
    )
    a = ap.parse_args()
    trees = {"base": a.base, "new": a.new}
    root = os.path.join(a.tmp, f"status-scale-{os.getpid()}")
    os.makedirs(root)
    PYCACHE.append(os.path.join(root, "pycache"))
    loads = [load()]
    try:
        for n in a.sizes:
            ws = os.path.join(root, f"ws-{n}")
            t0 = time.perf_counter()
            made = build(ws, a.new, n, 18, *(("--no-class-dirs",) if a.flat else ()))
            print(
                f"{n} jobs built in {time.perf_counter() - t0:.1f}s: "
                + ", ".join(f"{k} {v}" for k, v in sorted(made.items())),
                flush=True,
            )
            for tree in trees.values():  # warm: bytecode written, directories cached
                _timed(_flow("-w", ws, "status"), _env(tree))
            variants = [((), "status"), (("--json",), "status --json")]
            variants.append((("--json",), "status --json, a live manager with an end"))
            for variant, label in variants:
                if "live" in label:
                    _live_manager(ws, a.new)
                walls: dict[str, list[float]] = {k: [] for k in trees}
                for rep in range(a.reps):
                    order = list(trees) if rep % 2 == 0 else list(reversed(trees))
                    docs = {}
                    for side in order:
                        w, out = _timed(_flow("-w", ws, "status", *variant), _env(trees[side]))
                        walls[side].append(w)
                        docs[side] = out
                    if variant and _same(docs["base"]) != _same(docs["new"]):
                        raise SystemExit(f"the trees disagree on {ws}:\n{docs}")
                    print(
                        f"{n} {label} rep {rep}: base {walls['base'][-1]:.3f}s "
                        f"new {walls['new'][-1]:.3f}s "
                        f"ratio {walls['new'][-1] / walls['base'][-1]:.2f} (load {load()})",
                        flush=True,
                    )
                ratios = [x / y for x, y in zip(walls["new"], walls["base"], strict=True)]
                print(
                    f"{n} {label}: median base {statistics.median(walls['base']):.3f}s "
                    f"new {statistics.median(walls['new']):.3f}s, "
                    f"median ratio new/base {statistics.median(ratios):.2f}",
                    flush=True,
                )
            loads.append(load())
            if not a.keep:
                shutil.rmtree(ws)
    finally:
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(f"load average (1, 5, 15 min) at start and after each size: {' | '.join(loads)}")


if __name__ == "__main__":
    main()
