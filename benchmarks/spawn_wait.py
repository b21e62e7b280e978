"""What paces a manager: its own CPU a job, and its wait inside posix_spawn.

    python benchmarks/spawn_wait.py [--jobs 3000] [--workers 2 3] [--reps 2] [--program api]

Each repetition submits N no-op jobs (bash-API jobs, or `/bin/true` with --program true)
to a fresh workspace under $TMPDIR and runs `flow run --workers W --idle 0` in a Python
of its own whose `os.posix_spawn` (as the launcher calls it) is wrapped with a clock. At
exit it reports the rate, the manager's CPU a job (getrusage of itself), the CPU of
everything it reaped a job, and the mean time each posix_spawn call took to return.

(The manager's CPU includes what it spends before its first job, about 0.05 ms a job at
3,000.) From these: the manager's cycle (its CPU plus the wait, a job) bounds the rate at
1/cycle, as a single thread that waits in each spawn; the CPUs bound it at
ncpu/(manager + jobs). Whichever is lower is what the run can do (docs/benchmarks.md,
"What paces a manager"). The workers are alternated within each repetition, so that a
shared machine's load falls on all of them alike.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from programs import FLOW_API1
from scripts import RUSAGE_SCRIPT

#: put before RUSAGE_SCRIPT (same argv: OUT.json, then flow's): times each os.posix_spawn
#: as the launcher calls it, and at exit writes the mean and the wall time to OUT.json.spawn
SPAWN_TIMER = """
import atexit, json, os, sys, time
import httk_flow.manager.launcher as launcher
_spawn, _took, _t0, _out = os.posix_spawn, [0.0, 0], time.perf_counter(), sys.argv[1] + ".spawn"
def _timed(*args, **kw):
    t = time.perf_counter()
    try:
        return _spawn(*args, **kw)
    finally:
        _took[0] += time.perf_counter() - t
        _took[1] += 1
launcher.os.posix_spawn = _timed
def _dump_spawns():
    with open(_out, "w") as fh:
        json.dump({"wall": time.perf_counter() - _t0, "spawns": _took[1],
                   "spawn_s": _took[0]}, fh)
atexit.register(_dump_spawns)
"""


def one(tmp: str, program: str, n: int, workers: int) -> dict[str, float]:
    ws = os.path.join(tmp, "ws")
    shutil.rmtree(ws, ignore_errors=True)
    subprocess.run(["flow", "init", ws], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(
        ["flow", "-w", ws, "submit", "--array", f"1-{n}", program],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    out = os.path.join(tmp, "out.json")
    argv = ["-w", ws, "run", "--workers", str(workers), "--idle", "0", "--quiet"]
    script = SPAWN_TIMER + RUSAGE_SCRIPT
    run = [sys.executable, "-c", script, out, *argv]
    subprocess.run(run, check=True, stderr=subprocess.DEVNULL)
    with open(out) as fh:
        usage = json.load(fh)
    with open(out + ".spawn") as fh:
        spawns = json.load(fh)
    return {
        "rate": n / spawns["wall"],
        "manager_ms": usage["self_cpu"] / n * 1e3,
        "jobs_ms": usage["children_cpu"] / n * 1e3,
        "spawn_ms": spawns["spawn_s"] / max(1, spawns["spawns"]) * 1e3,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=3000)
    ap.add_argument("--workers", type=int, nargs="+", default=[2, 3])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--program", choices=["api", "true"], default="api")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="spawn-wait-")
    try:
        program = "/bin/true"
        if args.program == "api":
            program = os.path.join(tmp, "noop.sh")
            with open(program, "w") as fh:
                fh.write(FLOW_API1)
            os.chmod(program, 0o755)
        runs: dict[int, list[dict[str, float]]] = {w: [] for w in args.workers}
        for _ in range(args.reps):
            for w in args.workers:
                runs[w].append(one(tmp, program, args.jobs, w))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    cpus = len(os.sched_getaffinity(0))
    print(f"{args.jobs} {args.program} jobs, {cpus} CPUs, medians of {args.reps}")
    head = "workers  jobs/s  manager ms/job  spawn wait ms  jobs ms/job  cycle bound/s  CPU bound/s"
    print(head)
    for w, rs in runs.items():
        m = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        cycle = 1e3 / (m["manager_ms"] + m["spawn_ms"])
        cpu = cpus * 1e3 / (m["manager_ms"] + m["jobs_ms"])
        print(
            f"{w:>7}  {m['rate']:>6.0f}  {m['manager_ms']:>14.3f}  {m['spawn_ms']:>13.3f}"
            f"  {m['jobs_ms']:>11.3f}  {cycle:>13.0f}  {cpu:>11.0f}"
        )


if __name__ == "__main__":
    main()
