"""A manager that drains on SIGTERM inside a batch job says, in its own log, what the batch
system's line beside it is (Slurm writes `*** JOB N ON node CANCELLED AT ... ***` into the
job's output whenever it sends the job TERM: the walltime drain too). Outside a batch job,
or on another signal, it says nothing of the kind. Real `flow serve` processes; the job
comes from the environment Slurm gives a job (SLURM_JOB_ID) and the scheduler is not
asked (a stand-in squeue answers that it knows no such job)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from helpers import wait_for

from httk_flow.protocol.states import State

from .support import Managers, dump, job, log_of, submit, write_script

NOTE = (
    "drain: SIGTERM in Slurm job 4711, the batch system's drain (before the walltime, or a "
    "cancel); a '*** JOB 4711 ON <node> CANCELLED AT <time> ***' line beside this in the "
    "job's output is that signal, not a failure; running jobs are handed back (ready again, "
    "not charged a failure)"
)


@pytest.mark.parametrize(
    ("job_id", "sig", "note"),
    [
        ("4711", signal.SIGTERM, [NOTE]),
        (None, signal.SIGTERM, []),
        ("4711", signal.SIGINT, []),
    ],
    ids=["term-in-a-batch-job", "term-outside-one", "int-in-a-batch-job"],
)
def test_a_drain_on_sigterm_in_a_batch_job_says_what_the_batch_systems_line_is(
    root: str,
    scripts: Path,
    managers: Managers,
    tmp_path: Path,
    job_id: str | None,
    sig: signal.Signals,
    note: list[str],
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    squeue = bin_dir / "squeue"
    squeue.write_text("#!/bin/sh\necho 'squeue: error: Invalid job id specified' >&2\nexit 1\n")
    squeue.chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    if job_id is not None:
        env["SLURM_JOB_ID"] = job_id
    [jid] = submit(
        root, write_script(scripts, "job.sh", 'touch "$FLOW_WORKDIR/started"\nsleep 30\n')
    )
    p = managers.start(root, command="serve", workers=1, env=env, quiet=False)
    started = job(root, jid).job_dir(root) / "run" / "started"
    wait_for(lambda: started.exists() or p.poll() is not None, 20)
    assert p.poll() is None, log_of(p)
    p.send_signal(sig)
    assert p.wait(10) == 0, log_of(p)
    # each line is "HH:MM:SS <manager> <text>"
    lines = [line.split(" ", 2)[2] for line in log_of(p).splitlines()]
    drained = lines.index(f"draining (signal {sig.name}): no new claims; stopping 1 attempt(s)")
    assert [line for line in lines if line.startswith("drain:")] == note, log_of(p)
    if note:
        assert lines[drained + 1] == NOTE  # beside the drain, before the jobs it hands back
    # handed back: ready again, its failure budget untouched
    info = job(root, jid)
    assert info.state is State.READY, dump(root)
    assert info.last["why"] == "interrupted" and info.last["try"] == 0
