"""`flow demo`: a small campaign (multi-step jobs and a fan-out with a join), run locally."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from httk_flow.errors import UsageError
from httk_flow.ops.status import StatusReport, workspace_status
from httk_flow.protocol.submit import SubmitRequest, Submitter
from httk_flow.protocol.workspace import Workspace

RELAX = r"""#!/usr/bin/env bash
# A three-step job: prepare an input, "compute" on it, collect the result.
source "$FLOW_BASH_API"
flow_steps prepare compute collect
step_prepare() {
    echo "structure $(flow_param structure) scale $(flow_param scale)" > input.txt
    flow_advance compute "input written"
}
step_compute() {
    local s; s=$(flow_param scale)
    sleep 0.5  # the "simulation"
    echo "energy $(( s * s - 7 * s ))" > output.txt
    flow_advance collect
}
step_collect() {
    read -r _ energy < output.txt
    echo "$(flow_param structure),$(flow_param scale),$energy" > "$FLOW_JOB_DIR/result.csv"
    flow_succeed "energy $energy"
}
flow_main "$@"
"""

CAMPAIGN = r"""#!/usr/bin/env bash
# A fan-out: spawn one child per point, wait for all of them, aggregate their results.
source "$FLOW_BASH_API"
flow_steps spawn point aggregate
step_spawn() {
    local i
    for i in $(seq 1 "$(flow_param points 20)"); do
        flow_spawn --label "p$i" --step point --param x="$i"
    done
    flow_wait aggregate --all-succeeded
}
step_point() {
    local x; x=$(flow_param x)
    echo "$x,$(( x * x ))" > "$FLOW_JOB_DIR/point.csv"
    flow_succeed "x=$x"
}
step_aggregate() {
    local label id state path
    echo "x,x_squared" > "$FLOW_JOB_DIR/results.csv"
    while read -r label id state path; do
        cat "$path/point.csv" >> "$FLOW_JOB_DIR/results.csv"
    done < <(flow_children)
    flow_succeed "aggregated $(( $(wc -l < "$FLOW_JOB_DIR/results.csv") - 1 )) points"
}
flow_main "$@"
"""


@dataclass(frozen=True)
class DemoResult:
    workspace: str
    report: StatusReport
    campaign_results: str
    relax_results: list[str]
    exit_code: int
    #: where the demo's manager wrote its lines (its summary, any problem)
    manager_log: str = ""


#: in the demo workspace: the log of the manager the demo ran
MANAGER_LOG = "demo-manager.log"
#: the placement directory of the demo's fan-out job: its presence means the demo was built
CAMPAIGN_PLACEMENT = "demo/campaign"


class DemoExists(UsageError):
    """PATH already holds the demo campaign: a second one would make `campaign` ambiguous."""


def check(path: str) -> None:
    """Refuse a PATH that already holds the demo campaign (from an earlier `flow demo`)."""
    placed = os.path.join(os.path.abspath(path), CAMPAIGN_PLACEMENT)
    try:
        with os.scandir(placed) as entries:
            built = next(entries, None) is not None
    except (FileNotFoundError, NotADirectoryError):
        built = False
    if built:
        raise DemoExists(
            f"{path} already holds the demo campaign",
            hint="remove it or give another directory",
        )


def build(path: str) -> tuple[Workspace, str, list[str]]:
    """Create the workspace, write the two programs and submit the campaign."""
    check(path)
    ws = Workspace.create(path, exist_ok=True)
    progs = os.path.join(ws.root, "programs")
    os.makedirs(progs, exist_ok=True)
    files = {}
    for name, text in (("relax.sh", RELAX), ("campaign.sh", CAMPAIGN)):
        p = os.path.join(progs, name)
        with open(p, "w") as fh:
            fh.write(text)
        os.chmod(p, 0o755)
        files[name] = p
    sub = Submitter(ws, actor="demo")
    relax = [
        SubmitRequest(
            program=files["relax.sh"],
            tag=f"relax-{s}-{k}",
            step="prepare",
            params={"structure": s, "scale": k},
            placement="demo/relax",
        )
        for s in ("Si", "Ge", "GaAs")
        for k in range(1, 5)
    ]
    camp = SubmitRequest(
        program=files["campaign.sh"],
        tag="campaign",
        step="spawn",
        params={"points": 20},
        placement=CAMPAIGN_PLACEMENT,
        priority=600,
    )
    specs = list(sub.submit([camp, *relax]))
    c = specs[0]
    return ws, ws.job_dir(c.placement, c.key), [ws.job_dir(s.placement, s.key) for s in specs[1:]]


def run(
    path: str, *, workers: int = 2, on_tick: Callable[[StatusReport, float], None] | None = None
) -> DemoResult:
    """Build the campaign, run a local manager until idle, and report where results are."""
    ws, camp_dir, relax_dirs = build(path)
    cmd = [
        sys.executable,
        "-m",
        "httk_flow",
        "run",
        "-w",
        ws.root,
        "--workers",
        str(workers),
        "--quiet",
    ]
    t0 = time.monotonic()
    # the manager's own lines (its summary, any problem) go to a file: on the terminal
    # they would land inside the demo's live display
    log_path = os.path.join(ws.root, MANAGER_LOG)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=log)
    try:
        while proc.poll() is None:
            if on_tick:
                on_tick(workspace_status(ws), time.monotonic() - t0)
            time.sleep(0.25)
    except KeyboardInterrupt:
        proc.terminate()
        proc.wait()
        raise
    report = workspace_status(ws)
    if on_tick:
        on_tick(report, time.monotonic() - t0)
    return DemoResult(
        ws.root,
        report,
        os.path.join(camp_dir, "results.csv"),
        [os.path.join(d, "result.csv") for d in relax_dirs],
        proc.returncode,
        log_path,
    )
