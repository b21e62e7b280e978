"""Continuation before new work: of ready jobs of one priority a manager claims first the
ones its own commits moved on (depth-first), so a multi-step campaign finishes jobs early;
`--order breadth` keeps the order in which jobs became ready."""

from __future__ import annotations

from pathlib import Path

from .support import Managers, all_jobs, flow

#: three steps; every attempt appends "STEP INDEX" to the file named by its `log` param
STEPS = """#!/usr/bin/env bash
source "$FLOW_BASH_API"
flow_steps prepare compute collect
note() { echo "$FLOW_STEP $FLOW_ARRAY_INDEX" >> "$(flow_param log)"; }
step_prepare() { note; flow_advance compute; }
step_compute() { note; flow_advance collect; }
step_collect() { note; flow_succeed; }
flow_main "$@"
"""

JOBS = 36


def campaign(root: str, tmp: Path) -> Path:
    """A 36-job three-step array; returns the file its attempts write their order to."""
    program = tmp / "steps.sh"
    program.write_text(STEPS)
    program.chmod(0o755)
    log = tmp / "order.log"
    r = flow(
        "-w",
        root,
        "submit",
        "--array",
        f"1-{JOBS}",
        "--step",
        "prepare",
        "--param",
        f"log={log}",
        str(program),
    )
    assert r.returncode == 0, r.stderr
    return log


def attempts_before_first_success(log: Path) -> int:
    lines = log.read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("collect "))
    assert len(lines) == 3 * JOBS
    return first + 1


def test_one_worker_finishes_its_first_job_after_three_attempts_not_seventy_three(
    root: str, tmp_path: Path, managers: Managers
) -> None:
    log = campaign(root, tmp_path)
    assert managers.run(root, workers=1) == 0
    assert {j.state.value for j in all_jobs(root)} == {"succeeded"}
    assert attempts_before_first_success(log) == 3
    # and every job runs its steps back to back: prepare, compute, collect, next job
    lines = log.read_text().splitlines()
    for i in range(0, len(lines), 3):
        steps = [line.split() for line in lines[i : i + 3]]
        assert [s for s, _ in steps] == ["prepare", "compute", "collect"], lines[i : i + 3]
        assert len({n for _, n in steps}) == 1, lines[i : i + 3]


def test_order_breadth_runs_every_step_of_every_job_before_the_next_step(
    root: str, tmp_path: Path, managers: Managers
) -> None:
    log = campaign(root, tmp_path)
    assert managers.run(root, "--order", "breadth", workers=1) == 0
    assert {j.state.value for j in all_jobs(root)} == {"succeeded"}
    assert attempts_before_first_success(log) == 2 * JOBS + 1
