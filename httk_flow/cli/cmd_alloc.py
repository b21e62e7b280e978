"""`flow scale`, `flow allocations`, and the commands backends describe (submitting a
single allocation by hand), built here from their descriptions."""

from __future__ import annotations

import datetime as dt

import click

from httk_flow.cli.app import App
from httk_flow.cli.options import workspace_option
from httk_flow.errors import UsageError
from httk_flow.protocol.durations import parse_duration
from httk_flow.scale import backends
from httk_flow.scale.allocation_records import AllocationStore
from httk_flow.scale.allocations import Reconciler, ScaleSettings, TickReport
from httk_flow.scale.backends.base import BackendCommand


def _when(t: float) -> str:
    return dt.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


#: the backends `flow scale` can drive, by name
_BACKENDS = sorted(backends.available())


@click.command("scale", context_settings={"ignore_unknown_options": False})
@click.option("--backend", type=click.Choice(_BACKENDS), default="local", show_default=True)
@click.option(
    "--max",
    "max_",
    type=click.IntRange(min=0),
    default=4,
    show_default=True,
    help="Most allocations at once.",
)
@click.option(
    "--min",
    "min_",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Fewest allocations, even with nothing queued.",
)
@click.option(
    "--jobs-per-manager",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="Queued jobs that justify one more allocation.",
)
@click.option("--once", is_flag=True, help="One reconciliation pass (for cron).")
@click.option(
    "--interval", default="30s", show_default=True, help="Between two passes when looping."
)
@click.option("--time", "time_", default=None, help="Walltime of each allocation.")
@click.option(
    "--drain",
    default="2m",
    show_default=True,
    help="How long before the walltime a manager is told to drain.",
)
@click.option(
    "--backend-arg",
    *backends.submit_arg_flags(),
    "backend_args",
    multiple=True,
    metavar="ARG",
    help="Passed to the batch system's submission (repeatable).",
)
@click.option(
    "--serve-arg",
    "serve_args",
    multiple=True,
    metavar="ARG",
    help="Passed to each `flow serve` (repeatable).",
)
@click.option("--unpause", is_flag=True, help="Lift a pause after repeated failures.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON line per pass.")
@workspace_option
@click.pass_obj
def scale(
    app: App,
    /,
    backend: str,
    max_: int,
    min_: int,
    jobs_per_manager: int,
    once: bool,
    interval: str,
    time_: str | None,
    drain: str,
    backend_args: tuple[str, ...],
    serve_args: tuple[str, ...],
    unpause: bool,
    as_json: bool,
) -> None:
    """Keep manager allocations matched to the queued work."""
    ws = app.ws
    if unpause and AllocationStore(ws).unpause():
        app.echo("allocation queue unpaused")
    settings = ScaleSettings(
        max=max_,
        min=min(min_, max_),
        jobs_per_manager=jobs_per_manager,
        serve_args=serve_args,
        time=parse_duration(time_, "--time") if time_ else None,
        drain=parse_duration(drain, "--drain"),
        extra_args=backend_args,
    )
    rec = Reconciler(ws, backends.get(backend), settings)

    def show(r: TickReport) -> None:
        if as_json:
            app.json_line(r.__dict__)
            return
        parts = [f"desired {r.desired}", f"active {r.active}"]
        for label, items in (
            ("submitted", r.submitted),
            ("adopted", r.adopted),
            ("cancelled", r.cancelled),
        ):
            if items:
                parts.append(f"{label} {len(items)}")
        if r.unavailable:
            parts.append(f"backend unavailable: {r.unavailable}")
        if r.paused:
            parts.append(f"paused: {r.paused}")
        app.echo(", ".join(parts))

    try:
        rec.run(interval=parse_duration(interval, "--interval"), once=once, on_tick=show)
    except KeyboardInterrupt:
        pass


@click.command("allocations")
@click.option("--all", "all_", is_flag=True, help="Include ended allocations.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON document.")
@workspace_option
@click.pass_obj
def allocations(app: App, /, all_: bool, as_json: bool) -> None:
    """Allocations the workspace knows, with phase and backend handle."""
    store = AllocationStore(app.ws)
    recs = [r for r in store.load_all() if all_ or not r.phase.ended]
    paused = store.paused()
    if as_json:
        app.json(
            {
                "paused": paused,
                "allocations": [
                    {
                        "token": r.token,
                        "backend": r.backend,
                        "phase": r.phase.value,
                        "handle": r.handle,
                        "reason": r.reason,
                        "created": r.created,
                        "updated": r.updated,
                    }
                    for r in recs
                ],
            }
        )
        return
    if paused:
        app.echo(f"paused: {paused}")
    app.table(
        ["TOKEN", "BACKEND", "PHASE", "HANDLE", "SINCE", "REASON"],
        [[r.token, r.backend, r.phase.value, r.handle, _when(r.updated), r.reason] for r in recs],
    )


def backend_command(spec: BackendCommand) -> click.Command:
    """The click command of a backend's description: one allocation submitted by hand."""

    @click.command(spec.name, help=spec.help, context_settings={"allow_interspersed_args": False})
    @click.option(spec.arg_flag, "extra_args", multiple=True, metavar="ARG", help=spec.arg_help)
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
    def submit_one(
        app: App,
        /,
        extra_args: tuple[str, ...],
        time_: str | None,
        drain: str,
        as_json: bool,
        serve_args: tuple[str, ...],
    ) -> None:
        ws = app.ws
        _check_serve_args(serve_args)
        done = spec.submit(
            ws.root,
            serve_args=serve_args,
            time=parse_duration(time_, "--time") if time_ else None,
            drain=parse_duration(drain, "--drain"),
            extra_args=extra_args,
        )
        if as_json:
            app.json(
                {
                    "job_id": done.handle,
                    "token": done.token,
                    "workspace": done.workspace,
                    "log": done.log,
                }
            )
        else:
            app.echo(done.handle)

    return submit_one


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
