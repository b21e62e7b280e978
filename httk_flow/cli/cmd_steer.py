"""`flow cancel`, `pause`, `resume`, `release`, `priority`, `requests`, `wait` and `logs`."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

import click

from httk_flow.cli.app import App
from httk_flow.cli.options import selector_options, workspace_option
from httk_flow.errors import FlowError, UsageError
from httk_flow.ops import steering
from httk_flow.ops.logs import read_log
from httk_flow.ops.select import Selection, one, select
from httk_flow.ops.waiting import wait_jobs, waited
from httk_flow.protocol import names, requests
from httk_flow.protocol.states import State
from httk_flow.protocol.transition import JobHandle
from httk_flow.protocol.workspace import Workspace

F = TypeVar("F", bound=Callable[..., Any])


#: the states in which a bulk selection (--tag/--group/--state/--all) would change a
#: job; others are left out of the count and of the run (cancelling a finished job
#: changes nothing)
_CHANGES: dict[str, frozenset[State]] = {
    "cancel": frozenset(State) - {State.SUCCEEDED, State.CANCELLED, State.CANCELLING},
    "pause": frozenset(
        {
            State.SUBMITTED,
            State.READY,
            State.WAITING,
            State.CLAIMED,
            State.RUNNING,
            State.COMMITTING,
        }
    ),
    "resume": frozenset({State.PAUSED, State.FAILED}),
    "release": frozenset({State.PAUSED}),
    "reprioritise": frozenset(
        {
            State.SUBMITTED,
            State.READY,
            State.WAITING,
            State.PAUSED,
            State.CLAIMED,
            State.RUNNING,
            State.COMMITTING,
        }
    ),
}


def _select(app: App, sel: Selection, verb: str, yes: bool, quiet: bool = False) -> list[JobHandle]:
    """The jobs to steer: the named ones as they are (each must name one job); a bulk
    selection only where it changes something, confirmed on a terminal. A bulk selection
    that changes nothing says so on stderr (unless `quiet`) and is no error: a script may
    steer a tag whose jobs are all gone past that state."""
    if sel.empty:
        raise UsageError(
            "name at least one JOB (or --tag TAG / --group GROUP / --state KIND / --all)",
            obj=f"flow {verb}",
        )
    found = list(select(app.ws, sel))
    if sel.idents:
        return found
    changing = [h for h in found if h.state in _CHANGES[verb]]
    if not quiet and not (changing if verb != "release" else found):
        app.warn(_unchanged(sel, verb, found))
    if changing and app.is_terminal and not yes:
        left = len(found) - len(changing)
        rest = f" ({left} other job(s) left as they are)" if left else ""
        click.confirm(f"{verb} {len(changing)} job(s){rest}?", abort=True, err=True)
    return changing if verb != "release" else found


def _unchanged(sel: Selection, verb: str, found: list[JobHandle]) -> str:
    """Why a bulk selection changes nothing: it matches no job, or only jobs in states
    that `verb` leaves as they are (counted by state)."""
    what = sel.narrowing() or "--all"
    if not found:
        return f"no job matches {what}: nothing to {verb}"
    by_state = Counter(h.state.value for h in found)
    states = ", ".join(f"{n} {st}" for st, n in sorted(by_state.items()))
    return f"{len(found)} job(s) match {what}, none in a state to {verb} ({states})"


def _apply(
    app: App,
    handles: list[JobHandle],
    fn: Callable[[Workspace, JobHandle], steering.SteerResult],
    *,
    as_json: bool = False,
    quiet: bool = False,
) -> None:
    """Steer each job; one line per job (none with --quiet), or one JSON document."""
    ws = app.ws
    codes: set[int] = set()
    done: list[dict[str, object]] = []
    errors: list[dict[str, object]] = []
    for h in handles:
        try:
            r = fn(ws, h)
        except FlowError as e:
            codes.add(e.exit_code)
            if as_json:
                errors.append({"job": h.key, "error": e.render(), "exit_code": e.exit_code})
            else:
                app.error(e)
            continue
        row: dict[str, object] = {
            "id": h.job_id,
            "key": r.key,
            "from": r.before.value,
            "to": r.after.value,
        }
        if r.note:
            row["note"] = r.note
        if r.skipped:
            row["skipped"] = True
        done.append(row)
        if not as_json and not quiet:
            note = f" ({r.note})" if r.note else ""
            app.echo(f"{r.key}: {r.before.value} -> {r.after.value}{note}")
    if as_json:
        app.json({"jobs": done, "errors": errors})
    if codes:
        # 2 when every refusal was bad input, 1 when an operation failed
        raise SystemExit(1 if 1 in codes else 2)


def _reporting(f: F) -> F:
    """--json and -q/--quiet of the steering commands."""
    f = click.option(
        "--quiet", "-q", is_flag=True, help="Print nothing but errors (the exit status tells)."
    )(f)
    return click.option(
        "--json", "as_json", is_flag=True, help="Print what changed as one JSON document."
    )(f)


_STATE_HELP = "Every job in this state (repeatable)."


@click.command("cancel")
@click.argument("idents", nargs=-1, metavar="[JOB]...")
@selector_options(state_help=_STATE_HELP)
@click.option("--reason", default="", help="Recorded in the job's history.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@_reporting
@workspace_option
@click.pass_obj
def cancel(
    app: App,
    /,
    sel: Selection,
    reason: str,
    yes: bool,
    as_json: bool,
    quiet: bool,
) -> None:
    """Cancel jobs; a running job is fenced and its process group stopped."""
    handles = _select(app, sel, "cancel", yes, quiet)
    owners = steering.Owners(app.ws)  # read once, on the first running job
    _apply(
        app,
        handles,
        lambda ws, h: steering.cancel(ws, h, reason, owners),
        as_json=as_json,
        quiet=quiet,
    )


@click.command("pause")
@click.argument("idents", nargs=-1, metavar="[JOB]...")
@selector_options(state_help=_STATE_HELP)
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@_reporting
@workspace_option
@click.pass_obj
def pause(
    app: App,
    /,
    sel: Selection,
    yes: bool,
    as_json: bool,
    quiet: bool,
) -> None:
    """Pause jobs (a running job pauses when its attempt ends; a submitted one at once)."""
    handles = _select(app, sel, "pause", yes, quiet)
    _apply(app, handles, steering.pause, as_json=as_json, quiet=quiet)


@click.command("resume")
@click.argument("idents", nargs=-1, metavar="[JOB]...")
@click.option("--step", default=None, help="Continue at this step.")
@selector_options(
    states=("paused", "failed"),
    state_help="Every paused (or failed) job (repeatable).",
    all_help="Every paused or failed job.",
)
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@_reporting
@workspace_option
@click.pass_obj
def resume(
    app: App,
    /,
    step: str | None,
    sel: Selection,
    yes: bool,
    as_json: bool,
    quiet: bool,
) -> None:
    """Continue paused or failed jobs."""
    if step is not None:
        names.check_ident(step, "step name")
    if sel.all and not sel.states:
        sel = dataclasses.replace(sel, states=(State.PAUSED, State.FAILED))
    handles = _select(app, sel, "resume", yes, quiet)
    _apply(app, handles, lambda ws, h: steering.resume(ws, h, step), as_json=as_json, quiet=quiet)


@click.command("priority")
@click.argument("args", nargs=-1, required=True, metavar="[JOB]... N")
@selector_options(state_help=_STATE_HELP)
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@_reporting
@workspace_option
@click.pass_obj
def priority(
    app: App,
    /,
    args: tuple[str, ...],
    sel: Selection,
    yes: bool,
    as_json: bool,
    quiet: bool,
) -> None:
    """Change the priority of jobs (0-999, higher first); a running job's applies when
    its attempt ends."""
    if not args[-1].isdigit() or (len(args) < 2 and not sel.filters):
        raise UsageError("expects JOB... N with N in 0-999", obj="flow priority")
    n = names.check_priority(int(args[-1]))
    handles = _select(app, dataclasses.replace(sel, idents=args[:-1]), "reprioritise", yes, quiet)
    _apply(
        app, handles, lambda ws, h: steering.set_priority(ws, h, n), as_json=as_json, quiet=quiet
    )


@click.command("release")
@click.argument("idents", nargs=-1, metavar="[JOB]...")
@selector_options(
    states=("paused",),
    state_help="Every paused job (the one state a held job is in).",
    all_help="Every paused job.",
)
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@_reporting
@workspace_option
@click.pass_obj
def release(app: App, /, sel: Selection, yes: bool, as_json: bool, quiet: bool) -> None:
    """Let held jobs run (`flow submit --hold`): resume the paused ones, skip the rest."""
    if sel.all and not sel.states:
        sel = dataclasses.replace(sel, states=(State.PAUSED,))
    handles = _select(app, sel, "release", yes, quiet)
    _apply(app, handles, steering.release, as_json=as_json, quiet=quiet)


@click.command("requests")
@click.option("--pending", is_flag=True, help="Only requests not yet retired.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON document.")
@workspace_option
@click.pass_obj
def requests_(app: App, /, pending: bool, as_json: bool) -> None:
    """Requests waiting for a job's attempt to end, and how each was retired."""
    rows = list(requests.views(app.ws, done=not pending))
    if as_json:
        app.json({"requests": [r.to_json() for r in rows]})
        return
    if not rows:
        app.echo("no requests")
        return
    app.table(
        ["STATUS", "REQUEST", "JOB", "GEN", "MANAGER", "REASON"],
        [
            (
                r.status,
                r.request.what if r.request else r.name,
                r.request.key if r.request else "-",
                r.request.gen if r.request else "-",
                r.by or "-",
                r.reason or "-",
            )
            for r in rows
        ],
    )


@click.command("wait")
@click.argument("idents", nargs=-1, metavar="[JOB]...")
@selector_options()
@click.option("--timeout", type=float, default=None, help="Give up after SECONDS (exit 3).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON document.")
@workspace_option
@click.pass_obj
def wait(app: App, /, sel: Selection, timeout: float | None, as_json: bool) -> None:
    """Block until jobs are terminal: exit 0 all succeeded, 1 some did not, 3 timeout."""
    ws = app.ws
    handles = waited(ws, sel)

    def why(lines: list[str], say: Callable[[str], None]) -> None:
        # on stderr, whether or not it is a terminal: nothing moves, and this is why
        for line in lines:
            say(f"flow wait: nothing moves: {line}")

    if app.is_terminal and not as_json:
        from rich.markup import escape
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        with Progress(
            TextColumn("waiting"),
            BarColumn(),
            MofNCompleteColumn(),
            console=app.console(stderr=True),
            transient=True,
        ) as bar:
            task = bar.add_task("wait", total=None)
            r = wait_jobs(
                ws,
                handles,
                timeout=timeout,
                progress=lambda d, t: bar.update(task, completed=d, total=t),
                on_stuck=lambda lines: why(lines, lambda t: bar.console.print(escape(t))),
            )
    else:
        r = wait_jobs(
            ws,
            handles,
            timeout=timeout,
            on_stuck=lambda lines: why(lines, lambda t: app.echo(t, err=True)),
        )
    if r.total == 0 and sel.filters_but_all:
        # a tag or group nothing carries (a typo?) is waited for at once: say so
        app.warn(f"no job matches {sel.narrowing()}: nothing to wait for")
    if as_json:
        app.json(
            {
                "total": r.total,
                "done": r.done,
                "succeeded": r.succeeded,
                "failed": r.failed,
                "cancelled": r.cancelled,
                "timed_out": r.timed_out,
            }
        )
    else:
        app.echo(
            f"{r.done}/{r.total} done: {r.succeeded} succeeded, {r.failed} failed, "
            f"{r.cancelled} cancelled" + (" (timed out)" if r.timed_out else "")
        )
    raise SystemExit(r.exit_code)


@click.command("logs")
@click.argument("idents", nargs=-1, metavar="[JOB]")
@selector_options()
@click.option("--stderr", is_flag=True, help="Show stderr instead of stdout.")
@click.option("--attempt", type=int, default=None, help="Attempt number (default: last).")
@click.option(
    "--follow",
    "-f",
    is_flag=True,
    help="Keep printing until the attempt ends (waiting for the first one to start).",
)
@workspace_option
@click.pass_obj
def logs(app: App, /, sel: Selection, stderr: bool, attempt: int | None, follow: bool) -> None:
    """Print an attempt's output (of exactly one selected job)."""
    ws = app.ws
    job = one(ws, sel)
    for chunk in read_log(
        ws,
        job,
        stderr=stderr,
        attempt=attempt,
        follow=follow,
        on_wait=lambda: app.echo(
            f"flow: waiting for the first attempt of job {job.key} ({job.state.value})", err=True
        ),
    ):
        app.write(chunk)
