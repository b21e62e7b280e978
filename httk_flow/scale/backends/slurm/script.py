"""What is sent to sbatch for one manager allocation: the arguments and the batch script.

On one node the batch script `exec`s the manager, so the manager IS the batch shell: the
TERM that `--signal=B:TERM@<drain>` sends before the walltime (and `scancel -b -s TERM`)
reaches it directly and starts its drain. On several nodes it runs one manager per node
as one `srun` step and passes that TERM on to the step.
"""

from __future__ import annotations

import math
import os
import shlex
import sys

from httk_flow.protocol import layout
from httk_flow.scale.backends.base import AllocationProfile, AllocationRequest

#: Slurm's limit for the `--signal` offset
MAX_SIGNAL_OFFSET = 65535
#: Slurm handles `--signal` in passes about a minute apart: it may signal up to 60 s
#: earlier than asked, so a manager leaves this much more before the drain
SIGNAL_MARGIN = 60.0

#: sbatch options that set one part of an allocation's shape; where the user's own
#: arguments name any option of a kind, ours of that kind is left out (sbatch refuses
#: some pairs outright, e.g. --mem with --mem-per-cpu, and a later --gres replaces all of
#: an earlier one)
SHAPE_OPTIONS = {
    "nodes": ("--nodes", "-N"),
    "tasks": ("--ntasks-per-node", "--ntasks", "-n"),
    "cpus": ("--cpus-per-task", "-c", "--cpus-per-gpu"),
    "mem": ("--mem", "--mem-per-cpu", "--mem-per-gpu"),
    "gpus": ("--gres", "--gpus", "-G", "--gpus-per-node", "--gpus-per-task", "--gpus-per-socket"),
}
#: the step id of the managers' srun: the first step the batch script starts
MANAGER_STEP = 0


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
    if request.profile is not None:
        argv.extend(shape_args(request.profile, request.extra_args))
    argv.extend(request.extra_args)
    return argv


def named_kinds(args: tuple[str, ...]) -> set[str]:
    """The kinds of SHAPE_OPTIONS the user's own sbatch arguments name."""
    names = set()
    for arg in args:
        if arg.startswith("--"):
            names.add(arg.split("=", 1)[0])
        elif arg.startswith("-") and len(arg) >= 2:
            names.add(arg[:2])
    return {kind for kind, opts in SHAPE_OPTIONS.items() if names & set(opts)}


def mem_megabytes(n: int) -> int:
    return max(1, math.ceil(n / (1 << 20)))


def shape_args(profile: AllocationProfile, extra_args: tuple[str, ...] = ()) -> list[str]:
    """The sbatch options of a profile: every node one task (its manager) with all the
    node's CPUs, memory per node in megabytes, GPUs per node; less the kinds the user's
    own arguments set (theirs decide).

    GPUs are asked for as `--gres=gpu:N` rather than `--gpus-per-node=N`: both mean N per
    node, but --gres works with every select plugin and Slurm release that has GPUs,
    while the --gpus-* family needs select/cons_tres."""
    mine = named_kinds(extra_args)
    wanted = [
        ("nodes", f"--nodes={profile.nodes}"),
        ("tasks", "--ntasks-per-node=1"),
        ("cpus", f"--cpus-per-task={profile.cpus}"),
    ]
    if profile.mem:
        wanted.append(("mem", f"--mem={mem_megabytes(profile.mem)}M"))
    if profile.gpus:
        wanted.append(("gpus", f"--gres=gpu:{profile.gpus}"))
    return [arg for kind, arg in wanted if kind not in mine]


def margin_seconds(request: AllocationRequest) -> int:
    """How much earlier than asked Slurm may send the drain signal (the request's own
    margin, else Slurm's usual minute)."""
    margin = SIGNAL_MARGIN if request.margin is None else request.margin
    return max(0, math.ceil(margin))


def serve_resources(request: AllocationRequest) -> str:
    """The inventory options of `flow serve` in the batch script: what Slurm granted on
    the node (its variables), else the profile; without a profile one worker per CPU."""
    profile = request.profile
    if profile is None:
        # one worker per CPU of the allocation unless the serve arguments say otherwise
        # (a later --workers wins); os.cpu_count() would count the whole node
        return '--workers "${SLURM_CPUS_ON_NODE:-1}"'
    mine = named_kinds(request.extra_args)
    out = [f'--cpus "${{SLURM_CPUS_ON_NODE:-{profile.cpus}}}"']
    # a memory or GPU kind the user set: the manager finds what was granted itself
    if profile.mem and "mem" not in mine:
        out.append(f'--mem "${{SLURM_MEM_PER_NODE:-{mem_megabytes(profile.mem)}}}"')
    if profile.gpus and "gpus" not in mine:
        out.append(f'--gpus "${{SLURM_GPUS_ON_NODE:-{profile.gpus}}}"')
    return " ".join(out)


def batch_script(request: AllocationRequest, python: str | None = None) -> str:
    """The batch script: export the token, then become the manager (one node) or start
    one manager per node (several).

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
    ends = (
        f"--drain-before {drain_seconds(request.drain)}s --signal-margin {margin_seconds(request)}s"
    )
    args = " ".join(shlex.quote(a) for a in request.serve_args)
    command = f"{' '.join(shlex.quote(a) for a in serve)} {serve_resources(request)} {ends} {args}"
    lines = [
        "#!/bin/bash",
        f"# httk_flow manager allocation {request.token} for {request.workspace}",
        f"export {layout.ENV_ALLOCATION_TOKEN}={shlex.quote(request.token)}",
        # an end time another launcher may have exported: Slurm itself is asked instead
        f"unset {layout.ENV_ALLOCATION_END}",
        f"serve=({command.rstrip()})",
    ]
    if request.profile is None or request.profile.nodes <= 1:
        lines += [
            'if [ "${SLURM_JOB_NUM_NODES:-1}" -le 1 ]; then',
            "    # exec: the manager is the batch shell, so the drain signal reaches it",
            '    exec "${serve[@]}"',
            "fi",
        ]
    step = f"$SLURM_JOB_ID.{MANAGER_STEP}"
    lines += [
        "# several nodes: one manager per node, all in one step; --overlap leaves the",
        "# CPUs to the steps that attempts start, and one manager's end ends no other",
        'srun --ntasks-per-node=1 --cpus-per-task="${SLURM_CPUS_ON_NODE:-1}" --mem=0 \\',
        '    --overlap --kill-on-bad-exit=0 "${serve[@]}" &',
        "managers=$!",
        "# the drain TERM reaches only this shell; a TERM to srun would kill the step, so",
        "# it goes to the step's tasks through the controller",
        "# shellcheck disable=SC2317  # called by the trap",
        "drain() {",
        f'    scancel --signal=TERM "{step}" || echo "flow: the drain signal did not reach'
        ' the managers; they drain by themselves before the walltime" >&2',
        "}",
        "trap drain TERM",
        'wait "$managers"',
        "status=$?",
        "# a trap ends a wait early: wait until the step has ended",
        'while kill -0 "$managers" 2>/dev/null; do',
        '    wait "$managers"',
        "    status=$?",
        "done",
        'exit "$status"',
    ]
    return "\n".join(lines) + "\n"
