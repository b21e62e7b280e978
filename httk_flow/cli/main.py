"""The `flow` command group; each command lives in a module of its own."""

from __future__ import annotations

import click

from httk_flow import __version__
from httk_flow.backends import commands as backend_commands
from httk_flow.cli import (
    cmd_alloc,
    cmd_demo,
    cmd_fsck,
    cmd_init,
    cmd_ops,
    cmd_read,
    cmd_serve,
    cmd_steer,
    cmd_submit,
)
from httk_flow.cli.app import App
from httk_flow.cli.options import FlowGroup, workspace_option


@click.group(cls=FlowGroup, context_settings={"help_option_names": ["-h", "--help"]})
@workspace_option
@click.version_option(__version__, prog_name="flow")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """httk_flow: run thousands to millions of jobs from a shared workspace."""
    ctx.ensure_object(App)


def main() -> None:
    # standalone_mode=False: click would otherwise swallow a BrokenPipeError raised by a bug
    try:
        code = cli.main(obj=App(), prog_name="flow", standalone_mode=False)
    except click.ClickException as e:
        e.show()
        raise SystemExit(e.exit_code) from None
    except click.Abort:
        click.echo("flow: aborted", err=True)
        raise SystemExit(1) from None
    raise SystemExit(code if isinstance(code, int) else 0)


for _mod in (
    cmd_alloc,
    cmd_alloc,
    cmd_demo,
    cmd_fsck,
    cmd_init,
    cmd_ops,
    cmd_read,
    cmd_serve,
    cmd_steer,
    cmd_submit,
):
    _mod.register(cli)
for _command in backend_commands():
    cli.add_command(_command)
