"""Bulk submission under two source trees, interleaved in one run.

    python benchmarks/ab_submit.py --base OLD_TREE --new NEW_TREE \\
        [--fast DIR] [--disk DIR] [--reps 5] [--sizes 10000,100000]

Each repetition submits `flow submit --array 1-N /bin/true` into a fresh workspace under
each tree, in turn: non-durable under `--fast` (a tmpfs such as /dev/shm measures what the
engine costs) for every size, and durable (`flow init --durable`) under `--disk` for the
first size. Reported per side: the median rate of the whole command (interpreter start
included, as a user sees it), its user and system CPU, and the median of the per-repetition
ratios new / base, so that a shared machine's load cancels out (docs/benchmarks.md). A
disk's own writeback varies from run to run by several times: read its rows as ranges.

Both trees are byte-compiled first (an installation is; an uncompiled tree under
PYTHONDONTWRITEBYTECODE would compile its modules at every start).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

Point = tuple[float, float, float]  # jobs/s, user CPU s, system CPU s


def _flow(tree: str) -> tuple[list[str], dict[str, str]]:
    # -P: the current directory never shadows the tree on PYTHONPATH
    env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
    return [sys.executable, "-P", "-m", "httk_flow"], env


def submit_side(tree: str, where: str, n: int, durable: bool) -> Point:
    flow, env = _flow(tree)
    d = tempfile.mkdtemp(dir=where)
    try:
        ws = os.path.join(d, "ws")
        init = [*flow, "init", ws, *(["--durable"] if durable else [])]
        subprocess.run(init, env=env, check=True, stdout=subprocess.DEVNULL)
        os.sync()  # the init's writes are not this side's to pay
        t0 = time.perf_counter()
        argv = [*flow, "-w", ws, "submit", "--array", f"1-{n}", "/bin/true"]
        pid = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL).pid
        _, status, ru = os.wait4(pid, 0)
        wall = time.perf_counter() - t0
        if status != 0:
            raise SystemExit(f"failed: {' '.join(argv)}")
        return n / wall, ru.ru_utime, ru.ru_stime
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--base", required=True, help="the baseline source tree")
    ap.add_argument("--new", required=True, help="the source tree measured against it")
    ap.add_argument("--fast", default="/dev/shm", help="where non-durable workspaces go")
    ap.add_argument("--disk", default=tempfile.gettempdir(), help="where durable ones go")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--sizes", default="10000,100000")
    a = ap.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    for tree in (a.base, a.new):
        subprocess.run([sys.executable, "-m", "compileall", "-q", tree], check=True)
    sides = [(f"non-durable {n:,}", a.fast, n, False) for n in sizes]
    sides.append((f"durable {sizes[0]:,} (disk)", a.disk, sizes[0], True))
    got: dict[tuple[str, str], list[Point]] = {}
    print(f"load average before: {os.getloadavg()[0]:.2f}", flush=True)
    for rep in range(a.reps):
        for label, where, n, durable in sides:
            for name, tree in (("base", a.base), ("new", a.new)):
                p = submit_side(tree, where, n, durable)
                got.setdefault((label, name), []).append(p)
                print(f"rep {rep + 1} {label} {name}: {p[0]:,.0f} jobs/s", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}\n")
    head = ("side", "base jobs/s", "new jobs/s", "new/base", "new CPU u+s")
    print(f"{head[0]:<28} {head[1]:>12} {head[2]:>11} {head[3]:>9} {head[4]:>12}")
    for label, *_ in sides:
        base, new = got[(label, "base")], got[(label, "new")]
        ratio = statistics.median(nw[0] / bs[0] for nw, bs in zip(new, base, strict=True))
        rate_b = statistics.median(p[0] for p in base)
        rate_n = statistics.median(p[0] for p in new)
        cpu = statistics.median(p[1] + p[2] for p in new)
        lo, hi = min(p[0] for p in new), max(p[0] for p in new)
        print(
            f"{label:<28} {rate_b:>12,.0f} {rate_n:>11,.0f} {ratio:>8.2f}x {cpu:>11.2f}s"
            f"   (new {lo:,.0f} - {hi:,.0f})"
        )


if __name__ == "__main__":
    main()
