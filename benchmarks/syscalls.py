"""Issue #18: the manager's system calls per job, marginal, counted without slowing it.

    python benchmarks/syscalls.py [--tree DIR ...] [--small 1000] [--large 3000]
                                  [--program /bin/true|api] [--reps 2] [--tmp DIR]

For each tree, N jobs are submitted (`flow submit --array 1-N`) and `flow run --workers 2
--quiet` runs them under `perf stat -i -e raw_syscalls:sys_enter`: the kernel counts every
system call of the manager process alone (-i: not of the jobs it starts), at full speed.
Under strace the manager runs several times slower, so what it does per second (scans
that rest between cycles, heartbeats) is counted several times over per job; perf does
not have that bias. The figure quoted is marginal: (calls at --large - calls at --small)
/ (--large - --small), so the interpreter's start and the workspace's first scan are not
spread over the jobs; registration of the submitted jobs is included. `--program api` runs
the standard no-op bash-API program instead of /bin/true.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from programs import FLOW_API1

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def flow(tree: str, *args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": tree}
    cmd = [*prefix, sys.executable, "-P", "-m", "httk_flow", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)


def count(tree: str, tmp: str, n: int, program: str) -> int:
    ws = os.path.join(tmp, f"ws-{n}")
    shutil.rmtree(ws, ignore_errors=True)
    for args in (("init", ws), ("-w", ws, "submit", "--array", f"1-{n}", program)):
        done = flow(tree, *args)
        if done.returncode != 0:
            sys.exit(f"{tree}: flow {' '.join(args)} failed: {done.stderr}")
    perf = ("perf", "stat", "-i", "-x", ",", "-e", "raw_syscalls:sys_enter", "--")
    done = flow(tree, "-w", ws, "run", "--workers", "2", "--quiet", prefix=perf)
    for line in done.stderr.splitlines():
        if "raw_syscalls:sys_enter" in line:
            return int(line.split(",")[0])
    sys.exit(f"{tree}: perf gave no count (exit {done.returncode}): {done.stderr[-1000:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tree", action="append", help="source trees (default: this one)")
    ap.add_argument("--small", type=int, default=1000)
    ap.add_argument("--large", type=int, default=3000)
    ap.add_argument("--program", default="/bin/true", help="a program path, or 'api'")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--tmp", help="directory for the workspaces (tmpfs: /dev/shm)")
    a = ap.parse_args()
    if shutil.which("perf") is None:
        sys.exit("needs perf (Debian: linux-perf)")
    tmp = tempfile.mkdtemp(prefix="syscalls-", dir=a.tmp)
    program = a.program
    if program == "api":
        program = os.path.join(tmp, "api1.sh")
        with open(program, "w") as fh:
            fh.write(FLOW_API1)
        os.chmod(program, 0o755)
    try:
        for tree in a.tree or [REPO]:
            tree = os.path.abspath(tree)
            marginal, small = [], []
            for _ in range(a.reps):
                lo = count(tree, tmp, a.small, program)
                hi = count(tree, tmp, a.large, program)
                marginal.append((hi - lo) / (a.large - a.small))
                small.append(lo / a.small)
            print(
                f"{tree}: {statistics.median(marginal):.1f} system calls per job marginal "
                f"({a.small} -> {a.large} jobs, {a.program}); "
                f"{statistics.median(small):.1f} all-in at {a.small}"
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
