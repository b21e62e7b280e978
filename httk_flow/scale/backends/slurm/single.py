"""`flow sbatch` in plain terms: one manager allocation submitted by hand, which drains
before its walltime (the CLI builds the command from SBATCH)."""

from __future__ import annotations

import os
import secrets

from httk_flow.errors import FlowError, UsageError
from httk_flow.scale.backends.base import (
    AllocationRequest,
    BackendCommand,
    BackendUnavailable,
    Outcome,
    Submitted,
    adopt_by_token,
)
from httk_flow.scale.backends.slurm.script import (
    SIGNAL_MARGIN,
    check_request,
    default_log_dir,
    job_name,
)

#: how long to keep asking by token after a submission without a definite answer
ADOPT_WAIT = 10.0


def submit_one(
    workspace: str,
    *,
    serve_args: tuple[str, ...],
    time: float | None,
    drain: float,
    extra_args: tuple[str, ...],
    margin: float | None = None,
) -> Submitted:
    """Submit one allocation running `flow serve SERVE_ARGS` on the workspace; an unknown
    answer is resolved by asking for its token, never by submitting again."""
    from httk_flow.scale.backends.slurm import BACKEND

    token = "a" + secrets.token_hex(8)
    log_dir = default_log_dir(workspace)
    request = AllocationRequest(
        workspace=workspace,
        token=token,
        serve_args=serve_args,
        time=time,
        drain=drain,
        extra_args=extra_args,
        log_dir=log_dir,
        margin=margin,
    )
    problem = check_request(request)
    if problem:
        raise UsageError(problem, obj="flow sbatch")
    try:
        res = BACKEND.submit(request)
        outcome, job_id, reason = res.outcome, res.handle, res.reason
    except BackendUnavailable as e:
        outcome, job_id, reason = Outcome.UNKNOWN, None, e.render()
    if outcome is Outcome.REJECTED:
        raise FlowError(reason, obj="flow sbatch", hint="check the --sbatch-arg values")
    if job_id is None:
        job_id = adopt_by_token(BACKEND, workspace, token, ADOPT_WAIT)
    if job_id is None:
        raise FlowError(
            f"got no definite answer ({reason})",
            obj="flow sbatch",
            hint=f"the job may still appear: look for the job name {job_name(token)} "
            "in the queue before submitting again",
        )
    log = os.path.join(log_dir, f"{job_name(token)}-{job_id}.out")
    return Submitted(handle=job_id, token=token, workspace=workspace, log=log)


SBATCH = BackendCommand(
    name="sbatch",
    help=(
        "Submit one manager allocation to Slurm that drains before its walltime.\n\n"
        "The allocation runs `flow serve` on this workspace with SERVE_OPTIONS; Slurm sends "
        "it SIGTERM --drain before the walltime, and the manager stops claiming, puts its "
        "running jobs back in the queue and exits. Prints the Slurm job id."
    ),
    arg_flag="--sbatch-arg",
    arg_help="Passed to sbatch as it is, e.g. --sbatch-arg=--partition=short (repeatable).",
    submit=submit_one,
    signal_margin=SIGNAL_MARGIN,
)
