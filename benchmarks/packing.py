"""The claim pass with resource requests beside the same pass without them (#15).

Registered in harness.BENCHMARKS as `packing`. For each backlog N, two workspaces hold N
ready no-op jobs: one of plain jobs (the default request, 1 CPU), one of jobs asking for
2 CPUs and 1G each (a service class of their own). A manager built in-process, with an
inventory large enough for every claim, claims K jobs from each, interleaved; the row is
the cost per claim with requests, the baseline the same without, in the same repetition.
Flat in N: the cost at the largest backlog over the cost at the smallest.
"""

from __future__ import annotations

from harness import Bench, BenchError, Row, benchmark, median
from scripts import REGISTER_SCRIPT

#: claims per measurement: each repetition takes K more jobs of the backlog
CLAIMS = 2000

#: argv: workspace, claims. Prints the seconds K claims took (the pass only: no launch)
CLAIM_SCRIPT = r"""
import sys, time
from httk_flow.manager.config import ManagerConfig
from httk_flow.manager.inventory import Inventory
from httk_flow.manager.loop import Manager
from httk_flow.protocol.workspace import Workspace

ws = Workspace.open(sys.argv[1])
k = int(sys.argv[2])
cpus = 2 * k + 16
inv = Inventory(cpus=cpus, cpu_ids=tuple(range(cpus)), mem=1 << 50)
m = Manager(ws, ManagerConfig(workers=cpus, inventory=inv))
got = 0
t0 = time.perf_counter()
while got < k:
    took = m.claim.take(k - got, 2000)
    if not took:
        sys.exit("ran out of ready jobs")
    got += len(took)
print(time.perf_counter() - t0)
"""


def _ready(b: Bench, n: int, label: str, flags: list[str]) -> str:
    ws = b.init(f"packing-{label}-{n}")
    b.sh([b.flow, "-w", ws, "submit", *flags, "--array", f"1-{n}", "true"])
    got = int(b.sh([b.python, "-c", REGISTER_SCRIPT, ws], capture=True))
    if got != n:
        raise BenchError(f"registered {got} of {n} jobs in {ws}")
    return ws


@benchmark("packing")
def bench_packing(b: Bench) -> list[Row]:
    """Claim-pass cost per ready job with resource requests vs without."""
    rows: list[Row] = []
    per: dict[int, float] = {}
    for n in b.profile.backlogs:
        plain = _ready(b, n, "plain", [])
        shaped = _ready(b, n, "shaped", ["--cpus", "2", "--mem", "1G"])

        def once(plain: str = plain, shaped: str = shaped) -> tuple[float, float]:
            base = float(b.sh([b.python, "-c", CLAIM_SCRIPT, plain, str(CLAIMS)], capture=True))
            got = float(b.sh([b.python, "-c", CLAIM_SCRIPT, shaped, str(CLAIMS)], capture=True))
            return got / CLAIMS, base / CLAIMS

        runs = b.repeat(f"packing n={n}", once)
        value = median([r[0] for r in runs])
        base = median([r[1] for r in runs])
        per[n] = value
        ratio = value / base
        rows.append(
            Row(
                "claim pass, per claim, with requests",
                n,
                value * 1e3,
                "ms",
                better="lower",
                baseline=base * 1e3,
                baseline_name="the same pass, jobs without requests",
                target="within 10 % of the baseline",
                ok=ratio <= 1.10,
                samples=[r[0] * 1e3 for r in runs],
                baseline_samples=[r[1] * 1e3 for r in runs],
                command=f"{CLAIMS} claims from {n} ready jobs (--cpus 2 --mem 1G vs none), "
                "one manager in-process",
            )
        )
        b.discard(plain)
        b.discard(shaped)
    if len(per) > 1:
        lo, hi = min(per), max(per)
        growth = per[hi] / per[lo]
        rows.append(
            Row(
                f"  growth: per-claim cost at {hi} over {lo}",
                hi,
                growth,
                "x",
                better="lower",
                target="flat (<= 1.10)",
                ok=growth <= 1.10,
                command="the rows above",
            )
        )
    return rows
