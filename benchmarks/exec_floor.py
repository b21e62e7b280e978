"""Issue #18: what one process start costs on this machine, and what the gated launcher adds.

    python benchmarks/exec_floor.py [--n 1000] [--rounds 3] [--manager-ms 0.8]

Each case is started --n times from this Python process with os.posix_spawn (as a manager
starts an attempt) and waited for; the CPU of the children (getrusage) per start is the
figure, wall time beside it. Rounds interleave the cases, so a shared machine's load falls
on all of them alike; the median round is reported.

- `xargs -P2 sh -c true`: the floor itself (`seq N | xargs -P2 -n1 sh -c true`), per job,
  xargs's own CPU included;
- `sh -c true`: its unit (one exec, a builtin);
- `bash -c true`: the unit of the `xargs -P2 bash -c true` floor;
- `/bin/true`: the program alone, one exec;
- launcher: the manager's gated launcher (httk_flow.manager.launcher) running `/bin/true`,
  its gate already open: the launcher's exec of /bin/sh, then the program's own exec.

From these it prints the bound the job side sets on the `/bin/true` throughput target
(>= 0.5x `xargs -P2 sh -c true` on two cores): with the manager's CPU per job (--manager-ms,
measured by benchmarks/ab_hot_path.py) the best ratio two busy cores allow is
xargs's CPU per job / (launcher + manager), both cores busy all the time.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from httk_flow.manager import launcher  # noqa: E402  (the tree this script lies in)

#: the floor itself: one command that starts n jobs (its {n}), xargs's own CPU included
XARGS = "xargs -P2 sh -c true"
XARGS_CMD = "seq {n} | xargs -P2 -n1 sh -c true"


def _cases(tmp: str) -> dict[str, list[str]]:
    script = launcher._SCRIPT.replace("read -r _ ||", ": ||")  # the gate, already open
    out, err, fail = (os.path.join(tmp, n) for n in ("out", "err", "fail"))
    return {
        XARGS: ["/bin/sh", "-c", XARGS_CMD],
        "sh -c true": ["/bin/sh", "-c", "true"],
        "bash -c true": ["/bin/bash", "-c", "true"],
        "/bin/true": ["/bin/true"],
        "launcher + /bin/true": [
            *("/bin/sh", "-c", script, "flow-attempt", out, err, "", tmp, fail),
            "/bin/true",
        ],
    }


def _measure(argv: list[str], n: int) -> tuple[float, float]:
    """(children's CPU ms per job, wall ms per job): argv started n times, or once when it
    starts the n jobs itself (XARGS_CMD)."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    once = argv[-1] == XARGS_CMD
    runs = [[*argv[:-1], XARGS_CMD.format(n=n)]] if once else [argv] * n
    for a in runs:
        os.waitpid(os.posix_spawn(a[0], a, os.environ), 0)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
    return 1000 * cpu / n, 1000 * wall / n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000, help="starts per case and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--manager-ms", type=float, default=None, help="manager CPU per job")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="exec-floor-")
    try:
        cases = _cases(tmp)
        got: dict[str, list[tuple[float, float]]] = {k: [] for k in cases}
        for argv in cases.values():
            _measure(argv, max(1, a.n // 10))  # warm the page cache
        for _ in range(a.rounds):
            for name, argv in cases.items():
                got[name].append(_measure(argv, a.n))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    load = os.getloadavg()[0]
    print(f"{a.n} starts per case, {a.rounds} rounds, load {load:.2f}; median round:")
    med = {k: statistics.median(c for c, _ in v) for k, v in got.items()}
    for name, v in got.items():
        wall = statistics.median(w for _, w in v)
        print(f"  {name:24s} CPU {med[name]:.3f} ms   wall {wall:.3f} ms")
    floor, gated = med[XARGS], med["launcher + /bin/true"]
    print(f"launcher + /bin/true over {XARGS} per job: {gated / floor:.2f}x the CPU")
    if a.manager_ms is not None:
        best = floor / (gated + a.manager_ms)
        print(
            f"with a manager of {a.manager_ms:.2f} ms per job, two busy cores allow at most "
            f"{best:.2f}x `xargs -P2 sh -c true` on /bin/true jobs"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
