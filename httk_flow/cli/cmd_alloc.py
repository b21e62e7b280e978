"""`flow scale`, `flow allocations`, and the commands backends describe (submitting a
single allocation by hand), built here from their descriptions."""

from __future__ import annotations

import datetime as dt
import signal

import click

from httk_flow.cli.app import App
from httk_flow.cli.options import workspace_option
from httk_flow.errors import UsageError
from httk_flow.protocol.durations import compact_duration, parse_duration
from httk_flow.protocol.resources import parse_size
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
    "--max-time",
    default=None,
    help="Allocations may be longer than --time, up to this, so that the longest queued "
    "request fits before the drain.",
)
@click.option(
    "--signal-margin",
    default=None,
    help="How much earlier than --drain the batch system may signal (default: the backend's own).",
)
@click.option(
    "--cpus-per-node",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="The most CPUs an allocation may ask for on a node (default: one job's worth).",
)
@click.option(
    "--gpus-per-node",
    type=click.IntRange(min=0),
    default=None,
    metavar="N",
    help="The most GPUs an allocation may ask for on a node (default: one job's worth).",
)
@click.option(
    "--mem-per-node",
    default=None,
    metavar="SIZE",
    help="The most memory an allocation may ask for on a node, e.g. 64G "
    "(default: one job's worth).",
)
@click.option(
    "--max-nodes",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    metavar="N",
    help="The most nodes one allocation may ask for; each node runs a manager.",
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
    max_time: str | None,
    signal_margin: str | None,
    cpus_per_node: int | None,
    gpus_per_node: int | None,
    mem_per_node: str | None,
    max_nodes: int,
    backend_args: tuple[str, ...],
    serve_args: tuple[str, ...],
    unpause: bool,
    as_json: bool,
) -> None:
    """Keep manager allocations matched to the queued work."""
    ws = app.ws
    if unpause and AllocationStore(ws).unpause():
        app.echo("allocation queue unpaused")
    chosen = backends.get(backend)
    settings = ScaleSettings(
        max=max_,
        min=min(min_, max_),
        jobs_per_manager=jobs_per_manager,
        serve_args=serve_args,
        time=parse_duration(time_, "--time") if time_ else None,
        drain=parse_duration(drain, "--drain"),
        extra_args=backend_args,
        max_time=parse_duration(max_time, "--max-time") if max_time else None,
        margin=parse_duration(signal_margin, "--signal-margin") if signal_margin else None,
        cpus_per_node=cpus_per_node,
        gpus_per_node=gpus_per_node,
        mem_per_node=parse_size(mem_per_node, "--mem-per-node") if mem_per_node else None,
        max_nodes=max_nodes,
    )
    margin = settings.margin if settings.margin is not None else chosen.signal_margin
    for flag, wall in (("--time", settings.time), ("--max-time", settings.max_time)):
        if wall is not None:
            _warn_short(app, flag, wall, settings.drain, margin)
    rec = Reconciler(ws, chosen, settings)

    def show(r: TickReport) -> None:
        if as_json:
            app.json_line(r.__dict__)
            return
        parts = [f"desired {r.desired}", f"active {r.active}"]
        for label, items in (
            ("submitted", r.submitted),
            ("adopted", r.adopted),
            ("cancelled", r.cancelled),
            ("replaced", r.replaced),
        ):
            if items:
                parts.append(f"{label} {len(items)}")
                if label == "submitted" and r.submitted_shapes:
                    parts[-1] += f" ({_shapes(r.submitted_shapes)})"
        if r.submitted and r.walltime is not None:
            parts.append(f"walltime {compact_duration(r.walltime)}")
        if r.unfit:
            parts.append(f"unfit {r.unfit}: {r.unfit_reason}")
        if r.unavailable:
            parts.append(f"backend unavailable: {r.unavailable}")
        if r.paused:
            parts.append(f"paused: {r.paused}")
        app.echo(", ".join(parts))

    try:
        rec.run(interval=parse_duration(interval, "--interval"), once=once, on_tick=show)
    except KeyboardInterrupt:
        pass
    if rec.stopped_by is not None:
        name = signal.Signals(rec.stopped_by).name
        app.echo(f"flow scale: stopped by {name}; the reconciler lease is released", err=True)
        raise SystemExit(128 + rec.stopped_by)  # as the shell reports a death by it


def _shapes(shapes: list[str]) -> str:
    """Shapes in words, each once with how many: `1×2 CPUs, 1G; 2 × 1×1 CPU`."""
    seen: dict[str, int] = {}
    for shape in shapes:
        seen[shape] = seen.get(shape, 0) + 1
    return "; ".join(f"{n} × {shape}" if n > 1 else shape for shape, n in seen.items())


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
                        "time": r.time,
                        "attempts": r.attempts,
                        "service": r.service,
                        "profile": r.profile.to_json() if r.profile is not None else None,
                        "shape": r.profile.describe() if r.profile is not None else None,
                    }
                    for r in recs
                ],
            }
        )
        return
    if paused:
        app.echo(f"paused: {paused}")
    app.table(
        ["TOKEN", "BACKEND", "PHASE", "HANDLE", "SHAPE", "TIME", "SINCE", "REASON"],
        [
            [
                r.token,
                r.backend,
                r.phase.value,
                r.handle,
                r.shape,
                compact_duration(r.time) if r.time is not None else "-",
                _when(r.updated),
                r.reason,
            ]
            for r in recs
        ],
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
    @click.option(
        "--signal-margin",
        default=None,
        help="How much earlier than --drain the batch system may signal "
        f"(default {compact_duration(spec.signal_margin)}).",
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
        signal_margin: str | None,
        as_json: bool,
        serve_args: tuple[str, ...],
    ) -> None:
        ws = app.ws
        _check_serve_args(serve_args)
        wall = parse_duration(time_, "--time") if time_ else None
        drain_s = parse_duration(drain, "--drain")
        margin = parse_duration(signal_margin, "--signal-margin") if signal_margin else None
        if wall is not None and wall > drain_s:
            _warn_short(
                app, "--time", wall, drain_s, spec.signal_margin if margin is None else margin
            )
        # the margin only when given: a backend's submit may not know of it
        more = {"margin": margin} if margin is not None else {}
        done = spec.submit(
            ws.root,
            serve_args=serve_args,
            time=wall,
            drain=drain_s,
            extra_args=extra_args,
            **more,
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


#: the least usable time a walltime should leave, beyond the drain and the signal margin
USEFUL = 60.0


def _warn_short(app: App, flag: str, wall: float, drain: float, margin: float) -> None:
    """Warn when a walltime leaves less than a minute of claimable time."""
    useful = wall - drain - margin
    if useful >= USEFUL:
        return
    left = f"only {compact_duration(useful)}" if useful > 0 else "no time"
    early = f", and may come up to {compact_duration(margin)} early" if margin else ""
    app.warn(
        f"{flag} {compact_duration(wall)} leaves {left} for work: managers claim only "
        f"jobs that end before the drain, which is signalled {compact_duration(drain)} before "
        f"the end{early}; ask for at least {compact_duration(drain + margin + USEFUL)}"
    )


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
