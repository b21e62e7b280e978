"""Issue #18's backlog figures: two source trees interleaved in one run.

    python benchmarks/backlog_pools.py --base OLD_TREE --new NEW_TREE --tmp DIR \\
        [--pool-b WS [--pool-b-new WS2]] [--finished WS] [--status WS ...] [--reps 3]

- pool: `flow run --pool A --workers 2` of 1,000 pool-A jobs in an empty workspace and
  beside the ready jobs of another pool (`--pool-b`, made with `flow submit --pool B
  --array 1-N` and registered); reported per tree as the ratio beside / empty, per
  repetition, so the machine's load cancels out. `--pool-b-new`: the new tree's own such
  workspace, made by it (a layout the base tree does not read, as protocol revision 8's
  class directories).
  Then the CPU over 20 s of `flow run --pool A --idle 3600` waiting beside them.
- idle: the CPU of an idle `flow serve --workers 2` over 20 s in a workspace whose jobs all
  finished (`--finished`). Before each side, every emptied state directory is grown again to
  the size the run left it (names made and removed), so both trees start from the same
  directories: a manager of the new tree removes them.
  `--as-if N`: the submitted and ready directories are first grown as N registrations
  leave them (N/256 marker-long names each, made and removed), so a workspace where a
  thousand jobs ran stands for one where N did.
- status: `flow status` wall time in each `--status` workspace.

Against a base tree before protocol revision 8, make the `--finished` and `--status`
workspaces with `flow init --no-class-dirs` (that tree refuses class directories).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ACTIVE = ("submitted", "ready", "claimed", "running", "committing", "cancelling")


def _env(tree: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.path.abspath(tree)}


def _flow(tree: str, *args: str) -> list[str]:
    # -P: the current directory never shadows the tree on PYTHONPATH
    return [sys.executable, "-P", "-m", "httk_flow", *args]


def _timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    t0 = time.perf_counter()
    pid = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid
    _, status, ru = os.wait4(pid, 0)
    if os.waitstatus_to_exitcode(status) not in (0, 4):
        raise SystemExit(f"failed ({status}): {' '.join(argv)}")
    return time.perf_counter() - t0, ru.ru_utime + ru.ru_stime


def _run(tree: str, *args: str) -> None:
    subprocess.run(_flow(tree, *args), env=_env(tree), check=True, stdout=subprocess.DEVNULL)


def pool_once(tree: str, ws: str, n: int) -> float:
    # a batch of its own each time: the same command again would complete the first batch
    # (batches are idempotent) and submit nothing
    batch = f"pool-a-{time.time_ns()}"
    _run(
        tree,
        "-w",
        ws,
        "submit",
        "--pool",
        "A",
        "--batch-id",
        batch,
        "--array",
        f"1-{n}",
        "/bin/true",
    )
    wall, _ = _timed(
        _flow(tree, "-w", ws, "run", "--pool", "A", "--workers", "2", "--idle", "0"), _env(tree)
    )
    return wall


def regrow(ws: str, sizes: dict[str, int]) -> None:
    """Make every emptied directory as large as the run left it: names made, then removed."""
    filler = "f" * 200
    for d, size in sizes.items():
        os.makedirs(d, exist_ok=True)
        made = []
        while os.stat(d).st_size < size:
            p = os.path.join(d, f"{filler}{len(made)}")
            open(p, "x").close()
            made.append(p)
        for p in made:
            os.unlink(p)


def grow_as_if(ws: str, jobs: int) -> None:
    """Grow the submitted and ready shard directories as `jobs` registrations leave them:
    every name made before any is removed, as the markers of a bulk submission wait
    together (a name removed at once would only free the slot the next one takes)."""
    per_shard = max(1, jobs // 256)
    name = "0" * 32 + ".p500.g1.w1m2n3o4p5q6-0-0"  # as long as a marker name
    for kind in ("submitted", "ready"):
        for i in range(256):
            d = os.path.join(ws, ".flow", "state", kind, "jobs", f"{i:02x}")
            os.makedirs(d, exist_ok=True)
            made = [os.path.join(d, f"{k:06d}{name}") for k in range(per_shard)]
            for p in made:
                open(p, "x").close()
            for p in made:
                os.unlink(p)


def emptied_dirs(ws: str) -> dict[str, int]:
    out = {}
    for kind in ACTIVE:
        root = os.path.join(ws, ".flow", "state", kind)
        for parent, dirs, files in os.walk(root):
            if parent != root and not dirs and not files:
                out[parent] = os.stat(parent).st_size
    return out


def idle_once(tree: str, ws: str, seconds: float, *how: str) -> float:
    """CPU of an idle manager over `seconds` (`flow serve --workers 2`, or `how`)."""
    p = subprocess.Popen(
        _flow(tree, "-w", ws, *(how or ("serve", "--workers", "2"))),
        env=_env(tree),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(seconds)
    p.send_signal(signal.SIGTERM)
    _, _, ru = os.wait4(p.pid, 0)
    return ru.ru_utime + ru.ru_stime


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--pool-b")
    ap.add_argument("--pool-b-new", help="the new tree's pool-B workspace (default: --pool-b)")
    ap.add_argument("--finished")
    ap.add_argument("--status", nargs="*", default=[])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--idle-seconds", type=float, default=20.0)
    ap.add_argument("--as-if", type=int, default=0, help="grow --finished as N jobs leave it")
    a = ap.parse_args()
    trees = {"base": a.base, "new": a.new}
    if a.pool_b:
        pool_b = {"base": a.pool_b, "new": a.pool_b_new or a.pool_b}
        ratios: dict[str, list[float]] = {k: [] for k in trees}
        for rep in range(a.reps):
            for name, tree in trees.items():
                empty = os.path.join(tempfile.mkdtemp(dir=a.tmp), "ws")
                _run(tree, "init", empty)
                e = pool_once(tree, empty, a.jobs)
                b = pool_once(tree, pool_b[name], a.jobs)
                ratios[name].append(b / e)
                print(
                    f"pool rep {rep} {name}: empty {e:.2f}s beside {b:.2f}s "
                    f"ratio {b / e:.2f} (load {load()})",
                    flush=True,
                )
        for name, r in ratios.items():
            print(f"pool {name}: median ratio beside/empty {statistics.median(r):.2f}")
        # a `flow run` of pool A waiting for work beside the backlog: its idle check looks
        # at the ready jobs every tick
        beside: dict[str, list[float]] = {k: [] for k in trees}
        how = ("run", "--pool", "A", "--workers", "2", "--idle", "3600")
        for rep in range(a.reps):
            for name, tree in trees.items():
                c = idle_once(tree, pool_b[name], a.idle_seconds, *how)
                beside[name].append(c)
                print(
                    f"idle beside rep {rep} {name}: {c:.2f}s CPU in {a.idle_seconds:g}s "
                    f"(load {load()})",
                    flush=True,
                )
        for name, c in beside.items():
            print(
                f"idle beside {name}: median {statistics.median(c):.2f}s CPU per "
                f"{a.idle_seconds:g}s"
            )
    if a.finished:
        if a.as_if:
            grow_as_if(a.finished, a.as_if)
        sizes = emptied_dirs(a.finished)
        print(
            f"idle: {len(sizes)} emptied directories, {sum(sizes.values()) // 1024} KiB", flush=True
        )
        cpu: dict[str, list[float]] = {k: [] for k in trees}
        for rep in range(a.reps):
            for name, tree in trees.items():
                regrow(a.finished, sizes)
                c = idle_once(tree, a.finished, a.idle_seconds)
                cpu[name].append(c)
                print(
                    f"idle rep {rep} {name}: {c:.2f}s CPU in {a.idle_seconds:g}s (load {load()})",
                    flush=True,
                )
        for name, c in cpu.items():
            print(f"idle {name}: median {statistics.median(c):.2f}s CPU per {a.idle_seconds:g}s")
    for ws in a.status:
        walls: dict[str, list[float]] = {k: [] for k in trees}
        for rep in range(a.reps):
            for name, tree in trees.items():
                w, _ = _timed(_flow(tree, "-w", ws, "status"), _env(tree))
                walls[name].append(w)
                print(
                    f"status {os.path.basename(ws)} rep {rep} {name}: {w:.2f}s (load {load()})",
                    flush=True,
                )
        for name, w in walls.items():
            print(f"status {os.path.basename(ws)} {name}: median {statistics.median(w):.2f}s")


if __name__ == "__main__":
    main()
