"""Options shared by every command: the workspace, and the selectors of the commands
that act on jobs."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast

import click

from httk_flow.cli.app import App
from httk_flow.protocol.states import State

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


_STATE_NAMES = tuple(s.value for s in State)


def selector_options(
    *,
    states: tuple[str, ...] = _STATE_NAMES,
    state_help: str = "Jobs in this state (repeatable).",
    all_help: str = "Every job.",
) -> Callable[[F], F]:
    """--tag, --group, --state and --all of every selection-taking command, folded with
    the command's JOB idents (a parameter `idents`, when it has one) into one
    `sel: Selection` argument."""

    def decorate(f: F) -> F:
        @functools.wraps(f)
        def command(*args: Any, **kw: Any) -> Any:
            from httk_flow.ops.select import Selection  # loaded by the commands that select

            kw["sel"] = Selection(
                idents=tuple(kw.pop("idents", ())),
                tags=tuple(kw.pop("sel_tags")),
                groups=tuple(kw.pop("sel_groups")),
                states=tuple(State(s) for s in kw.pop("sel_states")),
                all=kw.pop("sel_all"),
            )
            return f(*args, **kw)

        opts = [
            click.option(
                "--tag", "sel_tags", multiple=True, metavar="TAG", help="Jobs with this tag."
            ),
            click.option(
                "--group",
                "sel_groups",
                multiple=True,
                metavar="GROUP",
                help="Jobs of this group (see `flow groups`).",
            ),
            click.option(
                "--state", "sel_states", multiple=True, type=click.Choice(states), help=state_help
            ),
            click.option("--all", "sel_all", is_flag=True, help=all_help),
        ]
        out: Any = command
        for opt in reversed(opts):
            out = opt(out)
        return cast(F, out)

    return decorate
