"""Two source trees of httk_flow on the hot path, interleaved in one run, beside xargs.

    python benchmarks/ab_hot_path.py --base OLD_TREE --new NEW_TREE [--jobs 2000] [--reps 3]

Each repetition runs, in this order: `xargs -P2 bash -c true`, bash-API no-op jobs
(`flow_succeed`) under each tree, `xargs -P2 sh -c true`, and `/bin/true` jobs under each
tree; every flow side is `flow submit --array 1-N` then `flow run --workers 2` to idle in a
fresh workspace. Reported per side: the median rate, CPU per job (the whole process tree,
from wait4), the manager's own share of it (its getrusage(RUSAGE_SELF) at exit), and
inodes left per job by the run (after submission), the seconds from the start of `flow
run` to its first attempt's start and the steady rate from then to the last job's end (from
the journal's frames: what a longer run tends to, without the fixed costs of a process
start); and the median of the per-repetition ratios, so that a shared machine's load
cancels out (docs/benchmarks.md).

Both trees are byte-compiled first (compileall), as an installed package is: with
PYTHONDONTWRITEBYTECODE set, an uncompiled tree would compile its modules at every
start, a fixed cost of about 0.1 s of CPU per `flow run` that no installation pays.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

from programs import FLOW_API1 as API  # the standard no-op bash-API program

#: jobs/s, CPU ms/job, manager CPU ms/job, inodes/job, seconds to the first start, and
#: jobs/s from the first start to the last end (the steady rate, without the fixed costs)
Point = tuple[float, float, float, float, float, float]

#: `flow ...` in-process, writing the manager's own CPU seconds (RUSAGE_SELF: not its
#: children) to the file named first
_SELF_CPU = """
import resource, sys
out, sys.argv = sys.argv[1], ["flow", *sys.argv[2:]]
from httk_flow.cli.main import main
try:
    main()
finally:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    with open(out, "w") as fh:
        fh.write(str(ru.ru_utime + ru.ru_stime))
"""


def _timed(argv: list[str], env: dict[str, str], cwd: str | None = None) -> tuple[float, float]:
    t0 = time.perf_counter()
    pid = subprocess.Popen(argv, env=env, cwd=cwd, stderr=subprocess.DEVNULL).pid
    _, status, ru = os.wait4(pid, 0)
    if status != 0:
        raise SystemExit(f"failed: {' '.join(argv)}")
    return time.perf_counter() - t0, ru.ru_utime + ru.ru_stime


def _entries(path: str) -> int:
    return sum(len(ds) + len(fs) for _, ds, fs in os.walk(path))


def _span(ws: str) -> tuple[float, float]:
    """The wall-clock times of the first move to running and the last to succeeded, read
    from the journal's frames (their `t`)."""
    starts, ends = [], []
    for seg in glob.glob(os.path.join(ws, ".flow", "journal", "*", "*.jsonl")):
        with open(seg, "rb") as fh:
            for line in fh:
                frame = json.loads(line)
                if frame.get("to") == "running":
                    starts.append(frame["t"])
                elif frame.get("to") == "succeeded":
                    ends.append(frame["t"])
    return min(starts), max(ends)


def flow_side(tree: str, program: str, n: int, tmp: str) -> Point:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
    # -P: not the current directory first on sys.path, which would shadow PYTHONPATH's tree
    # when run from inside a source tree
    flow = [sys.executable, "-P", "-m", "httk_flow"]
    d = tempfile.mkdtemp(dir=tmp)
    ws = os.path.join(d, "ws")
    subprocess.run([*flow, "init", ws], env=env, cwd=d, check=True, stdout=subprocess.DEVNULL)
    if program == "api":
        program = os.path.join(d, "api.sh")
        with open(program, "w") as fh:
            fh.write(API)
        os.chmod(program, 0o755)
    submit = [*flow, "-w", ws, "submit", "--array", f"1-{n}", program]
    subprocess.run(submit, env=env, cwd=d, check=True, stdout=subprocess.DEVNULL)
    before = _entries(ws)
    own = os.path.join(d, "manager-cpu")
    run = [sys.executable, "-P", "-c", _SELF_CPU, own, "-w", ws, "run", "--workers", "2"]
    began = time.time()
    secs, cpu = _timed([*run, "--quiet"], env, cwd=d)
    first, last = _span(ws)
    with open(own) as fh:
        manager = float(fh.read())
    left = _entries(ws) - before
    shutil.rmtree(d)
    return (
        n / secs,
        cpu / n * 1000,
        manager / n * 1000,
        left / n,
        first - began,
        (n - 1) / (last - first),
    )


def xargs_side(shell: str, n: int) -> Point:
    secs, cpu = _timed(["sh", "-c", f"seq {n} | xargs -P2 -n1 {shell} -c true"], dict(os.environ))
    return n / secs, cpu / n * 1000, 0.0, 0.0, 0.0, n / secs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--base", required=True, help="source tree of the baseline")
    ap.add_argument("--new", required=True, help="source tree of the change")
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    n = args.jobs
    for tree in (args.base, args.new):
        subprocess.run(
            [sys.executable, "-m", "compileall", "-q", os.path.join(tree, "httk_flow")], check=True
        )
    tmp = tempfile.mkdtemp(prefix="flow-ab-")
    sides: list[tuple[str, Callable[[], Point]]] = [
        ("xargs -P2 bash -c true", lambda: xargs_side("bash", n)),
        ("base: bash-API jobs", lambda: flow_side(args.base, "api", n, tmp)),
        ("new: bash-API jobs", lambda: flow_side(args.new, "api", n, tmp)),
        ("xargs -P2 sh -c true", lambda: xargs_side("sh", n)),
        ("base: /bin/true jobs", lambda: flow_side(args.base, "/bin/true", n, tmp)),
        ("new: /bin/true jobs", lambda: flow_side(args.new, "/bin/true", n, tmp)),
    ]
    got: dict[str, list[Point]] = {}
    loads = []
    try:
        for _ in range(args.reps):
            loads.append(os.getloadavg()[0])
            for name, side in sides:
                got.setdefault(name, []).append(side())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    loads.append(os.getloadavg()[0])
    print(
        f"{'side':26s} {'jobs/s':>8s} {'CPU ms/job':>11s} {'manager':>8s} {'jobs':>6s}"
        f" {'inodes/job':>11s} {'start s':>8s} {'steady/s':>9s}"
    )
    for name, pts in got.items():
        rate, cpu, manager, inodes, start, steady = (
            statistics.median(p[i] for p in pts) for i in range(6)
        )
        print(
            f"{name:26s} {rate:8.0f} {cpu:11.2f} {manager:8.2f} {cpu - manager:6.2f}"
            f" {inodes:11.2f} {start:8.3f} {steady:9.0f}"
        )
    pairs = [
        ("base: bash-API jobs", "xargs -P2 bash -c true"),
        ("new: bash-API jobs", "xargs -P2 bash -c true"),
        ("new: bash-API jobs", "base: bash-API jobs"),
        ("base: /bin/true jobs", "xargs -P2 sh -c true"),
        ("new: /bin/true jobs", "xargs -P2 sh -c true"),
        ("new: /bin/true jobs", "base: /bin/true jobs"),
    ]
    for a, b in pairs:
        r = statistics.median(x[0] / y[0] for x, y in zip(got[a], got[b], strict=True))
        steady = statistics.median(x[5] / y[5] for x, y in zip(got[a], got[b], strict=True))
        print(f"{a} / {b}: {r:.2f}x (steady rates: {steady:.2f}x)")
    print(f"load average: {' '.join(f'{x:.2f}' for x in loads)}")


if __name__ == "__main__":
    main()
