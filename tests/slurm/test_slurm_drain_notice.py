"""The line Slurm writes into a manager allocation's output when it drains it, and the
manager's own line beside it, against a real Slurm: `scancel -b -s TERM` (what
`flow scale` sends; the `--signal` drain before the walltime prints the same) makes
slurmstepd write `*** JOB N ON node CANCELLED AT ... ***`, though the job then ends
COMPLETED; the manager's log says, next to it, that this was its drain."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import wait_for
from manager.support import dump, flow, job, submit, write_script

from httk_flow.protocol.states import State

from .support import Cluster

pytestmark = pytest.mark.slurm

#: the job sleeps until the drain stops it
SLEEPER = 'touch "$FLOW_WORKDIR/started"\nsleep 300\n'


def test_the_cancelled_line_of_a_drain_has_the_managers_explanation_beside_it(
    root: str, scripts: Path, cluster: Cluster
) -> None:
    [jid] = submit(root, write_script(scripts, "sleeper.sh", SLEEPER))
    p = flow("sbatch", "-w", root, "--time", "10m", "--", "--kill-grace", "2s")
    assert p.returncode == 0, p.stderr
    job_id = p.stdout.strip()
    [token] = [j.name.removeprefix("flow-") for j in cluster.since(int(job_id))]
    wait_for(lambda: (job(root, jid).job_dir(root) / "run" / "started").exists(), 60, 0.2)

    cluster.signal_drain(job_id)
    assert cluster.wait_ended(job_id, 60) == "COMPLETED"
    out = Path(root) / ".flow" / "allocations" / "logs" / f"flow-{token}-{job_id}.out"
    lines = out.read_text(errors="replace").splitlines()
    [cancelled] = [
        i
        for i, line in enumerate(lines)
        if re.fullmatch(
            rf"slurmstepd\S*: error: \*\*\* JOB {job_id} ON \S+ CANCELLED AT \S+ \*\*\*", line
        )
    ]
    [note] = [i for i, line in enumerate(lines) if " drain: SIGTERM in " in line]
    assert cancelled < note <= cancelled + 3, "\n".join(lines)
    assert lines[note].split(" ", 2)[2] == (
        f"drain: SIGTERM in Slurm job {job_id}, the batch system's drain (before the "
        f"walltime, or a cancel); a '*** JOB {job_id} ON <node> CANCELLED AT <time> ***' line "
        "beside this in the job's output is that signal, not a failure; running jobs are "
        "handed back (ready again, not charged a failure)"
    )
    info = job(root, jid)
    assert info.state is State.READY, dump(root)
    assert info.last["why"] == "interrupted" and info.last["try"] == 0
