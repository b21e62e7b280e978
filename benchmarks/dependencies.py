"""Dependency release beside a backlog of waiting dependents (#17).

Registered in harness.BENCHMARKS as `dependencies`. Two workspaces: one where N jobs
wait (`--after`) for a job that never ends, one where 1,000 do. In each, K pairs of a
job and one dependent (`--after-policy any`) are made and registered; the timed part
ends each pair's first job (ready -> cancelled, in-process) which counts the end and
releases the dependent to ready. The row is the cost per finished job with N waiting,
the baseline the same with 1,000 waiting, in the same repetition: flat means the release
does not scan the waiting jobs.
"""

from __future__ import annotations

from harness import Bench, BenchError, Row, benchmark, median

#: pairs ended per measurement
PAIRS = 500
#: the waiting backlog of the baseline
SMALL = 1_000

#: argv: workspace, n. N jobs waiting for one job that is never run; prints N registered
SETUP_SCRIPT = r"""
import dataclasses, sys
from httk_flow.ops.depend import prepare
from httk_flow.protocol.after import AfterPolicy
from httk_flow.protocol.discovery import walk_all
from httk_flow.protocol.jobs import register
from httk_flow.protocol.states import State
from httk_flow.protocol.submit import SubmitRequest, Submitter
from httk_flow.protocol.workspace import Workspace

ws = Workspace.open(sys.argv[1])
n = int(sys.argv[2])
sub = Submitter(ws, actor="bench")
[blocker] = sub.submit([SubmitRequest(program="true", tag="blocker")])
deps = prepare(ws, [blocker.key], AfterPolicy.OK, actor="bench").after
base = SubmitRequest(program="true", after=deps)
for _ in sub.submit(dataclasses.replace(base, array_index=i) for i in range(n)):
    pass
got = 0
for h in list(walk_all(ws, State.SUBMITTED)):
    if h.marker.tag != "blocker":
        got += register(ws, h, actor="bench").state is State.WAITING
print(got)
"""

#: argv: workspace, pairs. Prints the seconds the pairs' ends took, releases included
MEASURE_SCRIPT = r"""
import sys, time
from httk_flow.ops.depend import prepare
from httk_flow.protocol.after import AfterPolicy
from httk_flow.protocol.frames import Body
from httk_flow.protocol.jobs import register
from httk_flow.protocol.states import State
from httk_flow.protocol.submit import SubmitRequest, Submitter
from httk_flow.protocol.transition import transition
from httk_flow.protocol.workspace import Workspace

ws = Workspace.open(sys.argv[1])
k = int(sys.argv[2])
sub = Submitter(ws, actor="bench")
firsts = []
for _ in range(k):
    [x] = sub.submit([SubmitRequest(program="true")])
    deps = prepare(ws, [x.key], AfterPolicy.ANY, actor="bench").after
    [y] = sub.submit([SubmitRequest(program="true", after=deps)])
    firsts.append((x, y))
from httk_flow.ops.lookup import find
ready = []
for x, y in firsts:
    ready.append(register(ws, find(ws, x.key), actor="bench"))
    assert register(ws, find(ws, y.key), actor="bench").state is State.WAITING
t0 = time.perf_counter()
for h in ready:
    transition(ws, h, State.CANCELLED, Body(), actor="bench")
elapsed = time.perf_counter() - t0
for _, y in firsts:
    assert find(ws, y.key).state is State.READY, y.key
print(elapsed)
"""


def _waiting(b: Bench, n: int) -> str:
    ws = b.init(f"dependencies-{n}")
    got = int(b.sh([b.python, "-c", SETUP_SCRIPT, ws, str(n)], capture=True))
    if got != n:
        raise BenchError(f"{got} of {n} dependents are waiting in {ws}")
    return ws


@benchmark("dependencies")
def bench_dependencies(b: Bench) -> list[Row]:
    """Cost per finished job of counting its end and releasing its dependent, beside N
    waiting dependents of another job, vs beside 1,000."""
    rows: list[Row] = []
    small = _waiting(b, SMALL)
    for n in b.profile.backlogs:
        big = _waiting(b, n)

        def once(big: str = big) -> tuple[float, float]:
            got = float(b.sh([b.python, "-c", MEASURE_SCRIPT, big, str(PAIRS)], capture=True))
            base = float(b.sh([b.python, "-c", MEASURE_SCRIPT, small, str(PAIRS)], capture=True))
            return got / PAIRS, base / PAIRS

        runs = b.repeat(f"dependencies n={n}", once)
        value = median([r[0] for r in runs])
        base = median([r[1] for r in runs])
        ratio = value / base
        rows.append(
            Row(
                "end of a job and release of its dependent, per job",
                n,
                value * 1e3,
                "ms",
                better="lower",
                baseline=base * 1e3,
                baseline_name=f"the same beside {SMALL:,} waiting",
                target="flat: within 10 % of the baseline",
                ok=ratio <= 1.10,
                samples=[r[0] * 1e3 for r in runs],
                baseline_samples=[r[1] * 1e3 for r in runs],
                command=f"{PAIRS} pairs (a job, one dependent --after-policy any) beside {n} "
                "jobs waiting --after a job that never runs, in-process",
            )
        )
        b.discard(big)
    b.discard(small)
    return rows
