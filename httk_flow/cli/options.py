"""Options shared by every command."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from httk_flow.cli.app import App

F = TypeVar("F", bound=Callable[..., Any])


class FlowGroup(click.Group):
    """Runs a command under the App's error handler (App.reporting_errors)."""

    def invoke(self, ctx: click.Context) -> Any:
        with ctx.ensure_object(App).reporting_errors():
            return super().invoke(ctx)


def _set_workspace(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value is not None:
        ctx.ensure_object(App).workspace_path = value


def workspace_option(f: F) -> F:
    """-w/--workspace, accepted after the command as well as before it."""
    return click.option(
        "-w",
        "--workspace",
        type=click.Path(file_okay=False),
        expose_value=False,
        callback=_set_workspace,
        help="Workspace (default: $FLOW_WORKSPACE, else the nearest ancestor with .flow/).",
    )(f)
