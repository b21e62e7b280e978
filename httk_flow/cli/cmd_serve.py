"""`flow serve` and `flow run`: a manager in the foreground."""

from __future__ import annotations

import os
import time
from typing import Any

import click

from httk_flow.cli.app import App
from httk_flow.cli.options import workspace_option
from httk_flow.errors import UsageError
from httk_flow.manager.config import ManagerConfig
from httk_flow.manager.loop import Manager
from httk_flow.protocol.durations import parse_duration
from httk_flow.protocol.names import check_label, check_placement
from httk_flow.protocol.workspace import check_lease
from httk_flow.scale import backends

#: the batch script may export when its allocation ends (unix seconds)
ALLOCATION_END_ENV = "FLOW_ALLOCATION_END"


def _options(f: Any) -> Any:
    for opt in reversed(
        [
            click.option(
                "--workers",
                type=click.IntRange(min=1),
                default=None,
                help="Concurrent attempts (default: number of CPUs).",
            ),
            click.option("--pool", "pools", multiple=True, help="Serve this pool (repeatable)."),
            click.option("--capability", "caps", multiple=True, help="Offer a capability."),
            click.option("--lease", default=None, help="Heartbeat lease, e.g. 30s (at least 1s)."),
            click.option(
                "--placement",
                "placements",
                multiple=True,
                help="Only serve jobs under this placement prefix (repeatable).",
            ),
            click.option(
                "--walltime",
                default=None,
                help="Stop claiming so that work ends this long after start.",
            ),
            click.option("--log-format", type=click.Choice(["text", "json"]), default="text"),
            click.option("--quiet", is_flag=True, help="No log line per transition."),
            click.option(
                "--drain-timeout",
                default="60s",
                show_default=True,
                help="How long a drain waits before killing attempts.",
            ),
            click.option(
                "--kill-grace",
                default="10s",
                show_default=True,
                help="Between TERM and KILL when stopping an attempt.",
            ),
            workspace_option,
        ]
    ):
        f = opt(f)
    return f


def _config(
    exit_when_idle: float | None,
    workers: int | None,
    pools: tuple[str, ...],
    caps: tuple[str, ...],
    lease: str | None,
    placements: tuple[str, ...],
    walltime: str | None,
    log_format: str,
    quiet: bool,
    drain_timeout: str,
    kill_grace: str,
) -> ManagerConfig:
    ends = []
    if walltime:
        ends.append(time.time() + parse_duration(walltime, "--walltime"))
    alloc_end = backends.current_allocation_end()
    if alloc_end is not None:
        ends.append(alloc_end)
    env_end = os.environ.get(ALLOCATION_END_ENV)
    if env_end:
        try:
            ends.append(float(env_end))
        except ValueError:
            raise UsageError("is not a unix time", obj=f"${ALLOCATION_END_ENV}") from None
    for p in pools:
        check_label(p, "pool")
    for c in caps:
        check_label(c, "capability")
    return ManagerConfig(
        workers=workers or os.cpu_count() or 1,
        pools=tuple(pools),
        capabilities=tuple(caps),
        placements=tuple(check_placement(p) for p in placements),
        lease=check_lease(parse_duration(lease, "--lease")) if lease else None,
        exit_when_idle=exit_when_idle,
        ends_at=min(ends) if ends else None,
        log_format="json" if log_format == "json" else "text",
        verbose=not quiet,
        drain_timeout=parse_duration(drain_timeout, "--drain-timeout"),
        kill_grace=parse_duration(kill_grace, "--kill-grace"),
    )


@click.command("serve")
@click.option(
    "--exit-when-idle",
    "idle",
    default=None,
    is_flag=False,
    flag_value="0",
    metavar="[SECONDS]",
    help="Exit once nothing is actionable (for this long).",
)
@_options
@click.pass_obj
def serve(app: App, /, idle: str | None, **kw: Any) -> None:
    """Run a manager until stopped: the first SIGTERM/SIGINT drains, a second exits."""
    idle_s = parse_duration(idle, "--exit-when-idle") if idle is not None else None
    cfg = _config(idle_s, **kw)
    raise SystemExit(Manager(app.ws, cfg).run())


@click.command("run")
@click.option(
    "--exit-when-idle",
    "--idle",
    "idle",
    default="0",
    show_default=True,
    help="Seconds of idleness before exiting.",
)
@_options
@click.pass_obj
def run(app: App, /, idle: str, **kw: Any) -> None:
    """`flow serve --exit-when-idle`: exit 0 when done, 1 if any job it ran failed."""
    cfg = _config(parse_duration(idle, "--exit-when-idle"), **kw)
    raise SystemExit(Manager(app.ws, cfg).run())
