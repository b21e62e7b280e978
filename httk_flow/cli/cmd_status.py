"""`flow status`, once or watched."""

from __future__ import annotations

from typing import Any

import click

from httk_flow.cli.app import App
from httk_flow.cli.options import selector_options, workspace_option
from httk_flow.ops.select import Selection
from httk_flow.ops.status import GroupBy, Snapshot, StatusReport, watch, workspace_status
from httk_flow.protocol.durations import format_duration, parse_duration
from httk_flow.protocol.states import State


@click.command("status")
@click.option(
    "--by",
    type=click.Choice(["state", "placement", "step", "tag", "group"]),
    default="state",
    show_default=True,
)
@selector_options(state_help="Count only jobs in this state (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON document.")
@click.option(
    "--watch",
    "every",
    default=None,
    is_flag=False,
    flag_value="2",
    metavar="[SECONDS]",
    help="Refresh a live view every SECONDS (default 2); off a terminal, print a "
    "snapshot every SECONDS (one JSON line each with --json).",
)
@workspace_option
@click.pass_obj
def status(app: App, /, by: GroupBy, sel: Selection, as_json: bool, every: str | None) -> None:
    """Counts per state, live managers and blocked reasons (of the selected jobs only,
    with --tag/--group/--state)."""
    if every is not None:
        _watch(app, by, parse_duration(every, "--watch"), as_json, sel)
        return
    r = workspace_status(app.ws, by=by, sel=sel)
    if as_json:
        app.json(_doc(r, by))
    else:
        _print(app, r, by)


def _doc(r: StatusReport, by: GroupBy) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "workspace": r.workspace,
        "total": r.total,
        "counts": {s.value: n for s, n in r.counts.items()},
        "managers": [
            {
                "id": m.info.id,
                "host": m.info.host,
                "pid": m.info.pid,
                "alive": m.alive,
                "heartbeat_age": round(m.age, 2),
            }
            for m in (v.liveness for v in r.listed)
            if m.alive or not m.stopped
        ],
        "held_by_dead": [d.to_json() for d in r.held_by_dead],
        # the time fit's entries add its numbers: needs, longest_remaining (seconds),
        # walltime (of an allocation it would fit, or null) and estimated (from a sample)
        "blocked": [{"reason": why, "count": n, **r.details.get(why, {})} for why, n in r.blocked],
        "requests_pending": r.requests_pending,
    }
    if by != "state":
        doc["groups"] = {
            g: {s.value: c[s] for s in State if c[s]} for g, c in sorted(r.groups.items())
        }
    return doc


def _print(app: App, r: StatusReport, by: GroupBy) -> None:
    app.echo(f"workspace {r.workspace}: {r.total} jobs")
    app.table(
        ["STATE", "JOBS"],
        [
            [s.value, n]
            for s, n in r.counts.items()
            if n or s in (State.READY, State.RUNNING, State.SUCCEEDED, State.FAILED)
        ],
    )
    if by != "state":
        shown = [s for s in State if any(c[s] for c in r.groups.values())]
        app.table(
            [by.upper(), *[s.value.upper() for s in shown]],
            [[g, *[c[s] for s in shown]] for g, c in sorted(r.groups.items())],
        )
    live = r.live_managers
    dead = [v for v in r.listed if not v.liveness.alive and not v.liveness.stopped]
    app.echo(f"managers: {len(live)} live" + (f", {len(dead)} dead" if dead else ""))
    for m in live:
        app.echo(
            f"  {m.info.id} on {m.info.host} pid {m.info.pid}, "
            f"{m.info.running}/{m.info.workers} running, "
            f"heartbeat {format_duration(m.age)} ago"
        )
    for d in r.held_by_dead:
        app.echo(f"  {d.describe(r.looked_at)}")
    held = sum(d.jobs for d in r.held_by_dead)
    if held and not live:
        it = "it" if held == 1 else "them"
        app.echo(f"  no live manager to recover {it}; start one with `flow serve` or `flow run`")
    for why, n in r.blocked:
        app.echo(f"blocked: {n} job{'s' * (n != 1)}: {why}")
    if r.requests_pending:
        app.echo(f"requests: {r.requests_pending} pending (see `flow requests`)")


def _pace(snap: Snapshot) -> str:
    eta = f", ETA {format_duration(snap.eta)}" if snap.eta else ""
    return f"{snap.rate:.1f} jobs/s{eta}"


def _watch(app: App, by: GroupBy, every: float, as_json: bool, sel: Selection) -> None:
    """Every snapshot the package yields, rendered, until Ctrl-C: a live view on a terminal;
    otherwise one plain block per snapshot (the `flow status` text, a throughput line and
    a blank line), or one JSON line per snapshot with --json."""
    snapshots = watch(app.ws, by=by, every=every, sel=sel)
    try:
        if as_json:
            for snap in snapshots:
                doc = _doc(snap.report, by)
                doc["elapsed"] = round(snap.elapsed, 2)
                doc["jobs_per_second"] = round(snap.rate, 3)
                doc["eta"] = round(snap.eta, 1) if snap.eta else None
                app.json_line(doc)
        elif not app.is_terminal:
            for snap in snapshots:
                _print(app, snap.report, by)
                app.echo(f"throughput: {_pace(snap)}")
                app.echo()
        else:
            from rich.live import Live

            with Live(console=app.console(), auto_refresh=False) as live:
                for snap in snapshots:
                    live.update(_live_view(app, snap), refresh=True)
    except KeyboardInterrupt:
        pass


def _live_view(app: App, snap: Snapshot) -> Any:
    r = snap.report
    rows = [[s.value, r.counts[s]] for s in State if r.counts[s]]
    rows += [[f"blocked: {why}", n] for why, n in r.blocked]
    return app.rich_table(
        ["state", "jobs"],
        rows,
        title=f"{r.workspace}: {r.total} jobs, {len(r.live_managers)} live managers, "
        + _pace(snap),
        right=["jobs"],
    )
