"""`flow sbatch`: submit one manager allocation that drains before its walltime."""

from __future__ import annotations

import os
import secrets
import time

import click

from httk_flow.cli.app import App
from httk_flow.cli.options import workspace_option
from httk_flow.errors import FlowError, UsageError
from httk_flow.protocol.durations import parse_duration
from httk_flow.scale.backends.base import AllocationRequest, BackendUnavailable, Outcome
from httk_flow.scale.backends.slurm.script import check_request, default_log_dir, job_name

#: how long to keep asking by token after a submission without a definite answer
ADOPT_WAIT = 10.0


def _check_serve_args(args: tuple[str, ...]) -> None:
    """Parse SERVE_OPTIONS as `flow serve` would, so a typo fails here and not in the job."""
    if "-w" in args or any(a == "--workspace" or a.startswith("--workspace=") for a in args):
        raise UsageError("may not name a workspace; pass -w before --", obj="SERVE_OPTIONS")
    if "-h" in args or "--help" in args:
        raise UsageError("may not ask for help; run `flow serve --help`", obj="SERVE_OPTIONS")
    ctx = click.get_current_context()
    root = ctx.find_root().command
    serve = root.get_command(ctx, "serve") if isinstance(root, click.Group) else None
    if serve is None:
        return
    try:
        serve.make_context("flow serve", list(args), obj=App())
    except click.ClickException as e:
        raise UsageError(
            f"are not options of `flow serve`: {e.format_message()}", obj="SERVE_OPTIONS"
        ) from None


@click.command(
    "sbatch",
    context_settings={"allow_interspersed_args": False},
)
@click.option(
    "--sbatch-arg",
    "sbatch_args",
    multiple=True,
    metavar="ARG",
    help="Passed to sbatch as it is, e.g. --sbatch-arg=--partition=short (repeatable).",
)
@click.option("--time", "time_", default=None, help="Walltime of the allocation, e.g. 4h.")
@click.option(
    "--drain",
    default="2m",
    show_default=True,
    help="How long before the walltime the manager is told to drain.",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON document.")
@workspace_option
@click.argument("serve_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- SERVE_OPTIONS]")
@click.pass_obj
def sbatch_command(
    app: App,
    /,
    sbatch_args: tuple[str, ...],
    time_: str | None,
    drain: str,
    as_json: bool,
    serve_args: tuple[str, ...],
) -> None:
    """Submit one manager allocation to Slurm that drains before its walltime.

    The allocation runs `flow serve` on this workspace with SERVE_OPTIONS; Slurm sends it
    SIGTERM --drain before the walltime, and the manager stops claiming, puts its running
    jobs back in the queue and exits. Prints the Slurm job id.
    """
    from httk_flow.scale.backends.slurm import BACKEND

    ws = app.ws
    _check_serve_args(serve_args)
    token = "a" + secrets.token_hex(8)
    log_dir = default_log_dir(ws.root)
    request = AllocationRequest(
        workspace=ws.root,
        token=token,
        serve_args=serve_args,
        time=parse_duration(time_, "--time") if time_ else None,
        drain=parse_duration(drain, "--drain"),
        extra_args=sbatch_args,
        log_dir=log_dir,
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
        job_id = _adopt(ws.root, token)
    if job_id is None:
        raise FlowError(
            f"got no definite answer ({reason})",
            obj="flow sbatch",
            hint=f"the job may still appear: look for the job name {job_name(token)} "
            "in the queue before submitting again",
        )
    log = os.path.join(log_dir, f"{job_name(token)}-{job_id}.out")
    if as_json:
        app.json({"job_id": job_id, "token": token, "workspace": ws.root, "log": log})
    else:
        app.echo(job_id)


def _adopt(workspace: str, token: str) -> str | None:
    """After an unknown result: ask for the token a few times before giving up."""
    from httk_flow.scale.backends.slurm import BACKEND

    deadline = time.monotonic() + ADOPT_WAIT
    while True:
        try:
            found = BACKEND.find_by_token(workspace, token)
        except BackendUnavailable:
            found = None
        if found is not None or time.monotonic() >= deadline:
            return found
        time.sleep(2.0)
