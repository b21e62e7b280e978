"""What is sent to sbatch for one manager allocation: the arguments and the batch script.

The batch script `exec`s the manager, so the manager IS the batch shell: the TERM that
`--signal=B:TERM@<drain>` sends before the walltime (and `scancel -b -s TERM`) reaches
it directly and starts its drain.
"""

from __future__ import annotations

import math
import os
import shlex
import sys

from httk_flow.protocol import layout
from httk_flow.scale.backends.base import AllocationRequest

#: Slurm's limit for the `--signal` offset
MAX_SIGNAL_OFFSET = 65535
#: Slurm handles `--signal` in passes about a minute apart: it may signal up to 60 s
#: earlier than asked, so a manager leaves this much more before the drain
SIGNAL_MARGIN = 60.0


def job_name(token: str) -> str:
    return f"flow-{token}"


def default_log_dir(workspace: str) -> str:
    return layout.allocation_logs(workspace)


def time_minutes(seconds: float) -> int:
    """Walltime in whole minutes, rounded up (Slurm's `--time` unit)."""
    return max(1, math.ceil(seconds / 60.0 - 1e-9))


def drain_seconds(seconds: float) -> int:
    return min(MAX_SIGNAL_OFFSET, max(1, math.ceil(seconds)))


def check_request(request: AllocationRequest) -> str | None:
    """Why this request cannot be submitted as it is, or None."""
    if not request.token or not all(c.isalnum() or c in "-_" for c in request.token):
        return f"token {request.token!r} is not a plain word"
    if request.time is not None and request.time <= 0:
        return "the walltime must be positive"
    if request.time is not None and drain_seconds(request.drain) >= time_minutes(request.time) * 60:
        return (
            f"the drain ({drain_seconds(request.drain)} s) must be shorter than the walltime "
            f"({time_minutes(request.time)} min): the manager would drain as it starts"
        )
    return None


def sbatch_argv(request: AllocationRequest, sbatch: str = "sbatch") -> list[str]:
    """`sbatch --parsable ...` for the request; the script comes on stdin.

    The request's extra arguments come last, so a user's own `--time`, `--output` or
    `--signal` wins over ours (sbatch keeps the last value of a repeated option)."""
    log_dir = request.log_dir or default_log_dir(request.workspace)
    argv = [
        sbatch,
        "--parsable",
        f"--job-name={job_name(request.token)}",
        f"--comment=token={request.token}",
        f"--signal=B:TERM@{drain_seconds(request.drain)}",
        f"--output={os.path.join(log_dir, job_name(request.token))}-%j.out",
        f"--chdir={request.workspace}",
    ]
    if request.time is not None:
        argv.append(f"--time={time_minutes(request.time)}")
    argv.extend(request.extra_args)
    return argv


def margin_seconds(request: AllocationRequest) -> int:
    """How much earlier than asked Slurm may send the drain signal (the request's own
    margin, else Slurm's usual minute)."""
    margin = SIGNAL_MARGIN if request.margin is None else request.margin
    return max(0, math.ceil(margin))


def batch_script(request: AllocationRequest, python: str | None = None) -> str:
    """The batch script: export the token, then become the manager.

    The manager asks Slurm when the allocation ends; it is told here how long before
    that end the drain signal is due (`--drain-before`, the `--signal` offset) and how
    much earlier it may come (`--signal-margin`), so it claims only work that ends before
    the earliest drain. Serve arguments come after these, so the user's own win."""
    serve = [
        python or sys.executable,
        "-m",
        "httk_flow",
        "serve",
        "-w",
        request.workspace,
    ]
    # one worker per CPU of the allocation unless the serve arguments say otherwise
    # (a later --workers wins); os.cpu_count() would count the whole node
    workers = '--workers "${SLURM_CPUS_ON_NODE:-1}"'
    ends = (
        f"--drain-before {drain_seconds(request.drain)}s --signal-margin {margin_seconds(request)}s"
    )
    args = " ".join(shlex.quote(a) for a in request.serve_args)
    return (
        "#!/bin/bash\n"
        f"# httk_flow manager allocation {request.token} for {request.workspace}\n"
        f"export {layout.ENV_ALLOCATION_TOKEN}={shlex.quote(request.token)}\n"
        # an end time another launcher may have exported: Slurm itself is asked instead
        f"unset {layout.ENV_ALLOCATION_END}\n"
        "# exec: the manager is the batch shell, so the drain signal reaches it\n"
        f"exec {' '.join(shlex.quote(a) for a in serve)} {workers} {ends} {args}\n".rstrip()
        + "\n"
    )
