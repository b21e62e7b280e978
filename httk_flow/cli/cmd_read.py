"""`flow list`, `flow show`, `flow history`."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from typing import Any

import click

from httk_flow.cli.app import App
from httk_flow.cli.options import selector_options, workspace_option
from httk_flow.errors import UsageError
from httk_flow.ops import depend, lookup
from httk_flow.ops.select import Selection, one, select
from httk_flow.protocol import jobs
from httk_flow.protocol.durations import format_duration
from httk_flow.protocol.jobspec import duration_words
from httk_flow.protocol.resources import Request
from httk_flow.protocol.states import State


def _limit(seconds: float | None) -> str:
    return duration_words(seconds) if seconds is not None else "-"


def _elapsed(seconds: float | None) -> str:
    return format_duration(seconds) if seconds is not None else "-"


def _when(t: object) -> str:
    if not isinstance(t, int | float):
        return "-"
    return dt.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


#: the columns of `flow list`, by the name `--format` knows them: (header, cell of a row)
COLUMNS: dict[str, tuple[str, Callable[[lookup.JobRow], object]]] = {
    "id": ("ID", lambda r: r.handle.job_id[:12]),
    "fullid": ("ID", lambda r: r.handle.job_id),
    "key": ("KEY", lambda r: r.handle.key),
    "tag": ("TAG", lambda r: r.handle.marker.tag),
    "group": ("GROUP", lambda r: r.group),
    "state": ("STATE", lambda r: r.handle.state.value),
    "step": ("STEP", lambda r: r.step),
    "prio": ("PRIO", lambda r: r.handle.marker.priority),
    "attempts": ("ATTEMPTS", lambda r: r.attempts),
    "start": ("START", lambda r: _when(r.start)),
    "end": ("END", lambda r: _when(r.end)),
    "elapsed": ("ELAPSED", lambda r: _elapsed(r.elapsed)),
    "limit": ("LIMIT", lambda r: _limit(r.limit)),
    "placement": ("PLACEMENT", lambda r: r.handle.placement),
    "reason": ("REASON", lambda r: _reason(r)),
}
DEFAULT_COLUMNS = "id,tag,state,step,prio,attempts,elapsed,limit,placement"


def _reason(r: lookup.JobRow) -> str:
    if r.failure is not None:
        return r.failure.code
    if r.handle.marker.after:
        return "after"  # waits for dependencies not yet met (`flow show` names them)
    return f"interrupted ({r.interrupted})" if r.interrupted else "-"


def _columns(spec: str) -> list[str]:
    names = [c.strip().lower() for c in spec.split(",") if c.strip()]
    bad = [c for c in names if c not in COLUMNS]
    if bad or not names:
        raise UsageError(
            f"unknown column {', '.join(bad)}" if bad else "names no column",
            obj=f"--format {spec}",
            hint=f"columns are {', '.join(COLUMNS)}",
        )
    return names


@click.command("list")
@click.argument("idents", nargs=-1, metavar="[JOB]...")
@selector_options(state_help="Only jobs in this state (repeatable).")
@click.option("--failed-code", default=None, help="Only failed jobs with this failure code.")
@click.option(
    "--interrupted",
    is_flag=True,
    help="Only jobs whose last attempt was stopped from outside (a drain, a takeover).",
)
@click.option("--limit", type=click.IntRange(min=0), default=None, help="At most this many rows.")
@click.option(
    "--format",
    "columns",
    default=None,
    metavar="COLS",
    help=f"Comma-separated columns (default {DEFAULT_COLUMNS}, and reason when a row "
    f"failed); from {','.join(COLUMNS)}.",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON document.")
@workspace_option
@click.pass_obj
def list_(
    app: App,
    /,
    sel: Selection,
    failed_code: str | None,
    interrupted: bool,
    limit: int | None,
    columns: str | None,
    as_json: bool,
) -> None:
    """One row per job (of the selected ones: JOB idents, --tag, --group, --state)."""
    names = _columns(columns) if columns is not None else None
    rows = lookup.list_rows(
        app.ws,
        sel.states or tuple(State),
        limit=limit,
        failed_code=failed_code,
        interrupted=interrupted,
        jobs=select(app.ws, sel),
    )
    if as_json:
        app.json({"jobs": [r.to_json() for r in rows]})
        return
    listed = list(rows)
    if names is None:
        names = DEFAULT_COLUMNS.split(",")
        if any(r.failure is not None or r.handle.marker.after for r in listed):
            names.insert(names.index("elapsed"), "reason")
    app.table(
        [COLUMNS[c][0] for c in names],
        [[COLUMNS[c][1](r) for c in names] for r in listed],
    )


@click.command("show")
@click.argument("idents", nargs=-1, metavar="[JOB]")
@selector_options()
@click.option("--json", "as_json", is_flag=True, help="Print a JSON document.")
@workspace_option
@click.pass_obj
def show(app: App, /, sel: Selection, as_json: bool) -> None:
    """Definition, current state and attempts of JOB (exactly one selected job)."""
    ws = app.ws
    v = lookup.view(ws, one(ws, sel))
    h = v.handle
    doc: dict[str, Any] = {
        "id": h.job_id,
        "key": h.key,
        "tag": h.marker.tag,
        "group": v.spec.group if v.spec else None,
        "state": h.state.value,
        "step": v.step,
        "generation": h.marker.generation,
        "priority": h.marker.priority,
        "placement": h.placement,
        "directory": ws.job_dir(h.placement, h.key),
        "activation": v.activation,
        "limit": v.limit,
        "elapsed": round(elapsed, 3) if (elapsed := v.elapsed) is not None else None,
        "attempts": [a.to_json() for a in v.attempts],
        "definition": v.spec.to_dict() if v.spec else None,
        "resources": _resources(v.spec.resources) if v.spec else None,
    }
    if v.spec_error:
        doc["definition_error"] = v.spec_error
    if h.state is State.FAILED:
        doc["failure"] = v.failure.to_json() if v.failure else None
    if h.marker.not_before:
        doc["not_before"] = h.marker.not_before
    if v.message is not None:
        doc["message"] = v.message
    join = lookup.join_progress(ws, v)
    if join is not None:
        doc["join"] = join.to_json()
    deps = depend.dependencies_of(ws, h) if v.spec is not None and v.spec.after else []
    if deps:
        doc["after"] = [d.to_json() for d in deps]
    if as_json:
        app.json(doc)
        return
    spec = v.spec
    lines: list[tuple[str, object]] = [
        ("id", h.job_id),
        ("key", h.key),
        ("state", h.state.value),
        ("step", v.step),
        ("generation", h.marker.generation),
        ("priority", h.marker.priority),
        ("directory", doc["directory"]),
    ]
    if spec:
        if spec.name:
            lines.insert(1, ("name", spec.name))
        if spec.group:
            lines.insert(lines.index(("state", h.state.value)), ("group", spec.group))
        prog = spec.program.name or spec.program.command
        lines.append(("program", " ".join([str(prog), *spec.args])))
        if spec.array_index is not None:
            lines.append(("array index", spec.array_index))
        if spec.params:
            lines.append(("params", " ".join(f"{k}={v}" for k, v in spec.params.items())))
        if spec.pool or spec.requires:
            lines.append(("serves", f"pool {spec.pool or 'default'} " + " ".join(spec.requires)))
        charged = v.frame.snap.charged if v.frame is not None else 0
        lines.append(
            (
                "retries",
                f"{spec.retries} per activation; {charged} of at most {spec.max_attempts} "
                "failures charged",
            )
        )
        if spec.time is not None:
            lines.append(("time", f"{duration_words(spec.time)} (request)"))
        if not spec.resources.is_default:
            lines.append(("resources", spec.resources.describe() + " per attempt"))
    if v.limit is not None:
        lines.append(("limit", _limit_words(v)))
    if v.elapsed is not None:
        running = h.state is State.RUNNING
        lines.append(("elapsed", f"{_elapsed(v.elapsed)}{' so far' if running else ''}"))
    if v.spec_error:
        lines.append(("definition", f"unreadable: {v.spec_error}"))
    if h.state is State.FAILED and v.failure is not None:
        lines.append(("failure", f"{v.failure.code}: {v.failure.message}"))
    if v.message is not None and (v.failure is None or v.failure.message != v.message):
        lines.append(("message", v.message))
    if join is not None:
        lines.append(("join", f"{join.words()}; then {join.next}"))
    lines.extend(("after", d.words()) for d in deps)
    width = max(len(k) for k, _ in lines)
    for k, val in lines:
        app.echo(f"{k.ljust(width)}  {val}")
    if v.attempts:
        app.echo("")
        now = time.time()
        app.table(
            ["ATTEMPT", "STEP", "STATE", "HOST", "PID", "ELAPSED", "LIMIT", "RESULT"],
            [
                [
                    a.record.n,
                    a.record.step,
                    a.state.value,
                    a.record.host,
                    a.record.pid,
                    _elapsed(a.elapsed_at(now)),
                    _limit(a.limit),
                    a.result_words,
                ]
                for a in v.attempts
            ],
        )


def _resources(r: Request) -> dict[str, Any]:
    """A request as `flow show --json` says it: every member, defaults included."""
    return {"cpus": r.cpus, "gpus": r.gpus, "mem": r.mem, "custom": dict(r.custom)}


def _limit_words(v: lookup.JobView) -> str:
    """The limit, and how it grows: `4s (--time-limit 2s, ×2 after each attempt
    stopped at its limit)`."""
    assert v.limit is not None
    words = duration_words(v.limit)
    spec = v.spec
    if spec is None or spec.time_limit is None or spec.time_limit_factor == 1:
        return words
    grows = f"×{spec.time_limit_factor:g} after each attempt stopped at its limit"
    if v.limit == spec.time_limit:
        return f"{words} ({grows})"
    return f"{words} (--time-limit {duration_words(spec.time_limit)}, {grows})"


@click.command("history")
@click.argument("job")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON document.")
@workspace_option
@click.pass_obj
def history(app: App, /, job: str, as_json: bool) -> None:
    """Every transition of JOB, oldest first."""
    ws = app.ws
    found = lookup.find(ws, job)
    if as_json:
        app.json({"transitions": jobs.history_json(ws, found)})
        return
    app.table(
        ["TIME", "GEN", "FROM", "TO", "STEP", "BY", "WHY"],
        [
            [
                _when(f.t),
                f.gen,
                f.source.value if f.source else "-",
                f.to.value,
                f.snap.step or None,
                f.by,
                lookup.why_words(f),
            ]
            for f in jobs.history(ws, found)
        ],
    )
