"""`flow list`, `flow show`, `flow history`, `flow status`, `flow managers`."""

from __future__ import annotations

import datetime as dt
from typing import Any

import click

from httk_flow.cli.app import App
from httk_flow.cli.options import workspace_option
from httk_flow.ops import lookup
from httk_flow.ops.status import GroupBy, StatusReport, Throughput, workspace_status
from httk_flow.protocol import jobs
from httk_flow.protocol.durations import format_duration, parse_duration
from httk_flow.protocol.states import State

STATE_NAMES = [s.value for s in State]


def _result(r: object) -> str:
    """An attempt's ending in words: the outcome's action, else the exit status."""
    if not isinstance(r, dict):
        return "-"
    out = r.get("outcome")
    if isinstance(out, dict):
        text = str(out.get("action", "?"))
        if out.get("step"):
            text += f" {out['step']}"
        return text
    if r.get("outcome_error"):
        return "bad outcome"
    if r.get("interrupted"):
        return f"interrupted ({r['interrupted']})"
    if r.get("signal"):
        return f"signal {r['signal']}"
    return f"exit {r.get('exit')}"


def _when(t: object) -> str:
    if not isinstance(t, int | float):
        return "-"
    return dt.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


@click.command("list")
@click.option("--state", "states", multiple=True, type=click.Choice(STATE_NAMES))
@click.option("--tag", default=None)
@click.option("--limit", type=click.IntRange(min=0), default=None)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON document.")
@workspace_option
@click.pass_obj
def list_(
    app: App, /, states: tuple[str, ...], tag: str | None, limit: int | None, as_json: bool
) -> None:
    """One row per job."""
    sel = tuple(State(s) for s in states) or tuple(State)
    rows = lookup.list_rows(app.ws, sel, tag=tag, limit=limit)
    if as_json:
        app.json({"jobs": [r.to_json() for r in rows]})
        return
    app.table(
        ["ID", "TAG", "STATE", "STEP", "PRIO", "ATTEMPTS", "PLACEMENT"],
        [
            [
                r.handle.job_id[:12],
                r.handle.marker.tag,
                r.handle.state.value,
                r.step,
                r.handle.marker.priority,
                r.attempts,
                r.handle.placement,
            ]
            for r in rows
        ],
    )


@click.command("show")
@click.argument("job")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON document.")
@workspace_option
@click.pass_obj
def show(app: App, /, job: str, as_json: bool) -> None:
    """Definition, current state and attempts of JOB."""
    ws = app.ws
    v = lookup.view(ws, lookup.find(ws, job))
    h, f = v.handle, v.frame
    doc: dict[str, Any] = {
        "id": h.job_id,
        "key": h.key,
        "tag": h.marker.tag,
        "state": h.state.value,
        "step": f.get("step"),
        "generation": h.marker.generation,
        "priority": h.marker.priority,
        "placement": h.placement,
        "directory": ws.job_dir(h.placement, h.key),
        "activation": f.get("act"),
        "attempts": v.attempts,
        "definition": v.spec.to_dict() if v.spec else None,
    }
    if v.spec_error:
        doc["definition_error"] = v.spec_error
    if h.state is State.FAILED:
        doc["failure"] = f.get("failure")
    if h.marker.not_before:
        doc["not_before"] = h.marker.not_before
    if as_json:
        app.json(doc)
        return
    spec = v.spec
    lines = [
        ("id", h.job_id),
        ("key", h.key),
        ("state", h.state.value),
        ("step", f.get("step")),
        ("generation", h.marker.generation),
        ("priority", h.marker.priority),
        ("directory", doc["directory"]),
    ]
    if spec:
        prog = spec.program.name or spec.program.command
        lines.append(("program", " ".join([str(prog), *spec.args])))
        if spec.params:
            lines.append(("params", " ".join(f"{k}={v}" for k, v in spec.params.items())))
    if v.spec_error:
        lines.append(("definition", f"unreadable: {v.spec_error}"))
    if h.state is State.FAILED and isinstance(f.get("failure"), dict):
        fl = f["failure"]
        lines.append(("failure", f"{fl.get('code')}: {fl.get('message')}"))
    width = max(len(k) for k, _ in lines)
    for k, val in lines:
        app.echo(f"{k.ljust(width)}  {val}")
    if v.attempts:
        app.echo("")
        app.table(
            ["ATTEMPT", "STEP", "STATE", "HOST", "PID", "RESULT"],
            [
                [
                    a.get("n"),
                    a.get("step"),
                    a.get("state"),
                    a.get("host"),
                    a.get("pid"),
                    _result(a.get("result")),
                ]
                for a in v.attempts
            ],
        )


@click.command("history")
@click.argument("job")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON document.")
@workspace_option
@click.pass_obj
def history(app: App, /, job: str, as_json: bool) -> None:
    """Every transition of JOB, oldest first."""
    ws = app.ws
    frames = jobs.history(ws, lookup.find(ws, job))
    if as_json:
        app.json({"transitions": frames})
        return
    app.table(
        ["TIME", "GEN", "FROM", "TO", "STEP", "BY", "WHY"],
        [
            [
                _when(f.get("t")),
                f.get("gen"),
                f.get("from", "-"),
                f.get("to"),
                f.get("step"),
                f.get("by"),
                f.get("why", ""),
            ]
            for f in frames
        ],
    )


@click.command("status")
@click.option(
    "--by",
    type=click.Choice(["state", "placement", "step", "tag"]),
    default="state",
    show_default=True,
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON document.")
@click.option(
    "--watch",
    "watch",
    default=None,
    is_flag=False,
    flag_value="2",
    metavar="[SECONDS]",
    help="Refresh a live view every SECONDS (default 2).",
)
@workspace_option
@click.pass_obj
def status(app: App, /, by: GroupBy, as_json: bool, watch: str | None) -> None:
    """Counts per state, live managers and blocked reasons."""
    if watch is not None:
        _watch(app, by, parse_duration(watch, "--watch"))
        return
    r = workspace_status(app.ws, by=by)
    if as_json:
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
                for m in r.managers
                if m.alive or not m.stopped
            ],
            "blocked": [{"reason": why, "count": n} for why, n in r.blocked],
            "requests_pending": r.requests_pending,
        }
        if by != "state":
            doc["groups"] = {
                g: {s.value: c[s] for s in State if c[s]} for g, c in sorted(r.groups.items())
            }
        app.json(doc)
        return
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
    stale = [m for m in r.managers if not m.alive and not m.stopped]
    app.echo(f"managers: {len(live)} live" + (f", {len(stale)} stale" if stale else ""))
    for m in live:
        app.echo(
            f"  {m.info.id} on {m.info.host} pid {m.info.pid}, "
            f"{m.info.running}/{m.info.workers} running, "
            f"heartbeat {format_duration(m.age)} ago"
        )
    for why, n in r.blocked:
        app.echo(f"blocked: {n} job{'s' * (n != 1)}: {why}")
    if r.requests_pending:
        app.echo(f"requests: {r.requests_pending} pending (see `flow requests`)")


def _watch(app: App, by: GroupBy, every: float) -> None:
    """A live view: counts, managers, throughput and ETA, until Ctrl-C."""
    import time

    from rich.live import Live
    from rich.table import Table

    tp = Throughput()

    def render(r: StatusReport) -> Table:
        eta = tp.eta(r)
        t = Table(
            title=f"{r.workspace}: {r.total} jobs, {len(r.live_managers)} live managers, "
            f"{tp.rate:.1f} jobs/s" + (f", ETA {format_duration(eta)}" if eta else ""),
            title_justify="left",
        )
        t.add_column("state")
        t.add_column("jobs", justify="right")
        for s in State:
            if r.counts[s]:
                t.add_row(s.value, str(r.counts[s]))
        for why, n in r.blocked:
            t.add_row(f"blocked: {why}", str(n))
        return t

    try:
        with Live(console=app.console(), auto_refresh=False) as live:
            while True:
                r = workspace_status(app.ws, by=by)
                tp.add(r, time.monotonic())
                live.update(render(r), refresh=True)
                time.sleep(every)
    except KeyboardInterrupt:
        pass
