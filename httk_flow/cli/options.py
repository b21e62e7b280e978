"""Options shared by every command."""

from __future__ import annotations

import errno
from collections.abc import Callable
from typing import Any, TypeVar

import click

from httk_flow.cli.app import App
from httk_flow.errors import FlowError

_ENVIRONMENT_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}
)

F = TypeVar("F", bound=Callable[..., Any])


class FlowGroup(click.Group):
    """Turns a FlowError into `flow: error: ...` and its exit code; anything else is a bug."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except FlowError as e:
            ctx.ensure_object(App).fail(e)
        except OSError as e:
            # the machine refusing (full disk, quota, read-only) is not a bug: say so plainly
            if e.errno not in _ENVIRONMENT_ERRNOS:
                raise
            refused = FlowError(
                f"{e.strerror}",
                obj=str(e.filename) if e.filename else None,
                hint="free space or fix permissions in the workspace and run the command again",
            )
            ctx.ensure_object(App).fail(refused)


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
