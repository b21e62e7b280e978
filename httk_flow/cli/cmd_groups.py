"""`flow groups`: one row per group of jobs (a submission, an array, `--group NAME`)."""

from __future__ import annotations

import datetime as dt
import time

import click

from httk_flow.cli.app import App
from httk_flow.cli.options import workspace_option
from httk_flow.ops.groups import group_summaries
from httk_flow.protocol.durations import format_duration
from httk_flow.protocol.states import State


@click.command("groups")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON document.")
@workspace_option
@click.pass_obj
def groups(app: App, /, as_json: bool) -> None:
    """Groups of jobs: their counts per state, when each began and how long it took."""
    rows = group_summaries(app.ws)
    if as_json:
        app.json({"groups": [g.to_json() for g in rows]})
        return
    if not rows:
        app.echo("no groups")
        return
    now = time.time()
    shown = [s for s in State if any(g.states[s] for g in rows)]
    table = []
    for g in rows:
        span, running = g.span(now)
        words = "-" if span is None else format_duration(span)
        created = (
            dt.datetime.fromtimestamp(g.created).strftime("%Y-%m-%d %H:%M:%S")
            if g.created is not None
            else "-"
        )
        table.append(
            [
                g.name or f"? ({g.digest})",
                g.jobs,
                *[g.states[s] for s in shown],
                created,
                f"running for {words}" if running and span is not None else words,
            ]
        )
    app.table(["GROUP", "JOBS", *[s.value.upper() for s in shown], "CREATED", "SPAN"], table)
