"""What one verified transition costs the process that makes it, alone.

    python benchmarks/transition_cost.py [--jobs 3000] [--reps 3]

Each repetition submits N `/bin/true` jobs to a fresh workspace under $TMPDIR, registers
them with a manager of a pool no job asks for (`flow run --pool none --idle 0`), then, in
this process, moves every ready job to claimed and back with `transition()`, the call each
state change of the manager makes (frame appended to the journal, marker renamed, the
outcome resolved). It reports the CPU and wall time per transition, each direction apart.

A manager's job makes four of them (registration, claim, running, commit), so this tells
how much of its CPU per job (docs/benchmarks.md) a protocol with one transition fewer
would save, before building it.
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

from httk_flow.protocol.jobs import all_jobs
from httk_flow.protocol.states import State
from httk_flow.protocol.transition import transition
from httk_flow.protocol.workspace import Workspace


def _flow(*args: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "httk_flow", *args],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def once(root: str, jobs: int) -> tuple[float, float, float, float]:
    """(CPU, wall) in microseconds per transition: ready -> claimed, claimed -> ready."""
    _flow("init", root)
    _flow("-w", root, "submit", "--array", f"1-{jobs}", "/bin/true")
    _flow("-w", root, "run", "--pool", "none", "--idle", "0", "--quiet")
    ws = Workspace.open(root)
    try:
        handles = list(all_jobs(ws, (State.READY,)))
        if len(handles) != jobs:
            raise SystemExit(f"{len(handles)} ready jobs, not {jobs}")
        frames = [ws.reader.frame(h.marker.ref) for h in handles]
        c0, t0 = time.process_time(), time.perf_counter()
        claimed = [
            transition(ws, h, State.CLAIMED, f.body, actor="bench")
            for h, f in zip(handles, frames, strict=True)
        ]
        c1, t1 = time.process_time(), time.perf_counter()
        for h, f in zip(claimed, frames, strict=True):
            transition(ws, h, State.READY, f.body, actor="bench")
        c2, t2 = time.process_time(), time.perf_counter()
    finally:
        ws.close()
    us = 1e6 / jobs
    return (c1 - c0) * us, (t1 - t0) * us, (c2 - c1) * us, (t2 - t1) * us


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=3000)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    rows = []
    for _ in range(a.reps):
        tmp = tempfile.mkdtemp(prefix="transition-cost-")
        try:
            rows.append(once(os.path.join(tmp, "ws"), a.jobs))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    cols = list(zip(*rows, strict=True))
    med = [statistics.median(c) for c in cols]
    print(
        f"{a.jobs} jobs, {a.reps} repetitions, medians per transition: "
        f"ready -> claimed {med[0]:.1f} us CPU ({med[1]:.1f} us wall); "
        f"claimed -> ready {med[2]:.1f} us CPU ({med[3]:.1f} us wall)"
    )


if __name__ == "__main__":
    main()
