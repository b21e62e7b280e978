"""`flow serve` and `flow run`: a manager in the foreground."""

from __future__ import annotations

from typing import Any, NoReturn

import click

from httk_flow.cli import live
from httk_flow.cli.app import App
from httk_flow.cli.options import workspace_option
from httk_flow.errors import UsageError
from httk_flow.manager.config import ManagerConfig
from httk_flow.manager.loop import Manager
from httk_flow.scale import backends


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
            click.option(
                "--drain-before",
                default=None,
                metavar="DURATION",
                help="The batch system signals the drain this long before the allocation "
                "ends (the allocation's --drain); claimed work ends before it.",
            ),
            click.option(
                "--signal-margin",
                default=None,
                metavar="DURATION",
                help="The drain signal may come this much earlier still (default: what "
                "the batch system the manager runs in is known to do; 0 outside one).",
            ),
            click.option(
                "--order",
                type=click.Choice(["depth", "breadth"]),
                default="depth",
                show_default=True,
                help="Of ready jobs of one priority, claim those that advanced, retried or "
                "joined first (depth), or in the order they came (breadth).",
            ),
            click.option(
                "--launch-ahead/--no-launch-ahead",
                default=True,
                show_default=True,
                help="While every worker runs short attempts, keep the next jobs claimed "
                "and launched behind their gates, to start the moment a worker frees.",
            ),
            click.option("--log-format", type=click.Choice(["text", "json"]), default="text"),
            click.option(
                "-q",
                "--quiet",
                is_flag=True,
                help="Only problems and the summary at the end: no panel, no transition lines.",
            ),
            click.option(
                "-v",
                "--verbose",
                is_flag=True,
                help="A log line per transition, also on a terminal (instead of the live "
                "panel); off a terminal that is always so.",
            ),
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


def _resource_options(f: Any) -> Any:
    """What the manager gives its attempts (docs/cli.md, "Resources")."""
    for opt in reversed(
        [
            click.option(
                "--cpus",
                type=click.IntRange(min=1),
                default=None,
                metavar="N",
                help="CPUs attempts share (default: the CPUs this process may run on, "
                "as its affinity mask and the batch allocation say).",
            ),
            click.option(
                "--gpus",
                default=None,
                metavar="N|LIST",
                help="GPUs attempts share: a count, or ids (0,1; one id: 2,). Default: "
                "CUDA_VISIBLE_DEVICES, ROCR_VISIBLE_DEVICES or the batch allocation's.",
            ),
            click.option(
                "--mem",
                default=None,
                metavar="SIZE",
                help="Memory attempts share, e.g. 64G (default: the batch allocation's, "
                "the cgroup's limit, else the machine's).",
            ),
            click.option(
                "--resource",
                "resources",
                multiple=True,
                metavar="NAME=N",
                help="Units of a site-defined resource attempts share (repeatable).",
            ),
            click.option(
                "--bind",
                type=click.Choice(["none", "cpus"]),
                default="none",
                show_default=True,
                help="cpus: pin each attempt's processes to its own CPUs.",
            ),
            click.option(
                "--reserve-after",
                default=None,
                metavar="DURATION",
                help="A job too large for what is free lets smaller ones past this long, "
                "then keeps back what it needs as it frees up (default 60s).",
            ),
        ]
    ):
        f = opt(f)
    return f


def _config(exit_when_idle: str | None, **flags: Any) -> ManagerConfig:
    """The manager's configuration from the flags as given; the package resolves it."""
    backends.export_allocation_id()  # the manager's heartbeat names its batch job
    return ManagerConfig.resolve(
        exit_when_idle=exit_when_idle,
        allocation=backends.current_allocation,
        grant=backends.current_grant,
        batch_job=backends.current_job,
        **flags,
    )


def _serve(app: App, command: str, idle: str | None, flags: dict[str, Any]) -> NoReturn:
    """Run the manager: under the live panel when stderr is a terminal (live.wanted),
    else writing its log lines there."""
    verbose = flags.pop("verbose")
    if verbose and flags["quiet"]:
        raise UsageError("cannot be given together", obj="-v/--verbose and -q/--quiet")
    cfg = _config(idle, **flags)
    show = live.wanted(verbose=verbose, quiet=not cfg.verbose, log_format=cfg.log_format)
    with live.panel(app, command, show) as reporter:
        code = Manager(app.ws, cfg, reporter=reporter).run()
    raise SystemExit(code)


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
@_resource_options
@click.pass_obj
def serve(app: App, /, idle: str | None, **kw: Any) -> None:
    """Run a manager until stopped: the first SIGTERM/SIGINT drains, a second exits."""
    _serve(app, "serve", idle, kw)


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
@_resource_options
@click.pass_obj
def run(app: App, /, idle: str, **kw: Any) -> None:
    """`flow serve --exit-when-idle`: exit 0 when done, 1 if any job it ran failed."""
    _serve(app, "run", idle, kw)
