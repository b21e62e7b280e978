"""Options shared by every command."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from httk_flow.cli.app import App
from httk_flow.errors import FlowError

F = TypeVar("F", bound=Callable[..., Any])


class FlowGroup(click.Group):
    """Turns a FlowError into `flow: error: ...` and its exit code; anything else is a bug."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except FlowError as e:
            click.echo(f"flow: error: {e.render()}", err=True)
            ctx.exit(e.exit_code)


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
